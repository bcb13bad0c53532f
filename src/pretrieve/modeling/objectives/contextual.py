"""CoT-MAE's contextual decoders (Wu et al., 2023; CoT-MoTE (Ma et al. 2023) eq. 10–12): each span's [CLS] vector, with the
embeddings of the *other* span of its pair, reconstructs that other span.

A batch holds ``B`` anchors (the encoder-masked main input) and their ``B`` context spans (batch feature
``context``: ``context_input_ids`` / ``context_attention_mask`` / ``context_mlm_labels`` / ``context_text_type``,
built by the collator from the examples of :mod:`pretrieve.data.spans`). :class:`~pretrieve.modeling.
pretrain_model.PretrainModel` encodes ``[anchors; contexts]`` in one encoder call (extra encoder input
``context``), so objectives read the context encoding from ``enc.views["context"]``.

Objectives registered here:

* ``context_ae`` — auto-encoding decoder (CoT-MAE): input ``[h_CLS(X) ; embeddings of the decoder-masked Y]``
  (position 0 replaced by the other span's [CLS] vector, as in :mod:`.autoencoding`), bidirectional attention
  over Y's tokens, MLM loss at Y's decoder-masked positions through the shared head. Both directions
  (anchor→context and context→anchor) go through the decoder as one ``2B`` batch; the loss is the mean over
  all their masked tokens (CoT-MAE's code computes one cross-entropy over the ``2B`` interleaved rows).
  CoT-MAE's settings: 2 decoder layers (``n_head_layers=2``), decoder mask 0.45, encoder mask 0.30 (the
  ``cotmae`` preset).
* ``context_ar`` — auto-regressive decoder (CoT-MAE-qc / CoT-MoTE eq. 12, "a single-layer decoder … Casual
  Language Model"): input ``[h_CLS(X) ; embeddings of Y]`` (Y unmasked), causal attention, position ``i``
  predicts Y's token ``i + 1`` (special tokens and padding not predicted, as :mod:`.autoregression`); 1 layer
  by default; both directions as above.
* ``mlm_spans`` — the encoder MLM over the masked tokens of *both* spans (anchors' ``mlm_labels`` and contexts'
  ``context_mlm_labels``, one mean), because CoT-MAE's encoder is an ordinary MLM over every span of the
  batch; it replaces ``mlm`` in the CoT presets (using both would count the anchors twice).

Logged besides the loss: ``loss_to_context`` / ``loss_to_anchor`` (each direction's mean) and ``tokens``.
The decoder layers are our BERT-equivalent post-LN block (:mod:`.decoder_layers`); CoT-MAE-qc's AR head is a
GPT-2 block (pre-LN + final LayerNorm) — we keep one block type for every decoder of the project, as
:mod:`.autoregression` does for SEED.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from pretrieve.errors import ConfigError
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.autoencoding import with_cls_first
from pretrieve.modeling.objectives.autoregression import causal_visibility
from pretrieve.modeling.objectives.base import (Objective, ObjectiveOutput, positive_int, register_objective,
                                                token_prediction_loss)
from pretrieve.modeling.objectives.decoder_layers import DecoderStack

CONTEXT = "context"
IGNORE_INDEX = -100


def context_view(enc: EncoderOutput) -> EncoderOutput:
    """The encoding of the context spans (``enc.views["context"]``), with a clear error when it is missing."""
    views = getattr(enc, "views", None) or {}
    if CONTEXT not in views:
        raise ConfigError("contextual objectives need the context spans encoded beside the anchors (batch feature "
                          "'context', an extra encoder input of PretrainModel)")
    return views[CONTEXT]


def stack_padded(first: Tensor, second: Tensor, value: int) -> Tensor:
    """``[first; second]`` along the batch, right-padding the shorter one's length with ``value``."""
    length = max(first.shape[1], second.shape[1])
    pad = lambda t: F.pad(t, (0, length - t.shape[1]), value=value)  # noqa: E731
    return torch.cat([pad(first), pad(second)])


def directional_loss(encoder: Encoder, decoded: Tensor, labels: Tensor, rows: int) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean CE over every scored token of the ``2B`` rows, plus each direction's own mean for the logs.

    Rows ``[:rows]`` reconstruct the contexts from the anchors' [CLS], rows ``[rows:]`` the anchors."""
    to_context, count_context = token_prediction_loss(encoder, decoded[:rows], labels[:rows])
    to_anchor, count_anchor = token_prediction_loss(encoder, decoded[rows:], labels[rows:])
    total = (count_context + count_anchor).clamp(min=1)
    loss = (to_context * count_context + to_anchor * count_anchor) / total
    logs = {"loss": loss.detach(), "loss_to_context": to_context.detach(), "loss_to_anchor": to_anchor.detach(),
            "tokens": (count_context + count_anchor).detach()}
    return loss, logs


