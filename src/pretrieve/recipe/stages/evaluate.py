"""The ``evaluate`` stage: one row per retriever and collection (``runs/<retriever>__<collection>.trec``), BM25 and
the zero-shot model as baselines, a re-ranked row, one row per fusion, and paired t-tests of the ``final`` row.

Collections default to the recipe's ``data``; ``"msmarco:dev"`` picks a split. Retrievers fine-tuned with the
sparse/hybrid representation get one row per search mode with ``modes`` (``finetune-s1-sparse``, …). With ``final``
and ``compare``, the final row is tested (nDCG@10 per query, paired two-sided t-tests) against each named row, and
``results.md`` closes with which row to use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pretrieve import outputs
from pretrieve.data import BeirCollection, read_run
from pretrieve.data.registry import resolve_collection_path
from pretrieve.errors import ConfigError
from pretrieve.evaluation import compare, evaluate
from pretrieve.recipe.results import RESULT_MEASURES, result_row
from pretrieve.recipe.runner import RunState, bm25_run, retriever_run, run_tag
from pretrieve.recipe.schema import split_collection, stage
from pretrieve.recipe.stages.fuse import fusion_rows
from pretrieve.retrieval.index import SEARCH_MODES
from pretrieve.retrieval.load import retriever_kind
from pretrieve.retrieval.rerank import rerank_run_file


@dataclass
class EvaluateOptions:
    """Options of the ``evaluate`` stage."""

    collections: list[str] | None = None     # default: the recipe's data; "name:split" picks a split
    split: str = "test"
    depth: int = 1000
    bm25: bool = False
    zero_shot: bool = False
    rerank_depth: int | None = None
    rerank: str | None = None
    modes: list[str] | str | None = None
    precision: str = "auto"       # of the encoders: auto, fp32, bf16, fp16, int8
    batch_size: int = 64          # texts per forward pass when encoding
    final: str | None = None      # the row to use: paired t-tests against 'compare' and a closing paragraph
    compare: list[str] = field(default_factory=list)


def check_evaluate(options: dict[str, Any], where: str) -> None:
    search_modes(options.get("modes"))
    if int(options.get("depth", 1000)) < 1 or (options.get("rerank_depth") is not None and options["rerank_depth"] < 1):
        raise ConfigError("depth and rerank_depth must be >= 1")


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    retrievers = given.get("retriever", [])
    if not retrievers and not options.get("zero_shot"):
        raise ConfigError(f"{where}: no retriever to evaluate (add 'finetune' stages or zero_shot: true)")
    requested = options.get("rerank")
    if requested is not None and requested not in retrievers:
        raise ConfigError(f"{where}.rerank: no retriever named {requested!r} before this stage "
                          f"(known: {', '.join(retrievers) or 'none'})")


@stage("evaluate", EvaluateOptions, check=check_evaluate, needs=needs)
def stage_evaluate(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> list[dict]:
    check_final_options(state, options)
    default_split = options.get("split", "test")
    depth = int(options.get("depth", 1000))
    modes = search_modes(options.get("modes"))
    encoding = {key: options[key] for key in ("precision", "batch_size") if key in options}
    collections = [collection_and_split(c, default_split, state)
                   for c in options.get("collections") or [state.recipe["data"]]]
    retrievers = dict(state.retrievers)
    if options.get("zero_shot", False):
        retrievers = {"zero-shot": state.base_model, **retrievers}
    rows = []
    runs_dir = state.out / "runs"
    outputs.remove_leftovers(runs_dir, depth=0)
    for collection_path, split in collections:
        collection = BeirCollection(collection_path)
        qrels = collection.load_qrels(split)
        tag = run_tag(collection_path, split)
        if options.get("bm25", False):
            run_path = bm25_run(state, collection, split, depth)
            rows.append(result_row("bm25", tag, run_path, evaluate(qrels, read_run(run_path), RESULT_MEASURES)))
        for name, model_dir in retrievers.items():
            for row_label, mode in labelled_modes(name, model_dir, modes):
                run_path = retriever_run(state, name, model_dir, collection, split, depth, row_label, mode,
                                         show_progress, encoding)
                rows.append(result_row(row_label, tag, run_path, evaluate(qrels, read_run(run_path), RESULT_MEASURES)))
        rerank_depth = options.get("rerank_depth")
        if rerank_depth and state.reranker is not None and state.retrievers:
            name = reranked_retriever(state, options.get("rerank"))
            retriever_run(state, name, state.retrievers[name], collection, split, depth, name, None, show_progress,
                          encoding)
            rows.append(rerank_row(state, name, collection_path, split, int(rerank_depth), qrels, show_progress))
        rows.extend(fusion_rows(state, collection, split, depth, qrels, show_progress))
        mark_final(rows, options, tag, qrels)
    return rows


def search_modes(value: Any) -> list[str] | None:
    """The evaluate stage's ``modes`` option: None, or a list of sparse/hybrid search modes."""
    if value is None:
        return None
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or any(mode not in SEARCH_MODES for mode in values):
        raise ConfigError(f"evaluate: 'modes' must be a non-empty list of {', '.join(SEARCH_MODES)}, got {value!r}")
    return list(dict.fromkeys(values))


