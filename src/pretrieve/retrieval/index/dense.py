"""Dense back-end: search over the ``embeddings`` of an index directory, exact or approximate (FAISS), CPU or GPU.

Every representation whose passages are dense vectors is searched here: sentence-transformers and Hugging Face
encoders, pretrieve's fine-tuned dense retrievers (siamese, separate towers, CoT-MoTE experts), and the dense
part of a hybrid model (``--mode dense``).

**Exact search** (``factory="Flat"``, the default and the reference) streams the vectors: they are read from
disk ``block_rows`` at a time (file reads, not a mapping of the whole file), each block is searched with
``faiss.knn`` (inner product or L2) when FAISS is installed, else with a torch matrix product and top-k on the
device the search runs on (CUDA when torch sees a GPU, else the CPU; queries in chunks, so that one chunk's scores
stay under :data:`~pretrieve.retrieval.index.topk.DEFAULT_BLOCK_ELEMENTS` floats), and the per-block top-k are
merged into a running top-k (:func:`merge_topk`). Either way ties are broken by row (score, then the lower row
first), so a run is the same with and without FAISS up to float32 rounding of the scores. Peak memory is one block
of vectors plus the top-k arrays, not the shard. GPU images rarely carry FAISS; exact search needs none.

**Approximate search** takes any ``faiss.index_factory`` string — ``"HNSW32"``, ``"IVF4096,Flat"``,
``"IVF4096,PQ64"``, ``"IVF4096,SQ8"``, ``"Flat"`` with ``SQfp16`` (``"SQfp16"``) … — for every dense-vector
representation, fine-tuned retrievers included. The index is built once per index directory (trained on its
vectors or a random sample of ``train_size`` of them) and kept as a sibling directory
``<index>.<factory>.<metric>/`` in the same on-disk format, reused only while :func:`pretrieve.artifacts.check`
says it was built from the same vectors with the same settings. ``nprobe`` (IVF) and ``ef_search`` (HNSW) are
applied when it is opened. Measured recall against exact search: docs/benchmarks.md.

**GPU.** When the installed FAISS has GPU support and sees a GPU (``faiss.get_num_gpus() > 0``), searches run on
every GPU (``faiss.index_cpu_to_all_gpus``): exact blocks through a GPU flat index, approximate indexes cloned to
the GPUs (index types without a GPU implementation, e.g. HNSW, stay on the CPU with a warning). ``use_gpu=False``
forces the CPU; ``use_gpu=True`` without a GPU is a :class:`~pretrieve.errors.ConfigError`. The ``faiss-cpu``
wheel reports no GPU: with it exact search runs on the CPU, or through torch on CUDA when ``use_gpu=True``.
Without FAISS, exact search runs through torch on CUDA when torch sees a GPU (``use_gpu`` None or True).
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pretrieve import artifacts
from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.index import EMBEDDINGS, SEARCH_MODES, IndexDir, open_index, writing
from pretrieve.retrieval.index.compose import ShardSearcher
from pretrieve.retrieval.index.topk import DEFAULT_BLOCK_ELEMENTS, exhaustive_top_k, merge_topk

logger = logging.getLogger(__name__)

KINDS = ("dense",)
METRICS = ("ip", "l2")
DEFAULT_BLOCK_ROWS = 1 << 16
_FAISS_FILE = "index.faiss"


def _faiss():
    faiss = optional_faiss()
    if faiss is None:   # an extra: faiss-cpu or faiss-gpu, whichever fits the machine
        raise ConfigError("FAISS is not installed: pip install 'pretrieve[faiss]' (CPU) or 'pretrieve[faiss-gpu]' "
                          "(CUDA 12); exact search (--factory Flat) needs none")
    return faiss


def optional_faiss():
    """The ``faiss`` module, or None when it is not installed (exact search then runs through torch)."""
    try:
        import faiss  # optional: faiss
    except ImportError:
        return None
    return faiss


def _metric(metric: str) -> int:
    faiss = _faiss()
    if metric == "ip":
        return faiss.METRIC_INNER_PRODUCT
    if metric == "l2":
        return faiss.METRIC_L2
    raise ConfigError(f"unknown metric '{metric}' (choose from {', '.join(METRICS)})")


def as_float32(array: np.ndarray) -> np.ndarray:
    """C-contiguous float32 (what FAISS requires)."""
    return np.ascontiguousarray(array, dtype=np.float32)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def factory_slug(factory: str, metric: str) -> str:
    """A file-name-safe name for a factory string, e.g. ``IVF256,Flat`` → ``IVF256_Flat.ip``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", factory).strip("_") + f".{metric}"


