"""The representation interface and its registry (what :mod:`pretrieve.modeling.representations` is built on).

A :class:`Representation` is the pluggable part of :class:`~pretrieve.modeling.dual_encoder.DualEncoder`:

* ``encode(hidden_states, attention_mask, input_ids, tower) -> rep`` — one row per text. It receives the tower
  too, so representations that need the MLM head (DupMAE's ordinary-token vector, SPLADE-style sparse vectors)
  can call ``tower.mlm_logits(hidden_states)``; they set ``needs_mlm_head = True`` and the dual encoder then
  builds :class:`~pretrieve.modeling.encoder.Encoder` towers instead of plain ``AutoModel`` ones.
* ``score(q_rep, p_rep) -> [Bq, Bp]`` — relevance of every query with every passage.
* ``temperature`` — τ dividing the scores in the training losses.
* ``loss_options()`` — keyword arguments for :mod:`pretrieve.modeling.losses` (``similarity`` for the built-in dot
  / cosine paths, which are faster, or ``score_fn=self.score`` for anything else).
* ``config()`` / ``from_config()`` — a JSON-able description saved with the model (``dual_encoder.json``);
  learnable parameters, if a representation has any, are saved by the dual encoder beside the towers.
* ``from_spec(spec, model_path, temperature)`` — the representation fine-tuning's ``representation:
  "<kind>:<spec>"`` setting asks for (for the kinds that have such settings).

:func:`register_representation` makes a class known by its ``kind`` (:data:`REPRESENTATIONS`).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Mapping

from torch import Tensor, nn

from pretrieve.errors import ConfigError


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
        """JSON-able settings; must hold ``"type": self.kind`` so that
        :func:`~pretrieve.modeling.representations.representation_from_config` finds the class."""

    @classmethod
    def from_spec(cls, spec: str, model_path: str, temperature: float = 1.0) -> "Representation":
        """The representation of fine-tuning's ``representation: "<kind>:<spec>"`` for the checkpoint at
        ``model_path``; kinds without such settings refuse."""
        raise ConfigError(f"representation '{cls.kind}' has no fine-tuning settings here yet")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Representation":
        """The representation a saved :meth:`config` describes (its settings as keyword arguments)."""
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