def labelled_modes(name: str, model_dir: str, modes: list[str] | None) -> list[tuple[str, str | None]]:
    """``[(row label, search mode)]``: one row per mode (``finetune-s1-sparse``) for a model fine-tuned with the
    sparse/hybrid representation when ``modes`` is given, else one row searched as trained."""
    if modes and retriever_kind(model_dir) in ("sparse", "hybrid"):
        return [(f"{name}-{mode}", mode) for mode in modes]
    return [(name, None)]


def collection_and_split(entry: str, default_split: str, state: RunState) -> tuple[Path, str]:
    """``"scifact"`` → (path, default split); ``"msmarco:dev"`` → (path, "dev")."""
    name, split = split_collection(str(entry))
    path = state.collections.get(name) or resolve_collection_path(name, state.recipe)
    return path, split or default_split


def reranked_retriever(state: RunState, requested: str | None) -> str:
    """The evaluate stage's ``rerank`` option: which retriever's run the reranker re-orders (default: the
    latest, e.g. ``finetune-s3``; ``finetune-s2`` re-ranks the run the teacher scores were computed on)."""
    if requested is None:
        return list(state.retrievers)[-1]
    if requested not in state.retrievers:
        raise ConfigError(f"evaluate: rerank: no retriever named {requested!r} "
                          f"(known: {', '.join(state.retrievers)})")
    return requested


def rerank_row(state: RunState, name: str, collection_path: Path, split: str, depth: int, qrels,
               show_progress: bool) -> dict:
    """``runs/<name>+rerank@<depth>__<collection>.trec``: the reranker's order of the retriever's top ``depth``."""
    source = state.run_path(name, collection_path, split)
    label = f"{name}+rerank@{depth}"
    out = state.run_path(label, collection_path, split)
    rerank_run_file(state.reranker, collection_path, split, source, out, depth=depth, show_progress=show_progress)
    return result_row(label, run_tag(collection_path, split), out, evaluate(qrels, read_run(out), RESULT_MEASURES))


def check_final_options(state: RunState, options: Mapping[str, Any]) -> None:
    """The evaluate stage's ``final`` (the row to use) and ``compare`` (rows it is tested against) name rows."""
    final, compared = options.get("final"), options.get("compare", [])
    if final is None:
        if compared:
            raise ConfigError("evaluate: 'compare' needs 'final' (the row the comparisons are made for)")
        return
    if not isinstance(compared, list):
        raise ConfigError(f"evaluate: 'compare' must be a list of row names, got {compared!r}")
    known = (["bm25"] if options.get("bm25") else []) + (["zero-shot"] if options.get("zero_shot") else []) \
        + list(state.retrievers) + list(state.fusions)
    for name in [final, *compared]:
        if name not in known and "+rerank@" not in str(name):
            raise ConfigError(f"evaluate: no row named {name!r} (rows: {', '.join(known)})")


def mark_final(rows: list[dict], options: Mapping[str, Any], collection: str, qrels) -> None:
    """Paired two-sided t-tests (nDCG@10, per query) of the ``final`` row against each ``compare`` row of this
    collection, stored in the final row as ``vs``."""
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
