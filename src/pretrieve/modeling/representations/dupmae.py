"""The DupMAE representation (DupMAE, Xiao & Liu 2022, §3.2 "Representation", eq. 10–12): [CLS] reduced + sparse OT vector.

For a text ``X`` with last hidden states ``h``:

* **eq. 10** ``ĥ_X = h_CLSᵀ W^cls``, ``W^cls ∈ R^{d×d′}`` — a bias-free linear reduction, trained during
  fine-tuning (initialised as a Johnson–Lindenstrauss projection, entries ``N(0, 1/d′)``, so that at the start
  ``ĥ_q·ĥ_d`` is an unbiased estimate of the full [CLS] dot product). ``d′`` defaults to half the hidden size
  (384 for BERT-base, §4). When ``d′`` equals the hidden size, or the spec says ``cls:full``, no reduction is
  applied: "CLS:768 directly uses the [CLS] embedding" (§4.2).
* **eq. 11** ``μ̂_X = {i: μ_X[i] | i ∈ I_X}``, ``I_X`` = the indices of the top-``k`` entries of ``μ_X``,
  where ``μ_X`` is eq. 7's vector: the MLM head's logits max-pooled over the ordinary tokens (every attended
  position but [CLS]; at inference nothing is masked). The paper applies **no activation**: ``μ_X`` is the
  raw max-pooled logit vector that pre-training shaped with eq. 8's softmax, so that is our default
  (``act:none``). ``act:relu`` and ``act:log1p`` (SPLADE's ``log(1 + ReLU(·))`` saturation) are offered as
  options; they are not in the paper.
* **eq. 12** ``⟨q, d⟩ = ĥ_qᵀ ĥ_d + Σ_{i ∈ I_d} μ_q[i] μ_d[i]``: the sum runs over the *document's* kept
  indices with the *query's full* OT vector. Only the document side is sparsified — that is what the
  storage argument of §4.2 needs, and it keeps the per-pair cost at ``d′ + k`` multiply-adds, "the same
  similarity computation cost as CLS:768". So queries are not top-k sparsified.

**Any checkpoint with an MLM head.** The representation needs only the hidden states and the checkpoint's own
MLM head (``needs_mlm_head``: the dual encoder loads ``*ForMaskedLM`` towers,
:class:`~pretrieve.modeling.encoder.Encoder`), not DupMAE pre-training: a plain MLM / RetroMAE checkpoint or a SPLADE one is fine-tuned and searched with it just
the same, which separates "the representation" from "OT pre-training" in a comparison.

Variants (Table 3) are one spec string: ``cls:384,ot:260`` (default ``cls:H/2,ot:H/2``), ``cls:768`` /
``cls:full`` (CLS only), ``ot:768`` (OT only), optionally ``,act:relu``. Fine-tuning selects one with
``representation: "dupmae:cls:384,ot:260"`` (``pretrieve.train.finetuner``); the resolved spec, the hidden size
and the reduction weights are saved with the fine-tuned model (``dual_encoder.json`` +
``representation.safetensors``) and restored by ``DualEncoder.load``.

Tensor layout. :meth:`DupMAERepresentation.encode` returns one row per text, ``[ĥ (d′) ; μ (V)]`` (either
part absent in the one-part variants), the *full* ``μ`` for queries and passages alike (the representation
does not know which side it encodes). :meth:`~DupMAERepresentation.score` sparsifies the passage side —
top-``k`` of each passage's ``μ`` kept, the rest zero — so the training loss (eq. 13–15) optimises exactly
eq. 12: gradients flow into the kept values (the selection itself is not differentiable, as in any top-k).
Search (:mod:`pretrieve.retrieval.index.dupmae`) stores ``ĥ_d`` in FAISS and ``(I_d, μ_d[I_d])`` in a sparse
inverted index (:mod:`pretrieve.retrieval.index.sparse`).

Storage per passage (:meth:`DupMAERepresentation.storage_bytes`): ``4·d′`` bytes of fp32 dense values plus
``k`` (index, value) pairs. The paper counts an index as < 15 bits (⌈log₂ 30522⌉ = 15): CLS:384,OT:260 is
384·32 + 260·(32 + 15) = 24,508 bits ≤ 768·32 = 24,576 bits of CLS:768 — that is its "same storage cost".
Our sparse index stores uint16 term ids when the vocabulary has at most 65,536 entries (int32 otherwise),
fp32 values and a 4-byte row pointer per passage, so CLS:384,OT:260 takes 1,536 + 260·6 + 4 = 3,100 bytes
against 3,072 for CLS:768 (+0.9 %).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor, nn
from transformers import AutoConfig

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.objectives.ot_bow import DEFAULT_CHUNK_ELEMENTS, max_pool_logits, ordinary_token_mask
from pretrieve.modeling.pooling import pool
from pretrieve.models import no_remote_code
from pretrieve.modeling.representations.base import Representation, register_representation

ACTIVATIONS = ("none", "relu", "log1p")
PAPER_INDEX_BITS = 15
"""Bits per OT index in the paper's storage accounting (§4.2: "less than 15 bits" for 30522 entries)."""


