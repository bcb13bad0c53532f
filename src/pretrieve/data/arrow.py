"""Corpus, queries and training groups as memory-mapped Arrow datasets (Hugging Face ``datasets``).

At MS MARCO scale (8.8M passages, 500k training groups) holding every passage as Python objects on every rank
costs gigabytes; an Arrow dataset is read through a memory map, so a process holds only the pages it touches and
ranks on one machine share them. This module converts the JSONL files once and reuses the result:

* :func:`corpus_dataset` (``corpus.jsonl``) → a ``datasets.Dataset`` with columns ``_id``, ``title``, ``text``
  in file order (row ``i`` is the ``i``-th passage); :func:`queries_dataset` (``queries.jsonl``) → ``_id``,
  ``text``; :func:`groups_dataset` (training groups JSONL, :mod:`pretrieve.data.groups`) → a
  :class:`GroupsDataset` (``len``, ``[i]`` → :class:`~pretrieve.data.groups.TrainingGroup`) over columns
  ``query_id``, ``query``, ``positives``, ``negatives``, ``positive_scores``, ``negative_scores``.
  :class:`~pretrieve.data.collection.BeirCollection` has ``corpus_dataset()`` / ``queries_dataset(split)`` /
  ``corpus_index()``.
* :func:`id_index` → an :class:`IdIndex`: id → row without a Python dict of all ids (sorted 64-bit BLAKE2b
  hashes of the ids and the row of each, two memory-mapped ``.npy`` files; a match is confirmed against the
  ``_id`` column, so a hash collision never returns a wrong row).

**Validation is the streaming readers'.** Each part of the file is parsed by the same functions as
:func:`~pretrieve.data.beir.iter_corpus`, :func:`~pretrieve.data.beir.load_queries` and
:func:`~pretrieve.data.groups.iter_groups`, so a malformed line gives the same one-line
:class:`~pretrieve.errors.InputError` (file, real line number, field, message); duplicate ids are found from the
sorted hashes and reported with both lines, as :meth:`Corpus.load <pretrieve.data.beir.Corpus.load>` does. (A file
with several problems may name a different one first: parse errors are found before duplicates.) Groups are
checked against a corpus when one is given (``on_unknown`` as in :func:`~pretrieve.data.groups.read_groups`);
skipped and dropped counts are kept in :attr:`GroupsDataset.stats`.

**Building.** The file is cut into byte ranges at line starts and converted by ``num_proc`` processes
(:mod:`pretrieve.data.parallel`; default: one per 16 MB, at most the CPUs; a ``.gz`` file is one part), each
writing its own Arrow file in batches of 8,192 rows, so memory does not grow with the file. The result is an
ordinary ``datasets.save_to_disk`` directory (``datasets.load_from_disk`` opens it too) plus ``ids.hash.npy`` /
``ids.row.npy`` and ``meta.json``.

**Where and when.** The directory is ``$PRETRIEVE_CACHE/arrow/<input dir name>-<hash of its path>/<name>.arrow``
(default ``~/.cache/pretrieve/arrow/…``; e.g. ``corpus.arrow``): the user's cache, never the data folder (which
may be shared, read-only or written by others); ``cache_dir`` overrides it. It is written atomically through :mod:`pretrieve.artifacts`, under a file lock (``.<name>.arrow.lock``:
commands started together on a fresh collection build it once, the others wait for it), and reused only while
current: same format, same settings, same input content (the source file's fingerprint; for groups also the corpus
dataset's).

**Multi-rank.** Rows are in file order, so a rank takes a contiguous slice:
``dataset.select(range(a, b))`` or ``dataset.shard(world, rank, contiguous=True)`` (no copy, no cache file).
Build on one process first (the others then find it current; :func:`pretrieve.ranks.built_once` does that under
several ranks). ``map``/``filter``/non-contiguous ``select``
write ``datasets`` cache files beside the data unless given ``keep_in_memory=True`` or a ``cache_file_name``
elsewhere; a file added to the directory makes it not current (it is then rebuilt), so pass one of those.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from filelock import FileLock, Timeout

from pretrieve import artifacts
from pretrieve.data.groups import (GroupStats, TrainingGroup, check_known, drop_positive_negatives, log_problems,
                                   parse_group)
from pretrieve.data.jsonl import _open_binary, iter_jsonl, iter_lines
from pretrieve.data.parallel import (byte_ranges, located_in_part, lines_before, part_count, resolve_num_proc,
                                     run_parts)
from pretrieve.data.records import (collection_file, duplicate_id_message, join_title, parse_document, parse_query,
                                     user_cache_dir)
from pretrieve.errors import ConfigError, InputError

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

FORMAT = "pretrieve-arrow/1"
KIND = "arrow-dataset"
CACHE_DIR_NAME = artifacts.DERIVED_CACHE_DIR   # ".pretrieve-cache"
BATCH_ROWS = 8192
HASHES_FILE, ROWS_FILE, META_FILE = "ids.hash.npy", "ids.row.npy", "meta.json"

SCHEMAS = {
    "corpus": pa.schema([("_id", pa.string()), ("title", pa.string()), ("text", pa.string())]),
    "queries": pa.schema([("_id", pa.string()), ("text", pa.string())]),
    "groups": pa.schema([("query_id", pa.string()), ("query", pa.string()),
                         ("positives", pa.list_(pa.string())), ("negatives", pa.list_(pa.string())),
                         ("positive_scores", pa.list_(pa.float64())), ("negative_scores", pa.list_(pa.float64()))]),
}
_ID_KIND = {"corpus": "document", "queries": "query"}
_EMPTY = {"corpus": "corpus is empty (no documents)", "queries": "no queries in file"}


# ------------------------------------------------------------------------------------------------ ids
def hash_ids(ids: Iterable[str]) -> np.ndarray:
    """64-bit BLAKE2b hashes of ids (UTF-8), as ``uint64``."""
    raw = b"".join(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest() for doc_id in ids)
    return np.frombuffer(raw, dtype="<u8")


class IdIndex:
    """id → row of a dataset: sorted id hashes and their rows (memory-mapped) plus the id column.

    ``lookup(ids)`` answers a whole batch with one ``searchsorted``; every hit is confirmed by comparing the id
    itself, and ids sharing a hash are all tried, so the answer is exact.
    """

    def __init__(self, hashes: np.ndarray, rows: np.ndarray, ids: pa.ChunkedArray):
        self.hashes = hashes
        self.rows = rows
        self.ids = ids

    @classmethod
    def open(cls, directory: str | Path, ids: pa.ChunkedArray | None = None) -> "IdIndex":
        """The index of a dataset directory (``ids``: its ``_id`` column when already read)."""
        directory = Path(directory)
        if not (directory / HASHES_FILE).exists():
            raise ConfigError(f"{directory} has no id index (not a corpus or queries Arrow dataset)")
        return cls(np.load(directory / HASHES_FILE, mmap_mode="r"), np.load(directory / ROWS_FILE, mmap_mode="r"),
                   read_column(directory, "_id") if ids is None else ids)

    def __len__(self) -> int:
        return len(self.rows)

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        """Rows of ``ids`` (``int64``), -1 for an unknown id."""
        ids = list(ids)
        out = np.full(len(ids), -1, dtype=np.int64)
        if not ids or not len(self.rows):
            return out
        wanted = hash_ids(ids)
        pos = np.searchsorted(self.hashes, wanted)
        clipped = np.minimum(pos, len(self.hashes) - 1)
        hit = np.nonzero((pos < len(self.hashes)) & (np.asarray(self.hashes[clipped]) == wanted))[0]
        if not len(hit):
            return out
        candidates = np.asarray(self.rows[clipped[hit]], dtype=np.int64)
        found = take_rows(self.ids, candidates)
        for i, row, doc_id in zip(hit.tolist(), candidates.tolist(), found):
            if doc_id == ids[i]:
                out[i] = row
            else:  # a hash collision (or an unknown id sharing a known id's hash): try the others with this hash
                out[i] = self._scan(int(pos[i]) + 1, int(wanted[i]), ids[i])
        return out

    def _scan(self, position: int, hashed: int, doc_id: str) -> int:
        while position < len(self.hashes) and int(self.hashes[position]) == hashed:
            row = int(self.rows[position])
            if self.ids[row].as_py() == doc_id:
                return row
            position += 1
        return -1

    def row(self, doc_id: str) -> int:
        """Row of one id (KeyError if unknown)."""
        row = int(self.lookup([doc_id])[0])
        if row < 0:
            raise KeyError(doc_id)
        return row

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self.lookup([doc_id])[0] >= 0

    def missing(self, ids: Sequence[str]) -> set[str]:
        """The ids of ``ids`` that are not in the index."""
        ids = list(ids)
        return {ids[i] for i in np.nonzero(self.lookup(ids) < 0)[0].tolist()}


def take_rows(column: pa.ChunkedArray, rows: Sequence[int] | np.ndarray) -> list[Any]:
    """The values at ``rows`` of a chunked column, as Python objects, in the order asked.

    Reads only the chunks the rows are in: pyarrow's ``ChunkedArray.take`` first concatenates every chunk, i.e.
    copies the whole column (the whole corpus's texts, 0.4 s and 440 MB at 1M passages) to return a few rows."""
    rows = np.asarray(rows, dtype=np.int64)
    values: list[Any] = [None] * len(rows)
    if not len(rows):
        return values
    ends = np.cumsum([len(chunk) for chunk in column.chunks], dtype=np.int64)
    if rows.min() < 0 or rows.max() >= (ends[-1] if len(ends) else 0):
        raise IndexError(f"row out of range 0..{int(ends[-1]) - 1 if len(ends) else -1}")
    chunk_of = np.searchsorted(ends, rows, side="right")
    order = np.argsort(chunk_of, kind="stable")
    sorted_chunks = chunk_of[order]
    bounds = np.flatnonzero(np.diff(sorted_chunks)) + 1
    for positions in np.split(order, bounds):
        number = int(chunk_of[positions[0]])
        first = int(ends[number - 1]) if number else 0
        taken = column.chunk(number).take(pa.array(rows[positions] - first)).to_pylist()
        for position, value in zip(positions.tolist(), taken):
            values[position] = value
    return values


def read_column(directory: str | Path, name: str) -> pa.ChunkedArray:
    """One column of an Arrow dataset directory, memory-mapped (no ``datasets`` import)."""
    return read_columns(directory, (name,))[0][name]


def read_columns(directory: str | Path, names: Sequence[str]) -> tuple[dict[str, pa.ChunkedArray], list[mmap.mmap]]:
    """Columns of an Arrow dataset directory over read-only memory maps this process owns (zero-copy), and the
    maps: :func:`release_pages` gives back the pages a read touched."""
    directory = Path(directory)
    state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
    maps: list[mmap.mmap] = []
    tables = []
    for entry in state["_data_files"]:
        with open(directory / entry["filename"], "rb") as handle:
            maps.append(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
        tables.append(pa.ipc.open_stream(pa.py_buffer(maps[-1])).read_all())
    columns = {name: pa.chunked_array([chunk for table in tables for chunk in table.column(name).chunks],
                                      type=tables[0].schema.field(name).type) for name in names}
    return columns, maps


def release_pages(maps: Iterable[mmap.mmap]) -> None:
    """Drop the pages of read-only file maps from this process (``MADV_DONTNEED``): the data stays valid — a later
    read faults it back in from the page cache or the file — but a sequential pass over a memory-mapped corpus no
    longer leaves the whole file counted in the process's resident memory (and its OOM score)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:
        return
    for mapped in maps:
        mapped.madvise(advice)


def id_index(dataset: "datasets.Dataset | str | Path") -> IdIndex:
    """The :class:`IdIndex` of a corpus or queries dataset from this module (or its directory); rows are rows of
    the whole dataset (not of a ``select``-ed or sharded view)."""
    if isinstance(dataset, (str, Path)):
        return IdIndex.open(dataset)
    if getattr(dataset, "_indices", None) is not None:
        raise ConfigError("id_index needs the whole dataset, not a select()/shard() view of it")
    index = IdIndex.open(dataset_directory(dataset))
    if len(index) != len(dataset):
        raise ConfigError("id_index needs the whole dataset, not a slice of it")
    return index


def dataset_directory(dataset: "datasets.Dataset") -> Path:
    """The directory a memory-mapped dataset was loaded from."""
    files = dataset.cache_files
    if not files:
        raise ConfigError("the dataset is held in memory, not loaded from an Arrow directory")
    return Path(files[0]["filename"]).parent


class CorpusTexts:
    """Passages of a corpus dataset: by document id (``texts_of(ids)``, for collators and scorers) or by rows
    (``texts[i:j]``, for the batch encoder), title + text.

    Holds the id index and the ``_id``/``title``/``text`` columns over memory maps it owns and gives their pages
    back after every read (:func:`release_pages`; the strings read are copies), so a pass over the whole corpus
    keeps one read's pages resident, not the file. Pickles as its directory (a DataLoader worker reopens the
    memory maps instead of receiving a copy)."""

    def __init__(self, dataset: "datasets.Dataset | str | Path"):
        self.directory = Path(dataset) if isinstance(dataset, (str, Path)) else dataset_directory(dataset)
        columns, self._maps = read_columns(self.directory, ("_id", "title", "text"))
        self.index = IdIndex.open(self.directory, ids=columns["_id"])
        self.titles = columns["title"]
        self.texts = columns["text"]

    @classmethod
    def of(cls, dataset: Any) -> "CorpusTexts | None":
        """A view of ``dataset`` when it is a whole corpus dataset from this module (not a ``select``-ed view of
        one), else None."""
        if getattr(dataset, "_indices", None) is not None or not getattr(dataset, "cache_files", None):
            return None
        try:
            directory = dataset_directory(dataset)
        except ConfigError:
            return None
        if not (directory / HASHES_FILE).exists() or set(dataset.column_names) != {"_id", "title", "text"}:
            return None
        texts = cls(directory)
        return texts if len(texts) == len(dataset) else None

    def __getitem__(self, rows: slice) -> list[str]:
        """Passages of rows ``rows`` (a slice with step 1), in order, title and text joined by a space."""
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("CorpusTexts reads contiguous rows only")
        return self.rows_text(start, stop)

    def rows_text(self, start: int, end: int, sep: str = " ") -> list[str]:
        """``title + sep + text`` of rows ``start:end``, in order."""
        start, end, _ = slice(start, end).indices(len(self))
        count = max(0, end - start)
        passages = [join_title(title or "", text, sep) for title, text in
                    zip(self.titles.slice(start, count).to_pylist(), self.texts.slice(start, count).to_pylist())]
        release_pages(self._maps)
        return passages

    def ids_of(self, start: int, end: int) -> list[str]:
        """Document ids of rows ``start:end``, in order."""
        ids = self.index.ids.slice(start, max(0, end - start)).to_pylist()
        release_pages(self._maps)
        return ids

    def __getstate__(self) -> dict:
        return {"directory": str(self.directory)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"])

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self.index

    def missing(self, ids: Sequence[str]) -> set[str]:
        """The ids of ``ids`` the corpus does not have (one batched lookup)."""
        return self.index.missing(ids)

    def texts_of(self, ids: Sequence[str], sep: str = " ") -> list[str]:
        """``title + sep + text`` of each id, in order (KeyError for an unknown id)."""
        ids = list(ids)
        rows = self.index.lookup(ids)
        if (rows < 0).any():
            raise KeyError(ids[int(np.argmax(rows < 0))])
        passages = [join_title(title, text, sep) for title, text in
                    zip(take_rows(self.titles, rows), take_rows(self.texts, rows))]
        release_pages(self._maps)
        return passages


# ----------------------------------------------------------------------------------------- locations
def cache_root(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Directory holding the Arrow datasets of files in ``source``'s directory (see the module docstring)."""
    if cache_dir is not None:
        return Path(cache_dir)
    parent = Path(source).parent
    digest = hashlib.sha1(str(parent.resolve()).encode()).hexdigest()[:12]
    return user_cache_dir("arrow", f"{parent.name}-{digest}")


def dataset_path(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where the Arrow dataset of ``source`` lives (``corpus.jsonl`` → ``.../corpus.arrow``)."""
    name = Path(source).name.removesuffix(".gz")
    for suffix in (".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return cache_root(source, cache_dir) / f"{name}.arrow"


# ----------------------------------------------------------------------------------------- public API
def corpus_dataset(path: str | Path, *, num_proc: int | None = None,
                   cache_dir: str | Path | None = None) -> "datasets.Dataset":
    """The corpus of ``corpus.jsonl`` (``_id``, ``title``, ``text``; file order), memory-mapped."""
    return load(build("corpus", path, num_proc=num_proc, cache_dir=cache_dir))


def queries_dataset(path: str | Path, *, num_proc: int | None = None,
                    cache_dir: str | Path | None = None) -> "datasets.Dataset":
    """The queries of ``queries.jsonl`` (``_id``, ``text``; file order), memory-mapped."""
    return load(build("queries", path, num_proc=num_proc, cache_dir=cache_dir))


def groups_dataset(path: str | Path, corpus: "datasets.Dataset | str | Path | None" = None,
                   on_unknown: str = "error", *, num_proc: int | None = None,
                   cache_dir: str | Path | None = None) -> "GroupsDataset":
    """Training groups of a groups JSONL file, validated as :func:`~pretrieve.data.groups.read_groups` does.

    ``corpus``: a corpus dataset from :func:`corpus_dataset` (or its directory, or a ``corpus.jsonl``) to check
    the document ids against (``on_unknown``: ``error`` | ``skip``); None: ids are not checked.
    """
    if on_unknown not in ("error", "skip"):
        raise ConfigError(f"on_unknown must be 'error' or 'skip', got {on_unknown!r}")
    corpus_dir = None
    if corpus is not None:
        if isinstance(corpus, (str, Path)) and not (Path(corpus) / HASHES_FILE).exists():
            if Path(corpus).is_dir():  # a BEIR collection directory
                corpus = collection_file(Path(corpus), "corpus.jsonl")
            corpus_dir = build("corpus", corpus, num_proc=num_proc, cache_dir=cache_dir)
        else:
            corpus_dir = Path(corpus) if isinstance(corpus, (str, Path)) else dataset_directory(corpus)
    directory = build("groups", path, num_proc=num_proc, cache_dir=cache_dir, corpus_dir=corpus_dir,
                      on_unknown=on_unknown)
    meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    stats = GroupStats(**meta["stats"])
    log_problems(str(path), stats)
    return GroupsDataset(load(directory), stats, str(path))


def load(directory: str | Path) -> "datasets.Dataset":
    """Open an Arrow dataset directory memory-mapped."""
    import datasets  # lazy: datasets

    return datasets.load_from_disk(str(directory), keep_in_memory=False)


@dataclass
class GroupsDataset:
    """Training groups read from Arrow: ``len(groups)``, ``groups[i]`` → :class:`TrainingGroup` (the training
    loop's dataset contract), ``dataset`` for column access, ``stats`` of what reading kept and skipped."""

    dataset: "datasets.Dataset"
    stats: GroupStats = field(default_factory=GroupStats)
    path: str | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> TrainingGroup:
        row = self.dataset[int(index)]
        return TrainingGroup(row["query_id"], row["query"], row["positives"], row["negatives"],
                             row["positive_scores"], row["negative_scores"])

    def __iter__(self):
        for row in self.dataset:
            yield TrainingGroup(row["query_id"], row["query"], row["positives"], row["negatives"],
                                row["positive_scores"], row["negative_scores"])

    def select(self, indices: Sequence[int] | range) -> "GroupsDataset":
        """The groups at ``indices`` (a range is a contiguous view; other indices are kept in memory)."""
        view = self.dataset.select(indices, keep_in_memory=not isinstance(indices, range))
        return GroupsDataset(view, self.stats, self.path)

    def trainable(self, need_negatives: bool, max_groups: int | None = None) -> "GroupsDataset":
        """The groups a trainer draws from: those with negatives when ``need_negatives`` (the others counted in
        ``stats.skipped_no_negatives`` and warned about), then the first ``max_groups``. Columns are read, never
        the groups as objects; the result is a contiguous view when it can be. No group left: :class:`InputError`."""
        keep = np.arange(len(self))
        if need_negatives:
            lengths = pc.list_value_length(self.dataset.data.column("negatives")).to_numpy(zero_copy_only=False)
            keep = np.nonzero(lengths > 0)[0]
            if len(keep) < len(self):
                self.stats.skipped_no_negatives += len(self) - len(keep)
                logger.warning("%s: skipped %d groups without negatives", self.path, len(self) - len(keep))
        if max_groups is not None:
            keep = keep[:max_groups]
        if not len(keep):
            raise InputError("no usable training group" + (" with negatives" if need_negatives else ""),
                             path=self.path)
        if len(keep) == len(self):
            return self
        contiguous = int(keep[-1]) - int(keep[0]) + 1 == len(keep)
        return self.select(range(int(keep[0]), int(keep[-1]) + 1) if contiguous else keep)


# ------------------------------------------------------------------------------------------- building
def build(table: str, path: str | Path, *, num_proc: int | None = None, cache_dir: str | Path | None = None,
          corpus_dir: Path | None = None, on_unknown: str = "error") -> Path:
    """Build (or find current) the Arrow dataset of ``path``; returns its directory."""
    path = Path(path)
    _open_binary(path).close()  # missing file, directory, no permission: the readers' errors
    target = dataset_path(path, cache_dir)
    settings: dict[str, Any] = {"format": FORMAT, "table": table}
    inputs: dict[str, Path] = {"source": path}
    if table == "groups":
        settings.update(on_unknown=on_unknown, checked_against_corpus=corpus_dir is not None)
        if corpus_dir is not None:
            inputs["corpus"] = corpus_dir
    if artifacts.check(target, settings, inputs, kind=KIND).current:
        return target
    with _building(target):
        status = artifacts.check(target, settings, inputs, kind=KIND)   # another process may have built it meanwhile
        if not status.current:
            _convert(table, path, target, settings, inputs, status, num_proc, corpus_dir, on_unknown)
    return target


@contextlib.contextmanager
def _building(target: Path) -> Iterator[None]:
    """Hold the build lock of ``target`` (``filelock`` on ``.<name>.lock`` beside it): concurrent commands on a fresh
    collection build the dataset once; the others wait, then find it current."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target.parent / f".{target.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("waiting for another process building %s", target)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _convert(table: str, path: Path, target: Path, settings: dict[str, Any], inputs: dict[str, Path],
             status: artifacts.Freshness, num_proc: int | None, corpus_dir: Path | None, on_unknown: str) -> None:
    """Convert ``path`` into the Arrow dataset ``target`` (under the build lock)."""
    if status.exists:
        logger.info("rebuilding %s: %s", target, status.reason)
    size = path.stat().st_size
    num_proc = resolve_num_proc(num_proc, size)
    ranges = byte_ranges(path, part_count(path, num_proc))
    logger.info("converting %s to Arrow (%d parts, %d processes)", path, len(ranges), num_proc)
    with artifacts.write_dir(target, kind=KIND, settings=settings, inputs=inputs) as tmp:
        names = [f"data-{i:05d}-of-{len(ranges):05d}.arrow" for i in range(len(ranges))]
        tasks = [_Part(table, str(path), start, end, str(tmp / name), str(corpus_dir) if corpus_dir else None,
                       on_unknown) for (start, end), name in zip(ranges, names)]
        results = run_parts(_convert_part, tasks, num_proc)
        rows = sum(r.rows for r in results)
        meta: dict[str, Any] = {"rows": rows, "parts": [r.rows for r in results]}
        if table == "groups":
            stats = GroupStats()
            for result in results:
                for name, value in result.stats.items():
                    setattr(stats, name, getattr(stats, name) + value)
            if not rows:
                raise InputError(f"no usable training group ({stats.seen} read, {stats.skipped_no_positives} "
                                 "without positives)", path=path)
            meta["stats"] = stats.as_dict()
        elif not rows:
            raise InputError(_EMPTY[table], path=path)
        _write_state(tmp, names, table, hashlib.sha1(json.dumps([settings, rows]).encode()).hexdigest()[:16])
        if table in _ID_KIND:
            _write_id_index(tmp, results, path, ranges, meta["parts"], _ID_KIND[table])
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _write_state(directory: Path, names: list[str], table: str, fingerprint: str) -> None:
    """``state.json`` and ``dataset_info.json`` as ``Dataset.save_to_disk`` writes them."""
    import datasets  # lazy: datasets

    state = {"_data_files": [{"filename": name} for name in names], "_fingerprint": fingerprint,
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": None}
    (directory / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    info = asdict(datasets.DatasetInfo(features=datasets.Features.from_arrow_schema(SCHEMAS[table])))
    (directory / "dataset_info.json").write_text(json.dumps({key: info[key] for key in sorted(info)}, indent=2),
                                                 encoding="utf-8")


def _write_id_index(directory: Path, results: list["_PartResult"], source: Path, ranges, part_rows: list[int],
                    kind: str) -> None:
    """Sort the parts' id hashes (stable: rows ascending among equal hashes), refuse duplicate ids, save the sorted
    hashes and their rows. Holds 24 bytes per row at most (hashes, their order, the sorted hashes)."""
    hashes = np.concatenate([np.frombuffer(result.hashes, dtype="<u8") for result in results])
    for result in results:
        result.hashes = b""
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    del hashes
    same = np.nonzero(ordered[1:] == ordered[:-1])[0]
    if len(same):
        ids = read_column(directory, "_id")
        duplicate = None  # (row of the second occurrence, row of the first)
        for i in same.tolist():
            second = int(order[i + 1])
            value = ids[second].as_py()
            first, j = None, i
            while j >= 0 and ordered[j] == ordered[i + 1]:  # rows ascend among equal hashes: the last match is first
                if ids[int(order[j])].as_py() == value:
                    first = int(order[j])
                j -= 1
            if first is not None and (duplicate is None or second < duplicate[0]):
                duplicate = (second, first)
        if duplicate is not None:
            second, first = duplicate
            lines = _lines_of_rows(source, ranges, part_rows, [first, second])
            raise InputError(duplicate_id_message(kind, ids[second].as_py(), lines[0]), path=source,
                             line=lines[1], field="_id")
    np.save(directory / HASHES_FILE, ordered)
    np.save(directory / ROWS_FILE, order)


def _lines_of_rows(source: Path, ranges, part_rows: list[int], rows: list[int]) -> list[int]:
    """File line numbers of dataset rows (a rescan of the parts holding them; only for error messages)."""
    starts = np.cumsum([0, *part_rows])
    lines = []
    for row in rows:
        part = int(np.searchsorted(starts, row, side="right") - 1)
        start, end = ranges[part]
        wanted, seen = row - int(starts[part]), -1
        for line_no, line in iter_lines(source, start, end):
            if line.strip():
                seen += 1
                if seen == wanted:
                    lines.append(line_no + (lines_before(source, start) if start else 0))
                    break
    return lines


# -------------------------------------------------------------------------------------- worker side
@dataclass(frozen=True)
class _Part:
    table: str
    source: str
    start: int
    end: int | None
    out: str
    corpus: str | None = None
    on_unknown: str = "error"


@dataclass
class _PartResult:
    rows: int
    hashes: bytes = b""
    stats: dict = field(default_factory=dict)


def _convert_part(part: _Part) -> _PartResult:
    """Parse one byte range of a JSONL file into one Arrow file (in batches)."""
    rows = _ROWS[part.table](part)
    with located_in_part(part.source, part.start):
        with pa.OSFile(part.out, "wb") as sink, pa.ipc.new_stream(sink, SCHEMAS[part.table]) as writer:
            try:
                for line_no, obj in iter_jsonl(part.source, part.start, part.end):
                    rows.add(obj, line_no)
                    if rows.pending() >= BATCH_ROWS:
                        writer.write_batch(rows.batch())
            except InputError:
                rows.finish()  # checks still pending for earlier lines are reported first, as a streaming reader does
                raise
            rows.finish()
            if rows.pending():
                writer.write_batch(rows.batch())
    return _PartResult(rows.count, rows.hashes(), rows.stats())


class _Rows:
    """Accumulates validated rows of one part column-wise; ``batch()`` hands them over as a record batch."""

    table = ""

    def __init__(self, part: _Part):
        self.path = part.source
        self.columns: dict[str, list] = {name: [] for name in SCHEMAS[self.table].names}
        self.count = 0
        self._hashes: list[np.ndarray] = []

    def pending(self) -> int:
        return len(next(iter(self.columns.values())))

    def batch(self) -> pa.RecordBatch:
        if "_id" in self.columns:
            self._hashes.append(hash_ids(self.columns["_id"]))
        batch = pa.RecordBatch.from_pydict(self.columns, schema=SCHEMAS[self.table])
        self.count += batch.num_rows
        self.columns = {name: [] for name in self.columns}
        return batch

    def finish(self) -> None:
        """Called after the last line (before the last batch)."""

    def hashes(self) -> bytes:
        return b"".join(h.tobytes() for h in self._hashes)

    def stats(self) -> dict:
        return {}


class _CorpusRows(_Rows):
    table = "corpus"

    def add(self, obj: dict, line: int) -> None:
        doc = parse_document(obj, self.path, line)
        self.columns["_id"].append(doc.id)
        self.columns["title"].append(doc.title)
        self.columns["text"].append(doc.text)


class _QueryRows(_Rows):
    table = "queries"

    def add(self, obj: dict, line: int) -> None:
        qid, text = parse_query(obj, self.path, line)
        self.columns["_id"].append(qid)
        self.columns["text"].append(text)


class _NotIn:
    """A container of every id except ``unknown`` (what :func:`check_known` needs to see a group's unknown ids)."""

    def __init__(self, unknown: set[str]):
        self.unknown = unknown

    def __contains__(self, doc_id: object) -> bool:
        return doc_id not in self.unknown


_INDEXES: dict[str, IdIndex] = {}  # per worker process: a corpus index opened once for all its parts


class _GroupRows(_Rows):
    """Groups parsed line by line; the corpus check runs per batch (one lookup for all ids of up to 8,192 groups),
    in line order, before any later parse error is raised — so errors come in the streaming reader's order."""

    table = "groups"
    CHECK_EVERY = 1024

    def __init__(self, part: _Part):
        super().__init__(part)
        self.on_unknown = part.on_unknown
        self.index = None
        if part.corpus is not None:
            self.index = _INDEXES.get(part.corpus) or _INDEXES.setdefault(part.corpus, IdIndex.open(part.corpus))
        self.shared_ids: dict[str, str] = {}
        self.unchecked: list[tuple[int, TrainingGroup]] = []
        self._stats = GroupStats()

    def add(self, obj: dict, line: int) -> None:
        self._stats.seen += 1
        group = parse_group(obj, self.path, line, self.shared_ids)
        self.unchecked.append((line, group))
        if len(self.unchecked) >= self.CHECK_EVERY:
            self.finish()

    def pending(self) -> int:
        return len(self.columns["query_id"]) + len(self.unchecked)

    def batch(self) -> pa.RecordBatch:
        self.finish()
        return super().batch()

    def finish(self) -> None:
        unknown: set[str] = set()
        if self.index is not None and self.unchecked:
            unknown = self.index.missing([d for _, g in self.unchecked for d in (*g.positives, *g.negatives)])
        known = _NotIn(unknown)
        for line, group in self.unchecked:
            if unknown and not (unknown.isdisjoint(group.positives) and unknown.isdisjoint(group.negatives)):
                group = check_known(group, known, self.on_unknown, self._stats, self.path, line)
            group = drop_positive_negatives(group, self._stats)
            if not group.positives:
                self._stats.skipped_no_positives += 1
                continue
            self._stats.kept += 1
            for name, value in group.to_dict().items():
                self.columns[name].append(value)
            for name in ("positive_scores", "negative_scores"):
                if len(self.columns[name]) < len(self.columns["query_id"]):
                    self.columns[name].append(None)
        self.unchecked = []
        if len(self.shared_ids) > 1_000_000:
            self.shared_ids.clear()

    def stats(self) -> dict:
        return self._stats.as_dict()


_ROWS = {"corpus": _CorpusRows, "queries": _QueryRows, "groups": _GroupRows}
