"""The Python API: the verbs of the command line as functions, importable from ``pretrieve`` (docs/python.md).

=================== ========================================= ==========================================
function            returns                                   the command it matches
=================== ========================================= ==========================================
:func:`pretrain`    the pre-trained encoder's directory        ``pretrieve pretrain``
:func:`finetune`    the fine-tuned retriever's directory       ``pretrieve finetune``
``load_retriever``  a :class:`~pretrieve.retrieval.load.Retriever` (``pretrieve.retrieval.load``)
:func:`encode`      vectors of texts                           ``pretrieve encode``
:func:`search`      a run ``{query_id: {doc_id: score}}``      ``pretrieve dense`` / ``search``
:func:`bm25`        a run                                      ``pretrieve bm25``
:func:`fuse`        a run                                      ``pretrieve fuse``
:func:`evaluate`    a :class:`~pretrieve.evaluation.ResultsTable` ``pretrieve evaluate``
                    (of ``models=``: a ``CollectionsTable``)
:func:`run_recipe`  the results dict of ``results.json``       ``pretrieve run``
:func:`export`      the export folder (sentence-transformers   ``pretrieve export``
                    model + model card)
=================== ========================================= ==========================================

They take what the commands take: models as paths, offline aliases (``minilm``) or hub names
(:func:`pretrieve.models.resolve_model`), collections as paths or names, found by the one resolver of the command
line (:func:`pretrieve.data.registry.resolve_collection`: ``data_root``, ``$PRETRIEVE_DATA``, ``../shared/data``
beside a source checkout, the download cache, else downloaded). Training settings are the fields of the run's
configuration (``max_steps``, ``batch_size``, ``lr``, … — ``pretrieve pretrain --help`` lists them as flags); an
unknown one is refused with the closest name. Errors name these Python parameters, not command-line flags.

Nothing here changes global state: no logging handler is added, no log level, environment variable or matplotlib
backend is set. Work that takes more than a few seconds shows a progress bar (``show_progress=False`` to be quiet);
while a verb runs, transformers' warnings, "Loading weights" bars and checkpoint LOAD REPORT tables are held back
(as the command line does) and restored afterwards. Corpus embeddings are kept in the user cache
(:mod:`pretrieve.retrieval.cache`, ``$PRETRIEVE_CACHE``): a second :func:`search` of the same corpus with the same
model encodes no passage. Torch, transformers and FAISS are imported inside the verbs that need them, so
``import pretrieve`` stays light and :func:`bm25`, :func:`fuse` and :func:`evaluate` of runs never import torch.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from pretrieve import outputs
from pretrieve.data.beir import load_qrels
from pretrieve.data.collection import BeirCollection
from pretrieve.data.registry import benchmark_parts, resolve_collection, resolve_corpus
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError
from pretrieve.io_utils import load_config_file
from pretrieve.models import resolve_model
from pretrieve.provenance import provenance
from pretrieve.retrieval import cache as embedding_cache
from pretrieve.retrieval import fusion
from pretrieve.retrieval.bm25 import BM25Params, corpus_index
from pretrieve.retrieval.index import SearchOptions
from pretrieve.retrieval.runs import model_run
from pretrieve.train.settings import FinetuneSettings, PretrainSettings, default_of

if TYPE_CHECKING:
    import numpy as np

    from pretrieve.evaluation import CollectionsTable, ResultsTable
    from pretrieve.retrieval.load import Retriever

logger = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
RunLike = Union[Mapping[str, Mapping[str, float]], str, Path]
"""A run in memory, or a TREC run file."""
SIDES = ("query", "passage")


# ------------------------------------------------------------------------------------------------- training
def pretrain(model: str | Path, corpus: str | Path, out: str | Path,
             method: str | Mapping[str, Any] = default_of(PretrainSettings, "method"), *,
             data_root: str | Path | None = None, report_to: str | Sequence[str] | None = None,
             **settings: Any) -> Path:
    """Pre-train ``model`` on ``corpus`` with ``method`` into ``out``; returns ``out/final`` (loads with
    ``AutoModel.from_pretrained``). A finished run with the same settings is reused, an interrupted one resumes
    with ``resume=True``.

    ``corpus``: a collection name or directory, a ``corpus.jsonl`` / JSONL / text file, ``DIR@SPLIT`` of a
    ``datasets`` directory or ``hf:NAME[:CONFIG][@SPLIT]``. ``method``: a preset name (``bow``, ``retromae``,
    ``dupmae``, …; docs/methods.md), a method file or a mapping. ``settings``: fields of
    :class:`~pretrieve.train.pretrainer.PretrainConfig` (``max_steps``, ``batch_size``, ``lr``, ``max_len``,
    ``precision``, ``seed``, …) and the method overrides (``objectives``, ``weights``, ``encoder_mask``, …).
    ``report_to``: experiment trackers besides ``out/logs.jsonl`` (``"tensorboard"``, ``["wandb", "mlflow"]``, …:
    accelerate's names; default none; docs/recipes.md, "Tracking").
    """
    from pretrieve.train.pretrainer import pretrain as run_pretraining   # lazy: torch
    from pretrieve.train.run_config import PretrainOptions, build_pretrain_config   # lazy: torch

    _require(model=model, corpus=corpus, out=out)
    _check_settings(PretrainOptions, {**settings, "report_to": report_to}, "pretrain()")   # before any download
    required = {"model": str(model), "corpus": resolve_corpus(corpus, data_root=data_root), "out": str(out)}
    with quiet_libraries(), told():
        config = build_pretrain_config({**settings, "report_to": report_to}, required, {"method": method},
                                       where="pretrain()")
        return run_pretraining(config)


def finetune(model: str | Path, data: str | Path, out: str | Path, *,
             stage: int = default_of(FinetuneSettings, "stage"),
             data_root: str | Path | None = None, report_to: str | Sequence[str] | None = None,
             **settings: Any) -> Path:
    """Fine-tune ``model`` as a retriever on the training queries of collection ``data`` (stage 1: BM25
    negatives; 2 and 3 need ``groups=``, see docs/methods.md); returns ``out/final``, a sentence-transformers
    folder for dense retrievers. ``settings``: fields of :class:`~pretrieve.train.finetuner.FinetuneConfig`
    (``max_steps``, ``batch_size``, ``num_negatives``, ``pooling``, ``lr``, ``groups``, ``split``, …). ``report_to``:
    experiment trackers, as for :func:`pretrain`."""
    from pretrieve.train.finetuner import (FinetuneConfig, build_finetune_config,   # lazy: torch
                                           finetune as run_finetuning)

    _require(model=model, data=data, out=out)
    _check_settings(FinetuneConfig, {**settings, "report_to": report_to}, "finetune()")   # before any download
    required = {"model": str(model), "data": str(resolve_collection(data, data_root=data_root)), "out": str(out),
                "stage": stage}
    with quiet_libraries(), told():
        config = build_finetune_config({**settings, "report_to": report_to}, required, where="finetune()")
        return run_finetuning(config)


# ------------------------------------------------------------------------------------------------ retrieval
def encode(retriever: Retriever | str | Path, texts: Sequence[str], *, side: str = "passage", batch_size: int = 64,
           show_progress: bool = True, prompt: str | None = None, cache: bool = True) -> np.ndarray | dict[str, Any]:
    """Encode ``texts`` as queries or passages (``side``) with a retriever (loaded, or a model name / path):
    a ``[len(texts), dim]`` float32 array for dense retrievers; the named outputs (sparse matrices, token vectors)
    for other kinds. ``prompt`` (with a model name / path) replaces the side's saved prompt (``""``: none); a
    loaded retriever takes its prompts from ``load_retriever(query_prompt=…, passage_prompt=…)``. ``cache``: dense
    vectors of 256 texts or more are kept in the user cache (:mod:`pretrieve.retrieval.cache`, keyed by the model's
    fingerprint, the side's settings and the texts) and reused by a later call."""
    from pretrieve.retrieval.batches import encode_all   # lazy: torch

    if side not in SIDES:
        raise ConfigError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    if isinstance(texts, str):
        raise ConfigError("texts must be a sequence of strings, got one string (wrap it in a list)")
    if prompt is not None and not isinstance(retriever, (str, Path)):
        raise ConfigError("prompt: give the prompts of a loaded retriever to load_retriever(query_prompt=..., "
                          "passage_prompt=...)")
    _positive(batch_size=batch_size)
    with quiet_libraries():
        loaded = (load_retriever(retriever, **{f"{side}_prompt": prompt}) if prompt is not None
                  else _retriever(retriever))
        texts = list(texts)
        kept = (embedding_cache.texts_file(loaded, side, texts)
                if cache and loaded.kind == "dense" and len(texts) >= embedding_cache.MIN_CACHED_TEXTS else None)
        if kept is not None:
            vectors = embedding_cache.load_texts(kept, len(texts))
            if vectors is not None:
                logger.info("%d %s vectors from the cache (%s)", len(texts), side, kept)
                return vectors
        outputs = encode_all(getattr(loaded, side), texts, batch_size=batch_size,
                             show_progress=show_progress and len(texts) > batch_size, description=f"encode {side}s")
        if kept is not None:
            embedding_cache.save_texts(kept, outputs["embeddings"])
    return outputs["embeddings"] if loaded.kind == "dense" else outputs


def search(retriever: Retriever | str | Path, data: str | Path, *, split: str = "test",
           queries: Mapping[str, str] | None = None, k: int = 1000, data_root: str | Path | None = None,
           cache: str | Path | bool = True, mode: str | None = None, factory: str = "Flat",
           nprobe: int | None = None, ef_search: int | None = None, gpu: bool | None = None, batch_size: int = 64,
           show_progress: bool = True) -> Run:
    """The top-``k`` passages of collection ``data`` for the queries judged in ``split`` (or for ``queries``,
    ``{query_id: text}``), searched the way the retriever was trained (``mode`` picks another search of a
    sparse/hybrid model; ``factory`` an approximate FAISS index). ``cache``: where the corpus index is kept and
    reused while current — by default the user cache (:mod:`pretrieve.retrieval.cache`: keyed by the passage
    tower's files, the corpus's digest and the encoding settings, so a second search of the same corpus with the same
    model — or with one fine-tuned from it on the query side only — encodes no passage), a directory, or ``False``
    for a temporary one."""
    from pretrieve.retrieval.search import search as search_corpus   # lazy: torch

    _positive(k=k, batch_size=batch_size)
    collection = BeirCollection(resolve_collection(data, data_root=data_root))
    wanted = dict(queries) if queries is not None else collection.load_queries(split)
    options = SearchOptions(factory=factory, metric="ip", nprobe=nprobe, ef_search=ef_search, use_gpu=gpu)
    with quiet_libraries():
        loaded = _retriever(retriever)
        cache_dir = (embedding_cache.corpus_index_dir(loaded, collection.corpus_path) if cache is True or cache is None
                     else None if cache is False else cache)
        return search_corpus(loaded, wanted, collection.corpus_dataset(), k=k, cache_dir=cache_dir, mode=mode,
                             options=options, batch_size=batch_size, show_progress=show_progress)


def bm25(data: str | Path, *, split: str = "test", queries: Mapping[str, str] | None = None, k: int = 1000,
         k1: float = 0.9, b: float = 0.4, exclude_self: bool = False, data_root: str | Path | None = None,
         index: str | Path | None = None) -> Run:
    """BM25 (bm25s, Lucene scoring, Pyserini's k1/b) over the title + text of collection ``data``: the top ``k``
    for the queries judged in ``split`` (or for ``queries``). ``index``: a directory where the index is kept and
    reused while current (default: a temporary one)."""
    _positive(k=k)
    collection = BeirCollection(resolve_collection(data, data_root=data_root))
    wanted = dict(queries) if queries is not None else collection.load_queries(split)
    with corpus_index(collection.corpus_path, BM25Params(k1=k1, b=b), index_dir=index) as built:
        return built.search(wanted, k=k, exclude_self=exclude_self)


def fuse(runs: Sequence[RunLike], *, method: str = "rrf", norm: str | None = None,
         weights: Sequence[float] | None = None, k: int = 60, depth: int = 1000, fit_data: str | Path | None = None,
         fit_runs: Sequence[RunLike] | None = None, fit_split: str = "train", fit_measure: str = "nDCG@10",
         fit_step: float = 0.05, data_root: str | Path | None = None) -> Run:
    """One run from several: reciprocal rank fusion (``method="rrf"``, constant ``k``) or a normalised weighted
    score sum (``"wsum"``, ``norm`` minmax | zscore, convex ``weights``). The weights (or, with ``"auto"``, the
    method) can instead be fitted on training queries: ``fit_data`` (a collection) with ``fit_runs``, the same
    retrievers' runs on its ``fit_split`` queries, in the order of ``runs`` (the test split is refused)."""
    loaded = [_run(run, "runs") for run in runs]
    fitting = fit_data is not None or fit_runs is not None
    if len(loaded) < 2:
        raise ConfigError(f"runs: give at least two runs to fuse, got {len(loaded)}")
    if fitting and (fit_data is None or not fit_runs):
        raise ConfigError("fitting needs both fit_data (a collection) and fit_runs (one training run per run)")
    if fitting and weights is not None:
        raise ConfigError("give either weights or fit_data/fit_runs, not both")
    if method == "auto" and not fitting:
        raise ConfigError("method='auto' chooses on training queries: give fit_data and fit_runs")
    if method == "rrf" and (norm is not None or weights is not None):
        raise ConfigError("rrf fuses ranks: norm and weights belong to method='wsum'")
    if fitting:
        if method == "rrf":
            raise ConfigError("rrf has nothing to fit (k is fixed): drop fit_data/fit_runs, or use method='wsum' "
                              "or 'auto'")
        train_runs = [_run(run, "fit_runs") for run in fit_runs]
        if len(train_runs) != len(loaded):
            raise ConfigError(f"fit_runs: {len(train_runs)} training run(s) for {len(loaded)} runs; give one per run, "
                              "in the same order")
        qrels = BeirCollection(resolve_collection(fit_data, data_root=data_root)).load_qrels(fit_split)
        spec = fusion.fit_fusion(train_runs, qrels, fusion.parse_candidates(method, norm), measure=fit_measure,
                                 step=fit_step, depth=depth, k=k, split=fit_split)
        logger.info("fusion fitted on %s %s queries: %s", spec.fit["queries"], fit_split, spec.describe())
    else:
        spec = fusion.FusionSpec(method, norm or ("minmax" if method == "wsum" else None),
                                 tuple(weights) if weights is not None else None, k=k, depth=depth)
    return fusion.fuse_runs(loaded, spec)


# ------------------------------------------------------------------------------------------------ evaluation
def evaluate(runs: RunLike | Sequence[RunLike] | Mapping[str, RunLike] | None = None,
             data: str | Path | Sequence[str | Path] | None = None, *,
             models: Sequence[str | Path] | Mapping[str, str | Path] | None = None, out: str | Path | None = None,
             qrels: str | Path | Mapping[str, Mapping[str, int]] | None = None, split: str = "test",
             measures: str | Sequence[str] | None = None, test: str | None = "ttest", alpha: float = 0.05,
             correction: str | None = "holm", missing: str = "zero", ignore_identical_ids: bool = False,
             depth: int = 1000, precision: str = "auto", batch_size: int = 64, data_root: str | Path | None = None,
             show_progress: bool = True, baseline: str | None = None,
             pairs: str = "baseline") -> ResultsTable | CollectionsTable:
    """Score runs against the ``split`` qrels of collection ``data`` (or against ``qrels``, a file or a dict):
    one row per run, each other run tested against the baseline — the first run, or the one named ``baseline`` —
    (``test``: ttest | permutation | None; ``correction``: the p-values of the runs tested against the baseline
    adjusted together by Holm, or None). ``pairs="all"`` tests every pair of runs (a listed before b) instead, Holm
    over all the pairs on each measure: ``table.pairwise[(a, b)][measure]``, a pairwise section in the markdown.

    ``runs``: one run (a dict or a TREC file), a list of them, or a dict ``{name: run}``; ``measures``:
    ir_measures names (default: ``pretrieve evaluate``'s). ``print(table.to_markdown())`` shows the table,
    ``table.value(name, "nDCG@10")`` reads one number.

    ``models`` instead of ``runs``: each model (``"bm25"``, a pretrieve checkpoint or exported directory, any
    sentence-transformers model by path, offline alias or hub name; a list, or a dict ``{name: model}``) searches
    every collection of ``data`` (one, a list or a comma-separated string) to ``depth``; returns the BEIR-style
    :class:`~pretrieve.evaluation.CollectionsTable` (a row per collection and the average, a column per model and
    measure; default measures nDCG@10 and R@100). ``out``: where the runs are written (and reused while current),
    with ``results.md`` / ``results.json``; default a temporary directory, nothing kept."""
    from pretrieve.evaluation import DEFAULT_MEASURES, RunEvaluator, build_table   # lazy: scipy
    from pretrieve.evaluation.answers import split_evaluator   # lazy: scipy

    if (runs is None) == (models is None):
        raise ConfigError("give exactly one of runs or models")
    if models is not None:
        return _evaluate_models(models, data, out=out, split=split, measures=measures, test=test, alpha=alpha,
                                correction=correction, missing=missing, ignore_identical_ids=ignore_identical_ids,
                                depth=depth, precision=precision, batch_size=batch_size, data_root=data_root,
                                show_progress=show_progress, qrels=qrels, baseline=baseline, pairs=pairs)
    if (qrels is None) == (data is None):
        raise ConfigError("give exactly one of data (a collection, with split) or qrels")
    if qrels is None:   # qrels measures and answer accuracy (Acc@k) of the collection's split
        if not isinstance(data, (str, Path)):
            raise ConfigError("data: runs are scored on one collection; give a list of collections with models")
        evaluator = split_evaluator(BeirCollection(resolve_collection(data, data_root=data_root)), split, measures,
                                    missing=missing, ignore_identical_ids=ignore_identical_ids)
    else:
        judgments = load_qrels(qrels) if isinstance(qrels, (str, Path)) else qrels
        evaluator = RunEvaluator(judgments, measures or DEFAULT_MEASURES, missing=missing,
                                 ignore_identical_ids=ignore_identical_ids)
    results = {name: evaluator(run, name=name) for name, run in baseline_first(_named_runs(runs), baseline).items()}
    return build_table(results, test=test, alpha=alpha, correction=correction, pairs=pairs)


def baseline_first(named: Mapping[str, Any], baseline: str | None, parameter: str = "baseline") -> dict[str, Any]:
    """``named`` with the entry ``baseline`` first (the one every other is tested against); as is without one."""
    named = dict(named)
    if baseline is None:
        return named
    if baseline not in named:
        raise ConfigError(f"{parameter}: no run or model is named {baseline!r} (names: {', '.join(named)})")
    return {baseline: named[baseline], **{name: value for name, value in named.items() if name != baseline}}


MODEL_MEASURES = "nDCG@10,R@100"
"""The measures of ``evaluate(models=...)`` / ``pretrieve evaluate --model`` unless given (BEIR's)."""


def _evaluate_models(models, data, *, out, split, measures, test, alpha, correction, missing, ignore_identical_ids,
                     depth, precision, batch_size, data_root, show_progress, qrels,
                     baseline=None, pairs="baseline") -> CollectionsTable:
    """``evaluate(models=...)``: every model's run on every collection (:func:`pretrieve.retrieval.runs.model_run`),
    scored and tabulated (:func:`pretrieve.evaluation.collections_table`), written under ``out`` when given."""
    from pretrieve.evaluation import collections_table   # lazy: scipy
    from pretrieve.evaluation.answers import check_measures, split_evaluator   # lazy: scipy
    from pretrieve.evaluation.metrics import mean_of_parts   # lazy: scipy

    if qrels is not None:
        raise ConfigError("qrels: models are scored on the qrels of each collection of data; drop qrels")
    if data is None or (not isinstance(data, (str, Path)) and not list(data)):
        raise ConfigError("data: give the collections to evaluate the models on")
    _positive(depth=depth, batch_size=batch_size)
    named = baseline_first(_named_models(models), baseline)
    entries = [c.strip() for c in data.split(",")] if isinstance(data, str) else \
        [str(c) for c in ([data] if isinstance(data, Path) else data)]
    collections = {}
    for entry in entries:
        directory = resolve_collection(entry, data_root=data_root)
        if directory.name in collections:
            raise ConfigError(f"data: two collections are named '{directory.name}'")
        # a benchmark (CQADupStack's 12 forums) is one row: the mean of its parts' scores
        collections[directory.name] = [BeirCollection(part) for part in benchmark_parts(directory)] or \
            [BeirCollection(directory)]
    resolved = {name: model if model == "bm25" else resolve_model(model) for name, model in named.items()}
    chosen = check_measures(measures or MODEL_MEASURES)   # bad names: said before the search
    results: dict[str, dict[str, Any]] = {name: {} for name in named}
    run_files: dict[str, dict[str, str]] = {name: {} for name in named}
    with contextlib.ExitStack() as stack:
        stack.enter_context(quiet_libraries())
        root = (stack.enter_context(outputs.writing(out)) if out is not None
                else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pretrieve-evaluate-"))))
        if out is not None:   # the ownership rule: its tables are replaced only beside pretrieve's own runs
            outputs.claim([root / "results.json", root / "results.md"], records=outputs.sidecar_records(root),
                          remedy="choose another out, or move the file away")
        for label, parts in collections.items():
            by_part: dict[str, dict[str, Any]] = {name: {} for name in named}
            for collection in parts:
                evaluator = split_evaluator(collection, split, chosen, missing=missing,
                                            ignore_identical_ids=ignore_identical_ids)
                for name, model in resolved.items():
                    path = model_run(model, name, collection, split, depth, root, precision=precision,
                                     batch_size=batch_size, show_progress=show_progress)
                    by_part[name][collection.root.name] = evaluator(read_run(path), name=name)
                    run_files[name][label if len(parts) == 1 else f"{label}/{collection.root.name}"] = \
                        str(path.relative_to(root))
            for name, scored in by_part.items():
                results[name][label] = next(iter(scored.values())) if len(parts) == 1 else mean_of_parts(scored)
        table = collections_table(results, chosen, test=test, alpha=alpha, correction=correction, pairs=pairs)
        if out is not None:
            metadata = {"split": split, "depth": depth, "models": {name: str(model) for name, model in named.items()},
                        "data": {label: str(parts[0].root if len(parts) == 1 else parts[0].root.parent)
                                 for label, parts in collections.items()}, "run_files": run_files,
                        "provenance": provenance()}
            table.write(json_path=root / "results.json", md_path=root / "results.md", metadata=metadata)
    return table


# ---------------------------------------------------------------------------------------------------- export
def export(model: str | Path, out: str | Path, *, recipe_out: str | Path | None = None,
           query_prompt: str | None = None, passage_prompt: str | None = None, license: str = "apache-2.0",
           push_to_hub: str | None = None, private: bool = False, token: str | None = None,
           dry_run: bool = False, metrics: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Export the retriever fine-tuned in ``model`` to ``out``: a sentence-transformers model (``Router`` for
    separate towers and CoT-MoTE experts; pretrieve's own format for sparse / DupMAE) with a ``README.md`` model
    card (docs/export.md). ``recipe_out``: the recipe's output folder, whose resolved recipe and ``results.md`` go
    into the card; ``query_prompt`` / ``passage_prompt`` are saved with the model; ``push_to_hub``: a Hub model
    repository to upload to (``token`` or the logged-in one): the token and the Hub are checked before anything is
    exported, and a failure is one :class:`~pretrieve.errors.ConfigError`. ``dry_run``: export, then print what
    ``push_to_hub`` would upload (files and sizes) without touching the network. ``metrics``: what you measured,
    ``{collection: {measure: value}}`` (``"scifact"`` for its test split, ``"scifact:dev"`` for another), for the
    card's ``model-index`` beside the recipe's results and the dev evaluation while training. Returns ``out``."""
    from pretrieve.modeling.export import (check_hub, export_model, hub_token,   # lazy: torch
                                           push_to_hub as push, upload_plan)
    from pretrieve.modeling.model_card import metrics_of   # lazy: torch

    if dry_run and not push_to_hub:
        raise ConfigError("dry_run shows what push_to_hub would upload: give push_to_hub too")
    if push_to_hub and not dry_run:   # before the work: a push that cannot happen fails at once
        token = hub_token(token)
        logger.info("Hugging Face Hub reachable; pushing as %s", check_hub(token))
    recipe = results = None
    given = metrics
    if recipe_out is not None:
        recipe = load_config_file(Path(recipe_out) / "recipe.resolved.json", "resolved recipe")
        results_md = Path(recipe_out) / "results.md"
        results = results_md.read_text(encoding="utf-8") if results_md.is_file() else None
        results_json = Path(recipe_out) / "results.json"
        if results_json.is_file():   # the final row's metrics: the card's model-index
            metrics = {**metrics_of(load_config_file(results_json, "recipe results").get("rows"), None),
                       **(given or {})}
    with quiet_libraries():
        exported = export_model(model, out, query_prompt=query_prompt, passage_prompt=passage_prompt, recipe=recipe,
                                results=results, license=license, repo_id=push_to_hub, metrics=metrics)
    if push_to_hub and dry_run:
        plan = upload_plan(exported)
        print(f"dry run: would upload {len(plan)} files ({sum(size for _, size in plan) / 1e6:.1f} MB) from "
              f"{exported} to https://huggingface.co/{push_to_hub}" + (" (private)" if private else ""))
        for name, size in plan:
            print(f"  {name}  {size:,} bytes")
    elif push_to_hub:
        push(exported, push_to_hub, private=private, token=token)
    return exported


# ---------------------------------------------------------------------------------------------------- recipes
def run_recipe(recipe: str | Path | Mapping[str, Any], *, out: str | Path | None = None, smoke: bool = False,
               data_root: str | Path | None = None, redo_changed: bool = False,
               show_progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a recipe — a YAML/JSON file or the same as a dict (docs/recipes.md) — and return its results
    (also in ``results.json`` / ``results.md``). A dict is validated first, then kept as ``recipe.yaml`` in the
    run's output directory once it is locked, so that ``pretrieve run OUT/recipe.yaml`` reproduces the run.
    ``smoke``: the recipe made tiny, in ``<out>-smoke`` unless ``out`` is given."""
    from pretrieve.recipe import run_recipe as run   # lazy: torch

    with quiet_libraries():
        return run(recipe, out=out, show_progress=show_progress, redo_changed=redo_changed, data_root=data_root,
                   smoke=smoke)


# ---------------------------------------------------------------------------------------------------- helpers
def load_retriever(name_or_path: str | Path, *args: Any, **kwargs: Any) -> Retriever:
    """:func:`pretrieve.retrieval.load.load_retriever` (same arguments), with transformers' warnings and loading
    bars held back as in every verb; says what it loaded as ``pretrieve dense`` does (pooling, normalisation,
    passage length, the precision ``auto`` chose, device: :func:`told`)."""
    from pretrieve.retrieval.load import load_retriever as load   # lazy: torch

    with quiet_libraries(), told():
        retriever = load(name_or_path, *args, **kwargs)
        logger.info("retriever %s: %s", name_or_path, retriever.describe())
        return retriever


@contextlib.contextmanager
def quiet_libraries():
    """While a verb runs: transformers' log at ERROR (no "checkpoint seem corrupted" notice, no LOAD REPORT
    tables: pretrieve loads checkpoints into other architectures on purpose) and its "Loading weights" bars off, as
    on the command line; both restored afterwards (a verb changes no global state)."""
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is None:
        import transformers.utils.logging as hf_logging   # lazy: transformers
    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def told():
    """While a training verb or ``load_retriever`` runs, pretrieve's own INFO lines — what the command line prints:
    the pooling and similarity kept or changed, the precision trained or encoded at, the groups, the dev
    evaluations — go to stderr as ``pretrieve: …``, unless the caller configured logging (a handler on the root or
    ``pretrieve`` logger: theirs rules). Removed afterwards (a verb changes no global state)."""
    package = logging.getLogger("pretrieve")
    if logging.getLogger().handlers or package.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pretrieve: %(message)s"))
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


def _check_settings(config_class: type, settings: Mapping[str, Any], where: str) -> None:
    """Unknown or ill-typed training settings refused before anything is resolved or downloaded."""
    from pretrieve.train.run_config import validated_values   # lazy: torch

    validated_values(config_class, {k: v for k, v in settings.items() if v is not None}, {}, where)


def _require(**values: Any) -> None:
    missing = [name for name, value in values.items() if value is None or str(value) == ""]
    if missing:
        raise ConfigError(f"missing required argument(s): {', '.join(missing)}")


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")


def _retriever(retriever: Retriever | str | Path) -> Retriever:
    """A loaded retriever as is; a model name or path loaded with the defaults of ``load_retriever``."""
    return load_retriever(retriever) if isinstance(retriever, (str, Path)) else retriever


def _run(run: RunLike, parameter: str) -> Run:
    if isinstance(run, (str, Path)):
        return read_run(run)
    if not isinstance(run, Mapping):
        raise ConfigError(f"{parameter}: expected a run ({{query_id: {{doc_id: score}}}}) or a run file, "
                          f"got {type(run).__name__}")
    return {str(qid): dict(docs) for qid, docs in run.items()}


def _named_runs(runs: RunLike | Sequence[RunLike] | Mapping[str, RunLike]) -> dict[str, Run]:
    """``{name: run}``: a file is named by its stem, a run in memory ``run1``, ``run2``, … by its place; a dict of
    runs keeps its names."""
    if isinstance(runs, Mapping) and runs and all(isinstance(v, (str, Path)) or _is_run(v) for v in runs.values()):
        return {str(name): _run(run, "runs") for name, run in runs.items()}
    items = [runs] if isinstance(runs, (str, Path, Mapping)) else list(runs)
    if not items:
        raise ConfigError("runs: no run to evaluate")
    named: dict[str, Run] = {}
    for index, run in enumerate(items, start=1):
        name = Path(str(run).removesuffix(".gz")).stem if isinstance(run, (str, Path)) else f"run{index}"
        if name in named:
            raise ConfigError(f"runs: two runs are named '{name}'; pass a dict {{name: run}}")
        named[name] = _run(run, "runs")
    return named


def _named_models(models: Sequence[str | Path] | Mapping[str, str | Path]) -> dict[str, str]:
    """``{name: model}``: a dict keeps its names; in a list ``bm25`` is ``bm25`` and a model is named by its last path
    part (``minilm``, ``checkpoints/scifact`` → ``scifact``)."""
    if isinstance(models, (str, Path)):
        models = [models]
    if isinstance(models, Mapping):
        named = {str(name): str(model) for name, model in models.items()}
    else:
        named = {}
        for model in models:
            name = Path(str(model).rstrip("/")).name or str(model)
            if name in named:
                raise ConfigError(f"models: two models are named '{name}'; pass a dict {{name: model}}")
            named[name] = str(model)
    if not named:
        raise ConfigError("models: no model to evaluate")
    for name in named:
        if not name or any(c in name for c in "/\\") or name.startswith("."):
            raise ConfigError(f"models: {name!r} cannot name run files; pass a dict {{name: model}}")
    return named


def _is_run(value: Any) -> bool:
    """Whether ``value`` is a run (``{query_id: {doc_id: score}}``), not one query's ranking."""
    return isinstance(value, Mapping) and all(isinstance(docs, Mapping) for docs in value.values())
