"""CPDAE (CPDAE (Ma et al. 2022), Ma et al., CIKM'22): an MLP decoder that reconstructs the input's *set* of words from the
[CLS] vector, and a contrastive loss between the decoded word distributions of two masked views of a text.

Objectives registered here:

* ``cpdae`` — the MLP decoder, the reconstruction loss (eq. 3–4) and the contrastive loss (eq. 5), weighted
  inside the objective as ``REC + λ·CL`` (eq. 6 with λ = 0.1, §4.1.3; the MLM term is ``mlm_views``).
  ``contrast="dense"`` is CPDAE-R (§3.2.2); ``contrast="none"`` and ``idf=...`` are the ablations of
  Table 2 (w/o CL, IDF-REC).
* ``mlm_views`` — the encoder MLM over *both* masked views: the mean cross-entropy over every masked token
  of view 1 (``mlm_labels``) and view 2 (``view2_mlm_labels``). Both views are ordinary masked inputs of the
  encoder, so eq. 6's MLM is taken over all 2m sequences, as an MLM over the doubled batch would be. It
  replaces ``mlm`` in the CPDAE presets (using both would count view 1 twice).

Both read the second view's encoding from ``enc.views["second_view"]``: :class:`~pretrieve.modeling.
pretrain_model.PretrainModel` encodes ``[view 1; view 2]`` in one encoder call when an objective requires the
batch feature ``second_view`` (``view2_input_ids`` / ``view2_mlm_labels``, built by the collator with the
encoder masker, independently of view 1).

Choices, each stated (the paper has no public code):

* **Views (§3.1.1).** Each text is masked twice with BERT's masking (token-level, 15 %, 80/10/10: the
  ``cpdae`` preset's encoder masker); the representation is the last layer's [CLS] (eq. 1).
* **Decoder (§3.1.2, eq. 2).** ``Linear(H, H) → GELU → LayerNorm → Linear(H, |V|)`` — "two layers of FFN
  with GELU and LayerNorm", ordered like BERT's prediction head — freshly initialised (``N(0,
  initializer_range)``, zero biases) and *not* tied to the input embeddings (the paper sizes its own output
  layer to |V| = 30,522). It is a head of this objective: saved in ``heads.safetensors``, never part of the
  exported encoder, dropped for fine-tuning (§4.1.3).
* **Reconstruction (eq. 3–4).** ``ẑ = sigmoid(z)`` per vocabulary entry, binary cross-entropy against the
  multi-hot set ``y`` of the input's token ids (the unique non-special ids of the *original* text, batch
  feature ``bow_targets``; sub-word ids, as the decoder's output space is the tokenizer's vocabulary). The
  printed eq. 4 has ``log ẑ`` in both terms; the intended second term is ``log(1 − ẑ)`` (a multi-label
  cross-entropy), which is what we compute (``binary_cross_entropy_with_logits``, numerically stable).
  Reduction: **mean over the vocabulary** and over the texts of the batch (``rec_reduction="mean"``, the
  default; what ``BCEWithLogitsLoss()`` computes). The printed eq. 4 sums over ``j = 1..|V|``
  (``rec_reduction="sum"`` keeps that literal reading), but eq. 6 adds REC unweighted to MLM with λ = 0.1 on
  CL, which only balances when REC is on a per-entry scale; measured here (splade-tiny, SciFact, 100 steps ×
  32 × 144): with the sum, REC starts near 20,000 and under Adam its gradient direction swamps MLM and CL —
  the [CLS] vectors collapse (mean pairwise cosine of 64 passages 0.999, vs 0.83 after MLM; 0.984 even at
  the paper's lr 5e-5), the contrast never moves (CPDAE-R's dense contrast stays at log(2m − 1) too), and the
  fine-tuned retriever is broken (SciFact nDCG@10 0.015 vs 0.244 for `mlm`); with the mean, [CLS] stays
  spread (0.83), MLM reaches 5.1 instead of 7.1 and CPDAE-R's contrast falls from 4.1 to 0.14. REC is
  computed for **both views** (both decode the same word set) and averaged.
* **IDF-REC (Table 2).** ``idf=<path>`` weights each vocabulary entry's term of eq. 4 by its IDF,
  ``log((1 + N) / (1 + df))`` over the pre-training corpus chunks — a directory of PMI/n-gram statistics
  (:meth:`pretrieve.masking.pmi.NgramStatistics.save`) or a ``.npy`` vector of |V| weights.
* **Contrast (eq. 5).** ``z̃ = ẑ / Σ ẑ``; similarity ``−JS(z̃ᵢ, z̃ₖ)``; InfoNCE over the 2m views of a
  batch of m texts: the other view of the same text is the positive, the other 2m − 2 views negatives, the
  anchor itself excluded from the denominator (``1[k ≠ i]``). The printed eq. 5 sums over the m first views
  only; we use **every view as an anchor** (SimCLR's symmetric form — the two halves are exchangeable, so
  the expectation is the same and the variance lower) and take the **mean over anchors** (not the sum:
  the scale then does not grow with the batch size, like REC's mean over texts). No temperature is given
  for the JS contrast, so ``τ = 1``; note ``−JS ∈ [−log 2, 0]``, so the loss lies between ``log m`` and
  ``log(2m − 1)``.
* **Across processes.** The m of eq. 5 is the batch's: with several processes (each holding m / W texts of a
  step's micro-batch) the views of every process are gathered (``gather_with_grad``, as the fine-tuning losses
  gather cross-device negatives) and each process computes the same contrast over all 2m views, its gradient
  scaled by W so that DDP's average gives the one-process gradient (:mod:`pretrieve.modeling.distributed`);
  ``tests/test_cpdae.py`` checks 2 processes × 8 texts = 1 process × 16 texts, loss and gradients. Without it,
  8 processes of 8 texts would each contrast 14 negatives per anchor instead of the paper's 126. REC and MLM are
  per-text terms and stay local. (Gradient accumulation is not a gather: with ``micro_batch_size`` below the
  per-process share, each micro-batch contrasts only its own views.)
* **CPDAE-R (§3.2.2).** ``contrast="dense"`` contrasts the [CLS] vectors instead, with cosine similarity
  and ``τ = 0.05`` (SimCSE, which the paper cites as its dense-contrast baseline; the paper gives neither).
* **Pairwise JS at scale.** ``JS(P, Q) = ½Σp log p + ½Σq log q − Σm log m`` with ``m = (p + q)/2`` needs
  every pair's ``Σ m log m``, a ``[2m, 2m, |V|]`` computation (m = 64: 0.5 G values). A custom autograd
  function computes it in row chunks and recomputes the chunk in the backward pass
  (``∂JS_ik/∂p_ix = ½(log p_ix − log m_ikx)``), so memory stays ``O(chunk · 2m · |V|)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pretrieve.errors import ConfigError, InputError
from pretrieve.masking.pmi import NgramStatistics
from pretrieve.modeling.distributed import gather_with_grad, scale_grad, world_size
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.base import (CPDAE, Objective, ObjectiveOutput, bottleneck, register_objective,
                                                token_prediction_loss)
from pretrieve.precision import full_precision
from pretrieve.modeling.objectives.decoder_layers import LayerShape

CONTRASTS = ("js", "dense", "none")
DEFAULT_TEMPERATURE = {"js": 1.0, "dense": 0.05, "none": 1.0}
REC_REDUCTIONS = ("sum", "mean")
SECOND_VIEW = "second_view"
CHUNK_ELEMENTS = 1 << 25  # values per chunk of the pairwise JS computation (128 MiB in float32)


# ---------------------------------------------------------------------- the decoder
class MLPDecoder(nn.Module):
    """``Linear(H, H) → GELU → LayerNorm → Linear(H, |V|)``: the [CLS] vector to vocabulary logits (eq. 2)."""

    def __init__(self, shape: LayerShape, vocab_size: int):
        super().__init__()
        self.dense = nn.Linear(shape.hidden_size, shape.hidden_size)
        self.norm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.output = nn.Linear(shape.hidden_size, vocab_size)
        for module in (self.dense, self.output):
            nn.init.normal_(module.weight, mean=0.0, std=shape.initializer_range)
            nn.init.zeros_(module.bias)

    def forward(self, cls: Tensor) -> Tensor:
        return self.output(self.norm(F.gelu(self.dense(cls))))


# ---------------------------------------------------------------------- losses (pure functions)
def multi_hot(targets: Tensor, vocab_size: int) -> Tensor:
    """``[N, K]`` ids padded with -100 → float ``[N, V]`` with 1 at each id."""
    valid = targets != -100
    y = torch.zeros(targets.shape[0], vocab_size, device=targets.device)
    y.scatter_(1, targets.clamp(min=0), valid.float())
    return y


def reconstruction_loss(logits: Tensor, targets: Tensor, weights: Tensor | None = None,
                        reduction: str = "mean") -> Tensor:
    """Eq. 4 with the intended ``log(1 − ẑ)``: ``−Σ_j w_j [y_j log σ(z_j) + (1 − y_j) log(1 − σ(z_j))]``.

    ``logits [N, V]``, ``targets [N, K]`` (ids, -100 padding), ``weights [V]`` (IDF-REC) or None.
    ``reduction`` over the vocabulary: ``"mean"`` (default, see the module docstring) or ``"sum"`` (the printed
    eq. 4); always the mean over the N texts.
    """
    if reduction not in REC_REDUCTIONS:
        raise ConfigError(f"rec_reduction must be one of {REC_REDUCTIONS}, got {reduction!r}")
    logits = full_precision(logits)
    y = multi_hot(targets, logits.shape[-1]).to(logits.dtype)
    per_entry = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    if weights is not None:
        per_entry = per_entry * weights.to(per_entry.dtype)
    per_text = per_entry.sum(dim=-1) if reduction == "sum" else per_entry.mean(dim=-1)
    return per_text.mean()


def word_distribution(logits: Tensor) -> Tensor:
    """``z̃ = σ(z) / Σ σ(z)`` over the vocabulary (computed in log space, float32+)."""
    log_z = F.logsigmoid(full_precision(logits))
    return torch.exp(log_z - torch.logsumexp(log_z, dim=-1, keepdim=True))


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence (natural log) of matching rows of ``p`` and ``q`` ``[..., V]`` → ``[...]``."""
    m = (p + q) / 2
    return 0.5 * (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1) + 0.5 * (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)


