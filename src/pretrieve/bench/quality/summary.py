"""What the report of ``pretrieve bench quality`` shows, recomputed from ``bench.json`` and the saved TREC runs only.

Per arm, measure and collection (the training collection pooled over the folds, each zero-shot collection):

* **cell** — each seed's score (in-domain: the mean over the pooled queries of every fold's test split, each
  query scored by the model that did not train on it; zero-shot: per query the mean over the folds' models, then
  the mean over queries); mean ± sample standard deviation (ddof 1; 0 with one seed) over seeds;
* **avg** — per seed, the mean over collections; then mean ± std over seeds;
* **vs** — the secondary paired t-test (:func:`pretrieve.evaluation.significance.paired_ttest`) against ``mlm``
  and ``none``, over the per-query scores averaged over each arm's seeds (a query evaluated in neither arm is left
  out; one missing from a run scores 0 there);
* **contrasts** — for every contrast of the declared family: the multi-bootstrap
  (:func:`pretrieve.evaluation.significance.multi_bootstrap`, queries resampled within folds, seeds within arms):
  Δ, its 95 % interval, p, σ_q, τ, the standard error and the MDE (80 % power; also at Holm's first step); the
  Holm-adjusted p over the family (per measure and collection); the t-test; and the decision of the issue's rule
  (:func:`pretrieve.evaluation.significance.decide`) with the margin;
* **pre-training speed** — wall time of the ``pretrain`` recipe and samples/s of training alone from the trainer's
  ``logs.jsonl`` (``steps × batch / Σ window seconds``, complete across resumes); fine-tuning and evaluation
  seconds summed over folds; means over seeds;
* **coverage** — the mean over seeds of each coverage variant's ratio per k.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pretrieve.bench.quality.arms import BASELINES, arm_seeds, parse_contrast, split_family
from pretrieve.bench.quality.recipes import MEASURES
from pretrieve.bench.quality.settings import (COVERAGE_FILE, RETRIEVER, STATE_FILE, fold_dir, parse_fold, run_key,
                                              seed_dir)
from pretrieve.errors import InputError

_EVALUATED: dict[tuple, Any] = {}


def _evaluated(evaluator, run_path: Path, qrels_path: Path):
    """The run's :class:`EvalResult`, memoised per (run file, qrels file) with their sizes and mtimes, so that
    the partial reports written while a comparison runs do not re-read every earlier run."""
    from pretrieve.data.trec import read_run

    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in (run_path, qrels_path))
    if key not in _EVALUATED:
        _EVALUATED[key] = evaluator(read_run(run_path), name=str(run_path))
    return _EVALUATED[key]


def run_path(out: Path, arm: str, seed: int, fold: str, collection: str, split: str) -> Path:
    """The saved TREC run of an arm × seed's fold model on a collection (``name`` or ``name:split``)."""
    tag = collection if split == "test" else f"{collection}:{split}"
    return seed_dir(out, arm, seed) / fold_dir(fold) / "runs" / f"{RETRIEVER}__{tag}.trec"


