"""The one pooling function: token states ``[B, L, H]`` → one vector per text, as sentence-transformers computes it.

:func:`pool` reproduces sentence-transformers' padded-batch code: ``cls`` takes the first non-padding position,
``mean`` is ``sum(h * mask) / clamp(sum(mask), 1e-9)`` accumulated in float32 for half-precision inputs, ``max``
fills padding with ``-inf``, ``weightedmean`` weights position ``i`` (counted from the first real token) by
``i + 1``, ``lasttoken`` takes the last real token. Several modes are concatenated in the order given. Used by the
fine-tuned representations (:mod:`pretrieve.modeling.representations`) and by the sentence-transformers encoder
(:class:`pretrieve.modeling.sentence_transformer.DenseEncoder`), so a model exported by
:mod:`pretrieve.modeling.export` encodes the same vectors in sentence-transformers and here.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from pretrieve.errors import ConfigError

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def pool(token_embeddings: Tensor, attention_mask: Tensor, modes: str | Sequence[str]) -> Tensor:
    """Pool ``[B, L, H]`` token embeddings to ``[B, H * len(modes)]`` (modes concatenated in order)."""
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    return torch.cat([_pool_one(token_embeddings, attention_mask, mode) for mode in modes], dim=-1)


def _pool_one(token_embeddings: Tensor, attention_mask: Tensor, mode: str) -> Tensor:
    """One pooling mode, as sentence-transformers computes it on a padded batch."""
    accumulate = torch.float32 if token_embeddings.dtype in (torch.float16, torch.bfloat16) else token_embeddings.dtype
    if mode == "cls":
        first = attention_mask.to(torch.int).argmax(dim=1)  # first real token (handles left padding)
        return token_embeddings[torch.arange(token_embeddings.size(0), device=first.device), first]
    if mode in ("mean", "mean_sqrt_len_tokens"):
        mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
        summed = (token_embeddings * mask).sum(dim=1, dtype=accumulate)
        count = torch.clamp(mask.sum(dim=1, dtype=accumulate), min=1e-9)
        denominator = count if mode == "mean" else torch.sqrt(count)
        return (summed / denominator).to(token_embeddings.dtype)
    if mode == "max":
        mask = attention_mask.unsqueeze(-1).expand_as(token_embeddings)
        return token_embeddings.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    if mode == "weightedmean":
        mask = attention_mask.unsqueeze(-1).to(accumulate)
        positions = torch.arange(1, token_embeddings.size(1) + 1, device=token_embeddings.device, dtype=accumulate)
        left_pad = attention_mask.to(torch.int32).argmax(dim=1)
        weights = mask * (positions.view(1, -1, 1) - left_pad.view(-1, 1, 1))
        summed = (token_embeddings * weights).sum(dim=1)
        return (summed / torch.clamp(weights.sum(dim=1), min=1e-9)).to(token_embeddings.dtype)
    if mode == "lasttoken":
        batch, length, hidden = token_embeddings.shape
        values, flipped = attention_mask.flip(1).max(1)
        flipped = torch.where(values == 0, length - 1, flipped)
        last = (length - flipped - 1).view(batch, 1, 1).expand(-1, 1, hidden)
        masked = token_embeddings * attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
        return torch.gather(masked, 1, last).squeeze(1)
    raise ConfigError(f"unknown pooling mode '{mode}' (choose from {', '.join(POOLING_MODES)})")


def exclude_prompt(attention_mask: Tensor, prompt_length: int) -> Tensor:
    """A copy of the mask with the first ``prompt_length`` real tokens of every row zeroed."""
    mask = attention_mask.clone()
    left_pad = mask.to(torch.int32).argmax(dim=1)
    positions = torch.arange(mask.size(1), device=mask.device).unsqueeze(0)
    mask[positions < (left_pad + prompt_length).unsqueeze(1)] = 0
    return mask


def parse_pooling(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"mean"``, ``"cls+max"`` or a list → a validated tuple of modes."""
    modes = tuple(value.split("+")) if isinstance(value, str) else tuple(value)
    if not modes:
        raise ConfigError("pooling needs at least one mode")
    for mode in modes:
        if mode not in POOLING_MODES:
            raise ConfigError(f"unknown pooling mode '{mode}' (choose from {', '.join(POOLING_MODES)})")
    return modes
