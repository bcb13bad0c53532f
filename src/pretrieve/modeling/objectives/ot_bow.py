"""DupMAE's ordinary-token (OT) decoding: bag-of-words from the max-pooled vocabulary projection of every
ordinary token (DupMAE, Xiao & Liu 2022, §3.2, eq. 6–8), and the OT max-pool the DupMAE representation reuses (eq. 11).

Paper, step by step, and what we do:

* **eq. 6** ``μ_{x_i} = e_{x_i}ᵀ W^O`` for every ordinary token ``x_i`` of the *masked* input ``X̃_enc``,
  "masked tokens excluded". The linear projection unit ``W^O`` is the encoder's MLM head
  (:meth:`Encoder.mlm_logits`: transform + LayerNorm + tied decoder + bias), as in the authors' code
  (``lm_out.logits``); no parameter is added. *Ordinary tokens* are every attended position except the first
  one ([CLS]); a *masked* position is one the encoder masker selected (``mlm_labels != -100``: the 80 %
  [MASK], 10 % random and 10 % kept tokens alike — the random ones are not in the input's bag and the kept
  ones are MLM targets). [SEP] is an ordinary token here (the authors' code pools it too).
* **eq. 7** ``μ = token.Max({μ_{x_i}})``: the element-wise maximum over those positions, of the raw logits.
* **eq. 8** cross-entropy of ``softmax(μ)`` against ``set(X)``, the unique tokens of the *original* input
  (special tokens excluded; batch feature ``bow_targets``). Eq. 8 writes an unnormalised sum over the set,
  which grows with the text length and would outweigh the token-averaged MLM and decoder losses of eq. 9 by
  a factor of |set(X)| (≈ 60–100); we use the properly normalised form — the target is the uniform
  distribution over ``set(X)``, i.e. :func:`~pretrieve.modeling.objectives.bow.bow_cross_entropy`, the same
  loss as Drop your Decoder's (Ma et al. 2024) BoW — so that eq. 9's weights 1 : 1 : 1 are meaningful. Mean over examples.

``variant="code"`` reproduces staoxiao/RetroMAE ``modeling_duplex.py`` instead: the max-pool runs over every
attended non-[CLS] position *including the masked ones* (``logits[:, 1:]`` with padding pushed to −1000), and
each unique token gets weight ``1 / n`` with ``n`` the number of (non-special) tokens of the text
(``bag_word_weight``), so an example's loss is ``|set(X)| / n`` times ours; the authors weight the whole term
0.1 (``bow_loss_weight``): preset ``dupmae-code``.

Memory. Projecting every position to the vocabulary is ``[B, L, V]`` logits (560 MB in fp32 at B = 32,
L = 144, V = 30522), and its gradient is as large again. :func:`max_pool_logits` projects ``c`` positions at
a time (``c`` chosen so that a chunk holds at most ``chunk_elements`` logits, 2²⁶ = 256 MB fp32 by default),
max-pools each chunk to ``[B, V]`` and takes the maximum of the chunk maxima. Autograd keeps only the
chunks' (small) inputs and their ``[B, V]`` arg-max indices, so forward and backward peak at one chunk of
logits instead of the whole tensor; the result and the gradient are identical to the one-shot max. Only kept
positions are projected: each row's ordinary tokens are gathered to the front
(:func:`compact_kept_positions`), so [CLS], padding and masked positions cost nothing and no mask is applied to
the logits. Without autograd (encoding) the chunk maximum is ``amax`` (no arg-max indices, ~5× faster).
Chunks should not be too small: on our 2-core CPU (hidden 128, B = 64, L = 144) projecting 8 positions per
chunk took 2.0 s against 1.0 s in one shot and 1.3 s at 34 positions (the 2²⁶ default); at B = 32, L = 144
the default is 3 chunks, peak 256 MB of logits (and as much of their gradient) instead of 560 MB.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from pretrieve.errors import ConfigError
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives.base import DUPMAE, Objective, ObjectiveOutput, positive_int, register_objective
from pretrieve.modeling.objectives.bow import bow_cross_entropy
from pretrieve.precision import full_precision

OT_BOW_VARIANTS = ("paper", "code")
DEFAULT_CHUNK_ELEMENTS = 1 << 26
"""Logits per chunk of :func:`max_pool_logits` (2²⁶ = 67 M values, 256 MB in fp32)."""


def ordinary_token_mask(attention_mask: Tensor, mlm_labels: Tensor | None = None) -> Tensor:
    """``[B, L]`` True at the ordinary tokens: attended, not position 0 ([CLS]) and, when ``mlm_labels`` is
    given, not selected by the encoder masker (``mlm_labels == -100``)."""
    keep = attention_mask.bool().clone()
    keep[:, 0] = False
    if mlm_labels is not None:
        keep &= mlm_labels == -100
    return keep


def max_pool_logits(project: Callable[[Tensor], Tensor], hidden: Tensor, keep: Tensor,
                    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> Tensor:
    """``max_{l: keep[b, l]} project(hidden[b, l])`` → ``[B, V]``, computed a chunk of positions at a time.

    ``project`` maps ``[..., H]`` to ``[..., V]`` (the MLM head). Rows without any kept position get the
    dtype's lowest value everywhere (callers drop them). See the module docstring for the memory argument.
    """
    gathered, empty = compact_kept_positions(hidden, keep)
    batch, width = gathered.shape[:2]
    track_grad = torch.is_grad_enabled() and gathered.requires_grad
    first = _chunk_max(project, gathered[:, :1], track_grad)
    step = max(1, chunk_elements // max(1, batch * first.shape[-1]))
    maxima = [first] + [_chunk_max(project, gathered[:, start:start + step], track_grad)
                        for start in range(1, width, step)]
    pooled = first if len(maxima) == 1 else torch.stack(maxima, dim=1).max(dim=1).values
    if bool(empty.any()):
        pooled = pooled.masked_fill(empty.unsqueeze(-1), torch.finfo(pooled.dtype).min)
    return pooled


def compact_kept_positions(hidden: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's kept hidden states moved to the front, ``[B, W, H]`` with ``W`` = the most kept in a row, and
    the rows with none (``[B]`` bool).

    The slots past a row's own count repeat its first kept state instead of being masked: a duplicate never
    changes a maximum, so no ``[B, W, V]`` mask has to be applied to the logits, and its gradient flows back to
    the same source position through the gather. [CLS], padding and masked positions are never gathered.
    """
    counts = keep.sum(dim=1)
    width = max(1, int(counts.max()))
    order = torch.sort(keep.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :width]
    slots = torch.arange(width, device=keep.device).unsqueeze(0)
    index = torch.where(slots < counts.unsqueeze(1), order, order[:, :1])
    gathered = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return gathered, counts == 0


