"""A sparse inverted index: exact top-k retrieval by sparse dot product (scipy.sparse).

:class:`SparseIndex` holds one sparse vector per document over a vocabulary of ``dim`` terms — DupMAE's
top-k ordinary-token vectors (DupMAE, Xiao & Liu 2022, eq. 11), SPLADE-style term weights, any bag of weighted terms — in two
scipy layouts built from the same data:

* the **forward** matrix ``[N, dim]`` (CSR: a row = one document's (term, weight) pairs), what is stored and
  what :meth:`SparseIndex.score_rows` reads to score given candidate documents;
* the **inverted** index ``[dim, N]`` (CSR of the transpose: row ``t`` = the posting list of term ``t``,
  documents ascending), what :meth:`SparseIndex.search` accumulates over. It is derived on first use and not
  saved.

Search is exact: for a block of queries the scores against every document are accumulated (``Q @ postings``,
scipy's sparse×sparse product for sparse queries — which visits exactly the posting lists of the query's
terms — or sparse×dense for dense queries, where every posting list is visited) and the top ``k`` are taken
with ``argpartition``; ties are broken by document row, ascending, so results are deterministic. Documents
sharing no term with a query score 0 and are ranked like any other. Query blocks are sized so that the dense
score block stays under ``block_elements`` floats (2²⁶ = 256 MB).

Queries are ``scipy.sparse`` matrices or dense ``numpy`` arrays ``[Q, dim]`` (DupMAE's query OT vectors are
dense: eq. 12 uses the query's full vector). Values are float32.

Storage (:meth:`SparseIndex.storage_bytes`, the saved layout): float32 weights, term ids as **uint16** when
every id fits (``dim ≤ 65536``: BERT's 30,522 and RoBERTa's 50,265 tokens) else int32
(:func:`term_id_dtype`), and row pointers as int32 (int64 from 2³¹ entries on) — ``nnz·(4 + 2) + (N + 1)·4``
bytes for a BERT vocabulary. In memory scipy widens the term ids to int32 (its sparse products need 32-bit
indices), and the derived posting lists take as much again while searching; scores and rankings do not depend
on the stored width.

Files (:meth:`SparseIndex.save`): ``sparse.npz`` (the keys of ``scipy.sparse.save_npz``, so ``load_npz``
reads it too, with the narrow term ids), ``ids.json``, ``sparse_meta.json``; written atomically. Files
written with int32 term ids (format 1) load unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from pretrieve.data.trec import Run, run_from_arrays
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json

SPARSE_FORMAT = "pretrieve-sparse/2"
UINT16_TERMS = 1 << 16
"""Vocabularies up to this size store their term ids as uint16."""
_MATRIX_FILE = "sparse.npz"
_IDS_FILE = "ids.json"
_META_FILE = "sparse_meta.json"
DEFAULT_BLOCK_ELEMENTS = 1 << 26


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
        self.ids = [str(i) for i in range(forward.shape[0])] if ids is None else list(ids)
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
        indices, values = np.asarray(indices), np.asarray(values, dtype=np.float32)
        if indices.shape != values.shape or indices.ndim != 2:
            raise InputError(f"indices {indices.shape} and values {values.shape} must be two [N, k] arrays")
        if indices.size and (indices.max() >= dim or indices.min() < -1):
            raise InputError(f"term indices must lie in [0, {dim}) (or be -1 for padding)")
        rows = np.repeat(np.arange(indices.shape[0]), indices.shape[1])
        keep = (indices.ravel() >= 0) & (values.ravel() != 0)
        matrix = sp.csr_matrix((values.ravel()[keep], (rows[keep], indices.ravel()[keep])),
                               shape=(indices.shape[0], dim), dtype=np.float32)
        return cls(matrix, ids)

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
        """Write ``sparse.npz`` + ``ids.json`` + ``sparse_meta.json`` into directory ``path``, atomically."""
        path = Path(path)
        term_ids = term_id_dtype(self.dim)
        with atomic_dir(path) as tmp:
            np.savez(tmp / _MATRIX_FILE, data=self.matrix.data, indices=self.matrix.indices.astype(term_ids),
                     indptr=self.matrix.indptr.astype(row_pointer_dtype(self.nnz)), format=np.bytes_(b"csr"),
                     shape=np.array(self.matrix.shape))
            with open(tmp / _IDS_FILE, "w", encoding="utf-8") as handle:
                json.dump(self.ids, handle)
            write_json(tmp / _META_FILE, {"format": SPARSE_FORMAT, "dim": self.dim, "count": len(self),
                                          "nnz": self.nnz, "term_ids": np.dtype(term_ids).name})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SparseIndex":
        path = Path(path)
        if not (path / _META_FILE).exists():
            raise InputError(f"not a pretrieve sparse index ({_META_FILE} missing)", path=path)
        ids = json.loads((path / _IDS_FILE).read_text(encoding="utf-8"))
        with np.load(path / _MATRIX_FILE) as files:
            shape = tuple(int(size) for size in files["shape"])
            matrix = sp.csr_matrix((files["data"], files["indices"].astype(np.int32 if shape[1] <= np.iinfo(
                np.int32).max else np.int64), files["indptr"]), shape=shape)
        return cls(matrix, ids)


def term_id_dtype(dim: int) -> type:
    """The narrowest stored type for term ids in ``[0, dim)``: uint16 up to 65,536 terms, else int32 (int64 beyond)."""
    if dim <= UINT16_TERMS:
        return np.uint16
    return np.int32 if dim <= np.iinfo(np.int32).max else np.int64


def row_pointer_dtype(nnz: int) -> type:
    """Row pointers: int32 below 2³¹ stored entries, else int64 (scipy's own rule)."""
    return np.int32 if nnz <= np.iinfo(np.int32).max else np.int64


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``scores [Q, N]``, the column indices of the ``k`` largest, best first; ties by column."""
    k = min(k, scores.shape[1])
    if k < scores.shape[1]:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        threshold = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        candidates = [np.flatnonzero(row >= t) for row, t in zip(scores, threshold[:, 0])]
    else:
        candidates = [np.arange(scores.shape[1])] * scores.shape[0]
    out = np.empty((scores.shape[0], k), dtype=np.int64)
    for q, columns in enumerate(candidates):
        order = np.lexsort((columns, -scores[q, columns]))
        out[q] = columns[order[:k]]
    return out