# ------------------------------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class DupMAESpec:
    """Which parts a DupMAE representation keeps: ``cls_dim`` (None: no [CLS] part; equal to the hidden size:
    the unreduced [CLS]), ``ot_k`` (None: no OT part) and the OT ``activation``."""

    cls_dim: int | None
    ot_k: int | None
    activation: str = "none"

    def __str__(self) -> str:
        parts = []
        if self.cls_dim is not None:
            parts.append(f"cls:{self.cls_dim}")
        if self.ot_k is not None:
            parts.append(f"ot:{self.ot_k}")
        if self.activation != "none":
            parts.append(f"act:{self.activation}")
        return ",".join(parts)


def parse_spec(text: str | None, hidden_size: int) -> DupMAESpec:
    """Parse ``"cls:384,ot:260"`` / ``"cls:full"`` / ``"ot:768"`` / ``"...,act:relu"``; empty → ``cls:H/2,ot:H/2``.

    ``cls:full`` resolves to the hidden size. Raises :class:`ConfigError` naming the accepted forms.
    """
    text = (text or "").strip()
    if not text:
        half = max(1, hidden_size // 2)
        return DupMAESpec(cls_dim=half, ot_k=half)
    values: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition(":")
        key, value = key.strip().lower(), value.strip().lower()
        if not sep or key not in ("cls", "ot", "act") or not value or key in values:
            raise ConfigError(f"invalid DupMAE representation spec {text!r}: expected comma-separated cls:<d′|full>, "
                              "ot:<k>, act:<none|relu|log1p> (each at most once), e.g. 'cls:384,ot:260'")
        values[key] = value
    if "cls" not in values and "ot" not in values:
        raise ConfigError(f"DupMAE representation spec {text!r} keeps neither the [CLS] nor the OT part")
    cls_dim = None if "cls" not in values else (hidden_size if values["cls"] == "full"
                                                else _positive(values["cls"], "cls", text))
    if cls_dim is not None and cls_dim > hidden_size:
        raise ConfigError(f"DupMAE spec {text!r}: cls:{cls_dim} exceeds the hidden size {hidden_size}")
    ot_k = None if "ot" not in values else _positive(values["ot"], "ot", text)
    activation = values.get("act", "none")
    if activation not in ACTIVATIONS:
        raise ConfigError(f"DupMAE spec {text!r}: act must be one of {', '.join(ACTIVATIONS)}")
    return DupMAESpec(cls_dim=cls_dim, ot_k=ot_k, activation=activation)


def _positive(value: str, key: str, text: str) -> int:
    if not re.fullmatch(r"\d+", value) or int(value) < 1:
        raise ConfigError(f"DupMAE spec {text!r}: {key} must be a positive integer"
                          + (" or 'full'" if key == "cls" else "") + f", got {value!r}")
    return int(value)


# ------------------------------------------------------------------------------------------ representation
@register_representation
class DupMAERepresentation(Representation):
    """``[ĥ_CLS ; μ_OT]`` per text; eq. 12 score with the passage's OT vector sparsified to its top-``k``.

    Args:
        hidden_size: the encoder's hidden size ``d``.
        spec: the variant (see :func:`parse_spec`); resolved and stored in canonical form.
        temperature: τ dividing the scores in the losses (papers: plain dot product, τ = 1).
        chunk_elements: logits per chunk of the memory-bounded OT max-pool.
        seed: seed of the reduction layer's initialisation (independent of the global RNG).
    """

    kind = "dupmae"

    def __init__(self, hidden_size: int, spec: str | None = None, temperature: float = 1.0,
                 chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, seed: int = 0):
        super().__init__()
        if not isinstance(hidden_size, int) or hidden_size < 1:
            raise ConfigError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
            raise ConfigError(f"temperature must be a finite number > 0, got {temperature!r}")
        self.hidden_size = hidden_size
        self.spec = parse_spec(spec, hidden_size)
        self.temperature = float(temperature)
        self.chunk_elements = int(chunk_elements)
        self.seed = int(seed)
        self.needs_mlm_head = self.spec.ot_k is not None
        self.reduction: nn.Linear | None = None
        if self.spec.cls_dim is not None and self.spec.cls_dim < hidden_size:
            self.reduction = nn.Linear(hidden_size, self.spec.cls_dim, bias=False)
            generator = torch.Generator().manual_seed(self.seed)
            with torch.no_grad():
                self.reduction.weight.normal_(0.0, 1.0 / math.sqrt(self.spec.cls_dim), generator=generator)

    @classmethod
    def from_spec(cls, spec: str, model_path: str, temperature: float = 1.0) -> "DupMAERepresentation":
        """``dupmae[:<spec>]`` (:func:`parse_spec`) for the checkpoint at ``model_path``."""
        return cls.for_model(spec, model_path, temperature=temperature)

    @classmethod
    def for_model(cls, spec: str | None, model_path: str, **kwargs: Any) -> "DupMAERepresentation":
        """Build for the checkpoint at ``model_path`` (its ``hidden_size`` from the Hugging Face config)."""
        try:
            config = AutoConfig.from_pretrained(str(model_path), **no_remote_code(model_path))
        except OSError as exc:
            raise InputError(f"cannot read the model config: {exc}", path=str(model_path)) from None
        return cls(int(config.hidden_size), spec, **kwargs)

    # ------------------------------------------------------------------ sizes
    @property
    def dense_dim(self) -> int:
        """Width of the [CLS] part of a representation row (0 without one)."""
        return 0 if self.spec.cls_dim is None else self.spec.cls_dim

    @property
    def ot_k(self) -> int | None:
        return self.spec.ot_k

    def storage_bytes(self, index_bytes: float = 4, value_bytes: float = 4, dense_bytes: float = 4) -> float:
        """Bytes per passage: dense values + ``k`` (index, value) pairs. The paper's accounting is
        ``index_bytes = PAPER_INDEX_BITS / 8`` (see the module docstring); our index stores 2 + 4 for vocabularies of
        ≤ 65,536 entries, 4 + 4 above (plus a 4-byte row pointer per passage, see
        :func:`pretrieve.retrieval.index.dupmae.storage`)."""
        return self.dense_dim * dense_bytes + (self.ot_k or 0) * (index_bytes + value_bytes)

    # ------------------------------------------------------------------ computation
    def encode(self, hidden_states: Tensor, attention_mask: Tensor, input_ids: Tensor | None = None,
               tower: nn.Module | None = None) -> Tensor:
        parts = []
        if self.spec.cls_dim is not None:
            cls = pool(hidden_states, attention_mask, "cls")
            parts.append(self.reduction(cls) if self.reduction is not None else cls)
        if self.spec.ot_k is not None:
            if tower is None or not hasattr(tower, "mlm_logits"):
                raise ConfigError("the DupMAE OT vector needs a tower with the MLM head ('mlm' tower)")
            keep = ordinary_token_mask(attention_mask)
            pooled = max_pool_logits(tower.mlm_logits, hidden_states, keep, self.chunk_elements)
            parts.append(activate(pooled, self.spec.activation))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def split(self, rep: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """``(ĥ [B, d′] or None, μ [B, V] or None)`` of representation rows."""
        dense = rep[:, :self.dense_dim] if self.spec.cls_dim is not None else None
        ot = rep[:, self.dense_dim:] if self.spec.ot_k is not None else None
        return dense, ot

    def sparsify(self, ot: Tensor) -> tuple[Tensor, Tensor]:
        """Eq. 11: ``(values [B, k], indices [B, k])`` of each row's top-``k`` OT entries, largest first."""
        if self.spec.ot_k is None:
            raise ConfigError("this DupMAE representation has no OT part")
        k = min(self.spec.ot_k, ot.shape[-1])
        values, indices = ot.topk(k, dim=-1)
        return values, indices

    def sparsified_ot(self, ot: Tensor) -> Tensor:
        """``μ_d`` with everything but its top-``k`` entries set to zero (the passage side of eq. 12)."""
        values, indices = self.sparsify(ot)
        return torch.zeros_like(ot).scatter(-1, indices, values)

    def score(self, q_rep: Tensor, p_rep: Tensor) -> Tensor:
        """Eq. 12 for every query (row of ``q_rep``) with every passage (row of ``p_rep``): ``[Bq, Bp]``."""
        q_dense, q_ot = self.split(q_rep)
        p_dense, p_ot = self.split(p_rep)
        scores = None
        if q_dense is not None:
            scores = q_dense @ p_dense.T
        if q_ot is not None:
            sparse = q_ot @ self.sparsified_ot(p_ot).T
            scores = sparse if scores is None else scores + sparse
        return scores

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, Any]:
        return {"type": self.kind, "hidden_size": self.hidden_size, "spec": str(self.spec),
                "temperature": self.temperature, "chunk_elements": self.chunk_elements, "seed": self.seed}

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, spec={self.spec}, temperature={self.temperature}"


def activate(pooled: Tensor, activation: str) -> Tensor:
    """The OT vector's activation: ``none`` (paper), ``relu`` or ``log1p`` (= log(1 + ReLU(x)), SPLADE)."""
    if activation == "none":
        return pooled
    if activation == "relu":
        return torch.relu(pooled)
    if activation == "log1p":
        return torch.log1p(torch.relu(pooled))
    raise ConfigError(f"unknown OT activation '{activation}' (choose from {', '.join(ACTIVATIONS)})")


def is_dupmae_config(representation: Mapping[str, Any] | None) -> bool:
    """Whether a saved representation config (``dual_encoder.json``'s ``representation``) is DupMAE's."""
    return bool(representation) and representation.get("type") == DupMAERepresentation.kind