class Scores:
    """Per-query scores of every finished arm × seed: ``scores(arm, seed, collection, measure)`` →
    ``{query key: score}``; in-domain keys are ``(fold, query id)``, zero-shot ones the query id."""

    def __init__(self, out: Path, fingerprint: Mapping[str, Any]):
        from pretrieve.data.beir import load_qrels
        from pretrieve.data.collection import BeirCollection
        from pretrieve.evaluation import RunEvaluator

        self.out = out
        self.folds = list(fingerprint.get("folds") or ["train:test"])
        train = Path(fingerprint["train"]).name
        self.in_domain = train
        self.split = fingerprint["split"]
        self.names = [Path(c).name for c in fingerprint["eval"]]
        derived = out / "collections" / train
        self.qrels: dict[tuple[str, str], Path] = {}
        for fold in self.folds:
            self.qrels[(train, fold)] = BeirCollection(derived).qrels_path(parse_fold(fold)[1])
        for path in fingerprint["eval"]:
            if Path(path).name != train:
                self.qrels[(Path(path).name, "")] = BeirCollection(Path(path)).qrels_path(self.split)
        self.evaluators = {key: RunEvaluator(load_qrels(path), list(MEASURES)) for key, path in self.qrels.items()}

    def runs(self, arm: str, seed: int) -> dict[str, dict[str, Path]]:
        """``{fold: {collection: run file}}``."""
        return {fold: {name: run_path(self.out, arm, seed, fold, name,
                                      parse_fold(fold)[1] if name == self.in_domain else self.split)
                       for name in self.names} for fold in self.folds}

    def results(self, arm: str, seed: int, fold: str, name: str):
        key = (name, fold if name == self.in_domain else "")
        path = self.runs(arm, seed)[fold][name]
        return _evaluated(self.evaluators[key], path, self.qrels[key])

    def scores(self, arm: str, seed: int, name: str, measure: str) -> dict[Any, float]:
        if name == self.in_domain:
            return {(fold, qid): value for fold in self.folds
                    for qid, value in self.results(arm, seed, fold, name).per_query[measure].items()}
        per_fold = [self.results(arm, seed, fold, name).per_query[measure] for fold in self.folds]
        queries = list(dict.fromkeys(q for scores in per_fold for q in scores))
        return {qid: float(np.mean([scores.get(qid, 0.0) for scores in per_fold])) for qid in queries}


def _mean_std(per_seed: Mapping[int, float]) -> dict[str, Any]:
    values = np.array(list(per_seed.values()), dtype=np.float64)
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return {"mean": float(values.mean()), "std": std, "n": len(values),
            "per_seed": {str(seed): float(value) for seed, value in per_seed.items()}}


def arm_matrix(per_seed: Sequence[Mapping[Any, float]], keys: Sequence[Any]) -> np.ndarray:
    """Seeds × queries (a query missing from a seed's run scores 0)."""
    return np.array([[scores.get(key, 0.0) for key in keys] for scores in per_seed], dtype=np.float64)


def _paired(a: Sequence[Mapping[Any, float]], b: Sequence[Mapping[Any, float]]) -> tuple[list, np.ndarray, np.ndarray]:
    """The queries evaluated in either arm (any seed), in first-seen order, and both arms' matrices."""
    keys = list(dict.fromkeys(key for scores in [*a, *b] for key in scores))
    return keys, arm_matrix(a, keys), arm_matrix(b, keys)


def _ttest(a, b, alpha: float) -> dict:
    from pretrieve.evaluation.significance import paired_ttest

    _, x, y = _paired(a, b)
    return paired_ttest(y.mean(axis=0), x.mean(axis=0), alpha=alpha).to_dict()


def contrast_entries(per_arm: Mapping[str, Sequence[Mapping[Any, float]]], contrasts: Sequence[str],
                     alpha: float, margin: float, n_boot: int) -> list[dict[str, Any]]:
    """Every contrast whose two arms have results: bootstrap, Holm within its family (``FAMILY:a-b``; unlabelled
    contrasts form the primary family) over those that have results, t-test, decision."""
    from pretrieve.evaluation.significance import decide, holm, multi_bootstrap

    arms = list(per_arm)
    entries = []
    for labelled in contrasts:
        family, name = split_family(labelled)
        a, b = parse_contrast(name, arms)
        if not per_arm.get(a) or not per_arm.get(b):
            continue
        keys, x, y = _paired(per_arm[a], per_arm[b])
        if not keys:
            continue
        folds = [key[0] if isinstance(key, tuple) else "all" for key in keys]
        result = multi_bootstrap(x, y, folds, n_boot=n_boot, alpha=alpha)
        entries.append({"contrast": name, "family": family, "a": a, "b": b, **result.to_dict(),
                        "ttest": _ttest(per_arm[a], per_arm[b], alpha)})
    for family in dict.fromkeys(e["family"] for e in entries):
        members = [e for e in entries if e["family"] == family]
        adjusted = holm([e["p_value"] for e in members])
        for entry, p_holm in zip(members, adjusted):
            entry["p_holm"] = float(p_holm)
            entry["mde_holm"] = _mde(entry["se"], alpha, len(members))
            entry["decision"] = decide(entry["delta"], entry["ci_high"], entry["p_holm"], margin, alpha)
            entry["representation_changed"] = None
    return entries


