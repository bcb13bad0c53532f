"""The sentence-transformers architecture as pretrieve runs it: transformer → pooling → Dense* → Normalize.

:class:`DenseEncoder` turns a padded batch of token ids into one vector per text: ``AutoModel``
(``last_hidden_state``) → pooling → optional Dense layers → optional L2 normalisation. It is built from a
checkpoint's ``modules.json`` (or from explicit settings for any other checkpoint) by
:func:`pretrieve.retrieval.load.load_dense_encoder`, which reads the files; this module holds the arithmetic.

Pooling (:func:`pool`) reproduces sentence-transformers' padded-batch code: ``cls`` takes the first
non-padding position, ``mean`` is ``sum(h * mask) / clamp(sum(mask), 1e-9)`` accumulated in float32
for half-precision inputs, ``max`` fills padding with ``-inf``, ``weightedmean`` weights position ``i``
(counted from the first real token) by ``i + 1``, ``lasttoken`` takes the last real token. Several modes
are concatenated in the order given. ``Dense`` modules are ``activation(linear(x))`` with an optional
residual, as sentence-transformers' ``Dense``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from pretrieve.errors import ConfigError

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


# ---------------------------------------------------------------------------------------------- pooling
def pool(token_embeddings: Tensor, attention_mask: Tensor, modes: str | Sequence[str]) -> Tensor:
    """Pool ``[B, L, H]`` token embeddings to ``[B, H * len(modes)]`` (modes concatenated in order)."""
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    return torch.cat([pool_one(token_embeddings, attention_mask, mode) for mode in modes], dim=-1)


def pool_one(token_embeddings: Tensor, attention_mask: Tensor, mode: str) -> Tensor:
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


# --------------------------------------------------------------------------------------- dense layers
class DenseLayer(nn.Module):
    """sentence-transformers' ``Dense`` module: ``activation(linear(x))`` (+ optional residual)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: nn.Module | None = None, use_residual: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation if activation is not None else nn.Identity()
        self.use_residual = use_residual
        if use_residual and in_features != out_features:
            self.residual = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def activation_from_name(name: str | None, where: str) -> nn.Module:
    """``torch.nn.modules.activation.Tanh`` → ``nn.Tanh()``; only ``torch.`` module classes (no remote code)."""
    if name is None:
        return nn.Tanh()  # sentence-transformers' default when the key is absent
    module_name, _, class_name = name.rpartition(".")
    if not name.startswith("torch.") or not module_name:
        raise ConfigError(f"{where}: activation '{name}' is not a torch.nn module; sentence-transformers "
                          "would need trust_remote_code for it, which pretrieve does not support")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigError(f"{where}: activation '{name}' is not a torch.nn.Module class")
    return cls()



# ------------------------------------------------------------------------------------------- encoder
@dataclass
class TokenizedTexts:
    """Unpadded token ids of a list of texts (plus token type ids when the model uses them)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    prompt_length: int | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


class DenseEncoder:
    """Texts → vectors: tokenizer, transformer, pooling, Dense layers, normalisation."""

    def __init__(self, model, tokenizer, pooling: Sequence[str] = ("cls",), normalize: bool = False,
                 max_length: int = 512, dense_layers: Sequence[DenseLayer] = (), include_prompt: bool = True,
                 query_prompt: str | None = None, passage_prompt: str | None = None,
                 name: str = "", sentence_transformers: bool = False):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = parse_pooling(pooling)
        self.normalize = normalize
        self.max_length = int(max_length)
        self.dense_layers = nn.ModuleList(dense_layers).eval()
        self.include_prompt = include_prompt
        self.query_prompt = query_prompt
        self.passage_prompt = passage_prompt
        self.name = name
        self.sentence_transformers = sentence_transformers
        self._prompt_lengths: dict[str, int] = {}

    def to(self, device: str | torch.device) -> "DenseEncoder":
        self.model.to(device)
        self.dense_layers.to(device)
        return self

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        """Dimension of the output vectors."""
        if len(self.dense_layers):
            return self.dense_layers[-1].linear.out_features
        return int(self.model.config.hidden_size) * len(self.pooling)

    def describe(self) -> dict[str, Any]:
        """The settings that determine the vectors (stored in every embeddings ``meta.json``)."""
        return {"model": self.name, "pooling": "+".join(self.pooling), "normalize": self.normalize,
                "max_length": self.max_length, "dim": self.dim, "dense_layers": len(self.dense_layers),
                "query_prompt": self.query_prompt, "passage_prompt": self.passage_prompt,
                "include_prompt": self.include_prompt, "sentence_transformers": self.sentence_transformers,
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", "")}

    # ------------------------------------------------------------------ tokenizing
    def tokenize(self, texts: Sequence[str], max_length: int | None = None,
                 prompt: str | None = None) -> TokenizedTexts:
        """Unpadded token ids, truncated to ``max_length`` (default: the encoder's), prompt prepended."""
        length = max_length or self.max_length
        inputs = [prompt + text for text in texts] if prompt else list(texts)
        encoded = self.tokenizer(inputs, truncation=True, max_length=length, padding=False,
                                 return_attention_mask=False)
        token_types = encoded.get("token_type_ids") if "token_type_ids" in self.tokenizer.model_input_names else None
        prompt_length = self.prompt_length(prompt, length) if prompt and not self.include_prompt else None
        return TokenizedTexts(list(encoded["input_ids"]), list(token_types) if token_types is not None else None,
                              prompt_length)

    def prompt_length(self, prompt: str, max_length: int) -> int:
        """Tokens of the prompt alone, without a trailing special token (sentence-transformers' rule)."""
        key = f"{max_length}\0{prompt}"
        if key not in self._prompt_lengths:
            ids = self.tokenizer([prompt], truncation=True, max_length=max_length)["input_ids"][0]
            length = len(ids)
            if ids and ids[-1] in set(self.tokenizer.all_special_ids):
                length -= 1
            self._prompt_lengths[key] = length
        return self._prompt_lengths[key]

    # ------------------------------------------------------------------ embedding
    def embed_batch(self, batch: dict[str, Tensor], prompt_length: int | None = None) -> Tensor:
        """One padded batch → ``[B, dim]`` vectors (call under ``torch.inference_mode``)."""
        hidden = self.model(**batch, return_dict=True).last_hidden_state
        mask = batch["attention_mask"]
        if prompt_length:
            mask = exclude_prompt(mask, prompt_length)
        vectors = pool(hidden, mask, self.pooling)
        for layer in self.dense_layers:
            vectors = layer(vectors)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], max_length: int | None = None, prompt: str | None = None) -> Tensor:
        """Embed a small list of texts in one padded batch (no sorting, no progress; corpora go through
        :mod:`pretrieve.retrieval.batches`)."""
        tokenized = self.tokenize(texts, max_length=max_length, prompt=prompt)
        features = {"input_ids": tokenized.input_ids}
        if tokenized.token_type_ids is not None:
            features["token_type_ids"] = tokenized.token_type_ids
        batch = self.tokenizer.pad(features, return_tensors="pt")
        return self.embed_batch({key: value.to(self.device) for key, value in batch.items()}, tokenized.prompt_length)
