"""How a dual encoder turns a tower's hidden states into a representation, and how two of them are scored.

A :class:`Representation` is the pluggable part of :class:`~pretrieve.modeling.dual_encoder.DualEncoder`:

* ``encode(hidden_states, attention_mask, input_ids, tower) -> rep`` — one row per text. It receives the tower
  too, so representations that need the MLM head (DupMAE's ordinary-token vector, SPLADE-style sparse vectors:
  later issues) can call ``tower.mlm_logits(hidden_states)``; they set ``needs_mlm_head = True`` and the dual
  encoder then builds :class:`~pretrieve.modeling.encoder.Encoder` towers instead of plain ``AutoModel`` ones.
* ``score(q_rep, p_rep) -> [Bq, Bp]`` — relevance of every query with every passage.
* ``temperature`` — τ dividing the scores in the training losses.
* ``loss_options()`` — keyword arguments for :mod:`pretrieve.modeling.losses` (``similarity`` for the built-in dot
  / cosine paths, which are faster, or ``score_fn=self.score`` for anything else).
* ``config()`` / ``from_config()`` — a JSON-able description saved with the model (``dual_encoder.json``);
  learnable parameters, if a representation has any, are saved by the dual encoder beside the towers.

:class:`DenseRepresentation` is the papers' representation: one vector per text, pooled from the last hidden
states (``cls``: the first real token, the papers' choice for BERT; ``mean``: the average over real tokens,
what all-MiniLM-L6-v2 was trained with), optionally L2-normalised, scored by dot product (Drop your Decoder, DupMAE, CDMAE, CoT-MoTE:
``s(q, d) = q·d``, τ = 1) or cosine similarity (τ ≈ 0.01–0.05). Pooling reproduces sentence-transformers'
arithmetic exactly (first non-padding position; ``sum(h·mask) / clamp(sum(mask), 1e-9)``), so the exported
model (:mod:`pretrieve.modeling.export`) encodes the same vectors in sentence-transformers and in
:class:`pretrieve.retrieval.DenseEncoder`. (It is written here, not imported from ``pretrieve.retrieval``,
because modeling sits below retrieval in the package order.)
"""

from __future__ import annotations

import abc
import math
import warnings
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pretrieve.errors import ConfigError

DENSE_POOLING = ("cls", "mean")
SIMILARITIES = ("dot", "cos")


class Representation(nn.Module, abc.ABC):
    """Hidden states → a representation per text, and the relevance score of query/passage representations."""

    kind: ClassVar[str] = ""
    needs_mlm_head: ClassVar[bool] = False
    temperature: float = 1.0

    @abc.abstractmethod
    def encode(self, hidden_states: Tensor, attention_mask: Tensor, input_ids: Tensor, tower: nn.Module) -> Tensor:
        """``[B, L, H]`` hidden states (+ mask, ids, the tower) → ``[B, ...]`` representations."""

    @abc.abstractmethod
    def score(self, q_rep: Tensor, p_rep: Tensor) -> Tensor:
        """``[Bq, Bp]`` relevance of every query with every passage."""

    def loss_options(self) -> dict[str, Any]:
        """Keyword arguments for the losses of :mod:`pretrieve.modeling.losses`: a custom ``score_fn`` by default."""
        return {"score_fn": self.score}

    def regularization(self, q_rep: Tensor, p_rep: Tensor) -> dict[str, Tensor]:
        """Weighted extra loss terms (name → scalar) the dual encoder adds to its loss; none by default
        (sparse representations add their FLOPS regulariser)."""
        return {}

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """JSON-able settings; must hold ``"type": self.kind`` so :func:`representation_from_config` finds the class."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Representation":
        values = {key: value for key, value in config.items() if key != "type"}
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"invalid settings for representation '{cls.kind}': {exc}") from None


REPRESENTATIONS: dict[str, type[Representation]] = {}


def register_representation(cls: type[Representation]) -> type[Representation]:
    """Class decorator: make a representation available by its ``kind`` (configs, saved models, CLI)."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} needs a non-empty 'kind'")
    REPRESENTATIONS[cls.kind] = cls
    return cls


def representation_from_config(config: Mapping[str, Any]) -> Representation:
    """Rebuild a representation from its :meth:`Representation.config`."""
    kind = config.get("type")
    if kind not in REPRESENTATIONS:
        raise ConfigError(f"unknown representation type {kind!r} (known: {', '.join(sorted(REPRESENTATIONS))})")
    return REPRESENTATIONS[kind].from_config(config)


