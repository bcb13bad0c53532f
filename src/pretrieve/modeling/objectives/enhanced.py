"""Enhanced decoding (Drop your Decoder, Ma et al. 2024, eq. 8–10; RetroMAE, Xiao et al. 2022; DupMAE §3.1 eq. 2–5).

Two streams feed one attention layer:

* query stream ``H1 = [h_CLS + p_0, …, h_CLS + p_N]`` (eq. 8: ``q = h_CLS + p``) — the sentence vector plus
  the *raw* position embeddings of the encoder (no LayerNorm, as RetroMAE's code): param ``query_stream: raw``,
  the default. DupMAE's released code (``modeling_duplex.py``) instead passes ``h_CLS`` at every position
  through the encoder's whole embedding layer, ``H1 = Dropout(LN(h_CLS + p + t_0))`` (position and token-type
  embeddings, LayerNorm, dropout): ``query_stream: embeddings``, which the ``dupmae`` presets use;
* content stream ``H2 = [h_CLS, e_{x_1} + p_1, …, e_{x_N} + p_N]`` (``k = v = h_Dec^Emb``) — the encoder's
  embedding layer applied to the **original, unmasked** text with position 0 replaced by ``h_CLS``.
  RetroMAE's collator passes ``decoder_input_ids = origin_input_ids``: the decoder-side masking lives
  entirely in the position-specific attention mask, not in the input tokens; we follow the code.

``A = softmax(qᵀk/√d + M)·v`` and ``h_Dec = LN(FFN(A) + A)`` (eq. 9) with the residual taken from the query
stream (RetroMAE's ``BertSelfOutput(attention, query)``), one post-LN BERT block (:mod:`.decoder_layers`).
``M`` is the position-specific mask built in the collator by ``pretrieve.masking.enhanced_decoding_mask``
(batch feature ``enhanced_mask``, True = visible): row ``i`` sees a random sample of the other tokens
(keep ratio ``1 − r_Dec``), always the first position (``h_CLS``) for ``i ≠ 0``, never itself; padding keys
are additionally hidden here. The loss (eq. 10) is the CE of the shared MLM head over *all* tokens of the
text except the special tokens and padding (RetroMAE sets the [CLS] and final [SEP] labels to −100):
batch feature ``original_labels``; mean over those tokens.
"""

from __future__ import annotations

from torch import Tensor

from pretrieve.errors import ConfigError

from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.autoencoding import with_cls_first
from pretrieve.modeling.objectives.base import (RETROMAE, Objective, ObjectiveOutput, bottleneck, register_objective,
                                                token_prediction_loss)
from pretrieve.modeling.objectives.decoder_layers import DecoderLayer, LayerShape


QUERY_STREAMS = ("raw", "embeddings")


@register_objective
class EnhancedDecoder(Objective):
    """RetroMAE's two-stream, position-specific-mask decoder."""

    name = "enhanced"
    citation = RETROMAE
    requires = frozenset({"original", "enhanced_mask"})

    def __init__(self, encoder: Encoder, *, query_stream: str = "raw"):
        super().__init__(encoder)
        if query_stream not in QUERY_STREAMS:
            raise ConfigError(f"objective 'enhanced': query_stream must be one of {', '.join(QUERY_STREAMS)}, "
                              f"got {query_stream!r}")
        self.query_stream = query_stream
        self.layer = DecoderLayer(LayerShape.from_config(encoder.config))

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        ids = batch["original_input_ids"]
        positions = encoder.position_ids(ids)
        embedded = encoder.embed_tokens(ids, positions)
        sentence = bottleneck(enc)                                                                # h_CLS
        cls = sentence.unsqueeze(1).to(embedded.dtype)
        if self.query_stream == "embeddings":                                                     # H1, DupMAE code
            query = encoder.embed_vectors(cls.expand(-1, ids.shape[1], -1), positions)
        else:                                                                                     # H1, RetroMAE
            query = cls + encoder.position_embeddings(positions)
        content = with_cls_first(sentence, embedded)                                               # H2
        visible = batch["enhanced_mask"].bool() & batch["attention_mask"].bool().unsqueeze(1)
        decoded = self.layer(query, content, visible)
        loss, count = token_prediction_loss(encoder, decoded, batch["original_labels"])
        return ObjectiveOutput(loss, {"loss": loss.detach(), "tokens": count.detach()})
