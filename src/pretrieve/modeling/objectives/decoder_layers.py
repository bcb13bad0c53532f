"""The shallow transformer blocks that MAE-style decoders add on top of the encoder.

One post-LayerNorm block (Drop your Decoder, Ma et al. 2024, eq. 9: ``A = softmax(qᵀk/√d + M)·v``, ``h = LN(FFN(A) + A)``), sized from
the encoder's config, serves every decoder:

* auto-encoding (eq. 4–5) and auto-regression (eq. 6–7): self-attention, ``query_states`` only;
* enhanced decoding (eq. 8–10): queries from the query stream H1, keys/values from the content stream H2,
  residual taken from H1 (as RetroMAE's ``BertSelfOutput(attention, query)``).

We use one standard block instead of the model family's own layer class (``BertLayer``, ``RobertaLayer``,
``TransformerBlock``...): those classes do not take separate query and key/value streams, their call
signatures changed between transformers 4 and 5, and their parameter names differ per family. The block
matches BERT's layer exactly (same sub-layers, activation, LayerNorm epsilon, dropouts, initialisation
``N(0, initializer_range)``), so a BERT decoder layer is what the papers used.

Masks are boolean "visible" tensors (True = may attend) broadcastable to ``[B, Lq, Lk]``; they are turned
into additive masks in the dtype the attention is computed in (so fp16/bf16 autocast never sees ``-inf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN


@dataclass(frozen=True)
class LayerShape:
    """The hyper-parameters of one decoder block, read from any BERT-like config."""

    hidden_size: int
    num_heads: int
    intermediate_size: int
    activation: str
    layer_norm_eps: float
    dropout: float
    attention_dropout: float
    initializer_range: float

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "LayerShape":
        hidden = int(_first(config, ("hidden_size", "dim", "d_model")))
        return cls(
            hidden_size=hidden,
            num_heads=int(_first(config, ("num_attention_heads", "n_heads"))),
            intermediate_size=int(_first(config, ("intermediate_size", "hidden_dim"), 4 * hidden)),
            activation=str(_first(config, ("hidden_act", "activation"), "gelu")),
            layer_norm_eps=float(_first(config, ("layer_norm_eps",), 1e-12)),
            dropout=float(_first(config, ("hidden_dropout_prob", "dropout"), 0.1)),
            attention_dropout=float(_first(config, ("attention_probs_dropout_prob", "attention_dropout"), 0.1)),
            initializer_range=float(_first(config, ("initializer_range",), 0.02)),
        )


def _first(config: PretrainedConfig, names: tuple[str, ...], default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is None:
        raise ValueError(f"config of type {type(config).__name__} has none of {names}")
    return default


def additive_mask(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool ``[B, Lq, Lk]`` (or ``[B, 1, Lk]``; True = visible) → additive ``[B, 1, Lq|1, Lk]`` (0 or dtype min)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask = mask.masked_fill(~visible, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


class DecoderLayer(nn.Module):
    """A post-LN transformer block whose queries and keys/values may come from different streams."""

    def __init__(self, shape: LayerShape):
        super().__init__()
        if shape.hidden_size % shape.num_heads:
            raise ValueError(f"hidden size {shape.hidden_size} is not a multiple of {shape.num_heads} heads")
        self.num_heads = shape.num_heads
        self.head_dim = shape.hidden_size // shape.num_heads
        h = shape.hidden_size
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.attention_output = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.intermediate = nn.Linear(h, shape.intermediate_size)
        self.output = nn.Linear(shape.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.activation = ACT2FN[shape.activation]
        self.dropout = nn.Dropout(shape.dropout)
        self.attention_dropout = shape.attention_dropout
        self.reset_parameters(shape.initializer_range)

    def reset_parameters(self, std: float) -> None:
        """BERT's initialisation: linear weights ``N(0, std)``, biases 0, LayerNorm (1, 0)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, query_states: Tensor, key_value_states: Tensor | None = None,
                visible: Tensor | None = None) -> Tensor:
        """``query_states [B, Lq, H]``, ``key_value_states [B, Lk, H]`` (default: the queries), ``visible``
        bool broadcastable to ``[B, Lq, Lk]`` → ``[B, Lq, H]``."""
        kv = query_states if key_value_states is None else key_value_states
        q = self._heads(self.query(query_states))
        k = self._heads(self.key(kv))
        v = self._heads(self.value(kv))
        mask = None
        if visible is not None:
            mask = additive_mask(visible, q.dtype)
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.attention_dropout if self.training else 0.0,
            scale=1.0 / math.sqrt(self.head_dim))
        context = context.transpose(1, 2).reshape(query_states.shape)
        attended = self.attention_norm(self.dropout(self.attention_output(context)) + query_states)
        ffn = self.output(self.activation(self.intermediate(attended)))
        return self.output_norm(self.dropout(ffn) + attended)

    def _heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)


class DecoderStack(nn.Module):
    """``num_layers`` :class:`DecoderLayer` blocks applied in turn with the same mask (and content stream)."""

    def __init__(self, config: PretrainedConfig, num_layers: int = 1):
        super().__init__()
        shape = LayerShape.from_config(config)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(num_layers))

    def forward(self, hidden: Tensor, visible: Tensor | None = None) -> Tensor:
        """Self-attention decoding: every layer attends over its own input."""
        for layer in self.layers:
            hidden = layer(hidden, visible=visible)
        return hidden
