"""The end-to-end recipe: pre-train → fine-tune stage 1 → mine → stage 2 → reranker → stage 3 → evaluate.

``pretrieve run recipe.yaml`` executes the stages a recipe lists, top to bottom, each in its own
directory under ``out``. Every stage takes paths and returns paths, skips work whose complete output
already exists (a finished stage is never redone; an interrupted one resumes from its last
checkpoint), so killing and restarting a run finishes with the same results as an uninterrupted one.
A stage whose recipe settings (or inputs, for fine-tuning and the reranker) changed since it finished or
was interrupted is refused with the differing settings, never silently reused or resumed;
``redo_changed=True`` (``pretrieve run --redo-changed``) instead renames that stage's directory to
``<dir>.replaced-<UTC time>`` (nothing is deleted) and runs the stage again — the stages after it then see
new inputs and are redone the same way.

Recipe (YAML or JSON)::

    name: scifact-cpu
    out: outputs/scifact-cpu
    model: minilm                 # the starting checkpoint (path, offline alias or hub name)
    data: scifact                 # training collection: a path, or a name under data_root
    data_root: null               # default: $PRETRIEVE_DATA, ../shared/data, /work/shared/data
    seed: 42
    finetune: {pooling: mean}     # options shared by every fine-tuning stage
    stages:
      - pretrain: {method: bow, max_steps: 100}     # corpus defaults to the training collection
      - finetune: {stage: 1}
      - mine: {depth: 200}
      - finetune: {stage: 2}
      - reranker: {epochs: 1}
      - teacher: {max_negatives: 31}
      - finetune: {stage: 3}
      - fuse: {name: rrf-zero-shot, runs: [bm25, zero-shot], method: rrf}      # untrained fusion
      - fuse: {name: final, runs: [bm25, finetune-s2], method: wsum, norm: zscore}   # weights fitted on train
      - evaluate: {collections: [scifact, cranfield], split: test, bm25: true, zero_shot: true,
                   rerank_depth: 100, rerank: finetune-s2,   # a collection may name its split: "msmarco:dev"
                   final: final, compare: [bm25, zero-shot, rrf-zero-shot]}   # paired t-tests + closing paragraph
      # modes: [dense, sparse, hybrid, rrf] — retrievers fine-tuned with the sparse/hybrid representation
      #   get one row per search mode (finetune-s1-sparse, ...); default: one row, searched as trained

Stage semantics follow the papers: stages 2 and 3 re-initialise from the pre-trained checkpoint (not
from the previous stage); ``mine`` uses the latest fine-tuned retriever (the stage-1 one) to mine the
stage-2 negatives; ``teacher`` scores the mined groups with the reranker for stage 3. ``fuse`` defines a fused
retriever (:func:`stage_fuse`: reciprocal rank fusion, or a normalised weighted sum whose weights are fitted on the
training collection's ``train`` queries only); ``evaluate`` adds its rows on every collection and, with ``final``
and ``compare``, paired t-tests of the final row and a closing paragraph in ``results.md``.

Outputs in ``out``: one directory per stage, ``runs/<retriever>__<collection>.trec`` for every
evaluated run (re-evaluate any number with ``pretrieve evaluate``), ``results.json``, ``results.md``
(one row per retriever and collection) and ``recipe.resolved.json``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pretrieve.errors import ConfigError, InputError, StaleOutputError
from pretrieve.io_utils import atomic_open, write_json

logger = logging.getLogger(__name__)

STAGE_KINDS = ("pretrain", "finetune", "mine", "reranker", "teacher", "fuse", "evaluate")
RESULT_MEASURES = ("nDCG@10", "MRR@10", "R@100")


@dataclass
class RunState:
    """What the stages have produced so far (paths), threaded through the recipe."""

    recipe: dict[str, Any]
    out: Path
    data: Path
    base_model: str
    pretrained: str | None = None
    retrievers: dict[str, str] = field(default_factory=dict)   # name → exported retriever dir, in order
    groups: dict[str, str] = field(default_factory=dict)       # "mined" / "teacher" → groups JSONL
    reranker: str | None = None
    fusions: dict[str, dict[str, Any]] = field(default_factory=dict)   # name → {"runs": [...], "spec": FusionSpec}
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def init_model(self) -> str:
        """Every fine-tuning stage starts from the pre-trained checkpoint (or the base model)."""
        return self.pretrained or self.base_model

    @property
    def latest_retriever(self) -> str | None:
        return list(self.retrievers.values())[-1] if self.retrievers else None


def data_roots(recipe: Mapping[str, Any]) -> list[Path]:
    roots = []
    for value in (recipe.get("data_root"), os.environ.get("PRETRIEVE_DATA")):
        if value:
            roots.append(Path(os.path.expandvars(str(value))).expanduser())
    roots += [Path("../shared/data"), Path("/work/shared/data")]
    return roots


def resolve_collection_path(name_or_path: str, recipe: Mapping[str, Any]) -> Path:
    """A collection given as a path, or as a name under the first data root that has it."""
    path = Path(os.path.expandvars(str(name_or_path))).expanduser()
    if path.is_dir():
        return path
    for root in data_roots(recipe):
        if (root / str(name_or_path) / "corpus.jsonl").exists():
            return root / str(name_or_path)
    from pretrieve.data.registry import resolve_collection

    return resolve_collection(str(name_or_path))  # known name: cached or downloaded; else a clear error


def load_recipe(path: str | Path) -> dict[str, Any]:
    from pretrieve.train.run_config import load_config_file

    recipe = load_config_file(path)
    for key in ("out", "model", "data", "stages"):
        if key not in recipe:
            raise InputError(f"recipe has no '{key}'", path=path)
    stages = recipe["stages"]
    if not isinstance(stages, list) or not stages:
        raise InputError("'stages' must be a non-empty list", path=path, field="stages")
    for index, entry in enumerate(stages):
        kind, _ = stage_entry(entry, index)
        if kind not in STAGE_KINDS:
            raise InputError(f"stage {index + 1}: unknown stage '{kind}' (known: {', '.join(STAGE_KINDS)})",
                             path=path, field="stages")
    return recipe


def stage_entry(entry: Any, index: int) -> tuple[str, dict[str, Any]]:
    """``"mine"`` or ``{"mine": {...options}}`` → ``("mine", options)``."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping) and len(entry) == 1:
        kind, options = next(iter(entry.items()))
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"stage {index + 1} ({kind}): options must be a mapping")
        return str(kind), dict(options)
    raise ConfigError(f"stage {index + 1}: expected a stage name or a one-key mapping, got {entry!r}")