def _mde(se: float, alpha: float, tests: int) -> float:
    from pretrieve.evaluation.significance import minimum_detectable_effect

    return minimum_detectable_effect(se, alpha=alpha, tests=tests)


def summarize(out: str | Path) -> dict[str, Any]:
    """Everything the report shows, recomputed from ``bench.json`` and the saved runs of ``out``."""
    out = Path(out)
    path = out / STATE_FILE
    if not path.exists():
        raise InputError("no comparison here (bench.json missing)", path=path)
    state = json.loads(path.read_text(encoding="utf-8"))
    recorded = state["settings"]
    fingerprint = recorded["fingerprint"]
    methods, seeds = recorded["methods"], recorded["seeds"]
    alpha = float(recorded.get("alpha", 0.05))
    margin, n_boot = float(recorded.get("margin", 0.02)), int(recorded.get("bootstrap", 10_000))
    contrasts = list(recorded.get("contrasts", []))
    scores = Scores(out, fingerprint)
    names = scores.names

    entries: dict[str, dict[str, Any]] = {}
    for arm in methods:
        done, failed, pending = [], {}, []
        for seed in arm_seeds(arm, seeds):
            record = state["runs"].get(run_key(arm, seed), {})
            runs = scores.runs(arm, seed)
            if record.get("status") == "done" and all(p.exists() for fold in runs.values() for p in fold.values()):
                done.append(seed)   # (a finished run whose files were removed is pending: a rerun redoes it)
            elif record.get("status") == "failed":
                failed[seed] = record.get("error", "unknown error")
            else:
                pending.append(seed)
        status = "done" if done and not failed and not pending else "failed" if failed and not done else \
            "partial" if done else "pending"
        entries[arm] = {"status": status, "seeds": done, "failed": {str(s): e for s, e in failed.items()},
                        "pending": pending,
                        "runs": {str(s): {fold: {n: str(p) for n, p in files.items()}
                                          for fold, files in scores.runs(arm, s).items()} for s in done},
                        "scores": {}, "coverage": _coverage_summary(out, arm, done),
                        "pretrain": _pretrain_summary(out, arm, done, scores.folds)}

    per_query = {measure: {name: {arm: [scores.scores(arm, s, name, measure) for s in entry["seeds"]]
                                  for arm, entry in entries.items()} for name in names} for measure in MEASURES}
    for arm, entry in entries.items():
        if not entry["seeds"]:
            continue
        for measure in MEASURES:
            cells: dict[str, Any] = {}
            for name in names:
                per_seed = {seed: float(np.mean(list(values.values()))) if values else 0.0
                            for seed, values in zip(entry["seeds"], per_query[measure][name][arm])}
                cell = _mean_std(per_seed)
                cell["vs"] = {baseline: _ttest(per_query[measure][name][arm], per_query[measure][name][baseline],
                                               alpha)
                              for baseline in BASELINES if baseline != arm and per_query[measure][name].get(baseline)}
                cells[name] = cell
            per_seed_avg = {seed: float(np.mean([cells[n]["per_seed"][str(seed)] for n in names]))
                            for seed in entry["seeds"]}
            cells["avg"] = _mean_std(per_seed_avg)
            entry["scores"][measure] = cells
    contrast_table = {measure: {name: contrast_entries(per_query[measure][name], contrasts, alpha, margin, n_boot)
                                for name in names} for measure in MEASURES}
    moved = ((state.get("gates") or {}).get("objectives_move_representation") or {}).get("arms", {})
    for entry in (e for by_name in contrast_table.values() for entries in by_name.values() for e in entries):
        if entry["b"] == "mlm" and entry["a"] in moved:
            entry["representation_changed"] = bool(moved[entry["a"]]["moved"])
    return {"settings": {**fingerprint, "methods": methods, "seeds": seeds, "alpha": alpha, "margin": margin,
                         "bootstrap": n_boot, "contrasts": contrasts},
            "collections": names, "in_domain": scores.in_domain, "measures": list(MEASURES), "retriever": RETRIEVER,
            "selection": state.get("selection"), "methods": entries, "contrasts": contrast_table,
            "gates": state.get("gates")}


