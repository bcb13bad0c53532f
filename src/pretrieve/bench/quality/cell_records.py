"""What a finished cell's record holds, read off its outputs in the scratch ``<out>``.

:func:`fold_record` (one fold of an arm × seed: per-query scores of its model on every collection, evaluated from
its TREC runs; its timings; the SHA-1 of the checkpoint it fine-tuned), :func:`cell_record` (an arm × seed: its
folds' records put together; the coverage and probes trimmed to what the report and the claims read; pre-training
speed from the trainer's logs; timings; the checkpoint's SHA-1), :func:`select_record` (a dev-grid point: its
per-query dev nDCG@10) and :func:`failed_record` (the error of a cell that failed). Each is stamped with the tier's
digest, the precision, the commit and the machine (:func:`pretrieve.bench.quality.records.stamp`); the format is
described in :mod:`pretrieve.bench.quality.records`.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any, Mapping

from pretrieve.bench.quality import recipes
from pretrieve.bench.quality.arms import arm_method
from pretrieve.bench.quality.cell import DEV, Bench, checkpoint_digest
from pretrieve.bench.quality.records import (CELL_FORMAT, DONE, FAILED, FOLD_FORMAT, SELECT_FORMAT, rounded, stamp,
                                             trimmed_coverage)
from pretrieve.bench.quality.settings import (COVERAGE_FILE, PRIMARY, RETRIEVER, fold_dir, parse_fold, point_name,
                                              seed_dir)
from pretrieve.data.beir import load_qrels
from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import read_run
from pretrieve.errors import InputError
from pretrieve.evaluation import RunEvaluator
from pretrieve.retrieval import runs
from pretrieve.train.loop import read_logs

def run_path(directory: Path, collection: str, split: str, zero_shot_split: str) -> Path:
    """The TREC run a fine-tuning recipe in ``directory`` wrote for a collection (``name`` for the zero-shot
    split, else ``name:split``)."""
    return runs.run_path(directory, RETRIEVER, collection, split, zero_shot=zero_shot_split)


def per_query_scores(run: Path, qrels: Path) -> dict[str, dict[str, float]]:
    """``{measure: {query id: score}}`` of a saved run against a qrels file (every judged query; one the run
    does not answer scores 0, as ``trec_eval -c``)."""
    if not run.exists():
        raise InputError("the run of a finished recipe is missing", path=run)
    result = RunEvaluator(load_qrels(qrels), list(recipes.MEASURES))(read_run(run), name=str(run))
    return {measure: rounded(result.per_query[measure]) for measure in recipes.MEASURES}


def _timings(directory: Path) -> dict[str, float]:
    path = directory / "results.json"
    return json.loads(path.read_text(encoding="utf-8")).get("timings_s", {}) if path.exists() else {}


def train_seconds(stage_dir: Path, batch_size: int) -> tuple[int, float]:
    """Steps and training seconds of a training run from its ``logs.jsonl`` (``Σ window steps × batch / window
    samples/s``): complete across resumes, where a part's wall time counts only its last process."""
    previous, train_s = 0, 0.0
    for entry in read_logs(stage_dir):
        steps = int(entry["step"]) - previous
        previous = int(entry["step"])
        if entry.get("samples_per_s"):
            train_s += steps * batch_size / float(entry["samples_per_s"])
    return previous, train_s


def pretrain_speed(directory: Path) -> dict[str, Any] | None:
    """Wall time of a cell's pretrain stage and training samples/s from its ``logs.jsonl``: ``steps × batch /
    Σ window seconds``, complete across resumes."""
    pretrain_dir = directory / "pretrain"
    config_path = pretrain_dir / "pretrain_config.json"
    if not config_path.exists():
        return None
    batch_size = int(json.loads(config_path.read_text(encoding="utf-8"))["batch_size"])
    steps, train_s = train_seconds(pretrain_dir, batch_size)
    return {"steps": steps, "batch_size": batch_size, "train_s": train_s,
            "wall_s": _timings(directory).get("pretrain"),
            "samples_per_s": steps * batch_size / train_s if train_s > 0 else None}


def finetune_train_s(directory: Path) -> float | None:
    """The fine-tuning seconds of a fold or grid point, complete across resumes (:func:`train_seconds`); None
    without the stage's logs (a fold whose model was copied from the dev grid's point)."""
    config_path = directory / RETRIEVER / "finetune_config.json"
    if not config_path.exists():
        return None
    batch_size = int(json.loads(config_path.read_text(encoding="utf-8"))["settings"]["batch_size"])
    steps, seconds = train_seconds(directory / RETRIEVER, batch_size)
    return seconds if steps else None


