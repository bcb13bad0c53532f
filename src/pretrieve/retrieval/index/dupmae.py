"""DupMAE back-end: the [CLS] part searched densely, the sparse OT part in an inverted index, combined exactly (eq. 12).

A passage is stored as ``ĥ_d`` (``d′`` floats: ``embeddings.npy``, searched exactly by
:func:`~pretrieve.retrieval.index.dense.exact_search` — FAISS when installed, else torch — or through a FAISS
index of another factory) and ``(I_d, μ_d[I_d])``
(its top-``k`` OT entries: the ``ot`` CSR part, searched by a
:class:`~pretrieve.retrieval.index.sparse.SparseSearcher`); a query as ``ĥ_q`` and its *full* OT vector ``μ_q``
(eq. 12 of "RetroMAE v2 / DupMAE: Duplex Masked Auto-Encoder" sums ``μ_q[i] μ_d[i]`` over the document's indices,
see :mod:`pretrieve.modeling.representations.dupmae`).

Exact two-index search (:meth:`DupMAESearcher.search`) — a threshold algorithm (Fagin et al.) with exact
rescoring: for depth ``c`` take the top-``c`` of each index, rescore the union of the candidates exactly with
eq. 12 (dense dot product from the stored vectors + sparse dot product from the forward rows), and keep the
best ``k``. A document in neither list has a dense score ≤ the dense list's ``c``-th score and a sparse score
≤ the sparse list's ``c``-th score, so its total is at most their sum; when the ``k``-th rescored candidate
reaches that bound the result is certified exact, otherwise the query is searched again at depth ``4c``
(until ``c = N``, which is brute force). Start depth: ``2k``. The guarantee needs exact component searches
(FAISS ``Flat``, the default; the sparse index is always exact). Ties at the bound are resolved in favour of
the candidates; float32 sums computed in a different order can differ in the last bits, so "exact" means
equal to brute-force eq. 12 up to float32 rounding. With DupMAE's dense query OT vectors the sparse search
visits every posting list — ``N·k`` multiply-adds per query, the same as a flat dense index of dimension ``k``
(the paper's "same computation cost" argument). One-part variants (``cls:…`` or ``ot:…``) search their single
index directly.

Storage per passage (:func:`storage`): FAISS Flat keeps ``4·d′`` bytes; the sparse index stores
``k·(4 + 2)`` bytes plus a 4-byte row pointer (float32 values, uint16 term ids: BERT-size vocabularies are below
2¹⁶) — ``cls:384,ot:260`` takes 1536 + 1560 + 4 = 3100 bytes against the paper's 3063.5 (15-bit indices, reported
beside it as ``paper_bytes``) and 3072 for ``cls:768``.

Queries are searched in blocks of :data:`QUERY_BLOCK` (their full OT vectors are ``V`` floats each).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp
import torch

from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.index import EMBEDDINGS, IndexDir, dense_part_bytes, sparse_part_bytes
from pretrieve.retrieval.index.compose import ShardSearcher
from pretrieve.retrieval.index.dense import as_float32, build_faiss, exact_search, faiss_search
from pretrieve.retrieval.index.dense import resolve_mode as dense_mode
from pretrieve.retrieval.index.sparse import SparseSearcher, topk_matrix
from pretrieve.retrieval.index.topk import top_k_rows

logger = logging.getLogger(__name__)

KINDS = ("dupmae",)
QUERY_BLOCK = 256
PAPER_INDEX_BYTES = 15 / 8
"""The paper's bytes per OT index (15 bits, §4.2)."""


