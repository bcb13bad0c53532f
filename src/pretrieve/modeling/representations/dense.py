"""The dense representation: one pooled vector per text (Drop your Decoder, DupMAE, CDMAE, CoT-MoTE).

Pooled from the last hidden states (``cls``: the first real token, the papers' choice for BERT; ``mean``: the
average over real tokens, what all-MiniLM-L6-v2 was trained with) by :func:`pretrieve.modeling.pooling.pool`,
optionally L2-normalised, scored by dot product (``s(q, d) = q·d``, τ = 1) or cosine similarity (τ ≈ 0.01–0.05).
The pooling is sentence-transformers' arithmetic, so the exported model (:mod:`pretrieve.modeling.export`)
encodes the same vectors in sentence-transformers and in :class:`pretrieve.modeling.sentence_transformer.DenseEncoder`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from pretrieve.errors import ConfigError
from pretrieve.modeling.pooling import pool
from pretrieve.modeling.representations.base import Representation, register_representation

DENSE_POOLING = ("cls", "mean")
SIMILARITIES = ("dot", "cos")


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
        vectors = pool(hidden_states, attention_mask, self.pooling)
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