# --------------------------------------------------------------------------------------------------- GPU
def gpu_count() -> int:
    """GPUs the installed FAISS can use (0 for the faiss-cpu wheel)."""
    get = getattr(_faiss(), "get_num_gpus", None)
    return int(get()) if get is not None else 0


def use_gpus(requested: bool | None) -> bool:
    """``None`` → whether a GPU is available; ``True`` without one is an error."""
    available = gpu_count() > 0
    if requested and not available:
        raise ConfigError("GPU search was requested but the installed FAISS sees no GPU (faiss-cpu, or no device); "
                          "install a FAISS build with GPU support or search on the CPU")
    return available if requested is None else bool(requested)


def to_gpus(index, where: str = "index"):
    """``index`` cloned to every GPU; indexes FAISS cannot put on a GPU stay on the CPU (logged)."""
    try:
        return _faiss().index_cpu_to_all_gpus(index)
    except (RuntimeError, AttributeError) as exc:
        logger.warning("%s stays on the CPU: FAISS cannot put it on the GPU (%s)", where, first_line(exc))
        return index


# ------------------------------------------------------------------------------------------ FAISS index
def build_faiss(vectors: np.ndarray, factory: str = "Flat", metric: str = "ip", train_size: int | None = None,
                seed: int = 0):
    """A FAISS index of ``factory`` over ``vectors [N, d]``, trained first when the index type needs it (on a
    random sample of ``train_size`` rows when given)."""
    faiss = _faiss()
    if vectors.ndim != 2:
        raise InputError(f"embeddings must be a 2-d array, got shape {vectors.shape}")
    try:
        index = faiss.index_factory(int(vectors.shape[1]), factory, _metric(metric))
    except RuntimeError as exc:
        raise ConfigError(f"invalid FAISS factory string '{factory}': {first_line(exc)}") from None
    if not index.is_trained:
        sample = vectors
        if train_size is not None and train_size < len(vectors):
            rows = np.sort(np.random.default_rng(seed).choice(len(vectors), size=train_size, replace=False))
            sample = vectors[rows]
        try:
            index.train(as_float32(sample))
        except RuntimeError as exc:
            raise ConfigError(f"cannot train FAISS index '{factory}' on {len(sample)} vectors: "
                              f"{first_line(exc)}") from None
    for start in range(0, len(vectors), DEFAULT_BLOCK_ROWS):   # add block by block: no full float32 copy
        index.add(as_float32(vectors[start:start + DEFAULT_BLOCK_ROWS]))
    return index


