"""Run files: the one place where queries are searched into TREC run files (every retriever, every lexical engine,
the recipe, ``pretrieve evaluate --model``, the CLI's ``bm25`` / ``search`` / ``dense``), with freshness and the
split across ranks, and the one rule naming a collection's run (:func:`run_tag`).

* :func:`run_tag` / :func:`run_path` — how runs and result rows name a collection's split (``name``, or
  ``name:split`` for a split other than the zero-shot one) and where a run of it lies (``runs/<label>__<tag>.trec``).
* :func:`retriever_run` — the run file of a retriever (any kind: dense, sparse, hybrid, DupMAE) on a collection's
  split, ``(model, collection, split, depth, out)``: searched now unless current, i.e. made by these weights (by
  content) from this corpus, queries and split, to this depth, in this search mode and precision, and intact;
  :func:`retriever_runs`: several splits of a collection, the retriever loaded and the corpus encoded once (the
  unsupervised [CLS] probe, :mod:`pretrieve.analysis.probe`, searches through it).
* :func:`lexical_run_file` — a lexical engine's run file (BM25, or any engine of
  :data:`pretrieve.retrieval.index.LEXICAL_BACKENDS`: one memory-mapped index per collection, queries split by
  rank, rankings written as they come); :func:`bm25_run` / :func:`lexical_run`: the same, searched now unless
  current. :func:`bm25_negatives` — stage-1 training groups (and optionally the run) from a lexical engine's
  rankings, written the same way.
* :func:`search_run` — a run searched in one process and written (the CLI's ``search`` and ``dense``).
* :func:`write_run_file` / :func:`run_part` — the two ways every run file is written, here and by the modules that
  make runs of their own (re-ranked: :mod:`pretrieve.retrieval.rerank`; mined: :mod:`pretrieve.retrieval.mining`;
  fused: :mod:`pretrieve.retrieval.fusion`): a run held in memory written atomically (recorded as an artefact when
  given its settings), or a run streamed query by query into a rank's part file (:func:`pretrieve.ranks.split_files`
  makes the file atomic and records it). The line format is :mod:`pretrieve.data.trec`'s; no other module writes
  run lines (``tests/test_run_writers.py``).
* :func:`search_split` — what both the retriever's run files and mined groups
  (:func:`pretrieve.retrieval.mining.mine_negatives`) are written through: load the retriever, encode the corpus
  (:func:`searched_index`) into an index directory (once; a directory every rank shares is built by all of them, each
  a slice, and merged), then each rank searches its slice of the queries (by whole search blocks, so each block is
  computed exactly as in one process) into part files that rank 0 merges into the very files one process writes
  (:func:`pretrieve.ranks.split_files`).
* :func:`is_current` — whether an output is current, rank 0's answer on every rank: the freshness check of every
  searched run (the retriever's, a lexical engine's, the probe's, the mined and re-ranked ones).
* :func:`model_run` — the run file of BM25 or any retriever under an evaluation directory (``pretrieve evaluate
  --model``): ``runs/<name>__<collection>[:split].trec``, its index kept beside it.

The lexical paths are torch-free (``pretrieve bm25`` imports this module): the retriever's loading and search
stack is imported inside the functions that use it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

from pretrieve import artifacts, ranks
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import GroupStats, group_from_ranking
from pretrieve.data.trec import Run, RunWriter, write_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.outputs import write_failures
from pretrieve.retrieval.index import lexical_backend

if TYPE_CHECKING:
    from pretrieve.retrieval.load import Retriever

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``(path, kind, settings, inputs)`` of an output file (as :func:`pretrieve.artifacts.write_file` takes them).
Output = tuple[Path, str, Mapping[str, Any], Mapping[str, Any]]


def run_tag(collection: str | Path, split: str, zero_shot: str = "test") -> str:
    """How runs and result rows name a collection (a name, or its directory): its name for the ``zero_shot`` split,
    ``name:split`` for another (MS MARCO dev and TREC DL 2019 are two splits of one collection)."""
    name = Path(collection).name if isinstance(collection, Path) else collection
    return name if split == zero_shot else f"{name}:{split}"


def run_path(root: str | Path, label: str, collection: str | Path, split: str, zero_shot: str = "test") -> Path:
    """``root/runs/<label>__<run tag>.trec``: where the run of ``label`` on a collection's split lies."""
    return Path(root) / "runs" / f"{label}__{run_tag(collection, split, zero_shot)}.trec"


