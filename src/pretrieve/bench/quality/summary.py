"""What the report of ``pretrieve bench quality`` shows, recomputed from the comparison's records only.

The records (:mod:`pretrieve.bench.quality.records`: ``tier.json``, one file per dev-grid point and per arm × seed)
are the one input: no checkpoint, run file or scratch directory is read, so a fresh clone with the committed records
rebuilds every number. Per arm, measure and collection:

* **cell** — each seed's score (in-domain: the mean over the pooled queries of every fold's test split, each
  query scored by the model that did not train on it; zero-shot: per query the mean over the folds' models, then
  the mean over queries); mean ± sample standard deviation (ddof 1; 0 with one seed) over seeds;
* **avg** — per seed, the mean over collections; then mean ± std over seeds;
* **vs** — the secondary paired t-test (:func:`pretrieve.evaluation.significance.paired_ttest`) against ``mlm``
  and ``none``, over the per-query scores averaged over each arm's seeds (it ignores seed variance: descriptive);
* **contrasts** — for every contrast of the declared family: the multi-bootstrap
  (:func:`pretrieve.evaluation.significance.multi_bootstrap`, queries resampled within folds, seeds within arms):
  Δ, its 95 % interval, p, σ_q, τ, the standard error, the MDE of the test and of the rule, the rule's power at
  the margin; the Holm-adjusted p over the family (a declared contrast without results counts as p = 1, so the
  family keeps its size); the t-test; and the decision of the rule
  (:func:`pretrieve.evaluation.significance.decide`; *descriptive* when an arm has one seed);
* **pre-training speed** — samples/s of training from the trainer's logs and the stages' wall times, means over
  seeds; **coverage** — the mean over seeds of each coverage variant's ratio per k;
* **selection** — every dev-grid point's dev score and the chosen point (once every point has a record);
* **gates** — :func:`pretrieve.bench.quality.gates.compute_gates` on the records' probes and coverage.

Only current records count (:meth:`pretrieve.bench.quality.records.Records.cell`): a record made with another
precision, other settings or another protocol is neither done nor pending work's result — it is ignored (and the
harness runs the cell again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pretrieve.bench.quality.arms import BASELINES, arm_seeds, parse_contrast, split_family
from pretrieve.bench.quality.gates import compute_gates
from pretrieve.bench.quality.records import DONE, FAILED, Records
from pretrieve.bench.quality.recipes import MEASURES
from pretrieve.bench.quality.settings import PRIMARY, RETRIEVER, grid_points, point_name
from pretrieve.evaluation.significance import (decide, holm, minimum_detectable_effect, multi_bootstrap, paired_ttest,
                                               rule_mde, rule_power)


def flat_settings(tier: Mapping[str, Any]) -> dict[str, Any]:
    """The tier's settings as the report shows them: collections and models by name (their digests under
    ``identities``), with the growing lists and the statistics' settings."""
    fp = tier["fingerprint"]
    names = {"base": fp["base"]["name"], "train": fp["train"]["name"], "eval": [e["name"] for e in fp["eval"]],
             "pretrain_data": [e["name"] for e in fp["pretrain_data"]]}
    return {**fp, **names, "identities": {k: fp[k] for k in names}, "precision": tier["precision"],
            "methods": list(tier.get("methods") or []), "seeds": list(tier.get("seeds") or []),
            "contrasts": list(tier.get("contrasts") or []), "grid": tier.get("grid") or {},
            "alpha": float(tier.get("alpha", 0.05)), "margin": float(tier.get("margin", 0.02)),
            "bootstrap": int(tier.get("bootstrap", 10_000)), "select_arm": tier.get("select_arm")}