class _ContextualDecoder(Objective):
    """Shared parts: the decoder stack and the ``2B`` bottleneck vectors (anchors' then contexts' [CLS])."""

    default_layers = 1

    def __init__(self, encoder: Encoder, *, num_layers: int | None = None):
        super().__init__(encoder)
        layers = self.default_layers if num_layers is None else positive_int(self.name, "num_layers", num_layers)
        self.decoder = DecoderStack(encoder.config, layers)

    @staticmethod
    def bottlenecks(enc: EncoderOutput) -> Tensor:
        """``[h_CLS(anchors); h_CLS(contexts)]`` → row ``i`` reconstructs the *other* span of its pair."""
        return torch.cat([enc.cls, context_view(enc).cls])

    def other_spans(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder,
                    ids: tuple[str, str], labels: tuple[str, str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The span each of the ``2B`` rows reconstructs (contexts' features for anchor rows, then anchors' for
        context rows), named by ``ids`` / ``labels`` = (context key, anchor key): its token ids, labels,
        attention mask (bool) and the decoder input ``[bottleneck; token embeddings]``."""
        pad = int(getattr(encoder.config, "pad_token_id", None) or 0)
        targets = stack_padded(batch[ids[0]], batch[ids[1]], pad)
        target_labels = stack_padded(batch[labels[0]], batch[labels[1]], IGNORE_INDEX)
        attention = stack_padded(batch["context_attention_mask"], batch["attention_mask"], 0).bool()
        hidden = with_cls_first(self.bottlenecks(enc), encoder.embed_tokens(targets))
        return targets, target_labels, attention, hidden


@register_objective
class ContextAutoEncoding(_ContextualDecoder):
    """CoT-MAE: reconstruct the decoder-masked other span from this span's [CLS] (bidirectional decoder)."""

    name = "context_ae"
    requires = frozenset({"decoder", "context"})
    default_layers = 2

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        rows = batch["input_ids"].shape[0]
        _, labels, attention, hidden = self.other_spans(batch, enc, encoder,
                                                        ("context_decoder_input_ids", "decoder_input_ids"),
                                                        ("context_decoder_labels", "decoder_labels"))
        decoded = self.decoder(hidden, attention.unsqueeze(1))
        loss, logs = directional_loss(encoder, decoded, labels, rows)
        return ObjectiveOutput(loss, logs)


@register_objective
class ContextAutoRegression(_ContextualDecoder):
    """CoT-MoTE eq. 12: generate the other span left to right from this span's [CLS] (causal decoder)."""

    name = "context_ar"
    requires = frozenset({"original", "context"})
    default_layers = 1

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        rows = batch["input_ids"].shape[0]
        targets, labels, attention, hidden = self.other_spans(batch, enc, encoder,
                                                              ("context_original_ids", "original_input_ids"),
                                                              ("context_original_labels", "original_labels"))
        causal = causal_visibility(targets.shape[1], None, targets.device)
        decoded = self.decoder(hidden, causal.unsqueeze(0) & attention.unsqueeze(1))
        loss, logs = directional_loss(encoder, decoded[:, :-1], labels[:, 1:], rows)
        return ObjectiveOutput(loss, logs)


@register_objective
class SpanMaskedLanguageModeling(Objective):
    """Encoder MLM over the masked tokens of the anchors and of their context spans (one mean)."""

    name = "mlm_spans"
    requires = frozenset({"mlm_labels", "context"})

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        context = context_view(enc)
        anchor_loss, anchor_count = token_prediction_loss(encoder, enc.last_hidden_state, batch["mlm_labels"])
        context_loss, context_count = token_prediction_loss(encoder, context.last_hidden_state,
                                                            batch["context_mlm_labels"])
        total = (anchor_count + context_count).clamp(min=1)
        loss = (anchor_loss * anchor_count + context_loss * context_count) / total
        return ObjectiveOutput(loss, {"loss": loss.detach(), "loss_anchor": anchor_loss.detach(),
                                                      "loss_context": context_loss.detach(),
                                                      "tokens": (anchor_count + context_count).detach()})
