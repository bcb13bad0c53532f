"""Encoder masked language modelling (Drop your Decoder, Ma et al. 2024, eq. 3).

``L_enc = CE(Enc(mask(t)), t_i), i ∈ M``: the encoder's own MLM head predicts the original token at every
position the encoder masker selected (``mlm_labels != -100``; the label is the original id whether the
position shows [MASK], a random token or the original token — BERT's 80/10/10). Choices:

* hidden states are gathered at the masked positions before the head, so the vocabulary projection costs
  ``N_masked × H × V`` instead of ``B × L × H × V`` (identical loss);
* the loss is the mean over all masked tokens of the batch (as Hugging Face's ``BertForMaskedLM`` and the
  RetroMAE / bowdpr code), not a per-sequence mean.
"""

from __future__ import annotations

from torch import Tensor

from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.base import (BERT, Objective, ObjectiveOutput, register_objective,
                                                token_prediction_loss)


@register_objective
class MaskedLanguageModeling(Objective):
    """Cross-entropy of the encoder's MLM head at the encoder-masked positions."""

    name = "mlm"
    citation = BERT
    requires = frozenset({"mlm_labels"})

    def __init__(self, encoder: Encoder):
        super().__init__(encoder)

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        loss, count = token_prediction_loss(encoder, enc.last_hidden_state, batch["mlm_labels"])
        return ObjectiveOutput(loss, {"loss": loss.detach(), "tokens": count.detach()})
