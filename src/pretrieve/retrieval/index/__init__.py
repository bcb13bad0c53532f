"""The one on-disk index format, for every representation, and the registry of search back-ends.

An **index directory** holds the encoded passages of one contiguous slice of a corpus::

    meta.json          format, kind (dense | dupmae | sparse | hybrid), count, rows, what encoded it
    ids.npy            document ids, UTF-8 bytes (``S<n>``), memory-mapped on load
    embeddings.npy     float32 [N, d]: the dense vector of every kind that has one (dense, DupMAE's [CLS], hybrid)
    <part>.data.npy    a sparse part as CSR arrays: float32 values,
    <part>.indices.npy term ids (uint16 up to 65,536 terms, else int32), and
    <part>.indptr.npy  row pointers (int32 below 2³¹ entries, else int64), and ``<part>.shape.npy`` [rows, vocabulary]
                       — ``sparse`` (SPLADE), ``ot`` (DupMAE)
    artifact.json      the freshness sidecar (:mod:`pretrieve.artifacts`): settings, input fingerprints, and the
                       size and SHA-1 of every file above

It is written atomically through :func:`pretrieve.artifacts.write_dir` (:func:`writing`), and a corpus index is
reused only when :func:`pretrieve.artifacts.check` says it was made by the same model weights, settings and texts
(:func:`is_current`): a zero-byte or truncated ``embeddings.npy`` is re-encoded, never reported cached.
:func:`open_index` refuses a directory whose files no longer match its sidecar.

A corpus too large for one directory is split into **shards**: ``shard-I-of-N`` directories (contiguous row
ranges, :func:`pretrieve.ranks.shard_bounds`), each an index directory, searched one at a time with a streaming
top-k merge (:mod:`pretrieve.retrieval.search`); :func:`find_shards` returns the complete set or says what is
missing.

Parts are streamed to disk window by window as the batch encoder produces them (:func:`write_parts`), so
encoding needs memory for one window, not for the corpus. Each representation kind has a back-end module
(:data:`BACKENDS`) that turns an opened directory into a searcher: :mod:`~pretrieve.retrieval.index.dense`
(FAISS), :mod:`~pretrieve.retrieval.index.dupmae` (CLS + OT), :mod:`~pretrieve.retrieval.index.sparse`
(sparse and hybrid). Adding a representation = one modeling file + one back-end module registered here. Lexical engines are
back-ends too (:data:`LEXICAL_BACKENDS`, the :class:`LexicalBackend` contract; BM25 is
:mod:`pretrieve.retrieval.bm25`): a new one is one module plus its line there (or :func:`register_lexical`), and
:mod:`pretrieve.retrieval.runs` writes its run files and negatives.

**The back-end contract**, written down as protocols: a back-end module is a :class:`Backend` — its ``KINDS``,
``resolve_mode(kind, mode)`` (the search mode a request means for that kind, or a
:class:`~pretrieve.errors.ConfigError`) and ``open_searcher(shards, options, mode)`` → a :class:`Searcher` of a
corpus's shards, whose ``search(queries, k)`` gives ``(scores [Q, k'], rows [Q, k'])`` best first (row ``-1``: no
result). A back-end builds it from searchers of one directory, composed (:mod:`pretrieve.retrieval.index.compose`,
the idea of Pyserini's ``HybridSearcher``): shards merged as they come, a weighted sum of two exhaustive scorers
(the hybrid score), reciprocal rank fusion of two searchers' rankings (``rrf``). The
back-ends of representations encoded by a :class:`~pretrieve.modeling.dual_encoder.DualEncoder` (every kind but
``dense``, whose vectors come from :class:`~pretrieve.modeling.sentence_transformer.DenseEncoder`) implement
:class:`PartsEncoder` as well: ``outputs(representation, rep, text_type)`` turns representation rows into index
parts, ``empty_outputs(representation, vocab_size, text_type)`` gives the parts of no text. Top-k arithmetic shared by
all: :mod:`pretrieve.retrieval.index.topk`. :func:`sparse_part_bytes` / :func:`dense_part_bytes` tell what a part
takes on disk per passage.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from pretrieve import artifacts
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json

if TYPE_CHECKING:
    import scipy.sparse as sp

INDEX_FORMAT = "pretrieve-index/1"
ARTIFACT_KIND = "index"
META_FILE = "meta.json"
IDS_FILE = "ids.npy"
EMBEDDINGS = "embeddings"
_SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")
UINT16_TERMS = 1 << 16
"""Vocabularies up to this size store their term ids as uint16."""

SEARCH_MODES = ("dense", "sparse", "hybrid", "rrf")
"""Search modes of sparse/hybrid retrievers (:mod:`pretrieve.retrieval.index.sparse`); other kinds are searched as
trained."""
MODES_BY_KIND = {"sparse": ("sparse",), "hybrid": SEARCH_MODES}

#: representation kind → back-end module
BACKENDS: dict[str, str] = {
    "dense": "pretrieve.retrieval.index.dense",
    "dupmae": "pretrieve.retrieval.index.dupmae",
    "sparse": "pretrieve.retrieval.index.sparse",
    "hybrid": "pretrieve.retrieval.index.sparse",
}

#: lexical engine name → its back-end (a :class:`LexicalBackend`: a module path, imported when first used, or an
#: object registered with :func:`register_lexical`)
LEXICAL_BACKENDS: dict[str, Any] = {
    "bm25": "pretrieve.retrieval.bm25",
}


@dataclass
class SearchOptions:
    """How an index is searched (each back-end reads the fields it knows).

    ``factory`` / ``metric`` / ``nprobe`` / ``ef_search`` / ``train_size``: the FAISS index of dense vectors
    (``Flat`` = exact); ``use_gpu``: None = when FAISS sees a GPU (exact search without FAISS: when torch does);
    ``block_rows``: vectors per exact-search block; ``dense_weight`` / ``sparse_weight``: α, β of the hybrid score
    (None: as trained); ``rrf_k`` / ``rrf_depth``: reciprocal rank fusion of the dense and sparse rankings.
    """

    factory: str = "Flat"
    metric: str = "ip"
    nprobe: int | None = None
    ef_search: int | None = None
    train_size: int | None = None
    use_gpu: bool | None = None
    block_rows: int = 1 << 16
    dense_weight: float | None = None
    sparse_weight: float | None = None
    rrf_k: int = 60
    rrf_depth: int = 1000


class Searcher(Protocol):
    """Searches passages: one index directory, the shards of a corpus in order, or searchers composed of searchers
    (:mod:`pretrieve.retrieval.index.compose`)."""

    count: int
    """How many passages it searches (its rows are ``0 … count - 1``)."""

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of encoded ``queries`` (part name → ``[Q, …]`` rows): ``(scores [Q, k'], rows [Q, k'])``, best
        first (row ``-1``: no result)."""
        ...


