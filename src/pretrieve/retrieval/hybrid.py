"""DupMAE search: the [CLS] part in FAISS, the sparse OT part in an inverted index, combined exactly (eq. 12).

A passage is stored as ``ĥ_d`` (``d′`` floats, a FAISS index) and ``(I_d, μ_d[I_d])`` (its top-``k`` OT entries,
a :class:`~pretrieve.retrieval.sparse_index.SparseIndex`); a query as ``ĥ_q`` and its *full* OT vector
``μ_q`` (eq. 12 sums ``μ_q[i] μ_d[i]`` over the document's indices, see :mod:`pretrieve.modeling.dupmae`).

Exact two-index search (:meth:`DupMAEIndex.search`) — a threshold algorithm (Fagin et al.) with exact
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
(the paper's "same computation cost" argument); a sparsified query (SPLADE-style) visits only its terms'.
One-part variants (``cls:…`` or ``ot:…``) search their single index directly.

Storage per passage (:meth:`DupMAEIndex.storage`): FAISS Flat keeps ``4·d′`` bytes; the sparse index stores
``k·(4 + 2)`` bytes plus a 4-byte row pointer (float32 values, uint16 term ids: BERT-size vocabularies are below
2¹⁶; ``k·(4 + 4)`` for larger ones, see :mod:`~pretrieve.retrieval.sparse_index`) — ``cls:384,ot:260`` takes
1536 + 1560 + 4 = 3100 bytes against the paper's 3063.5 (15-bit indices, reported beside it as
``paper_bytes``) and 3072 for ``cls:768``.

:func:`dupmae_search` is what ``retrieval.mining.dense_search`` dispatches to for a fine-tuned model whose
``dual_encoder.json`` declares the ``dupmae`` representation (mining and the recipe's evaluate stage): it
encodes the corpus (cached in ``cache_dir``: ``dupmae-index/`` with the model fingerprint, encoding settings
and a hash of the texts, reused when they match), then encodes and searches the queries in blocks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from pretrieve.data.trec import Run, run_from_arrays
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.retrieval.faiss_search import FaissIndex, as_float32
from pretrieve.retrieval.sparse_index import SparseIndex, top_k_rows

logger = logging.getLogger(__name__)

INDEX_FORMAT = "pretrieve-dupmae-index/1"
INDEX_DIR = "dupmae-index"
_DENSE_FILE = "dense.npy"
_SPARSE_DIR = "sparse"
_IDS_FILE = "ids.json"
_META_FILE = "meta.json"
PAPER_INDEX_BYTES = 15 / 8
"""The paper's bytes per OT index (15 bits, §4.2)."""