def run_recipe(path: str | Path, out: str | Path | None = None, show_progress: bool = True,
               redo_changed: bool = False) -> dict[str, Any]:
    """Execute (or resume) a recipe; returns the results dict also written to ``results.json``."""
    recipe = load_recipe(path)
    if out is not None:
        recipe["out"] = str(out)
    out_dir = Path(recipe["out"])
    out_dir.mkdir(parents=True, exist_ok=True)
    from pretrieve.models import resolve_model

    state = RunState(recipe=recipe, out=out_dir, data=resolve_collection_path(recipe["data"], recipe),
                     base_model=resolve_model(recipe["model"]))
    write_json(out_dir / "recipe.resolved.json", {**recipe, "data": str(state.data), "model": state.base_model})
    results: dict[str, Any] = {"recipe": recipe.get("name", Path(path).stem), "rows": []}
    counts: dict[str, int] = {}
    for index, entry in enumerate(recipe["stages"]):
        kind, options = stage_entry(entry, index)
        counts[kind] = counts.get(kind, 0) + 1
        label = kind if kind != "finetune" else f"finetune-s{options.get('stage', counts[kind])}"
        started = time.perf_counter()
        logger.info("stage %d/%d: %s", index + 1, len(recipe["stages"]), label)
        rows = run_stage(kind, state, options, label, show_progress, redo_changed)
        state.timings[label] = round(time.perf_counter() - started, 1)
        if rows:
            results["rows"].extend(rows)
    results["timings_s"] = state.timings
    results["command"] = f"pretrieve run {path}"
    write_json(out_dir / "results.json", results)
    with atomic_open(out_dir / "results.md") as handle:
        handle.write(results_markdown(results))
    return results


