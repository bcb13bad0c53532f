"""The ``evaluate`` stage: one row per retriever and collection (``runs/<retriever>__<collection>.trec``), BM25 and
the zero-shot model as baselines, a re-ranked row, one row per fusion, and paired t-tests of the ``final`` row.

Collections default to the recipe's ``data``; ``"msmarco:dev"`` picks a split. ``retrievers`` limits the rows of
fine-tuned retrievers to those named (default: every one; a fusion or ``rerank`` still searches what it needs).
``measures`` names the measures (``ir_measures`` names; default nDCG@10, MRR@10, R@100): a list for every
collection, or a mapping from a collection (as ``collections`` names it) to its list — ``{"msmarco:dev": [MRR@10,
R@50, R@1000], "msmarco:test": [nDCG@10, "R(rel=2)@1000"]}``; ``(rel=2)`` counts grade ≥ 2 as relevant, as
``trec_eval -l 2`` (TREC DL's recall). The recipe's ``expected`` numbers (the paper's) are attached to their rows
(``paper``). Retrievers fine-tuned with the sparse/hybrid representation get one row per search mode with ``modes``
(``finetune-s1-sparse``, …). With ``final`` and ``compare``, the final row is tested (nDCG@10 per query, paired
two-sided t-tests) against each named row, and ``results.md`` closes with which row to use. ``ignore_identical_ids``
names the collections whose runs are scored as BEIR scores them: a query's own document (the same id) is dropped
from its ranking (:func:`pretrieve.evaluation.metrics.drop_identical_ids`); ``true`` applies it to every collection
of the stage, as BEIR's ``EvaluateRetrieval.evaluate`` does by default (``ignore_identical_ids=True``) for every
dataset — the protocol of the papers' BEIR tables. Keep it off for collections whose query and document ids are
unrelated numbers (MS MARCO, Cranfield): there it would drop documents that merely share a number.
``zero_shot_encoding`` (``{title_join, query_max_len, passage_max_len}``) encodes the zero-shot row's checkpoint as
its authors fine-tuned it when it carries no pretrieve training record — a released retriever scored beside its
published number (``configs/released-cotmae.yaml``, docs/evaluation.md "Released retrievers").

A collection that a ``select`` stage before this one holds a guard half of (its ``guard``) is evaluated on the other
half of its test queries only (``<out>/guard-split/<name>``'s ``test``): guard queries are never evaluated. Each
``final`` row says whether its collection is the training collection or one derived from it (``in_domain``), so
that ``results.md`` can say which row to use there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pretrieve import outputs
from pretrieve.data import BeirCollection, read_run
from pretrieve.data.registry import resolve_collection
from pretrieve.errors import ConfigError
from pretrieve.evaluation import compare, evaluate
from pretrieve.evaluation.answers import check_measures, split_evaluator
from pretrieve.options import join_path
from pretrieve.recipe.results import RESULT_MEASURES, result_row
from pretrieve.recipe.rows import bm25_run, fusion_rows, origin, retriever_run, stage_rows
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import split_collection, stage, stage_labels
from pretrieve.retrieval.index import SEARCH_MODES
from pretrieve.retrieval.load import retriever_kind
from pretrieve.retrieval.rerank import rerank_run_file
from pretrieve.retrieval.runs import run_tag


@dataclass
class EvaluateOptions:
    """Options of the ``evaluate`` stage."""

    collections: list[str] | None = None     # default: the recipe's data; "name:split" picks a split
    split: str = "test"
    depth: int = 1000
    bm25: bool = False
    zero_shot: bool = False
    retrievers: list[str] | None = None   # the fine-tuned retrievers that get rows (default: every one)
    rerank_depth: int | None = None
    rerank: str | None = None
    modes: list[str] | str | None = None
    precision: str = "auto"       # of the encoders: auto, fp32, bf16, fp16, int8
    batch_size: int = 64          # texts per forward pass when encoding
    final: str | None = None      # the row to use: paired t-tests against 'compare' and a closing paragraph
    compare: list[str] = field(default_factory=list)
    measures: list[str] | dict[str, list[str]] | None = None   # default RESULT_MEASURES; a mapping: per collection
    ignore_identical_ids: bool | list[str] = field(default_factory=list)   # collections (true: all) without own id
    # the zero-shot row as a released retriever: {passage_max_len, query_max_len, title_join} it was fine-tuned with
    zero_shot_encoding: dict[str, Any] = field(default_factory=dict)


#: ``zero_shot_encoding`` keys → the ``load_retriever`` arguments (:data:`pretrieve.recipe.rows.RELEASED_ENCODING`).
ZERO_SHOT_ENCODING = {"passage_max_len": "max_length", "query_max_len": "query_max_length", "title_join": "title_join"}


def check_evaluate(options: dict[str, Any], where: str) -> None:
    search_modes(options.get("modes"))
    released = options.get("zero_shot_encoding") or {}
    for key, value in released.items():
        if key not in ZERO_SHOT_ENCODING:
            raise ConfigError(f"zero_shot_encoding.{key}: unknown key (known: {', '.join(ZERO_SHOT_ENCODING)})")
        if key == "title_join" and value not in ("space", "sep"):
            raise ConfigError(f"zero_shot_encoding.title_join: 'space' or 'sep', got {value!r}")
        if key != "title_join" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"zero_shot_encoding.{key}: a positive number of tokens, got {value!r}")
    if released and not options.get("zero_shot"):
        raise ConfigError("zero_shot_encoding encodes the zero-shot row: set zero_shot: true")
    if int(options.get("depth", 1000)) < 1 or (options.get("rerank_depth") is not None and options["rerank_depth"] < 1):
        raise ConfigError("depth and rerank_depth must be >= 1")
    measures = options.get("measures")
    lists = {"": measures} if isinstance(measures, list) else measures or {}
    for key, names in lists.items():
        at = f"measures.{key}" if key else "measures"
        try:
            check_measures(names)   # ir_measures names, or answer accuracy Acc@k (collections judged by answers)
        except ConfigError as exc:
            raise ConfigError(f"{at}: {exc}") from None
        if options.get("final") is not None and RESULT_MEASURES[0] not in names:
            raise ConfigError(f"{at}: 'final' is tested on {RESULT_MEASURES[0]} per query; add it to the measures")


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    retrievers = given.get("retriever", [])
    if not retrievers and not options.get("zero_shot"):
        raise ConfigError(f"{where}: no retriever to evaluate (add 'finetune' stages or zero_shot: true)")
    for index, name in enumerate(options.get("retrievers") or []):
        if name not in retrievers:
            raise ConfigError(f"{where}.retrievers[{index}]: no fine-tuned retriever named {name!r} before this "
                              f"stage (known: {', '.join(retrievers) or 'none'})")
    requested = options.get("rerank")
    if requested is not None and requested not in retrievers:
        raise ConfigError(f"{where}.rerank: no retriever named {requested!r} before this stage "
                          f"(known: {', '.join(retrievers) or 'none'})")
    entries = stage_collections(options, recipe)
    per_collection = options.get("measures")
    if isinstance(per_collection, Mapping):
        for key in per_collection:
            if not any(same_collection(key, entry, options) for entry in entries):
                raise ConfigError(f"{where}.measures.{key}: not a collection this stage evaluates "
                                  f"({', '.join(entries)})")
    ignored = options.get("ignore_identical_ids")
    for index, key in enumerate(ignored if isinstance(ignored, list) else []):   # true / false: every / none
        if not any(same_collection(key, entry, options) for entry in entries):
            raise ConfigError(f"{where}.ignore_identical_ids[{index}]: {key!r} is not a collection this stage "
                              f"evaluates ({', '.join(entries)})")
    check_expected(options, recipe, given, where)


def stage_collections(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[str]:
    """The collections an evaluate stage evaluates, as it names them (default: the recipe's data)."""
    return [str(entry) for entry in options.get("collections") or [recipe["data"]]]


def same_collection(a: str, b: str, options: Mapping[str, Any]) -> bool:
    """Whether two collection names of an evaluate stage are the same collection and split: ``msmarco`` is
    ``msmarco:test`` under the default ``split``, and a path is its directory's name (as results rows name it;
    ``--smoke`` evaluates ``<out>/smoke-data/msmarco:dev`` for ``msmarco:dev``)."""
    split = options.get("split", "test")
    (name_a, split_a), (name_b, split_b) = split_collection(a), split_collection(b)
    return (Path(name_a).name, split_a or split) == (Path(name_b).name, split_b or split)


def collection_measures(options: Mapping[str, Any], entry: str) -> list[str]:
    """The measures the stage scores the collection ``entry`` with (its ``measures``; default RESULT_MEASURES)."""
    measures = options.get("measures")
    if isinstance(measures, Mapping):
        measures = next((names for key, names in measures.items() if same_collection(key, entry, options)), None)
    return list(measures or RESULT_MEASURES)


def check_expected(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]],
                   where: str) -> None:
    """The recipe's ``expected`` numbers for this stage's collections name measures it computes there and rows it
    makes (a fine-tuned retriever before it, ``bm25``, ``zero-shot`` or a fusion, with a search mode or
    ``+rerank@K`` after it); an entry no evaluate stage of the recipe evaluates is refused too."""
    root, _, stage_at = where.rpartition("stages[")
    root, stage_at = root.rstrip(": ."), f"stages[{stage_at}"
    evaluates = [opts for kind, _, opts in stage_labels(recipe) if kind == "evaluate"]
    known = ["bm25", "zero-shot", *given.get("retriever", []), *stage_rows(recipe)]
    for index, entry in enumerate(recipe.get("expected") or []):
        at = join_path(join_path(root, "expected"), index)
        collection = entry["collection"]
        if not any(same_collection(collection, c, opts) for opts in evaluates for c in stage_collections(opts, recipe)):
            raise ConfigError(f"{at}.collection: no evaluate stage evaluates {collection!r}")
        here = [c for c in stage_collections(options, recipe) if same_collection(collection, c, options)]
        if not here:
            continue
        measures = collection_measures(options, here[0])
        for measure in entry["values"]:
            if measure not in measures:
                raise ConfigError(f"{at}.values.{measure}: not measured on {collection} by {stage_at} "
                                  f"(measures: {', '.join(measures)})")
        row = entry.get("row") or default_expected_row(given)
        base = re.sub(r"\+rerank@\d+$", "", str(row))
        base = re.sub(rf"-({'|'.join(SEARCH_MODES)})$", "", base)
        if base not in known:
            raise ConfigError(f"{at}.row: no row {row!r} in {stage_at} (rows: {', '.join(known)}, with a search "
                              "mode or +rerank@K after a retriever)")