# ------------------------------------------------------------------------------------------------ index
class DupMAEIndex:
    """Dense [CLS] vectors in FAISS + sparse OT vectors in a :class:`SparseIndex`; exact eq. 12 search."""

    def __init__(self, ids: Sequence[str], dense: np.ndarray | None = None, sparse: SparseIndex | None = None,
                 factory: str = "Flat", meta: Mapping[str, Any] | None = None):
        if dense is None and sparse is None:
            raise ConfigError("a DupMAE index needs a dense part, a sparse part, or both")
        self.ids = list(ids)
        self.dense = None if dense is None else as_float32(dense)
        self.sparse = sparse
        for name, size in (("dense", None if dense is None else len(dense)),
                           ("sparse", None if sparse is None else len(sparse))):
            if size is not None and size != len(self.ids):
                raise InputError(f"the {name} part holds {size} passages but {len(self.ids)} ids were given")
        self.factory = factory
        self.meta = dict(meta or {})
        self.faiss = None if self.dense is None else FaissIndex.build(self.dense, self.ids, factory, "ip")

    @classmethod
    def build(cls, ids: Sequence[str], dense: np.ndarray | None = None, ot_indices: np.ndarray | None = None,
              ot_values: np.ndarray | None = None, vocab_size: int | None = None, factory: str = "Flat",
              meta: Mapping[str, Any] | None = None) -> "DupMAEIndex":
        """From ``ĥ_d [N, d′]`` and/or the top-k OT pairs ``(indices [N, k], values [N, k])`` over ``vocab_size``."""
        sparse = None
        if ot_indices is not None:
            if ot_values is None or vocab_size is None:
                raise ConfigError("the OT part needs indices, values and the vocabulary size")
            sparse = SparseIndex.from_topk(ot_indices, ot_values, vocab_size, ids)
        return cls(ids, dense, sparse, factory, meta)

    def __len__(self) -> int:
        return len(self.ids)

    # ------------------------------------------------------------------ scoring
    def exact_scores(self, dense_queries: np.ndarray | None, ot_queries: np.ndarray | None,
                     rows: np.ndarray) -> np.ndarray:
        """Eq. 12 of query ``q`` with passages ``rows[q]`` (``[Q, C]``, ``-1`` → ``-inf``)."""
        rows = np.asarray(rows, dtype=np.int64)
        total = np.zeros(rows.shape, dtype=np.float32)
        if self.dense is not None:
            queries = as_float32(dense_queries)
            for q in range(rows.shape[0]):
                total[q] = self.dense[np.maximum(rows[q], 0)] @ queries[q]
        if self.sparse is not None:
            total += np.where(rows >= 0, self.sparse.score_rows(ot_queries, np.maximum(rows, 0)), 0.0)
        return np.where(rows >= 0, total, -np.inf).astype(np.float32)

    def brute_force_scores(self, dense_queries: np.ndarray | None, ot_queries: np.ndarray | None) -> np.ndarray:
        """Eq. 12 of every query with every passage, ``[Q, N]`` (reference for tests and small corpora)."""
        scores = None
        if self.dense is not None:
            scores = as_float32(dense_queries) @ self.dense.T
        if self.sparse is not None:
            sparse = self.sparse.score_all(ot_queries)
            scores = sparse if scores is None else scores + sparse
        return scores

    def search(self, dense_queries: np.ndarray | None, ot_queries: np.ndarray | None, k: int,
               initial_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` by eq. 12: ``(scores [Q, k'], rows [Q, k'])``, ``k' = min(k, N)``, best first."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        self._check_queries(dense_queries, ot_queries)
        if self.sparse is None:
            return self.faiss.search(dense_queries, k)
        if self.dense is None:
            return self.sparse.search(ot_queries, k)
        count, size, k = ot_queries.shape[0], len(self), min(k, len(self))
        out_scores = np.zeros((count, k), dtype=np.float32)
        out_rows = np.zeros((count, k), dtype=np.int64)
        pending = np.arange(count)
        depth = min(size, max(k, initial_depth or 2 * k))
        while pending.size:
            dense_q, ot_q = as_float32(dense_queries)[pending], ot_queries[pending]
            dense_scores, dense_rows = self.faiss.search(dense_q, depth)
            sparse_scores, sparse_rows = self.sparse.search(ot_q, depth)
            candidates = union_rows(dense_rows, sparse_rows)
            exact = self.exact_scores(dense_q, ot_q, candidates)
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

    def search_run(self, dense_queries: np.ndarray | None, ot_queries: np.ndarray | None,
                   query_ids: Sequence[str], k: int) -> Run:
        scores, rows = self.search(dense_queries, ot_queries, k)
        return run_from_arrays(query_ids, self.ids, rows, scores)

    def _check_queries(self, dense_queries, ot_queries) -> None:
        if self.dense is not None and dense_queries is None:
            raise InputError("this index has a dense [CLS] part: dense query vectors are required")
        if self.sparse is not None and ot_queries is None:
            raise InputError("this index has a sparse OT part: query OT vectors are required")
        if self.dense is not None and self.sparse is not None and len(dense_queries) != ot_queries.shape[0]:
            raise InputError(f"{len(dense_queries)} dense but {ot_queries.shape[0]} OT query vectors")

    # ------------------------------------------------------------------ storage
    def storage(self) -> dict[str, float]:
        """Bytes per passage: the dense part (fp32), the sparse part as stored (CSR) and per the paper."""
        dense = 0.0 if self.dense is None else float(self.dense.shape[1] * self.dense.itemsize)
        sparse = 0.0 if self.sparse is None else self.sparse.storage_bytes()["per_document"]
        entries = 0.0 if self.sparse is None else self.sparse.storage_bytes()["entries_per_document"]
        return {"dense_bytes": dense, "sparse_bytes": sparse, "total_bytes": dense + sparse,
                "ot_entries": entries, "paper_bytes": dense + entries * (4 + PAPER_INDEX_BYTES)}

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """``dense.npy``, ``sparse/``, ``ids.json`` and ``meta.json`` (with :attr:`meta`) in ``path``, atomically."""
        path = Path(path)
        with atomic_dir(path) as tmp:
            if self.dense is not None:
                np.save(tmp / _DENSE_FILE, self.dense)
            if self.sparse is not None:
                self.sparse.save(tmp / _SPARSE_DIR)
            with open(tmp / _IDS_FILE, "w", encoding="utf-8") as handle:
                json.dump(self.ids, handle)
            write_json(tmp / _META_FILE, {"format": INDEX_FORMAT, "factory": self.factory, **self.meta})
        return path

    @classmethod
    def load(cls, path: str | Path, factory: str | None = None) -> "DupMAEIndex":
        path = Path(path)
        meta = read_index_meta(path)
        if meta is None:
            raise InputError(f"not a pretrieve DupMAE index ({_META_FILE} missing or not ours)", path=path)
        ids = json.loads((path / _IDS_FILE).read_text(encoding="utf-8"))
        dense = np.load(path / _DENSE_FILE) if (path / _DENSE_FILE).exists() else None
        sparse = SparseIndex.load(path / _SPARSE_DIR) if (path / _SPARSE_DIR).exists() else None
        meta.pop("format", None)
        saved_factory = meta.pop("factory", "Flat")
        return cls(ids, dense, sparse, factory or saved_factory, meta)


def read_index_meta(path: Path) -> dict[str, Any] | None:
    from pretrieve.retrieval.encode import read_index_meta as read_meta

    return read_meta(path, _META_FILE, INDEX_FORMAT)


def union_rows(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Per query, the distinct rows of two candidate lists, ascending, padded with ``-1`` → ``[Q, C]``."""
    merged = np.sort(np.concatenate([first, second], axis=1), axis=1)
    repeat = np.zeros(merged.shape, dtype=bool)
    repeat[:, 1:] = merged[:, 1:] == merged[:, :-1]
    merged[repeat | (merged < 0)] = -1
    return merged


# ---------------------------------------------------------------------------------------------- encoding
@dataclass
class EncodedTexts:
    """DupMAE encodings of texts: ``dense [N, d′]`` and either the full OT vectors ``ot [N, V]`` (queries) or
    their top-k ``(ot_indices, ot_values) [N, k]`` (passages); absent parts are None."""

    dense: np.ndarray | None
    ot: np.ndarray | None = None
    ot_indices: np.ndarray | None = None
    ot_values: np.ndarray | None = None


def encode_dupmae(model, tokenizer, texts: Sequence[str], text_type: str, max_length: int, batch_size: int = 64,
                  bf16: bool = False, show_progress: bool = False, chunk_size: int = 65536) -> EncodedTexts:
    """Encode ``texts`` with a DupMAE :class:`~pretrieve.modeling.dual_encoder.DualEncoder`.

    Passages (``text_type="passage"``) keep the top-``k`` OT entries (eq. 11); queries keep the full OT vector
    (eq. 12). Texts are tokenized ``chunk_size`` at a time and length-sorted into batches within a chunk;
    outputs follow the input order.
    """
    from pretrieve.retrieval.encode import progress_bar

    count = len(texts)
    out = EncodedTexts(dense=None)
    with progress_bar(count, f"encode {text_type}s", enabled=show_progress) as advance:
        for first in range(0, count, chunk_size):
            chunk = texts[first:first + chunk_size]
            tokenized = tokenizer(list(chunk), truncation=True, max_length=max_length)
            order = sorted(range(len(chunk)), key=lambda i: -len(tokenized["input_ids"][i]))
            for start in range(0, len(chunk), batch_size):
                rows = order[start:start + batch_size]
                parts = _encode_batch(model, tokenizer, tokenized, rows, text_type, bf16)
                _store(out, parts, first + np.asarray(rows), count)
                advance(len(rows))
    return out


def _encode_batch(model, tokenizer, tokenized, rows: Sequence[int], text_type: str,
                  bf16: bool) -> dict[str, np.ndarray]:
    """One padded batch through the model → ``dense`` and ``ot`` (queries) or ``ot_indices``/``ot_values``."""
    from pretrieve.retrieval.encode import autocast

    representation = model.representation
    device = next(model.parameters()).device
    keys = [key for key in ("input_ids", "attention_mask", "token_type_ids") if key in tokenized]
    batch = tokenizer.pad({key: [tokenized[key][i] for i in rows] for key in keys}, return_tensors="pt")
    batch = {key: value.to(device) for key, value in batch.items()}
    with torch.inference_mode(), autocast(device, bf16):
        rep = model.encode(text_type, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    dense, ot = representation.split(rep.float())
    parts: dict[str, np.ndarray] = {}
    if dense is not None:
        parts["dense"] = dense.cpu().numpy()
    if ot is not None and text_type == "query":
        parts["ot"] = ot.cpu().numpy()
    elif ot is not None:
        values, indices = representation.sparsify(ot)
        parts["ot_indices"], parts["ot_values"] = indices.cpu().numpy().astype(np.int32), values.cpu().numpy()
    return parts


def _store(out: EncodedTexts, parts: Mapping[str, np.ndarray], rows: np.ndarray, count: int) -> None:
    """Write a batch's arrays into ``out`` at ``rows`` (allocating ``[count, width]`` arrays on first use)."""
    for name, values in parts.items():
        target = getattr(out, name)
        if target is None:
            fill = -1 if name == "ot_indices" else 0
            target = np.full((count, values.shape[1]), fill, dtype=values.dtype)
            setattr(out, name, target)
        target[rows] = values


# ------------------------------------------------------------------------------------------ end to end
def is_dupmae_model(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` is a saved dual encoder with the DupMAE representation (``dual_encoder.json``)."""
    from pretrieve.retrieval.sparse_search import representation_kind

    return representation_kind(model_dir) == "dupmae"


def load_dual_encoder(model_dir: str | Path, device: str = "auto"):
    """``(model, tokenizer, passage_max_len, query_max_len)`` of a saved dual encoder (DupMAE, sparse, hybrid, …)
    in eval mode; the lengths are the ones it was fine-tuned with (``dual_encoder.json``), else 144 / 32."""
    from transformers import AutoTokenizer

    from pretrieve.modeling.dual_encoder import DualEncoder, read_dual_encoder_config
    from pretrieve.retrieval.encoder import resolve_device

    info = read_dual_encoder_config(model_dir)
    model = DualEncoder.load(model_dir).to(resolve_device(device)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    training = info.get("training") or {}
    return model, tokenizer, int(training.get("passage_max_len") or 144), int(training.get("query_max_len") or 32)


load_dupmae_model = load_dual_encoder
"""The loader under its first name (DupMAE): any saved dual encoder."""


def build_corpus_index(model, tokenizer, corpus, max_length: int, cache_dir: str | Path | None = None,
                       model_dir: str | Path | None = None, batch_size: int = 64, bf16: bool = False,
                       factory: str = "Flat", show_progress: bool = True) -> DupMAEIndex:
    """Encode ``corpus`` (title + text) into a :class:`DupMAEIndex`, reusing ``cache_dir/dupmae-index`` when
    it was built by the same model weights, settings and texts."""
    from pretrieve.retrieval.encode import cached_corpus_index, corpus_index_settings

    texts = corpus.full_texts()
    settings = corpus_index_settings(model, model_dir, max_length, bf16, corpus.ids, texts)
    cached, current = cached_corpus_index(cache_dir, INDEX_DIR, model_dir, settings, _META_FILE, INDEX_FORMAT)
    if current:
        logger.info("DupMAE corpus index cached in %s; not re-encoding", cached)
        return DupMAEIndex.load(cached, factory=factory)
    encoded = encode_dupmae(model, tokenizer, texts, "passage", max_length, batch_size=batch_size, bf16=bf16,
                            show_progress=show_progress)
    vocab = int(model.query_tower.config.vocab_size)
    index = DupMAEIndex.build(corpus.ids, encoded.dense, encoded.ot_indices, encoded.ot_values, vocab, factory,
                              meta={"settings": settings})
    storage = index.storage()
    logger.info("DupMAE index: %d passages, %.0f bytes/passage (dense %.0f + sparse %.0f; paper's accounting %.0f)",
                len(index), storage["total_bytes"], storage["dense_bytes"], storage["sparse_bytes"],
                storage["paper_bytes"])
    if cached is not None:
        index.save(cached)
    return index


def dupmae_search(model_dir: str | Path, corpus, queries: Mapping[str, str], k: int,
                  cache_dir: str | Path | None = None, batch_size: int = 64, max_length: int | None = None,
                  query_max_length: int | None = None, device: str = "auto", bf16: bool = False,
                  show_progress: bool = True, query_block: int = 256) -> Run:
    """Exact eq. 12 top-``k`` of ``queries`` over ``corpus`` with a fine-tuned DupMAE model (see module doc).

    Lengths default to the ones the model was fine-tuned with; queries are encoded and searched
    ``query_block`` at a time (their full OT vectors are ``V`` floats each).
    """
    model, tokenizer, passage_len, query_len = load_dual_encoder(model_dir, device)
    index = build_corpus_index(model, tokenizer, corpus, max_length or passage_len, cache_dir, model_dir,
                               batch_size=batch_size, bf16=bf16, show_progress=show_progress)
    query_ids = list(queries)
    run: Run = {}
    for start in range(0, len(query_ids), query_block):
        block = query_ids[start:start + query_block]
        encoded = encode_dupmae(model, tokenizer, [queries[q] for q in block], "query", query_max_length or query_len,
                                batch_size=batch_size, bf16=bf16, show_progress=False)
        run.update(index.search_run(encoded.dense, encoded.ot, block, k))
    return run
