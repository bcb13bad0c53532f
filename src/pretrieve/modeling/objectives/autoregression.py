"""Auto-regressive decoder (Drop your Decoder, Ma et al. 2024, eq. 6–7; SEED-Encoder, Lu et al. 2021).

The decoder input is the *original* text with its first token replaced by the encoder's sentence vector
(eq. 6): ``t_Dec = {h_CLS, t_1, …, t_n, [SEP]}``; a causal decoder predicts every token from the ones
before it (eq. 7, ``CE(Dec(t_Dec[:i−1]), t_i), i ∈ (0, n]``). Choices:

* position ``i`` predicts the token at ``i + 1`` (shifted CE); the targets are the original tokens
  ``t_1 … t_n`` — special tokens ([SEP]) and padding are not predicted (``original_labels``), so exactly
  ``i ∈ (0, n]`` of eq. 7; the loss is the mean over those tokens of the batch;
* inputs 1… are embedded by the encoder's shared embedding layer; position 0 is the raw [CLS] vector;
* ``num_layers`` post-LN BERT blocks with a causal mask. Drop your Decoder (Ma et al. 2024) describes SEED as "merely a single-layer
  auto-regressive decoder" and reproduces it with RetroMAE's settings, so the default is 1;
* ``attention_window`` (default ``None`` = full causal attention, as eq. 7) optionally applies SEED's
  attention-span restriction: position ``i`` sees ``h_CLS`` plus the ``attention_window`` most recent
  positions up to itself (``i − window < j ≤ i``), forcing the decoder to rely on the bottleneck.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.autoencoding import with_cls_first
from pretrieve.modeling.objectives.base import (DROP_YOUR_DECODER, Objective, ObjectiveOutput, bottleneck, positive_int,
                                                register_objective, token_prediction_loss)
from pretrieve.modeling.objectives.decoder_layers import DecoderStack


def causal_visibility(length: int, window: int | None, device: torch.device | None = None) -> Tensor:
    """``[L, L]`` bool: query ``i`` may see key ``j`` when ``j ≤ i`` (and ``j == 0`` or ``i − j < window``)."""
    positions = torch.arange(length, device=device)
    distance = positions.unsqueeze(1) - positions.unsqueeze(0)       # i - j
    visible = distance >= 0
    if window is not None:
        visible &= (distance < window) | (positions.unsqueeze(0) == 0)
    return visible


@register_objective
class AutoRegressiveDecoder(Objective):
    """Generate the original text left to right from [h_CLS ; text] with a causal decoder."""

    name = "ar"
    citation = DROP_YOUR_DECODER
    requires = frozenset({"original"})

    def __init__(self, encoder: Encoder, *, num_layers: int = 1, attention_window: int | None = None):
        super().__init__(encoder)
        self.decoder = DecoderStack(encoder.config, positive_int(self.name, "num_layers", num_layers))
        if attention_window is not None:
            positive_int(self.name, "attention_window", attention_window)
        self.attention_window = attention_window

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        ids = batch["original_input_ids"]
        hidden = with_cls_first(bottleneck(enc), encoder.embed_tokens(ids))
        causal = causal_visibility(ids.shape[1], self.attention_window, ids.device)
        visible = causal.unsqueeze(0) & batch["attention_mask"].bool().unsqueeze(1)     # [B, L, L]
        decoded = self.decoder(hidden, visible)
        loss, count = token_prediction_loss(encoder, decoded[:, :-1], batch["original_labels"][:, 1:])
        return ObjectiveOutput(loss, {"loss": loss.detach(), "tokens": count.detach()})