def write_run_file(run: Run, out: str | Path, *, tag: str, depth: int | None = None,
                   settings: Mapping[str, Any] | None = None, inputs: Mapping[str, str | Path] | None = None) -> Path:
    """Write ``run`` (``{qid: {doc_id: score}}``) to ``out``: TREC lines (:func:`pretrieve.data.trec.write_run`: by
    descending score, at most ``depth`` per query, run tag ``tag``), atomically; with ``settings``, recorded as a
    ``run`` artefact made from ``inputs`` (:func:`pretrieve.artifacts.write_file`). Returns ``out``."""
    if settings is None:
        write_run(run, out, tag=tag, depth=depth)
    else:
        with artifacts.write_file(out, kind="run", settings=settings, inputs=inputs) as tmp:
            write_run(run, tmp, tag=tag, depth=depth)
    return Path(out)


@contextlib.contextmanager
def run_part(path: str | Path, out: str | Path, *, tag: str, depth: int | None = None) -> Iterator[RunWriter]:
    """A :class:`pretrieve.data.trec.RunWriter` that streams a run query by query into ``path``, a plain part file
    (:func:`pretrieve.ranks.split_files` merges the parts into ``out`` atomically and records it); errors name
    ``out``."""
    with open(path, "w", encoding="utf-8") as handle:
        yield RunWriter(handle, out, tag=tag, depth=depth)


def is_current(path: str | Path, settings: Mapping[str, Any], inputs: Mapping[str, str | Path],
               kind: str | None = None) -> bool:
    """Whether ``path`` is intact and was made with ``settings`` from ``inputs`` — rank 0's answer, on every rank."""
    status = artifacts.check(path, settings, inputs, kind=kind)
    if status.exists and not status.current:
        logger.info("searching again: %s", status.reason)
    return ranks.broadcast(status.current, f"check {Path(path).name}")


def search_split(model: str | Path, collection: BeirCollection,
                 index_dir: str | Path | Callable[[Retriever], Path] | None,
                 outputs: Sequence[Output], count: int,
                 write_part: Callable[[Retriever, Path, int, int, list[Path]], T], what: str, *, depth: int,
                 query_block: int | None = None, show_progress: bool = True,
                 check: Callable[[list[T]], None] | None = None, **loading: Any) -> list[T]:
    """Load the retriever ``model`` and index the collection's corpus (:func:`searched_index`, with ``loading``),
    then write ``outputs`` from ``count`` query items split by rank: each rank calls
    ``write_part(retriever, index, a, b, paths)`` for its slice ``[a, b)`` of whole blocks of ``query_block`` queries
    (default: the search's own block for ``depth``). Returns every rank's ``write_part`` result (``check`` may
    refuse them before anything is written)."""
    scratch = Path(outputs[0][0]).parent if outputs else None
    with searched_index(model, collection, index_dir, what, scratch=scratch, show_progress=show_progress,
                        **loading) as (retriever, index):
        return _split_search(retriever, index, outputs, count, write_part, what, depth=depth,
                             query_block=query_block, check=check)


def _split_search(retriever: Retriever, index: Path, outputs: Sequence[Output], count: int,
                  write_part: Callable[[Retriever, Path, int, int, list[Path]], T], what: str, *, depth: int,
                  query_block: int | None = None, check: Callable[[list[T]], None] | None = None) -> list[T]:
    """``outputs`` written from ``count`` query items split by rank, by whole search blocks (:func:`search_split`)."""
    from pretrieve.retrieval.search import query_block_size  # lazy: torch

    return ranks.split_files(outputs, count, lambda start, end, paths: write_part(retriever, index, start, end, paths),
                             what, check=check, unit=query_block_size(retriever, depth, query_block))