def _chunk_max(project: Callable[[Tensor], Tensor], hidden: Tensor, track_grad: bool) -> Tensor:
    logits = project(hidden)
    # amax is ~5x faster than max(dim) but its backward would keep the whole chunk of logits alive
    return logits.max(dim=1).values if track_grad else logits.amax(dim=1)


def length_weighted_bow_cross_entropy(logits: Tensor, targets: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The authors' code: mean over examples of ``−(1/n_b) Σ_{v ∈ targets_b} log softmax(logits_b)_v``.

    ``targets [B, K]`` unique ids padded with ``-100``; ``lengths [B]`` the token counts ``n_b``. Returns
    ``(loss, examples)`` with examples = rows with at least one target.
    """
    log_probs = torch.log_softmax(full_precision(logits), dim=-1)
    valid = targets != -100
    picked = log_probs.gather(1, targets.clamp(min=0)) * valid
    has_target = valid.any(dim=1)
    examples = has_target.sum()
    if not bool(examples):
        return logits.sum() * 0.0, examples
    per_example = -picked.sum(dim=1) / lengths.clamp(min=1).to(picked.dtype)
    return per_example[has_target].mean(), examples


@register_objective
class OrdinaryTokenBagOfWords(Objective):
    """DupMAE's OT decoding: bag of words of the input from the max-pooled MLM logits of its ordinary tokens.

    Params: ``variant`` — ``"paper"`` (eq. 6–8, default) or ``"code"`` (the authors' released code, see the
    module docstring); ``chunk_elements`` — logits per chunk of the memory-bounded max-pool.
    """

    name = "ot_bow"
    citation = DUPMAE
    requires = frozenset({"mlm_labels", "bow_targets", "original"})

    def __init__(self, encoder: Encoder, *, variant: str = "paper", chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
        super().__init__(encoder)
        if variant not in OT_BOW_VARIANTS:
            raise ConfigError(f"objective 'ot_bow': variant must be one of {', '.join(OT_BOW_VARIANTS)}, "
                              f"got {variant!r}")
        self.variant = variant
        self.chunk_elements = positive_int(self.name, "chunk_elements", chunk_elements)

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        exclude_masked = self.variant == "paper"
        keep = ordinary_token_mask(batch["attention_mask"], batch["mlm_labels"] if exclude_masked else None)
        pooled = max_pool_logits(encoder.mlm_logits, enc.last_hidden_state, keep, self.chunk_elements)
        targets = batch["bow_targets"].masked_fill(~keep.any(dim=1, keepdim=True), -100)
        if self.variant == "paper":
            loss, _ = bow_cross_entropy(pooled, targets)
        else:
            lengths = (batch["original_labels"] != -100).sum(dim=1)
            loss, _ = length_weighted_bow_cross_entropy(pooled, targets, lengths)
        return ObjectiveOutput(loss, {"loss": loss.detach(), "pooled_tokens": keep.sum().detach()})
