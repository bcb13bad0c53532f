"""Mixture of Textual Experts (CoT-MoTE (Ma et al. 2023) §3.1, eq. 7–9): one shared self-attention per layer, two
feed-forward experts — Q-FFN for queries, P-FFN for passages — chosen by the text type of each input.

What this module owns:

* **Wrapping** (:func:`enable_mote`). In every transformer layer of a BERT-family body the feed-forward
  sub-modules (BERT/RoBERTa/ELECTRA: ``intermediate`` and ``output``; DistilBERT: ``ffn`` and
  ``output_layer_norm``, :data:`FFN_MODULES`) are replaced by a :class:`RoutedModule` holding a *passage*
  expert (the original module) and a *query* expert (a deep copy), so both start from the original FFN weights
  (§4.1: "Both Q-FFN and P-FFN are initialized from the original FFN weights"). The self-attention, the
  embeddings and the MLM head stay shared. An expert is the whole FFN of eq. 8–9 including its residual
  LayerNorm (``LN(FFN(A) + A)``), which in BERT lives in ``output`` (as VLMo/BEiT-3 give each modality expert
  its own norm). Layers are found generically: any module that has all the family's FFN children.
* **Routing** (:class:`Router`, :func:`mote_routing`). Before a forward the caller sets a per-example text type
  ``[B]`` (0 = query, 1 = passage; :data:`QUERY`, :data:`PASSAGE`). :class:`pretrieve.modeling.Encoder`
  does it from its ``text_type`` argument, so pre-training and the dual encoder's towers route with no other
  change. A batch of one type calls that expert on the whole tensor (the common case: a query batch or a
  passage batch); a mixed batch (pre-training encodes passages and their pseudo-queries in one call) is split
  once per forward into index lists, each expert runs on its rows (``index_select``) and the outputs are put
  back in order with one ``index_select`` by the inverse permutation — no per-token or per-example Python loop.
  ``text_type=None`` routes everything to the passage expert (plain text of the pre-training corpus is
  passages; it is also what the encoder's construction check feeds).
* **Checkpoints.** The passage expert is saved under the *original* parameter names
  (``…layer.0.intermediate.dense.weight``) and the query expert beside it (``…layer.0.intermediate.query.
  dense.weight``), with ``"mote"`` in ``config.json``. So ``AutoModel.from_pretrained`` still loads a working
  BERT — the passage encoder, warning that the ``query`` weights were not used — and
  :func:`restore_mote` (called by :meth:`pretrieve.modeling.Encoder.from_pretrained`) rebuilds both experts.
  State-dict hooks do the renaming, so ``state_dict``/``load_state_dict`` (trainer checkpoints, resume) agree
  with the files.
* **Fixed routes** (:func:`routed_views`): two views of one MoTE model that always route to the query or the
  passage expert, for encoders that do not pass text types (dense retrieval with a plain ``AutoModel`` call).

The Table 4 ablation (experts swapped in pre-training: queries through P-FFN, passages through Q-FFN) is
the method option ``mote_swap`` (:class:`pretrieve.modeling.pretrain_model.PretrainModel` flips the text types
it hands the encoder); fine-tuning always routes queries to Q-FFN (§5.2).
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open
from torch import Tensor, nn

from pretrieve.errors import ConfigError, InputError

QUERY, PASSAGE = 0, 1
EXPERTS = ("query", "passage")
"""Expert names, indexed by text type (the order of ``pretrieve.modeling.dual_encoder.TEXT_TYPES``)."""
CONFIG_KEY = "mote"
FORMAT = 1
DEFAULT_FFN_MODULES = ("intermediate", "output")
FFN_MODULES: dict[str, tuple[str, ...]] = {"distilbert": ("ffn", "output_layer_norm")}
"""Feed-forward child modules of a layer, per ``model_type`` (default: BERT's ``intermediate`` + ``output``)."""


# ------------------------------------------------------------------------------------------------ routing
@dataclass
class RoutePlan:
    """How a batch is routed: ``single`` expert for every row, or per-expert row lists plus the inverse order."""

    single: int | None = PASSAGE
    groups: list[tuple[int, Tensor]] = field(default_factory=list)
    inverse: Tensor | None = None


def route_plan(text_type: Tensor | None) -> RoutePlan:
    """The plan for per-example text types ``[B]`` (0 = query, 1 = passage; None = all passages)."""
    if text_type is None:
        return RoutePlan(single=PASSAGE)
    types = torch.as_tensor(text_type).reshape(-1).long()
    if types.numel() == 0:
        return RoutePlan(single=PASSAGE)
    low, high = int(types.min()), int(types.max())
    if low < QUERY or high > PASSAGE:
        raise ValueError(f"text_type values must be {QUERY} (query) or {PASSAGE} (passage), got {low}..{high}")
    if low == high:
        return RoutePlan(single=low)
    rows = [(expert, torch.nonzero(types == expert).flatten()) for expert in (QUERY, PASSAGE)]
    order = torch.cat([indices for _, indices in rows])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return RoutePlan(single=None, groups=rows, inverse=inverse)


class Router:
    """The routing plan every :class:`RoutedModule` of one model reads (set once per forward)."""

    def __init__(self) -> None:
        self.plan = RoutePlan(single=PASSAGE)

    def set(self, text_type: Tensor | None) -> None:
        self.plan = route_plan(text_type)


class RoutedModule(nn.Module):
    """Two experts with the same signature; each row of the batch goes to the expert its text type names.

    Every positional argument must be a tensor whose first dimension is the batch (BERT's ``intermediate``
    takes ``hidden``, ``output`` takes ``(hidden, residual)``).
    """

    def __init__(self, passage: nn.Module, query: nn.Module, router: Router):
        super().__init__()
        self.passage = passage
        self.query = query
        self._router = router  # plain attribute: shared by the model's routed modules, not a sub-module
        self.register_state_dict_post_hook(_passage_under_original_names)
        self.register_load_state_dict_pre_hook(_passage_from_original_names)

    def expert(self, index: int) -> nn.Module:
        return self.query if index == QUERY else self.passage

    def forward(self, *inputs: Tensor) -> Tensor:
        plan = self._router.plan
        if plan.single is not None:
            return self.expert(plan.single)(*inputs)
        outputs = [self.expert(expert)(*(x.index_select(0, rows) for x in inputs))
                   for expert, rows in plan.groups if rows.numel()]
        return torch.cat(outputs).index_select(0, plan.inverse)


def _passage_under_original_names(module: nn.Module, state: dict, prefix: str, local_metadata: Any) -> None:
    """``<prefix>passage.<name>`` → ``<prefix><name>``: the passage expert keeps the plain model's names."""
    inner = prefix + "passage."
    for key in [k for k in state if k.startswith(inner)]:
        state[prefix + key[len(inner):]] = state.pop(key)


def _passage_from_original_names(module: nn.Module, state: dict, prefix: str, local_metadata: Any, strict: bool,
                                 missing: list, unexpected: list, errors: list) -> None:
    """Inverse of :func:`_passage_under_original_names` when loading a state dict."""
    query = prefix + "query."
    for key in [k for k in state if k.startswith(prefix) and not k.startswith(query)
                and not k.startswith(prefix + "passage.")]:
        state[prefix + "passage." + key[len(prefix):]] = state.pop(key)


# ----------------------------------------------------------------------------------------------- wrapping
def ffn_module_names(model: nn.Module) -> tuple[str, ...]:
    config = getattr(model, "config", None)
    return FFN_MODULES.get(getattr(config, "model_type", ""), DEFAULT_FFN_MODULES)


def transformer_layers(model: nn.Module, names: tuple[str, ...]) -> list[nn.Module]:
    """Every module having all the FFN children ``names`` (the transformer layers), in registration order."""
    layers = []
    for module in model.modules():
        children = dict(module.named_children())
        if all(name in children for name in names):
            layers.append(module)
    return layers


def is_mote(model: nn.Module) -> bool:
    """Whether ``model`` already has query/passage experts."""
    return isinstance(getattr(model, "mote_router", None), Router)


def enable_mote(model: nn.Module) -> nn.Module:
    """Give every layer of ``model`` a query and a passage FFN expert, both copies of its FFN (idempotent).

    Records ``config.mote`` so ``save_pretrained`` writes it to ``config.json``. Returns ``model``.
    """
    if is_mote(model):
        return model
    names = ffn_module_names(model)
    layers = transformer_layers(model, names)
    if not layers:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ConfigError(f"MoTE: no transformer layer with feed-forward modules {names} found in a "
                          f"'{model_type}' model; add its FFN module names to pretrieve.modeling.mote.FFN_MODULES")
    router = Router()
    for layer in layers:
        for name in names:
            original = getattr(layer, name)
            setattr(layer, name, RoutedModule(passage=original, query=copy.deepcopy(original), router=router))
    model.mote_router = router
    if getattr(model, "config", None) is not None:
        model.config.mote = {"format": FORMAT, "experts": list(EXPERTS), "modules": list(names)}
    return model


def routed_modules(model: nn.Module) -> list[tuple[str, RoutedModule]]:
    return [(name, module) for name, module in model.named_modules() if isinstance(module, RoutedModule)]


def expert_parameters(model: nn.Module, expert: str) -> list[nn.Parameter]:
    """The parameters of one expert (``"query"`` or ``"passage"``) across all layers."""
    if expert not in EXPERTS:
        raise ValueError(f"expert must be one of {EXPERTS}, got {expert!r}")
    return [p for _, module in routed_modules(model) for p in getattr(module, expert).parameters()]


@contextlib.contextmanager
def mote_routing(model: nn.Module, text_type: Tensor | None) -> Iterator[None]:
    """Route the forward passes inside the block by ``text_type`` (a no-op for models without experts).

    The plan is kept after the block, so a recomputation in the backward pass of the same batch would see
    it; it is replaced by the next call.
    """
    router = getattr(model, "mote_router", None)
    if isinstance(router, Router):
        router.set(text_type)
    yield


# ---------------------------------------------------------------------------------------------- checkpoints
def mote_config(config: Any) -> dict | None:
    """The ``mote`` entry of a model config (an object or a dict), or None for a plain model."""
    value = config.get(CONFIG_KEY) if isinstance(config, dict) else getattr(config, CONFIG_KEY, None)
    return value if isinstance(value, dict) else None


def is_mote_checkpoint(path: str | Path) -> bool:
    """Whether the local checkpoint directory ``path`` declares query/passage experts in ``config.json``."""
    config = Path(str(path)) / "config.json"
    if not config.is_file():
        return False
    try:
        return mote_config(json.loads(config.read_text(encoding="utf-8"))) is not None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=config, line=exc.lineno) from None


