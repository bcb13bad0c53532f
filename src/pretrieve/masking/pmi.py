"""Corpus n-gram statistics, PMI/AMI token importance and importance-aware masking (CDMAE (Li et al. 2023) §3.2).

This module owns everything CDMAE adds on the data side: counting the n-grams of a pre-training corpus,
turning the counts into a per-token importance (average mutual information, AMI), and masking the most
important tokens first (Algorithm 1), for an MLM decoder (:class:`ImportanceMasker`) or for RetroMAE's
position-specific attention masks (:func:`importance_enhanced_mask`).

Definitions (CDMAE, Li et al. 2023, eq. 7–8), with natural logarithms:

* ``p(g) = count(g) / N_n`` for an n-gram ``g`` of order ``n``, ``N_n`` = the number of n-gram positions of
  the corpus ("the number of all the n-grams in the corpus"); n-grams never cross a chunk boundary;
* ``PMI(w_1…w_n) = log p(w_1…w_n) − Σ_k log p(w_k)`` — eq. 7 generalised to n-grams as the paper says
  ("we expand to the computation of all n-grams where 2 ≤ n ≤ L");
* ``AMI(w_i) = mean_{j=1..L-1} PMI(w_{i-j}…w_i) + mean_{j=1..L-1} PMI(w_i…w_{i+j})`` — eq. 8 is the *sum of
  two averages* (n-grams ending at ``w_i`` and n-grams starting at ``w_i``, orders 2..L), not one average
  over the 2(L−1) n-grams. Near the edges of a text fewer n-grams exist; each side averages the n-grams
  that exist (a side with none contributes 0), the natural reading of "the average PMI value of all
  possible n-gram combinations delimited by the token". n-grams never include special tokens or padding.
  ``L = 4`` (§3.2).

Choices, each stated:

* **Units.** Statistics are over the *sub-word token ids of the model's tokenizer*, read straight from the
  pre-training cache (:class:`pretrieve.data.pretrain_text.TokenizedCorpus`), not over whitespace words.
  Algorithm 1 ranks and masks *tokens* (``x = (x_1..x_n)``, ``t_i = AMI(x_i)``), so token statistics are
  exactly aligned with what the masker sees, need no second tokenisation, and make the corpus statistics
  and the batch look-ups use the same units. With the uncased WordPiece vocabulary most English words are
  one token, so the two readings differ only on rare, split words.
* **Hashed n-gram ids.** An n-gram of order ``n`` is the 64-bit polynomial hash
  ``h = ((n·P + w_1)·P + w_2)·P + … + w_n mod 2⁶⁴``. When ``(L+1)·P^L ≤ 2⁶⁴`` with ``P = 2^⌈log₂|V|⌉``
  (BERT's 30,522 ids: 15 bits, 4·15 + log₂ 5 < 64) the hash is an exact bit-packing: no collision is
  possible and orders occupy disjoint key ranges. Larger vocabularies use a fixed odd 64-bit ``P``
  (collision probability ≈ 2⁻⁶⁴ per pair of distinct n-grams).
* **Counting scales.** One streaming pass per order over the token memmap in blocks of whole chunks
  (``block_tokens`` tokens): window keys of the block → ``np.unique(..., return_counts=True)``; block
  results are merged like a binary counter (concatenate, stable sort — runs are already sorted — and
  ``np.add.reduceat``), so at most O(log blocks) partial tables exist. Peak memory is about 55 B per
  distinct n-gram of the largest order (the last merge). Measured on this machine with i.i.d. Zipfian
  tokens (nearly every 4-gram distinct, a worst case): 2·10⁷ tokens in 18 s and 1.4 GB above the baseline,
  5·10⁷ tokens (500 k chunks) in 52 s and 3.2 GB; so a million passages of ~100 tokens (10⁸ tokens) need
  at most ~6.5 GB and about two minutes — real text has far fewer distinct n-grams. SciFact (1.7 M tokens) counts in under a second (tokenising it takes ~3 s).
* **Only n-grams seen at least twice are stored.** An n-gram of the corpus missing from the table occurred
  exactly once, so a look-up miss means ``count = 1``; this is exact for every n-gram of the corpus and
  drops the hapaxes (on SciFact 60 % of the distinct bigrams, 80 % of the 3-grams, 90 % of the 4-grams).
  n-grams that are not in the corpus at all (texts from elsewhere) get the same ``count = 1`` (add-one
  floor); unseen unigrams too, so every log is finite.
* **Vectorised look-ups.** The stored keys sit in an open-addressing table (linear probing, load ≤ 1/4,
  Fibonacci hashing) built without a Python loop: keys sorted by home slot get
  ``slot_k = max(home_k, slot_{k-1} + 1)``, a running maximum. A batch looks up all its windows of all
  orders at once: one dense probe of every key's home slot, then only the ~1/6 of keys that must probe
  further are followed. AMI of a 128 × 150 batch: ~0.6 ms on one core (SciFact statistics); the whole
  ``pmi`` masker 1.7–1.8× the token-level random masker, measured side by side with
  :func:`pretrieve.masking.latency.masking_latency` (kind ``"pmi"``; CDMAE (Li et al. 2023) Table 6 reports 2.75×).
  The table costs 12 B per slot, 4–8 slots per stored n-gram (SciFact: 24 MB; load 1/2 would halve it but
  make look-ups ~50 % slower), held by each collating process.
  Precomputing AMI per corpus token was the alternative; it would need the dataset to hand the collator
  an index or the scores, and could not score texts from elsewhere.
* **Algorithm 1.** ``t_i + N(0, σ²)`` with ``σ = 1`` (footnote 3), the highest-ranked tokens are masked,
  80/10/10 replacement. The number masked is :func:`~pretrieve.masking.whole_word.masking_budget`
  (``max(1, round(p·n))``, ``n`` = maskable tokens) rather than ``⌊p·n⌋``: it differs by at most one
  token and keeps the budget identical to the random maskers', so comparisons (and the Fig. 2 analysis)
  differ only in *which* tokens are masked. ``whole_word=True`` ranks whole words by their most important
  sub-word instead (not in the paper).
* **Asymmetric use (§3.2):** CDMAE applies it to the decoder input only (``p_dec = 0.5``), the encoder
  keeps random masking (``p_enc = 0.3``); the ``cdmae`` preset of :mod:`pretrieve.train.method` does so.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from pretrieve.data.pretrain_text import TokenizedCorpus
from pretrieve.data.registry import default_cache_dir
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.masking.enhanced import visible_per_row
from pretrieve.masking.registry import register_masker
from pretrieve.masking.vocab import VocabInfo
from pretrieve.masking.whole_word import MaskedInput, RandomMasker

DEFAULT_WINDOW = 4  # L (CDMAE, Li et al. 2023, §3.2)
DEFAULT_SIGMA = 1.0  # σ of Algorithm 1's Gaussian perturbation (footnote 3)
MAX_WINDOW = 8
PMI_MASKER_DEFAULTS: dict[str, Any] = {"window": DEFAULT_WINDOW, "sigma": DEFAULT_SIGMA, "whole_word": False,
                                       "statistics": None}
"""Parameters of the ``pmi`` masker kind (``MaskerSpec.params``); ``statistics``: None = the pre-training
corpus handed to the collator, or a path (a directory written by :meth:`NgramStatistics.save`, or a
pre-training text source to count)."""

STATS_VERSION = 1
_META_FILE = "pmi_meta.json"
_HASH_BASE = 0xD6E8FEB86659FD93  # odd 64-bit multiplier of the polynomial hash (large vocabularies)
_FIBONACCI = 0x9E3779B97F4A7C15  # 2⁶⁴/φ, multiplicative hashing of keys to table slots
_EMPTY = np.uint64(0)  # empty table slot; no exact key is 0 (keys ≥ 2·P²); a hashed key is 0 with probability 2⁻⁶⁴
_LOAD_SHIFT = 2  # table size ≥ 4 × keys (load ≤ 1/4)
_U64 = np.uint64


# ---------------------------------------------------------------------- parameters
def check_pmi_params(params: Mapping[str, Any], where: str = "pmi masker") -> dict[str, Any]:
    """Validate ``pmi`` masker parameters; return them merged over :data:`PMI_MASKER_DEFAULTS`."""
    unknown = sorted(set(params) - set(PMI_MASKER_DEFAULTS))
    if unknown:
        raise ConfigError(f"{where}: unknown parameter(s) {', '.join(unknown)}; the pmi masker accepts "
                          f"{', '.join(PMI_MASKER_DEFAULTS)}")
    merged = {**PMI_MASKER_DEFAULTS, **params}
    window = merged["window"]
    if isinstance(window, bool) or not isinstance(window, int) or not 2 <= window <= MAX_WINDOW:
        raise ConfigError(f"{where}: window must be an integer in [2, {MAX_WINDOW}], got {window!r}")
    sigma = merged["sigma"]
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
        raise ConfigError(f"{where}: sigma must be a finite number ≥ 0, got {sigma!r}")
    merged["sigma"] = float(sigma)
    if not isinstance(merged["whole_word"], bool):
        raise ConfigError(f"{where}: whole_word must be true or false, got {merged['whole_word']!r}")
    if merged["statistics"] is not None and not isinstance(merged["statistics"], (str, os.PathLike)):
        raise ConfigError(f"{where}: statistics must be a path or null, got {merged['statistics']!r}")
    if merged["statistics"] is not None:
        merged["statistics"] = str(merged["statistics"])
    return merged


# ---------------------------------------------------------------------- n-gram keys
def hash_base(vocab_size: int, window: int) -> tuple[int, bool]:
    """``(P, exact)``: the polynomial base and whether keys are an exact bit-packing (see module docstring)."""
    bits = max(1, math.ceil(math.log2(max(vocab_size, 2))))
    if (window + 1) << (bits * window) <= 1 << 64:
        return 1 << bits, True
    return _HASH_BASE, False


def ngram_keys(ids: np.ndarray, order: int, base: int) -> np.ndarray:
    """Keys of every window of ``order`` consecutive ids along the last axis: ``[..., T] → [..., T-order+1]``."""
    ids = np.asarray(ids)
    width = ids.shape[-1] - order + 1
    if width <= 0:
        return np.empty(ids.shape[:-1] + (0,), dtype=_U64)
    ids = ids.astype(_U64, copy=False)
    key = np.full(ids.shape[:-1] + (width,), order, dtype=_U64)
    for j in range(order):
        key *= _U64(base)
        key += ids[..., j:j + width]
    return key


# ---------------------------------------------------------------------- counting
def count_ngrams(tokens: np.ndarray, offsets: np.ndarray, vocab_size: int, window: int = DEFAULT_WINDOW, *,
                 block_tokens: int = 1 << 23, meta: Mapping[str, Any] | None = None) -> "NgramStatistics":
    """Count unigrams (and document frequencies) and n-grams of orders 2..``window`` of a chunked corpus.

    ``tokens`` is the flat id array (a memmap is fine: it is read block by block), ``offsets`` the chunk
    boundaries (``offsets[0] = 0``, chunk ``c`` is ``tokens[offsets[c]:offsets[c+1]]``, no special tokens).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    _check_corpus_arrays(tokens, offsets, vocab_size, window)
    base, exact = hash_base(vocab_size, window)
    blocks = _blocks(offsets, block_tokens)
    lengths = np.diff(offsets)

    unigram = np.zeros(vocab_size, dtype=np.int64)
    doc_freq = np.zeros(vocab_size, dtype=np.int64)
    for first, last in blocks:
        ids = np.asarray(tokens[offsets[first]:offsets[last]], dtype=np.int64)
        unigram += np.bincount(ids, minlength=vocab_size)
        chunk = np.repeat(np.arange(last - first, dtype=np.int64), lengths[first:last])
        unique_pairs = np.unique(chunk * vocab_size + ids)
        doc_freq += np.bincount(unique_pairs % vocab_size, minlength=vocab_size)

    totals = np.zeros(window + 1, dtype=np.int64)
    totals[1] = int(lengths.sum())
    stored_keys, stored_counts = [], []
    for order in range(2, window + 1):
        totals[order] = int(np.clip(lengths - order + 1, 0, None).sum())
        keys, counts = _count_order(tokens, offsets, blocks, order, base)
        frequent = counts >= 2
        stored_keys.append(keys[frequent])
        stored_counts.append(counts[frequent])
    keys = np.concatenate(stored_keys)
    counts = np.concatenate(stored_counts).astype(np.uint32 if totals[1] < 2**32 else np.uint64)
    order = np.argsort(keys, kind="stable")
    return NgramStatistics(window=window, vocab_size=vocab_size, base=base, exact=exact, unigram_counts=unigram,
                           totals=totals, keys=keys[order], counts=counts[order], doc_freq=doc_freq,
                           num_docs=len(lengths), meta=dict(meta or {}))


