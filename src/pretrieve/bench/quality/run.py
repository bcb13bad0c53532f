"""Running (and resuming) a comparison as cells: the shared inputs, the dev-grid points, every arm × seed.

A comparison is a set of **cells** — a point of the dev grid (the selection arm's first seed fine-tuned on the
first fold with that point, scored on dev) and an arm × seed (its pre-training, every fold's fine-tuning and
evaluation, its coverage and, for the first seed, its probes) — each ending in a small record
(:mod:`pretrieve.bench.quality.records`) in the records directory. The records are the comparison's state: a cell
whose current record exists is done, on any machine and in any checkout (a fresh clone with committed records runs
only the rest); everything reported is recomputed from the records (:mod:`pretrieve.bench.quality.summary`).
``<out>`` is scratch: checkpoints, runs, derived collections, BM25 groups — reused while current
(:mod:`pretrieve.artifacts`: each recipe's ``results.json``, coverage and probe files, the derived collection, the
pre-training union), so that an interrupted cell resumes where it stopped on the same machine.

:func:`run_quality_bench` runs the selection first (the grid points without a record; the protocol is chosen once
all have one), then the arm × seed cells without a current record (``cells``: only those), ``jobs`` at a time as
separate processes (:mod:`concurrent.futures` with the ``spawn`` start method; each process runs one cell with
``threads`` torch threads and writes its record; ``jobs = 1`` runs the same function in this process). A cell that
fails (an exception; a non-finite loss or score) records its error and the others go on; it is not retried unless
``retry_failed``. With ``commit`` every record is committed with git as it lands.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import shutil
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pretrieve import artifacts
from pretrieve.bench.quality import recipes
from pretrieve.bench.quality.arms import NO_PRETRAIN, arm_method
from pretrieve.bench.quality.records import (DONE, FAILED, CELL_FORMAT, SELECT_FORMAT, Records, commit, rounded,
                                             stamp, trimmed_coverage, write_record)
from pretrieve.bench.quality.report import write_report
from pretrieve.bench.quality.settings import (COVERAGE_FILE, PRIMARY, RETRIEVER, QualityBenchSettings, fold_dir,
                                              grid_points, parse_fold, point_name, seed_dir)
from pretrieve.bench.quality.summary import selection, summarize
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import file_digest
from pretrieve.models import no_remote_code

logger = logging.getLogger(__name__)

COVERAGE_KS = (10, 20, 50, 100)
#: Coverage variants: every token, English stopwords excluded, the most frequent corpus tokens excluded.
COVERAGE_VARIANTS = ("raw", "no-stopwords", "no-frequent")
FREQUENT_TOKENS = 500
FREQUENT_SAMPLE = 100_000       # passages of the pre-training corpus whose tokens are counted
PROBE_FILE = "probe.json"
PROBE_DEPTH = 100
DEV = "dev"


# -------------------------------------------------------------------------------------------- inputs
def derived_collection(settings: QualityBenchSettings) -> Path:
    """The training collection with its held-out ``dev`` queries (:func:`pretrieve.data.folds.held_out_dev`: at most
    ``dev_queries`` drawn with ``dev_seed`` from the collection's own ``dev`` split when it has one, else carved out
    of its ``train`` split), in ``<out>/collections/<name>`` (same directory name, so runs are named after the
    collection)."""
    from pretrieve.data.folds import held_out_dev

    return held_out_dev(settings.train, Path(settings.out) / "collections" / Path(settings.train).name,
                        size=settings.dev_queries, seed=settings.dev_seed, train="train")


def pretrain_corpus(settings: QualityBenchSettings) -> str:
    """The pre-training corpus: the one source, or the union of several written once as JSONL (every passage of
    each source in file order, sources in the given order) in ``<out>/pretrain-data/``."""
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    sources = list(settings.pretrain_data)
    if len(sources) == 1:
        return sources[0]
    path = Path(settings.out) / "pretrain-data" / ("+".join(Path(s).stem if Path(s).is_file() else Path(s).name
                                                             for s in sources) + ".jsonl")
    record = {"sources": [Path(s).name for s in sources]}
    inputs = {f"source{i}": s for i, s in enumerate(sources)}
    if not artifacts.is_current(path, record, inputs, kind="pretrain-union"):
        path.parent.mkdir(parents=True, exist_ok=True)
        with artifacts.write_file(path, "pretrain-union", record, inputs) as tmp, \
                open(tmp, "w", encoding="utf-8") as handle:
            for source in sources:
                for text in iter_pretrain_texts(source):
                    handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return str(path)


def bm25_groups(settings: QualityBenchSettings, data: Path, split: str, arm: str) -> Path:
    """Stage-1 training groups (BM25 negatives of ``split`` of the derived collection), built once, shared."""
    from pretrieve.retrieval.bm25 import bm25_negatives

    depth = int(settings.finetune_for(arm_method(arm)[0]).get("bm25_depth", 1000))
    path = Path(settings.out) / "groups" / f"{data.name}-{split}-bm25-{depth}.jsonl"
    return bm25_negatives(data, split, path, depth=depth)


def prepare_pairs(settings: QualityBenchSettings, data: Path) -> Path | None:
    """The training split's (passage, query) pairs for pair-based methods (``dev`` left out; no fold evaluates on
    ``train`` then, :meth:`QualityBenchSettings.resolved`); written once."""
    if not any(recipes.needs_pairs(arm_method(m)[0]) for m in settings.methods):
        return None
    from pretrieve.data import BeirCollection
    from pretrieve.data.spans import write_qrels_pairs

    path = Path(settings.out) / "pairs" / f"{data.name}-train.jsonl"
    if not path.exists():
        count = write_qrels_pairs(BeirCollection(data), "train", path)
        logger.info("wrote %d passage–query pairs of the training split to %s", count, path)
    return path


def coverage_texts(settings: QualityBenchSettings, corpus: str) -> list[str]:
    """The fixed coverage sample: the first ``coverage_texts`` passages of the pre-training corpus."""
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    texts = list(islice(iter_pretrain_texts(corpus), settings.coverage_texts))
    if not texts:
        raise InputError("the pre-training corpus has no passages", path=corpus)
    return texts


# ------------------------------------------------------------------------------------------ the cells
class Bench:
    """One comparison's shared inputs, computed once per process."""

    def __init__(self, settings: QualityBenchSettings):
        self.settings, self.out = settings, Path(settings.out)
        self.data = derived_collection(settings)
        self.corpus = pretrain_corpus(settings)
        self._pairs: Path | None = None
        self._texts: list[str] | None = None
        self._frequent: list[int] | None = None

    # -- recipes
    def pretrained(self, arm: str, seed: int) -> str:
        """The checkpoint an arm × seed fine-tunes: its pre-training's ``final`` (run unless current) or the base."""
        method = arm_method(arm)[0]
        if method == NO_PRETRAIN:
            return self.settings.base
        directory = seed_dir(self.out, arm, seed)
        if not recipes.results_are_current(directory):
            if self._pairs is None and recipes.needs_pairs(method):
                self._pairs = prepare_pairs(self.settings, self.data)
            pretrain = {**self.settings.pretrain, "precision": self.settings.precision}
            if self.settings.probe_steps and seed == self.settings.arm_seeds(arm)[0]:
                pretrain.update(save_every=_gcd(self.settings.probe_steps), keep_checkpoints=0)
            recipe = recipes.pretrain_recipe(f"bench-quality-{arm}-seed{seed}", directory, self.settings.base,
                                             str(self.data), seed, method, pretrain, self.corpus,
                                             self.out / "cache", self._pairs)
            recipes.run_recipe(recipe, directory, self.settings.show_progress)
        return str(directory / "pretrain" / "final")

    def fold(self, arm: str, seed: int, fold: str, chosen: Mapping[str, Any]) -> Path:
        """Fine-tune an arm × seed on a fold's training split and evaluate it on the fold's test split and the
        zero-shot collections; returns the fold's directory."""
        model = self.pretrained(arm, seed)
        directory = seed_dir(self.out, arm, seed) / fold_dir(fold)
        if not recipes.results_are_current(directory):
            train_split, test_split = parse_fold(fold)
            method = arm_method(arm)[0]
            evaluate = [f"{self.data}:{test_split}", *self.zero_shot()]
            recipe = recipes.finetune_recipe(
                f"bench-quality-{arm}-seed{seed}-{fold_dir(fold)}", directory, model, str(self.data), seed,
                self.finetune_settings(method, chosen), train_split,
                bm25_groups(self.settings, self.data, train_split, arm), evaluate, self.settings.depth,
                self.settings.precision)
            recipes.run_recipe(recipe, directory, self.settings.show_progress)
        return directory

    def zero_shot(self) -> list[str]:
        train = Path(self.settings.train).name
        return [f"{path}:{self.settings.split}" for path in self.settings.eval if Path(path).name != train]

    def finetune_settings(self, method: str, chosen: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {**self.settings.finetune_for(method, chosen), "precision": self.settings.precision}

    # -- the protocol chosen on dev
    def select_point(self, point: Mapping[str, Any]) -> Path:
        """Fine-tune the selection arm's first seed on the first fold's training split with one grid point and
        evaluate it on dev only; returns the point's directory (``<out>/select/<point>``)."""
        settings = self.settings
        arm, seed = settings.select_arm, settings.arm_seeds(settings.select_arm)[0]
        train_split = parse_fold(settings.folds[0])[0]
        model = self.pretrained(arm, seed)
        directory = self.out / "select" / point_name(point)
        if not recipes.results_are_current(directory):
            recipe = recipes.finetune_recipe(
                f"bench-quality-select-{point_name(point)}", directory, model, str(self.data), seed,
                {**self.finetune_settings(arm_method(arm)[0]), **point}, train_split,
                bm25_groups(settings, self.data, train_split, arm), [f"{self.data}:{DEV}"], settings.depth,
                settings.precision)
            recipes.run_recipe(recipe, directory, settings.show_progress)
        return directory

    def prepare(self, arms: Sequence[str]) -> None:
        """The inputs cells share, made once before cells run side by side: every fold's (and the selection's)
        BM25 groups and the pairs file of pair-based methods."""
        for split in dict.fromkeys(parse_fold(fold)[0] for fold in self.settings.folds):
            for arm in dict.fromkeys(arms):
                bm25_groups(self.settings, self.data, split, arm)
        if self._pairs is None and any(recipes.needs_pairs(arm_method(arm)[0]) for arm in arms):
            self._pairs = prepare_pairs(self.settings, self.data)

    # -- coverage
    def checkpoint(self, arm: str, seed: int) -> str:
        """Where an arm × seed's checkpoint is (nothing is run): its pre-training's ``final``, or the base."""
        from pretrieve.models import resolve_model

        if arm_method(arm)[0] == NO_PRETRAIN:
            return resolve_model(self.settings.base)
        return str(seed_dir(self.out, arm, seed) / "pretrain" / "final")

    def coverage_record(self, arm: str, seed: int) -> tuple[Path, dict[str, Any], dict[str, str]]:
        """``(coverage.json path, settings, inputs)``: what its artefact sidecar must record to be current."""
        record = {"texts": self.settings.coverage_texts, "max_len": int(self.settings.pretrain.get("max_len", 144)),
                  "ks": list(COVERAGE_KS), "variants": list(COVERAGE_VARIANTS), "frequent": FREQUENT_TOKENS}
        inputs = {"model": self.checkpoint(arm, seed), "corpus": self.corpus}
        return seed_dir(self.out, arm, seed) / COVERAGE_FILE, record, inputs

    def coverage(self, arm: str, seed: int) -> None:
        """``coverage.json`` of the arm × seed's checkpoint (the base for ``none``) unless current."""
        self.pretrained(arm, seed)
        path, record, inputs = self.coverage_record(arm, seed)
        if artifacts.is_current(path, record, inputs, kind="coverage"):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._texts is None:
            self._texts = coverage_texts(self.settings, self.corpus)
        model = inputs["model"]
        report = checkpoint_coverage(model, self._texts, record["max_len"], self.frequent_tokens(model))
        with artifacts.write_file(path, "coverage", record, inputs) as tmp:
            tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    # -- probes
    def probe_steps(self, arm: str, seed: int) -> list[int]:
        """The probed steps of an arm × seed: the chosen steps for each arm's first seed (0 for ``none``: the
        base model), none otherwise."""
        if not self.settings.probe_steps or seed != self.settings.arm_seeds(arm)[0]:
            return []
        return [0] if arm_method(arm)[0] == NO_PRETRAIN else list(self.settings.probe_steps)

    def probe_record(self, arm: str, seed: int, step: int) -> tuple[Path, dict[str, Any], dict[str, str]]:
        """``(probe.json path, settings, inputs)`` of one probed step."""
        directory = seed_dir(self.out, arm, seed) / "probes" / f"step-{step}"
        last = step == int(self.settings.pretrain.get("max_steps") or 0)
        model = self.checkpoint(arm, seed) if step == 0 or last else str(directory / "model")
        record = {"step": step, "depth": PROBE_DEPTH, "collections": [Path(c).name for c in self.settings.eval],
                  "precision": self.settings.precision,
                  "max_len": int(self.settings.pretrain.get("max_len", 144)), "texts": self.settings.coverage_texts,
                  "variants": list(COVERAGE_VARIANTS), "frequent": FREQUENT_TOKENS}
        inputs = {"model": model, "corpus": self.corpus, **{f"collection{i}": c for i, c in enumerate(self.settings.eval)}}
        return directory / PROBE_FILE, record, inputs

    def probe(self, arm: str, seed: int) -> None:
        """At each probed step: [CLS] retrieval without fine-tuning (dot and cosine) on every judged query of every
        split of the evaluation collections, and the coverage variants (:mod:`pretrieve.analysis.probe`)."""
        from pretrieve.analysis.probe import cls_probe, export_checkpoint_encoder

        for step in self.probe_steps(arm, seed):
            path, record, inputs = self.probe_record(arm, seed, step)
            if artifacts.is_current(path, record, inputs, kind="probe"):
                continue
            model = inputs["model"]
            if not Path(model).exists():
                checkpoint = seed_dir(self.out, arm, seed) / "pretrain" / "checkpoints" / f"step-{step}"
                export_checkpoint_encoder(checkpoint, self.checkpoint(arm, seed), model)
            if self._texts is None:
                self._texts = coverage_texts(self.settings, self.corpus)
            result = {"step": step, "retrieval": cls_probe(model, self.settings.eval, path.parent, depth=PROBE_DEPTH,
                                                          precision=self.settings.precision),
                      "coverage": checkpoint_coverage(model, self._texts, record["max_len"],
                                                      self.frequent_tokens(model))}
            with artifacts.write_file(path, "probe", record, inputs) as tmp:
                tmp.write_text(json.dumps(result) + "\n", encoding="utf-8")

    def frequent_tokens(self, model: str) -> list[int]:
        """The :data:`FREQUENT_TOKENS` most frequent tokens of the pre-training corpus (every arm shares the base
        tokenizer; counted once)."""
        if self._frequent is None:
            from transformers import AutoTokenizer

            from pretrieve.analysis.coverage import frequent_token_ids
            from pretrieve.data.pretrain_text import iter_pretrain_texts

            tokenizer = AutoTokenizer.from_pretrained(model, **no_remote_code(model))
            texts = islice(iter_pretrain_texts(self.corpus), FREQUENT_SAMPLE)
            self._frequent = frequent_token_ids(tokenizer, texts, FREQUENT_TOKENS)
        return self._frequent


def _gcd(values: Sequence[int]) -> int:
    result = 0
    for value in values:
        result = math.gcd(result, int(value))
    return result


def checkpoint_coverage(model: str, texts: Sequence[str], max_len: int, frequent: Sequence[int],
                        ks: Sequence[int] = COVERAGE_KS) -> dict:
    """:func:`pretrieve.analysis.coverage.token_coverage` of one checkpoint in each of :data:`COVERAGE_VARIANTS`
    (what ``pretrieve analyze coverage`` computes), without the per-text examples; ``raw`` at the top level."""
    from transformers import AutoTokenizer

    from pretrieve.analysis.coverage import load_encoder, token_coverage

    encoder, created = load_encoder(model)
    tokenizer = AutoTokenizer.from_pretrained(model, **no_remote_code(model))
    variants: dict[str, Any] = {}
    for variant in COVERAGE_VARIANTS:
        try:
            report = token_coverage(encoder, tokenizer, list(texts), ks=ks, max_len=max_len, num_examples=0,
                                    name=str(model), head_created=created,
                                    exclude_stopwords=variant == "no-stopwords",
                                    exclude_ids=frequent if variant == "no-frequent" else ())
        except InputError:
            if variant == "raw":
                raise
            variants[variant] = None   # a tiny corpus: the excluded tokens are every token of every text
            continue
        variants[variant] = report.to_dict()
    return {**variants["raw"], "variants": variants}


# ------------------------------------------------------------------------------------------------ the records
def run_path(directory: Path, collection: str, split: str, zero_shot_split: str) -> Path:
    """The TREC run a fine-tuning recipe in ``directory`` wrote for a collection (``name`` for the zero-shot
    split, else ``name:split``)."""
    tag = collection if split == zero_shot_split else f"{collection}:{split}"
    return directory / "runs" / f"{RETRIEVER}__{tag}.trec"


def per_query_scores(run: Path, qrels: Path) -> dict[str, dict[str, float]]:
    """``{measure: {query id: score}}`` of a saved run against a qrels file (every judged query; one the run
    does not answer scores 0, as ``trec_eval -c``)."""
    from pretrieve.data.beir import load_qrels
    from pretrieve.data.trec import read_run
    from pretrieve.evaluation import RunEvaluator

    if not run.exists():
        raise InputError("the run of a finished recipe is missing", path=run)
    result = RunEvaluator(load_qrels(qrels), list(recipes.MEASURES))(read_run(run), name=str(run))
    return {measure: rounded(result.per_query[measure]) for measure in recipes.MEASURES}


def _timings(directory: Path) -> dict[str, float]:
    path = directory / "results.json"
    return json.loads(path.read_text(encoding="utf-8")).get("timings_s", {}) if path.exists() else {}


def pretrain_speed(directory: Path) -> dict[str, Any] | None:
    """Wall time of a cell's pretrain stage and training samples/s from its ``logs.jsonl``: ``steps × batch /
    Σ window seconds``, complete across resumes."""
    from pretrieve.train.loop import read_logs

    pretrain_dir = directory / "pretrain"
    config_path = pretrain_dir / "pretrain_config.json"
    if not config_path.exists():
        return None
    batch_size = int(json.loads(config_path.read_text(encoding="utf-8"))["batch_size"])
    previous, train_s = 0, 0.0
    for entry in read_logs(pretrain_dir):
        steps = int(entry["step"]) - previous
        previous = int(entry["step"])
        if entry.get("samples_per_s"):
            train_s += steps * batch_size / float(entry["samples_per_s"])
    return {"steps": previous, "batch_size": batch_size, "train_s": train_s,
            "wall_s": _timings(directory).get("pretrain"),
            "samples_per_s": previous * batch_size / train_s if train_s > 0 else None}


def cell_record(bench: Bench, arm: str, seed: int, protocol: Mapping[str, Any], tier: Mapping[str, Any],
                wall_s: float) -> dict[str, Any]:
    """The record of a finished arm × seed (module docstring of :mod:`pretrieve.bench.quality.records`)."""
    from pretrieve.data.collection import BeirCollection

    settings = bench.settings
    directory = seed_dir(bench.out, arm, seed)
    in_domain = Path(settings.train).name
    scores: dict[str, dict[str, Any]] = {}
    timings = {"finetune_s": 0.0, "evaluate_s": 0.0}
    for fold in settings.folds:
        fold_path = directory / fold_dir(fold)
        test_split = parse_fold(fold)[1]
        for path in settings.eval:
            name = Path(path).name
            split, qrels = (test_split, BeirCollection(bench.data).qrels_path(test_split)) if name == in_domain \
                else (settings.split, BeirCollection(Path(path)).qrels_path(settings.split))
            scores.setdefault(name, {})[fold] = per_query_scores(run_path(fold_path, name, split, settings.split),
                                                                 qrels)
        fold_timings = _timings(fold_path)
        timings["finetune_s"] += float(fold_timings.get(RETRIEVER, 0.0))
        timings["evaluate_s"] += float(fold_timings.get("evaluate", 0.0))
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
    weights = directory / "pretrain" / "final" / "model.safetensors"
    return {"format": CELL_FORMAT, "status": DONE, "arm": arm, "seed": seed, "method": arm_method(arm)[0],
            "protocol": dict(protocol), "finetune": bench.finetune_settings(arm_method(arm)[0], protocol),
            "scores": scores, "coverage": trimmed_coverage(coverage), "probes": probes,
            "pretrain": pretrain_speed(directory), "timings": {**timings, "wall_s": round(wall_s, 1)},
            "checkpoint_sha256": file_digest(weights) if weights.exists() else None,
            **stamp(tier, bench.settings.threads)}


def select_record(bench: Bench, point: Mapping[str, Any], directory: Path, tier: Mapping[str, Any],
                  wall_s: float) -> dict[str, Any]:
    """The record of one dev-grid point: its per-query dev nDCG@10 (the selection compares their means)."""
    from pretrieve.data.collection import BeirCollection

    name = Path(bench.settings.train).name
    dev = per_query_scores(run_path(directory, name, DEV, bench.settings.split),
                           BeirCollection(bench.data).qrels_path(DEV))
    return {"format": SELECT_FORMAT, "status": DONE, "point": dict(point), "name": point_name(point),
            "arm": bench.settings.select_arm, "seed": bench.settings.arm_seeds(bench.settings.select_arm)[0],
            "fold": bench.settings.folds[0], "dev": {"measure": PRIMARY, "per_query": dev[PRIMARY]},
            "timings": {"finetune_s": _timings(directory).get(RETRIEVER), "wall_s": round(wall_s, 1)},
            **stamp(tier, bench.settings.threads)}


def failed_record(kind: str, key: Mapping[str, Any], exc: BaseException, tier: Mapping[str, Any],
                  threads: int | None, wall_s: float) -> dict[str, Any]:
    error = f"{type(exc).__name__}: {exc}".strip()
    return {"format": CELL_FORMAT if kind == "cell" else SELECT_FORMAT, "status": FAILED, **key,
            "error": error, "traceback": traceback.format_exc(limit=8), "timings": {"wall_s": round(wall_s, 1)},
            **stamp(tier, threads)}


# ---------------------------------------------------------------------------------------------------- the jobs
def run_job(settings: QualityBenchSettings, tier: Mapping[str, Any], kind: str, payload: Mapping[str, Any]) -> dict:
    """One cell, in whatever process runs it: ``kind`` ``"select"`` (``payload``: the grid point) or ``"cell"``
    (``arm``, ``seed``, ``protocol``). Writes the cell's record (a failed one on any exception) and returns
    ``{"path", "status", "line"}``."""
    import torch

    if settings.threads:
        torch.set_num_threads(settings.threads)
    records = Records(settings.records)
    started = time.perf_counter()
    bench = Bench(settings)
    if kind == "select":
        point = dict(payload["point"])
        key, path = {"point": point, "name": point_name(point)}, records.select_path(point_name(point))
        try:
            record = select_record(bench, point, bench.select_point(point), tier, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - a point that fails (diverges) is recorded and cannot be chosen
            record = failed_record(kind, key, exc, tier, settings.threads, time.perf_counter() - started)
    else:
        arm, seed, protocol = payload["arm"], int(payload["seed"]), dict(payload["protocol"])
        key, path = {"arm": arm, "seed": seed, "protocol": protocol}, records.cell_path(arm, seed)
        try:
            run_cell(bench, arm, seed, protocol)
            record = cell_record(bench, arm, seed, protocol, tier, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - any failure of one cell must not stop the others
            record = failed_record(kind, key, exc, tier, settings.threads, time.perf_counter() - started)
        if record["status"] == DONE and not settings.keep_checkpoints:
            for checkpoints in seed_dir(bench.out, arm, seed).glob("**/checkpoints"):
                shutil.rmtree(checkpoints, ignore_errors=True)
    write_record(path, record)
    label = key.get("name") or f"{key['arm']}/seed{key['seed']}"
    wall = record["timings"]["wall_s"]
    line = f"{label}: done in {wall:.0f} s" if record["status"] == DONE else \
        f"{label}: FAILED — {record['error'].splitlines()[0][:200]}"
    return {"path": str(path), "status": record["status"], "line": line}


def run_jobs(settings: QualityBenchSettings, tier: Mapping[str, Any], jobs: Sequence[tuple[str, dict]],
             parallel: int, say: Callable[[str], None], landed: Callable[[dict], None]) -> list[dict]:
    """Run ``jobs`` (``(kind, payload)``) ``parallel`` at a time, each in its own process (``spawn``; one cell per
    process, so its memory is returned), or in this process when ``parallel`` is 1; ``landed`` is called with each
    result as it comes in."""
    results = []
    if parallel <= 1 or len(jobs) <= 1:
        for index, (kind, payload) in enumerate(jobs, 1):
            say(f"[{index}/{len(jobs)}] {kind} {_job_label(kind, payload)}: running")
            result = run_job(settings, tier, kind, payload)
            say(f"[{index}/{len(jobs)}] {result['line']}")
            landed(result)
            results.append(result)
        return results
    options: dict[str, Any] = {"max_workers": parallel, "mp_context": multiprocessing.get_context("spawn")}
    if "max_tasks_per_child" in ProcessPoolExecutor.__init__.__code__.co_varnames:
        options["max_tasks_per_child"] = 1
    with ProcessPoolExecutor(**options) as pool:
        pending: dict[Future, tuple[str, dict]] = {}
        queue = list(jobs)
        done_count = 0
        while queue or pending:
            while queue and len(pending) < parallel:
                kind, payload = queue.pop(0)
                say(f"[{done_count + len(pending) + 1}/{len(jobs)}] {kind} {_job_label(kind, payload)}: running")
                pending[pool.submit(run_job, settings, tier, kind, payload)] = (kind, payload)
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                kind, payload = pending.pop(future)
                done_count += 1
                result = future.result()
                say(f"[{done_count}/{len(jobs)}] {result['line']}")
                landed(result)
                results.append(result)
    return results


def _job_label(kind: str, payload: Mapping[str, Any]) -> str:
    return point_name(payload["point"]) if kind == "select" else f"{payload['arm']}/seed{payload['seed']}"


def parse_cells(items: Sequence[str], settings: QualityBenchSettings) -> list[tuple[str, int]]:
    """``--cells ARM:SEED,ARM`` → the arm × seed cells to run (``ARM`` alone: every seed of the arm); each must
    be an arm and seed of the comparison (an A/A arm's seeds are its shifted ones)."""
    cells: list[tuple[str, int]] = []
    for item in items:
        arm, _, seed = str(item).strip().partition(":")
        if arm not in settings.methods:
            raise ConfigError(f"cell '{item}': '{arm}' is not an arm of the comparison ({', '.join(settings.methods)})")
        seeds = settings.arm_seeds(arm)
        if seed:
            try:
                chosen = [int(seed)]
            except ValueError:
                raise ConfigError(f"cell '{item}': the seed must be a number, e.g. {arm}:{seeds[0]}") from None
            if chosen[0] not in seeds:
                raise ConfigError(f"cell '{item}': seed {chosen[0]} is not one of {arm}'s seeds {seeds}")
        else:
            chosen = seeds
        cells += [(arm, s) for s in chosen if (arm, s) not in cells]
    return cells


# ---------------------------------------------------------------------------------------------- running
def run_quality_bench(settings: QualityBenchSettings, progress: Callable[[str], None] | None = None,
                      cells: Sequence[str] | None = None, select_only: bool = False, jobs: int = 1,
                      commit_records: bool = False) -> dict[str, Any]:
    """Run (or resume) the comparison's cells that have no current record and write the report; returns
    :func:`~pretrieve.bench.quality.summary.summarize`'s dict. ``cells``: only these arm × seeds (``ARM:SEED`` or
    ``ARM``); ``select_only``: only the dev grid; ``jobs``: cells at once, each in its own process;
    ``commit_records``: commit each record with git as it lands."""
    settings = settings.resolved()
    if jobs < 1:
        raise ConfigError(f"jobs must be ≥ 1, got {jobs}")
    if settings.threads is None:
        settings = replace(settings, threads=max(1, (os.cpu_count() or 1) // jobs))
    wanted = parse_cells(cells, settings) if cells else [(a, s) for a in settings.methods for s in settings.arm_seeds(a)]
    say = progress or (lambda line: logger.info("%s", line))
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    records = Records(settings.records)
    tier = records.open(settings.fingerprint(), settings.precision, settings.growing())
    if commit_records:
        commit([records.tier_path], f"Claims records ({records.root.name}): tier.json")
    bench = Bench(settings)     # the derived collection and the pre-training union, made once here

    def landed(result: Mapping[str, Any]) -> None:
        if commit_records:
            commit([Path(result["path"])], f"Claims records ({records.root.name}): {result['line']}")

    state = selection(records, tier)
    if state is not None and state["todo"]:
        select_arm = settings.select_arm
        bench.prepare([select_arm])
        say(f"[select] pre-training {select_arm}/seed{settings.arm_seeds(select_arm)[0]} for the dev grid "
            f"({len(state['todo'])} of {len(grid_points(tier['grid']))} points to run)")
        # at the cells' own thread count, not threads × jobs: the checkpoint is also that arm × seed's cell, and
        # torch's CPU kernels round differently with another thread count (--jobs 2 must give --jobs 1's records)
        _with_threads(settings.threads, lambda: bench.pretrained(select_arm, settings.arm_seeds(select_arm)[0]))
        points = {point_name(p): p for p in grid_points(tier["grid"])}
        run_jobs(settings, tier, [("select", {"point": points[name]}) for name in state["todo"]], jobs, say, landed)
        state = selection(records, tier)
    if state is not None:
        scores = ", ".join(f"{name} {value:.4f}" for name, value in state["scores"].items())
        say(f"[select] dev {PRIMARY}: {scores}")
        if state["chosen"] is None:
            say("[select] no protocol chosen yet (points missing or all failed): no arm × seed cell runs")
    protocol = None if state is None else state["chosen"]
    if not select_only and (state is None or protocol is not None):
        protocol = protocol or {}
        todo = []
        for arm, seed in wanted:
            record = records.cell(arm, seed, tier, protocol, status=None)
            if record is not None and record["status"] == DONE:
                say(f"{arm}/seed{seed}: recorded, skipped")
            elif record is not None and not settings.retry_failed:
                say(f"{arm}/seed{seed}: failed earlier ({record.get('error', '?').splitlines()[0][:160]}), skipped "
                    "(--retry-failed runs it again)")
            else:
                todo.append((arm, seed))
        if todo:
            bench.prepare([arm for arm, _ in todo])
            run_jobs(settings, tier, [("cell", {"arm": arm, "seed": seed, "protocol": protocol})
                                      for arm, seed in todo], jobs, say, landed)
    summary = summarize(records.root)
    write_report(out, summary, records.root, plot=True)
    return summary


def _with_threads(threads: int, work: Callable[[], Any]) -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        return work()
    finally:
        torch.set_num_threads(before)


def run_cell(bench: Bench, arm: str, seed: int, chosen: Mapping[str, Any]) -> None:
    """One arm × seed: its pre-training, every fold, the coverage of its checkpoint, its probes (first seed)."""
    for fold in bench.settings.folds:
        bench.fold(arm, seed, fold, chosen)
    bench.coverage(arm, seed)
    bench.probe(arm, seed)
