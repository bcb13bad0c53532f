"""The ``fuse`` stage: a fused retriever of two or more runs (:mod:`pretrieve.retrieval.fusion`); the ``evaluate``
stage adds its rows (:func:`pretrieve.recipe.rows.fusion_rows`; it declares them: ``rows``).

Reciprocal rank fusion needs nothing fitted; a normalised weighted sum (``wsum``, or ``auto``: rrf vs wsum and the
normalisation) without explicit ``weights`` is fitted on the training collection's ``fit_split`` queries only (never
``test``; by default the recipe's dev split, :mod:`pretrieve.recipe.dev`, else ``train``), and stored in
``fuse/<name>/fusion.json`` as an artefact of the component runs and that split's qrels. A fine-tuned retriever's
weight is never fitted on a split a stage trained or mined on (refused before anything runs: :func:`needs`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from pretrieve.errors import ConfigError
from pretrieve.recipe.rows import check_fit_split, component_source, fit_fusion, fit_split
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import stage
from pretrieve.retrieval import fusion

logger = logging.getLogger(__name__)


@dataclass
class FuseOptions:
    """Options of the ``fuse`` stage (:func:`stage_fuse`)."""

    runs: list[str] = field(default_factory=list)   # two or more: bm25, zero-shot, finetune-sN, finetune-sN+rerank@K
    name: str | None = None        # default: fuse-<run>+<run>...
    method: str = "rrf"            # rrf | wsum | auto (auto: rrf or wsum and its normalisation, chosen on train queries)
    norm: str | None = None        # wsum: minmax | zscore
    weights: list[float] | None = None   # wsum: convex weights; none: fitted on the training queries
    k: int = 60                    # rrf's k
    depth: int = 1000
    fit_split: str | None = None   # default: the recipe's dev split, else train; never test
    step: float = 0.05             # weight grid step when fitting
    measure: str = "nDCG@10"       # what the fit maximises


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if options.get("weights") is None and options.get("method", "rrf") != "rrf":
        check_fit_split([str(c) for c in options.get("runs") or []], options, recipe, where)


def fusion_name(options: Mapping[str, Any]) -> str:
    """The fusion's name: ``name``, else ``fuse-<run>+<run>...``."""
    return str(options.get("name") or "fuse-" + "+".join(map(str, options.get("runs") or [])))


@stage("fuse", FuseOptions, needs=needs, gives="fusion", rows=lambda options: [fusion_name(options)],
       name_options=("name", "runs"))
def stage_fuse(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    """A fused retriever: ``runs`` (``bm25``, ``zero-shot``, fine-tuned retrievers such as ``finetune-s2``, or
    ``finetune-s2+rerank@100``) combined by ``method`` rrf | wsum | auto (:mod:`pretrieve.retrieval.fusion`).

    ``wsum`` / ``auto`` without explicit ``weights`` fit the weights (``auto``: also rrf vs wsum and the
    normalisation) on the training collection's ``fit_split`` (default: the dev split, else ``train``) queries:
    every component searches those queries (``runs/<component>.<split>__<collection>.trec``) and only that split's qrels are
    read; the fitted fusion is stored in ``fuse/<name>/fusion.json`` (reused while its inputs are unchanged).
    The ``evaluate`` stage then adds one row per fusion and evaluated collection — zero-shot collections use the
    fusion fitted on the training collection.
    """
    components = options.get("runs")
    if not isinstance(components, list) or len(components) < 2 or len(set(map(str, components))) != len(components):
        raise ConfigError(f"{label}: 'runs' must list two or more distinct retrievers to fuse, got {components!r}")
    components = [str(c) for c in components]
    for component in components:
        component_source(state, component, label)
    name = fusion_name(options)
    if not name or any(ch.isspace() or ch in "/\\" for ch in name) or name in state.named("fusion"):
        raise ConfigError(f"{label}: fusion name {name!r} must be new, non-empty, without spaces or slashes")
    method = str(options.get("method", "rrf"))
    norm = options.get("norm")
    weights = options.get("weights")
    depth = int(options.get("depth", fusion.DEFAULT_DEPTH))
    k = int(options.get("k", fusion.RRF_K))
    if weights is not None or method == "rrf":
        if method == "auto":
            raise ConfigError(f"{label}: method 'auto' chooses on training queries; it takes no 'weights'")
        spec = fusion.FusionSpec(method, norm or ("minmax" if method == "wsum" else None),
                                 tuple(float(w) for w in weights) if weights is not None else None, k=k,
                                 depth=depth).check(len(components))
    else:
        spec = fit_fusion(state, name, components, fusion.parse_candidates(method, norm),
                          fit_split(options, state.recipe), str(options.get("measure", fusion.DEFAULT_FIT_MEASURE)),
                          float(options.get("step", fusion.DEFAULT_STEP)), depth, k, show_progress)
    state.give("fusion", name, {"runs": components, "spec": spec})
    logger.info("%s: %s = %s of %s", label, name, spec.describe(), ", ".join(components))