def run_stage(kind: str, state: RunState, options: dict[str, Any], label: str, show_progress: bool,
              redo_changed: bool) -> list[dict] | None:
    """One stage; a stage directory left by other settings is set aside and redone when ``redo_changed``."""
    try:
        return STAGES[kind](state, options, label, show_progress)
    except StaleOutputError as exc:
        directory = exc.directory.resolve()
        if state.out.resolve() not in directory.parents:
            raise
        if not redo_changed:
            raise StaleOutputError(f"{label}: {exc}; or rerun with --redo-changed to set it aside and run the "
                                   "stage again", exc.directory) from None
        aside = set_aside(directory)
        logger.warning("%s: settings changed since %s was written; moved it to %s and running the stage again",
                       label, directory, aside)
        return STAGES[kind](state, options, label, show_progress)


def set_aside(directory: Path) -> Path:
    """Rename ``directory`` to ``<name>.replaced-<UTC time>[-k]`` (a fresh name) and return the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    aside, k = directory.with_name(f"{directory.name}.replaced-{stamp}"), 1
    while aside.exists():
        k += 1
        aside = directory.with_name(f"{directory.name}.replaced-{stamp}-{k}")
    directory.rename(aside)
    return aside


# ------------------------------------------------------------------------------------------ stages
def _seeded(state: RunState, options: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(options)
    values.setdefault("seed", state.recipe.get("seed", 42))
    return values


def stage_pretrain(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.pretrainer import pretrain
    from pretrieve.train.run_config import build_pretrain_config

    out = state.out / "pretrain"
    values = _seeded(state, options)
    values.setdefault("corpus", str(state.data))
    values["corpus"] = str(resolve_collection_path(values["corpus"], state.recipe)) if not Path(
        str(values["corpus"])).exists() else values["corpus"]
    method = values.pop("method", "bow")
    flags = {**values, "model": state.base_model, "out": str(out), "show_progress": show_progress}
    config = build_pretrain_config({}, flags, {"method": method}, resume=True)
    state.pretrained = str(pretrain(config))   # skipped when finished with the same settings


def stage_finetune(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.finetuner import build_finetune_config, finetune

    values = {**state.recipe.get("finetune", {}), **_seeded(state, options)}
    stage = int(values.setdefault("stage", len(state.retrievers) + 1))
    if stage in (2, 3) and "groups" not in values:
        key = "mined" if stage == 2 else "teacher"
        if key not in state.groups:
            producer = "mine" if stage == 2 else "teacher"
            raise ConfigError(f"{label}: stage {stage} needs the '{producer}' stage earlier in the recipe")
        values["groups"] = state.groups[key]
    flags = {**values, "model": state.init_model, "data": str(state.data), "out": str(state.out / label),
             "show_progress": show_progress}
    config = build_finetune_config({}, flags, resume=True)
    state.retrievers[label] = str(finetune(config))


def stage_mine(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.retrieval.mining import mine_negatives

    retriever = state.latest_retriever
    if retriever is None:
        raise ConfigError("mine: needs a fine-tuned retriever earlier in the recipe (a 'finetune' stage)")
    values = dict(options)
    split = values.pop("split", "train")
    out = state.out / "mine" / "groups.jsonl"
    path = mine_negatives(retriever, state.data, split, out, cache_dir=_embedding_cache(state, retriever),
                          show_progress=show_progress, **values)
    state.groups["mined"] = str(path)


def stage_reranker(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.reranker import RerankerConfig, train_reranker

    if "mined" not in state.groups and "groups" not in options:
        raise ConfigError("reranker: needs mined groups (a 'mine' stage earlier) or a 'groups' option")
    values = _seeded(state, options)
    values.setdefault("groups", state.groups.get("mined"))
    values.setdefault("model", state.base_model)
    config = RerankerConfig(**{**values, "data": str(state.data), "out": str(state.out / "reranker"),
                               "resume": True, "show_progress": show_progress})
    state.reranker = str(train_reranker(config))


def stage_teacher(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.reranker import teacher_groups

    if state.reranker is None or "mined" not in state.groups:
        raise ConfigError("teacher: needs a 'reranker' stage and mined groups earlier in the recipe")
    out = state.out / "teacher" / "groups.jsonl"
    state.groups["teacher"] = str(teacher_groups(state.reranker, state.data, state.groups["mined"], out,
                                                 show_progress=show_progress, **options))


def _embedding_cache(state: RunState, model_dir: str, collection: Path | None = None) -> Path:
    """One corpus-embedding cache per (model, collection): mining and evaluation share it."""
    collection = collection or state.data
    return state.out / "embeddings" / f"{Path(model_dir).parent.name}__{collection.name}"


def stage_evaluate(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> list[dict]:
    from pretrieve.data import BeirCollection, read_run
    from pretrieve.evaluation import evaluate

    _check_final_options(state, options)
    default_split = options.get("split", "test")
    depth = int(options.get("depth", 1000))
    modes = _search_modes(options.get("modes"))
    collections = [_collection_and_split(c, default_split, state.recipe)
                   for c in options.get("collections", [state.recipe["data"]])]
    retrievers = dict(state.retrievers)
    if options.get("zero_shot", False):
        retrievers = {"zero-shot": state.base_model, **retrievers}
    if not retrievers:
        raise ConfigError("evaluate: no retriever to evaluate (add 'finetune' stages or zero_shot: true)")
    rows = []
    runs_dir = state.out / "runs"
    for collection_path, split in collections:
        collection = BeirCollection(collection_path)
        qrels = collection.load_qrels(split)
        if options.get("bm25", False):
            run_path = _bm25_run(collection, split, depth, runs_dir / f"bm25__{collection_path.name}.trec")
            rows.append(_row("bm25", collection_path.name, run_path, evaluate(qrels, read_run(run_path), RESULT_MEASURES)))
        for name, model_dir in retrievers.items():
            for label, mode in _labelled_modes(name, model_dir, modes):
                run_path = _retriever_run(state, name, model_dir, collection, split, depth, label, mode, show_progress)
                rows.append(_row(label, collection_path.name, run_path,
                                 evaluate(qrels, read_run(run_path), RESULT_MEASURES)))
        rerank_depth = options.get("rerank_depth")
        if rerank_depth and state.reranker is not None and state.retrievers:
            name = _reranked_retriever(state, options.get("rerank"))
            _retriever_run(state, name, state.retrievers[name], collection, split, depth, name, None, show_progress)
            rows.append(_rerank_row(state, name, collection_path, split, int(rerank_depth), runs_dir, qrels,
                                    show_progress))
        rows.extend(_fusion_rows(state, collection, split, depth, qrels, show_progress))
        _mark_final(rows, options, collection_path.name, qrels)
    return rows


def _search_modes(value: Any) -> list[str] | None:
    """The evaluate stage's ``modes`` option: None, or a list of sparse/hybrid search modes."""
    from pretrieve.retrieval.sparse_search import SEARCH_MODES

    if value is None:
        return None
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or any(mode not in SEARCH_MODES for mode in values):
        raise ConfigError(f"evaluate: 'modes' must be a non-empty list of {', '.join(SEARCH_MODES)}, got {value!r}")
    return list(dict.fromkeys(values))