@contextlib.contextmanager
def searched_index(model: str | Path, collection: BeirCollection,
                   index_dir: str | Path | Callable[[Retriever], Path] | None, what: str, *,
                   scratch: Path | None = None, batch_size: int = 64, device: str = "auto", precision: str = "auto",
                   max_length: int | None = None, query_max_length: int | None = None, pooling: str | None = None,
                   normalize: bool | None = None, normalized_from: Path | None = None,
                   show_progress: bool = True) -> Iterator[tuple[Retriever, Path]]:
    """``(retriever, index)``: the retriever ``model`` loaded (``device``, ``precision``, ``max_length``,
    ``query_max_length``, ``pooling``, ``normalize``: see :func:`pretrieve.retrieval.load.load_retriever`) and the
    collection's corpus encoded into ``index_dir`` (None: a temporary directory in ``scratch`` — on the disk the
    user chose for the results, not the system's temporary one, which may be too small for a large corpus — for one
    process, removed after the block; a callable: chosen by it once the retriever is loaded; ``normalized_from``: the
    unnormalised index of the same encoder, from which a cosine retriever's index is derived instead where that is
    possible, :func:`_normalized_index`)."""
    from pretrieve.retrieval.load import load_retriever  # lazy: torch
    from pretrieve.retrieval.search import encode_corpus, scratch_index  # lazy: torch

    if ranks.active() and index_dir is None:
        raise ConfigError(f"{what} under several ranks needs a cache_dir that every rank shares (for the corpus "
                          "index)")
    retriever = load_retriever(model, device=device, precision=precision, max_length=max_length,
                               query_max_length=query_max_length, pooling=pooling, normalize=normalize)
    if callable(index_dir):
        index_dir = index_dir(retriever)
    with contextlib.ExitStack() as stack:
        root = Path(index_dir) if index_dir is not None else stack.enter_context(scratch_index(scratch))
        corpus = ranks.built_once(collection.corpus_dataset)
        index = _normalized_index(retriever, corpus, normalized_from, root) if normalized_from is not None else None
        if index is None:
            index = encode_corpus(retriever, corpus, root, batch_size=batch_size, show_progress=show_progress)
        yield retriever, index


def _normalized_index(retriever: Retriever, corpus: Any, source: Path, root: Path) -> Path | None:
    """``root``: the index of a cosine ``retriever`` derived from ``source``, the current unnormalised index of the
    same encoder (:func:`pretrieve.retrieval.search.normalized_index`: the same vectors as encoding again, without
    encoding); None where it cannot be (several ranks, not a float32 normalising encoder, ``source`` not current)."""
    from pretrieve.retrieval.search import normalized_index, normalizes_in_float32  # lazy: torch

    if ranks.active() or not normalizes_in_float32(retriever):
        return None
    try:
        return normalized_index(retriever, corpus, source, root)
    except ConfigError as refused:       # the source index is missing or stale: encode instead
        logger.info("encoding the corpus: %s", refused)
        return None


def retriever_run(model: str, collection: BeirCollection, split: str, depth: int, out: Path, *,
                  index_dir: Path | Callable[[Retriever], Path], tag: str = "pretrieve", **options: Any) -> Path:
    """``out``: the retriever's top-``depth`` of every ``split`` query, searched now unless current (the corpus
    index kept in ``index_dir``; ``options``: see :func:`retriever_runs`)."""
    return retriever_runs(model, collection, {split: out}, depth, index_dir=index_dir, tag=tag, **options)[split]


