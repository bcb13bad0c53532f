"""Top-k arithmetic shared by the search back-ends: :func:`top_k_rows` (the ``k`` best columns of a score matrix,
ties by column), :func:`exhaustive_top_k` (the top-k of a scorer of every passage, a block of queries at a time),
:func:`merge_topk` (stable merge of per-block / per-shard results) and :func:`rrf_fuse` (reciprocal rank fusion of
ranked row lists, Cormack et al. 2009).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pretrieve.errors import ConfigError, InputError

RRF_K = 60
DEFAULT_RRF_DEPTH = 1000
DEFAULT_BLOCK_ELEMENTS = 1 << 26
"""Exhaustive scoring keeps a block of query × passage scores under this many floats (256 MB)."""


def query_count(queries: Mapping[str, Any]) -> int:
    """How many queries encoded ``queries`` (part name → ``[Q, …]`` rows) hold."""
    return next(iter(queries.values())).shape[0] if queries else 0


def exhaustive_top_k(scores_of: Callable[[Mapping[str, Any]], np.ndarray], queries: Mapping[str, Any], count: int,
                     k: int, block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of a scorer of every passage (``scores_of(queries)`` → float32 ``[Q, count]``), a block of
    queries at a time (``block_elements`` scores at most): ``(scores [Q, k'], rows [Q, k'])`` with
    ``k' = min(k, count)``, best first, ties by row."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    total, k = query_count(queries), min(k, count)
    out_scores = np.zeros((total, k), dtype=np.float32)
    out_rows = np.zeros((total, k), dtype=np.int64)
    if total == 0 or k == 0:
        return out_scores, out_rows
    block = max(1, block_elements // max(1, count))
    for start in range(0, total, block):
        part = slice(start, start + block)
        scores = scores_of({name: value[part] for name, value in queries.items()})
        out_rows[part] = top_k_rows(scores, k)
        out_scores[part] = np.take_along_axis(scores, out_rows[part], axis=1)
    return out_scores, out_rows


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


def merge_topk(scores: Sequence[np.ndarray], rows: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-block/per-shard ``[Q, k_i]`` results into the top-``k`` per query (stable: earlier lists win ties)."""
    merged_scores = np.concatenate(scores, axis=1)
    merged_rows = np.concatenate(rows, axis=1)
    order = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(merged_scores, order, axis=1), np.take_along_axis(merged_rows, order, axis=1)


def rrf_fuse(rankings: Sequence[np.ndarray], k: int, rrf_k: int = RRF_K) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of ranked row lists ``[Q, n_i]`` (best first; ``-1`` = no entry).

    A row's fused score is ``Σ_i 1 / (rrf_k + rank_i)`` over the lists that hold it (ranks from 1). Returns the
    top ``k`` per query as ``(scores [Q, k'], rows [Q, k'])`` with ``k'`` the largest union size (``k`` at
    most); shorter results are padded with row ``-1`` and score ``-inf``. Ties go to the lower row.
    """
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if rrf_k < 0:
        raise ConfigError(f"rrf_k must be >= 0, got {rrf_k}")
    rankings = [np.asarray(rows, dtype=np.int64) for rows in rankings]
    count = rankings[0].shape[0]
    if any(rows.ndim != 2 or rows.shape[0] != count for rows in rankings):
        raise InputError("every ranking must be [Q, n] with the same number of queries")
    fused_rows, fused_scores = [], []
    for q in range(count):
        rows = np.concatenate([ranking[q] for ranking in rankings])
        contributions = np.concatenate([1.0 / (rrf_k + np.arange(1, len(ranking[q]) + 1)) for ranking in rankings])
        keep = rows >= 0
        unique, inverse = np.unique(rows[keep], return_inverse=True)
        totals = np.zeros(len(unique))
        np.add.at(totals, inverse, contributions[keep])
        best = top_k_rows(totals[None, :], k)[0] if len(unique) else np.zeros(0, dtype=np.int64)
        fused_rows.append(unique[best])
        fused_scores.append(totals[best])
    width = max((len(rows) for rows in fused_rows), default=0)
    out_rows = np.full((count, width), -1, dtype=np.int64)
    out_scores = np.full((count, width), -np.inf, dtype=np.float64)
    for q, (rows, scores) in enumerate(zip(fused_rows, fused_scores)):
        out_rows[q, :len(rows)], out_scores[q, :len(rows)] = rows, scores
    return out_scores, out_rows
