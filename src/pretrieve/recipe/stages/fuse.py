"""The ``fuse`` stage: a fused retriever of two or more runs (:mod:`pretrieve.retrieval.fusion`), and its rows in
the ``evaluate`` stage (:func:`fusion_rows`).

Reciprocal rank fusion needs nothing fitted; a normalised weighted sum (``wsum``, or ``auto``: rrf vs wsum and the
normalisation) without explicit ``weights`` is fitted on the training collection's ``fit_split`` queries only (never
``test``; by default the recipe's dev split, :mod:`pretrieve.recipe.dev`, else ``train``), and stored in
``fuse/<name>/fusion.json`` as an artefact of the component runs and that split's qrels. A fine-tuned retriever's
weight is never fitted on a split a stage trained or mined on (refused before anything runs: :func:`needs`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pretrieve import artifacts, ranks
from pretrieve.data import BeirCollection, read_run
from pretrieve.errors import ConfigError
from pretrieve.evaluation import evaluate
from pretrieve.recipe.results import RESULT_MEASURES, result_row
from pretrieve.recipe.runner import RunState, bm25_run, retriever_run, run_tag
from pretrieve.recipe.dev import dev_split
from pretrieve.recipe.schema import stage, stage_labels
from pretrieve.retrieval import fusion
from pretrieve.retrieval.rerank import rerank_run_file

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


def fit_split(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> str:
    """Where a fusion's weights are fitted: the option, else the recipe's dev split, else ``train``."""
    return str(options.get("fit_split") or dev_split(recipe) or "train")


def trained_splits(recipe: Mapping[str, Any]) -> set[str]:
    """The splits of the training collection whose queries some stage trained or mined on (fine-tuning, mining,
    the reranker)."""
    shared = recipe.get("finetune") or {}
    return {str(options.get("split") or (shared.get("split") if kind == "finetune" else None) or "train")
            for kind, _, options in stage_labels(recipe) if kind in ("finetune", "mine", "reranker")}


def check_fit_split(components: list[str], options: Mapping[str, Any], recipe: Mapping[str, Any], where: str) -> None:
    """A fitted fusion (or selection) never fits a trained retriever's weight on queries it was trained on: its
    scores there are inflated (issue 21). BM25 and the off-the-shelf model may be fitted anywhere but ``test``."""
    split = fit_split(options, recipe)
    if split == fusion.TEST_SPLIT:
        raise ConfigError(f"{where}: fit_split must be a training split, never '{split}'")
    trained = [c for c in components if c not in ("bm25", "zero-shot")]
    if trained and split in trained_splits(recipe):
        raise ConfigError(f"{where}: would fit the weight of {', '.join(trained)} on the '{split}' queries it was "
                          "trained on; add a dev split to the recipe (dev: {seed: 0}) or set fit_split to a split "
                          "no stage trained on")


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if options.get("weights") is None and options.get("method", "rrf") != "rrf":
        check_fit_split([str(c) for c in options.get("runs") or []], options, recipe, where)


@stage("fuse", FuseOptions, needs=needs, gives="fusion")
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
    name = str(options.get("name") or "fuse-" + "+".join(components))
    if not name or any(ch.isspace() or ch in "/\\" for ch in name) or name in state.fusions:
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
    state.fusions[name] = {"runs": components, "spec": spec}
    logger.info("%s: %s = %s of %s", label, name, spec.describe(), ", ".join(components))


def component_source(state: RunState, component: str, where: str) -> tuple[str, str | None, int | None]:
    """``(kind, model, rerank depth)`` of a fusion component: ``("bm25", None, None)``, ``("dense", model dir,
    None)`` or ``("rerank", retriever label, depth)``."""
    if component == "bm25":
        return "bm25", None, None
    if component == "zero-shot":
        return "dense", state.base_model, None
    if component in state.retrievers:
        return "dense", state.retrievers[component], None
    if component in state.candidates:
        return "dense", state.candidates[component], None
    base, sep, depth = component.partition("+rerank@")
    if sep and base in state.retrievers and depth.isdigit() and int(depth) > 0:
        if state.reranker is None:
            raise ConfigError(f"{where}: {component} needs a 'reranker' stage earlier in the recipe")
        return "rerank", base, int(depth)
    known = ["bm25", "zero-shot", *state.retrievers] + [f"{r}+rerank@N" for r in state.retrievers if state.reranker]
    raise ConfigError(f"{where}: unknown retriever {component!r} to fuse (known so far: {', '.join(known)})")


def component_run(state: RunState, component: str, collection: BeirCollection, split: str, depth: int, run_name: str,
                  show_progress: bool) -> Path:
    """``runs/<run_name>__<collection>.trec``: the component's run on the split's judged queries (searched unless
    it exists; dense retrievers share one corpus-embedding cache per collection with the evaluate stage)."""
    kind, model, rerank_depth = component_source(state, component, "fuse")
    path = state.run_path(run_name, collection.root, split)
    if kind == "bm25":
        return bm25_run(state, collection, split, depth)
    if kind == "dense":
        return retriever_run(state, component, model, collection, split, depth, run_name, None, show_progress)
    source_name = model if run_name == component else f"{model}.{split}"
    source = component_run(state, model, collection, split, depth, source_name, show_progress)
    return rerank_run_file(state.reranker, collection.root, split, source, path, depth=rerank_depth,
                           show_progress=show_progress)


def fit_fusion(state: RunState, name: str, components: list[str], candidates, split: str, measure: str,
               step: float, depth: int, k: int, show_progress: bool):
    """The fusion fitted on the training collection's ``split`` queries (never ``test``), stored and reused."""
    if split == fusion.TEST_SPLIT:
        raise ConfigError(f"fuse: {name}: fit_split must be a training split, never '{split}'")
    collection = BeirCollection(state.data)
    qrels_path = collection.qrels_path(split)          # that split's qrels only; checked before any search
    train_runs = {f"run:{c}": component_run(state, c, collection, split, depth, f"{c}.{split}", show_progress)
                  for c in components}
    path = fusion_file(state, name)
    settings = {"runs": components, "candidates": [list(c) for c in candidates], "split": split, "measure": measure,
                "step": step, "depth": depth, "k": k,
                "cross_fit": {"folds": fusion.CROSS_FIT_FOLDS, "seed": fusion.CROSS_FIT_SEED}}
    inputs = {**train_runs, "qrels": qrels_path}

    def fit() -> None:
        if artifacts.is_current(path, settings, inputs, kind="fusion"):
            return
        spec = fusion.fit_on_split(list(train_runs.values()), collection.root, split, candidates=candidates,
                                   measure=measure, step=step, depth=depth, k=k)
        with artifacts.write_file(path, kind="fusion", settings=settings, inputs=inputs) as tmp:
            tmp.write_text(json.dumps(spec.to_dict(), indent=2), encoding="utf-8")

    ranks.once(f"fit the fusion {name}", fit)
    return fusion.FusionSpec.from_dict(json.loads(path.read_text(encoding="utf-8")))


