"""SPLADE-style sparse representations (CoT-MoTE, Ma et al. 2023, eq. 4) and the dense + sparse hybrid (eq. 5–6, 13).

**Sparse vector (eq. 4).** The last hidden states go through the MLM head (transform, LayerNorm, the tied
``Eᵀ`` + bias), then ``log(1 + ReLU(·))`` and a max over the sequence:
``w_j = max_i log(1 + ReLU(h_iᵀ E_j + b_j))`` — SPLADE v2's max pooling, which CoT-MoTE (Ma et al. 2023) writes as
"ReLU and log saturation … pooling". Special tokens and padding are excluded: the pooled positions are the
attended ones except each row's first and last ([CLS] … [SEP] of a single tokenized text; SPLADE itself
pools over [CLS] and [SEP] too — the issue asks for them to be left out). A row with no ordinary token gets the
zero vector. Because ``log(1 + ReLU(x))`` is non-decreasing, the max of the saturated values is the saturation
of the max logit, so the pooling reuses DupMAE's memory-bounded max over the logits
(:func:`pretrieve.modeling.objectives.ot_bow.max_pool_logits`, chunked forward and backward), then saturates.

**Sparsity (fine-tuning).** ``λ_q·FLOPS(q) + λ_d·FLOPS(d)`` (:func:`pretrieve.modeling.losses.flops_regularizer`,
Paria et al. 2020 as used by SPLADE) is added to the contrastive loss through
:meth:`~pretrieve.modeling.representations.Representation.regularization`; the passage term covers every
passage of the batch (positives and hard negatives). Defaults ``λ_q = 3e-4``, ``λ_d = 1e-4`` (the order of
magnitude SPLADE uses; neither CoT-MoTE (Ma et al. 2023) nor CoT-MAE v2 prints theirs); SPLADE's quadratic warm-up of λ is not
applied (the representation does not see the training step).

**Hybrid (eq. 5–6, 13).** One row per text, ``[h_CLS (H) ; w (V)]``; the relevance is
``s = α·(q_CLS · d_CLS) + β·(q_w · d_w)`` with α = β = 1 (eq. 6: the hybrid similarity is the sum of the dense
and sparse dot products; fine-tuning eq. 13 trains on it). Retrieval can then score with the dense part, the
sparse part or both from the same fine-tuned model (Table 3). Specs for fine-tuning
(``representation: "hybrid"`` / ``"sparse"``, :func:`representation_from_spec`): ``hybrid:dense=1,sparse=1,
lq=3e-4,ld=1e-4`` (any subset of the keys).

Both register in the representations registry (``"sparse"``, ``"hybrid"``) and need the MLM head, so the dual
encoder builds :class:`~pretrieve.modeling.dual_encoder.MaskedLMTower`\\ s (which also route MoTE experts).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig

from pretrieve.errors import ConfigError
from pretrieve.modeling.losses import flops_regularizer
from pretrieve.models import no_remote_code
from pretrieve.modeling.objectives.ot_bow import DEFAULT_CHUNK_ELEMENTS, max_pool_logits
from pretrieve.modeling.pooling import pool
from pretrieve.modeling.representations.base import Representation, register_representation

DEFAULT_QUERY_FLOPS = 3e-4
DEFAULT_PASSAGE_FLOPS = 1e-4


# -------------------------------------------------------------------------------------------------- pooling
def content_positions(attention_mask: Tensor) -> Tensor:
    """``[B, L]`` True at the attended positions other than each row's first and last ([CLS] and [SEP])."""
    attended = attention_mask.bool()
    positions = torch.arange(attended.shape[1], device=attended.device).unsqueeze(0)
    first = attended.to(torch.int8).argmax(dim=1, keepdim=True)
    last = attended.shape[1] - 1 - attended.flip(1).to(torch.int8).argmax(dim=1, keepdim=True)
    return attended & (positions != first) & (positions != last)


