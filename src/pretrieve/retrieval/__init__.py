"""First-stage retrieval, by role: one loader, one batch encoder, one index format, one search path.

* :mod:`~pretrieve.retrieval.load` — :func:`load_retriever`: any retriever (sentence-transformers / Hugging Face
  checkpoint, or a model fine-tuned by pretrieve) with its representation kind and query/passage sides; the only
  reader of a model's configuration;
* :mod:`~pretrieve.retrieval.batches` — the streaming batch encoder (background tokenisation, length-sorted
  batches, outputs window by window) and precisions (``auto`` / fp32 / bf16 / fp16 / int8);
* :mod:`~pretrieve.retrieval.index` — the on-disk index format (ids, meta, parts, freshness sidecar; shards) and
  one back-end per kind: :mod:`~pretrieve.retrieval.index.dense` (FAISS: exact streaming search, factory strings,
  GPU), :mod:`~pretrieve.retrieval.index.dupmae` (CLS + OT), :mod:`~pretrieve.retrieval.index.sparse`
  (sparse / hybrid / rrf);
* :mod:`~pretrieve.retrieval.search` — :func:`search` / :func:`build_index`: the one entry of ``pretrieve dense``,
  ``search``, ``encode``, ``mine``, the recipe's evaluate stage and mining;
* :mod:`~pretrieve.retrieval.mining` — training groups: search minus positives;
* :mod:`~pretrieve.retrieval.bm25` — BM25 (bm25s), the lexical baseline and stage-1 negative miner;
* :mod:`~pretrieve.retrieval.fusion` — reciprocal rank fusion and normalised weighted sums of runs (ranx).

Knows nothing about training: it reads checkpoints, it never writes them. The names below are imported on first
use (PEP 562), so ``import pretrieve.retrieval.bm25`` does not import torch through the dense modules.
"""

import importlib

_EXPORTS = {
    "bm25": ("BM25Index", "BM25Params", "bm25_run"),
    "load": ("Retriever", "load_retriever", "load_dense_encoder"),
    "batches": ("encode_all", "encode_windows", "resolve_precision"),
    "index": ("SearchOptions", "find_shards", "open_index"),
    "index.topk": ("merge_topk",),
    "search": ("build_index", "search", "search_blocks"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'pretrieve.retrieval' has no attribute '{name}'")
    return getattr(importlib.import_module(f"pretrieve.retrieval.{_MODULE_OF[name]}"), name)