def default_expected_row(given: Mapping[str, list[str]]) -> str:
    """The row a paper's numbers belong to unless ``row`` says: the last fine-tuned retriever."""
    retrievers = given.get("retriever", [])
    return retrievers[-1] if retrievers else "zero-shot"


def reads(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """Each evaluated collection with its split (``"msmarco:dev"``: dev; else the stage's ``split``)."""
    default = options.get("split", "test")
    return [(name, split or default) for name, split in map(split_collection, stage_collections(options, recipe))]


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: depth ≤ 20, re-ranking depth ≤ 10, the first ``kit.max_collections`` collections, each a slice
    or fixture standing for it (:class:`pretrieve.recipe.smoke.SmokeKit`)."""
    options["depth"] = min(int(options.get("depth", 1000)), 20)
    released = options.get("zero_shot_encoding") or {}
    for key, cap in (("query_max_len", 16), ("passage_max_len", 48)):   # as the fine-tuning stages' smoke caps
        if key in released:
            released[key] = min(int(released[key]), cap)
    if options.get("rerank_depth"):
        options["rerank_depth"] = min(int(options["rerank_depth"]), 10)
    entries = options.get("collections", [kit.recipe["data"]])[:kit.max_collections]
    options["collections"] = [kit.collection(entry) for entry in entries]
    return options


@stage("evaluate", EvaluateOptions, check=check_evaluate, needs=needs, smoke=smoke, reads=reads,
       name_options=("final", "compare", "retrievers", "rerank"))
def stage_evaluate(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> list[dict]:
    check_final_options(state, options)
    default_split = options.get("split", "test")
    depth = int(options.get("depth", 1000))
    modes = search_modes(options.get("modes"))
    encoding = {key: options[key] for key in ("precision", "batch_size") if key in options}
    released = {ZERO_SHOT_ENCODING[key]: value for key, value in (options.get("zero_shot_encoding") or {}).items()}
    entries = stage_collections(options, state.recipe)
    retrievers = {name: path for name, path in state.named("retriever").items()
                  if options.get("retrievers") is None or name in options["retrievers"]}
    if options.get("zero_shot", False):
        retrievers = {"zero-shot": state.base_model, **retrievers}
    rows = []
    runs_dir = state.out / "runs"
    outputs.remove_leftovers(runs_dir, depth=0)
    for entry in entries:
        collection_path, split = collection_and_split(entry, default_split, state)
        collection = BeirCollection(collection_path)
        qrels = collection.load_qrels(split)
        tag = run_tag(collection_path, split)
        measures = collection_measures(options, entry)
        ignore = ignores_identical_ids(options, entry)
        score = split_evaluator(collection, split, measures, ignore_identical_ids=ignore)   # qrels and/or Acc@k
        here = []
        if options.get("bm25", False):
            run_path = bm25_run(state, collection, split, depth)
            here.append(result_row("bm25", tag, run_path, score(read_run(run_path))))
        for name, model_dir in retrievers.items():
            for row_label, mode in labelled_modes(name, model_dir, modes):
                run_path = retriever_run(state, name, model_dir, collection, split, depth, row_label, mode,
                                         show_progress, {**encoding, **released} if name == "zero-shot" else encoding)
                here.append(result_row(row_label, tag, run_path, score(read_run(run_path))))
        rerank_depth = options.get("rerank_depth")
        if rerank_depth and state.latest("reranker") is not None and state.named("retriever"):
            name = reranked_retriever(state, options.get("rerank"))
            retriever_run(state, name, state.named("retriever")[name], collection, split, depth, name, None,
                          show_progress, encoding)
            here.append(rerank_row(state, name, collection_path, split, int(rerank_depth), qrels, show_progress,
                                   measures, ignore))
        here.extend(fusion_rows(state, collection, split, depth, qrels, show_progress, measures,
                                ignore_identical_ids=ignore))
        attach_expected(here, state, options, entry)
        rows.extend(here)
        mark_final(rows, options, tag, qrels, ignore)
        for row in here:
            if row.get("final"):
                row["in_domain"] = origin(collection_path) == origin(state.data)
    return rows


def ignores_identical_ids(options: Mapping[str, Any], entry: str) -> bool:
    """Whether the collection ``entry`` is scored without each query's own id (``ignore_identical_ids``: a list of
    collections, or ``true`` for every collection of the stage)."""
    ignored = options.get("ignore_identical_ids") or []
    if isinstance(ignored, bool):
        return ignored
    return any(same_collection(key, entry, options) for key in ignored)


def attach_expected(rows: list[dict], state: RunState, options: Mapping[str, Any], entry: str) -> None:
    """The recipe's ``expected`` numbers for the collection ``entry`` go on their row as ``paper`` (the table they
    come from and the values)."""
    for expected in state.recipe.get("expected") or []:
        if not same_collection(expected["collection"], entry, options):
            continue
        name = expected.get("row") or default_expected_row({"retriever": list(state.named("retriever"))})
        for row in rows:
            if row["retriever"] == name:
                row["paper"] = {"table": expected["table"], "values": dict(expected["values"]),
                                **({"tolerance": expected["tolerance"]} if expected.get("tolerance") is not None
                                   else {})}


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
    """``"scifact"`` → (path, default split); ``"msmarco:dev"`` → (path, "dev"); a collection a ``select`` stage
    guards → its guard split's collection (whose ``test`` is the half that is not guard)."""
    name, split = split_collection(str(entry))
    split = split or default_split
    guarded = state.named("guard").get(name)
    if guarded is not None and split == "test":
        return Path(guarded), split
    path = state.collections.get(name) or resolve_collection(name, recipe=state.recipe)
    return path, split