def splade_pool(mlm_logits, hidden_states: Tensor, attention_mask: Tensor,
                chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> Tensor:
    """Eq. 4: ``max_i log(1 + ReLU(logits_i))`` over the content positions → ``[B, V]`` (zero rows when empty)."""
    keep = content_positions(attention_mask)
    pooled = max_pool_logits(mlm_logits, hidden_states, keep, chunk_elements)
    return torch.log1p(torch.relu(pooled))


def flops_terms(q_sparse: Tensor, p_sparse: Tensor, query_weight: float, passage_weight: float) -> dict[str, Tensor]:
    """``{"flops_query": λ_q·FLOPS(q), "flops_passage": λ_d·FLOPS(d)}`` (weights 0 are left out)."""
    terms = {}
    if query_weight:
        terms["flops_query"] = query_weight * flops_regularizer(q_sparse.float())
    if passage_weight:
        terms["flops_passage"] = passage_weight * flops_regularizer(p_sparse.float())
    return terms


def _check_weight(name: str, value: Any, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise ConfigError(f"{name} must be a finite number {'> 0' if positive else '≥ 0'}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------- representations
@register_representation
class SparseRepresentation(Representation):
    """A SPLADE vector ``[B, V]`` per text (eq. 4), dot-product relevance, FLOPS regularisation in training."""

    kind = "sparse"
    needs_mlm_head = True

    def __init__(self, query_flops: float = DEFAULT_QUERY_FLOPS, passage_flops: float = DEFAULT_PASSAGE_FLOPS,
                 temperature: float = 1.0, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
        super().__init__()
        self.query_flops = _check_weight("query_flops", query_flops)
        self.passage_flops = _check_weight("passage_flops", passage_flops)
        self.temperature = _check_weight("temperature", temperature, positive=True)
        self.chunk_elements = int(chunk_elements)

    @classmethod
    def from_spec(cls, spec: str, model_path: str, temperature: float = 1.0) -> "SparseRepresentation":
        """``sparse[:lq=…,ld=…]`` (:func:`representation_from_spec`)."""
        return representation_from_spec(cls.kind, spec, model_path, temperature)

    def encode(self, hidden_states: Tensor, attention_mask: Tensor, input_ids: Tensor | None = None,
               tower: nn.Module | None = None) -> Tensor:
        return splade_pool(_mlm_head(tower), hidden_states, attention_mask, self.chunk_elements)

    def score(self, q_rep: Tensor, p_rep: Tensor) -> Tensor:
        return q_rep @ p_rep.T

    def loss_options(self) -> dict[str, Any]:
        return {"similarity": "dot"}

    def regularization(self, q_rep: Tensor, p_rep: Tensor) -> dict[str, Tensor]:
        return flops_terms(q_rep, p_rep, self.query_flops, self.passage_flops)

    def config(self) -> dict[str, Any]:
        return {"type": self.kind, "query_flops": self.query_flops, "passage_flops": self.passage_flops,
                "temperature": self.temperature, "chunk_elements": self.chunk_elements}


@register_representation
class HybridRepresentation(Representation):
    """``[h_CLS ; SPLADE vector]`` per text; ``s = α·dense + β·sparse`` (eq. 6); FLOPS on the sparse part.

    Args:
        hidden_size: the encoder's hidden size ``H`` (width of the dense part of a row).
        dense_weight / sparse_weight: α and β of the hybrid score (paper: 1 and 1).
        query_flops / passage_flops: λ_q and λ_d of the FLOPS regulariser.
        temperature: τ of the contrastive loss (papers: plain dot products, τ = 1).
    """

    kind = "hybrid"
    needs_mlm_head = True

    def __init__(self, hidden_size: int, dense_weight: float = 1.0, sparse_weight: float = 1.0,
                 query_flops: float = DEFAULT_QUERY_FLOPS, passage_flops: float = DEFAULT_PASSAGE_FLOPS,
                 temperature: float = 1.0, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ConfigError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        self.hidden_size = hidden_size
        self.dense_weight = _check_weight("dense_weight", dense_weight)
        self.sparse_weight = _check_weight("sparse_weight", sparse_weight)
        if self.dense_weight == self.sparse_weight == 0:
            raise ConfigError("the hybrid score needs dense_weight or sparse_weight > 0")
        self.query_flops = _check_weight("query_flops", query_flops)
        self.passage_flops = _check_weight("passage_flops", passage_flops)
        self.temperature = _check_weight("temperature", temperature, positive=True)
        self.chunk_elements = int(chunk_elements)

    @classmethod
    def from_spec(cls, spec: str, model_path: str, temperature: float = 1.0) -> "HybridRepresentation":
        """``hybrid[:dense=…,sparse=…,lq=…,ld=…]`` (:func:`representation_from_spec`)."""
        return representation_from_spec(cls.kind, spec, model_path, temperature)

    @classmethod
    def for_model(cls, model_path: str, **kwargs: Any) -> "HybridRepresentation":
        try:
            config = AutoConfig.from_pretrained(str(model_path), **no_remote_code(model_path))
        except OSError as exc:
            raise ConfigError(f"cannot read the model config of {model_path}: {exc}") from None
        return cls(int(config.hidden_size), **kwargs)

    def encode(self, hidden_states: Tensor, attention_mask: Tensor, input_ids: Tensor | None = None,
               tower: nn.Module | None = None) -> Tensor:
        dense = pool(hidden_states, attention_mask, "cls")
        sparse = splade_pool(_mlm_head(tower), hidden_states, attention_mask, self.chunk_elements)
        return torch.cat([dense.to(sparse.dtype), sparse], dim=-1)

    def split(self, rep: Tensor) -> tuple[Tensor, Tensor]:
        """``(dense [B, H], sparse [B, V])`` of representation rows."""
        return rep[:, :self.hidden_size], rep[:, self.hidden_size:]

    def score(self, q_rep: Tensor, p_rep: Tensor) -> Tensor:
        q_dense, q_sparse = self.split(q_rep)
        p_dense, p_sparse = self.split(p_rep)
        return self.dense_weight * (q_dense @ p_dense.T) + self.sparse_weight * (q_sparse @ p_sparse.T)

    def loss_options(self) -> dict[str, Any]:
        if self.dense_weight == self.sparse_weight == 1.0:
            return {"similarity": "dot"}   # eq. 6 with α = β = 1 is the dot product of the concatenated rows
        return {"score_fn": self.score}

    def regularization(self, q_rep: Tensor, p_rep: Tensor) -> dict[str, Tensor]:
        return flops_terms(self.split(q_rep)[1], self.split(p_rep)[1], self.query_flops, self.passage_flops)

    def config(self) -> dict[str, Any]:
        return {"type": self.kind, "hidden_size": self.hidden_size, "dense_weight": self.dense_weight,
                "sparse_weight": self.sparse_weight, "query_flops": self.query_flops,
                "passage_flops": self.passage_flops, "temperature": self.temperature,
                "chunk_elements": self.chunk_elements}


def _mlm_head(tower: nn.Module | None):
    if tower is None or not hasattr(tower, "mlm_logits"):
        raise ConfigError("sparse representations need a tower with the MLM head ('mlm' tower)")
    return tower.mlm_logits


# ------------------------------------------------------------------------------------------------ specs
_SPEC_KEYS = {"dense": "dense_weight", "sparse": "sparse_weight", "lq": "query_flops", "ld": "passage_flops"}


def parse_spec(text: str) -> dict[str, float]:
    """``"dense=1,sparse=0.5,lq=3e-4,ld=1e-4"`` → constructor keywords (empty → {})."""
    values: dict[str, float] = {}
    for part in filter(None, (piece.strip() for piece in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _SPEC_KEYS or _SPEC_KEYS[key] in values:
            raise ConfigError(f"invalid sparse/hybrid representation spec {text!r}: expected comma-separated "
                              "dense=<α>, sparse=<β>, lq=<λ_q>, ld=<λ_d> (each at most once)")
        try:
            values[_SPEC_KEYS[key]] = float(value)
        except ValueError:
            raise ConfigError(f"representation spec {text!r}: {key} must be a number, got {value!r}") from None
    return values


def representation_from_spec(kind: str, spec: str, model_path: str, temperature: float = 1.0) -> Representation:
    """Fine-tuning's ``representation: "sparse[:lq=…,ld=…]"`` or ``"hybrid[:dense=…,sparse=…,lq=…,ld=…]"``."""
    values = parse_spec(spec)
    if kind == "sparse":
        unknown = sorted(set(values) - {"query_flops", "passage_flops"})
        if unknown:
            raise ConfigError(f"the sparse representation takes lq and ld only, got {', '.join(unknown)}")
        return SparseRepresentation(temperature=temperature, **values)
    if kind == "hybrid":
        return HybridRepresentation.for_model(model_path, temperature=temperature, **values)
    raise ConfigError(f"unknown sparse representation kind {kind!r} (sparse, hybrid)")
