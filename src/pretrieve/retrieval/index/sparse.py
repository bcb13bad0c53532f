"""Sparse back-end: an inverted index for sparse vectors, and search of sparse/hybrid fine-tuned models.

**The inverted index** (:class:`SparseSearcher`, over one sparse part of an index directory) holds one sparse vector
per document over a vocabulary of ``dim`` terms — DupMAE's top-k ordinary-token vectors (eq. 11 of "RetroMAE v2 /
DupMAE: Duplex Masked Auto-Encoder"), SPLADE-style term weights, any bag of weighted terms — in two scipy layouts
built from the same data: the **forward** matrix ``[N, dim]`` (CSR: a row = one document's (term, weight) pairs),
what is stored and what :meth:`SparseSearcher.score_rows` reads to score given candidates; and the **inverted**
index ``[dim, N]`` (CSR of the transpose: row ``t`` = the posting list of term ``t``), derived on first use, what
:meth:`SparseSearcher.search` accumulates over. Search is exact: for a block of queries the scores against every
document are accumulated (``Q @ postings``: scipy's sparse×sparse product for sparse queries, which visits exactly
the posting lists of the query's terms, or sparse×dense for dense queries) and the top ``k`` taken with
``argpartition``; ties are broken by document row, ascending. Query blocks keep the dense score block under
``block_elements`` floats (2²⁶ = 256 MB). Storage (:func:`storage`, the saved layout): float32 weights, term ids as
uint16 when every id fits (``dim ≤ 65536``: BERT's 30,522 and RoBERTa's 50,265) else int32, row pointers int32
(int64 from 2³¹ entries) — ``nnz·(4 + 2) + (N + 1)·4`` bytes for a BERT vocabulary; in memory scipy widens term ids
to int32.

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
are float32 matrix products with every passage vector (:class:`~pretrieve.retrieval.index.dense.DenseScorer`;
a FAISS index with a factory other than ``Flat``). Each mode is a searcher composed of searchers
(:mod:`pretrieve.retrieval.index.compose`, :func:`open_searcher`): the hybrid score is the weighted sum of the
dense and the sparse scorer of each shard — computed for every passage of a block of queries
(``α·(Q_h H_dᵀ) + β·(Q_w postings)``) and the top ``k`` taken once; both component searches are exhaustive anyway,
so a candidate-and-rescore search (the DupMAE back-end's) could not skip any of that work — and ``rrf`` fuses the
dense and the sparse searcher of all the shards, i.e. the *global* rankings. α and β not given in the options are
the ones recorded with the index's passages (the representation the model was trained with).

Texts are encoded with ``DualEncoder.encode(text_type, …)`` (:func:`outputs`): queries by the query tower, passages
by the passage tower; a CoT-MoTE model routes queries through Q-FFN and passages through P-FFN.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp
import torch

from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.index import (EMBEDDINGS, MODES_BY_KIND, SEARCH_MODES, IndexDir, Searcher, SearchOptions,
                                       dense_part_bytes, sparse_part_bytes)
from pretrieve.retrieval.index.compose import RankFusion, ShardSearcher, WeightedSum
from pretrieve.retrieval.index.dense import DenseScorer, DenseSearcher
from pretrieve.retrieval.index.topk import DEFAULT_BLOCK_ELEMENTS, exhaustive_top_k

KINDS = ("sparse", "hybrid")


# ------------------------------------------------------------------------------------------ inverted index
def forward_rows(matrix: sp.spmatrix | sp.sparray) -> sp.csr_matrix:
    """The forward CSR ``[N, dim]`` as searched: float32 values, duplicates summed, zeros dropped, term ids sorted
    (int32 while they fit)."""
    forward = sp.csr_matrix(matrix, dtype=np.float32, copy=True)
    forward.sum_duplicates()
    forward.sort_indices()
    forward.eliminate_zeros()
    if forward.nnz and forward.indices.dtype != np.int32 and forward.shape[1] <= np.iinfo(np.int32).max:
        forward.indices = forward.indices.astype(np.int32)
    return forward


class SparseSearcher:
    """One sparse part (``part``) of an index directory: exact top-k by dot product through its posting lists."""

    def __init__(self, index: IndexDir, part: str = "sparse", block_elements: int = DEFAULT_BLOCK_ELEMENTS):
        if not index.has(part):
            raise InputError(f"this index has no sparse '{part}' part", path=index.path)
        self.matrix = forward_rows(index.matrix(part))
        if self.matrix.shape[0] != index.count:
            raise InputError(f"the '{part}' part holds {self.matrix.shape[0]} passages but the index {index.count} "
                             "ids", path=index.path)
        self.part = part
        self.count = index.count
        self.block_elements = block_elements
        self._postings: sp.csr_matrix | None = None

    @property
    def dim(self) -> int:
        return self.matrix.shape[1]

    @property
    def postings(self) -> sp.csr_matrix:
        """The inverted index ``[dim, N]``: row ``t`` lists the documents holding term ``t`` and their weights."""
        if self._postings is None:
            self._postings = self.matrix.T.tocsr()
            self._postings.sort_indices()
        return self._postings

    def scores(self, queries: Mapping[str, Any]) -> np.ndarray:
        """Exact dot products of every query with every document: float32 ``[Q, N]`` (one block; see search)."""
        vectors = self._vectors(queries)
        if sp.issparse(vectors):
            return np.asarray((vectors @ self.postings).toarray(), dtype=np.float32)
        return np.asarray(vectors @ self.postings, dtype=np.float32)

    def score_rows(self, queries: Mapping[str, Any], rows: np.ndarray) -> np.ndarray:
        """Dot products of query ``q`` with the documents ``rows[q]`` (``[Q, C]``; row ``-1`` scores ``-inf``)."""
        vectors = self._vectors(queries)
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[0] != vectors.shape[0]:
            raise InputError(f"rows must be [Q, C] with Q = {vectors.shape[0]}, got {rows.shape}")
        scores = np.full(rows.shape, -np.inf, dtype=np.float32)
        for q in range(rows.shape[0]):
            valid = rows[q] >= 0
            if not valid.any():
                continue
            docs = self.matrix[rows[q][valid]]
            query = vectors[q]
            product = docs @ (query.T if sp.issparse(query) else np.asarray(query).ravel())
            scores[q, valid] = np.asarray(product.toarray() if sp.issparse(product) else product).ravel()
        return scores

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k``: ``(scores [Q, k'], rows [Q, k'])`` with ``k' = min(k, N)``, best first (ties: lower row)."""
        return exhaustive_top_k(self.scores, {self.part: self._vectors(queries)}, self.count, k, self.block_elements)

    def _vectors(self, queries: Mapping[str, Any]):
        """The queries' ``part`` rows as float32 CSR (sparse queries) or a float32 array (dense ones)."""
        if queries.get(self.part) is None:
            raise InputError(f"this search needs the queries' '{self.part}' vectors")
        vectors = queries[self.part]
        if sp.issparse(vectors):
            vectors = sp.csr_matrix(vectors, dtype=np.float32)
        else:
            vectors = np.asarray(vectors, dtype=np.float32)
            if vectors.ndim == 1:
                vectors = vectors[None, :]
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise InputError(f"queries of shape {vectors.shape} do not match the index dimension {self.dim}")
        return vectors


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