def selection(records: Records, tier: Mapping[str, Any]) -> dict[str, Any] | None:
    """The dev grid's state from the records: every point's dev score (``scores``: the dev curve), the points
    still to run, the best point — the best dev nDCG@10 (computed from the per-query scores; ties to the first
    point of the grid order) once every point has a current record — and the chosen one. None without a grid.

    The convergence rule (pre-registration amendment 9(a)): when the best point lies on the grid's upper edge
    (``edge``: its largest lr and/or epochs) and the grid has not grown yet, the grid grows once in those directions
    (``grow``: the tier's ``grid_grow`` values of those axes, crossed with the other axis' values) and nothing is
    chosen until the grown grid is scored; the grid has grown (``grown``) once any growth value is in it. After
    that the best point is chosen even on the edge, and ``edge`` says the protocol may not have converged."""
    grid = tier.get("grid") or {}
    if not grid:
        return None
    points = grid_points(grid)
    scores, todo, failed = {}, [], {}
    for point in points:
        name = point_name(point)
        record = records.select_point(name, tier)
        if record is None:
            todo.append(name)
        elif record.get("status") == FAILED:
            failed[name] = record.get("error")
            scores[name] = float("-inf")    # a point that diverged cannot be chosen
        else:
            per_query = record["dev"]["per_query"]
            scores[name] = float(np.mean(list(per_query.values()))) if per_query else 0.0
    best = None
    if not todo:
        index = max(range(len(points)), key=lambda i: (scores[point_name(points[i])], -i))
        if scores[point_name(points[index])] > float("-inf"):
            best = points[index]
    allowed = {key: list(values) for key, values in (tier.get("grid_grow") or {}).items() if values}
    edge, grow = upper_edge(grid, best, allowed), {}
    grown = any(value in grid.get(key, ()) for key, values in allowed.items() for value in values)
    if best is not None and not grown:
        grow = {key: allowed[key] for key in edge if key in allowed}
    fp = tier["fingerprint"]
    arm = tier.get("select_arm")
    seed = arm_seeds(arm, tier.get("seeds") or [0])[0] if arm else None
    return {"arm": arm, "seed": seed, "fold": fp["folds"][0], "measure": PRIMARY, "split": "dev",
            "dev_queries": fp.get("dev_queries"), "grid": grid, "scores": scores, "failed": failed, "todo": todo,
            "best": best, "edge": edge, "grid_grow": allowed, "grown": grown, "grow": grow,
            "chosen": None if grow else best}


def upper_edge(grid: Mapping[str, Sequence], point: Mapping[str, Any] | None,
               grow: Mapping[str, Sequence] | None = None) -> list[str]:
    """The grid's axes (``lr``, ``epochs``) on whose largest value ``point`` lies: axes searched over several
    values, or that may grow (``grow``); a single fixed value is no edge."""
    if point is None:
        return []
    return [key for key in ("lr", "epochs") if grid.get(key) and point.get(key) == max(grid[key])
            and (len(grid[key]) > 1 or key in (grow or {}))]


class Scores:
    """Per-query scores of every finished arm × seed, from its record: ``scores(arm, seed, collection, measure)``
    → ``{query key: score}``; in-domain keys are ``(fold, query id)``, zero-shot ones the query id (its score the
    mean over the folds' models; a query a fold's model did not answer scores 0 there)."""

    def __init__(self, cells: Mapping[tuple[str, int], Mapping[str, Any]], in_domain: str):
        self.cells, self.in_domain = cells, in_domain

    def scores(self, arm: str, seed: int, name: str, measure: str) -> dict[Any, float]:
        by_fold = self.cells[(arm, seed)]["scores"][name]
        if name == self.in_domain:
            return {(fold, qid): float(value) for fold, per in by_fold.items() for qid, value in per[measure].items()}
        per_fold = [per[measure] for per in by_fold.values()]
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
    _, x, y = _paired(a, b)
    return paired_ttest(y.mean(axis=0), x.mean(axis=0), alpha=alpha).to_dict()


def contrast_entries(per_arm: Mapping[str, Sequence[Mapping[Any, float]]], contrasts: Sequence[str],
                     alpha: float, margin: float, n_boot: int) -> list[dict[str, Any]]:
    """Every declared contrast: bootstrap, Holm within its family (``FAMILY:a-b``; unlabelled contrasts form the
    primary family), t-test, decision. A declared contrast whose arms have no results yet stays in its family with
    p = 1 (``missing``: no estimate) so that the family keeps its registered size — Holm never adjusts over fewer
    tests because an arm failed or has not run."""
    arms = list(per_arm)
    entries = []
    for labelled in contrasts:
        family, name = split_family(labelled)
        a, b = parse_contrast(name, arms)
        keys, x, y = _paired(per_arm.get(a) or [], per_arm.get(b) or [])
        if not per_arm.get(a) or not per_arm.get(b) or not keys:
            entries.append({"contrast": name, "family": family, "a": a, "b": b, "missing": True, "p_value": 1.0})
            continue
        folds = [key[0] if isinstance(key, tuple) else "all" for key in keys]
        result = multi_bootstrap(x, y, folds, n_boot=n_boot, alpha=alpha)
        entries.append({"contrast": name, "family": family, "a": a, "b": b, "missing": False, **result.to_dict(),
                        "ttest": _ttest(per_arm[a], per_arm[b], alpha)})
    for family in dict.fromkeys(e["family"] for e in entries):
        members = [e for e in entries if e["family"] == family]
        adjusted = holm([e["p_value"] for e in members])
        for entry, p_holm in zip(members, adjusted):
            entry["p_holm"] = float(p_holm)
            entry["family_size"] = len(members)
            if entry["missing"]:
                continue
            entry.update(_power(entry["se"], margin, alpha, len(members)))
            entry["decision"] = decide_entry(entry, margin, alpha)
            entry["representation_changed"] = None
    return [e for e in entries if not e["missing"]]


