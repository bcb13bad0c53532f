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

Options of both decoders (objective params):

* ``direction_weights`` — how the two directions are combined. ``null`` (default): one mean over every scored
  token of both directions, as CoT-MAE's code does (its decoder sees the ``2B`` interleaved rows). ``[w_c, w_a]``:
  each direction's own mean, then ``w_c · mean(anchor → context) + w_a · mean(context → anchor)``; a direction
  weighted 0 is not decoded at all. With passage anchors (~144 tokens) and query contexts (~10 tokens), the
  token-count mean lets passage reconstruction outweigh query generation 10–20×, while CoT-MoTE's eq. 12 is the
  passage → query task only, and CoT-MAE-qc's code (which CoT-MoTE reuses) decodes only the context span from
  the anchor's [CLS]: the ``cotmote`` preset uses ``[1, 0]``.
* ``attention_window`` (``context_ar`` only; default null = full causal attention) — position ``i`` of the
  decoder sees the bottleneck (position 0) and the ``attention_window`` most recent positions up to itself, as
  :mod:`.autoregression`'s SEED option; CoT-MAE-qc's AR head uses ``--attn_window 3`` (its GPT-2 blocks get the
  same triangular mask), and so does the ``cotmote`` preset.

Logged besides the loss: ``loss_to_context`` / ``loss_to_anchor`` (each decoded direction's mean) and
``tokens``.
The decoder layers are our BERT-equivalent post-LN block (:mod:`.decoder_layers`); CoT-MAE-qc's AR head is a
GPT-2 block (pre-LN + final LayerNorm) — we keep one block type for every decoder of the project, as
:mod:`.autoregression` does for SEED.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pretrieve.errors import ConfigError
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.autoencoding import with_cls_first
from pretrieve.modeling.objectives.autoregression import causal_visibility
from pretrieve.modeling.objectives.base import (COT_MAE, COT_MOTE, Objective, ObjectiveOutput, bottleneck, positive_int,
                                                register_objective, token_prediction_loss)
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


def directional_loss(encoder: Encoder, decoded: Tensor, labels: Tensor, rows: int,
                     weights: tuple[float, float] | None = None,
                     directions: tuple[bool, bool] = (True, True)) -> tuple[Tensor, dict[str, Tensor]]:
    """The decoders' loss over the decoded rows, plus each direction's own mean for the logs.

    ``directions`` says which of (anchor → context, context → anchor) were decoded; the decoded rows hold the
    first direction's ``rows`` rows first. ``weights`` None: the mean over every scored token; else the weighted
    sum of the directions' means (module docstring)."""
    names = ("to_context", "to_anchor")
    means, counts, start = {}, {}, 0
    for name, decoded_here in zip(names, directions):
        if decoded_here:
            means[name], counts[name] = token_prediction_loss(encoder, decoded[start:start + rows],
                                                              labels[start:start + rows])
            start += rows
    if weights is None:
        total = sum(counts.values()).clamp(min=1)
        loss = sum(means[name] * counts[name] for name in means) / total
    else:
        loss = sum(weight * means[name] for name, weight in zip(names, weights) if name in means)
    logs = {"loss": loss.detach(), "tokens": sum(counts.values()).detach(),
            **{f"loss_{name}": mean.detach() for name, mean in means.items()}}
    return loss, logs


def check_direction_weights(name: str, weights) -> tuple[float, float] | None:
    if weights is None:
        return None
    if (not isinstance(weights, (list, tuple)) or len(weights) != 2
            or any(isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0
                   for w in weights) or not any(weights)):
        raise ConfigError(f"objective '{name}': direction_weights must be null or two numbers >= 0, not both 0 "
                          f"([anchor -> context, context -> anchor]), got {weights!r}")
    return float(weights[0]), float(weights[1])


class _ContextualDecoder(Objective):
    """Shared parts: the decoder stack, the direction weights and the bottleneck vectors (anchors' then
    contexts' [CLS])."""

    default_layers = 1

    def __init__(self, encoder: Encoder, *, num_layers: int | None = None,
                 direction_weights: list[float] | None = None):
        super().__init__(encoder)
        layers = self.default_layers if num_layers is None else positive_int(self.name, "num_layers", num_layers)
        self.decoder = DecoderStack(encoder.config, layers)
        self.direction_weights = check_direction_weights(self.name, direction_weights)
        weights = self.direction_weights or (1.0, 1.0)
        self.directions = (weights[0] > 0, weights[1] > 0)

    def other_spans(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder,
                    ids: tuple[str, str], labels: tuple[str, str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The span each decoded row reconstructs (contexts' features for anchor rows, then anchors' for
        context rows; only the directions with a weight > 0), named by ``ids`` / ``labels`` = (context key, anchor
        key): its token ids, labels, attention mask (bool) and the decoder input ``[bottleneck; token
        embeddings]``."""
        pad = int(getattr(encoder.config, "pad_token_id", None) or 0)
        sides = [(batch[ids[0]], batch[labels[0]], batch["context_attention_mask"], bottleneck(enc)),
                 (batch[ids[1]], batch[labels[1]], batch["attention_mask"], bottleneck(context_view(enc)))]
        sides = [side for side, decoded in zip(sides, self.directions) if decoded]
        if len(sides) == 1:   # one direction: its B rows at their own length
            targets, target_labels, attention, bottlenecks = sides[0]
            attention = attention.bool()
        else:
            (first, second) = sides
            targets = stack_padded(first[0], second[0], pad)
            target_labels = stack_padded(first[1], second[1], IGNORE_INDEX)
            attention = stack_padded(first[2], second[2], 0).bool()
            bottlenecks = torch.cat([first[3], second[3]])
        hidden = with_cls_first(bottlenecks, encoder.embed_tokens(targets))
        return targets, target_labels, attention, hidden


@register_objective
class ContextAutoEncoding(_ContextualDecoder):
    """CoT-MAE: reconstruct the decoder-masked other span from this span's [CLS] (bidirectional decoder)."""

    name = "context_ae"
    citation = COT_MAE
    requires = frozenset({"decoder", "context"})
    default_layers = 2

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        rows = batch["input_ids"].shape[0]
        _, labels, attention, hidden = self.other_spans(batch, enc, encoder,
                                                        ("context_decoder_input_ids", "decoder_input_ids"),
                                                        ("context_decoder_labels", "decoder_labels"))
        decoded = self.decoder(hidden, attention.unsqueeze(1))
        loss, logs = directional_loss(encoder, decoded, labels, rows, self.direction_weights, self.directions)
        return ObjectiveOutput(loss, logs)


@register_objective
class ContextAutoRegression(_ContextualDecoder):
    """CoT-MoTE eq. 12: generate the other span left to right from this span's [CLS] (causal decoder)."""

    name = "context_ar"
    citation = COT_MOTE
    requires = frozenset({"original", "context"})
    default_layers = 1

    def __init__(self, encoder: Encoder, *, num_layers: int | None = None,
                 direction_weights: list[float] | None = None, attention_window: int | None = None):
        super().__init__(encoder, num_layers=num_layers, direction_weights=direction_weights)
        if attention_window is not None:
            positive_int(self.name, "attention_window", attention_window)
        self.attention_window = attention_window

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        rows = batch["input_ids"].shape[0]
        targets, labels, attention, hidden = self.other_spans(batch, enc, encoder,
                                                              ("context_original_ids", "original_input_ids"),
                                                              ("context_original_labels", "original_labels"))
        causal = causal_visibility(targets.shape[1], self.attention_window, targets.device)
        decoded = self.decoder(hidden, causal.unsqueeze(0) & attention.unsqueeze(1))
        loss, logs = directional_loss(encoder, decoded[:, :-1], labels[:, 1:], rows, self.direction_weights,
                                      self.directions)
        return ObjectiveOutput(loss, logs)


@register_objective
class SpanMaskedLanguageModeling(Objective):
    """Encoder MLM over the masked tokens of the anchors and of their context spans (one mean)."""

    name = "mlm_spans"
    citation = COT_MAE
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