def fusion_file(state: RunState, name: str) -> Path:
    """``fuse/<name>/fusion.json``: where the fusion ``name`` fitted by :func:`fit_fusion` is stored."""
    return state.out / "fuse" / name / "fusion.json"


def fusion_rows(state: RunState, collection: BeirCollection, split: str, depth: int, qrels,
                show_progress: bool, measures=RESULT_MEASURES, ignore_identical_ids: bool = False) -> list[dict]:
    """One row per fusion of the recipe on this collection: ``runs/<fusion>__<collection>.trec``, scored with
    ``measures`` (without each query's own id with ``ignore_identical_ids``)."""
    rows = []
    for name, entry in state.fusions.items():
        spec = entry["spec"]
        sources = [component_run(state, c, collection, split, depth, c, show_progress) for c in entry["runs"]]
        path = state.run_path(name, collection.root, split)
        inputs = {f"run{i + 1}": p for i, p in enumerate(sources)}
        fitted = entry.get("fitted") or fusion_file(state, name)
        fit_inputs = {"fusion": fitted} if spec.fit and fitted.exists() else {}

        def fuse() -> None:   # rank 0 decides and writes: the others wait for the file
            if not artifacts.is_current(path, fusion.fusion_settings(spec), {**inputs, **fit_inputs}, kind="run"):
                fusion.write_fused_run(sources, path, spec, tag=name, fit_inputs=fit_inputs)

        ranks.once(f"fuse {name}", fuse)
        row = result_row(name, run_tag(collection.root, split), path,
                         evaluate(qrels, read_run(path), measures, ignore_identical_ids=ignore_identical_ids))
        row["fusion"] = {"runs": entry["runs"], "method": spec.describe(), "fit": fusion.fit_record(spec)}
        if entry.get("selection"):
            row["fusion"]["selection"] = entry["selection"]
        rows.append(row)
    return rows