def decide_entry(entry: Mapping[str, Any], margin: float, alpha: float) -> str:
    """The rule's verdict of one contrast entry (descriptive when an arm has one seed)."""
    return decide(entry["delta"], entry["ci_high"], entry["p_holm"], margin, alpha,
                  seed_variance_estimated=bool(entry.get("seed_variance_estimated", True)))


def _power(se: float, margin: float, alpha: float, tests: int) -> dict[str, float]:
    """The MDE of the test (Δ ≠ 0 at Holm's first step), the MDE of the *rule* (Δ ≥ margin and significant, 80 %
    power) and the rule's power when the true Δ equals the margin."""
    return {"mde_holm": minimum_detectable_effect(se, alpha=alpha, tests=tests),
            "mde_rule": rule_mde(se, margin, alpha=alpha, tests=tests),
            "power_at_margin": rule_power(margin, se, margin, alpha=alpha, tests=tests)}


def summarize(records_dir: str | Path) -> dict[str, Any]:
    """Everything the report shows, recomputed from the records in ``records_dir`` (module docstring)."""
    records = Records(records_dir)
    tier = records.tier()
    settings = flat_settings(tier)
    methods, seeds = settings["methods"], settings["seeds"]
    alpha, margin, n_boot = settings["alpha"], settings["margin"], settings["bootstrap"]
    contrasts = settings["contrasts"]
    chosen_state = selection(records, tier)
    protocol = (chosen_state or {}).get("chosen") or {}
    names, in_domain = settings["eval"], settings["train"]

    cells: dict[tuple[str, int], dict[str, Any]] = {}
    entries: dict[str, dict[str, Any]] = {}
    for arm in methods:
        done, failed, pending = [], {}, []
        for seed in arm_seeds(arm, seeds):
            record = records.cell(arm, seed, tier, protocol, status=None) if not tier.get("grid") or \
                chosen_state["chosen"] is not None else None
            if record is not None and record.get("status") == DONE:
                done.append(seed)
                cells[(arm, seed)] = record
            elif record is not None and record.get("status") == FAILED:
                failed[seed] = record.get("error", "unknown error")
            else:
                pending.append(seed)
        status = "done" if done and not failed and not pending else "failed" if failed and not done else \
            "partial" if done else "pending"
        entries[arm] = {"status": status, "seeds": done, "failed": {str(s): e for s, e in failed.items()},
                        "pending": pending, "scores": {},
                        "coverage": _coverage_summary([cells[(arm, s)].get("coverage") for s in done]),
                        "pretrain": _pretrain_summary([cells[(arm, s)] for s in done]),
                        "machines": sorted({label for s in done for label in _machine_labels(cells[(arm, s)])})}
    scores = Scores(cells, in_domain)
    per_query = {measure: {name: {arm: [scores.scores(arm, s, name, measure) for s in entry["seeds"]]
                                  for arm, entry in entries.items()} for name in names} for measure in MEASURES}
    for arm, entry in entries.items():
        if not entry["seeds"]:
            continue
        for measure in MEASURES:
            table: dict[str, Any] = {}
            for name in names:
                per_seed = {seed: float(np.mean(list(values.values()))) if values else 0.0
                            for seed, values in zip(entry["seeds"], per_query[measure][name][arm])}
                cell = _mean_std(per_seed)
                cell["vs"] = {baseline: _ttest(per_query[measure][name][arm], per_query[measure][name][baseline],
                                               alpha)
                              for baseline in BASELINES if baseline != arm and per_query[measure][name].get(baseline)}
                table[name] = cell
            per_seed_avg = {seed: float(np.mean([table[n]["per_seed"][str(seed)] for n in names]))
                            for seed in entry["seeds"]}
            table["avg"] = _mean_std(per_seed_avg)
            entry["scores"][measure] = table
    contrast_table = {measure: {name: contrast_entries(per_query[measure][name], contrasts, alpha, margin, n_boot)
                                for name in names} for measure in MEASURES}
    gates = compute_gates({arm: cells.get((arm, arm_seeds(arm, seeds)[0])) for arm in methods}) if seeds else {}
    moved = (gates.get("objectives_move_representation") or {}).get("arms", {})
    for entry in (e for by_name in contrast_table.values() for entries_ in by_name.values() for e in entries_):
        if entry["b"] == "mlm" and entry["a"] in moved:
            entry["representation_changed"] = bool(moved[entry["a"]]["moved"])
    todo = [f"{arm}/seed{seed}" for arm, entry in entries.items() for seed in entry["pending"]]
    folds_recorded: dict[str, list[str]] = {}     # of the cells to do, once the protocol is known
    if chosen_state is None or chosen_state["chosen"] is not None:
        folds = list(settings.get("folds") or [])
        for arm, entry in entries.items():
            for seed in entry["pending"]:
                if recorded := records.recorded_folds(arm, seed, tier, protocol, folds):
                    folds_recorded[f"{arm}/seed{seed}"] = recorded
    return {"settings": settings, "collections": names, "in_domain": in_domain, "measures": list(MEASURES),
            "retriever": RETRIEVER, "selection": chosen_state, "methods": entries, "contrasts": contrast_table,
            "gates": gates or None, "records": str(records.root),
            "progress": {"cells_done": sum(len(e["seeds"]) for e in entries.values()),
                         "cells_failed": sum(len(e["failed"]) for e in entries.values()),
                         "cells_todo": todo, "folds_recorded": folds_recorded,
                         "machines_by_seed": machines_by_seed(entries, cells, seeds),
                         "select_done": None if chosen_state is None else
                         len(chosen_state["scores"]),
                         "select_todo": None if chosen_state is None else list(chosen_state["todo"])}}


