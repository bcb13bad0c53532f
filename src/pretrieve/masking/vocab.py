"""Per-vocabulary lookup tensors for the maskers, and vectorised word segmentation.

This module owns what the maskers need to know about a tokenizer, computed once per vocabulary:
which ids are special (never masked), which tokens continue the previous word (for whole-word
masking), and which ids may serve as random replacements in 80/10/10 masking. Per batch, the
maskers only index these tensors with ``input_ids``; no token strings are looked at again.

Word boundaries follow the tokenizer family:

* WordPiece (BERT): a token continues the previous word when it starts with the model's
  continuing-subword prefix (``##``).
* Byte-level BPE (RoBERTa, GPT-2) and SentencePiece: a token *starts* a word when it begins with the
  word-start marker (``Ġ`` resp. ``▁``); every other token continues the previous word.

Special tokens are never continuations, and a continuation right after a special token (or after
padding) starts a new word, so a sequence never merges across ``[CLS]``/``<s>``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from pretrieve.errors import ConfigError, InputError

WORDPIECE_PREFIX = "##"
BYTE_LEVEL_WORD_START = "\u0120"  # 'Ġ'
SENTENCEPIECE_WORD_START = "\u2581"  # '▁'


@dataclass(frozen=True, eq=False)
class VocabInfo:
    """Lookup tensors over one vocabulary (all on one device, CPU by default).

    ``eq=False`` keeps identity comparison/hashing: comparing tensor fields element-wise would be
    meaningless for a dataclass ``==``.
    """

    vocab_size: int
    mask_token_id: int
    pad_token_id: int
    special_ids: torch.Tensor  # LongTensor[S]: CLS, SEP, PAD, MASK, UNK, BOS/EOS and added special tokens
    is_special: torch.Tensor  # BoolTensor[vocab_size]
    is_continuation: torch.Tensor  # BoolTensor[vocab_size]: token continues the previous word
    replacement_ids: torch.Tensor  # LongTensor[R]: ids allowed as random replacements (non-special)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "VocabInfo":
        """Build the lookups from a Hugging Face tokenizer (WordPiece, byte-level BPE or SentencePiece)."""
        vocab_size = len(tokenizer)
        mask_id = getattr(tokenizer, "mask_token_id", None)
        pad_id = getattr(tokenizer, "pad_token_id", None)
        if mask_id is None:
            raise ConfigError("the tokenizer has no mask token; masked-language-model masking needs one")
        if pad_id is None:
            raise ConfigError("the tokenizer has no padding token; batches cannot be padded")

        special_ids = sorted(_special_token_ids(tokenizer, vocab_size))
        is_special = torch.zeros(vocab_size, dtype=torch.bool)
        is_special[torch.tensor(special_ids, dtype=torch.long)] = True

        tokens = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
        is_continuation = torch.tensor(_continuation_flags(tokenizer, tokens), dtype=torch.bool)
        is_continuation &= ~is_special

        return cls(
            vocab_size=vocab_size,
            mask_token_id=int(mask_id),
            pad_token_id=int(pad_id),
            special_ids=torch.tensor(special_ids, dtype=torch.long),
            is_special=is_special,
            is_continuation=is_continuation,
            replacement_ids=torch.nonzero(~is_special).flatten(),
        )

    def to(self, device: torch.device | str) -> "VocabInfo":
        """The same lookups on ``device`` (returns ``self`` when they are already there)."""
        device = torch.device(device)
        if self.is_special.device == device:
            return self
        return replace(
            self,
            special_ids=self.special_ids.to(device),
            is_special=self.is_special.to(device),
            is_continuation=self.is_continuation.to(device),
            replacement_ids=self.replacement_ids.to(device),
        )


def _special_token_ids(tokenizer: Any, vocab_size: int) -> set[int]:
    """Ids of the named special tokens plus every added token flagged ``special``."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i, token in added.items() if getattr(token, "special", False))
    return {i for i in ids if 0 <= i < vocab_size}


def _continuation_flags(tokenizer: Any, tokens: list[str | None]) -> list[bool]:
    """Per-id flag 'continues the previous word', by the tokenizer family's word-boundary convention."""
    strings = [token or "" for token in tokens]
    wordpiece_prefix = _wordpiece_prefix(tokenizer, strings)
    if wordpiece_prefix is not None:
        cut = len(wordpiece_prefix)
        return [len(s) > cut and s.startswith(wordpiece_prefix) for s in strings]
    for marker in (BYTE_LEVEL_WORD_START, SENTENCEPIECE_WORD_START):
        if any(s.startswith(marker) for s in strings):
            return [not s.startswith(marker) for s in strings]
    raise ConfigError(
        f"cannot tell word boundaries for tokenizer {type(tokenizer).__name__}: it is neither WordPiece "
        f"('{WORDPIECE_PREFIX}' pieces) nor byte-level BPE ('{BYTE_LEVEL_WORD_START}') nor SentencePiece "
        f"('{SENTENCEPIECE_WORD_START}'); use token-level masking (whole_word=False) only with a supported tokenizer"
    )


def _wordpiece_prefix(tokenizer: Any, strings: list[str]) -> str | None:
    """The continuing-subword prefix when the tokenizer is WordPiece, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        model = backend.model
        if type(model).__name__ == "WordPiece":
            return model.continuing_subword_prefix
        return None
    # Slow (pure Python) tokenizers: recognise WordPiece by its '##' pieces.
    if any(s.startswith(WORDPIECE_PREFIX) and len(s) > len(WORDPIECE_PREFIX) for s in strings):
        return WORDPIECE_PREFIX
    return None


def word_ids(input_ids: torch.Tensor, info: VocabInfo,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Word index of every token within its sequence (0, 1, 2, ...), -1 for special tokens and padding.

    A word starts at every non-continuation token and at every token right after a special token or
    padding. Vectorised with a cumulative sum; ``attention_mask`` (optional) marks extra padding
    positions whose id is not the pad id.
    """
    check_input_ids(input_ids, info)
    lookups = info.to(input_ids.device)
    in_word = ~lookups.is_special[input_ids]
    if attention_mask is not None:
        in_word &= attention_mask.to(torch.bool)
    return word_index(in_word, lookups.is_continuation[input_ids])


def word_index(in_word: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """Word index per position given which positions belong to words and which continue a word.

    ``in_word`` BoolTensor[B,L] (False at specials/padding), ``continuation`` BoolTensor[B,L].
    Returns LongTensor[B,L] with -1 outside words.
    """
    previous_in_word = torch.zeros_like(in_word)
    previous_in_word[:, 1:] = in_word[:, :-1]
    starts = in_word & (~continuation | ~previous_in_word)
    index = torch.cumsum(starts, dim=1) - 1
    return index.masked_fill_(~in_word, -1)


def check_input_ids(input_ids: torch.Tensor, info: VocabInfo) -> None:
    """Reject input ids the lookups cannot index (wrong rank, dtype, or outside the vocabulary)."""
    if input_ids.dim() != 2:
        raise InputError(f"input_ids must be a [batch, length] tensor, got shape {tuple(input_ids.shape)}",
                         field="input_ids")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise InputError(f"input_ids must be an integer tensor, got {input_ids.dtype}", field="input_ids")
    if input_ids.numel():
        low, high = (int(v) for v in torch.aminmax(input_ids))
        if low < 0 or high >= info.vocab_size:
            raise InputError(f"input_ids must lie in [0, {info.vocab_size}) (the tokenizer's vocabulary); "
                             f"got values in [{low}, {high}]", field="input_ids")