def restore_mote(model: nn.Module, path: str | Path) -> bool:
    """After a plain ``from_pretrained`` of a MoTE checkpoint (passage experts loaded under the original names),
    rebuild the experts and load the query experts from the checkpoint's safetensors. Returns whether the
    checkpoint was a MoTE one (False: nothing done)."""
    config = mote_config(getattr(model, "config", None))
    if config is None:
        return False
    if config.get("format") != FORMAT:
        raise ConfigError(f"{path}: unsupported MoTE format {config.get('format')!r} (expected {FORMAT})")
    had_experts = is_mote(model)
    enable_mote(model)
    if had_experts:
        return True
    prefix = getattr(model, "base_model_prefix", "")
    keys = _query_keys(model)
    tensors = _read_tensors(Path(str(path)), {variant for key in keys for variant in _key_variants(key, prefix)})
    state = model.state_dict()
    missing = []
    with torch.no_grad():
        for key in keys:
            found = next((tensors[k] for k in _key_variants(key, prefix) if k in tensors), None)
            if found is None:
                missing.append(key)
                continue
            state[key].copy_(found.to(dtype=state[key].dtype))
    if missing:
        raise ConfigError(f"{path}: the MoTE checkpoint lacks query-expert weights {missing[:3]}"
                          + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    return True


def _query_keys(model: nn.Module) -> list[str]:
    return [f"{name}.query.{key}" for name, module in routed_modules(model) for key in module.query.state_dict()]


def _key_variants(key: str, prefix: str) -> list[str]:
    """The names a parameter may have in a checkpoint: of the body (``encoder.…``) or the full model
    (``bert.encoder.…``), and with the legacy LayerNorm names ``gamma``/``beta``, which transformers writes back
    when the model was loaded from such a checkpoint (splade-tiny's)."""
    names = [key]
    for modern, legacy in ((".weight", ".gamma"), (".bias", ".beta")):
        if key.endswith(modern):
            names.append(key[:-len(modern)] + legacy)
    variants = list(names)
    if prefix:
        for name in names:
            variants += [f"{prefix}.{name}", name.removeprefix(f"{prefix}.")]
    return variants


def _read_tensors(directory: Path, names: set[str]) -> dict[str, Tensor]:
    """The tensors called ``names`` in a local safetensors checkpoint (single file or sharded)."""
    files = [directory / "model.safetensors"]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        files = [directory / name for name in sorted(set(weight_map.values()))]
    if not all(file.is_file() for file in files):
        raise InputError("a MoTE checkpoint must be a local directory with safetensors weights "
                         "(its query experts are read from the files)", path=directory)
    tensors: dict[str, Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name in names:
                    tensors[name] = handle.get_tensor(name)
    return tensors


# ------------------------------------------------------------------------------------------- fixed routes
class RoutedView(nn.Module):
    """A MoTE model whose every forward is routed to one expert (for callers that pass no text type)."""

    def __init__(self, model: nn.Module, expert: int):
        super().__init__()
        self.model = model
        self.expert = int(expert)

    @property
    def config(self):
        return self.model.config

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.model.mote_router.plan = RoutePlan(single=self.expert)
        return self.model(*args, **kwargs)


def routed_views(model: nn.Module, path: str | Path | None = None) -> tuple[RoutedView, RoutedView]:
    """``(query view, passage view)`` of one set of weights; restores the experts from ``path`` first when
    ``model`` was loaded as a plain model from a MoTE checkpoint."""
    if not is_mote(model):
        if path is None or not restore_mote(model, path):
            raise ConfigError("routed views need a MoTE model (or the path of its MoTE checkpoint)")
    return RoutedView(model, QUERY), RoutedView(model, PASSAGE)
