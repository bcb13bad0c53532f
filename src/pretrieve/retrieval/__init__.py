"""First-stage retrieval: BM25 (bm25s), dense encoding (sentence-transformers compatible), FAISS search.

* :mod:`~pretrieve.retrieval.bm25` — :class:`BM25Index` (build / search / save / load), the lexical
  baseline and negative miner;
* :mod:`~pretrieve.retrieval.encoder` — :class:`DenseEncoder`: checkpoint loading, pooling, Dense
  layers and normalisation exactly as sentence-transformers reads them;
* :mod:`~pretrieve.retrieval.encode` — batched, length-sorted encoding; corpus shards with caching;
* :mod:`~pretrieve.retrieval.faiss_search` — :class:`FaissIndex`, :func:`search_shards`, and the end-to-end
  :func:`search_embeddings` / :func:`dense_run`;
* :mod:`~pretrieve.retrieval.throughput` — the encoding-throughput benchmark;
* :mod:`~pretrieve.retrieval.fusion` — reciprocal rank fusion and normalised weighted sums of runs (ranx).

Knows nothing about training: it reads checkpoints, it never writes them.

The names below are imported on first use (PEP 562), so ``import pretrieve.retrieval.bm25`` (the ``bm25``
command) does not import torch through the dense modules.
"""

import importlib

# Imported on first use (PEP 562), so that a module that needs no model — ``fusion``, ``bm25`` — does not load
# torch through this package.
_EXPORTS = {
    "BM25Index": "bm25", "BM25Params": "bm25", "bm25_run": "bm25",
    "EmbeddingShard": "encode", "encode_corpus": "encode", "encode_queries": "encode", "encode_texts": "encode",
    "find_shards": "encode", "load_shard": "encode", "shard_bounds": "encode",
    "POOLING_MODES": "encoder", "DenseEncoder": "encoder", "pool": "encoder",
    "read_sentence_transformers_config": "encoder",
    "FaissIndex": "faiss_search", "dense_run": "faiss_search", "merge_topk": "faiss_search",
    "search_embeddings": "faiss_search", "search_shards": "faiss_search",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"pretrieve.retrieval.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pretrieve.retrieval' has no attribute {name!r}")
