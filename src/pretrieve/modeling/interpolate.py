"""Weight-space interpolation of a fine-tuned retriever with the checkpoint it started from (WiSE-FT).

Wortsman et al. 2022, "Robust fine-tuning of zero-shot models" (WiSE-FT): the model with weights
``θ(α) = (1 − α)·θ_base + α·θ_finetuned`` keeps much of what fine-tuning gained in-domain and much of what
the base model did well elsewhere; ``α`` is chosen on held-out (dev) queries. ``α = 1`` is the fine-tuned
model, ``α = 0`` the base model's weights inside the fine-tuned model's wrapper (same pooling, normalisation
and maximum lengths).

:func:`interpolate_retriever` copies the fine-tuned retriever's folder (every file: sentence-transformers
modules, ``dual_encoder.json``, tokenizer) and rewrites each ``*.safetensors`` file in it:

* a tensor whose name and shape match a tensor of the base checkpoint is interpolated (floating-point tensors
  only; integer buffers such as ``position_ids`` are kept);
* names are matched after removing a leading model prefix (``bert.``, ``model.``, ``0.auto_model.``), so a
  ``BertForMaskedLM`` base (``bert.encoder…``) matches a fine-tuned ``BertModel`` tower (``encoder…``);
* a tensor the base does not have (a query expert of CoT-MoTE, a learned projection, an MLM head the base
  lacks) keeps its fine-tuned value and is counted;
* separate towers (:data:`~pretrieve.modeling.dual_encoder.TOWER_FOLDERS`) are each interpolated with the base
  checkpoint's weights;
* a CoT-MoTE export (Ma et al. 2023; :mod:`pretrieve.modeling.mote`) holds both experts at its root and one plain
  transformer per side in the same two folders (the side's expert under the original FFN names): the
  query side's copy is interpolated with the base's *query* expert (the base's ``….query.…`` tensors; a base without
  experts has one FFN, which both experts started from), so the side folders stay equal to the root's experts.

A tensor with a matching name but another shape is an error (not the base this model was fine-tuned from).
The output folder is written atomically and holds ``interpolation.json`` (base, fine-tuned, ``α``, counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load_file, save_file

from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.models import resolve_model
from pretrieve.modeling.dual_encoder import tower_folder
from pretrieve.modeling.mote import EXPERTS, is_mote_checkpoint

PREFIXES = ("0.auto_model.", "bert.", "model.")
RECORD = "interpolation.json"


def weight_key(name: str) -> str:
    """``name`` without a leading model prefix (:data:`PREFIXES`), the key used to match tensors."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _base_tensors(base: Path) -> dict[str, torch.Tensor]:
    files = sorted(base.glob("*.safetensors"))
    if not files:
        raise InputError("no *.safetensors weights to interpolate with", path=str(base))
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        for name, tensor in load_file(str(path)).items():
            tensors.setdefault(weight_key(name), tensor)
    return tensors


def query_expert_view(base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``base`` with each FFN tensor replaced by its CoT-MoTE query expert's (``M.query.k`` → ``M.k``, where
    ``M.k`` is a base tensor): the weights a MoTE export's query-side copy is interpolated with."""
    view = dict(base)
    marker = f".{EXPERTS[0]}."
    for name, tensor in base.items():
        module, found, rest = name.rpartition(marker)
        if found and f"{module}.{rest}" in base and tensor.shape == base[f"{module}.{rest}"].shape:
            view[f"{module}.{rest}"] = tensor
    return view


def interpolate_tensors(base: Mapping[str, torch.Tensor], finetuned: Mapping[str, torch.Tensor], alpha: float,
                        where: str) -> tuple[dict[str, torch.Tensor], int, int]:
    """``finetuned`` with every tensor the base also has replaced by ``(1 − α)·base + α·finetuned``.

    Returns the tensors and the numbers of interpolated and kept tensors."""
    out: dict[str, torch.Tensor] = {}
    mixed = kept = 0
    for name, tensor in finetuned.items():
        other = base.get(weight_key(name))
        if other is None or not tensor.is_floating_point():
            out[name] = tensor
            kept += 1
            continue
        if other.shape != tensor.shape:
            raise InputError(f"tensor '{name}' has shape {tuple(tensor.shape)}, the base has {tuple(other.shape)}: "
                             "not the checkpoint this retriever was fine-tuned from", path=where)
        mixed_value = (1.0 - alpha) * other.to(torch.float32) + alpha * tensor.to(torch.float32)
        out[name] = mixed_value.to(tensor.dtype).contiguous()
        mixed += 1
    return out, mixed, kept


def interpolate_retriever(base: str | Path, finetuned: str | Path, alpha: float, out: str | Path) -> Path:
    """Write the WiSE-FT interpolation ``(1 − α)·base + α·finetuned`` of a retriever folder to ``out``."""
    if not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"interpolation weight alpha must be in [0, 1], got {alpha}")
    base_dir = Path(resolve_model(str(base)))
    finetuned_dir = Path(finetuned)
    if not finetuned_dir.is_dir():
        raise InputError("not a retriever folder", path=str(finetuned_dir))
    weight_files = sorted(finetuned_dir.rglob("*.safetensors"))
    if not weight_files:
        raise InputError("no *.safetensors weights to interpolate", path=str(finetuned_dir))
    base_tensors = _base_tensors(base_dir)
    query_side = tower_folder(finetuned_dir, "query")
    mote_query = query_expert_view(base_tensors) if is_mote_checkpoint(finetuned_dir) else None
    counts = {"interpolated": 0, "kept": 0}
    with atomic_dir(out) as tmp:
        for path in sorted(finetuned_dir.rglob("*")):
            target = tmp / path.relative_to(finetuned_dir)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif path.suffix != ".safetensors" and path.name != RECORD:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
        for path in weight_files:
            base_side = mote_query if mote_query is not None and path.parent == query_side else base_tensors
            tensors, mixed, kept = interpolate_tensors(base_side, load_file(str(path)), float(alpha), str(path))
            target = tmp / path.relative_to(finetuned_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(target), metadata={"format": "pt"})
            counts["interpolated"] += mixed
            counts["kept"] += kept
        if counts["interpolated"] == 0:
            raise InputError("no tensor of the retriever matches the base checkpoint by name: not the checkpoint it "
                             "was fine-tuned from", path=str(base_dir))
        write_json(tmp / RECORD, {"base": str(base), "finetuned": str(finetuned_dir), "alpha": float(alpha),
                                  "tensors_interpolated": counts["interpolated"],
                                  "tensors_kept_from_finetuned": counts["kept"]})
    return Path(out)
