"""Maskers: random whole-word / token masking with 80/10/10 and RetroMAE enhanced-decoding attention masks.

Everything here works on token-id tensors, vectorised over the batch, and knows nothing about models.
"""

from pretrieve.masking.enhanced import enhanced_decoding_mask, to_additive_mask, visible_per_row
from pretrieve.masking.latency import masking_latency
from pretrieve.masking.vocab import VocabInfo, word_ids
from pretrieve.masking.whole_word import IGNORE_INDEX, MaskedInput, RandomMasker, masking_budget

__all__ = [
    "IGNORE_INDEX",
    "MaskedInput",
    "RandomMasker",
    "VocabInfo",
    "enhanced_decoding_mask",
    "masking_budget",
    "masking_latency",
    "to_additive_mask",
    "visible_per_row",
    "word_ids",
]