def retriever_runs(model: str, collection: BeirCollection, outs: Mapping[str, Path], depth: int, *,
                   index_dir: Path | Callable[[Retriever], Path], mode: str | None = None, precision: str = "auto",
                   batch_size: int = 64, tag: str = "pretrieve", pooling: str | None = None,
                   normalize: bool | None = None, normalized_from: Path | None = None,
                   show_progress: bool = True) -> dict[str, Path]:
    """``{split: out}``: the retriever's top-``depth`` of every query of each split in ``outs``, each searched now
    unless current — the retriever loaded and the corpus encoded (into ``index_dir``) once, and only when some run is
    not current. ``mode``: a search mode of sparse/hybrid retrievers (default: as trained); ``pooling`` /
    ``normalize``: of a plain dense checkpoint (:func:`pretrieve.retrieval.load.load_retriever`; recorded when
    given); ``normalized_from``: see :func:`searched_index`."""
    from pretrieve.precision import resolve_precision  # lazy: torch
    from pretrieve.retrieval.batches import resolve_device  # lazy: torch
    from pretrieve.retrieval.search import search  # lazy: torch

    precision = resolve_precision(precision, resolve_device("auto"))
    stale = {}
    for split, out in outs.items():
        inputs, named = artifacts.run_inputs(model=model, corpus=collection.corpus_path,
                                             queries=collection.queries_path, qrels=collection.qrels_path(split))
        settings = {"split": split, "depth": depth, "mode": mode, "precision": precision, **named,
                    **{key: value for key, value in (("pooling", pooling), ("normalize", normalize))
                       if value is not None}}
        if not is_current(out, settings, inputs, kind="run"):
            stale[split] = (out, "run", settings, inputs)
    if not stale:
        return dict(outs)

    with searched_index(model, collection, index_dir, f"search {tag}", batch_size=batch_size, precision=precision,
                        pooling=pooling, normalize=normalize, normalized_from=normalized_from,
                        show_progress=show_progress) as (retriever, index):
        for split, output in stale.items():
            queries = list(collection.load_queries(split).items())

            def write_part(retriever: Retriever, index: Path, start: int, end: int, paths: list[Path]) -> None:
                run = search(retriever, dict(queries[start:end]), index, k=depth, mode=mode, batch_size=batch_size,
                             show_progress=show_progress)
                write_run_file(run, paths[0], tag=tag)

            _split_search(retriever, index, [output], len(queries), write_part, f"search {tag}", depth=depth)
    return dict(outs)


def search_run(retriever: Retriever, queries: Mapping[str, str], source: Any, out: str | Path, *, k: int, tag: str,
               failures_at: str | Path | None = None, **search_options: Any) -> Run:
    """Search ``queries`` (``{qid: text}``) with a loaded retriever over ``source`` (an index directory or a corpus,
    :func:`pretrieve.retrieval.search.search` with ``search_options``) in this process and write the run to ``out``
    (TREC, atomically, at most ``k`` per query, run tag ``tag``). A write that fails for lack of space while
    searching names ``failures_at`` (the corpus index the user chose; default: nothing added)."""
    from pretrieve.retrieval.search import search  # lazy: torch

    with write_failures(failures_at) if failures_at is not None else contextlib.nullcontext():
        run = search(retriever, queries, source, k=k, **search_options)
    write_run_file(run, out, tag=tag, depth=k)
    return run


def lexical_run(collection: BeirCollection, split: str, depth: int, out: Path, index_dir: Path,
                engine: str = "bm25") -> Path:
    """``out``: a lexical engine's top-``depth`` of every ``split`` query, with its default settings, searched now
    unless current (the collection's memory-mapped index kept in ``index_dir``)."""
    settings, inputs = lexical_run_record(collection, split, depth, engine=engine)
    if not is_current(out, settings, inputs, kind="run"):
        lexical_run_file(collection, split, out, k=depth, index_dir=index_dir, engine=engine)
    return out


def bm25_run(collection: BeirCollection, split: str, depth: int, out: Path, index_dir: Path) -> Path:
    """``out``: BM25's top-``depth`` of every ``split`` query, searched now unless current (:func:`lexical_run`)."""
    return lexical_run(collection, split, depth, out, index_dir, engine="bm25")


