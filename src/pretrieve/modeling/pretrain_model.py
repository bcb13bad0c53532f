"""The pre-training model: one encoder, a weighted set of objectives, one loss.

:class:`PretrainModel` encodes the encoder-masked input once and sums ``wᵢ · lossᵢ`` over the method's
objectives (Drop your Decoder, Ma et al. 2024, eq. 13 is ``mlm + bow`` with weights 1, 1). It knows nothing of files beyond its own
checkpoint layout, nor of the CLI or the trainer; the method arrives as plain data (the ``to_dict()`` of
:class:`pretrieve.train.method.MethodConfig`, or any mapping with an ``objectives`` list of
``{name, weight, params}``), so this module does not import the training package.

Checkpoint layout written by :meth:`PretrainModel.save` (the trainer adds optimizer state beside it and makes
the whole directory atomic)::

    config.json, model.safetensors   the encoder, save_pretrained → loads with AutoModel / AutoModelForMaskedLM
    heads.safetensors                parameters owned by the objectives only (decoder layers)
    method.json                      the resolved method

Extra encoder inputs: some objectives need the encoder to encode more than the encoder-masked input — a
second masked view of the same texts (CPDAE, batch feature ``second_view``), later context spans. A batch
feature registered in :data:`EXTRA_ENCODER_INPUTS` (with :func:`register_extra_encoder_input`: which batch
keys hold its ids, attention mask, optional token types and text types) is encoded *in the same encoder call*
as the main input whenever an objective requires it: the inputs are right-padded to a common length and
concatenated along the batch (one forward, one set of weights in the autograd graph, same dropout stream),
and the result is split back. Objectives then receive a :class:`MultiViewEncoderOutput`: the main input's
encoding as usual (``last_hidden_state``, ``cls``) plus ``views[feature]`` for each extra input, each sliced
back to its own length. With BERT-style attention masks the extra padding does not change the valid
positions' outputs. Per-example ``text_type`` (MoTE routing) is forwarded to :meth:`Encoder.forward`.

Bottleneck: the method's ``bottleneck`` (``cls``, the default, or ``mean``) names the sentence vector the decoder
objectives read (:func:`pretrieve.modeling.objectives.bottleneck`). With ``mean``, :meth:`PretrainModel.encode` sets
``bottleneck`` on every encoding (the main input's and each extra input's, with its own attention mask) to the
attention-masked mean of the last hidden states, computed by
:func:`pretrieve.modeling.pooling.pool` — the very function that mean-pools a fine-tuned dense
retriever, so a mean-pooled model (all-MiniLM-L6-v2) is pre-trained on the vector it retrieves with.

CoT-MoTE: a method with ``mote: true`` gives the encoder query/passage FFN experts
(:func:`pretrieve.modeling.mote.enable_mote`) before training; ``mote_swap: true`` (CoT-MoTE, Ma et al. 2023, Table 4) hands the
encoder swapped text types, so queries train the passage expert and passages the query expert.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from pretrieve.errors import ConfigError
from pretrieve.io_utils import atomic_path, write_json
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.mote import enable_mote
from pretrieve.modeling.objectives import BOTTLENECKS, build_objective
from pretrieve.modeling.pooling import pool

HEADS_FILE = "heads.safetensors"
METHOD_FILE = "method.json"


@dataclass(frozen=True)
class ExtraEncoderInput:
    """The batch keys of one extra text batch the encoder encodes beside the encoder-masked input."""

    input_ids: str
    attention_mask: str
    token_type_ids: str | None = None
    text_type: str | None = None


EXTRA_ENCODER_INPUTS: dict[str, ExtraEncoderInput] = {}
"""Batch feature → its extra encoder input; encoded when an objective requires the feature."""


def register_extra_encoder_input(feature: str, spec: ExtraEncoderInput) -> None:
    """Make batch ``feature`` an extra encoder input (e.g. ``"context"`` spans of a later method)."""
    if feature in EXTRA_ENCODER_INPUTS and EXTRA_ENCODER_INPUTS[feature] != spec:
        raise ValueError(f"batch feature '{feature}' is already an extra encoder input")
    EXTRA_ENCODER_INPUTS[feature] = spec


# CPDAE: the second masked view shares the first view's attention mask (same texts, same lengths).
register_extra_encoder_input("second_view", ExtraEncoderInput("view2_input_ids", "attention_mask",
                                                              token_type_ids="token_type_ids",
                                                              text_type="text_type"))
# CoT-MAE / CoT-MoTE: the context span of each anchor (pretrieve.data.spans), with its own text type.
register_extra_encoder_input("context", ExtraEncoderInput("context_input_ids", "context_attention_mask",
                                                          text_type="context_text_type"))


@dataclass
class MultiViewEncoderOutput(EncoderOutput):
    """The main input's encoding plus ``views[feature]``, the encoding of each extra encoder input, and the pooled
    ``bottleneck`` vector of each (None: the objectives read the [CLS] vector)."""

    views: dict[str, EncoderOutput] = field(default_factory=dict)
    bottleneck: Tensor | None = None


class PretrainModel(nn.Module):
    """Encoder + objectives; ``forward(batch) -> (total_loss, logs)``."""

    def __init__(self, encoder: Encoder, method: Any):
        super().__init__()
        self.method = _method_dict(method)
        if self.method.get("trainer"):
            raise ConfigError(f"method '{self.method.get('name')}' has its own trainer ({self.method['trainer']}): it "
                              "is not trained by PretrainModel")
        self.encoder = encoder
        self.objectives = nn.ModuleDict()
        self.weights: dict[str, float] = {}
        for spec in self.method["objectives"]:
            name, weight, params = _objective_spec(spec)
            if name in self.objectives:
                raise ConfigError(f"objective '{name}' is listed twice")
            self.objectives[name] = build_objective(name, encoder, **params)
            self.weights[name] = weight
        if not self.objectives:
            raise ConfigError("a method needs at least one objective")
        _check_no_shared_parameters(encoder, self.objectives)
        if self.method.get("mote"):  # CoT-MoTE: query/passage FFN experts, both copies of the FFN (CoT-MoTE, Ma et al. 2023, §3.1)
            enable_mote(encoder.model)
        self.swap_experts = bool(self.method.get("mote_swap"))  # Table 4 ablation: queries → P-FFN, passages → Q-FFN
        self.bottleneck = self.method.get("bottleneck", "cls")
        if self.bottleneck not in BOTTLENECKS:
            raise ConfigError(f"method bottleneck must be one of {', '.join(BOTTLENECKS)}, got {self.bottleneck!r}")
        required = self.required_features()
        self.extra_inputs = [feature for feature in EXTRA_ENCODER_INPUTS if feature in required]

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, method: Any, **kwargs: Any) -> "PretrainModel":
        """Start pre-training from an encoder checkpoint (fresh heads)."""
        return cls(Encoder.from_pretrained(name_or_path, **kwargs), method)

    def required_features(self) -> set[str]:
        """The batch features the collator must produce for these objectives."""
        return set().union(*(type(objective).requires for objective in self.objectives.values()))

    def may_leave_parameters_unused(self) -> bool:
        """Whether a step may leave a trainable parameter without gradient (DDP then searches for them).

        Every objective uses all the parameters it owns on every batch, and the encoder's body is used by the
        main input; left unused can be the MLM head (no objective predicts tokens through it, e.g. ``cpdae``
        alone) and the query experts of a MoTE encoder fed passages only (a method with ``mote`` but no
        passage/query ``pairs`` context, which would put both text types in every batch).
        """
        uses_head = any(getattr(objective, "uses_mlm_head", True) for objective in self.objectives.values())
        context = self.method.get("context") or {}
        one_text_type = bool(self.method.get("mote")) and context.get("kind") != "pairs"
        return not uses_head or one_text_type

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Encode the encoder-masked input once, then ``Σ wᵢ · lossᵢ``.

        Logs hold ``loss`` (the weighted total) and ``<key>/<objective>`` for every value an objective logs
        (``loss/mlm``, ``tokens/mlm``, ``loss/bow`` …), as detached 0-d tensors.
        """
        enc = self.encode(batch)
        total: Tensor | None = None
        logs: dict[str, Tensor] = {}
        for name, objective in self.objectives.items():
            out = objective(batch, enc, self.encoder)
            weighted = self.weights[name] * out.loss
            total = weighted if total is None else total + weighted
            for key, value in out.logs.items():
                logs[f"{key}/{name}"] = value.detach() if isinstance(value, Tensor) else torch.tensor(value)
        assert total is not None
        logs["loss"] = total.detach()
        return total, logs

    def encode(self, batch: Mapping[str, Tensor]) -> MultiViewEncoderOutput:
        """The main input's encoding; with extra encoder inputs, all of them in one encoder call."""
        main = (batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"), batch.get("text_type"))
        if not self.extra_inputs:
            out = self.encoder(main[0], main[1], token_type_ids=main[2], text_type=self._routed(main[3]))
            return self._encoding(out.last_hidden_state, main[1])
        parts = [main]
        for feature in self.extra_inputs:
            spec = EXTRA_ENCODER_INPUTS[feature]
            if spec.input_ids not in batch or spec.attention_mask not in batch:
                raise ConfigError(f"the batch lacks '{spec.input_ids}'/'{spec.attention_mask}' of extra encoder "
                                  f"input '{feature}' (the collator builds them when an objective requires it)")
            parts.append((batch[spec.input_ids], batch[spec.attention_mask],
                          batch.get(spec.token_type_ids) if spec.token_type_ids else None,
                          batch.get(spec.text_type) if spec.text_type else None))
        pad_id = int(getattr(self.encoder.config, "pad_token_id", None) or 0)
        ids, attention, token_types, text_types = _concatenate_inputs(parts, pad_id)
        out = self.encoder(ids, attention, token_type_ids=token_types, text_type=self._routed(text_types))
        encodings, start = [], 0
        for part in parts:
            rows, length = part[0].shape
            encodings.append(self._encoding(out.last_hidden_state[start:start + rows, :length], part[1]))
            start += rows
        first = encodings[0]
        first.views = dict(zip(self.extra_inputs, encodings[1:]))
        return first

    def _encoding(self, hidden: Tensor, attention_mask: Tensor) -> MultiViewEncoderOutput:
        """One input's encoding with its [CLS] vector and, under ``bottleneck: mean``, its masked mean."""
        pooled = pool(hidden, attention_mask, "mean") if self.bottleneck == "mean" else None
        return MultiViewEncoderOutput(last_hidden_state=hidden, cls=hidden[:, 0], bottleneck=pooled)

    def _routed(self, text_type: Tensor | None) -> Tensor | None:
        """The text types handed to the encoder: swapped (query ↔ passage) under ``mote_swap``."""
        return 1 - text_type if self.swap_experts and text_type is not None else text_type

    # ------------------------------------------------------------------ persistence
    def head_state_dict(self) -> dict[str, Tensor]:
        """Every parameter and buffer not in the encoder, keyed ``<objective>.<param>``."""
        state: dict[str, Tensor] = {}
        for name, objective in self.objectives.items():
            state.update({f"{name}.{key}": value for key, value in objective.head_state_dict().items()})
        return state

    def save(self, directory: str | Path) -> Path:
        """Write the encoder (save_pretrained), ``heads.safetensors`` and ``method.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(directory)
        heads = {key: value.detach().contiguous().cpu() for key, value in self.head_state_dict().items()}
        with atomic_path(directory / HEADS_FILE) as tmp:
            save_file(heads, str(tmp), metadata={"format": "pt"})
        write_json(directory / METHOD_FILE, self.method)
        return directory

    @classmethod
    def load(cls, directory: str | Path, method: Mapping[str, Any] | None = None, **kwargs: Any) -> "PretrainModel":
        """Restore a model written by :meth:`save` (encoder, heads and method); ``method``: its ``method.json``
        when the caller has already read it (it is not read again)."""
        directory = Path(directory)
        if method is None:
            method_path = directory / METHOD_FILE
            if not method_path.exists():
                raise ConfigError(f"{directory} is not a pre-training checkpoint: {METHOD_FILE} is missing")
            method = json.loads(method_path.read_text(encoding="utf-8"))
        model = cls(Encoder.from_pretrained(directory, **kwargs), method)
        heads_path = directory / HEADS_FILE
        heads = load_file(str(heads_path)) if heads_path.exists() else {}
        model.load_head_state_dict(heads)
        return model

    def load_head_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load the objectives' own parameters; every expected key must be present and no other."""
        expected = set(self.head_state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ConfigError(f"head weights do not match the method: missing {missing}, unexpected {unexpected}")
        for name, objective in self.objectives.items():
            prefix = f"{name}."
            objective.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})


