"""FAISS indexes over dense embeddings: build, search, save/load, search across shards, end-to-end dense runs.

:class:`FaissIndex` wraps any ``faiss.index_factory`` string: ``"Flat"`` (exact, the reference;
with ``metric="ip"`` it is an ``IndexFlatIP``), ``"HNSW32"``, ``"IVF256,Flat"``, ``"IVF1024,PQ64"``...
Indexes that need training are trained on the vectors being indexed (or a random sample of
``train_size`` of them); ``nprobe`` (IVF) and ``ef_search`` (HNSW) are applied at build and load time.

:func:`search_shards` searches every shard written by ``encode_corpus`` with its own index and
merges the per-shard top-k by score. Exact search over shards gives the same ranking as over
one index; ties are broken by shard order, then by FAISS' order within a shard.

:func:`search_embeddings` (encode queries, search an embeddings directory) and :func:`dense_run`
(encode corpus and queries, search) are the library side of ``pretrieve search`` / ``pretrieve dense``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pretrieve.data.trec import Run, run_from_arrays
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.retrieval.encode import encode_corpus, encode_queries, find_shards, load_shard

logger = logging.getLogger(__name__)

INDEX_FORMAT = "pretrieve-faiss/1"
_INDEX_FILE = "index.faiss"
_IDS_FILE = "ids.json"
_META_FILE = "index_meta.json"
METRICS = ("ip", "l2")


def _faiss():
    import faiss

    return faiss


def _metric(metric: str) -> int:
    faiss = _faiss()
    if metric == "ip":
        return faiss.METRIC_INNER_PRODUCT
    if metric == "l2":
        return faiss.METRIC_L2
    raise ConfigError(f"unknown metric '{metric}' (choose from {', '.join(METRICS)})")


class FaissIndex:
    """A FAISS index whose rows map to document ids."""

    def __init__(self, index, ids: Sequence[str], factory: str = "Flat", metric: str = "ip"):
        if index.ntotal != len(ids):
            raise InputError(f"index holds {index.ntotal} vectors but {len(ids)} ids were given")
        self.index = index
        self.ids = list(ids)
        self.factory = factory
        self.metric = metric

    @classmethod
    def build(cls, embeddings: np.ndarray, ids: Sequence[str], factory: str = "Flat", metric: str = "ip",
              nprobe: int | None = None, ef_search: int | None = None, train_size: int | None = None,
              seed: int = 0) -> "FaissIndex":
        """Index ``embeddings [N, d]`` (float32); train first when the index type needs it."""
        faiss = _faiss()
        vectors = as_float32(embeddings)
        if vectors.ndim != 2:
            raise InputError(f"embeddings must be a 2-d array, got shape {vectors.shape}")
        if len(vectors) != len(ids):
            raise InputError(f"{len(vectors)} vectors but {len(ids)} ids")
        try:
            index = faiss.index_factory(vectors.shape[1], factory, _metric(metric))
        except RuntimeError as exc:
            raise ConfigError(f"invalid FAISS factory string '{factory}': {first_line(exc)}") from None
        if not index.is_trained:
            sample = vectors
            if train_size is not None and train_size < len(vectors):
                rows = np.random.default_rng(seed).choice(len(vectors), size=train_size, replace=False)
                sample = vectors[np.sort(rows)]
            try:
                index.train(sample)
            except RuntimeError as exc:
                raise ConfigError(f"cannot train FAISS index '{factory}' on {len(sample)} vectors: "
                                  f"{first_line(exc)}") from None
        index.add(vectors)
        built = cls(index, ids, factory, metric)
        built.set_search_params(nprobe=nprobe, ef_search=ef_search)
        return built

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """IVF ``nprobe`` / HNSW ``efSearch`` (ignored, with a warning, by index types without them)."""
        faiss = _faiss()
        for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
            if value is None:
                continue
            try:
                faiss.ParameterSpace().set_index_parameter(self.index, name, int(value))
            except RuntimeError:
                logger.warning("FAISS index '%s' has no parameter %s; ignored", self.factory, name)

    def __len__(self) -> int:
        return self.index.ntotal

    @property
    def dim(self) -> int:
        return self.index.d

    def search(self, query_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query: ``(scores [Q, k'], rows [Q, k'])`` with ``k' = min(k, N)``, best first.

        For ``metric="l2"`` scores are negated squared distances, so larger is always better.
        """
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        queries = as_float32(query_emb)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise InputError(f"query embeddings of shape {queries.shape} do not match index dimension {self.dim}")
        k = min(k, len(self))
        if len(queries) == 0 or k == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        scores, rows = self.index.search(queries, k)
        if self.metric == "l2":
            scores = -scores
        return scores, rows

    def search_run(self, query_emb: np.ndarray, query_ids: Sequence[str], k: int) -> Run:
        scores, rows = self.search(query_emb, k)
        return run_from_arrays(query_ids, self.ids, rows, scores)

    def save(self, path: str | Path) -> Path:
        """Write ``index.faiss`` + ``ids.json`` + ``index_meta.json`` into directory ``path``, atomically."""
        path = Path(path)
        with atomic_dir(path) as tmp:
            _faiss().write_index(self.index, str(tmp / _INDEX_FILE))
            with open(tmp / _IDS_FILE, "w", encoding="utf-8") as handle:
                json.dump(self.ids, handle)
            write_json(tmp / _META_FILE, {"format": INDEX_FORMAT, "factory": self.factory, "metric": self.metric,
                                          "dim": self.dim, "count": len(self)})
        return path

    @classmethod
    def load(cls, path: str | Path, nprobe: int | None = None, ef_search: int | None = None) -> "FaissIndex":
        path = Path(path)
        if not (path / _META_FILE).exists():
            raise InputError(f"not a pretrieve FAISS index ({_META_FILE} missing)", path=path)
        meta = json.loads((path / _META_FILE).read_text(encoding="utf-8"))
        ids = json.loads((path / _IDS_FILE).read_text(encoding="utf-8"))
        loaded = cls(_faiss().read_index(str(path / _INDEX_FILE)), ids, meta["factory"], meta["metric"])
        loaded.set_search_params(nprobe=nprobe, ef_search=ef_search)
        return loaded