def lexical_run_file(data: str | Path | BeirCollection, split: str, out: str | Path, k: int = 1000,
                     params: Any = None, exclude_self: bool = False, index_dir: str | Path | None = None,
                     n_threads: int | None = None, show_progress: bool = False,
                     engine: str = "bm25") -> tuple[int, int]:
    """``pretrieve bm25``: search the ``split`` queries of a collection with the lexical ``engine`` (``params``: its
    settings, default its own) and write the run to ``out`` as the rankings come (TREC, run tag ``engine``,
    atomically, recorded as an artefact). Returns ``(queries, lines)`` written.

    Under several ranks (:mod:`pretrieve.ranks`) the index is built once and each rank searches a contiguous slice
    of the queries; the file is the one a single process writes."""
    collection = data if isinstance(data, BeirCollection) else BeirCollection(Path(data))
    backend = lexical_backend(engine)
    params = params or backend.params()
    queries = list(collection.load_queries(split).items())  # validates the split before the index is built
    if not queries:
        raise InputError(f"no query judged in split '{split}' ({collection.qrels_path(split)}) is in the queries "
                         "file: the run would be empty (do the query ids match?)", path=collection.queries_path)
    out = Path(out)
    settings, inputs = lexical_run_record(collection, split, k, params, exclude_self, engine=engine)
    with contextlib.ExitStack() as stack:
        with write_failures(index_dir or out):   # the index (without index_dir: a temporary one beside the run)
            index = stack.enter_context(backend.open_index(collection.corpus_path, params, index_dir,
                                                           scratch_dir=out.parent, show_progress=show_progress))

        def write_part(start: int, end: int, paths: list[Path]) -> tuple[int, int]:
            with run_part(paths[0], out, tag=engine, depth=k) as writer:
                for qid, ranking in index.iter_search(queries[start:end], k=k, exclude_self=exclude_self,
                                                      n_threads=n_threads, show_progress=show_progress,
                                                      total=end - start):
                    writer.write(qid, ranking)
            return writer.queries, writer.lines

        written = ranks.split_files([(out, "run", settings, inputs)], len(queries), write_part,
                                    f"{engine.upper()} run")
    return sum(q for q, _ in written), sum(lines for _, lines in written)


def lexical_run_record(collection: BeirCollection, split: str, k: int, params: Any = None,
                       exclude_self: bool = False, engine: str = "bm25") -> tuple[dict[str, Any], dict[str, Path]]:
    """``(settings, inputs)`` recorded with a lexical engine's run file (what :func:`pretrieve.artifacts.check`
    compares)."""
    params = params or lexical_backend(engine).params()
    settings = {"retriever": engine, **params.settings(), "split": split, "k": k, "exclude_self": exclude_self}
    return settings, collection.split_inputs(split)