# ------------------------------------------------------------------------------------------- encoding
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


def storage(index: IndexDir) -> dict[str, float]:
    """Bytes per passage of a sparse/hybrid index as stored: the dense part (float32), the sparse part (CSR, see
    :func:`~pretrieve.retrieval.index.sparse_part_bytes`), their total, and stored entries per passage."""
    sparse, dense = sparse_part_bytes(index, "sparse"), dense_part_bytes(index)
    return {"dense_bytes": dense, "sparse_bytes": sparse["per_document"], "total_bytes": dense + sparse["per_document"],
            "sparse_entries": sparse["entries_per_document"]}


# ---------------------------------------------------------------------------------------------- search
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


def hybrid_weights(index: IndexDir, options: SearchOptions) -> tuple[float, float]:
    """α and β: the options' overrides, else the ones recorded with the index's passages (the representation the
    model was trained with; 1 and 1 when it records none)."""
    trained = (index.meta.get("passage") or {}).get("representation") or {}
    alpha = options.dense_weight if options.dense_weight is not None else trained.get("dense_weight", 1.0)
    beta = options.sparse_weight if options.sparse_weight is not None else trained.get("sparse_weight", 1.0)
    return float(alpha), float(beta)


def open_searcher(shards, options: SearchOptions, mode: str | None = None) -> Searcher:
    """The searcher of ``mode`` (default: the kind of the index, as trained) over the shards of a corpus."""
    mode = mode or (shards[0].kind if shards else "sparse")
    if mode == "rrf":
        return RankFusion(open_searcher(shards, options, "dense"), open_searcher(shards, options, "sparse"),
                          rrf_k=options.rrf_k, depth=options.rrf_depth)
    if mode not in ("dense", "sparse", "hybrid"):
        raise ConfigError(f"unknown search mode '{mode}' (choose from {', '.join(SEARCH_MODES)})")
    return ShardSearcher(shards, lambda shard: shard_searcher(shard, options, mode))


def shard_searcher(shard: IndexDir, options: SearchOptions, mode: str) -> Searcher:
    """The searcher of one directory in mode ``dense`` (FAISS when a factory other than ``Flat`` is asked for),
    ``sparse`` or ``hybrid`` (the weighted sum of the two)."""
    if mode == "sparse":
        return SparseSearcher(shard)
    if mode == "dense":
        return DenseScorer(shard) if options.factory == "Flat" else DenseSearcher(shard, options)
    alpha, beta = hybrid_weights(shard, options)
    return WeightedSum(DenseScorer(shard), SparseSearcher(shard), alpha, beta)
