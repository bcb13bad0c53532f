"""Bag-of-words prediction from the [CLS] vector (Drop your Decoder, Ma et al. 2024, §3.3, Algorithm 2, eq. 11–13).

``h_proj = h_CLS · Eᵀ`` (eq. 11) projects the sentence representation to the vocabulary, and
``L_Dec = CE(h_CLS Eᵀ, T)`` (eq. 12) is a multi-label cross-entropy against the token *set* ``T`` of the
input. Choices, each stated:

* **Projection** — the encoder's full MLM head (transform + LayerNorm + tied decoder ``Eᵀ`` + bias), "the
  BERT language model heads" of §3.2/§3.3; no new parameter is added (the method's selling point).
* **Target** — the set of unique non-special token ids of the *original, unmasked* text (the encoder sees
  the masked text, so masked words must still be predicted). The collator sends it compactly as padded
  ids ``bow_targets [B, K]`` (``-100`` = padding); it is never densified to ``[B, V]``: the loss gathers
  the K log-probabilities instead, which is the same number.
* **Normalisation** — the target is the uniform distribution over the unique tokens (multi-hot / count),
  so ``loss_b = −(1/|T_b|) Σ_{v∈T_b} log softmax(h_proj)_v`` and the batch loss is the mean over
  examples with at least one target. Duplicates count once (eq. 12's ``T`` is "a set of tokenized input
  text"). The bowdpr source is not in our offline reference index; the closest public implementation of
  this loss by the RetroMAE/DupMAE authors (``bag_word_weight`` in staoxiao/RetroMAE) sets weight
  ``1/n_tokens`` on each unique id, i.e. ours times ``|T_b| / n_tokens`` — a per-example rescaling that
  down-weights repetitive texts. We keep the properly normalised distribution (a true cross-entropy
  whose value is comparable across texts of different length).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.base import Objective, ObjectiveOutput, full_precision, register_objective


def bow_cross_entropy(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Mean over examples of ``−mean_{v ∈ targets_b} log softmax(logits_b)_v``.

    ``logits [B, V]``; ``targets [B, K]`` unique ids padded with ``-100``. Returns ``(loss, examples)``.
    """
    log_probs = torch.log_softmax(full_precision(logits), dim=-1)
    valid = targets != -100
    picked = log_probs.gather(1, targets.clamp(min=0)) * valid
    counts = valid.sum(dim=1)
    has_target = counts > 0
    per_example = -picked.sum(dim=1) / counts.clamp(min=1)
    examples = has_target.sum()
    if not bool(examples):
        return logits.sum() * 0.0, examples
    return per_example[has_target].mean(), examples


@register_objective
class BagOfWords(Objective):
    """Predict the input's bag of words from the [CLS] vector through the MLM head (eq. 12)."""

    name = "bow"
    requires = frozenset({"bow_targets"})

    def __init__(self, encoder: Encoder):
        super().__init__(encoder)

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        logits = encoder.mlm_logits(enc.cls)
        loss, _ = bow_cross_entropy(logits, batch["bow_targets"])
        return ObjectiveOutput(loss, {"loss": loss.detach()})