class _PairwiseJS(torch.autograd.Function):
    """``JS[i, k]`` for all rows of ``P [N, V]``, chunked over rows, with a recomputing backward."""

    @staticmethod
    def forward(ctx: Any, probs: Tensor, chunk: int) -> Tensor:
        neg_entropy = torch.xlogy(probs, probs).sum(-1)
        mixed = torch.empty(probs.shape[0], probs.shape[0], dtype=probs.dtype, device=probs.device)
        for start in range(0, probs.shape[0], chunk):
            m = (probs[start:start + chunk, None, :] + probs[None, :, :]) / 2
            mixed[start:start + chunk] = torch.xlogy(m, m).sum(-1)
        ctx.save_for_backward(probs)
        ctx.chunk = chunk
        return 0.5 * (neg_entropy[:, None] + neg_entropy[None, :]) - mixed

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (probs,) = ctx.saved_tensors
        tiny = torch.finfo(probs.dtype).tiny
        sym = grad + grad.T                                    # JS is symmetric: both arguments are p_i
        log_p = probs.clamp_min(tiny).log()
        out = 0.5 * log_p * sym.sum(dim=1, keepdim=True)
        for start in range(0, probs.shape[0], ctx.chunk):
            log_m = ((probs[start:start + ctx.chunk, None, :] + probs[None, :, :]) / 2).clamp_min(tiny).log()
            out[start:start + ctx.chunk] -= 0.5 * torch.einsum("ck,ckv->cv", sym[start:start + ctx.chunk], log_m)
        return out, None


