"""Search with a model fine-tuned with the ``sparse`` or ``hybrid`` representation (CoT-MoTE, Ma et al. 2023, eq. 4–6, Table 3).

A model whose ``dual_encoder.json`` declares ``"representation": {"type": "sparse" | "hybrid", ...}``
(:mod:`pretrieve.modeling.sparse`) encodes a text into a SPLADE vector ``w`` (``[V]``, mostly zeros) and, for
``hybrid``, a dense [CLS] vector ``h`` (``[H]``) beside it. One encoding of the corpus serves four search modes
(:data:`SEARCH_MODES`):

========== ========================================================================= ===============
mode       score of query ``q`` and passage ``d``                                    models
========== ========================================================================= ===============
``dense``  ``h_q · h_d`` — the [CLS] part                                           hybrid
``sparse`` ``w_q · w_d`` — the SPLADE part, through the inverted index              sparse, hybrid
``hybrid`` ``α·(h_q · h_d) + β·(w_q · w_d)`` (eq. 6) with the α, β the model was    hybrid
           trained with (``representation.dense_weight`` / ``sparse_weight``;
           overridable)
``rrf``    reciprocal rank fusion of the dense and the sparse top-``N``:             hybrid
           ``Σ 1 / (60 + rank)`` over the lists that hold ``d`` (Cormack et al.
           2009, ``k = 60``; ``N = max(k, rrf_depth)``, default 1000)
========== ========================================================================= ===============

By default a model is searched as it was trained: ``hybrid`` for a hybrid model, ``sparse`` for a sparse one.

**Everything is exact.** Passages' SPLADE vectors are stored in a
:class:`~pretrieve.retrieval.sparse_index.SparseIndex` and queries are kept as sparse vectors, so the sparse
scores are accumulated over the posting lists of the query's terms only; dense scores are float32 matrix
products with every passage vector. Top-``k`` ties are broken by corpus row (ascending), as in
:func:`~pretrieve.retrieval.sparse_index.top_k_rows`.

**Hybrid: brute force, not a threshold search.** :mod:`pretrieve.retrieval.hybrid` (DupMAE) takes candidates
from both indexes and rescores them with a certified bound, widening the depth until the bound holds. Here the
hybrid scores of a block of queries are computed for *every* passage — ``α·(Q_h H_dᵀ) + β·(Q_w postings)`` —
and the top ``k`` taken once. Both component searches are exhaustive anyway (a flat dense scan and a sparse
accumulation that touches every posting list of the query's terms), so the candidate search could not skip
any of that work; it would only add the rescoring and, when the bound fails at the first depth (usual for
``k = 1000`` on a few thousand passages), repeat both searches. Brute force costs exactly one dense scan and one
sparse accumulation per query block; query blocks keep the dense ``[Q, N]`` score block under
``block_elements`` floats (2²⁶ = 256 MB), so it stays fast for the 5k–50k passage collections this targets
(SciFact's 5,183 passages × 300 queries: well under a second per mode once encoded). For millions of passages
an approximate or pruned component index with the certified rescoring of :mod:`~pretrieve.retrieval.hybrid`
would be the way.

**Routing.** Texts are encoded with :meth:`DualEncoder.encode(text_type, …)
<pretrieve.modeling.dual_encoder.DualEncoder.encode>`: queries by the query tower with ``text_type="query"``,
passages by the passage tower with ``"passage"``. A CoT-MoTE model (its ``config.json`` declares ``mote``) is
loaded with both experts, so queries go through Q-FFN and passages through P-FFN; a model with separate towers
(``tied: false``) uses its two towers.

**Cache.** :func:`build_corpus_index` keeps the encoded corpus in ``cache_dir/splade-index`` (``dense.npy``,
``sparse/``, ``ids.json``, ``meta.json``) with the model path and weight fingerprint, the representation,
the passage length, bf16 and a hash of the ids and texts; a later call with the same settings reuses it, so
searching several modes encodes the corpus once.

:func:`sparse_search` is what :func:`pretrieve.retrieval.mining.dense_search` dispatches to for such a model
(``pretrieve dense --mode``, ``pretrieve mine``, the recipe's evaluate stage with ``modes:``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp
import torch

from pretrieve.data.trec import Run, run_from_arrays
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.retrieval.sparse_index import DEFAULT_BLOCK_ELEMENTS, SparseIndex, top_k_rows

logger = logging.getLogger(__name__)

SEARCH_MODES = ("dense", "sparse", "hybrid", "rrf")
SPARSE_KINDS = ("sparse", "hybrid")
MODES_BY_KIND = {"sparse": ("sparse",), "hybrid": SEARCH_MODES}
RRF_K = 60
DEFAULT_RRF_DEPTH = 1000
INDEX_FORMAT = "pretrieve-splade-index/1"
INDEX_DIR = "splade-index"
_DENSE_FILE = "dense.npy"
_SPARSE_DIR = "sparse"
_IDS_FILE = "ids.json"
_META_FILE = "meta.json"


# ------------------------------------------------------------------------------------------------ models
def representation_kind(model_dir: str | Path) -> str | None:
    """The representation type a saved dual encoder declares (``dual_encoder.json``), or None for other models."""
    path = Path(str(model_dir)) / "dual_encoder.json"
    if not path.exists():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    return (info.get("representation") or {}).get("type")


def is_sparse_model(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` is a dual encoder fine-tuned with the ``sparse`` or ``hybrid`` representation."""
    return representation_kind(model_dir) in SPARSE_KINDS


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