def as_float32(array: np.ndarray) -> np.ndarray:
    """C-contiguous float32 (what FAISS requires)."""
    return np.ascontiguousarray(array, dtype=np.float32)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def factory_slug(factory: str, metric: str) -> str:
    """A file-name-safe name for a factory string, e.g. ``IVF256,Flat`` → ``IVF256_Flat.ip``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", factory).strip("_") + f".{metric}"


# ----------------------------------------------------------------------------------------- sharded search
def shard_index(shard_dir: Path, factory: str = "Flat", metric: str = "ip", nprobe: int | None = None,
                ef_search: int | None = None, cache: bool = True) -> FaissIndex:
    """The index of one embeddings shard: exact ``Flat`` indexes are built on the fly; other types are
    built once and cached in ``shard_dir/index.<factory>/`` (rebuilt when the embeddings are newer)."""
    shard = load_shard(shard_dir)
    if factory == "Flat" or not cache:
        return FaissIndex.build(shard.embeddings, shard.ids, factory, metric, nprobe=nprobe, ef_search=ef_search)
    cached = shard_dir / f"index.{factory_slug(factory, metric)}"
    embeddings_file = shard_dir / "embeddings.npy"
    if (cached / _META_FILE).exists() and (cached / _META_FILE).stat().st_mtime >= embeddings_file.stat().st_mtime:
        return FaissIndex.load(cached, nprobe=nprobe, ef_search=ef_search)
    index = FaissIndex.build(shard.embeddings, shard.ids, factory, metric, nprobe=nprobe, ef_search=ef_search)
    index.save(cached)
    return index


def search_shards(query_emb: np.ndarray, query_ids: Sequence[str], shard_dirs: Sequence[str | Path] | str | Path,
                  k: int = 1000, factory: str = "Flat", metric: str = "ip", nprobe: int | None = None,
                  ef_search: int | None = None) -> Run:
    """Search every shard (a list of shard dirs, or an embeddings dir holding them) and merge by score."""
    if isinstance(shard_dirs, (str, Path)):
        shard_dirs = find_shards(shard_dirs)
    if len(query_ids) != len(query_emb):
        raise InputError(f"{len(query_emb)} query vectors for {len(query_ids)} query ids")
    all_scores, all_docs = [], []
    for shard_dir in shard_dirs:
        index = shard_index(Path(shard_dir), factory, metric, nprobe=nprobe, ef_search=ef_search)
        scores, rows = index.search(query_emb, k)
        ids = np.asarray(index.ids + [""], dtype=object)  # row -1 (no result) maps to ""
        all_scores.append(np.where(rows >= 0, scores, -np.inf))
        all_docs.append(ids[rows])
    scores, docs = merge_topk(all_scores, all_docs, k)
    return {qid: {doc: float(score) for doc, score in zip(docs[q].tolist(), scores[q].tolist()) if score != -np.inf}
            for q, qid in enumerate(query_ids)}


def merge_topk(scores: Sequence[np.ndarray], docs: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard ``[Q, k_s]`` results into the global top-``k`` per query (stable: earlier shards win ties)."""
    merged_scores = np.concatenate(scores, axis=1)
    merged_docs = np.concatenate(docs, axis=1)
    order = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(merged_scores, order, axis=1), np.take_along_axis(merged_docs, order, axis=1)