class Backend(Protocol):
    """What a back-end module provides to the search path (:mod:`pretrieve.retrieval.search`)."""

    KINDS: tuple[str, ...]

    def resolve_mode(self, kind: str, mode: str | None) -> str | None:
        """The search mode ``mode`` means for a ``kind`` retriever (None: as trained); refuses an unusable one."""
        ...

    def open_searcher(self, shards: Sequence[IndexDir], options: SearchOptions, mode: str | None = None) -> Searcher:
        """A searcher of the shards of one corpus (in order; its rows are corpus rows) in search mode ``mode``."""
        ...


class PartsEncoder(Protocol):
    """What a back-end of dual-encoder representations provides to the batch encoder (:mod:`pretrieve.retrieval.load`)."""

    def outputs(self, representation: Any, rep: Any, text_type: str) -> dict[str, Any]:
        """A batch of representation rows → index parts (name → ``[B, w]`` array or CSR ``[B, V]``)."""
        ...

    def empty_outputs(self, representation: Any, vocab_size: int, text_type: str) -> dict[str, Any]:
        """The parts of no text (their widths tell the index writer the sizes)."""
        ...


class LexicalIndex(Protocol):
    """A lexical engine's index over one corpus, as its back-end opens it."""

    def iter_search(self, queries: Iterable[tuple[str, str]], k: int = 1000, exclude_self: bool = False,
                    n_threads: int | None = None, show_progress: bool = False,
                    total: int | None = None) -> Iterator[tuple[str, list[tuple[str, float]]]]:
        """``(query_id, [(doc_id, score), ...])`` best first, for each ``(query_id, text)`` in input order."""
        ...


