"""The ``select`` stage, "do no harm" (issue 21): the fused retriever ``name`` (default ``final``) is BM25 fused with
whichever of the off-the-shelf model, the fine-tuned model and their weight interpolations scores best on the dev
queries.

Candidates, in this order: ``zero-shot`` (the recipe's model as it is), ``wise-<α>`` for each of ``alphas`` (WiSE-FT,
Wortsman et al. 2022: the weights ``(1 − α)·θ_start + α·θ_finetuned``, :func:`pretrieve.modeling.interpolate.
interpolate_retriever`, written to ``<label>/wise-<α>/``; ``θ_start`` is the checkpoint fine-tuning started from), and
the fine-tuned retriever ``model`` (default: the latest). Each is fused with ``runs`` (default ``[bm25]``) exactly as
the ``fuse`` stage fits a fusion — by default ``method: auto``, RRF (nothing fitted) or a weighted sum of z-scores
with weights fitted on the dev split (``fit_split``; by default the recipe's :mod:`dev <pretrieve.recipe.dev>`
split, and never a split a stage trained on), stored in ``fuse/<name>.<candidate>/fusion.json``. Candidates and
fusion methods are compared by their **cross-fitted** dev score (docs/preregistration.md, amendment 2;
:func:`pretrieve.retrieval.fusion.fit_fusion`): a weighted sum is scored on each of five folds of the dev queries
by weights fitted on the other four, so a fit cannot win by having seen the queries that score it, and RRF by its
plain dev score. The highest wins; ties go to the candidate earlier in the order, the one closest to the
off-the-shelf model, and to RRF before the weighted sum. The winner's weights are fitted on every dev query. So
where fine-tuning does not help on dev, ``final`` is (at least) a fusion of BM25 and the off-the-shelf model.

**The dev gate** (``dev_gate``, default 0.05; ``null`` switches it off; docs/preregistration.md, amendment 16; issue
56). Being highest on a few dev queries is not evidence: with 20 of them a fine-tuned candidate can lead by chance
and lose on test. So a candidate other than the untrained RRF of ``runs`` and the off-the-shelf model (the
``rrf-zero-shot`` row, the baseline: never gated) is admitted only if its per-query cross-fitted dev score is above
the baseline's on the same dev queries with a paired one-sided t-test p ≤ ``dev_gate``
(:func:`dev_gate_verdict`; the baseline's dev run is fitted, with nothing to fit, as ``fuse/<name>.rrf-zero-shot``).
``name`` is the first admitted candidate in dev order, else the baseline; ``results.json``'s selection lists each
refused candidate with the rule that refused it, its Δ and p (``refused``), and whether the gate kept the baseline.

**The guard** (``guard``: collections; docs/preregistration.md, amendment 14; issue 56). The dev queries are the
training collection's own, so nothing above sees another domain, and fine-tuning on one domain can cost the others
(WiSE-FT, Wortsman et al. 2022, keeps robustness under shift only at some interpolation weights). With a guard, each
listed collection that does not come from the training collection (:func:`pretrieve.recipe.rows.origin`) is split
once: its ``test`` queries halved by the seeded draw of ``pretrieve data halves`` (``guard_seed``), the first half
the ``guard`` split and the second half ``test`` of ``<out>/guard-split/<name>`` (:func:`guard_collections`). Every
evaluate stage after this one reads such a collection from there, so it is evaluated on the second half only, and a
recipe whose evaluate stages read a guard query of the same origin is refused (:func:`check_guard_overlap`). The
candidates are taken in dev order (:func:`dev_order`); each is fused on the guard queries exactly as it would be used
and tested (paired two-sided t-test, nDCG@10 per query) against the untrained RRF of ``runs`` and the off-the-shelf
model (the ``rrf-zero-shot`` row): it is **refused** when it is below with p ≤ ``guard_p`` (0.10) pooled over every
guard query or within any one guard collection (:func:`guard_verdict`). With both the gate and a guard a candidate
must pass both (the gate first: it costs no search). ``name`` is the first candidate not refused; the off-the-shelf
model fused by RRF is that baseline itself, never refused, and the fallback when all are. The shipped recipe has no
guard (amendment 16: its 15–40 queries per collection could not see the harm it was built for, issue 56).

The ``evaluate`` stage adds the chosen fusion's rows like any fusion's; ``results.md`` lists every candidate's dev
scores (alone and fused), gate and guard tests, says which was chosen and why, and which row to use on each evaluated
collection (``final`` in-domain, ``rrf-zero-shot`` elsewhere: :func:`pretrieve.recipe.results.row_to_use`). Only the
chosen candidate is searched on the evaluated collections.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pretrieve import artifacts, ranks
from pretrieve.data import BeirCollection, read_run
from pretrieve.data.folds import derive_collection
from pretrieve.data.registry import resolve_collection
from pretrieve.errors import ConfigError
from pretrieve.evaluation import evaluate
from pretrieve.evaluation.significance import paired_ttest
from pretrieve.modeling.interpolate import interpolate_retriever
from pretrieve.models import resolve_model
from pretrieve.recipe.rows import (check_fit_split, component_run, fit_fusion, fit_split, fusion_file, origin,
                                   split_query_ids)
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import split_collection, stage, stage_labels
from pretrieve.retrieval import fusion

logger = logging.getLogger(__name__)

RULE = "the highest cross-fitted dev {measure} of the candidates fused with {runs} (weights fitted on four folds of " \
       "the dev queries score the fifth; RRF fits nothing); ties go to the candidate closest to the off-the-shelf " \
       "model, then to RRF"
GUARD_RULE = "the first in dev order not below the untrained RRF of {runs} + the off-the-shelf model on the guard " \
             "queries with p <= {p:g} (paired two-sided t-test of {measure}, pooled and per guard collection)"
GATE_RULE = "admitted only above the untrained RRF of {runs} + the off-the-shelf model on the same dev queries " \
            "with p <= {p:g} (paired one-sided t-test of the per-query cross-fitted {measure})"
DEV_GATE_P = 0.05
BASELINE = "rrf-zero-shot"   # the untrained fusion the gate and the guard compare with (never gated or refused)
GUARD_SPLIT = "guard"
GUARD_DIR = "guard-split"


@dataclass
class SelectOptions:
    """Options of the ``select`` stage (module docstring)."""

    name: str = "final"
    model: str | None = None        # the fine-tuned retriever; default: the latest
    alphas: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])   # WiSE-FT weights of the fine-tuned model
    runs: list[str] = field(default_factory=lambda: ["bm25"])                # fused with each candidate
    method: str = "auto"            # as the fuse stage's: rrf | wsum | auto
    norm: str | None = "zscore"
    depth: int = 1000
    k: int = 60
    fit_split: str | None = None    # default: the recipe's dev split
    step: float = 0.05
    measure: str = "nDCG@10"
    guard: list[str] = field(default_factory=list)   # collections whose first test half guards the other domains
    guard_p: float = 0.10           # a candidate below the untrained RRF there with p <= this is refused
    guard_seed: int = 0             # the seed of the halves (that of `pretrieve data halves`)
    dev_gate: float | None = 0.05   # a candidate must beat the untrained RRF on dev (one-sided p <= this); None: off


def check_select(options: dict[str, Any], where: str) -> None:
    guard = [str(g) for g in options.get("guard") or []]
    if len(set(guard)) != len(guard) or any(":" in g for g in guard):
        raise ConfigError(f"'guard' must list distinct collections (no ':split': the test split is halved), got {guard}")
    if not 0.0 < float(options.get("guard_p", 0.10)) < 1.0:
        raise ConfigError(f"guard_p must be between 0 and 1, got {options.get('guard_p')}")
    gate = options.get("dev_gate", DEV_GATE_P)
    if gate is not None and not 0.0 < float(gate) < 1.0:
        raise ConfigError(f"dev_gate must be a p-value between 0 and 1 (or null: no gate), got {gate}")
    alphas = [float(a) for a in options.get("alphas", [])]
    if any(not 0.0 < a < 1.0 for a in alphas) or len(set(alphas)) != len(alphas):
        raise ConfigError("alphas must be distinct and strictly between 0 and 1 (0, the off-the-shelf model, and "
                          f"1, the fine-tuned one, are always candidates), got {alphas}")
    fusion.parse_candidates(str(options.get("method", "auto")), options.get("norm", "zscore"))
    runs = [str(r) for r in options.get("runs", ["bm25"])]
    if not runs or len(set(runs)) != len(runs):
        raise ConfigError(f"'runs' must list one or more distinct retrievers to fuse each candidate with, got {runs}")


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    retrievers = given.get("retriever", [])
    if not retrievers:
        raise ConfigError(f"{where}: needs a fine-tuned retriever earlier in the recipe (a 'finetune' stage)")
    model = options.get("model") or retrievers[-1]
    if model not in retrievers:
        raise ConfigError(f"{where}.model: no retriever named {model!r} before this stage "
                          f"(known: {', '.join(retrievers)})")
    check_fit_split([*map(str, options.get("runs", ["bm25"])), model], options, recipe, where)


def reads(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The guard collections (their test split is halved)."""
    return [(str(name), "test") for name in options.get("guard") or []]


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: each guard collection a slice or fixture standing for it (at most ``kit.max_collections``)."""
    if options.get("guard"):
        options["guard"] = [kit.collection(entry) for entry in options["guard"][:kit.max_collections]]
    return options


@stage("select", SelectOptions, check=check_select, needs=needs, gives=("fusion", "candidate", "guard"),
       smoke=smoke, reads=reads, rows=lambda options: [str(options.get("name") or "final")],
       name_options=("name", "model", "runs"))
def stage_select(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    name = str(options.get("name", "final"))
    if not name or any(ch.isspace() or ch in "/\\" for ch in name) or name in state.named("fusion"):
        raise ConfigError(f"{label}: fusion name {name!r} must be new, non-empty, without spaces or slashes")
    runs = [str(r) for r in options.get("runs", ["bm25"])]
    retrievers = state.named("retriever")
    finetuned = str(options.get("model") or list(retrievers)[-1])
    alphas = sorted(float(a) for a in options.get("alphas", [0.25, 0.5, 0.75]))
    candidates = {"zero-shot": None, **{f"wise-{a:g}": a for a in alphas}, finetuned: None}
    for candidate, alpha in candidates.items():
        if alpha is not None:
            state.give("candidate", candidate, interpolated(state, retrievers[finetuned], alpha,
                                                            state.out / label / candidate))
    split = fit_split(options, state.recipe)
    measure = str(options.get("measure", fusion.DEFAULT_FIT_MEASURE))
    methods = fusion.parse_candidates(str(options.get("method", "auto")), options.get("norm", "zscore"))
    fits = {candidate: fit_fusion(state, f"{name}.{candidate}", [*runs, candidate], methods, split, measure,
                                  float(options.get("step", fusion.DEFAULT_STEP)),
                                  int(options.get("depth", fusion.DEFAULT_DEPTH)),
                                  int(options.get("k", fusion.RRF_K)), show_progress)
            for candidate in candidates}
    ranked = dev_order({candidate: spec.fit["cross_fitted"] for candidate, spec in fits.items()})
    baseline = fusion.FusionSpec(method="rrf", k=int(options.get("k", fusion.RRF_K)),
                                 depth=int(options.get("depth", fusion.DEFAULT_DEPTH)))
    gate_p = options.get("dev_gate", DEV_GATE_P)
    gate_p = None if gate_p is None else float(gate_p)
    baseline_dev = (fit_fusion(state, f"{name}.{BASELINE}", [*runs, "zero-shot"], [("rrf", None)], split, measure,
                               float(options.get("step", fusion.DEFAULT_STEP)), int(options.get("depth",
                               fusion.DEFAULT_DEPTH)), int(options.get("k", fusion.RRF_K)), show_progress)
                    if gate_p is not None else None)
    guards = guard_collections(state, options, label)
    chosen, spec, gates, checks, refused = None, None, {}, {}, []
    for candidate in ranked:   # in dev order; checking stops at the first admitted (the same choice as checking all)
        fit = fits[candidate]
        if baseline_dev is not None and not is_baseline(candidate, fit, baseline):
            gates[candidate] = dev_gate_verdict(baseline_dev.fit["per_query"], fit.fit["per_query"], gate_p)
            if not gates[candidate]["admitted"]:
                refused.append(refusal(candidate, "dev gate", gates[candidate]))
                continue
        if guards:
            checks[candidate] = guard_check(state, name, runs, candidate, fit, baseline, guards, options,
                                            show_progress)
            if not checks[candidate]["admitted"]:
                refused.append(refusal(candidate, "guard", checks[candidate]["pooled"]))
                continue
        chosen, spec = candidate, fit
        break
    fallback = chosen is None
    if fallback:   # every candidate refused: the untrained RRF of the runs and the off-the-shelf model
        chosen, spec = "zero-shot", baseline
    fitted = fusion_file(state, f"{name}.{chosen}") if spec.fit else None
    selection = {"split": split, "measure": measure, "queries": fits[chosen].fit["queries"], "chosen": chosen,
                 "model": finetuned, "fusion": spec.describe(), "trained_on": origin(state.data).name,
                 "rule": RULE.format(measure=measure, runs=" + ".join(runs)),
                 "candidates": [{"name": candidate, "alpha": alpha, "fusion": fit.describe(),
                                 "fused": fit.fit["score"], "cross_fitted": fit.fit["cross_fitted"],
                                 "alone": fit.fit["single_runs"][f"run{len(runs)}"],
                                 "methods": fit.fit.get("candidates", []),
                                 **({"dev_gate": gates[candidate]} if candidate in gates else {}),
                                 **({"guard": checks[candidate]} if candidate in checks else {})}
                                for (candidate, alpha), fit in zip(candidates.items(), fits.values())],
                 "refused": refused, "fallback": fallback, "dev_order": ranked}
    if baseline_dev is not None:
        selection["dev_gate"] = {"p": gate_p, "baseline": BASELINE, "baseline_cross_fitted": baseline_dev.fit["score"],
                                 "rule": GATE_RULE.format(runs=" + ".join(runs), measure=measure, p=gate_p),
                                 "kept_baseline": any(r["rule"] == "dev gate" for r in refused)
                                 and is_baseline(chosen, spec, baseline)}
    if guards:
        selection["guard"] = {"collections": {g: len(split_query_ids(path, GUARD_SPLIT)) for g, path in guards.items()},
                              "evaluated": {g: len(split_query_ids(path, "test")) for g, path in guards.items()},
                              "p": float(options.get("guard_p", 0.10)), "seed": int(options.get("guard_seed", 0)),
                              "rule": GUARD_RULE.format(runs=" + ".join(runs), measure=measure,
                                                        p=float(options.get("guard_p", 0.10))),
                              "fallback": fallback}
    state.give("fusion", name, {"runs": [*runs, chosen], "spec": spec, "selection": selection, "fitted": fitted})
    state.report.setdefault("selections", {})[name] = selection   # results.json: every select stage's choice
    logger.info("%s: %s = %s of %s, chosen on %d %s queries (%s %.4f, cross-fitted %.4f)%s", label, name,
                spec.describe(), " + ".join([*runs, chosen]), selection["queries"], split, measure,
                fits[chosen].fit["score"], fits[chosen].fit["cross_fitted"],
                "; refused: " + ", ".join(f"{r['name']} ({r['rule']})" for r in refused) if refused else "")


def is_baseline(candidate: str, spec, baseline) -> bool:
    """Whether ``candidate`` fused by ``spec`` is the untrained RRF of the runs and the off-the-shelf model
    (``rrf-zero-shot``: never gated or refused)."""
    return candidate == "zero-shot" and spec.method == "rrf" and spec.k == baseline.k


def dev_gate_verdict(baseline: Mapping[str, float], candidate: Mapping[str, float], p: float) -> dict[str, Any]:
    """The dev gate (docs/preregistration.md, amendment 16): the candidate's per-query cross-fitted dev scores
    against the untrained RRF's on the same dev queries, paired one-sided t-test (candidate > baseline);
    ``admitted`` when ``p_value`` ≤ ``p`` (a NaN p, fewer than two queries, is never admitted)."""
    queries = list(baseline)
    result = paired_ttest(np.array([baseline[q] for q in queries]), np.array([candidate.get(q, 0.0) for q in queries]),
                          alternative="greater")
    admitted = not np.isnan(result.p_value) and result.p_value <= p
    return {"queries": len(queries), "mean_difference": round(result.mean_difference, 6),
            "p_value": result.p_value, "admitted": bool(admitted), "p": p}


def refusal(candidate: str, rule: str, test: Mapping[str, Any]) -> dict[str, Any]:
    """One refused candidate for ``results.md``: the rule (``dev gate`` or ``guard``), its Δ and p."""
    return {"name": candidate, "rule": rule, "mean_difference": test.get("mean_difference"),
            "p_value": test.get("p_value")}


def choose(scores: Mapping[str, float]) -> str:
    """The candidate with the highest score; a tie goes to the one listed first (rounded to 12 digits, as the
    fusion fit compares)."""
    return dev_order(scores)[0]


def dev_order(scores: Mapping[str, float]) -> list[str]:
    """The candidates from the highest score down; ties keep the listed order (rounded to 12 digits, as the fusion
    fit compares)."""
    if not scores:
        raise ConfigError("select: no candidate to choose from")
    return sorted(scores, key=lambda candidate: -round(scores[candidate], 12))   # stable: ties keep their order


def guard_collections(state: RunState, options: Mapping[str, Any], label: str) -> dict[str, Path]:
    """``{name: <out>/guard-split/<name>}`` for each ``guard`` collection not derived from the training collection:
    the source's ``test`` queries halved with ``guard_seed`` (the draw of ``pretrieve data halves``: the first half,
    ``<name>-a``'s ``train``, is the ``guard`` split; the second stays ``test``), written unless current and given as
    the product ``guard`` (the evaluate stages read these collections from there). Checked against every evaluate
    stage of the recipe before any guard query is searched (:func:`check_guard_overlap`)."""
    trained = origin(state.data)
    guards = {}
    for entry in options.get("guard") or []:
        source = Path(state.collections.get(str(entry)) or resolve_collection(str(entry), recipe=state.recipe))
        if origin(source) == trained:
            continue
        n = len(split_query_ids(source, "test"))
        if n < 2:
            raise ConfigError(f"{label}.guard: the test split of {source} has {n} judged queries: too few to halve")
        out = state.out / GUARD_DIR / source.name
        ranks.once(f"guard split {source.name}", lambda source=source, out=out, n=n: derive_collection(
            source, out, carve_from="test", parts={GUARD_SPLIT: n // 2}, seed=int(options.get("guard_seed", 0))))
        guards[str(entry)] = state.give("guard", str(entry), out)
    if guards:
        check_guard_overlap(state, guards, label)
    return guards


def check_guard_overlap(state: RunState, guards: Mapping[str, Path], label: str) -> None:
    """No evaluate stage reads a guard query: a collection named in ``guard`` is evaluated on its second half (the
    evaluate stage maps it), any other collection of the same origin may not share a query with its guard half."""
    guarded = {origin(path): split_query_ids(path, GUARD_SPLIT) for path in guards.values()}
    for kind, stage_label, options in stage_labels(state.recipe):
        if kind != "evaluate":
            continue
        for entry in options.get("collections") or [state.recipe["data"]]:
            name, split = split_collection(str(entry))
            split = split or str(options.get("split", "test"))
            if name in guards and split == "test":
                continue
            path = Path(state.collections.get(name) or resolve_collection(name, recipe=state.recipe))
            shared = guarded.get(origin(path), set()) & split_query_ids(path, split)
            if shared:
                raise ConfigError(f"{label}.guard: {stage_label} evaluates {entry}, which holds {len(shared)} of the "
                                  f"guard queries of {origin(path).name}; guard queries are never evaluated (evaluate "
                                  f"{origin(path).name} by its name: its second half is read)")


def guard_check(state: RunState, name: str, runs: list[str], candidate: str, spec, baseline, guards: Mapping[str, Path],
                options: Mapping[str, Any], show_progress: bool) -> dict[str, Any]:
    """The candidate fused as it would be used (``spec``, weights fitted on dev) against the untrained RRF of
    ``runs`` + the off-the-shelf model on every guard collection's ``guard`` queries: :func:`guard_verdict`."""
    measure = str(options.get("measure", fusion.DEFAULT_FIT_MEASURE))
    depth = int(options.get("depth", fusion.DEFAULT_DEPTH))
    scores = {}
    for guard, path in guards.items():
        collection = BeirCollection(path)
        qrels = collection.load_qrels(GUARD_SPLIT)
        pair = []
        for fused_name, components, fused_spec, fit_inputs in (
                (f"{name}.guard-baseline", [*runs, "zero-shot"], baseline, {}),
                (f"{name}.{candidate}", [*runs, candidate], spec,
                 {"fusion": fusion_file(state, f"{name}.{candidate}")} if spec.fit else {})):
            sources = [component_run(state, c, collection, GUARD_SPLIT, depth, c, show_progress) for c in components]
            out = state.run_path(fused_name, collection.root, GUARD_SPLIT)
            inputs = {**{f"run{i + 1}": p for i, p in enumerate(sources)}, **fit_inputs}

            def fuse(out=out, sources=sources, fused_spec=fused_spec, inputs=inputs, fit_inputs=fit_inputs,
                     fused_name=fused_name) -> None:
                if not artifacts.is_current(out, fusion.fusion_settings(fused_spec), inputs, kind="run"):
                    fusion.write_fused_run(sources, out, fused_spec, tag=fused_name, fit_inputs=fit_inputs)

            ranks.once(f"guard {fused_name} on {guard}", fuse)
            pair.append(evaluate(qrels, read_run(out), [measure]).per_query[measure])
        scores[guard] = pair
    verdict = guard_verdict(scores, float(options.get("guard_p", 0.10)))
    logger.info("guard of %s: %s (pooled Δ %+.4f, p %.3g)", candidate, "admitted" if verdict["admitted"] else "refused",
                verdict["pooled"]["mean_difference"], verdict["pooled"]["p_value"])
    return verdict