def _labelled_modes(name: str, model_dir: str, modes: list[str] | None) -> list[tuple[str, str | None]]:
    """``[(row label, search mode)]``: one row per mode (``finetune-s1-sparse``) for a model fine-tuned with the
    sparse/hybrid representation when ``modes`` is given, else one row searched as trained."""
    from pretrieve.retrieval.sparse_search import is_sparse_model

    if modes and is_sparse_model(model_dir):
        return [(f"{name}-{mode}", mode) for mode in modes]
    return [(name, None)]


def _retriever_run(state: RunState, name: str, model_dir: str, collection, split: str, depth: int, label: str,
                   mode: str | None, show_progress: bool) -> Path:
    """``runs/<label>__<collection>.trec``, searched now unless it exists (one corpus cache per retriever)."""
    from pretrieve.data import write_run
    from pretrieve.retrieval.mining import dense_search

    collection_name = collection.root.name
    run_path = state.out / "runs" / f"{label}__{collection_name}.trec"
    if not run_path.exists():
        cache = state.out / "embeddings" / f"{name}__{collection_name}"
        run = dense_search(model_dir, collection.load_corpus(), collection.load_queries(split), k=depth,
                           cache_dir=cache, show_progress=show_progress, mode=mode)
        write_run(run, run_path, tag=label)
    return run_path