# ---------------------------------------------------------------------------------------------- search
class DupMAESearcher:
    """One DupMAE index directory: the [CLS] part in FAISS, the OT part in an inverted index; exact eq. 12 search."""

    def __init__(self, index: IndexDir, options):
        if index.kind != "dupmae":
            raise InputError(f"a '{index.kind}' index, not a DupMAE one", path=index.path)
        if options.factory != "Flat":
            logger.warning("DupMAE search with FAISS '%s' for the [CLS] part: the result is no longer certified "
                           "exact", options.factory)
        self.count = index.count
        self.dense = as_float32(index.array(EMBEDDINGS, mmap=False)) if index.has(EMBEDDINGS) else None
        self.use_gpu = options.use_gpu
        # Flat: exact_search (FAISS when installed, else torch); another factory: a FAISS index of the [CLS] part
        self.faiss = None if self.dense is None or options.factory == "Flat" else build_faiss(
            self.dense, options.factory, "ip")
        self.sparse = SparseSearcher(index, "ot") if index.has("ot") else None

    def exact_scores(self, queries: Mapping[str, Any], rows: np.ndarray) -> np.ndarray:
        """Eq. 12 of query ``q`` with passages ``rows[q]`` (``[Q, C]``, ``-1`` → ``-inf``)."""
        rows = np.asarray(rows, dtype=np.int64)
        total = np.zeros(rows.shape, dtype=np.float32)
        if self.dense is not None:
            vectors = as_float32(queries[EMBEDDINGS])
            for q in range(rows.shape[0]):
                total[q] = self.dense[np.maximum(rows[q], 0)] @ vectors[q]
        if self.sparse is not None:
            total += np.where(rows >= 0, self.sparse.score_rows(queries, np.maximum(rows, 0)), 0.0)
        return np.where(rows >= 0, total, -np.inf).astype(np.float32)

    def search(self, queries: Mapping[str, Any], k: int,
               initial_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` by eq. 12: ``(scores [Q, k'], rows [Q, k'])``, ``k' = min(k, N)``, best first."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        self._check_queries(queries)
        if self.sparse is None:
            return self._dense_search(queries[EMBEDDINGS], k)
        if self.dense is None:
            return self.sparse.search(queries, k)
        dense_queries, ot_queries = as_float32(queries[EMBEDDINGS]), queries["ot"]
        count, size, k = ot_queries.shape[0], self.count, min(k, self.count)
        out_scores = np.zeros((count, k), dtype=np.float32)
        out_rows = np.zeros((count, k), dtype=np.int64)
        pending = np.arange(count)
        depth = min(size, max(k, initial_depth or 2 * k))
        while pending.size:
            pending_queries = {EMBEDDINGS: dense_queries[pending], "ot": ot_queries[pending]}
            dense_scores, dense_rows = self._dense_search(pending_queries[EMBEDDINGS], depth)
            sparse_scores, sparse_rows = self.sparse.search(pending_queries, depth)
            candidates = union_rows(dense_rows, sparse_rows)
            exact = self.exact_scores(pending_queries, candidates)
            best = top_k_rows(exact, k)
            scores = np.take_along_axis(exact, best, axis=1)
            if depth >= size:
                certified = np.ones(len(pending), dtype=bool)
            else:
                certified = scores[:, -1] >= dense_scores[:, -1] + sparse_scores[:, -1]
            done = pending[certified]
            out_scores[done] = scores[certified]
            out_rows[done] = np.take_along_axis(candidates, best, axis=1)[certified]
            pending = pending[~certified]
            depth = min(size, depth * 4)
        return out_scores, out_rows

    def _dense_search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.faiss is not None:
            return faiss_search(self.faiss, vectors, k)
        return exact_search(vectors, self.dense, k, "ip", use_gpu=self.use_gpu)

    def _check_queries(self, queries: Mapping[str, Any]) -> None:
        dense_queries, ot_queries = queries.get(EMBEDDINGS), queries.get("ot")
        if self.dense is not None and dense_queries is None:
            raise InputError("this index has a dense [CLS] part: dense query vectors are required")
        if self.sparse is not None and ot_queries is None:
            raise InputError("this index has a sparse OT part: query OT vectors are required")
        if self.dense is not None and self.sparse is not None and len(dense_queries) != ot_queries.shape[0]:
            raise InputError(f"{len(dense_queries)} dense but {ot_queries.shape[0]} OT query vectors")


def union_rows(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Per query, the distinct rows of two candidate lists, ascending, padded with ``-1`` → ``[Q, C]``."""
    merged = np.sort(np.concatenate([first, second], axis=1), axis=1)
    repeat = np.zeros(merged.shape, dtype=bool)
    repeat[:, 1:] = merged[:, 1:] == merged[:, :-1]
    merged[repeat | (merged < 0)] = -1
    return merged


def storage(index: IndexDir) -> dict[str, float]:
    """Bytes per passage of a DupMAE index: the dense part (fp32), the OT part as stored (CSR) and per the paper."""
    dense = dense_part_bytes(index)
    sparse = sparse_part_bytes(index, "ot") if index.has("ot") else {"per_document": 0.0, "entries_per_document": 0.0}
    entries = sparse["entries_per_document"]
    return {"dense_bytes": dense, "sparse_bytes": sparse["per_document"], "total_bytes": dense + sparse["per_document"],
            "ot_entries": entries, "paper_bytes": dense + entries * (4 + PAPER_INDEX_BYTES)}


def resolve_mode(kind: str, mode: str | None) -> str | None:
    if mode is not None:
        dense_mode(kind, mode)
    return None


def open_searcher(shards, options, mode: str | None = None) -> ShardSearcher:
    return ShardSearcher(shards, lambda shard: DupMAESearcher(shard, options))


# ------------------------------------------------------------------------------------------- encoding
def outputs(representation, rep: torch.Tensor, text_type: str) -> dict[str, Any]:
    """A batch of DupMAE representation rows → ``embeddings`` (ĥ) and ``ot``: the full OT vectors ``[B, V]`` of
    queries (eq. 12), the top-``k`` OT entries of passages as CSR rows (eq. 11)."""
    dense, ot = representation.split(rep.float())
    parts: dict[str, Any] = {}
    if dense is not None:
        parts[EMBEDDINGS] = dense.cpu().numpy().astype(np.float32)
    if ot is not None and text_type == "query":
        parts["ot"] = ot.cpu().numpy().astype(np.float32)
    elif ot is not None:
        values, indices = representation.sparsify(ot)
        parts["ot"] = topk_matrix(indices.cpu().numpy(), values.cpu().numpy(), int(ot.shape[1]))
    return parts


def empty_outputs(representation, vocab_size: int, text_type: str) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    if representation.dense_dim:
        parts[EMBEDDINGS] = np.zeros((0, representation.dense_dim), np.float32)
    if representation.ot_k is not None:
        parts["ot"] = (np.zeros((0, vocab_size), np.float32) if text_type == "query"
                       else sp.csr_matrix((0, vocab_size), dtype=np.float32))
    return parts
