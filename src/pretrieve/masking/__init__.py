"""Maskers: random whole-word / token masking with 80/10/10 and RetroMAE enhanced-decoding attention masks.

Everything here works on token-id tensors, vectorised over the batch, and knows nothing about models.

Importing this package registers the built-in maskers (:data:`~pretrieve.masking.registry.MASKERS`): ``wwm`` and
``token`` (:mod:`~pretrieve.masking.whole_word`), ``pmi`` (:mod:`~pretrieve.masking.pmi`). A new masker is one module
here with a ``@register_masker`` builder, plus its import below.
"""

from pretrieve.masking.enhanced import enhanced_decoding_mask, to_additive_mask, visible_per_row
from pretrieve.masking.latency import masking_latency
from pretrieve.masking.vocab import VocabInfo, word_ids
from pretrieve.masking.registry import MASKERS, MaskerKind, masker_kind, register_masker
from pretrieve.masking.whole_word import IGNORE_INDEX, MaskedInput, RandomMasker, masking_budget
from pretrieve.masking import pmi  # noqa: E402,F401  (registers pmi)

__all__ = [
    "IGNORE_INDEX",
    "MASKERS",
    "MaskerKind",
    "MaskedInput",
    "RandomMasker",
    "VocabInfo",
    "enhanced_decoding_mask",
    "masking_budget",
    "masker_kind",
    "masking_latency",
    "register_masker",
    "to_additive_mask",
    "visible_per_row",
    "word_ids",
]