def _collection_and_split(entry: str, default_split: str, recipe: Mapping[str, Any]) -> tuple[Path, str]:
    """``"scifact"`` → (path, default split); ``"msmarco:dev"`` → (path, "dev")."""
    name, _, split = str(entry).partition(":") if ":" in str(entry) and not Path(str(entry)).exists() else (entry, "", "")
    return resolve_collection_path(name, recipe), split or default_split


def _reranked_retriever(state: RunState, requested: str | None) -> str:
    """The evaluate stage's ``rerank`` option: which retriever's run the reranker re-orders (default: the
    latest, e.g. ``finetune-s3``; ``finetune-s2`` re-ranks the run the teacher scores were computed on)."""
    if requested is None:
        return list(state.retrievers)[-1]
    if requested not in state.retrievers:
        raise ConfigError(f"evaluate: rerank: no retriever named {requested!r} "
                          f"(known: {', '.join(state.retrievers)})")
    return requested


def _rerank_row(state: RunState, name: str, collection_path: Path, split: str, depth: int, runs_dir: Path, qrels,
                show_progress: bool) -> dict:
    from pretrieve.data import read_run
    from pretrieve.evaluation import evaluate
    from pretrieve.train.reranker import rerank_run_file

    source = runs_dir / f"{name}__{collection_path.name}.trec"
    out = runs_dir / f"{name}+rerank@{depth}__{collection_path.name}.trec"
    rerank_run_file(state.reranker, collection_path, split, source, out, depth=depth, show_progress=show_progress)
    return _row(f"{name}+rerank@{depth}", collection_path.name, out, evaluate(qrels, read_run(out), RESULT_MEASURES))


def _bm25_run(collection, split: str, depth: int, run_path: Path) -> Path:
    """``run_path``: BM25 (Pyserini defaults) top ``depth`` of the split's judged queries, searched unless it exists."""
    if not run_path.exists():
        from pretrieve.data import write_run
        from pretrieve.retrieval.bm25 import BM25Index

        run = BM25Index.build(collection.load_corpus()).search(collection.load_queries(split), k=depth)
        write_run(run, run_path, tag="bm25")
    return run_path


# -------------------------------------------------------------------------------------------- fusion
FUSE_OPTIONS = ("name", "runs", "method", "norm", "weights", "k", "depth", "fit_split", "step", "measure")


