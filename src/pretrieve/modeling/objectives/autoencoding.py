"""Auto-encoding decoder (Drop your Decoder, Ma et al. 2024, eq. 4–5; RetroMAE without enhanced decoding, Condenser-style).

The decoder input is the text masked again by the *decoder* masker (a larger ratio, ``r_Dec > r_Enc``) with
its first token replaced by the encoder's sentence representation (eq. 4):
``mask(t_Dec) = {h_CLS, t_1, t_2, [m], t_4, …, t_n, [SEP]}``.
A fresh shallow transformer reconstructs the masked tokens with the MLM loss (eq. 5), so the gradient
reaches the encoder only through ``h_CLS`` (the bottleneck). Choices:

* token positions 1… are embedded by the encoder's own embedding layer (word + position (+ type) +
  LayerNorm + dropout, shared weights), as RetroMAE's ``decoder_embeddings = lm.bert.embeddings``;
  position 0 is the raw last-layer [CLS] vector (no extra position embedding or LayerNorm);
* the decoder is ``num_layers`` post-LN BERT blocks (:mod:`.decoder_layers`), bidirectional self-attention
  restricted to non-padding keys. Drop your Decoder (Ma et al. 2024) reproduces RetroMAE's one-layer decoder (default 1);
  CDMAE uses 2;
* the loss is the mean CE over the decoder-masked positions (``decoder_labels != -100``), scored through
  the encoder's (shared) MLM head after gathering those positions;
* ``projection=True`` (CDMAE (Li et al. 2023) eq. 4 and Table 4) puts a linear bottleneck head between encoder
  and decoder: position 0 of the decoder input is ``h_b = W·h_CLS + b`` instead of ``h_CLS``. ``W`` is
  ``d_dec × d_enc`` with ``d_dec = d_enc`` here (the decoder blocks are sized from the encoder's config),
  initialised like the decoder layers (``N(0, initializer_range)``, zero bias); it belongs to the decoder
  head and is dropped with it after pre-training. The importance-aware decoder masking of CDMAE is the
  decoder masker's business (``decoder_masker: {kind: pmi}``), not this objective's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pretrieve.errors import ConfigError
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.base import (DROP_YOUR_DECODER, Objective, ObjectiveOutput, bottleneck, positive_int,
                                                register_objective, token_prediction_loss)
from pretrieve.modeling.objectives.decoder_layers import DecoderStack, LayerShape


def with_cls_first(cls: Tensor, embedded: Tensor) -> Tensor:
    """``[h_CLS ; embedded[:, 1:]]``: the sentence vector replaces the first token (eq. 4, 6, RetroMAE H2)."""
    return torch.cat([cls.unsqueeze(1).to(embedded.dtype), embedded[:, 1:]], dim=1)


@register_objective
class AutoEncodingDecoder(Objective):
    """Reconstruct decoder-masked tokens from [h_CLS ; masked text] with a shallow decoder."""

    name = "ae"
    citation = DROP_YOUR_DECODER
    requires = frozenset({"decoder"})

    def __init__(self, encoder: Encoder, *, num_layers: int = 1, projection: bool = False):
        super().__init__(encoder)
        self.decoder = DecoderStack(encoder.config, positive_int(self.name, "num_layers", num_layers))
        if not isinstance(projection, bool):
            raise ConfigError(f"objective '{self.name}': parameter 'projection' must be true or false, got "
                              f"{projection!r}")
        self.projection: torch.nn.Linear | None = None
        if projection:
            shape = LayerShape.from_config(encoder.config)
            self.projection = torch.nn.Linear(encoder.hidden_size, shape.hidden_size)
            torch.nn.init.normal_(self.projection.weight, mean=0.0, std=shape.initializer_range)
            torch.nn.init.zeros_(self.projection.bias)

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        sentence = bottleneck(enc)
        first = sentence if self.projection is None else self.projection(sentence)      # CDMAE eq. 4
        hidden = with_cls_first(first, encoder.embed_tokens(batch["decoder_input_ids"]))
        key_visible = batch["attention_mask"].bool().unsqueeze(1)          # [B, 1, L]
        decoded = self.decoder(hidden, key_visible)
        loss, count = token_prediction_loss(encoder, decoded, batch["decoder_labels"])
        return ObjectiveOutput(loss, {"loss": loss.detach(), "tokens": count.detach()})