def per_query_rows(out: str | Path, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every finished arm × seed's per-query scores with their fold label (``per_query.tsv``): in-domain rows
    carry the fold whose model scored the query; zero-shot rows the mean over the folds' models (fold ``mean``)."""
    out = Path(out)
    state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
    scores = Scores(out, state["settings"]["fingerprint"])
    rows = []
    for arm, entry in summary["methods"].items():
        for seed in entry["seeds"]:
            for name in scores.names:
                by_measure = {m: scores.scores(arm, seed, name, m) for m in MEASURES}
                for key in by_measure[MEASURES[0]]:
                    fold, qid = key if isinstance(key, tuple) else ("mean", key)
                    rows.append({"arm": arm, "seed": seed, "collection": name, "fold": fold, "query": qid,
                                 **{m: by_measure[m].get(key, 0.0) for m in MEASURES}})
    return rows


def _coverage_summary(out: Path, arm: str, seeds: Sequence[int]) -> dict[str, Any]:
    reports = []
    for seed in seeds:
        path = seed_dir(out, arm, seed) / COVERAGE_FILE
        if path.exists():
            reports.append(json.loads(path.read_text(encoding="utf-8")))
    if not reports:
        return {}
    ks = sorted({int(k) for report in reports for k in report["coverage"]})

    def mean_ratio(key: str) -> dict[str, float]:
        found = [r.get("variants", {}).get(key, r if key == "raw" else None) for r in reports]
        found = [f for f in found if f]
        return {str(k): float(np.mean([f["coverage"][str(k)] for f in found if str(k) in f["coverage"]]))
                for k in ks} if found else {}

    variants = sorted({v for r in reports for v in r.get("variants", {})}) or ["raw"]
    return {"ratio": mean_ratio("raw"), "variants": {v: mean_ratio(v) for v in variants},
            "head_created": any(r.get("head_created") for r in reports), "num_texts": reports[0].get("num_texts")}


def pretrain_speed(directory: Path) -> dict[str, Any] | None:
    """Wall time of a run's pretrain stage and training samples/s from its ``logs.jsonl`` (module docstring)."""
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
    timings = _timings(directory)
    return {"steps": previous, "batch_size": batch_size, "train_s": train_s, "wall_s": timings.get("pretrain"),
            "samples_per_s": previous * batch_size / train_s if train_s > 0 else None}


def _timings(directory: Path) -> dict[str, float]:
    path = directory / "results.json"
    return json.loads(path.read_text(encoding="utf-8")).get("timings_s", {}) if path.exists() else {}


def _pretrain_summary(out: Path, arm: str, seeds: Sequence[int], folds: Sequence[str]) -> dict[str, Any]:
    speeds = [s for s in (pretrain_speed(seed_dir(out, arm, seed)) for seed in seeds) if s is not None]
    summary: dict[str, Any] = {}
    for key in ("wall_s", "train_s", "samples_per_s"):
        values = [s[key] for s in speeds if s.get(key) is not None]
        summary[key] = float(np.mean(values)) if values else None
    for key, stage in (("finetune_s", RETRIEVER), ("evaluate_s", "evaluate")):
        values = []
        for seed in seeds:
            times = [_timings(seed_dir(out, arm, seed) / fold_dir(f)).get(stage) for f in folds]
            if all(t is not None for t in times):
                values.append(float(sum(times)))
        summary[key] = float(np.mean(values)) if values else None
    return summary
