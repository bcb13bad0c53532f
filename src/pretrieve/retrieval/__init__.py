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

The names below are imported on first use (PEP 562), so ``import pretrieve.retrieval.bm25`` (the ``bm25``
command) does not import torch through the dense modules.
"""

import importlib

_EXPORTS = {
    "bm25": ("BM25Index", "BM25Params", "bm25_run"),
    "encode": ("EmbeddingShard", "encode_corpus", "encode_queries", "encode_texts", "find_shards", "load_shard",
               "shard_bounds"),
    "encoder": ("POOLING_MODES", "DenseEncoder", "pool", "read_sentence_transformers_config"),
    "faiss_search": ("FaissIndex", "dense_run", "merge_topk", "search_embeddings", "search_shards"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'pretrieve.retrieval' has no attribute '{name}'")
    return getattr(importlib.import_module(f"pretrieve.retrieval.{_MODULE_OF[name]}"), name)
