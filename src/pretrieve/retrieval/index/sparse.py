"""Sparse back-end: an inverted index for sparse vectors, and search of sparse/hybrid fine-tuned models.

**The inverted index** (:class:`SparseIndex`) holds one sparse vector per document over a vocabulary of ``dim``
terms — DupMAE's top-k ordinary-token vectors (eq. 11 of "RetroMAE v2 / DupMAE: Duplex Masked Auto-Encoder"),
SPLADE-style term weights, any bag of weighted terms — in two scipy layouts built from
the same data: the **forward** matrix ``[N, dim]`` (CSR: a row = one document's (term, weight) pairs), what is
stored and what :meth:`SparseIndex.score_rows` reads to score given candidates; and the **inverted** index
``[dim, N]`` (CSR of the transpose: row ``t`` = the posting list of term ``t``), derived on first use, what
:meth:`SparseIndex.search` accumulates over. Search is exact: for a block of queries the scores against every
document are accumulated (``Q @ postings``: scipy's sparse×sparse product for sparse queries, which visits exactly
the posting lists of the query's terms, or sparse×dense for dense queries) and the top ``k`` taken with
``argpartition``; ties are broken by document row, ascending. Query blocks keep the dense score block under
``block_elements`` floats (2²⁶ = 256 MB). Storage (:meth:`SparseIndex.storage_bytes`, the saved layout): float32
weights, term ids as uint16 when every id fits (``dim ≤ 65536``: BERT's 30,522 and RoBERTa's 50,265) else int32,
row pointers int32 (int64 from 2³¹ entries) — ``nnz·(4 + 2) + (N + 1)·4`` bytes for a BERT vocabulary; in memory
scipy widens term ids to int32.

**Sparse and hybrid models** (the representations of "CoT-MoTE: Contextual Masked Auto-Encoder with
Mixture-of-Textual-Experts", Table 3; :mod:`pretrieve.modeling.representations.sparse`) encode a
text into a SPLADE vector ``w`` (``[V]``) and, for ``hybrid``, a dense [CLS] vector ``h`` beside it. One encoding of
the corpus serves four search modes (:data:`SEARCH_MODES`):

========== ========================================================================= ===============
mode       score of query ``q`` and passage ``d``                                    models
========== ========================================================================= ===============
``dense``  ``h_q · h_d`` — the [CLS] part (any FAISS factory, see the dense back-end) hybrid
``sparse`` ``w_q · w_d`` — the SPLADE part, through the inverted index              sparse, hybrid
``hybrid`` ``α·(h_q · h_d) + β·(w_q · w_d)`` (eq. 6) with the α, β the model was    hybrid
           trained with (``representation.dense_weight`` / ``sparse_weight``;
           overridable)
``rrf``    reciprocal rank fusion of the dense and the sparse top-``N``:             hybrid
           ``Σ 1 / (60 + rank)`` over the lists that hold ``d`` (Cormack et al.
           2009, ``k = 60``; ``N = max(k, rrf_depth)``, default 1000)
========== ========================================================================= ===============

By default a model is searched as it was trained: ``hybrid`` for a hybrid model, ``sparse`` for a sparse one.
Everything is exact: sparse scores are accumulated over the posting lists of the query's terms only; dense scores
are float32 matrix products with every passage vector. Hybrid scores of a block of queries are computed for every
passage (``α·(Q_h H_dᵀ) + β·(Q_w postings)``) and the top ``k`` taken once — both component searches are
exhaustive anyway, so a candidate-and-rescore search (the DupMAE back-end's) could not skip any of that work.
Over several shards, the rrf mode fuses the *global* dense and sparse rankings (:mod:`pretrieve.retrieval.search`).

Texts are encoded with ``DualEncoder.encode(text_type, …)`` (:func:`outputs`): queries by the query tower, passages
by the passage tower; a CoT-MoTE model routes queries through Q-FFN and passages through P-FFN.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp
import torch

from pretrieve.data.trec import Run, run_from_arrays
from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.index import (EMBEDDINGS, MODES_BY_KIND, SEARCH_MODES, IndexDir, open_index, save_arrays,
                                       row_pointer_dtype, term_id_dtype, writing)
from pretrieve.retrieval.index.dense import DenseSearcher
from pretrieve.retrieval.index.topk import DEFAULT_RRF_DEPTH, RRF_K, rrf_fuse, top_k_rows

KINDS = ("sparse", "hybrid")
DEFAULT_BLOCK_ELEMENTS = 1 << 26
_OWN_META = ("format", "kind", "count", "parts")


# ------------------------------------------------------------------------------------------ inverted index
class SparseIndex:
    """Documents as sparse vectors; exact top-k by dot product through posting lists."""

    def __init__(self, matrix: sp.spmatrix | sp.sparray, ids: Sequence[str] | None = None):
        forward = sp.csr_matrix(matrix, dtype=np.float32, copy=True)
        forward.sum_duplicates()
        forward.sort_indices()
        forward.eliminate_zeros()
        if forward.nnz and forward.indices.dtype != np.int32 and forward.shape[1] <= np.iinfo(np.int32).max:
            forward.indices = forward.indices.astype(np.int32)
        self.matrix = forward
        self.ids = [str(i) for i in range(forward.shape[0])] if ids is None else ids
        if len(self.ids) != forward.shape[0]:
            raise InputError(f"sparse index holds {forward.shape[0]} documents but {len(self.ids)} ids were given")
        self._postings: sp.csr_matrix | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_topk(cls, indices: np.ndarray, values: np.ndarray, dim: int,
                  ids: Sequence[str] | None = None) -> "SparseIndex":
        """From per-document ``(indices [N, k], values [N, k])`` pairs (e.g. DupMAE's top-k OT entries).

        Index ``-1`` marks padding; zero values are dropped; repeated indices in a row are summed.
        """
        return cls(topk_matrix(indices, values, dim), ids)

    @classmethod
    def from_dense(cls, vectors: np.ndarray, ids: Sequence[str] | None = None) -> "SparseIndex":
        """From dense ``[N, dim]`` rows; zeros are not stored."""
        return cls(sp.csr_matrix(np.asarray(vectors, dtype=np.float32)), ids)

    # ------------------------------------------------------------------ properties
    def __len__(self) -> int:
        return self.matrix.shape[0]

    @property
    def dim(self) -> int:
        return self.matrix.shape[1]

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz)

    @property
    def postings(self) -> sp.csr_matrix:
        """The inverted index ``[dim, N]``: row ``t`` lists the documents holding term ``t`` and their weights."""
        if self._postings is None:
            self._postings = self.matrix.T.tocsr()
            self._postings.sort_indices()
        return self._postings

    def storage_bytes(self) -> dict[str, float]:
        """Bytes of the forward CSR as saved: total, per document, and per stored entry (term id + value)."""
        per_entry = self.matrix.data.itemsize + np.dtype(term_id_dtype(self.dim)).itemsize
        pointers = (len(self) + 1) * np.dtype(row_pointer_dtype(self.nnz)).itemsize
        total = self.nnz * per_entry + pointers
        return {"total": float(total), "per_document": total / max(1, len(self)), "per_entry": float(per_entry),
                "entries_per_document": self.nnz / max(1, len(self))}

    # ------------------------------------------------------------------ scoring
    def score_all(self, queries) -> np.ndarray:
        """Exact dot products of every query with every document: float32 ``[Q, N]`` (one block; see search)."""
        queries = self._check_queries(queries)
        if sp.issparse(queries):
            return np.asarray((queries @ self.postings).toarray(), dtype=np.float32)
        return np.asarray(queries @ self.postings, dtype=np.float32)

    def score_rows(self, queries, rows: np.ndarray) -> np.ndarray:
        """Dot products of query ``q`` with the documents ``rows[q]`` (``[Q, C]``; row ``-1`` scores ``-inf``)."""
        queries = self._check_queries(queries)
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[0] != queries.shape[0]:
            raise InputError(f"rows must be [Q, C] with Q = {queries.shape[0]}, got {rows.shape}")
        scores = np.full(rows.shape, -np.inf, dtype=np.float32)
        for q in range(rows.shape[0]):
            valid = rows[q] >= 0
            if not valid.any():
                continue
            docs = self.matrix[rows[q][valid]]
            query = queries[q]
            product = docs @ (query.T if sp.issparse(query) else np.asarray(query).ravel())
            scores[q, valid] = np.asarray(product.toarray() if sp.issparse(product) else product).ravel()
        return scores

    def search(self, queries, k: int, block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k``: ``(scores [Q, k'], rows [Q, k'])`` with ``k' = min(k, N)``, best first (ties: lower row)."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        queries = self._check_queries(queries)
        count, k = queries.shape[0], min(k, len(self))
        scores = np.zeros((count, k), dtype=np.float32)
        rows = np.zeros((count, k), dtype=np.int64)
        if count == 0 or k == 0:
            return scores, rows
        block = max(1, block_elements // max(1, len(self)))
        for start in range(0, count, block):
            block_scores = self.score_all(queries[start:start + block])
            rows[start:start + block] = top_k_rows(block_scores, k)
            scores[start:start + block] = np.take_along_axis(block_scores, rows[start:start + block], axis=1)
        return scores, rows

    def search_run(self, queries, query_ids: Sequence[str], k: int) -> Run:
        scores, rows = self.search(queries, k)
        return run_from_arrays(query_ids, self.ids, rows, scores)

    def _check_queries(self, queries):
        if sp.issparse(queries):
            queries = sp.csr_matrix(queries, dtype=np.float32)
        else:
            queries = np.asarray(queries, dtype=np.float32)
            if queries.ndim == 1:
                queries = queries[None, :]
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise InputError(f"queries of shape {queries.shape} do not match the index dimension {self.dim}")
        return queries

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the documents as an index directory (kind ``sparse``, the ``sparse`` part only), atomically."""
        return SpladeIndex(self.ids, self).save(path)

    @classmethod
    def load(cls, path: str | Path) -> "SparseIndex":
        return SpladeIndex.load(path).sparse


def topk_matrix(indices: np.ndarray, values: np.ndarray, dim: int) -> sp.csr_matrix:
    """CSR ``[N, dim]`` from per-row ``(indices [N, k], values [N, k])`` pairs (e.g. DupMAE's top-k OT entries).

    Index ``-1`` marks padding; zero values are dropped; repeated indices in a row are summed.
    """
    indices, values = np.asarray(indices), np.asarray(values, dtype=np.float32)
    if indices.shape != values.shape or indices.ndim != 2:
        raise InputError(f"indices {indices.shape} and values {values.shape} must be two [N, k] arrays")
    if indices.size and (indices.max() >= dim or indices.min() < -1):
        raise InputError(f"term indices must lie in [0, {dim}) (or be -1 for padding)")
    rows = np.repeat(np.arange(indices.shape[0]), indices.shape[1])
    keep = (indices.ravel() >= 0) & (values.ravel() != 0)
    matrix = sp.csr_matrix((values.ravel()[keep], (rows[keep], indices.ravel()[keep])),
                           shape=(indices.shape[0], dim), dtype=np.float32)
    matrix.sum_duplicates()
    return matrix



# ------------------------------------------------------------------------------------------- sparse/hybrid
@dataclass
class EncodedTexts:
    """Encodings of ``N`` texts: the dense [CLS] part ``[N, H]`` (hybrid models; else None) and the SPLADE part
    as a CSR matrix ``[N, V]``."""

    dense: np.ndarray | None
    sparse: sp.csr_matrix

    def __len__(self) -> int:
        return self.sparse.shape[0]


def as_encoded(queries: EncodedTexts | Mapping[str, Any]) -> EncodedTexts:
    """Batch-encoder outputs (``{"embeddings", "sparse"}``) as :class:`EncodedTexts`."""
    if isinstance(queries, EncodedTexts):
        return queries
    if "sparse" not in queries:
        raise InputError("sparse search needs the queries' sparse vectors")
    return EncodedTexts(queries.get(EMBEDDINGS), sp.csr_matrix(queries["sparse"], dtype=np.float32))


def outputs(representation, rep: torch.Tensor, text_type: str) -> dict[str, Any]:
    """A batch of sparse/hybrid representation rows → ``{"sparse": CSR [B, V]}`` (+ ``"embeddings"`` [B, H])."""
    rep = rep.float()
    if representation.kind == "hybrid":
        dense, sparse = representation.split(rep)
    elif representation.kind == "sparse":
        dense, sparse = None, rep
    else:
        raise ConfigError(f"representation '{representation.kind}' is neither sparse nor hybrid")
    parts: dict[str, Any] = {"sparse": sp.csr_matrix(sparse.cpu().numpy().astype(np.float32))}
    if dense is not None:
        parts[EMBEDDINGS] = dense.cpu().numpy().astype(np.float32)
    return parts


def empty_outputs(representation, vocab_size: int, text_type: str) -> dict[str, Any]:
    parts: dict[str, Any] = {"sparse": sp.csr_matrix((0, vocab_size), dtype=np.float32)}
    if representation.kind == "hybrid":
        parts[EMBEDDINGS] = np.zeros((0, representation.hidden_size), np.float32)
    return parts


def resolve_mode(kind: str, mode: str | None) -> str:
    """``mode``, or the model's trained representation when None; :class:`ConfigError` for an unusable one."""
    if kind not in MODES_BY_KIND:
        raise ConfigError(f"search modes need a model fine-tuned with the sparse or hybrid representation, "
                          f"not '{kind}'")
    if mode is None:
        return kind
    if mode not in SEARCH_MODES:
        raise ConfigError(f"unknown search mode '{mode}' (choose from {', '.join(SEARCH_MODES)})")
    if mode not in MODES_BY_KIND[kind]:
        raise ConfigError(f"search mode '{mode}' needs the dense [CLS] part of a 'hybrid' model; this model was "
                          f"fine-tuned with the '{kind}' representation (modes: {', '.join(MODES_BY_KIND[kind])})")
    return mode



def hybrid_weights(representation, dense_weight: float | None = None,
                   sparse_weight: float | None = None) -> tuple[float, float]:
    """α and β: the overrides, else the ones the model was trained with (1, 1 for a sparse model)."""
    alpha = dense_weight if dense_weight is not None else getattr(representation, "dense_weight", 1.0)
    beta = sparse_weight if sparse_weight is not None else getattr(representation, "sparse_weight", 1.0)
    return float(alpha), float(beta)


class SpladeIndex:
    """The encoded corpus of a sparse/hybrid model: dense [CLS] rows (or None) + a :class:`SparseIndex`."""

    def __init__(self, ids: Sequence[str], sparse: SparseIndex, dense: np.ndarray | None = None,
                 meta: Mapping[str, Any] | None = None):
        self.ids = ids
        self.sparse = sparse
        self.dense = None if dense is None else np.ascontiguousarray(dense, dtype=np.float32)
        for name, size in (("sparse", len(sparse)), ("dense", None if dense is None else len(dense))):
            if size is not None and size != len(self.ids):
                raise InputError(f"the {name} part holds {size} passages but {len(self.ids)} ids were given")
        self.meta = dict(meta or {})

    @classmethod
    def from_encoded(cls, ids: Sequence[str], encoded: EncodedTexts | Mapping[str, Any],
                     meta: Mapping[str, Any] | None = None) -> "SpladeIndex":
        encoded = as_encoded(encoded)
        return cls(ids, SparseIndex(encoded.sparse, ids), encoded.dense, meta)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def modes(self) -> tuple[str, ...]:
        return SEARCH_MODES if self.dense is not None else ("sparse",)

    def storage(self) -> dict[str, float]:
        """Bytes per passage: dense part (float32) and sparse part as stored (see ``SparseIndex.storage_bytes``)."""
        sparse = self.sparse.storage_bytes()
        dense = 0.0 if self.dense is None else float(self.dense.shape[1] * self.dense.itemsize)
        return {"dense_bytes": dense, "sparse_bytes": sparse["per_document"],
                "total_bytes": dense + sparse["per_document"], "sparse_entries": sparse["entries_per_document"]}

    # ------------------------------------------------------------------ scoring
    def scores(self, queries: EncodedTexts | Mapping[str, Any], mode: str, dense_weight: float = 1.0,
               sparse_weight: float = 1.0) -> np.ndarray:
        """Exact ``dense`` / ``sparse`` / ``hybrid`` scores of every query with every passage, float32 ``[Q, N]``."""
        queries = as_encoded(queries)
        self._check(queries, mode)
        if mode == "sparse":
            return self.sparse.score_all(queries.sparse)
        dense = np.asarray(queries.dense, dtype=np.float32) @ self.dense.T
        if mode == "dense":
            return dense
        if mode == "hybrid":
            return (np.float32(dense_weight) * dense
                    + np.float32(sparse_weight) * self.sparse.score_all(queries.sparse)).astype(np.float32)
        raise ConfigError(f"scores(): mode must be dense, sparse or hybrid, got '{mode}'")

    def search(self, queries: EncodedTexts | Mapping[str, Any], k: int, mode: str = "hybrid", dense_weight: float = 1.0,
               sparse_weight: float = 1.0, rrf_k: int = RRF_K, rrf_depth: int = DEFAULT_RRF_DEPTH,
               block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by ``mode``: ``(scores [Q, k'], rows [Q, k'])``, best first; ``k' = min(k, N)`` except for
        ``rrf`` (at most the size of the union of the two lists; missing places are row ``-1``)."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        queries = as_encoded(queries)
        self._check(queries, mode)
        if mode == "rrf":
            depth = min(len(self), max(k, rrf_depth))
            _, dense_rows = self.search(queries, depth, "dense", block_elements=block_elements)
            _, sparse_rows = self.search(queries, depth, "sparse", block_elements=block_elements)
            return rrf_fuse([dense_rows, sparse_rows], k, rrf_k=rrf_k)
        count, k = len(queries), min(k, len(self))
        out_scores = np.zeros((count, k), dtype=np.float32)
        out_rows = np.zeros((count, k), dtype=np.int64)
        block = max(1, block_elements // max(1, len(self)))
        for start in range(0, count, block):
            part = slice(start, start + block)
            block_queries = EncodedTexts(None if queries.dense is None else queries.dense[part], queries.sparse[part])
            scores = self.scores(block_queries, mode, dense_weight, sparse_weight)
            out_rows[part] = top_k_rows(scores, k)
            out_scores[part] = np.take_along_axis(scores, out_rows[part], axis=1)
        return out_scores, out_rows

    def search_run(self, queries: EncodedTexts | Mapping[str, Any], query_ids: Sequence[str], k: int, mode: str = "hybrid",
                   **options: Any) -> Run:
        scores, rows = self.search(queries, k, mode, **options)
        return run_from_arrays(query_ids, self.ids, rows, scores)

    def _check(self, queries: EncodedTexts, mode: str) -> None:
        if mode not in SEARCH_MODES:
            raise ConfigError(f"unknown search mode '{mode}' (choose from {', '.join(SEARCH_MODES)})")
        if mode != "sparse" and (self.dense is None or queries.dense is None):
            raise ConfigError(f"search mode '{mode}' needs the dense [CLS] part (a 'hybrid' model)")
        if queries.sparse.shape[1] != self.sparse.dim:
            raise InputError(f"query vectors have {queries.sparse.shape[1]} terms but the index {self.sparse.dim}")
        if queries.dense is not None and self.dense is not None and queries.dense.shape[1] != self.dense.shape[1]:
            raise InputError(f"dense query vectors have {queries.dense.shape[1]} dimensions but the index "
                             f"{self.dense.shape[1]}")

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write an index directory (``embeddings.npy`` for hybrid, the ``sparse`` CSR part, ids, meta), atomically."""
        kind = "hybrid" if self.dense is not None else "sparse"
        settings = {key: value for key, value in self.meta.items()}
        with writing(path, kind, list(self.ids), self.meta, settings) as tmp:
            parts: dict[str, Any] = {"sparse": self.sparse.matrix}
            if self.dense is not None:
                parts[EMBEDDINGS] = self.dense
            save_arrays(tmp, parts)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path | IndexDir) -> "SpladeIndex":
        index = path if isinstance(path, IndexDir) else open_index(path)
        if index.kind not in KINDS:
            raise InputError(f"a '{index.kind}' index, not a sparse or hybrid one", path=index.path)
        ids = index.id_list()
        meta = {key: value for key, value in index.meta.items() if key not in _OWN_META}
        dense = index.array(EMBEDDINGS, mmap=False) if index.has(EMBEDDINGS) else None
        return cls(ids, SparseIndex(index.matrix("sparse"), ids), dense, meta)


class SparseSearcher:
    """Searches one sparse/hybrid index directory in any mode (a FAISS index for ``dense`` with a factory,
    built on first use)."""

    def __init__(self, index: IndexDir, options):
        self.directory = index
        self.index = SpladeIndex.load(index)
        self.options = options
        self.dense = None

    def search(self, queries: Mapping[str, Any], k: int, mode: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        mode = mode or ("hybrid" if self.index.dense is not None else "sparse")
        if mode == "dense" and self.options.factory != "Flat":
            if self.dense is None:
                self.dense = DenseSearcher(self.directory, self.options)
            return self.dense.search(queries, k)
        return self.index.search(queries, k, mode, dense_weight=self.options.dense_weight,
                                 sparse_weight=self.options.sparse_weight, rrf_k=self.options.rrf_k,
                                 rrf_depth=self.options.rrf_depth)


def open_searcher(index: IndexDir, options, mode: str | None = None) -> SparseSearcher:
    return SparseSearcher(index, options)
