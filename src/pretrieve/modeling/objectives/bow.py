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
  text"). This is exactly the authors' released code (caskcsg/ir, bowdpr ``BoWPredictionCollator.
  _get_bow_weights``: weight ``1/|set|`` on each unique id of the unmasked input above 998, i.e. without BERT's
  special and ``[unused]`` tokens; ``bow_loss`` = ``mean_b −Σ_v w_bv log softmax``). The RetroMAE/DupMAE
  authors' ``bag_word_weight`` instead puts ``1/n_tokens`` on each unique id (ours times ``|T_b| / n_tokens``).
* **Weight schedule** — param ``cosine_decay_to`` (default None: the weight stays 1, as eq. 13 reads). The
  authors' released code (bowdpr, ``--bow_factor_cosine_decay_to 0.1`` in both pre-training phases, "used for
  stabilising the pre-training") multiplies the BoW loss by a cosine from 1 down to that floor over the run:
  ``f(t) = floor + (1 − floor) · ½ (1 + cos(π t))`` with ``t = step / total_steps`` (the loop puts ``t`` in every
  batch as ``training_progress``; without it, e.g. outside the loop, ``f = 1``). The ``bow`` preset uses 0.1.
  Their code indexes the decay by accelerate's step counter, which counts micro-batches: with their gradient
  accumulation of 4 (Wikipedia + BookCorpus) and 2 (MS MARCO) the factor reaches the floor after 1/4 and 1/2
  of the run and stays there; we decay over the optimizer steps, the schedule the option's name describes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pretrieve.errors import ConfigError
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.base import (DROP_YOUR_DECODER, Objective, ObjectiveOutput, bottleneck,
                                                register_objective)
from pretrieve.precision import full_precision

PROGRESS = "training_progress"
"""Batch key of ``step / total_steps`` (put there by :class:`pretrieve.train.loop.StepBatches`)."""


def cosine_decay(progress: Tensor, floor: float) -> Tensor:
    """``floor + (1 − floor) · ½ (1 + cos(π · progress))``: 1 at the start, ``floor`` at the end (on the device)."""
    return floor + (1.0 - floor) * 0.5 * (1.0 + torch.cos(torch.pi * progress.float()))


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
    """Predict the input's bag of words from the [CLS] vector (or the method's bottleneck) through the MLM head
    (eq. 12)."""

    name = "bow"
    citation = DROP_YOUR_DECODER
    requires = frozenset({"bow_targets"})

    def __init__(self, encoder: Encoder, *, cosine_decay_to: float | None = None):
        super().__init__(encoder)
        if cosine_decay_to is not None and (isinstance(cosine_decay_to, bool) or not isinstance(cosine_decay_to, (int, float))
                                            or not 0 <= cosine_decay_to <= 1):
            raise ConfigError(f"objective 'bow': cosine_decay_to must be a number in [0, 1] or null, "
                              f"got {cosine_decay_to!r}")
        self.cosine_decay_to = cosine_decay_to

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        logits = encoder.mlm_logits(bottleneck(enc))
        loss, _ = bow_cross_entropy(logits, batch["bow_targets"])
        logs = {}
        if self.cosine_decay_to is not None and PROGRESS in batch:
            factor = cosine_decay(batch[PROGRESS], float(self.cosine_decay_to))
            logs["cross_entropy"] = loss.detach()
            logs["factor"] = factor.detach()
            loss = loss * factor
        return ObjectiveOutput(loss, {"loss": loss.detach(), **logs})