def _concatenate_inputs(parts: list[tuple[Tensor, Tensor, Tensor | None, Tensor | None]],
                        pad_id: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Right-pad ``(ids, attention, token types, text types)`` parts to one length and stack them on the batch.

    Token types missing from some parts are zeros; text types are passed only when every part has them.
    """
    length = max(part[0].shape[1] for part in parts)

    def padded(tensor: Tensor, value: int) -> Tensor:
        return torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]), value=value)

    ids = torch.cat([padded(part[0], pad_id) for part in parts])
    attention = torch.cat([padded(part[1], 0) for part in parts])
    token_types = None
    if any(part[2] is not None for part in parts):
        token_types = torch.cat([padded(part[2] if part[2] is not None else torch.zeros_like(part[0]), 0)
                                 for part in parts])
    text_types = None
    if all(part[3] is not None for part in parts):
        text_types = torch.cat([part[3] for part in parts])
    elif any(part[3] is not None for part in parts):
        raise ConfigError("text_type is given for some encoder inputs but not for the others")
    return ids, attention, token_types, text_types


def _method_dict(method: Any) -> dict[str, Any]:
    """A JSON-able dict from a MethodConfig (``to_dict()``) or a mapping."""
    data = method.to_dict() if hasattr(method, "to_dict") else method
    if not isinstance(data, Mapping) or not isinstance(data.get("objectives"), list):
        raise ConfigError("a method must provide an 'objectives' list of {name, weight, params}")
    return json.loads(json.dumps(dict(data)))


def _objective_spec(spec: Any) -> tuple[str, float, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, 1.0, {}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"an objective must be a name or a mapping with 'name', got {spec!r}")
    weight = float(spec.get("weight", 1.0))
    if not math.isfinite(weight) or weight < 0:
        raise ConfigError(f"objective '{spec['name']}': weight must be a finite number ≥ 0, got {weight}")
    return str(spec["name"]), weight, dict(spec.get("params") or {})


def _check_no_shared_parameters(encoder: Encoder, objectives: nn.ModuleDict) -> None:
    """Objectives must reach shared modules through the ``encoder`` argument, never register them."""
    encoder_params = {id(p) for p in encoder.parameters()}
    for name, objective in objectives.items():
        shared = [key for key, p in objective.named_parameters() if id(p) in encoder_params]
        if shared:
            raise ConfigError(f"objective '{name}' registers encoder parameters {shared}; reach shared modules "
                              "through the encoder argument of forward() instead")