def guard_verdict(scores: Mapping[str, tuple[Mapping[str, float], Mapping[str, float]]], p: float) -> dict[str, Any]:
    """``scores``: per guard collection, the baseline's and the candidate's per-query scores. Paired two-sided
    t-tests of candidate − baseline, pooled over every guard query and per collection; ``admitted`` unless one of
    them is below with p ≤ ``p`` (docs/preregistration.md, amendment 14)."""
    def test(base: Mapping[str, float], run: Mapping[str, float]) -> dict[str, Any]:
        queries = list(base)
        result = paired_ttest(np.array([base[q] for q in queries]), np.array([run.get(q, 0.0) for q in queries]))
        below = result.mean_difference < 0 and result.p_value <= p   # NaN p (one query) is never below
        return {"queries": len(queries), "mean_difference": round(result.mean_difference, 6),
                "p_value": result.p_value, "below": bool(below)}

    per = {guard: test(base, run) for guard, (base, run) in scores.items()}
    pooled = test({f"{g}\t{q}": s for g, (base, _) in scores.items() for q, s in base.items()},
                  {f"{g}\t{q}": s for g, (_, run) in scores.items() for q, s in run.items()})
    return {"admitted": not pooled["below"] and not any(t["below"] for t in per.values()), "pooled": pooled,
            "per_collection": per, "p": p}


def interpolated(state: RunState, finetuned: str, alpha: float, out: Path) -> str:
    """``out``: the WiSE-FT interpolation of the fine-tuned retriever with the checkpoint it started from, made
    unless current."""
    base = resolve_model(state.init_model)
    settings = {"alpha": alpha}
    inputs, named = artifacts.run_inputs(base=base, finetuned=finetuned)

    def make() -> None:
        if not artifacts.is_current(out, {**settings, **named}, inputs, kind="interpolation"):
            interpolate_retriever(base, finetuned, alpha, out)
            artifacts.record(out, "interpolation", {**settings, **named}, inputs)

    ranks.once(f"interpolate {out.name}", make)
    return str(out)
