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

The ``evaluate`` stage adds the chosen fusion's rows like any fusion's; ``results.md`` lists every candidate's dev
scores (alone and fused) and says which was chosen and why. Only the chosen candidate is searched on the evaluated
collections.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pretrieve import artifacts, ranks
from pretrieve.errors import ConfigError
from pretrieve.modeling.interpolate import interpolate_retriever
from pretrieve.models import resolve_model
from pretrieve.recipe.rows import check_fit_split, fit_fusion, fit_split, fusion_file
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import stage
from pretrieve.retrieval import fusion

logger = logging.getLogger(__name__)

RULE = "the highest cross-fitted dev {measure} of the candidates fused with {runs} (weights fitted on four folds of " \
       "the dev queries score the fifth; RRF fits nothing); ties go to the candidate closest to the off-the-shelf " \
       "model, then to RRF"


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


def check_select(options: dict[str, Any], where: str) -> None:
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


@stage("select", SelectOptions, check=check_select, needs=needs, gives=("fusion", "candidate"),
       rows=lambda options: [str(options.get("name") or "final")], name_options=("name", "model", "runs"))
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
    chosen = choose({candidate: spec.fit["cross_fitted"] for candidate, spec in fits.items()})
    selection = {"split": split, "measure": measure, "queries": fits[chosen].fit["queries"], "chosen": chosen,
                 "model": finetuned,
                 "rule": RULE.format(measure=measure, runs=" + ".join(runs)),
                 "candidates": [{"name": candidate, "alpha": alpha, "fusion": spec.describe(),
                                 "fused": spec.fit["score"], "cross_fitted": spec.fit["cross_fitted"],
                                 "alone": spec.fit["single_runs"][f"run{len(runs)}"],
                                 "methods": spec.fit.get("candidates", [])}
                                for (candidate, alpha), spec in zip(candidates.items(), fits.values())]}
    state.give("fusion", name, {"runs": [*runs, chosen], "spec": fits[chosen], "selection": selection,
                                "fitted": fusion_file(state, f"{name}.{chosen}")})
    state.report.setdefault("selections", {})[name] = selection   # results.json: every select stage's choice
    logger.info("%s: %s = %s of %s, chosen on %d %s queries (%s %.4f, cross-fitted %.4f)", label, name,
                fits[chosen].describe(), " + ".join([*runs, chosen]), selection["queries"], split, measure,
                fits[chosen].fit["score"], fits[chosen].fit["cross_fitted"])


def choose(scores: Mapping[str, float]) -> str:
    """The candidate with the highest score; a tie goes to the one listed first (rounded to 12 digits, as the
    fusion fit compares)."""
    best = None
    for candidate, score in scores.items():
        if best is None or round(score, 12) > round(scores[best], 12):
            best = candidate
    assert best is not None
    return best


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