def per_query_rows(records_dir: str | Path, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every finished arm × seed's per-query scores with their fold label (``per_query.tsv``): in-domain rows
    carry the fold whose model scored the query; zero-shot rows the mean over the folds' models (fold ``mean``)."""
    records = Records(records_dir)
    tier = records.tier()
    protocol = (summary.get("selection") or {}).get("chosen") or {}
    cells = {(arm, seed): records.cell(arm, seed, tier, protocol) for arm, entry in summary["methods"].items()
             for seed in entry["seeds"]}
    scores = Scores(cells, summary["in_domain"])
    rows = []
    for arm, entry in summary["methods"].items():
        for seed in entry["seeds"]:
            for name in summary["collections"]:
                by_measure = {m: scores.scores(arm, seed, name, m) for m in MEASURES}
                for key in by_measure[MEASURES[0]]:
                    fold, qid = key if isinstance(key, tuple) else ("mean", key)
                    rows.append({"arm": arm, "seed": seed, "collection": name, "fold": fold, "query": qid,
                                 **{m: by_measure[m].get(key, 0.0) for m in MEASURES}})
    return rows


def _machine_label(record: Mapping[str, Any]) -> str:
    machine = record.get("machine") or {}
    device = machine.get("device") or {}
    where = device.get("name") if device.get("type") == "cuda" else machine.get("cpu")
    return f"{where} ({device.get('type', 'cpu')}, {machine.get('threads')} threads)"


def _machine_labels(record: Mapping[str, Any]) -> list[str]:
    """Where a cell ran: its own machine and those of its folds' records (``parts``)."""
    return sorted({_machine_label(record), *(_machine_label(part) for part in (record.get("parts") or {}).values())})


def machines_by_seed(entries: Mapping[str, Mapping[str, Any]], cells: Mapping[tuple[str, int], Mapping[str, Any]],
                     seeds: Sequence[int]) -> dict[str, dict[str, list[str]]]:
    """``{"seed <i>": {machine: [arms]}}`` for the i-th seed of every arm (an A/A arm's shifted seeds count as the
    i-th too): each contrast pairs arms within a seed, so this says which pairs share a machine."""
    out: dict[str, dict[str, list[str]]] = {}
    for arm, entry in entries.items():
        for index, seed in enumerate(arm_seeds(arm, seeds), start=1):
            if seed in entry["seeds"]:
                for label in _machine_labels(cells[(arm, seed)]):
                    out.setdefault(f"seed {index}", {}).setdefault(label, []).append(arm)
    return out


def _coverage_summary(reports: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    reports = [r for r in reports if r]
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


def _pretrain_summary(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means over seeds of the pre-training speed and the stages' seconds recorded in each cell."""
    summary: dict[str, Any] = {}
    for key in ("wall_s", "train_s", "samples_per_s"):
        values = [(c.get("pretrain") or {}).get(key) for c in cells]
        values = [v for v in values if v is not None]
        summary[key] = float(np.mean(values)) if values else None
    for key in ("finetune_s", "finetune_train_s", "evaluate_s"):
        values = [(c.get("timings") or {}).get(key) for c in cells]
        values = [v for v in values if v is not None]
        summary[key] = float(np.mean(values)) if values else None
    return summary