class LexicalBackend(Protocol):
    """What a lexical engine (BM25: :mod:`pretrieve.retrieval.bm25`) provides to the run files
    (:mod:`pretrieve.retrieval.runs`): a run, mined negatives and the CLI's preflight. Its ``params(**options)``
    returns settings whose ``settings()`` dict is recorded with every file made from them."""

    SCRATCH_NAME: str
    """Name of the temporary index directory built beside a run (removed when a killed run left it)."""

    def params(self, **options: Any) -> Any:
        """The engine's settings from named options (validated when an index is opened)."""
        ...

    def open_index(self, corpus_path: str | Path, params: Any, index_dir: str | Path | None = None,
                   scratch_dir: str | Path | None = None,
                   show_progress: bool = False) -> contextlib.AbstractContextManager[LexicalIndex]:
        """The index of ``corpus_path`` (kept in ``index_dir`` while current, else a temporary one in
        ``scratch_dir``), built once when several ranks run."""
        ...

    def index_space(self, corpus_path: str | Path) -> tuple[int, int]:
        """``(bytes, largest file)`` the index of ``corpus_path`` takes at least (the preflight's estimate)."""
        ...


def register_lexical(name: str, engine: Any) -> None:
    """Register a lexical engine under ``name``: a :class:`LexicalBackend` object or the path of its module."""
    LEXICAL_BACKENDS[name] = engine


def lexical_backend(name: str) -> LexicalBackend:
    """The lexical engine registered as ``name``."""
    if name not in LEXICAL_BACKENDS:
        raise ConfigError(f"no lexical engine '{name}' (known: {', '.join(LEXICAL_BACKENDS)})")
    engine = LEXICAL_BACKENDS[name]
    return importlib.import_module(engine) if isinstance(engine, str) else engine


def backend(kind: str) -> Backend:
    """The back-end module searching indexes of representation ``kind``."""
    if kind not in BACKENDS:
        raise ConfigError(f"no search back-end for representation '{kind}' (known: {', '.join(BACKENDS)})")
    return importlib.import_module(BACKENDS[kind])


# ------------------------------------------------------------------------------------------------- shards
def shard_dir_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard}-of-{num_shards}"


def find_shards(root: str | Path) -> list[Path]:
    """The complete set of shard directories in ``root`` (or ``root`` itself if it is an index), in order.

    Missing shards, or shards of different splittings mixed in one directory, raise :class:`InputError`.
    """
    root = Path(root)
    if (root / META_FILE).exists():
        return [root]
    if not root.is_dir():
        raise InputError("index directory not found", path=root)
    found: dict[int, dict[int, Path]] = {}
    for child in root.iterdir():
        match = _SHARD_DIR.match(child.name)
        if match and child.is_dir():
            found.setdefault(int(match.group(2)), {})[int(match.group(1))] = child
    if not found:
        raise InputError("no index shards (shard-I-of-N directories) found; run `pretrieve encode` first",
                         path=root)
    if len(found) > 1:
        raise InputError(f"shards of different splittings mixed ({', '.join(f'of-{n}' for n in sorted(found))}); "
                         "keep one", path=root)
    (num_shards, shards), = found.items()
    missing = sorted(set(range(num_shards)) - set(shards))
    if missing:
        raise InputError(f"missing shard(s) {', '.join(map(str, missing))} of {num_shards}; run `pretrieve encode "
                         f"--shard I --num-shards {num_shards}` for them", path=root)
    return [shards[i] for i in range(num_shards)]


# --------------------------------------------------------------------------------------------- reading
@dataclass
class IndexDir:
    """An index directory as opened: its path and ``meta.json``; arrays and ids are read on demand."""

    path: Path
    meta: dict[str, Any]
    _ids: np.ndarray | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    @property
    def count(self) -> int:
        return int(self.meta["count"])

    @property
    def first_row(self) -> int:
        """The corpus row of this directory's first passage (0 unless it is a shard)."""
        return int((self.meta.get("rows") or [0])[0])

    @property
    def ids(self) -> np.ndarray:
        """Document ids as a memory-mapped bytes array (decode with :func:`decode_ids`)."""
        if self._ids is None:
            self._ids = np.load(self.path / IDS_FILE, mmap_mode="r")
        return self._ids

    def id_list(self) -> list[str]:
        return decode_ids(self.ids)

    def has(self, name: str) -> bool:
        return (self.path / f"{name}.npy").exists() or (self.path / f"{name}.data.npy").exists()

    def array(self, name: str, mmap: bool = True) -> np.ndarray:
        """A dense part (``<name>.npy``), memory-mapped by default."""
        return np.load(self.path / f"{name}.npy", mmap_mode="r" if mmap else None)

    def matrix(self, name: str) -> sp.csr_matrix:
        """A sparse part (``<name>.{data,indices,indptr,shape}.npy``) as a CSR matrix in memory (int32 term ids)."""
        return load_csr(self.path, name)


