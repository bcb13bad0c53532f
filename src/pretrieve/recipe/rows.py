"""The row sources several stages share: the run files a result row is scored from and the fusions fitted on them.

The ``evaluate`` stage makes one row per retriever and collection; the ``fuse`` and ``select`` stages define fused
retrievers whose rows it adds (:func:`fusion_rows`), fitted on the training collection's dev (or train) queries
(:func:`fit_fusion`). Here are the pieces they share, so that no stage imports another:

* :func:`bm25_run` and :func:`retriever_run`: ``runs/<label>__<collection>[:split].trec`` of BM25 and of a
  (fine-tuned, zero-shot or interpolated) retriever, searched unless current (:mod:`pretrieve.retrieval.runs`);
* :func:`component_source` / :func:`component_run`: a fusion component by name (``bm25``, ``zero-shot``, a
  retriever, a select candidate, ``<retriever>+rerank@K``) and its run;
* :func:`fit_split`, :func:`check_fit_split`, :func:`fit_fusion`, :func:`fusion_file`: where and how a fusion's
  weights are fitted and stored (never on ``test``, never on a split a fused retriever was trained on);
* :func:`origin`, :func:`split_query_ids`: the collection a derived one (a dev split, a half, a guard split) was
  made from, and a split's judged queries — what the ``select`` stage's guard and the ``evaluate`` stage's
  in-domain mark compare;
* :func:`fusion_rows`: one row per fusion of the recipe; :func:`stage_rows`: the names of the rows stages add to the
  evaluate stages after them (each stage declares its own, :class:`pretrieve.recipe.schema.Stage` ``rows``).

What the stages made is read from :class:`~pretrieve.recipe.runner.RunState` by the names they declare they
``give``: ``retriever``, ``candidate``, ``reranker``, ``fusion``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from pretrieve import artifacts, ranks
from pretrieve.data import BeirCollection, read_run
from pretrieve.data.folds import RECORD
from pretrieve.errors import ConfigError
from pretrieve.evaluation import evaluate
from pretrieve.recipe.dev import dev_split
from pretrieve.recipe.results import RESULT_MEASURES, result_row
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import STAGES, stage_labels
from pretrieve.retrieval import fusion, runs
from pretrieve.retrieval.rerank import rerank_run_file

#: How the zero-shot row's checkpoint is encoded when it carries no training record (a released retriever): the
#: ``load_retriever`` arguments an evaluate stage's ``zero_shot_encoding`` sets.
RELEASED_ENCODING = ("max_length", "query_max_length", "title_join")


def bm25_run(state: RunState, collection: BeirCollection, split: str, depth: int) -> Path:
    """``runs/bm25__<collection>[:split].trec``, searched now unless current (one index per collection in
    ``bm25-index/``)."""
    return runs.bm25_run(collection, split, depth, state.run_path("bm25", collection.root, split),
                         index_dir=state.out / "bm25-index" / collection.root.name)


def retriever_run(state: RunState, name: str, model_dir: str, collection: BeirCollection, split: str, depth: int,
                  label: str, mode: str | None, show_progress: bool,
                  encoding: Mapping[str, Any] | None = None) -> Path:
    """``runs/<label>__<collection>[:split].trec`` of the retriever ``name`` (its weights in ``model_dir``), searched
    now unless current (:func:`pretrieve.retrieval.runs.retriever_run`). ``encoding``: the evaluate stage's
    ``precision`` / ``batch_size``, and for a released retriever (the zero-shot row) its ``RELEASED_ENCODING``."""
    encoding = dict(encoding or {})
    return runs.retriever_run(model_dir, collection, split, depth, state.run_path(label, collection.root, split),
                              index_dir=state.corpus_index(name, collection), mode=mode,
                              precision=encoding.get("precision", "auto"),
                              batch_size=int(encoding.get("batch_size", 64)), tag=label, show_progress=show_progress,
                              encoding={k: encoding[k] for k in RELEASED_ENCODING if encoding.get(k) is not None})


def origin(collection: str | Path) -> Path:
    """The collection ``collection`` was derived from (a dev split, a half, a guard split: its ``folds.json``'s
    ``source``, followed to the end), resolved; the collection itself when it is no derived one."""
    path = Path(collection).resolve()
    seen = set()
    while (path / RECORD).is_file() and path not in seen:
        seen.add(path)
        source = json.loads((path / RECORD).read_text(encoding="utf-8")).get("source")
        if not source:
            break
        path = Path(source).resolve()
    return path


def split_query_ids(collection: str | Path, split: str) -> set[str]:
    """The judged query ids of ``split`` of ``collection`` (empty when it has no such split)."""
    collection = BeirCollection(Path(collection))
    return set(collection.load_qrels(split)) if split in collection.splits() else set()


def fit_split(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> str:
    """Where a fusion's weights are fitted: the option, else the recipe's dev split, else ``train``."""
    return str(options.get("fit_split") or dev_split(recipe) or "train")


def trained_splits(recipe: Mapping[str, Any]) -> set[str]:
    """The splits of the training collection whose queries some stage trained or mined on (the stages that
    declare ``trains``: fine-tuning, mining, the reranker): a stage's ``split``, else its kind's shared one, else
    ``train``."""
    splits = set()
    for kind, _, options in stage_labels(recipe):
        spec = STAGES[kind]
        if spec.trains:
            shared = (recipe.get(spec.shared) or {}) if spec.shared is not None else {}
            splits.add(str(options.get("split") or shared.get("split") or "train"))
    return splits


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


def component_source(state: RunState, component: str, where: str) -> tuple[str, str | None, int | None]:
    """``(kind, model, rerank depth)`` of a fusion component: ``("bm25", None, None)``, ``("dense", model dir,
    None)`` or ``("rerank", retriever label, depth)``."""
    retrievers, candidates, reranker = state.named("retriever"), state.named("candidate"), state.latest("reranker")
    if component == "bm25":
        return "bm25", None, None
    if component == "zero-shot":
        return "dense", state.base_model, None
    if component in retrievers:
        return "dense", retrievers[component], None
    if component in candidates:
        return "dense", candidates[component], None
    base, sep, depth = component.partition("+rerank@")
    if sep and base in retrievers and depth.isdigit() and int(depth) > 0:
        if reranker is None:
            raise ConfigError(f"{where}: {component} needs a 'reranker' stage earlier in the recipe")
        return "rerank", base, int(depth)
    known = ["bm25", "zero-shot", *retrievers] + [f"{r}+rerank@N" for r in retrievers if reranker]
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
    return rerank_run_file(state.latest("reranker"), collection.root, split, source, path, depth=rerank_depth,
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
                "cross_fit": {"folds": fusion.CROSS_FIT_FOLDS, "seed": fusion.CROSS_FIT_SEED},
                "per_query": True}   # the report keeps per-query cross-fitted values (a fit stored without: made again)
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
    for name, entry in state.named("fusion").items():
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
        row = result_row(name, runs.run_tag(collection.root, split), path,
                         evaluate(qrels, read_run(path), measures, ignore_identical_ids=ignore_identical_ids))
        row["fusion"] = {"runs": entry["runs"], "method": spec.describe(), "fit": fusion.fit_record(spec)}
        if entry.get("selection"):
            row["fusion"]["selection"] = entry["selection"]
        rows.append(row)
    return rows


def stage_rows(recipe: Mapping[str, Any]) -> list[str]:
    """The names of the rows the recipe's stages add to the evaluate stages after them (the fusions of its ``fuse``
    and ``select`` stages: each stage's declared ``rows``)."""
    names = []
    for kind, _, options in stage_labels(recipe):
        rows = STAGES[kind].rows
        names.extend(rows(options) if rows is not None else [])
    return names
