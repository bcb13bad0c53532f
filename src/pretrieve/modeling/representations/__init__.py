"""How a dual encoder turns a tower's hidden states into a representation, and how two of them are scored.

One module per representation kind, each registering its class (:func:`register_representation`) on import:

* :mod:`~pretrieve.modeling.representations.dense` — ``dense``: one pooled vector, dot product or cosine (the
  papers' representation);
* :mod:`~pretrieve.modeling.representations.dupmae` — ``dupmae``: DupMAE's reduced [CLS] + ordinary-token vector
  (Xiao & Liu 2022, eq. 10–12), on any checkpoint with an MLM head;
* :mod:`~pretrieve.modeling.representations.sparse` — ``sparse`` and ``hybrid``: SPLADE vectors and [CLS] + SPLADE
  (CoT-MoTE, Ma et al. 2023, eq. 4–6).

The interface (:class:`Representation`) and the registry (:data:`REPRESENTATIONS`) live in
:mod:`~pretrieve.modeling.representations.base`, which the members import; this package imports the members, so
every kind is known once it is imported — before :meth:`DualEncoder.load
<pretrieve.modeling.dual_encoder.DualEncoder.load>` reads a saved model's ``"type"``. A new representation is one
module here (plus its import below) and, for search, one back-end in :mod:`pretrieve.retrieval.index`.
"""

from __future__ import annotations

from typing import Any, Mapping

from pretrieve.errors import ConfigError
from pretrieve.modeling.representations.base import REPRESENTATIONS, Representation, register_representation
from pretrieve.modeling.representations.dense import DENSE_POOLING, SIMILARITIES, DenseRepresentation
from pretrieve.modeling.representations.dupmae import DupMAERepresentation
from pretrieve.modeling.representations.sparse import HybridRepresentation, SparseRepresentation

__all__ = ["DENSE_POOLING", "REPRESENTATIONS", "SIMILARITIES", "DenseRepresentation", "DupMAERepresentation",
           "HybridRepresentation", "Representation", "SparseRepresentation", "from_spec", "register_representation",
           "representation_from_config"]


def representation_from_config(config: Mapping[str, Any]) -> Representation:
    """Rebuild a representation from its :meth:`Representation.config`."""
    kind = config.get("type")
    if kind not in REPRESENTATIONS:
        raise ConfigError(f"unknown representation type {kind!r} (known: {', '.join(sorted(REPRESENTATIONS))})")
    return REPRESENTATIONS[kind].from_config(config)


def from_spec(text: str, model_path: str, temperature: float = 1.0) -> Representation:
    """Fine-tuning's ``representation: "<kind>[:<spec>]"`` (e.g. ``dupmae:cls:384,ot:260``,
    ``hybrid:lq=3e-4,ld=1e-4``) for the checkpoint at ``model_path``, by the kind's ``from_spec``."""
    kind, _, spec = text.partition(":")
    if kind not in REPRESENTATIONS:
        raise ConfigError(f"unknown representation '{text}' (known: {', '.join(sorted(REPRESENTATIONS))})")
    return REPRESENTATIONS[kind].from_spec(spec, model_path, temperature)