def set_search_params(index, factory: str, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """IVF ``nprobe`` / HNSW ``efSearch`` (ignored, with a warning, by index types without them)."""
    faiss = _faiss()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        if value is None:
            continue
        try:
            faiss.ParameterSpace().set_index_parameter(index, name, int(value))
        except RuntimeError:
            logger.warning("FAISS index '%s' has no parameter %s; ignored", factory, name)


def faiss_search(index, queries: np.ndarray, k: int, metric: str = "ip") -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` per query of a FAISS index: ``(scores [Q, k'], rows [Q, k'])`` with ``k' = min(k, N)``, best
    first. For ``metric="l2"`` scores are negated squared distances, so larger is always better."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    queries = as_float32(queries)
    if queries.ndim != 2 or queries.shape[1] != index.d:
        raise InputError(f"query embeddings of shape {queries.shape} do not match index dimension {index.d}")
    k = min(k, index.ntotal)
    if len(queries) == 0 or k == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    scores, rows = index.search(queries, k)
    if metric == "l2":
        scores = -scores
    return scores, rows


# ----------------------------------------------------------------------------------------- exact search
def read_rows(path: Path, start: int, end: int) -> np.ndarray:
    """Rows ``start:end`` of a 2-d ``.npy`` file by a file read (nothing stays mapped), as float32."""
    header = np.load(path, mmap_mode="r")
    dtype, width, offset = header.dtype, header.shape[1], header.offset
    del header
    with open(path, "rb") as handle:
        handle.seek(offset + start * width * dtype.itemsize)
        block = np.fromfile(handle, dtype=dtype, count=(end - start) * width)
    return as_float32(block.reshape(end - start, width))


def exact_engine(use_gpu: bool | None) -> tuple[str, str]:
    """What runs exact search: ``("faiss", "cuda" | "cpu")`` when FAISS is installed, else ``("torch", device)``.

    FAISS on its GPUs when it sees one (unless ``use_gpu=False``), else FAISS on the CPU — or torch on CUDA when
    ``use_gpu=True`` and only torch sees a GPU. Without FAISS: torch on CUDA when torch sees a GPU and ``use_gpu``
    is not False, else torch on the CPU. ``use_gpu=True`` with no GPU at all is a ConfigError.
    """
    import torch  # lazy: torch

    faiss = optional_faiss()
    torch_gpu = torch.cuda.is_available()
    if faiss is not None and gpu_count() > 0:
        return "faiss", "cpu" if use_gpu is False else "cuda"
    if use_gpu and not torch_gpu:
        raise ConfigError("GPU search was requested but neither FAISS nor torch sees a GPU; search on the CPU")
    if faiss is not None and not use_gpu:
        return "faiss", "cpu"
    return "torch", "cuda" if torch_gpu and use_gpu is not False else "cpu"


def exact_search(queries: np.ndarray, vectors: Path | np.ndarray, k: int, metric: str = "ip",
                 block_rows: int = DEFAULT_BLOCK_ROWS, use_gpu: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of ``queries [Q, d]`` over ``vectors`` (an ``.npy`` path, streamed ``block_rows`` at a time,
    or an array): ``(scores [Q, k'], rows [Q, k'])``, ``k' = min(k, N)``, best first, ties by row. FAISS runs it
    when installed, else torch (:func:`exact_engine`)."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if metric not in METRICS:
        raise ConfigError(f"unknown metric '{metric}' (choose from {', '.join(METRICS)})")
    queries = as_float32(queries)
    count = int(np.load(vectors, mmap_mode="r").shape[0]) if isinstance(vectors, Path) else len(vectors)
    width = int(np.load(vectors, mmap_mode="r").shape[1]) if isinstance(vectors, Path) else vectors.shape[1]
    if queries.ndim != 2 or queries.shape[1] != width:
        raise InputError(f"query embeddings of shape {queries.shape} do not match index dimension {width}")
    engine, device = exact_engine(use_gpu)
    search_block = _faiss_block_search(metric, device) if engine == "faiss" else _torch_block_search(metric, device)
    scores = np.zeros((len(queries), 0), np.float32)
    rows = np.zeros((len(queries), 0), np.int64)
    if len(queries) == 0:
        return scores, rows
    for start in range(0, count, block_rows):
        end = min(count, start + block_rows)
        block = read_rows(vectors, start, end) if isinstance(vectors, Path) else as_float32(vectors[start:end])
        block_scores, block_rows_found = search_block(queries, block, min(k, end - start))
        scores, rows = merge_topk([scores, block_scores], [rows, block_rows_found + start], k)
    return scores, rows


def _faiss_block_search(metric: str, device: str):
    """``(queries, block, depth) -> (scores, rows)`` through FAISS (its GPUs for ``device="cuda"``), best first,
    ties by row (FAISS keeps the lower rows of a tie at the cut; their order among themselves is set here)."""
    faiss = _faiss()

    def search(queries: np.ndarray, block: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        if device == "cuda":
            flat = faiss.IndexFlat(block.shape[1], _metric(metric))
            flat.add(block)
            scores, rows = to_gpus(flat, "exact search").search(queries, depth)
        else:
            scores, rows = faiss.knn(queries, block, depth, metric=_metric(metric))
        scores, rows = (-scores if metric == "l2" else scores), rows.astype(np.int64)
        order = np.lexsort((rows, -scores), axis=1)
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)

    return search


def _torch_block_search(metric: str, device: str, block_elements: int = DEFAULT_BLOCK_ELEMENTS):
    """``(queries, block, depth) -> (scores, rows)`` through torch on ``device``: full-precision float32 products
    (no TF32), queries in chunks of at most ``block_elements`` scores, best first, ties by row."""
    import torch  # lazy: torch

    def search(queries: np.ndarray, block: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = torch.from_numpy(block).to(device)
        norms = (vectors * vectors).sum(dim=1) if metric == "l2" else None
        step = max(1, block_elements // max(1, len(block)))
        scores_out, rows_out = [], []
        with _full_float32(), torch.no_grad():
            for start in range(0, len(queries), step):
                chunk = torch.from_numpy(queries[start:start + step]).to(device)
                scores = chunk @ vectors.T
                if norms is not None:   # negated squared distance, as FAISS computes it for a block
                    scores = -((chunk * chunk).sum(dim=1, keepdim=True) + norms[None, :] - 2 * scores).clamp_min(0)
                top_scores, top_rows = top_k_by_row(scores, depth)
                scores_out.append(top_scores.cpu().numpy())
                rows_out.append(top_rows.cpu().numpy())
        return np.concatenate(scores_out).astype(np.float32), np.concatenate(rows_out).astype(np.int64)

    return search


def top_k_by_row(scores, k: int):
    """Per row of a torch ``scores [Q, N]``, the ``k`` largest ``(values, columns)``, best first, ties by column —
    the lower columns of a tie at the cut are the ones kept (``torch.topk`` alone keeps any of them)."""
    import torch  # lazy: torch

    values, columns = torch.topk(scores, k, dim=1)
    cut = values[:, -1:]
    for q in torch.nonzero((scores == cut).sum(dim=1) != (values == cut).sum(dim=1)).flatten().tolist():
        above = torch.nonzero(scores[q] > cut[q]).flatten()
        at_cut = torch.nonzero(scores[q] == cut[q]).flatten()[:k - len(above)]
        columns[q] = torch.cat([above, at_cut])
        values[q] = scores[q, columns[q]]
    columns, order = columns.sort(dim=1)
    values = values.gather(1, order)
    order = torch.argsort(values, dim=1, descending=True, stable=True)
    return values.gather(1, order), columns.gather(1, order)


@contextlib.contextmanager
def _full_float32():
    """float32 matrix products at full precision (no TF32 / bf16 passes) for the duration."""
    import torch  # lazy: torch

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


# ------------------------------------------------------------------------------------------------ search
def resolve_mode(kind: str, mode: str | None) -> str | None:
    if mode not in (None, "dense"):
        if mode not in SEARCH_MODES:
            raise ConfigError(f"unknown search mode '{mode}' (choose from {', '.join(SEARCH_MODES)})")
        raise ConfigError(f"search mode '{mode}' needs a model fine-tuned with the sparse or hybrid representation; "
                          f"this is a '{kind}' retriever, searched only as trained")
    return None


def approximate_index(index: IndexDir, options):
    """The FAISS index of ``options.factory`` over an index directory's vectors, built once and kept as the sibling
    directory ``<index>.<factory>.<metric>`` (an index directory of kind ``faiss``: ``index.faiss``), reused while
    it was built from the same vectors with the same settings; on the GPUs when they are used."""
    faiss = _faiss()
    cache = index.path.with_name(f"{index.path.name}.{factory_slug(options.factory, options.metric)}")
    settings = {"factory": options.factory, "metric": options.metric, "train_size": options.train_size, "seed": 0}
    inputs = {"embeddings": index.path}
    status = artifacts.check(cache, settings, inputs, kind="index")
    if status.current:
        built = faiss.read_index(str(open_index(cache, kind="faiss").path / _FAISS_FILE))
        set_search_params(built, options.factory, nprobe=options.nprobe, ef_search=options.ef_search)
    else:
        if status.exists:
            logger.info("rebuilding %s: %s", cache, status.reason)
        logger.info("building FAISS index '%s' over %d vectors of %s", options.factory, index.count, index.path)
        built = build_faiss(index.array(EMBEDDINGS), options.factory, options.metric, train_size=options.train_size)
        set_search_params(built, options.factory, nprobe=options.nprobe, ef_search=options.ef_search)
        meta = {"factory": options.factory, "metric": options.metric, "dim": int(built.d)}
        with writing(cache, "faiss", index.id_list(), meta, settings, inputs) as tmp:
            faiss.write_index(built, str(tmp / _FAISS_FILE))
    return to_gpus(built, f"FAISS index '{options.factory}'") if use_gpus(options.use_gpu) else built


class DenseSearcher:
    """Searches the ``embeddings`` of one index directory (exact streaming search or a FAISS index)."""

    def __init__(self, index: IndexDir, options):
        if not index.has(EMBEDDINGS):
            raise InputError("this index has no dense vectors (embeddings.npy)", path=index.path)
        self.index = index
        self.count = index.count
        self.options = options
        self.faiss = None if options.factory == "Flat" else approximate_index(index, options)

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = queries.get(EMBEDDINGS)
        if vectors is None:
            raise InputError("dense search needs query vectors")
        if self.faiss is not None:
            return faiss_search(self.faiss, vectors, k, self.options.metric)
        return exact_search(vectors, self.index.path / f"{EMBEDDINGS}.npy", k, self.options.metric,
                            self.options.block_rows, self.options.use_gpu)


class DenseScorer:
    """Inner products of query vectors with every vector of one index directory, in memory (numpy, float32): the
    dense part of an exhaustive score (the hybrid score of :mod:`pretrieve.retrieval.index.sparse`)."""

    def __init__(self, index: IndexDir, block_elements: int = DEFAULT_BLOCK_ELEMENTS):
        if not index.has(EMBEDDINGS):
            raise InputError("this index has no dense vectors (embeddings.npy)", path=index.path)
        self.vectors = as_float32(index.array(EMBEDDINGS, mmap=False))
        self.count = len(self.vectors)
        self.block_elements = block_elements

    def scores(self, queries: Mapping[str, Any]) -> np.ndarray:
        vectors = queries.get(EMBEDDINGS)
        if vectors is None:
            raise ConfigError("this search needs the dense [CLS] part of the queries (a 'hybrid' model)")
        if vectors.shape[1] != self.vectors.shape[1]:
            raise InputError(f"dense query vectors have {vectors.shape[1]} dimensions but the index "
                             f"{self.vectors.shape[1]}")
        return np.asarray(vectors, dtype=np.float32) @ self.vectors.T

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        return exhaustive_top_k(self.scores, queries, self.count, k, self.block_elements)


def open_searcher(shards: Sequence[IndexDir], options, mode: str | None = None) -> ShardSearcher:
    return ShardSearcher(shards, lambda shard: DenseSearcher(shard, options))