# ---------------------------------------------------------------------------------------------- pooling
def pool_hidden(hidden_states: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """``cls`` (first real token) or ``mean`` (over real tokens) of ``[B, L, H]``, as sentence-transformers."""
    if pooling == "cls":
        first = attention_mask.to(torch.int).argmax(dim=1)
        return hidden_states[torch.arange(hidden_states.size(0), device=hidden_states.device), first]
    if pooling == "mean":
        accumulate = torch.float32 if hidden_states.dtype in (torch.float16, torch.bfloat16) else hidden_states.dtype
        mask = attention_mask.unsqueeze(-1).to(hidden_states.dtype)
        summed = (hidden_states * mask).sum(dim=1, dtype=accumulate)
        count = torch.clamp(mask.sum(dim=1, dtype=accumulate), min=1e-9)
        return (summed / count).to(hidden_states.dtype)
    raise ConfigError(f"unknown pooling '{pooling}' for a dense representation "
                      f"(choose from {', '.join(DENSE_POOLING)})")


# ------------------------------------------------------------------------------------------------ dense
@register_representation
class DenseRepresentation(Representation):
    """One pooled vector per text; dot-product or cosine relevance.

    Args:
        pooling: ``"cls"`` (papers) or ``"mean"`` (sentence-transformers models such as all-MiniLM-L6-v2).
        normalize: L2-normalise the vectors (then the index holds unit vectors and dot product = cosine).
        similarity: ``"dot"`` (papers) or ``"cos"``. Cosine with ``normalize=False`` trains on cosine; the
            export then adds a Normalize module so that inner-product search ranks by cosine too.
        temperature: τ dividing the scores in the losses; 1 for unnormalised dot products (papers), about
            0.01–0.05 for cosine or normalised vectors (bounded scores need sharpening).
    """

    kind = "dense"

    def __init__(self, pooling: str = "cls", normalize: bool = False, similarity: str = "dot",
                 temperature: float = 1.0):
        super().__init__()
        if pooling not in DENSE_POOLING:
            raise ConfigError(f"unknown pooling '{pooling}' (choose from {', '.join(DENSE_POOLING)})")
        if similarity not in SIMILARITIES:
            raise ConfigError(f"unknown similarity '{similarity}' (choose from {', '.join(SIMILARITIES)})")
        if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
            raise ConfigError(f"temperature must be a finite number > 0, got {temperature!r}")
        if normalize and similarity == "dot" and temperature >= 0.5:
            warnings.warn(f"normalised vectors scored by dot product with temperature {temperature}: scores lie in "
                          "[-1, 1], so the softmax barely separates the positive; the usual temperature is "
                          "0.01-0.05", stacklevel=2)
        self.pooling = pooling
        self.normalize = bool(normalize)
        self.similarity = similarity
        self.temperature = float(temperature)

    @property
    def unit_vectors(self) -> bool:
        """Whether retrieval should search L2-normalised vectors (normalised, or trained on cosine)."""
        return self.normalize or self.similarity == "cos"

    def encode(self, hidden_states: Tensor, attention_mask: Tensor, input_ids: Tensor | None = None,
               tower: nn.Module | None = None) -> Tensor:
        vectors = pool_hidden(hidden_states, attention_mask, self.pooling)
        return F.normalize(vectors, p=2, dim=-1) if self.normalize else vectors

    def score(self, q_rep: Tensor, p_rep: Tensor) -> Tensor:
        if self.similarity == "cos":
            q_rep, p_rep = F.normalize(q_rep, dim=-1), F.normalize(p_rep, dim=-1)
        return q_rep @ p_rep.T

    def loss_options(self) -> dict[str, Any]:
        return {"similarity": self.similarity}

    def config(self) -> dict[str, Any]:
        return {"type": self.kind, "pooling": self.pooling, "normalize": self.normalize,
                "similarity": self.similarity, "temperature": self.temperature}

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.config().items() if key != "type")


# Representations defined in their own modules register themselves on import (the import sits at the end so
# that they can subclass Representation; a saved model's "type" must be known before DualEncoder.load).
from pretrieve.modeling import dupmae as _dupmae  # noqa: E402,F401  (registers "dupmae", DupMAE (Xiao & Liu 2022) eq. 10–12)
from pretrieve.modeling import sparse as _sparse  # noqa: E402,F401  (registers "sparse", "hybrid": CoT-MoTE (Ma et al. 2023) eq. 4–6)