def fold_record(bench: Bench, arm: str, seed: int, fold: str, protocol: Mapping[str, Any],
                tier: Mapping[str, Any], wall_s: float) -> dict[str, Any]:
    """The record of one finished fold of an arm × seed (module docstring of
    :mod:`pretrieve.bench.quality.records`): the per-query scores of its model on every collection, its timings
    and the SHA-1 of the checkpoint it fine-tuned."""
    settings = bench.settings
    fold_path = seed_dir(bench.out, arm, seed) / fold_dir(fold)
    in_domain, test_split = Path(settings.train).name, parse_fold(fold)[1]
    scores: dict[str, Any] = {}
    for path in settings.eval:
        name = Path(path).name
        split, qrels = (test_split, BeirCollection(bench.data).qrels_path(test_split)) if name == in_domain \
            else (settings.split, BeirCollection(Path(path)).qrels_path(settings.split))
        scores[name] = per_query_scores(run_path(fold_path, name, split, settings.split), qrels)
    timings = _timings(fold_path)
    return {"format": FOLD_FORMAT, "status": DONE, "arm": arm, "seed": seed, "fold": fold,
            "protocol": dict(protocol), "checkpoint_sha256": checkpoint_digest(settings, arm, seed),
            "scores": scores,
            "timings": {"finetune_s": float(timings.get(RETRIEVER, 0.0)),
                        "evaluate_s": float(timings.get("evaluate", 0.0)),
                        "finetune_train_s": finetune_train_s(fold_path), "wall_s": round(wall_s, 1)},
            **stamp(tier, settings.threads)}


def cell_record(bench: Bench, arm: str, seed: int, protocol: Mapping[str, Any], tier: Mapping[str, Any],
                wall_s: float, folds: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The record of a finished arm × seed (module docstring of :mod:`pretrieve.bench.quality.records`), its
    folds' scores and timings taken from their records (``folds``: fold → record), which may have been made on
    other machines (``parts`` says where)."""
    settings = bench.settings
    directory = seed_dir(bench.out, arm, seed)
    scores: dict[str, dict[str, Any]] = {}
    timings: dict[str, Any] = {"finetune_s": 0.0, "evaluate_s": 0.0, "finetune_train_s": 0.0}
    for fold in settings.folds:
        record = folds[fold]
        for name, per_query in record["scores"].items():
            scores.setdefault(name, {})[fold] = per_query
        timings["finetune_s"] = round(timings["finetune_s"] + record["timings"]["finetune_s"], 1)  # folds: 0.1 s
        timings["evaluate_s"] = round(timings["evaluate_s"] + record["timings"]["evaluate_s"], 1)
        train_s = record["timings"]["finetune_train_s"]
        timings["finetune_train_s"] = None if train_s is None or timings["finetune_train_s"] is None else \
            timings["finetune_train_s"] + train_s
    probes = {}
    for step in bench.probe_steps(arm, seed):
        probe = json.loads(bench.probe_record(arm, seed, step)[0].read_text(encoding="utf-8"))
        probes[str(step)] = {"retrieval": {sim: {part: {"aggregate": result["aggregate"],
                                                        "per_query": {m: rounded(v) for m, v in
                                                                      result["per_query"].items()}}
                                                 for part, result in by_part.items()}
                                           for sim, by_part in probe["retrieval"].items()},
                             "coverage": trimmed_coverage(probe.get("coverage"))}
    coverage = json.loads((directory / COVERAGE_FILE).read_text(encoding="utf-8"))
    parts = {fold: {key: folds[fold].get(key) for key in ("written", "code", "machine")} for fold in settings.folds}
    return {"format": CELL_FORMAT, "status": DONE, "arm": arm, "seed": seed, "method": arm_method(arm)[0],
            "protocol": dict(protocol), "finetune": bench.finetune_settings(arm_method(arm)[0], protocol),
            "scores": scores, "coverage": trimmed_coverage(coverage), "probes": probes,
            "pretrain": pretrain_speed(directory), "timings": {**timings, "wall_s": round(wall_s, 1)},
            "checkpoint_sha256": checkpoint_digest(settings, arm, seed), "parts": parts,
            **stamp(tier, bench.settings.threads)}


def select_record(bench: Bench, point: Mapping[str, Any], directory: Path, tier: Mapping[str, Any],
                  wall_s: float) -> dict[str, Any]:
    """The record of one dev-grid point: its per-query dev nDCG@10 (the selection compares their means)."""
    name = Path(bench.settings.train).name
    dev = per_query_scores(run_path(directory, name, DEV, bench.settings.split),
                           BeirCollection(bench.data).qrels_path(DEV))
    return {"format": SELECT_FORMAT, "status": DONE, "point": dict(point), "name": point_name(point),
            "arm": bench.settings.select_arm, "seed": bench.settings.arm_seeds(bench.settings.select_arm)[0],
            "fold": bench.settings.folds[0], "dev": {"measure": PRIMARY, "per_query": dev[PRIMARY]},
            "timings": {"finetune_s": _timings(directory).get(RETRIEVER), "wall_s": round(wall_s, 1),
                        "finetune_train_s": finetune_train_s(directory)},
            **stamp(tier, bench.settings.threads)}


def failed_record(kind: str, key: Mapping[str, Any], exc: BaseException, tier: Mapping[str, Any],
                  threads: int | None, wall_s: float) -> dict[str, Any]:
    error = f"{type(exc).__name__}: {exc}".strip()
    return {"format": CELL_FORMAT if kind == "cell" else SELECT_FORMAT, "status": FAILED, **key,
            "error": error, "traceback": traceback.format_exc(limit=8), "timings": {"wall_s": round(wall_s, 1)},
            **stamp(tier, threads)}