def open_index(path: str | Path, kind: str | None = None) -> IndexDir:
    """Open an index directory, refusing one that is not ours, incomplete, or modified since it was written."""
    path = Path(path)
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise InputError(f"not a pretrieve index ({META_FILE} missing or unreadable)", path=path) from None
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        raise InputError(f"not a pretrieve index of format {INDEX_FORMAT} (found {meta.get('format')!r}); "
                         "encode it again", path=path)
    sidecar = artifacts.read_sidecar(path)
    problem = ("it has no record of how it was written (interrupted?)" if sidecar is None
               else artifacts.content_problem(path, sidecar.get("content", {})))
    if problem:
        raise InputError(f"incomplete or modified index: {problem}; encode it again", path=path)
    if kind is not None and meta.get("kind") != kind:
        raise InputError(f"a '{meta.get('kind')}' index, not a '{kind}' one", path=path)
    return IndexDir(path, meta)


def is_current(path: str | Path, settings: Mapping[str, Any], inputs: Mapping[str, str | Path]) -> artifacts.Freshness:
    """Whether the index at ``path`` was written with ``settings`` from ``inputs`` and is intact."""
    return artifacts.check(path, settings, inputs, kind=ARTIFACT_KIND)


# ---------------------------------------------------------------------------------------------- writing
@contextlib.contextmanager
def writing(path: str | Path, kind: str, ids: Sequence[str] | Callable[[], Sequence[str]], meta: Mapping[str, Any],
            settings: Mapping[str, Any], inputs: Mapping[str, str | Path] | None = None) -> Iterator[Path]:
    """Write an index directory atomically: yields a temporary directory for the parts; ``ids.npy`` and
    ``meta.json`` (with ``parts``: the names of the parts found) are added, then the directory replaces ``path``
    and its freshness sidecar is recorded. ``ids`` may be a function, called once the parts are written (so the
    ids of a large corpus are not held while it is encoded)."""
    with artifacts.write_dir(path, kind=ARTIFACT_KIND, settings=settings, inputs=inputs or {}) as tmp:
        yield tmp
        if callable(ids):
            ids = ids()
        save_ids(tmp, ids)
        parts = sorted({file.name.split(".")[0] for file in tmp.glob("*.npy") if file.name != IDS_FILE})
        write_json(tmp / META_FILE, {"format": INDEX_FORMAT, "kind": kind, "count": len(ids), **meta,
                                     "parts": parts})


def save_ids(directory: Path, ids: Sequence[str]) -> None:
    encoded = [str(doc_id).encode("utf-8") for doc_id in ids]
    width = max((len(doc_id) for doc_id in encoded), default=1)
    np.save(directory / IDS_FILE, np.array(encoded, dtype=f"S{max(1, width)}"))


def decode_ids(ids: np.ndarray) -> list[str]:
    return [doc_id.decode("utf-8") for doc_id in ids.tolist()]


def save_arrays(directory: Path, parts: Mapping[str, Any]) -> None:
    """Write whole parts (arrays or CSR matrices) into an index directory being written."""
    write_parts(directory, [parts])


def term_id_dtype(dim: int) -> type:
    """The narrowest stored type for term ids in ``[0, dim)``: uint16 up to 65,536 terms, else int32 (int64 beyond)."""
    if dim <= UINT16_TERMS:
        return np.uint16
    return np.int32 if dim <= np.iinfo(np.int32).max else np.int64


def row_pointer_dtype(nnz: int) -> type:
    """Row pointers: int32 below 2³¹ stored entries, else int64 (scipy's own rule)."""
    return np.int32 if nnz <= np.iinfo(np.int32).max else np.int64


