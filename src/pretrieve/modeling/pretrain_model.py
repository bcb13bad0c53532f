"""The pre-training model: one encoder, a weighted set of objectives, one loss.

:class:`PretrainModel` encodes the encoder-masked input once and sums ``wᵢ · lossᵢ`` over the method's
objectives (paper 000 eq. 13 is ``mlm + bow`` with weights 1, 1). It knows nothing of files beyond its own
checkpoint layout, nor of the CLI or the trainer; the method arrives as plain data (the ``to_dict()`` of
:class:`pretrieve.train.method.MethodConfig`, or any mapping with an ``objectives`` list of
``{name, weight, params}``), so this module does not import the training package.

Checkpoint layout written by :meth:`PretrainModel.save` (the trainer adds optimizer state beside it and makes
the whole directory atomic)::

    config.json, model.safetensors   the encoder, save_pretrained → loads with AutoModel / AutoModelForMaskedLM
    heads.safetensors                parameters owned by the objectives only (decoder layers)
    method.json                      the resolved method

Extension points for later objectives: a second masked view (CPDAE) is encoded by the objective itself with
``encoder(batch["view2_input_ids"], ...)`` — the encoder is passed to every objective; a context span
(CoT-MAE) likewise arrives as extra batch keys; per-example ``text_type`` (MoTE routing) is forwarded from
the batch to :meth:`Encoder.forward` here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from pretrieve.errors import ConfigError
from pretrieve.io_utils import atomic_path, write_json
from pretrieve.modeling.encoder import Encoder
from pretrieve.modeling.objectives import Objective, build_objective

HEADS_FILE = "heads.safetensors"
METHOD_FILE = "method.json"


class PretrainModel(nn.Module):
    """Encoder + objectives; ``forward(batch) -> (total_loss, logs)``."""

    def __init__(self, encoder: Encoder, method: Any):
        super().__init__()
        self.method = _method_dict(method)
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

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, method: Any, **kwargs: Any) -> "PretrainModel":
        """Start pre-training from an encoder checkpoint (fresh heads)."""
        return cls(Encoder.from_pretrained(name_or_path, **kwargs), method)

    def required_features(self) -> set[str]:
        """The batch features the collator must produce for these objectives."""
        return set().union(*(type(objective).requires for objective in self.objectives.values()))

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Encode the encoder-masked input once, then ``Σ wᵢ · lossᵢ``.

        Logs hold ``loss`` (the weighted total) and ``<key>/<objective>`` for every value an objective logs
        (``loss/mlm``, ``tokens/mlm``, ``loss/bow`` …), as detached 0-d tensors.
        """
        enc = self.encoder(batch["input_ids"], batch["attention_mask"],
                           token_type_ids=batch.get("token_type_ids"), text_type=batch.get("text_type"))
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
    def load(cls, directory: str | Path, **kwargs: Any) -> "PretrainModel":
        """Restore a model written by :meth:`save` (encoder, heads and method)."""
        directory = Path(directory)
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