# ---------------------------------------------------------------------------------------------- encoding
@dataclass
class EncodedTexts:
    """Encodings of ``N`` texts: the dense [CLS] part ``[N, H]`` (hybrid models; else None) and the SPLADE part
    as a CSR matrix ``[N, V]``."""

    dense: np.ndarray | None
    sparse: sp.csr_matrix

    def __len__(self) -> int:
        return self.sparse.shape[0]


def split_representation(representation, rep: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(dense or None, sparse)`` parts of representation rows of a sparse or hybrid model."""
    if representation.kind == "hybrid":
        return representation.split(rep)
    if representation.kind == "sparse":
        return None, rep
    raise ConfigError(f"representation '{representation.kind}' is neither sparse nor hybrid")


def encode_texts(model, tokenizer, texts: Sequence[str], text_type: str, max_length: int, batch_size: int = 64,
                 bf16: bool = False, show_progress: bool = False, chunk_size: int = 65536) -> EncodedTexts:
    """Encode ``texts`` with a sparse/hybrid :class:`~pretrieve.modeling.dual_encoder.DualEncoder` as
    ``text_type`` (``"query"`` or ``"passage"``: the tower and, for MoTE models, the expert).

    Texts are tokenized ``chunk_size`` at a time and length-sorted into batches within a chunk (as
    :func:`pretrieve.retrieval.hybrid.encode_dupmae`); outputs follow the input order.
    """
    from pretrieve.retrieval.encode import progress_bar

    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    dense_blocks, sparse_blocks, order_blocks = [], [], []
    with progress_bar(len(texts), f"encode {text_type}s", enabled=show_progress) as advance:
        for first in range(0, len(texts), chunk_size):
            chunk = list(texts[first:first + chunk_size])
            tokenized = tokenizer(chunk, truncation=True, max_length=max_length)
            order = sorted(range(len(chunk)), key=lambda i: -len(tokenized["input_ids"][i]))
            for start in range(0, len(chunk), batch_size):
                rows = order[start:start + batch_size]
                dense, sparse = _encode_batch(model, tokenizer, tokenized, rows, text_type, bf16)
                dense_blocks.append(dense)
                sparse_blocks.append(sparse)
                order_blocks.append(first + np.asarray(rows, dtype=np.int64))
                advance(len(rows))
    if not texts:
        hybrid = model.representation.kind == "hybrid"
        vocab = int(model.query_tower.config.vocab_size)
        return EncodedTexts(np.zeros((0, model.representation.hidden_size), np.float32) if hybrid else None,
                            sp.csr_matrix((0, vocab), dtype=np.float32))
    inverse = np.argsort(np.concatenate(order_blocks), kind="stable")
    sparse = sp.vstack(sparse_blocks, format="csr")[inverse]
    dense = None if dense_blocks[0] is None else np.concatenate(dense_blocks)[inverse]
    return EncodedTexts(dense, sp.csr_matrix(sparse, dtype=np.float32))


def _encode_batch(model, tokenizer, tokenized, rows: Sequence[int], text_type: str,
                  bf16: bool) -> tuple[np.ndarray | None, sp.csr_matrix]:
    """One padded batch through the model → ``(dense [B, H] or None, sparse CSR [B, V])``."""
    from pretrieve.retrieval.encode import autocast

    device = next(model.parameters()).device
    keys = [key for key in ("input_ids", "attention_mask", "token_type_ids") if key in tokenized]
    batch = tokenizer.pad({key: [tokenized[key][i] for i in rows] for key in keys}, return_tensors="pt")
    batch = {key: value.to(device) for key, value in batch.items()}
    with torch.inference_mode(), autocast(device, bf16):
        rep = model.encode(text_type, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    dense, sparse = split_representation(model.representation, rep.float())
    return (None if dense is None else dense.cpu().numpy().astype(np.float32),
            sp.csr_matrix(sparse.cpu().numpy().astype(np.float32)))


# ------------------------------------------------------------------------------------------------ index
class SpladeIndex:
    """The encoded corpus of a sparse/hybrid model: dense [CLS] rows (or None) + a :class:`SparseIndex`."""

    def __init__(self, ids: Sequence[str], sparse: SparseIndex, dense: np.ndarray | None = None,
                 meta: Mapping[str, Any] | None = None):
        self.ids = list(ids)
        self.sparse = sparse
        self.dense = None if dense is None else np.ascontiguousarray(dense, dtype=np.float32)
        for name, size in (("sparse", len(sparse)), ("dense", None if dense is None else len(dense))):
            if size is not None and size != len(self.ids):
                raise InputError(f"the {name} part holds {size} passages but {len(self.ids)} ids were given")
        self.meta = dict(meta or {})

    @classmethod
    def from_encoded(cls, ids: Sequence[str], encoded: EncodedTexts,
                     meta: Mapping[str, Any] | None = None) -> "SpladeIndex":
        return cls(ids, SparseIndex(encoded.sparse, ids), encoded.dense, meta)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def modes(self) -> tuple[str, ...]:
        return SEARCH_MODES if self.dense is not None else ("sparse",)

    def storage(self) -> dict[str, float]:
        """Bytes per passage: dense part (float32) and sparse part as stored (see ``SparseIndex.storage_bytes``)."""
        sparse = self.sparse.storage_bytes()
        dense = 0.0 if self.dense is None else float(self.dense.shape[1] * self.dense.itemsize)
        return {"dense_bytes": dense, "sparse_bytes": sparse["per_document"],
                "total_bytes": dense + sparse["per_document"], "sparse_entries": sparse["entries_per_document"]}

    # ------------------------------------------------------------------ scoring
    def scores(self, queries: EncodedTexts, mode: str, dense_weight: float = 1.0,
               sparse_weight: float = 1.0) -> np.ndarray:
        """Exact ``dense`` / ``sparse`` / ``hybrid`` scores of every query with every passage, float32 ``[Q, N]``."""
        self._check(queries, mode)
        if mode == "sparse":
            return self.sparse.score_all(queries.sparse)
        dense = np.asarray(queries.dense, dtype=np.float32) @ self.dense.T
        if mode == "dense":
            return dense
        if mode == "hybrid":
            return (np.float32(dense_weight) * dense
                    + np.float32(sparse_weight) * self.sparse.score_all(queries.sparse)).astype(np.float32)
        raise ConfigError(f"scores(): mode must be dense, sparse or hybrid, got '{mode}'")

    def search(self, queries: EncodedTexts, k: int, mode: str = "hybrid", dense_weight: float = 1.0,
               sparse_weight: float = 1.0, rrf_k: int = RRF_K, rrf_depth: int = DEFAULT_RRF_DEPTH,
               block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by ``mode``: ``(scores [Q, k'], rows [Q, k'])``, best first; ``k' = min(k, N)`` except for
        ``rrf`` (at most the size of the union of the two lists; missing places are row ``-1``)."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        self._check(queries, mode)
        if mode == "rrf":
            depth = min(len(self), max(k, rrf_depth))
            _, dense_rows = self.search(queries, depth, "dense", block_elements=block_elements)
            _, sparse_rows = self.search(queries, depth, "sparse", block_elements=block_elements)
            return rrf_fuse([dense_rows, sparse_rows], k, rrf_k=rrf_k)
        count, k = len(queries), min(k, len(self))
        out_scores = np.zeros((count, k), dtype=np.float32)
        out_rows = np.zeros((count, k), dtype=np.int64)
        block = max(1, block_elements // max(1, len(self)))
        for start in range(0, count, block):
            part = slice(start, start + block)
            block_queries = EncodedTexts(None if queries.dense is None else queries.dense[part], queries.sparse[part])
            scores = self.scores(block_queries, mode, dense_weight, sparse_weight)
            out_rows[part] = top_k_rows(scores, k)
            out_scores[part] = np.take_along_axis(scores, out_rows[part], axis=1)
        return out_scores, out_rows

    def search_run(self, queries: EncodedTexts, query_ids: Sequence[str], k: int, mode: str = "hybrid",
                   **options: Any) -> Run:
        scores, rows = self.search(queries, k, mode, **options)
        return run_from_arrays(query_ids, self.ids, rows, scores)

    def _check(self, queries: EncodedTexts, mode: str) -> None:
        if mode not in SEARCH_MODES:
            raise ConfigError(f"unknown search mode '{mode}' (choose from {', '.join(SEARCH_MODES)})")
        if mode != "sparse" and (self.dense is None or queries.dense is None):
            raise ConfigError(f"search mode '{mode}' needs the dense [CLS] part (a 'hybrid' model)")
        if queries.sparse.shape[1] != self.sparse.dim:
            raise InputError(f"query vectors have {queries.sparse.shape[1]} terms but the index {self.sparse.dim}")
        if queries.dense is not None and self.dense is not None and queries.dense.shape[1] != self.dense.shape[1]:
            raise InputError(f"dense query vectors have {queries.dense.shape[1]} dimensions but the index "
                             f"{self.dense.shape[1]}")

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """``dense.npy`` (hybrid), ``sparse/``, ``ids.json`` and ``meta.json`` in ``path``, atomically."""
        path = Path(path)
        with atomic_dir(path) as tmp:
            if self.dense is not None:
                np.save(tmp / _DENSE_FILE, self.dense)
            self.sparse.save(tmp / _SPARSE_DIR)
            with open(tmp / _IDS_FILE, "w", encoding="utf-8") as handle:
                json.dump(self.ids, handle)
            write_json(tmp / _META_FILE, {"format": INDEX_FORMAT, **self.meta})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SpladeIndex":
        path = Path(path)
        meta = read_index_meta(path)
        if meta is None:
            raise InputError(f"not a pretrieve sparse/hybrid search index ({_META_FILE} missing or not ours)",
                             path=path)
        ids = json.loads((path / _IDS_FILE).read_text(encoding="utf-8"))
        dense = np.load(path / _DENSE_FILE) if (path / _DENSE_FILE).exists() else None
        meta.pop("format", None)
        return cls(ids, SparseIndex.load(path / _SPARSE_DIR), dense, meta)


def read_index_meta(path: Path) -> dict[str, Any] | None:
    from pretrieve.retrieval.encode import read_index_meta as read_meta

    return read_meta(path, _META_FILE, INDEX_FORMAT)


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


# ------------------------------------------------------------------------------------------ end to end
def build_corpus_index(model, tokenizer, corpus, max_length: int, cache_dir: str | Path | None = None,
                       model_dir: str | Path | None = None, batch_size: int = 64, bf16: bool = False,
                       show_progress: bool = True) -> SpladeIndex:
    """Encode ``corpus`` (title + text) as passages into a :class:`SpladeIndex`, reusing
    ``cache_dir/splade-index`` when it was built from the same model weights, settings and texts."""
    from pretrieve.retrieval.encode import cached_corpus_index, corpus_index_settings

    texts = corpus.full_texts()
    settings = corpus_index_settings(model, model_dir, max_length, bf16, corpus.ids, texts)
    cached, current = cached_corpus_index(cache_dir, INDEX_DIR, model_dir, settings, _META_FILE, INDEX_FORMAT)
    if current:
        logger.info("sparse/hybrid corpus index cached in %s; not re-encoding", cached)
        return SpladeIndex.load(cached)
    encoded = encode_texts(model, tokenizer, texts, "passage", max_length, batch_size=batch_size, bf16=bf16,
                           show_progress=show_progress)
    index = SpladeIndex.from_encoded(corpus.ids, encoded, meta={"settings": settings})
    storage = index.storage()
    logger.info("sparse/hybrid index: %d passages, %.0f bytes/passage (dense %.0f + sparse %.0f, %.1f terms)",
                len(index), storage["total_bytes"], storage["dense_bytes"], storage["sparse_bytes"],
                storage["sparse_entries"])
    if cached is not None:
        index.save(cached)
    return index


def hybrid_weights(representation, dense_weight: float | None = None,
                   sparse_weight: float | None = None) -> tuple[float, float]:
    """α and β: the overrides, else the ones the model was trained with (1, 1 for a sparse model)."""
    alpha = dense_weight if dense_weight is not None else getattr(representation, "dense_weight", 1.0)
    beta = sparse_weight if sparse_weight is not None else getattr(representation, "sparse_weight", 1.0)
    return float(alpha), float(beta)


def sparse_search(model_dir: str | Path, corpus, queries: Mapping[str, str], k: int, mode: str | None = None,
                  cache_dir: str | Path | None = None, batch_size: int = 64, max_length: int | None = None,
                  query_max_length: int | None = None, device: str = "auto", bf16: bool = False,
                  show_progress: bool = True, dense_weight: float | None = None, sparse_weight: float | None = None,
                  rrf_k: int = RRF_K, rrf_depth: int = DEFAULT_RRF_DEPTH) -> Run:
    """Exact top-``k`` of ``queries`` over ``corpus`` with a fine-tuned sparse/hybrid model (module docstring).

    ``mode`` defaults to the trained representation; lengths default to the ones the model was fine-tuned with.
    """
    from pretrieve.retrieval.hybrid import load_dual_encoder

    kind = representation_kind(model_dir)
    mode = resolve_mode(kind, mode)
    model, tokenizer, passage_len, query_len = load_dual_encoder(model_dir, device)
    index = build_corpus_index(model, tokenizer, corpus, max_length or passage_len, cache_dir, model_dir,
                               batch_size=batch_size, bf16=bf16, show_progress=show_progress)
    query_ids = list(queries)
    encoded = encode_texts(model, tokenizer, [queries[q] for q in query_ids], "query", query_max_length or query_len,
                           batch_size=batch_size, bf16=bf16, show_progress=show_progress)
    alpha, beta = hybrid_weights(model.representation, dense_weight, sparse_weight)
    return index.search_run(encoded, query_ids, k, mode, dense_weight=alpha, sparse_weight=beta, rrf_k=rrf_k,
                            rrf_depth=rrf_depth)
