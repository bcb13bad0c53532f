"""The one search path: ``search(retriever, queries, index_or_corpus, k)`` → a run, for every kind of retriever.

``pretrieve dense``, ``pretrieve search``, ``pretrieve mine``, the recipe's evaluate and mine stages and mining all
call :func:`search` (or :func:`search_blocks`, its streaming form):

1. **Index.** ``index_or_corpus`` is either an index (a directory written by :func:`build_index` /
   ``pretrieve encode``: one index directory or ``shard-I-of-N`` directories) or a corpus. A corpus is encoded
   into ``cache_dir/shard-0-of-1`` (without ``cache_dir``: a scratch directory ``.pretrieve-index.<random>.tmp`` in
   ``scratch_dir``, removed afterwards, :func:`scratch_index`) by :func:`encode_corpus` (under
   several ranks: each encodes a slice, rank 0 merges them into that same index) / :func:`build_index`, which
   reuses an index that :mod:`pretrieve.artifacts` certifies was made by the same model weights, settings and
   texts, and otherwise streams the passages through the batch encoder (:mod:`pretrieve.retrieval.batches`)
   into the index format (:mod:`pretrieve.retrieval.index`) — memory is one window, not the corpus. The index of
   an encoder that L2-normalises float32 vectors can instead be made from the same encoder's unnormalised index
   (:func:`normalized_index`: the same vectors, no second encode).
2. **Queries** are encoded and searched ``query_block`` at a time (results can be written as they come).
3. **Shards** are searched by the searcher the kind's back-end opens over them (dense: FAISS, exact or
   approximate; DupMAE: CLS + OT; sparse/hybrid: inverted index; every mode a searcher composed of searchers,
   :mod:`pretrieve.retrieval.index.compose`): one shard after the other, their top-k merged as they come
   (stable: earlier shards win ties), so peak memory is one shard's searcher, not the corpus. Rows are global
   corpus rows until the end, when they become document ids. Exact per-shard top-k merged give the exact global
   top-k; reciprocal rank fusion (``mode="rrf"``) fuses the *global* dense and sparse rankings.

A corpus index of one model and collection is shared by every mode and every later call (mining and evaluation
of the same model read the same encoding).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from pretrieve import artifacts, ranks
from pretrieve.data.trec import Run
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import temporary_dir
from pretrieve.retrieval.batches import DEFAULT_WINDOW, encode_all, encode_windows, text_slice, text_source
from pretrieve.retrieval.index import (IndexDir, SearchOptions, backend, decode_ids, find_shards, is_current,
                                       open_index, shard_dir_name, write_parts, writing)
from pretrieve.retrieval.load import Retriever

logger = logging.getLogger(__name__)

DEFAULT_QUERY_ELEMENTS = 1 << 24
"""Query blocks hold at most this many (query, result) pairs: 16,384 queries at k = 1000."""
INDEX_SCRATCH = "pretrieve-index"
"""The name of a corpus index built for one command (:func:`scratch_index`)."""


# ------------------------------------------------------------------------------------------------ indexing
def corpus_ids(corpus: Any, start: int, end: int, texts: Any = None) -> list[str]:
    """Document ids ``start:end`` of a corpus (``ids``), or of a dataset (``_id`` / ``id`` column; only that
    column is read — slicing a dataset would read every column of those rows). ``texts``: the corpus's
    :func:`text_source` when the caller has it."""
    if hasattr(corpus, "ids"):
        return [str(doc_id) for doc_id in corpus.ids[start:end]]
    texts = text_source(corpus) if texts is None else texts
    if hasattr(texts, "ids_of"):
        return texts.ids_of(start, end)
    for column in ("_id", "id", "doc_id", "docid"):
        if column in getattr(corpus, "column_names", ()):
            return [str(doc_id) for doc_id in corpus.select_columns([column])[start:end][column]]
    raise ConfigError("the corpus has no document ids (an 'ids' attribute or an '_id'/'id' column)")


def content_hash(corpus: Any, start: int, end: int, window: int = DEFAULT_WINDOW) -> str:
    """SHA-1 over the ids and passages of rows ``start:end``: any edit of those passages invalidates their index."""
    source = text_source(corpus)
    digest = hashlib.sha1()
    for first in range(start, end, window):
        last = min(end, first + window)
        for doc_id, text in zip(corpus_ids(corpus, first, last, source), text_slice(source, first, last)):
            digest.update(doc_id.encode("utf-8"))
            digest.update(b"\0")
            digest.update(text.encode("utf-8"))
            digest.update(b"\1")
    return digest.hexdigest()


def build_index(retriever: Retriever, corpus: Any, out_dir: str | Path, shard: int = 0, num_shards: int = 1,
                batch_size: int = 64, show_progress: bool = True, overwrite: bool = False,
                window: int = DEFAULT_WINDOW) -> Path:
    """Encode shard ``shard`` of ``num_shards`` (a contiguous row range) of ``corpus`` with the retriever's passage
    side into ``out_dir/shard-{i}-of-{n}``; an index made by the same model, settings and texts is reused."""
    shard_dir, settings, meta = _index_record(retriever, corpus, out_dir, shard, num_shards, window)
    description = f"encode shard {shard + 1}/{num_shards}" if num_shards > 1 else "encode passages"
    return _write_index(retriever, corpus, shard_dir, settings, meta, batch_size, show_progress, overwrite, window,
                        description)


def _write_index(retriever: Retriever, corpus: Any, directory: Path, settings: dict[str, Any], meta: dict[str, Any],
                 batch_size: int, show_progress: bool, overwrite: bool, window: int, description: str) -> Path:
    """Encode rows ``meta["rows"]`` of ``corpus`` into the index ``directory`` unless it is current."""
    start, end = meta["rows"]
    status = is_current(directory, settings, retriever.inputs())
    if status.current and not overwrite:
        logger.info("index %s is current (same model, settings and texts); not re-encoding", directory)
        return directory
    if status.exists:
        logger.info("re-encoding %s: %s", directory, status.reason)
    windows = (outputs for _, outputs in encode_windows(
        retriever.passage, text_source(corpus), batch_size, start, end, window=window,
        show_progress=show_progress, description=description))
    return _write_windows(retriever, corpus, directory, settings, meta, windows)


def _write_windows(retriever: Retriever, corpus: Any, directory: Path, settings: dict[str, Any],
                   meta: dict[str, Any], windows: Iterator[dict[str, Any]]) -> Path:
    """Write the passage outputs ``windows`` (rows ``meta["rows"]`` of ``corpus``, in order) as the index
    ``directory`` with its record; returns ``directory``."""
    start, end = meta["rows"]
    columns = _columns(retriever)
    with writing(directory, retriever.kind, lambda: corpus_ids(corpus, start, end), meta, settings,
                 retriever.inputs()) as tmp:
        if not write_parts(tmp, windows, columns=columns):
            write_parts(tmp, [retriever.passage.empty_outputs()], columns=columns)
    return directory


def _index_record(retriever: Retriever, corpus: Any, out_dir: str | Path, shard: int, num_shards: int,
                  window: int = DEFAULT_WINDOW, rows: tuple[int, int] | None = None
                  ) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """``(directory, settings, meta)`` of shard ``shard`` of ``num_shards`` of ``corpus`` (what its sidecar and
    ``meta.json`` record; the settings hold the SHA-1 of the shard's texts); ``rows`` overrides its row range."""
    start, end = rows or ranks.shard_bounds(len(text_source(corpus)), shard, num_shards)
    settings = {**retriever.settings(), "shard": shard, "num_shards": num_shards, "rows": [start, end],
                "content_sha1": content_hash(corpus, start, end, window)}
    meta = {"rows": [start, end], "shard": shard, "num_shards": num_shards, "model": retriever.name,
            "precision": retriever.precision, "passage": retriever.passage.settings}
    return Path(out_dir) / shard_dir_name(shard, num_shards), settings, meta


def _columns(retriever: Retriever) -> dict[str, int]:
    return {name: value.shape[1] for name, value in retriever.passage.empty_outputs().items()}


RANK_PARTS = ".rank-parts"
"""Where the ranks of a launched run put their slices of a corpus index before rank 0 merges them."""


def encode_corpus(retriever: Retriever, corpus: Any, root: str | Path, batch_size: int = 64,
                  show_progress: bool = True, window: int = DEFAULT_WINDOW) -> Path:
    """The index of a whole corpus, ``root/shard-0-of-1`` (:func:`build_index`), reused while current.

    Under several ranks (:mod:`pretrieve.ranks`; every rank calls this) each rank encodes a contiguous run of whole
    encoding windows (``window`` passages, the unit a single process sorts by length and batches, so every vector is
    computed from the very same batch) into ``root/.rank-parts``, and rank 0 merges the parts, in order, into the
    index a single process writes (same files, same record): later searches, by any number of ranks, read one index
    and rank ties exactly as a single process does. A corpus of fewer windows than ranks leaves ranks idle here.
    Returns ``root``."""
    root = Path(root)
    if not ranks.active():
        build_index(retriever, corpus, root, batch_size=batch_size, show_progress=show_progress, window=window)
        return root
    record = None
    if ranks.is_main():
        with ranks.guard("check the corpus index"):
            record = _index_record(retriever, corpus, root, 0, 1, window)
    current = ranks.broadcast(record is not None and is_current(record[0], record[1], retriever.inputs()).current,
                              "check the corpus index")
    if current:
        logger.info("index %s is current (same model, settings and texts); not re-encoding", root)
        return root
    count, unit, world = len(text_source(corpus)), max(window, batch_size), ranks.world_size()
    slices = [ranks.bounds(count, r, world, unit=unit) for r in range(world)]
    parts = [root / RANK_PARTS / f"rows-{start}-{end}" for start, end in slices]
    with ranks.guard("encode the corpus"):
        start, end = slices[ranks.rank()]
        directory, settings, meta = _index_record(retriever, corpus, root, 0, 1, window, rows=(start, end))
        _write_index(retriever, corpus, parts[ranks.rank()], settings, meta, batch_size, show_progress, False,
                     window, f"encode rows {start}-{end} (rank {ranks.rank()})")
    ranks.barrier("encode the corpus")
    if ranks.is_main():
        with ranks.guard("merge the corpus index"):
            directory, settings, meta = record
            start, end = meta["rows"]
            with writing(directory, retriever.kind, corpus_ids(corpus, start, end), meta, settings,
                         retriever.inputs()) as tmp:
                write_parts(tmp, _part_windows(parts), columns=_columns(retriever))

            shutil.rmtree(root / RANK_PARTS, ignore_errors=True)
    ranks.barrier("merge the corpus index")
    return root


def normalizes_in_float32(retriever: Retriever) -> bool:
    """Whether ``retriever`` is a plain dense encoder that L2-normalises float32 vectors (its index can then be
    derived from the unnormalised one, :func:`normalized_index`; a bfloat16 encoder normalises before the cast)."""
    settings = retriever.passage.settings
    return retriever.kind == "dense" and settings.get("normalize") is True and settings.get("dtype") == "float32"


def normalized_index(retriever: Retriever, corpus: Any, source: str | Path, root: str | Path,
                     window: int = DEFAULT_WINDOW) -> Path:
    """The index of a dense ``retriever`` that L2-normalises (cosine) made from ``source`` instead of encoding
    ``corpus`` again: ``source`` must be a current index (:func:`encode_corpus`) of the same model, settings and
    texts *without* normalisation, and its vectors are normalised as the encoder normalises its own
    (``torch.nn.functional.normalize``, row by row, on the same float32 vectors), into ``root/shard-0-of-1`` with the
    record an encoding by ``retriever`` writes — so the two are interchangeable and either is reused while current.
    Returns ``root``; refuses (:class:`ConfigError`) when ``source`` is not such an index. One process (a launched
    run encodes with :func:`encode_corpus`)."""
    root = Path(root)
    if ranks.active():
        raise ConfigError("normalized_index runs in one process; under several ranks use encode_corpus")
    if not normalizes_in_float32(retriever):
        raise ConfigError("normalized_index makes the index of a dense retriever that normalises its float32 vectors "
                          f"(this one: {retriever.kind}, {retriever.passage.settings})")
    directory, settings, meta = _index_record(retriever, corpus, root, 0, 1, window)
    if is_current(directory, settings, retriever.inputs()).current:
        logger.info("index %s is current (same model, settings and texts); not re-deriving", directory)
        return root
    unnormalized = {**settings, "passage": {**settings["passage"], "normalize": False}}
    source_dir = Path(source) / shard_dir_name(0, 1)
    status = is_current(source_dir, unnormalized, retriever.inputs())
    if not status.current:
        raise ConfigError(f"{source_dir} is not the unnormalised index of this model, settings and texts "
                          f"({status.reason}); encode the corpus instead")

    normalized = ({name: torch.nn.functional.normalize(torch.from_numpy(np.array(values, np.float32)), p=2,
                                                       dim=-1).numpy() for name, values in part.items()}
                  for part in _part_windows([source_dir]))
    _write_windows(retriever, corpus, directory, settings, meta, normalized)
    return root


def _part_windows(directories: Sequence[Path], rows: int = 1 << 16) -> Iterator[dict[str, Any]]:
    """The parts of index directories, in order, ``rows`` rows at a time (dense parts read from disk, sparse parts
    one directory's matrix at a time)."""
    for directory in directories:
        index = open_index(directory)
        names = index.meta.get("parts") or []
        sparse = {name: index.matrix(name) for name in names if not (directory / f"{name}.npy").exists()}
        for first in range(0, index.count, rows):
            last = min(index.count, first + rows)
            yield {name: (sparse[name][first:last] if name in sparse else np.asarray(index.array(name)[first:last]))
                   for name in names}
        del sparse


def _is_index(value: Any) -> bool:
    return isinstance(value, (str, Path))


# ------------------------------------------------------------------------------------------------- search
def search(retriever: Retriever, queries: Mapping[str, str], index_or_corpus: Any, k: int = 1000,
           cache_dir: str | Path | None = None, mode: str | None = None, options: SearchOptions | None = None,
           batch_size: int = 64, query_block: int | None = None, show_progress: bool = True,
           scratch_dir: str | Path | None = None) -> Run:
    """Top-``k`` of ``queries`` (``{qid: text}``) over an index directory or a corpus (see the module docstring).

    ``mode``: a search mode of sparse/hybrid retrievers (``dense`` / ``sparse`` / ``hybrid`` / ``rrf``; default:
    as trained); ``options``: FAISS factory, metric, GPU use, hybrid weights … (:class:`SearchOptions`);
    ``scratch_dir``: where a corpus is indexed without ``cache_dir`` (:func:`scratch_index`).
    """
    run: Run = {}
    for block in search_blocks(retriever, queries, index_or_corpus, k, cache_dir=cache_dir, mode=mode,
                               options=options, batch_size=batch_size, query_block=query_block,
                               show_progress=show_progress, scratch_dir=scratch_dir):
        run.update(block)
    return run


def search_blocks(retriever: Retriever, queries: Mapping[str, str], index_or_corpus: Any, k: int = 1000,
                  cache_dir: str | Path | None = None, mode: str | None = None,
                  options: SearchOptions | None = None, batch_size: int = 64, query_block: int | None = None,
                  show_progress: bool = True, scratch_dir: str | Path | None = None) -> Iterator[Run]:
    """:func:`search`, one run per block of ``query_block`` queries (in the order of ``queries``), as they come."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    search_backend = backend(retriever.kind)
    mode = search_backend.resolve_mode(retriever.kind, mode)
    options = options or SearchOptions()
    with contextlib.ExitStack() as stack:
        if _is_index(index_or_corpus):
            root = Path(index_or_corpus)
        else:
            if cache_dir is not None:   # shared by the ranks of a launched run (each must call this)
                root = encode_corpus(retriever, index_or_corpus, cache_dir, batch_size=batch_size,
                                     show_progress=show_progress)
            else:
                root = stack.enter_context(scratch_index(scratch_dir))
                build_index(retriever, index_or_corpus, root, batch_size=batch_size, show_progress=show_progress)
        shards = [open_index(path) for path in find_shards(root)]
        check_compatible(retriever, shards, root)
        query_ids = list(queries)
        block = query_block_size(retriever, k, query_block)
        searcher = search_backend.open_searcher(shards, options, mode)
        for first in range(0, len(query_ids), block):
            ids = query_ids[first:first + block]
            encoded = encode_all(retriever.query, [queries[q] for q in ids], batch_size,
                                 show_progress=show_progress and first == 0 and len(query_ids) > batch_size,
                                 description="encode queries")
            scores, rows = searcher.search(encoded, k)
            yield _run_of(ids, scores, rows, shards)


@contextlib.contextmanager
def scratch_index(parent: str | Path | None = None) -> Iterator[Path]:
    """A directory for a corpus index used by one command: ``.pretrieve-index.<random>.tmp`` in ``parent`` (default:
    the system's temporary directory), removed after the block — also after an error or Ctrl-C; a killed command's
    is a leftover that the next command's preflight removes (:func:`pretrieve.outputs.preflight`, ``scratch``
    :data:`INDEX_SCRATCH`)."""
    with temporary_dir(INDEX_SCRATCH, parent) as root:
        yield root


def query_block_size(retriever: Retriever, k: int, query_block: int | None = None) -> int:
    """How many queries :func:`search_blocks` encodes and searches at once (the unit by which ranks split queries,
    so that each block is computed exactly as in one process)."""
    return query_block or getattr(backend(retriever.kind), "QUERY_BLOCK", None) or max(256, DEFAULT_QUERY_ELEMENTS // k)


def _run_of(query_ids: Sequence[str], scores: np.ndarray, rows: np.ndarray, shards: Sequence[IndexDir]) -> Run:
    """Global rows → document ids (only the rows found are looked up)."""
    offsets = np.cumsum([0] + [shard.count for shard in shards])
    found = rows >= 0
    doc_ids = np.empty(rows.shape, dtype=object)
    if found.any():
        wanted = rows[found]
        shard_of = np.searchsorted(offsets, wanted, side="right") - 1
        names = np.empty(len(wanted), dtype=object)
        for position in np.unique(shard_of):
            at = shard_of == position
            names[at] = decode_ids(shards[position].ids[wanted[at] - offsets[position]])
        doc_ids[found] = names
    run: Run = {}
    for q, qid in enumerate(query_ids):
        keep = found[q] & np.isfinite(scores[q])
        run[qid] = {doc: float(score) for doc, score in zip(doc_ids[q][keep].tolist(), scores[q][keep].tolist())}
    return run


# -------------------------------------------------------------------------------------------- compatibility
def describe_shards(shards: Sequence[IndexDir], root: Path) -> dict[str, Any]:
    """The kind and passage settings shared by all shards; shards that disagree raise :class:`InputError`."""
    reference: dict[str, Any] | None = None
    for shard in shards:
        settings = {"kind": shard.kind, "precision": shard.meta.get("precision"),
                    "passage": shard.meta.get("passage"), "model": shard.meta.get("model")}
        if reference is None:
            reference = settings
        elif settings != reference:
            raise InputError(f"shards were encoded with different settings: {settings} vs {reference}",
                             path=shard.path)
    return reference or {}


def same_local_model(retriever: Retriever, shards: Sequence[IndexDir]) -> bool:
    """Whether every shard was encoded from the same inputs as the retriever's passage side (a folder copied or
    moved since: another path, the same weights; or a query-side fine-tuned model, whose passage tower is its base
    model's), by the fingerprints its sidecar recorded."""
    if retriever.path is None:
        return False
    current = {name: artifacts.fingerprint(value) for name, value in retriever.inputs().items()}
    recorded = [(artifacts.read_sidecar(shard.path) or {}).get("inputs") for shard in shards]
    return all(inputs == current for inputs in recorded)


def check_compatible(retriever: Retriever, shards: Sequence[IndexDir], root: Path) -> None:
    """Raise when the retriever's queries cannot be compared with the indexed passages; warn when their encoders'
    settings differ."""
    indexed = describe_shards(shards, root)
    if indexed.get("kind") != retriever.kind:
        raise InputError(f"the index holds '{indexed.get('kind')}' passages but {retriever.name} is a "
                         f"'{retriever.kind}' retriever", path=root)
    passage, query = indexed.get("passage") or {}, retriever.query.settings
    if retriever.kind == "dense":
        if passage.get("dim") != query.get("dim"):
            raise InputError(f"passages were encoded into {passage.get('dim')}-d vectors but the query encoder "
                             f"gives {query.get('dim')}-d ones ({indexed.get('model')} vs {retriever.name})",
                             path=root)
        differing = [f"{key}: {passage.get(key)!r} vs {query.get(key)!r}" for key in ("pooling", "normalize")
                     if passage.get(key) != query.get(key)]
        if indexed.get("model") != retriever.name and not same_local_model(retriever, shards):
            differing.insert(0, f"model: {indexed.get('model')} vs {retriever.name}")
        if differing:
            logger.warning("query encoder differs from the one that encoded %s (%s)", root, "; ".join(differing))
    elif passage.get("representation") != query.get("representation"):
        raise InputError(f"the index was encoded with another representation ({passage.get('representation')} vs "
                         f"{query.get('representation')})", path=root)