def statistics_from_sequences(sequences: Iterable[Sequence[int]], vocab_size: int,
                              window: int = DEFAULT_WINDOW, **kwargs: Any) -> "NgramStatistics":
    """:func:`count_ngrams` over a list of id sequences (one chunk each; no special tokens)."""
    arrays = [np.asarray(seq, dtype=np.int64).ravel() for seq in sequences]
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int64)
    return count_ngrams(tokens, offsets, vocab_size, window, **kwargs)


def _check_corpus_arrays(tokens: np.ndarray, offsets: np.ndarray, vocab_size: int, window: int) -> None:
    if not 2 <= window <= MAX_WINDOW:
        raise ConfigError(f"n-gram window must be in [2, {MAX_WINDOW}], got {window}")
    if offsets.ndim != 1 or offsets.size < 2 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise InputError("offsets must start at 0 and never decrease (one entry per chunk boundary)",
                         field="offsets")
    if offsets[-1] > len(tokens):
        raise InputError(f"offsets end at {offsets[-1]} but there are only {len(tokens)} tokens", field="offsets")
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be ≥ 1, got {vocab_size}")


def _blocks(offsets: np.ndarray, block_tokens: int) -> list[tuple[int, int]]:
    """Consecutive chunk ranges ``[first, last)`` of about ``block_tokens`` tokens (at least one chunk)."""
    n_chunks = len(offsets) - 1
    blocks, first = [], 0
    while first < n_chunks:
        last = int(np.searchsorted(offsets, offsets[first] + max(block_tokens, 1), side="right")) - 1
        last = min(max(last, first + 1), n_chunks)
        blocks.append((first, last))
        first = last
    return blocks