def pairwise_js(probs: Tensor, chunk: int | None = None) -> Tensor:
    """Symmetric ``[N, N]`` matrix of ``JS(probs[i], probs[k])`` (memory ``O(chunk · N · V)``)."""
    if probs.dim() != 2:
        raise InputError(f"pairwise_js expects [N, V] distributions, got shape {tuple(probs.shape)}")
    rows, vocab = probs.shape
    if chunk is None:
        chunk = max(1, CHUNK_ELEMENTS // max(rows * vocab, 1))
    return _PairwiseJS.apply(probs, int(chunk))


def view_contrastive_loss(similarity: Tensor, temperature: float = 1.0) -> Tensor:
    """InfoNCE over ``2m`` views, rows ``[view 1 of texts 0..m-1; view 2 of texts 0..m-1]``.

    Anchor ``i``'s positive is the other view of its text (``(i + m) mod 2m``), every other view but itself
    a negative; mean over the ``2m`` anchors (eq. 5, symmetric form — see the module docstring).
    """
    views = similarity.shape[0]
    if views % 2 or similarity.shape != (views, views):
        raise InputError(f"expected a square similarity matrix over an even number of views, got "
                         f"{tuple(similarity.shape)}")
    logits = full_precision(similarity) / temperature
    logits = logits.masked_fill(torch.eye(views, dtype=torch.bool, device=logits.device), -math.inf)
    half = views // 2
    positives = (torch.arange(views, device=logits.device) + half) % views
    return F.cross_entropy(logits, positives)


def gathered_views(rows: Tensor) -> Tensor:
    """``[view 1 of every process's texts; view 2 of every process's texts]`` from this process's ``[view 1; view
    2]`` rows (:func:`~pretrieve.modeling.distributed.gather_with_grad`: the own rows keep their gradient), the
    row order :func:`view_contrastive_loss` expects; the rows themselves in one process."""
    first, second = rows.chunk(2, dim=0)
    return torch.cat([gather_with_grad(first), gather_with_grad(second)], dim=0)


def cosine_similarity_matrix(vectors: Tensor) -> Tensor:
    normalized = F.normalize(full_precision(vectors), dim=-1)
    return normalized @ normalized.T


# ---------------------------------------------------------------------- helpers
def view_encoding(enc: EncoderOutput, name: str, objective: str) -> EncoderOutput:
    """The encoding of extra encoder input ``name`` (``enc.views[name]``, set by ``PretrainModel``)."""
    views = getattr(enc, "views", None) or {}
    if name not in views:
        raise ConfigError(f"objective '{objective}' needs the encoding of '{name}', which the pre-training model "
                          f"adds when an objective requires that feature (got views: {sorted(views) or 'none'})")
    return views[name]


def load_idf(path: str | Path, vocab_size: int) -> Tensor:
    """IDF weights ``[V]`` from a PMI/n-gram statistics directory or a ``.npy`` vector."""
    path = Path(path)
    if NgramStatistics.is_saved(path):
        weights = NgramStatistics.load(path).idf()
    elif path.suffix == ".npy" and path.is_file():
        weights = np.load(path)
    else:
        raise InputError("IDF weights must be a PMI statistics directory or a .npy vector", path=path)
    weights = np.asarray(weights, dtype=np.float32).ravel()
    if weights.size != vocab_size or not np.isfinite(weights).all():
        raise InputError(f"IDF weights must be {vocab_size} finite numbers (one per token id), got "
                         f"{weights.size}", path=path)
    return torch.from_numpy(weights.copy())


# ---------------------------------------------------------------------- objectives
@register_objective
class ContrastiveDiscriminativeAutoencoder(Objective):
    """CPDAE's MLP decoder with reconstruction + contrastive losses over two masked views (``REC + λ·CL``)."""

    name = "cpdae"
    citation = CPDAE
    uses_mlm_head = False   # its own MLP decoder maps [CLS] to the vocabulary
    requires = frozenset({SECOND_VIEW, "bow_targets"})

    def __init__(self, encoder: Encoder, *, contrast: str = "js", cl_weight: float = 0.1,
                 temperature: float | None = None, idf: str | None = None, rec_reduction: str = "mean"):
        super().__init__(encoder)
        if contrast not in CONTRASTS:
            raise ConfigError(f"objective 'cpdae': contrast must be one of {', '.join(CONTRASTS)}, got {contrast!r}")
        if rec_reduction not in REC_REDUCTIONS:
            raise ConfigError(f"objective 'cpdae': rec_reduction must be one of {', '.join(REC_REDUCTIONS)}, "
                              f"got {rec_reduction!r}")
        self.contrast = contrast
        self.cl_weight = _non_negative("cl_weight", cl_weight)
        self.temperature = DEFAULT_TEMPERATURE[contrast] if temperature is None else _positive("temperature",
                                                                                                temperature)
        self.rec_reduction = rec_reduction
        self.decoder = MLPDecoder(LayerShape.from_config(encoder.config), encoder.vocab_size)
        if idf is not None:
            self.register_buffer("idf_weights", load_idf(idf, encoder.vocab_size))
        else:
            self.idf_weights = None

    def decode(self, cls: Tensor) -> Tensor:
        """Vocabulary logits ``z`` (eq. 2) for [CLS] vectors ``[N, H]``."""
        return self.decoder(cls)

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        second = view_encoding(enc, SECOND_VIEW, self.name)
        cls = torch.cat([bottleneck(enc), bottleneck(second)], dim=0)      # [2m, H]: view 1 rows, then view 2
        logits = full_precision(self.decode(cls))
        targets = batch["bow_targets"].repeat(2, 1)
        rec = reconstruction_loss(logits, targets, self.idf_weights, self.rec_reduction)
        if self.contrast == "js":
            views = gathered_views(word_distribution(logits))
            similarity = -pairwise_js(views)
        elif self.contrast == "dense":
            views = gathered_views(cls)
            similarity = cosine_similarity_matrix(views)
        else:
            views = similarity = None
        if similarity is None or views.shape[0] < 4:  # a contrast needs at least two texts
            cl = logits.sum() * 0.0
        else:
            # every process computes the same loss over the gathered views and back-propagates into its own:
            # × world size undoes DDP's average (pretrieve.modeling.distributed), the value stays the loss
            cl = scale_grad(view_contrastive_loss(similarity, self.temperature), world_size())
        loss = rec + self.cl_weight * cl
        return ObjectiveOutput(loss, {"loss": loss.detach(), "rec": rec.detach(), "cl": cl.detach()})


@register_objective
class MultiViewMLM(Objective):
    """Encoder MLM over both masked views: mean CE over the masked tokens of view 1 and view 2 together."""

    name = "mlm_views"
    citation = CPDAE
    requires = frozenset({"mlm_labels", SECOND_VIEW})

    def __init__(self, encoder: Encoder):
        super().__init__(encoder)

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        second = view_encoding(enc, SECOND_VIEW, self.name)
        hidden = torch.cat([enc.last_hidden_state, second.last_hidden_state], dim=0)
        labels = torch.cat([batch["mlm_labels"], batch["view2_mlm_labels"]], dim=0)
        loss, count = token_prediction_loss(encoder, hidden, labels)
        return ObjectiveOutput(loss, {"loss": loss.detach(), "tokens": count.detach()})


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"objective 'cpdae': {name} must be a finite number ≥ 0, got {value!r}")
    return float(value)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"objective 'cpdae': {name} must be a finite number > 0, got {value!r}")
    return float(value)