def reranked_retriever(state: RunState, requested: str | None) -> str:
    """The evaluate stage's ``rerank`` option: which retriever's run the reranker re-orders (default: the
    latest, e.g. ``finetune-s3``; ``finetune-s2`` re-ranks the run the teacher scores were computed on)."""
    retrievers = state.named("retriever")
    if requested is None:
        return list(retrievers)[-1]
    if requested not in retrievers:
        raise ConfigError(f"evaluate: rerank: no retriever named {requested!r} (known: {', '.join(retrievers)})")
    return requested


def rerank_row(state: RunState, name: str, collection_path: Path, split: str, depth: int, qrels,
               show_progress: bool, measures=RESULT_MEASURES, ignore_identical_ids: bool = False) -> dict:
    """``runs/<name>+rerank@<depth>__<collection>.trec``: the reranker's order of the retriever's top ``depth``."""
    source = state.run_path(name, collection_path, split)
    label = f"{name}+rerank@{depth}"
    out = state.run_path(label, collection_path, split)
    rerank_run_file(state.latest("reranker"), collection_path, split, source, out, depth=depth,
                    show_progress=show_progress)
    return result_row(label, run_tag(collection_path, split), out,
                      evaluate(qrels, read_run(out), measures, ignore_identical_ids=ignore_identical_ids))


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
        + [name for name in state.named("retriever")
           if options.get("retrievers") is None or name in options["retrievers"]] + list(state.named("fusion"))
    for name in [final, *compared]:
        if name not in known and "+rerank@" not in str(name):
            raise ConfigError(f"evaluate: no row named {name!r} (rows: {', '.join(known)})")


def mark_final(rows: list[dict], options: Mapping[str, Any], collection: str, qrels,
               ignore_identical_ids: bool = False) -> None:
    """Paired two-sided t-tests (nDCG@10, per query) of the ``final`` row against each ``compare`` row of this
    collection, stored in the final row as ``vs``."""
    final = options.get("final")
    if final is None:
        return
    here = {row["retriever"]: row for row in rows if row["collection"] == collection}
    if final not in here:
        raise ConfigError(f"evaluate: final row {final!r} was not evaluated on {collection}")
    measure = RESULT_MEASURES[0]
    result = evaluate(qrels, read_run(here[final]["run"]), [measure], ignore_identical_ids=ignore_identical_ids)
    here[final]["final"] = True
    here[final]["vs"] = {}
    for name in options.get("compare", []):
        if name not in here:
            raise ConfigError(f"evaluate: comparison row {name!r} was not evaluated on {collection}")
        baseline = evaluate(qrels, read_run(here[name]["run"]), [measure], ignore_identical_ids=ignore_identical_ids)
        here[final]["vs"][name] = {"measure": measure, **compare(baseline, result, measure, test="ttest").to_dict()}