def stage_fuse(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    """A fused retriever: ``runs`` (``bm25``, ``zero-shot``, fine-tuned retrievers such as ``finetune-s2``, or
    ``finetune-s2+rerank@100``) combined by ``method`` rrf | wsum | auto (:mod:`pretrieve.retrieval.fusion`).

    ``wsum`` / ``auto`` without explicit ``weights`` fit the weights (``auto``: also rrf vs wsum and the
    normalisation) on the training collection's ``fit_split`` (default ``train``) queries: every component
    searches those queries (``runs/<component>.<split>__<collection>.trec``) and only that split's qrels are
    read; the fitted fusion is stored in ``fuse/<name>/fusion.json`` (reused while its inputs are unchanged).
    The ``evaluate`` stage then adds one row per fusion and evaluated collection — zero-shot collections use the
    fusion fitted on the training collection.
    """
    from pretrieve.retrieval import fusion

    unknown = sorted(set(options) - set(FUSE_OPTIONS))
    if unknown:
        raise ConfigError(f"{label}: unknown option(s) {', '.join(unknown)} (known: {', '.join(FUSE_OPTIONS)})")
    components = options.get("runs")
    if not isinstance(components, list) or len(components) < 2 or len(set(map(str, components))) != len(components):
        raise ConfigError(f"{label}: 'runs' must list two or more distinct retrievers to fuse, got {components!r}")
    components = [str(c) for c in components]
    for component in components:
        _component_source(state, component, label)
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
        spec = _fit_fusion(state, name, components, fusion.parse_candidates(method, norm),
                           str(options.get("fit_split", "train")), str(options.get("measure", fusion.DEFAULT_FIT_MEASURE)),
                           float(options.get("step", fusion.DEFAULT_STEP)), depth, k, show_progress)
    state.fusions[name] = {"runs": components, "spec": spec}
    logger.info("%s: %s = %s of %s", label, name, spec.describe(), ", ".join(components))


def _component_source(state: RunState, component: str, where: str) -> tuple[str, str | None, int | None]:
    """``(kind, model, rerank depth)`` of a fusion component: ``("bm25", None, None)``, ``("dense", model dir,
    None)`` or ``("rerank", retriever label, depth)``."""
    if component == "bm25":
        return "bm25", None, None
    if component == "zero-shot":
        return "dense", state.base_model, None
    if component in state.retrievers:
        return "dense", state.retrievers[component], None
    base, sep, depth = component.partition("+rerank@")
    if sep and base in state.retrievers and depth.isdigit() and int(depth) > 0:
        if state.reranker is None:
            raise ConfigError(f"{where}: {component} needs a 'reranker' stage earlier in the recipe")
        return "rerank", base, int(depth)
    known = ["bm25", "zero-shot", *state.retrievers] + [f"{r}+rerank@N" for r in state.retrievers if state.reranker]
    raise ConfigError(f"{where}: unknown retriever {component!r} to fuse (known so far: {', '.join(known)})")


def _component_run(state: RunState, component: str, collection, split: str, depth: int, run_name: str,
                   show_progress: bool) -> Path:
    """``runs/<run_name>__<collection>.trec``: the component's run on the split's judged queries (searched unless
    it exists; dense retrievers share one corpus-embedding cache per collection with the evaluate stage)."""
    kind, model, rerank_depth = _component_source(state, component, "fuse")
    path = state.out / "runs" / f"{run_name}__{collection.root.name}.trec"
    if kind == "bm25":
        return _bm25_run(collection, split, depth, path)
    if kind == "dense":
        return _retriever_run(state, component, model, collection, split, depth, run_name, None, show_progress)
    from pretrieve.train.reranker import rerank_run_file

    source_name = model if run_name == component else f"{model}.{split}"
    source = _component_run(state, model, collection, split, depth, source_name, show_progress)
    return rerank_run_file(state.reranker, collection.root, split, source, path, depth=rerank_depth,
                           show_progress=show_progress)


def _fit_fusion(state: RunState, name: str, components: list[str], candidates, split: str, measure: str,
                step: float, depth: int, k: int, show_progress: bool):
    """The fusion fitted on the training collection's ``split`` queries (never ``test``), stored and reused."""
    import json

    from pretrieve import artifacts
    from pretrieve.data import BeirCollection
    from pretrieve.retrieval import fusion

    if split == fusion.TEST_SPLIT:
        raise ConfigError(f"fuse: {name}: fit_split must be a training split, never '{split}'")
    collection = BeirCollection(state.data)
    qrels_path = collection.qrels_path(split)          # that split's qrels only; checked before any search
    train_runs = {f"run:{c}": _component_run(state, c, collection, split, depth, f"{c}.{split}", show_progress)
                  for c in components}
    path = state.out / "fuse" / name / "fusion.json"
    settings = {"runs": components, "candidates": [list(c) for c in candidates], "split": split, "measure": measure,
                "step": step, "depth": depth, "k": k}
    inputs = {**train_runs, "qrels": qrels_path}
    if artifacts.is_current(path, settings, inputs, kind="fusion"):
        return fusion.FusionSpec.from_dict(json.loads(path.read_text(encoding="utf-8")))
    spec = fusion.fit_on_split(list(train_runs.values()), collection.root, split, candidates=candidates,
                               measure=measure, step=step, depth=depth, k=k)
    with artifacts.write_file(path, kind="fusion", settings=settings, inputs=inputs) as tmp:
        tmp.write_text(json.dumps(spec.to_dict(), indent=2), encoding="utf-8")
    return spec


def _fusion_rows(state: RunState, collection, split: str, depth: int, qrels, show_progress: bool) -> list[dict]:
    """One row per fusion of the recipe on this collection: ``runs/<fusion>__<collection>.trec``."""
    from pretrieve import artifacts
    from pretrieve.data import read_run
    from pretrieve.evaluation import evaluate
    from pretrieve.retrieval import fusion

    rows = []
    for name, entry in state.fusions.items():
        spec = entry["spec"]
        sources = [_component_run(state, c, collection, split, depth, c, show_progress) for c in entry["runs"]]
        path = state.out / "runs" / f"{name}__{collection.root.name}.trec"
        inputs = {f"run{i + 1}": p for i, p in enumerate(sources)}
        fitted = state.out / "fuse" / name / "fusion.json"
        fit_inputs = {"fusion": fitted} if spec.fit and fitted.exists() else {}
        if not artifacts.is_current(path, fusion.fusion_settings(spec), {**inputs, **fit_inputs}, kind="run"):
            fusion.write_fused_run(sources, path, spec, tag=name, fit_inputs=fit_inputs)
        row = _row(name, collection.root.name, path, evaluate(qrels, read_run(path), RESULT_MEASURES))
        row["fusion"] = {"runs": entry["runs"], "method": spec.describe(), "fit": fusion.fit_record(spec)}
        rows.append(row)
    return rows


def _check_final_options(state: RunState, options: Mapping[str, Any]) -> None:
    """The evaluate stage's ``final`` (the row to use) and ``compare`` (rows it is tested against) name rows."""
    final, compare = options.get("final"), options.get("compare", [])
    if final is None:
        if compare:
            raise ConfigError("evaluate: 'compare' needs 'final' (the row the comparisons are made for)")
        return
    if not isinstance(compare, list):
        raise ConfigError(f"evaluate: 'compare' must be a list of row names, got {compare!r}")
    known = (["bm25"] if options.get("bm25") else []) + (["zero-shot"] if options.get("zero_shot") else []) \
        + list(state.retrievers) + list(state.fusions)
    for name in [final, *compare]:
        if name not in known and "+rerank@" not in str(name):
            raise ConfigError(f"evaluate: no row named {name!r} (rows: {', '.join(known)})")


def _mark_final(rows: list[dict], options: Mapping[str, Any], collection: str, qrels) -> None:
    """Paired two-sided t-tests (nDCG@10, per query) of the ``final`` row against each ``compare`` row of this
    collection, stored in the final row as ``vs``."""
    from pretrieve.data import read_run
    from pretrieve.evaluation import compare, evaluate

    final = options.get("final")
    if final is None:
        return
    here = {row["retriever"]: row for row in rows if row["collection"] == collection}
    if final not in here:
        raise ConfigError(f"evaluate: final row {final!r} was not evaluated on {collection}")
    measure = RESULT_MEASURES[0]
    result = evaluate(qrels, read_run(here[final]["run"]), [measure])
    here[final]["final"] = True
    here[final]["vs"] = {}
    for name in options.get("compare", []):
        if name not in here:
            raise ConfigError(f"evaluate: comparison row {name!r} was not evaluated on {collection}")
        baseline = evaluate(qrels, read_run(here[name]["run"]), [measure])
        here[final]["vs"][name] = {"measure": measure, **compare(baseline, result, measure, test="ttest").to_dict()}


def _row(retriever: str, collection: str, run_path: Path, result) -> dict:
    return {"retriever": retriever, "collection": collection, "run": str(run_path),
            **{measure: round(result.aggregate[measure], 4) for measure in RESULT_MEASURES}}


def results_markdown(results: Mapping[str, Any]) -> str:
    lines = [f"# Results: {results['recipe']}", "",
             "| retriever | collection | " + " | ".join(RESULT_MEASURES) + " |",
             "|---|---|" + "---|" * len(RESULT_MEASURES)]
    for row in results["rows"]:
        lines.append(f"| {row['retriever']} | {row['collection']} | "
                     + " | ".join(f"{row[m]:.4f}" for m in RESULT_MEASURES) + " |")
    lines += ["", "Runs are in `runs/`; re-evaluate any of them with `pretrieve evaluate --data DIR --split test RUN`.", ""]
    lines += _fusion_lines(results) + _final_lines(results)
    return "\n".join(lines)


def _fusion_lines(results: Mapping[str, Any]) -> list[str]:
    """What each fused row is (components, fusion, and where its weights were fitted)."""
    fused = {row["retriever"]: row["fusion"] for row in results["rows"] if row.get("fusion")}
    lines = []
    for name, info in fused.items():
        fit = info.get("fit")
        how = (f", weights fitted on the {fit['queries']} `{fit['split']}` queries of the training collection "
               f"({fit['measure']} {fit['score']:.4f} there)" if fit else "")
        lines.append(f"- `{name}`: {info['method']} of {' + '.join(f'`{r}`' for r in info['runs'])}{how}")
    return (["Fused rows:", "", *lines, ""]) if lines else []


def _final_lines(results: Mapping[str, Any]) -> list[str]:
    """The paired t-tests of the final row and one closing paragraph: which row to use, what each stage added, and
    the command behind every number."""
    finals = [row for row in results["rows"] if row.get("final")]
    if not finals:
        return []
    measure = RESULT_MEASURES[0]
    names = list(dict.fromkeys(name for row in finals for name in row["vs"]))
    final = finals[0]["retriever"]
    lines = [f"Paired two-sided t-tests of `{final}` against each baseline ({measure} per query; "
             "Δ = final − baseline, ▲/▼: p ≤ 0.05):", "",
             "| collection | " + " | ".join(f"vs `{n}`: Δ (p)" for n in names) + " |", "|---|" + "---|" * len(names)]
    for row in finals:
        cells = []
        for name in names:
            test = row["vs"].get(name)
            if not test:
                cells.append("—")
                continue
            mark = ("▲" if test["mean_difference"] > 0 else "▼") if test.get("significant") else ""
            p = test.get("p_value")
            cells.append(f"{test['mean_difference']:+.4f}{mark} (p = {p:.2g})" if p is not None else "—")
        lines.append(f"| {row['collection']} | " + " | ".join(cells) + " |")
    scores = {(row["retriever"], row["collection"]): row[measure] for row in results["rows"]}
    collections = [row["collection"] for row in finals]
    fused = {row["retriever"] for row in results["rows"] if row.get("fusion")}
    trained = [name for name in dict.fromkeys(row["retriever"] for row in results["rows"])
               if name not in ("bm25", "zero-shot", final) and name not in fused and "+rerank@" not in name]
    chain = (["zero-shot"] if any(name == "zero-shot" for name, _ in scores) else []) + trained + [final]

    def differences(better: str, worse: str) -> str:
        return " / ".join(f"{scores[(better, c)] - scores[(worse, c)]:+.4f}" for c in collections
                          if (better, c) in scores and (worse, c) in scores)

    steps = [f"`{a}` → `{b}` {differences(b, a)}" for a, b in zip(chain, chain[1:])]
    text = (f"**Which row to use: `{final}`** — {measure} "
            + " / ".join(f"{scores[(final, c)]:.4f}" for c in collections) + f" on {' / '.join(collections)}; "
            + "; ".join(f"{differences(final, n)} over `{n}`" for n in names) + ". "
            + (f"What each stage added ({measure}, {' / '.join(collections)}): " + "; ".join(steps) + ". "
               if steps else "")
            + f"Every number here comes from the runs in `runs/`; `{results.get('command', 'pretrieve run RECIPE')}` "
            "reproduces all of them (finished stages are skipped; delete the output directory to recompute).")
    return lines + ["", text, ""]


STAGES: dict[str, Callable[..., Any]] = {
    "pretrain": stage_pretrain, "finetune": stage_finetune, "mine": stage_mine,
    "reranker": stage_reranker, "teacher": stage_teacher, "fuse": stage_fuse, "evaluate": stage_evaluate,
}
