"""Run files: the one place where a collection's queries are searched into files, with freshness and the split
across ranks.

* :func:`retriever_run` — the run file of a retriever (any kind: dense, sparse, hybrid, DupMAE) on a collection's
  split, ``(model, collection, split, depth, out)``: searched now unless current, i.e. made by these weights (by
  content) from this corpus, queries and split, to this depth, in this search mode and precision, and intact.
* :func:`bm25_run` — BM25's run file (the streamed path, :func:`pretrieve.retrieval.bm25.bm25_run_file`: one
  memory-mapped index per collection, queries split by rank), searched now unless current.
* :func:`search_split` — what both the retriever's run file and mined groups
  (:func:`pretrieve.retrieval.mining.mine_negatives`) are written through: load the retriever, encode the corpus
  into an index directory (once; a directory every rank shares is built by all of them, each a slice, and merged),
  then each rank searches its slice of the queries (by whole search blocks, so each block is computed exactly as in
  one process) into part files that rank 0 merges into the very files one process writes
  (:func:`pretrieve.ranks.split_files`).
* :func:`is_current` — whether an output is current, rank 0's answer on every rank.
* :func:`model_run` — the run file of BM25 or any retriever under an evaluation directory (``pretrieve evaluate
  --model``): ``runs/<name>__<collection>[:split].trec``, its index kept beside it.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from pretrieve import artifacts, ranks
from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import write_run
from pretrieve.errors import ConfigError
from pretrieve.precision import resolve_precision
from pretrieve.retrieval.bm25 import bm25_run_file, bm25_run_record
from pretrieve.retrieval.batches import resolve_device
from pretrieve.retrieval.load import Retriever, load_retriever
from pretrieve.retrieval.search import encode_corpus, query_block_size, scratch_index, search

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``(path, kind, settings, inputs)`` of an output file (as :func:`pretrieve.artifacts.write_file` takes them).
Output = tuple[Path, str, Mapping[str, Any], Mapping[str, Any]]


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
                 query_block: int | None = None, batch_size: int = 64, device: str = "auto",
                 precision: str = "auto", max_length: int | None = None, query_max_length: int | None = None,
                 show_progress: bool = True, check: Callable[[list[T]], None] | None = None) -> list[T]:
    """Load the retriever ``model`` (``device``, ``precision``, ``max_length``, ``query_max_length``: see
    :func:`pretrieve.retrieval.load.load_retriever`), encode the collection's corpus into ``index_dir`` (None: a
    temporary directory beside the first output — on the disk the user chose for the results, not the system's
    temporary one, which may be too small for a large corpus — for one process; a callable: chosen by it once the
    retriever is loaded), then write ``outputs`` from
    ``count`` query items split by rank: each rank calls ``write_part(retriever, index, a, b, paths)`` for its slice
    ``[a, b)`` of whole blocks of ``query_block`` queries (default: the search's own block for ``depth``). Returns
    every rank's ``write_part`` result (``check`` may refuse them before anything is written)."""
    if ranks.active() and index_dir is None:
        raise ConfigError(f"{what} under several ranks needs a cache_dir that every rank shares (for the corpus "
                          "index)")
    retriever = load_retriever(model, device=device, precision=precision, max_length=max_length,
                               query_max_length=query_max_length)
    if callable(index_dir):
        index_dir = index_dir(retriever)
    with contextlib.ExitStack() as stack:
        root = (Path(index_dir) if index_dir is not None else
                stack.enter_context(scratch_index(Path(outputs[0][0]).parent if outputs else None)))
        index = encode_corpus(retriever, ranks.built_once(collection.corpus_dataset), root, batch_size=batch_size,
                              show_progress=show_progress)
        return ranks.split_files(outputs, count,
                                 lambda start, end, paths: write_part(retriever, index, start, end, paths), what,
                                 check=check, unit=query_block_size(retriever, depth, query_block))


def retriever_run(model: str, collection: BeirCollection, split: str, depth: int, out: Path, *,
                  index_dir: Path | Callable[[Retriever], Path],
                  mode: str | None = None, precision: str = "auto", batch_size: int = 64, tag: str = "pretrieve",
                  show_progress: bool = True) -> Path:
    """``out``: the retriever's top-``depth`` of every ``split`` query, searched now unless current (the corpus
    index kept in ``index_dir``). ``mode``: a search mode of sparse/hybrid retrievers (default: as trained)."""
    precision = resolve_precision(precision, resolve_device("auto"))
    inputs, named = artifacts.run_inputs(model=model, corpus=collection.corpus_path, queries=collection.queries_path,
                               qrels=collection.qrels_path(split))
    settings = {"split": split, "depth": depth, "mode": mode, "precision": precision, **named}
    if is_current(out, settings, inputs, kind="run"):
        return out
    queries = list(collection.load_queries(split).items())

    def write_part(retriever: Retriever, index: Path, start: int, end: int, paths: list[Path]) -> None:
        run = search(retriever, dict(queries[start:end]), index, k=depth, mode=mode, batch_size=batch_size,
                     show_progress=show_progress)
        write_run(run, paths[0], tag=tag)

    search_split(model, collection, index_dir, [(out, "run", settings, inputs)], len(queries), write_part,
                 f"search {tag}", depth=depth, batch_size=batch_size, show_progress=show_progress,
                 precision=precision)
    return out


def bm25_run(collection: BeirCollection, split: str, depth: int, out: Path, index_dir: Path) -> Path:
    """``out``: BM25's top-``depth`` of every ``split`` query, searched now unless current (the collection's
    memory-mapped index kept in ``index_dir``)."""
    settings, inputs = bm25_run_record(collection, split, depth)
    if not is_current(out, settings, inputs, kind="run"):
        bm25_run_file(collection, split, out, k=depth, index_dir=index_dir)
    return out


def model_run(model: str, name: str, collection: BeirCollection, split: str, depth: int, out: Path, *,
              precision: str = "auto", batch_size: int = 64, show_progress: bool = True) -> Path:
    """``out/runs/<name>__<collection>[:split].trec``: ``model``'s run (``"bm25"``, or a retriever: a path, an offline
    alias or a hub name, see :func:`pretrieve.retrieval.load.load_retriever`), searched now unless current; its index
    kept in ``out/index/<name>/<collection>`` (BM25's in ``out/bm25-index/<collection>``)."""
    tag = collection.root.name if split == "test" else f"{collection.root.name}:{split}"
    path = Path(out) / "runs" / f"{name}__{tag}.trec"
    if model == "bm25":
        return bm25_run(collection, split, depth, path, index_dir=Path(out) / "bm25-index" / collection.root.name)
    return retriever_run(model, collection, split, depth, path, index_dir=Path(out) / "index" / name /
                         collection.root.name, precision=precision, batch_size=batch_size, tag=name,
                         show_progress=show_progress)