def _count_order(tokens: np.ndarray, offsets: np.ndarray, blocks: list[tuple[int, int]], order: int,
                 base: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys of all order-``order`` windows inside chunks, with their counts (streaming)."""
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    lengths = np.diff(offsets)
    for first, last in blocks:
        start = offsets[first]
        ids = np.asarray(tokens[start:offsets[last]], dtype=np.int64)
        keys = ngram_keys(ids, order, base)
        chunk_end = np.repeat(offsets[first + 1:last + 1] - start, lengths[first:last])[:keys.size]
        inside = np.arange(keys.size) + order <= chunk_end
        unique, counts = np.unique(keys[inside], return_counts=True)
        parts.append((unique, counts.astype(np.int64)))
        while len(parts) >= 2 and parts[-1][0].size * 2 >= parts[-2][0].size:
            parts.append(_merge_counts(parts.pop(), parts.pop()))
    while len(parts) >= 2:
        parts.append(_merge_counts(parts.pop(), parts.pop()))
    return parts[0] if parts else (np.empty(0, dtype=_U64), np.empty(0, dtype=np.int64))


def _merge_counts(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Union of two sorted (keys, counts) tables, adding the counts of equal keys."""
    keys = np.concatenate([a[0], b[0]])
    counts = np.concatenate([a[1], b[1]])
    order = np.argsort(keys, kind="stable")  # two sorted runs: timsort merges them in linear time
    keys, counts = keys[order], counts[order]
    if keys.size == 0:
        return keys, counts
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return keys[starts], np.add.reduceat(counts, starts)


# ---------------------------------------------------------------------- statistics
@dataclass
class NgramStatistics:
    """Unigram/document counts and the n-grams (orders 2..window) seen at least twice, with a look-up table."""

    window: int
    vocab_size: int
    base: int
    exact: bool
    unigram_counts: np.ndarray  # int64 [V]
    totals: np.ndarray  # int64 [window + 1]: N_n, the number of n-gram positions of order n (index 0 unused)
    keys: np.ndarray  # uint64 [K], sorted: n-grams with count ≥ 2 (all orders)
    counts: np.ndarray  # uint32/uint64 [K]
    doc_freq: np.ndarray  # int64 [V]: chunks containing each token
    num_docs: int
    meta: dict = field(default_factory=dict)
    _table: tuple[np.ndarray, np.ndarray, int] | None = field(default=None, init=False, repr=False)
    _log_unigram: np.ndarray | None = field(default=None, init=False, repr=False)
    _log_unigram32: np.ndarray | None = field(default=None, init=False, repr=False)

    # ------------------------------------------------------------------ scalar helpers (tests, analysis)
    def ngram_count(self, ngram: Sequence[int]) -> int:
        """Corpus count of ``ngram``; for orders ≥ 2, n-grams seen once or never both read as 1."""
        ngram = [int(w) for w in ngram]
        if len(ngram) == 1:
            return int(self.unigram_counts[ngram[0]])
        if not 2 <= len(ngram) <= self.window:
            raise InputError(f"n-gram order must be in [1, {self.window}], got {len(ngram)}", field="ngram")
        key = ngram_keys(np.asarray(ngram)[None], len(ngram), self.base)[0, 0]
        at = int(np.searchsorted(self.keys, key))
        return int(self.counts[at]) if at < self.keys.size and self.keys[at] == key else 1

    def pmi(self, ngram: Sequence[int]) -> float:
        """``log p(w_1…w_n) − Σ log p(w_k)`` (eq. 7 generalised), counts floored at 1."""
        n = len(ngram)
        log_joint = math.log(max(self.ngram_count(ngram), 1)) - math.log(max(int(self.totals[n]), 1))
        return log_joint - sum(float(self.log_unigram[w]) for w in ngram)

    @property
    def log_unigram(self) -> np.ndarray:
        """``log p(w)`` per token id (float64 [V]; unseen ids count 1)."""
        if self._log_unigram is None:
            counts = np.maximum(self.unigram_counts, 1).astype(np.float64)
            self._log_unigram = np.log(counts) - math.log(max(int(self.totals[1]), 1))
        return self._log_unigram

    @property
    def log_unigram32(self) -> np.ndarray:
        if self._log_unigram32 is None:
            self._log_unigram32 = self.log_unigram.astype(np.float32)
        return self._log_unigram32

    def idf(self) -> np.ndarray:
        """Smoothed inverse document frequency per token id, ``log((1 + N) / (1 + df))`` (float32 [V]).

        Documents are the corpus chunks (the pre-training examples). Used by CPDAE's IDF-weighted
        reconstruction ablation (CPDAE, Ma et al. 2022, Table 2).
        """
        return np.log((1.0 + self.num_docs) / (1.0 + self.doc_freq)).astype(np.float32)

    # ------------------------------------------------------------------ batch importance
    def token_importance(self, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """AMI of every token of a batch (float32 [B, L]; 0 where ``valid`` is False).

        ``ids`` int [B, L]; ``valid`` bool [B, L] marks the tokens n-grams may use (not special, not padding).
        Every window of every order is looked up in one call (also windows touching padding or special
        tokens, zeroed afterwards): a dense query array and masks applied by multiplication cost less than
        compressing with boolean masks. Window sums of ``log p`` and window validity are built order by
        order from the previous order (one operation each).
        """
        ids = np.asarray(ids, dtype=np.int64)
        valid = np.asarray(valid, dtype=bool)
        if ids.ndim != 2 or ids.shape != valid.shape:
            raise InputError(f"ids and valid must be [batch, length] arrays of one shape, got {ids.shape} and "
                             f"{valid.shape}", field="input_ids")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise InputError(f"token ids must lie in [0, {self.vocab_size}) (the statistics' vocabulary)",
                             field="input_ids")
        batch, length = ids.shape
        orders = [n for n in range(2, self.window + 1) if length - n + 1 > 0]
        queries = np.empty(batch * sum(length - n + 1 for n in orders), dtype=_U64)
        ids_u = ids.astype(_U64)
        blocks, start = [], 0
        for order in orders:
            width = length - order + 1
            block = queries[start:start + batch * width].reshape(batch, width)
            start += batch * width
            if order == 2:  # 2·P² + w₀·P + w₁
                np.multiply(ids_u[:, :width], _U64(self.base), out=block)
            else:  # from order n-1: h_n = (h_{n-1} − (n−1)·P^(n−1))·P + w_{n-1} + n·P^n = h_{n-1}·P + w_{n-1} + P^n
                np.multiply(blocks[-1][:, :width], _U64(self.base), out=block)
            block += ids_u[:, order - 1:order - 1 + width]
            block += _U64((order if order == 2 else 1) * pow(self.base, order, 1 << 64) % (1 << 64))
            blocks.append(block)
        log_counts = self.lookup_log_counts(queries)

        log_p = self.log_unigram32[ids]
        left_sum = np.zeros((batch, length), dtype=np.float32)
        right_sum = np.zeros((batch, length), dtype=np.float32)
        left_n = np.zeros((batch, length), dtype=np.float32)
        right_n = np.zeros((batch, length), dtype=np.float32)
        window_log_p, inside, start = log_p, valid, 0
        for order in orders:
            width = length - order + 1
            window_log_p = window_log_p[:, :width] + log_p[:, order - 1:]
            inside = inside[:, :width] & valid[:, order - 1:]
            pmi = log_counts[start:start + batch * width].reshape(batch, width)
            start += batch * width
            pmi -= window_log_p
            pmi -= np.float32(math.log(max(int(self.totals[order]), 1)))
            pmi *= inside
            left_sum[:, order - 1:] += pmi
            right_sum[:, :width] += pmi
            left_n[:, order - 1:] += inside
            right_n[:, :width] += inside
        np.maximum(left_n, 1, out=left_n)
        np.maximum(right_n, 1, out=right_n)
        ami = left_sum / left_n
        ami += right_sum / right_n
        ami *= valid
        return ami

    def lookup_log_counts(self, keys: np.ndarray) -> np.ndarray:
        """``log count`` of each key (float32); keys not stored (seen once or never) give ``log 1 = 0``.

        The home slot of every key is probed densely (most keys end there: found, or an empty slot); only
        the keys that must probe further are gathered by index and followed slot by slot (with load ≤ 1/4
        about one key in six, for a few slots).
        """
        table_keys, table_values, shift = self._lookup_table()
        keys = np.asarray(keys, dtype=_U64)
        result = np.zeros(keys.size, dtype=np.float32)
        if keys.size == 0:
            return result
        position = ((keys * _U64(_FIBONACCI)) >> _U64(shift)).astype(np.intp)
        current = table_keys.take(position)
        found = current == keys
        hit = np.flatnonzero(found)
        result[hit] = table_values.take(position[hit])
        pending = np.flatnonzero(~found & (current != _EMPTY))
        wanted, position = keys[pending], position[pending]
        while pending.size:
            position += 1
            current = table_keys.take(position)
            found = current == wanted
            if found.any():
                result[pending[found]] = table_values.take(position[found])
            more = np.flatnonzero(~found & (current != _EMPTY))
            pending, wanted, position = pending[more], wanted[more], position[more]
        return result

    def _lookup_table(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Linear-probing table ``(keys, log counts, shift)`` built once, vectorised (module docstring)."""
        if self._table is None:
            size_bits = max(4, int(self.keys.size).bit_length() + _LOAD_SHIFT)
            shift = 64 - size_bits
            home = ((self.keys * _U64(_FIBONACCI)) >> _U64(shift)).astype(np.int64)
            order = np.argsort(home, kind="stable")
            rank = np.arange(order.size, dtype=np.int64)
            slots = np.maximum.accumulate(home[order] - rank) + rank if order.size else rank
            size = max(1 << size_bits, int(slots[-1]) + 1 if slots.size else 0) + 1  # + an empty slot at the end
            table_keys = np.zeros(size, dtype=_U64)
            table_values = np.zeros(size, dtype=np.float32)
            table_keys[slots] = self.keys[order]
            table_values[slots] = np.log(self.counts[order].astype(np.float64))
            self._table = (table_keys, table_values, shift)
        return self._table

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path) -> Path:
        """Write the statistics into ``directory`` atomically (``pmi_meta.json`` + ``.npy`` arrays)."""
        directory = Path(directory)
        with atomic_dir(directory) as tmp:
            for name in ("unigram_counts", "totals", "keys", "counts", "doc_freq"):
                np.save(tmp / f"{name}.npy", getattr(self, name))
            write_json(tmp / _META_FILE, {"version": STATS_VERSION, "window": self.window,
                                          "vocab_size": self.vocab_size, "base": str(self.base),
                                          "exact": self.exact, "num_docs": self.num_docs, "meta": self.meta})
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "NgramStatistics":
        directory = Path(directory)
        meta_path = directory / _META_FILE
        if not meta_path.exists():
            raise InputError(f"not a PMI statistics directory ({_META_FILE} missing)", path=directory)
        info = json.loads(meta_path.read_text(encoding="utf-8"))
        if info.get("version") != STATS_VERSION:
            raise InputError(f"PMI statistics version {info.get('version')} is not {STATS_VERSION}; recompute them",
                             path=directory)
        arrays = {name: np.load(directory / f"{name}.npy")
                  for name in ("unigram_counts", "totals", "keys", "counts", "doc_freq")}
        return cls(window=int(info["window"]), vocab_size=int(info["vocab_size"]), base=int(info["base"]),
                   exact=bool(info["exact"]), num_docs=int(info["num_docs"]), meta=dict(info.get("meta") or {}),
                   **arrays)

    @staticmethod
    def is_saved(directory: str | Path) -> bool:
        return (Path(directory) / _META_FILE).exists()

    def summary(self) -> dict[str, Any]:
        """Sizes for logs and reports."""
        per_order = {}
        if self.keys.size:
            for order in range(2, self.window + 1):
                low = order * pow(self.base, order) if self.exact else None
                if low is not None:
                    high = (order + 1) * pow(self.base, order)
                    per_order[order] = int(((self.keys >= _U64(low)) & (self.keys < _U64(high))).sum())
        return {"window": self.window, "tokens": int(self.totals[1]), "chunks": self.num_docs,
                "stored_ngrams": int(self.keys.size), "stored_per_order": per_order,
                "table_bytes": int(self.keys.nbytes + self.counts.nbytes)}


# ---------------------------------------------------------------------- where statistics come from
def corpus_statistics(corpus: Any, vocab_size: int, window: int = DEFAULT_WINDOW, *,
                      cache: bool = True) -> NgramStatistics:
    """Statistics of a :class:`~pretrieve.data.pretrain_text.TokenizedCorpus` (anything with ``tokens`` and
    ``offsets``), cached in a sibling directory ``<corpus cache dir>-pmi-L<window>`` when the tokens are a
    memmap of that cache (the corpus cache key already covers source, tokenizer and ``max_len``)."""
    tokens, offsets = getattr(corpus, "tokens", None), getattr(corpus, "offsets", None)
    if tokens is None or offsets is None:
        raise ConfigError(f"PMI statistics need a tokenized corpus with 'tokens' and 'offsets', got "
                          f"{type(corpus).__name__}")
    filename = getattr(tokens, "filename", None)
    target = Path(filename).parent.with_name(Path(filename).parent.name + f"-pmi-L{window}") if filename else None
    if cache and target is not None and NgramStatistics.is_saved(target):
        stats = NgramStatistics.load(target)
        if stats.vocab_size == vocab_size and int(stats.totals[1]) == int(offsets[-1]):
            return stats
    meta = dict(getattr(corpus, "meta", {}) or {})
    stats = count_ngrams(tokens, offsets, vocab_size, window, meta={"corpus": meta})
    if cache and target is not None:
        stats.save(target)
    return stats


def resolve_statistics(source: Any, *, window: int, vocab_size: int, tokenizer: Any = None,
                       max_len: int | None = None, cache_dir: str | Path | None = None) -> NgramStatistics:
    """The statistics for a ``pmi`` masker from whatever ``source`` is.

    ``source``: an :class:`NgramStatistics`; a tokenized corpus (``tokens`` + ``offsets``); a directory
    written by :meth:`NgramStatistics.save`; or a pre-training text source (BEIR directory, JSONL, plain
    text), tokenized with ``tokenizer`` at ``max_len`` into ``cache_dir`` (default
    ``$PRETRIEVE_CACHE/pretrain`` or ``~/.cache/pretrieve/pretrain``) and counted.
    """
    if isinstance(source, NgramStatistics):
        stats = source
    elif hasattr(source, "tokens") and hasattr(source, "offsets"):
        stats = corpus_statistics(source, vocab_size, window)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if NgramStatistics.is_saved(path):
            stats = NgramStatistics.load(path)
        else:
            if tokenizer is None or max_len is None:
                raise ConfigError(f"counting PMI statistics of {path} needs the tokenizer and max_len")

            corpus = TokenizedCorpus.build(path, tokenizer, max_len, cache_dir or _default_cache_dir(),
                                           show_progress=False)
            stats = corpus_statistics(corpus, vocab_size, window)
    else:
        raise ConfigError(f"cannot get PMI statistics from {type(source).__name__}")
    if stats.vocab_size != vocab_size:
        raise ConfigError(f"PMI statistics were counted for a vocabulary of {stats.vocab_size} ids, but the "
                          f"tokenizer has {vocab_size}")
    if stats.window != window:
        raise ConfigError(f"PMI statistics have window {stats.window}, the masker asks for {window}")
    return stats


def _default_cache_dir() -> Path:
    return default_cache_dir().parent / "pretrain"


# ---------------------------------------------------------------------- maskers
class ImportanceMasker:
    """Algorithm 1: mask the tokens with the highest AMI perturbed by ``N(0, sigma²)``, then 80/10/10.

    Same call signature and output as :class:`~pretrieve.masking.whole_word.RandomMasker` (selection and
    corruption are delegated to it with ``importance=``), so every objective that reads a masker's output
    works with it unchanged.
    """

    def __init__(self, info: VocabInfo, ratio: float, statistics: NgramStatistics, sigma: float = DEFAULT_SIGMA,
                 whole_word: bool = False, replace_probs: tuple[float, float, float] = (0.8, 0.1, 0.1)):
        if statistics.vocab_size != info.vocab_size:
            raise ConfigError(f"PMI statistics cover {statistics.vocab_size} token ids, the tokenizer has "
                              f"{info.vocab_size}")
        if not math.isfinite(sigma) or sigma < 0:
            raise ConfigError(f"sigma must be a finite number ≥ 0, got {sigma}")
        self.info = info
        self.statistics = statistics
        self.sigma = float(sigma)
        self._select = RandomMasker(info, ratio, whole_word=whole_word, replace_probs=replace_probs)
        self.ratio = self._select.ratio
        self.whole_word = self._select.whole_word
        self.replace_probs = self._select.replace_probs

    def __repr__(self) -> str:
        return (f"ImportanceMasker(ratio={self.ratio}, sigma={self.sigma}, window={self.statistics.window}, "
                f"whole_word={self.whole_word}, replace_probs={self.replace_probs})")

    def importance(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """AMI per token (FloatTensor[B, L], 0 at special tokens and padding), on the batch's device."""
        ids = input_ids.detach().to("cpu", torch.long)
        valid = ~self.info.is_special[ids]
        if attention_mask is not None:
            valid &= attention_mask.detach().to("cpu").bool()
        scores = self.statistics.token_importance(ids.numpy(), valid.numpy())
        return torch.from_numpy(scores).to(input_ids.device)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 generator: torch.Generator | None = None, importance: torch.Tensor | None = None) -> MaskedInput:
        """Mask one batch; ``importance`` (optional) replaces the AMI scores (the noise is still added)."""
        scores = self.importance(input_ids, attention_mask) if importance is None else importance.float()
        if self.sigma > 0:
            scores = scores + self.sigma * torch.randn(scores.shape, generator=generator, device=scores.device)
        return self._select(input_ids, attention_mask, generator=generator, importance=scores)


def importance_enhanced_mask(attention_mask: torch.Tensor, importance: torch.Tensor, visible_ratio: float,
                             sigma: float = DEFAULT_SIGMA, generator: torch.Generator | None = None) -> torch.Tensor:
    """RetroMAE's position-specific visibility [B, L, L] with Algorithm 1 choosing what each row hides.

    Same counts and structure as :func:`pretrieve.masking.enhanced_decoding_mask` (each valid row sees
    :func:`~pretrieve.masking.enhanced.visible_per_row` positions, rows ``i ≠ 0`` always see position 0,
    never themselves, never padding), but instead of a uniform sample each row ``i`` keeps the positions
    of *lowest* ``importance_j + N(0, sigma²)`` (noise drawn independently per row): the important
    tokens are hidden from most rows and must come from the sentence embedding, which is what the
    decoder-side PMI masking of CDMAE does for an MLM decoder. Special tokens should carry a low
    importance (the masker gives them 0). Exact ranking with one stable sort over [B, L, L] (ties, e.g.
    with ``sigma = 0``, go to the lower column): about 115 ms for 128 × 150 on one core, ~2× the
    ``"independent"`` sampler of :func:`~pretrieve.masking.enhanced_decoding_mask` — collate in DataLoader
    workers for long runs.
    """
    valid = attention_mask.to(torch.bool)
    if importance.shape != valid.shape:
        raise InputError(f"importance has shape {tuple(importance.shape)} but attention_mask has "
                         f"{tuple(valid.shape)}", field="importance")
    batch, length = valid.shape
    count = visible_per_row(valid.sum(dim=1), visible_ratio=visible_ratio)
    if batch == 0 or length == 0:
        return torch.zeros(batch, length, length, dtype=torch.bool, device=valid.device)
    scores = importance.float().unsqueeze(1).expand(batch, length, length).clone()
    if sigma > 0:
        scores += sigma * torch.randn(scores.shape, generator=generator, device=scores.device)
    columns = torch.arange(length, device=valid.device)
    eligible = valid.unsqueeze(2) & valid.unsqueeze(1) & (columns.view(1, -1) != columns.view(-1, 1))
    forced = eligible.clone()
    forced[:, :, 1:] = False
    forced[:, 0, :] = False  # row 0 has no forced column (its column 0 is the diagonal)
    scores.masked_fill_(~eligible, math.inf)
    scores.masked_fill_(forced, -math.inf)
    order = scores.argsort(dim=2, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(2, order, columns.expand(batch, length, length).contiguous())
    return (rank < count.view(-1, 1, 1)) & eligible


@register_masker("pmi", defaults=PMI_MASKER_DEFAULTS, check_params=check_pmi_params, needs_statistics=True)
def importance_masker(spec, info: VocabInfo, statistics: NgramStatistics | None) -> ImportanceMasker:
    """``pmi``: importance-aware masking (CDMAE Algorithm 1), which needs the corpus n-gram ``statistics``."""
    if statistics is None:
        raise ConfigError("the pmi masker needs n-gram statistics of the pre-training corpus")
    return ImportanceMasker(info, ratio=spec.ratio, statistics=statistics, sigma=float(spec.params["sigma"]),
                            whole_word=bool(spec.params["whole_word"]), replace_probs=spec.replace_probs)
