"""First-stage retrieval: BM25 (bm25s), dense encoding (sentence-transformers compatible), FAISS search.

* :mod:`~pretrieve.retrieval.bm25` — :class:`BM25Index` (build / search / save / load), the lexical
  baseline and negative miner;
* :mod:`~pretrieve.retrieval.encoder` — :class:`DenseEncoder`: checkpoint loading, pooling, Dense
  layers and normalisation exactly as sentence-transformers reads them;
* :mod:`~pretrieve.retrieval.encode` — batched, length-sorted encoding; corpus shards with caching;
* :mod:`~pretrieve.retrieval.faiss_search` — :class:`FaissIndex`, :func:`search_shards`, and the end-to-end
  :func:`search_embeddings` / :func:`dense_run`;
* :mod:`~pretrieve.retrieval.throughput` — the encoding-throughput benchmark.

Knows nothing about training: it reads checkpoints, it never writes them.
"""

from pretrieve.retrieval.bm25 import BM25Index, BM25Params, bm25_run
from pretrieve.retrieval.encode import (EmbeddingShard, encode_corpus, encode_queries, encode_texts, find_shards,
                                        load_shard, shard_bounds)
from pretrieve.retrieval.encoder import POOLING_MODES, DenseEncoder, pool, read_sentence_transformers_config
from pretrieve.retrieval.faiss_search import FaissIndex, dense_run, merge_topk, search_embeddings, search_shards

__all__ = [
    "BM25Index", "BM25Params", "DenseEncoder", "EmbeddingShard", "FaissIndex", "POOLING_MODES", "bm25_run",
    "dense_run", "encode_corpus", "encode_queries", "encode_texts", "find_shards", "load_shard", "merge_topk",
    "pool", "read_sentence_transformers_config", "search_embeddings", "search_shards", "shard_bounds",
]