class ArrayWriter:
    """Appends rows to an ``.npy`` file whose header (the final shape) is written when it is closed."""

    HEADER = 128

    def __init__(self, path: Path, dtype: Any):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.width: int | None = None
        self.rows = 0
        self.handle = open(path, "wb")
        self.handle.write(b"\0" * self.HEADER)

    def append(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtype)
        width = array.shape[1] if array.ndim == 2 else 0
        if self.width is None:
            self.width = width
        elif width != self.width:
            raise ValueError(f"{self.path.name}: rows of width {width} after rows of width {self.width}")
        self.handle.write(array.tobytes())
        self.rows += array.shape[0]

    def close(self) -> None:
        shape = (self.rows, self.width) if self.width else (self.rows,)
        header = repr({"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape})
        body = header.ljust(self.HEADER - 10 - 1) + "\n"
        self.handle.seek(0)
        self.handle.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1"))
        self.handle.close()


def write_parts(directory: str | Path, windows: Iterable[Mapping[str, Any]],
                columns: Mapping[str, int] | None = None) -> int:
    """Stream windows of outputs (name → ``[n, w]`` array or CSR ``[n, V]``) into ``directory`` as they come:
    arrays to ``<name>.npy`` (float32, or int32 for integer parts), CSR parts to their arrays. Returns the number
    of rows. ``columns`` gives the vocabulary size of sparse parts (term-id width) when known."""
    import scipy.sparse as sp  # lazy: scipy

    directory = Path(directory)
    writers: dict[str, Any] = {}
    rows = 0
    try:
        for outputs in windows:
            count = None
            for name, value in outputs.items():
                if sp.issparse(value):
                    value = sp.csr_matrix(value)
                    if name not in writers:
                        writers[name] = _CsrWriter(directory, name, int((columns or {}).get(name, value.shape[1])))
                else:
                    value = np.asarray(value)
                    if name not in writers:
                        dtype = np.int32 if np.issubdtype(value.dtype, np.integer) else np.float32
                        writers[name] = ArrayWriter(directory / f"{name}.npy", dtype)
                writers[name].append(value)
                count = value.shape[0]
            rows += count or 0
    finally:
        for writer in writers.values():
            writer.close()
    return rows


class _CsrWriter:
    """Appends CSR rows to ``<name>.data.npy`` / ``.indices.npy`` / ``.indptr.npy`` (+ ``.shape.npy``)."""

    def __init__(self, directory: Path, name: str, vocab: int):
        self.vocab = vocab
        self.shape_path = directory / f"{name}.shape.npy"
        self.data = ArrayWriter(directory / f"{name}.data.npy", np.float32)
        self.indices = ArrayWriter(directory / f"{name}.indices.npy", term_id_dtype(vocab))
        self.indptr_path = directory / f"{name}.indptr.npy"
        self.counts: list[np.ndarray] = []

    def append(self, matrix: sp.csr_matrix) -> None:
        if matrix.shape[1] != self.vocab:
            raise ValueError(f"sparse rows of {matrix.shape[1]} columns for a vocabulary of {self.vocab}")
        matrix.sort_indices()
        self.data.append(matrix.data.astype(np.float32))
        self.indices.append(matrix.indices)
        self.counts.append(np.diff(matrix.indptr).astype(np.int64))

    def close(self) -> None:
        self.data.close()
        self.indices.close()
        counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int64)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        np.save(self.indptr_path, indptr.astype(row_pointer_dtype(int(indptr[-1]))))
        np.save(self.shape_path, np.array([len(indptr) - 1, self.vocab], dtype=np.int64))


def load_csr(directory: str | Path, name: str) -> sp.csr_matrix:
    """Read a sparse part written by :func:`write_parts` (term ids widened to int32 for scipy's products)."""
    import scipy.sparse as sp  # lazy: scipy

    directory = Path(directory)
    rows, columns = (int(size) for size in np.load(directory / f"{name}.shape.npy"))
    data = np.load(directory / f"{name}.data.npy")
    indices = np.load(directory / f"{name}.indices.npy")
    indptr = np.load(directory / f"{name}.indptr.npy")
    index_type = np.int32 if columns <= np.iinfo(np.int32).max else np.int64
    return sp.csr_matrix((data, indices.astype(index_type), indptr), shape=(rows, columns))


def sparse_part_bytes(index: IndexDir, name: str) -> dict[str, float]:
    """Bytes of a sparse part as stored (values, term ids and row pointers; not its 16-byte shape): ``total``,
    ``per_document``, ``per_entry`` (term id + value) and ``entries_per_document``."""
    arrays = [np.load(index.path / f"{name}.{array}.npy", mmap_mode="r") for array in ("data", "indices", "indptr")]
    total = sum(array.nbytes for array in arrays)
    entries, documents = arrays[0].shape[0], max(1, index.count)
    return {"total": float(total), "per_document": total / documents,
            "per_entry": float(arrays[0].itemsize + arrays[1].itemsize), "entries_per_document": entries / documents}


def dense_part_bytes(index: IndexDir, name: str = EMBEDDINGS) -> float:
    """Bytes per passage of a dense part as stored (0 when the index has none)."""
    if not index.has(name):
        return 0.0
    array = index.array(name)
    return float(array.shape[1] * array.itemsize)