# ---------------------------------------------------------------------------------------------- mining
def bm25_negatives(data: str | Path | BeirCollection, split: str, out_groups: str | Path, depth: int = 1000,
                   k1: float = 0.9, b: float = 0.4, run_out: str | Path | None = None, overwrite: bool = False,
                   index_dir: str | Path | None = None, n_threads: int | None = None,
                   show_progress: bool = False, engine: str = "bm25") -> Path:
    """Stage-1 groups: the BM25 (Pyserini defaults; ``engine``: another lexical engine, its ``k1``/``b``) top-``depth``
    of each ``split`` query minus its positives.

    CDMAE (Li et al. 2023) §3.4's first fine-tuning stage (K₁ = 1000). Queries are searched in qrels order and each group
    (and run line, with ``run_out``) is written as its ranking arrives, so memory does not grow with the number
    of training queries (:func:`pretrieve.data.groups.group_from_ranking` states which queries are skipped).
    A groups file that is current (same settings, same collection files) is returned without recomputing,
    unless ``overwrite``. Under several ranks (:mod:`pretrieve.ranks`) every rank calls this: the index is built
    once and each rank searches a contiguous slice of the training queries; the files are a single process's.
    """
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    collection = data if isinstance(data, BeirCollection) else BeirCollection(Path(data))
    out_groups = Path(out_groups)
    backend = lexical_backend(engine)
    params = backend.params(k1=k1, b=b)
    settings = {"retriever": engine, **params.settings(), "split": split, "depth": depth}
    inputs = collection.split_inputs(split)
    run_settings = {**settings, "k": depth}
    current = not overwrite and artifacts.is_current(out_groups, settings, inputs, kind="groups") and (
        run_out is None or artifacts.is_current(run_out, run_settings, inputs, kind="run"))
    if ranks.broadcast(current, "check the BM25 groups"):
        logger.info("BM25 groups in %s are up to date; not recomputing", out_groups)
        return out_groups
    qrels = collection.load_qrels(split)
    queries = load_query_texts(collection, qrels)
    wanted = [(qid, queries[qid]) for qid, judged in qrels.items()
              if qid in queries and any(grade >= 1 for grade in judged.values())]
    outputs = [(out_groups, "groups", settings, inputs)]
    if run_out is not None:
        outputs.append((Path(run_out), "run", run_settings, inputs))

    with backend.open_index(collection.corpus_path, params, index_dir, scratch_dir=out_groups.parent,
                            show_progress=show_progress) as index:
        def write_part(start: int, end: int, paths: list[Path]) -> GroupStats:
            stats = GroupStats()
            with contextlib.ExitStack() as stack:
                groups_file = stack.enter_context(open(paths[0], "w", encoding="utf-8"))
                run_writer = None
                if run_out is not None:
                    run_writer = stack.enter_context(run_part(paths[1], run_out, tag=engine, depth=depth))
                for qid, ranking in index.iter_search(wanted[start:end], k=depth, n_threads=n_threads,
                                                      show_progress=show_progress, total=end - start):
                    if run_writer is not None:
                        run_writer.write(qid, ranking)
                    group = group_from_ranking(qid, queries[qid], qrels[qid], [doc_id for doc_id, _ in ranking],
                                               depth, stats)
                    if group is not None:
                        groups_file.write(json.dumps(group.to_dict(), ensure_ascii=False) + "\n")
            return stats

        def check(parts: list[GroupStats]) -> None:
            stats = GroupStats.total(parts)
            # queries the search was not asked for are counted as group_from_ranking would count them
            for qid, judged in qrels.items():
                if qid not in queries or not any(grade >= 1 for grade in judged.values()):
                    group_from_ranking(qid, queries.get(qid), judged, [], depth, stats)
            if stats.kept == 0:
                raise InputError(f"no training group could be built from split '{split}' ({stats.problems()})",
                                 path=collection.root)
            logger.info("wrote %d groups to %s (%s)", stats.kept, out_groups, stats.as_dict())

        ranks.split_files(outputs, len(wanted), write_part, "BM25 negatives", check=check)
    return out_groups


def load_query_texts(collection: BeirCollection, qrels: Mapping[str, Any]) -> dict[str, str]:
    """The texts of the queries judged in ``qrels`` (others are not kept in memory)."""
    return {qid: text for qid, text in collection.load_queries().items() if qid in qrels}


def model_run(model: str, name: str, collection: BeirCollection, split: str, depth: int, out: Path, *,
              precision: str = "auto", batch_size: int = 64, show_progress: bool = True) -> Path:
    """``out/runs/<name>__<collection>[:split].trec``: ``model``'s run (``"bm25"``, or a retriever: a path, an offline
    alias or a hub name, see :func:`pretrieve.retrieval.load.load_retriever`), searched now unless current; its index
    kept in ``out/index/<name>/<collection>`` (BM25's in ``out/bm25-index/<collection>``)."""
    path = run_path(out, name, collection.root, split)
    if model == "bm25":
        return bm25_run(collection, split, depth, path, index_dir=Path(out) / "bm25-index" / collection.root.name)
    return retriever_run(model, collection, split, depth, path, index_dir=Path(out) / "index" / name /
                         collection.root.name, precision=precision, batch_size=batch_size, tag=name,
                         show_progress=show_progress)
