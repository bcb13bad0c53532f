"""Per-batch latency of the maskers, measured side by side in one process (used by ``pretrieve bench``).

Kinds:

* ``random``: token-level random masking with 80/10/10 (``RandomMasker(whole_word=False)``);
* ``whole_word``: whole-word random masking with 80/10/10 (``RandomMasker(whole_word=True)``);
* ``enhanced``: RetroMAE enhanced-decoding attention masks [B, L, L] (``enhanced_decoding_mask`` with
  its default ``"cyclic"`` sampler, what the collator uses);
* ``enhanced_independent``: the same masks with every row sampled independently (not measured by
  default; ~10× slower);
* ``pmi``: CDMAE's importance-aware masking (token-level Algorithm 1: AMI look-ups of every n-gram of the
  batch, Gaussian noise, top-k, 80/10/10; ``ImportanceMasker``) — compare with ``random``, the same
  selection rule without importance (CDMAE, Li et al. 2023, Table 6: batch 128, length 150). Its n-gram statistics are
  ``pmi_statistics`` when given, else counted from ``texts`` before timing starts. Not in
  ``DEFAULT_KINDS``.

The texts are tokenised once (truncated and padded to ``max_len``), repeated to fill one batch, and
each round times every kind once, in turn, so that drifts of a shared machine hit all kinds alike;
the order rotates from round to round, because the kind that runs right after the [B, L, L]
enhanced masks pays for their cache and allocator churn. The result is the median over
``repeats`` rounds, after one warm-up round. Torch's intra-op thread count is left as the caller
set it (on a shared 2-core machine, ``torch.set_num_threads(1)`` gives steadier numbers).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pretrieve.errors import ConfigError, InputError
from pretrieve.masking.enhanced import enhanced_decoding_mask
from pretrieve.masking.pmi import DEFAULT_WINDOW, ImportanceMasker, NgramStatistics, statistics_from_sequences
from pretrieve.masking.vocab import VocabInfo
from pretrieve.masking.whole_word import RandomMasker

KINDS = ("random", "whole_word", "enhanced", "enhanced_independent", "pmi")
DEFAULT_KINDS = ("random", "whole_word", "enhanced")


def masking_latency(tokenizer: Any, texts: list[str], batch_size: int = 128, max_len: int = 150,
                    repeats: int = 20, kinds: Sequence[str] = DEFAULT_KINDS, *, mask_ratio: float = 0.3,
                    visible_ratio: float = 0.5, seed: int = 0,
                    pmi_statistics: NgramStatistics | None = None) -> dict[str, float]:
    """Median seconds per batch for each masking kind (defaults: RetroMAE's 0.3 encoder ratio, 0.5 decoder)."""
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise ConfigError(f"unknown masking kind(s) {unknown}; choose from {list(KINDS)}")
    if not texts:
        raise InputError("masking_latency needs at least one text", field="texts")
    if batch_size < 1 or max_len < 2 or repeats < 1:
        raise ConfigError(f"batch_size, max_len and repeats must be positive (max_len >= 2), got "
                          f"{batch_size}, {max_len}, {repeats}")

    input_ids, attention_mask = _batch(tokenizer, texts, batch_size, max_len)
    info = VocabInfo.from_tokenizer(tokenizer)
    generator = torch.Generator().manual_seed(seed)
    runs = _runners(info, input_ids, attention_mask, generator, mask_ratio, visible_ratio)
    if "pmi" in kinds:
        if pmi_statistics is None:
            pmi_statistics = _text_statistics(tokenizer, texts, info.vocab_size)
        pmi_masker = ImportanceMasker(info, mask_ratio, pmi_statistics)
        runs["pmi"] = lambda: pmi_masker(input_ids, attention_mask, generator)

    timings: dict[str, list[float]] = {kind: [] for kind in kinds}
    order = list(dict.fromkeys(kinds))
    for round_index in range(repeats + 1):
        shift = round_index % len(order)  # rotate: the kind run right after a big one pays for the cache
        for kind in order[shift:] + order[:shift]:
            start = time.perf_counter()
            runs[kind]()
            elapsed = time.perf_counter() - start
            if round_index > 0:  # round 0 warms up allocators and kernels
                timings[kind].append(elapsed)
    return {kind: statistics.median(values) for kind, values in timings.items()}


def _batch(tokenizer: Any, texts: list[str], batch_size: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of ``batch_size`` texts (cycled), truncated and padded to ``max_len``."""
    chosen = [texts[i % len(texts)] for i in range(batch_size)]
    encoded = tokenizer(chosen, truncation=True, max_length=max_len, padding="max_length",
                        return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def _text_statistics(tokenizer: Any, texts: list[str], vocab_size: int) -> NgramStatistics:
    """n-gram statistics of the texts themselves (one chunk per text, no special tokens)."""
    sequences = tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
    return statistics_from_sequences(sequences, vocab_size, DEFAULT_WINDOW)


def _runners(info: VocabInfo, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             generator: torch.Generator, mask_ratio: float,
             visible_ratio: float) -> dict[str, Callable[[], object]]:
    token_masker = RandomMasker(info, mask_ratio, whole_word=False)
    word_masker = RandomMasker(info, mask_ratio, whole_word=True)
    return {
        "random": lambda: token_masker(input_ids, attention_mask, generator),
        "whole_word": lambda: word_masker(input_ids, attention_mask, generator),
        "enhanced": lambda: enhanced_decoding_mask(attention_mask, visible_ratio=visible_ratio,
                                                   generator=generator),
        "enhanced_independent": lambda: enhanced_decoding_mask(attention_mask, visible_ratio=visible_ratio,
                                                               generator=generator, sampler="independent"),
    }
