"""Searchers made of searchers (the idea of Pyserini's ``HybridSearcher``): what the back-ends build a corpus's
searcher from, so that the search path (:mod:`pretrieve.retrieval.search`) knows no mode and no back-end detail.

* :class:`ShardSearcher` — the shards of a corpus, searched one after the other (one shard's searcher in memory at a
  time; a lone shard's is kept for the next query block), their top-k merged as they come (stable: earlier shards
  win ties); its rows are corpus rows. Exact per-shard top-k merged give the exact global top-k.
* :class:`WeightedSum` — ``α·first + β·second`` of two exhaustive scorers of the same passages (the hybrid score,
  eq. 6 of CoT-MoTE), computed for every passage and its top-k taken once (exact).
* :class:`RankFusion` — reciprocal rank fusion of the top-``N`` rankings of two searchers (``N = max(k,
  depth)``, at most every passage). Composed over two :class:`ShardSearcher` s it fuses the *global* rankings.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from pretrieve.retrieval.index import IndexDir, Searcher
from pretrieve.retrieval.index.topk import (DEFAULT_BLOCK_ELEMENTS, DEFAULT_RRF_DEPTH, RRF_K, exhaustive_top_k,
                                            merge_topk, query_count, rrf_fuse)


class Scorer(Searcher, Protocol):
    """A searcher that can score every passage: ``scores(queries)`` → float32 ``[Q, count]``."""

    def scores(self, queries: Mapping[str, Any]) -> np.ndarray:
        ...


class ShardSearcher:
    """The shards of one corpus, in order: per-shard top-k merged into the corpus's top-k."""

    def __init__(self, shards: Sequence[IndexDir], open_shard: Callable[[IndexDir], Searcher]):
        self.shards = list(shards)
        self.open_shard = open_shard
        self.count = sum(shard.count for shard in self.shards)
        self._kept: Searcher | None = None

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        count = query_count(queries)
        scores, rows = np.zeros((count, 0), np.float32), np.zeros((count, 0), np.int64)
        offset = 0
        for shard in self.shards:
            searcher = self._kept or self.open_shard(shard)
            if len(self.shards) == 1:
                self._kept = searcher
            shard_scores, shard_rows = searcher.search(queries, k)
            shard_rows = np.asarray(shard_rows, dtype=np.int64)
            found = shard_rows >= 0
            scores, rows = merge_topk([scores, np.where(found, shard_scores, -np.inf).astype(np.float32)],
                                      [rows, np.where(found, shard_rows + offset, -1)], k)
            del searcher
            offset += shard.count
        return scores, rows


class WeightedSum:
    """``first_weight · first + second_weight · second`` over every passage (float32), top-k exact."""

    def __init__(self, first: Scorer, second: Scorer, first_weight: float, second_weight: float,
                 block_elements: int = DEFAULT_BLOCK_ELEMENTS):
        self.first, self.second = first, second
        self.weights = (np.float32(first_weight), np.float32(second_weight))
        self.count = first.count
        self.block_elements = block_elements

    def scores(self, queries: Mapping[str, Any]) -> np.ndarray:
        first = self.first.scores(queries)
        return (self.weights[0] * first + self.weights[1] * self.second.scores(queries)).astype(np.float32)

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        return exhaustive_top_k(self.scores, queries, self.count, k, self.block_elements)


class RankFusion:
    """Reciprocal rank fusion of two searchers' top-``max(k, depth)`` rankings: ``Σ 1 / (rrf_k + rank)``."""

    def __init__(self, first: Searcher, second: Searcher, rrf_k: int = RRF_K, depth: int = DEFAULT_RRF_DEPTH):
        self.searchers = (first, second)
        self.rrf_k, self.depth = rrf_k, depth
        self.count = first.count

    def search(self, queries: Mapping[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        depth = min(self.count, max(k, self.depth))
        rankings = [searcher.search(queries, depth)[1] for searcher in self.searchers]
        return rrf_fuse(rankings, k, rrf_k=self.rrf_k)