def describe_shards(shard_dirs: Sequence[Path]) -> dict[str, Any]:
    """The encoding settings shared by all shards (``meta.json``); disagreeing shards raise InputError."""
    keys = ("model", "pooling", "normalize", "max_length", "dim", "passage_prompt")
    reference: dict[str, Any] | None = None
    for shard_dir in shard_dirs:
        meta = json.loads((Path(shard_dir) / "meta.json").read_text(encoding="utf-8"))
        settings = {key: meta.get(key) for key in keys}
        if reference is None:
            reference = settings
        elif settings != reference:
            raise InputError(f"shards were encoded with different settings: {settings} vs {reference}",
                             path=shard_dir)
    return reference or {}



# ----------------------------------------------------------------------------------- end-to-end dense search
def search_embeddings(encoder, queries: Mapping[str, str], emb_dir: str | Path, k: int = 1000, factory: str = "Flat",
                      metric: str = "ip", batch_size: int = 64, query_max_length: int | None = None,
                      bf16: bool = False, nprobe: int | None = None, ef_search: int | None = None,
                      show_progress: bool = True) -> Run:
    """Encode ``queries`` with ``encoder`` and search every shard found in ``emb_dir`` (``pretrieve search``).

    The shards' ``meta.json`` must agree with each other; a vector dimension different from the
    encoder's is an error, other differing settings (model, pooling, normalisation) a warning.
    """
    shard_dirs = find_shards(emb_dir)
    check_compatible(encoder, describe_shards(shard_dirs), Path(emb_dir))
    query_ids, query_emb = encode_queries(encoder, queries, batch_size=batch_size, max_length=query_max_length,
                                          bf16=bf16, show_progress=show_progress)
    return search_shards(query_emb, query_ids, shard_dirs, k=k, factory=factory, metric=metric, nprobe=nprobe,
                         ef_search=ef_search)


def check_compatible(encoder, shard_settings: Mapping[str, Any], where: Path) -> None:
    """Raise when query and passage vectors cannot be compared; warn when their settings differ."""
    mine = encoder.describe()
    if shard_settings.get("dim") != mine["dim"]:
        raise InputError(f"passages were encoded into {shard_settings.get('dim')}-d vectors but the query encoder "
                         f"gives {mine['dim']}-d ones ({shard_settings.get('model')} vs {mine['model']})", path=where)
    differing = [f"{key}: {shard_settings.get(key)!r} vs {mine[key]!r}" for key in ("model", "pooling", "normalize")
                 if shard_settings.get(key) != mine[key]]
    if differing:
        logger.warning("query encoder differs from the one that encoded %s (%s)", where, "; ".join(differing))


def dense_run(encoder, corpus, queries: Mapping[str, str], k: int = 1000, cache_dir: str | Path | None = None,
              factory: str = "Flat", metric: str = "ip", batch_size: int = 64, max_length: int | None = None,
              query_max_length: int | None = None, bf16: bool = False, show_progress: bool = True) -> Run:
    """Encode the corpus (cached in ``cache_dir`` when given, else in a temporary directory), encode the
    queries and search (``pretrieve dense``)."""
    with contextlib.ExitStack() as stack:
        emb_dir = Path(cache_dir) if cache_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="pretrieve-emb-")))
        encode_corpus(encoder, corpus, emb_dir, batch_size=batch_size, max_length=max_length, bf16=bf16,
                      show_progress=show_progress)
        return search_embeddings(encoder, queries, emb_dir, k=k, factory=factory, metric=metric,
                                 batch_size=batch_size, query_max_length=query_max_length, bf16=bf16,
                                 show_progress=show_progress)
