"""sentence-transformers models as pretrieve runs them: sentence-transformers' own modules (``Transformer`` →
``Pooling`` → ``Dense``* → ``Normalize``, one route of a ``Router``) behind pretrieve's batch encoder, and the
check of a checkpoint's files before anything of it is loaded (:func:`read_sentence_transformers_config`; the
writer is :mod:`pretrieve.modeling.export`).

:class:`DenseEncoder` turns a padded batch of token ids into one vector per text by running the modules that
``SentenceTransformer(path)`` loaded (:func:`sentence_transformer_modules`), so a model encodes in pretrieve
exactly as in sentence-transformers. A checkpoint without ``modules.json`` gets the same modules built here: a
``Transformer``, the ``Pooling`` the caller names, ``Normalize`` when asked.

What stays pretrieve's own, because sentence-transformers does not do it:

* the batch encoder around the modules (:mod:`pretrieve.retrieval.batches`: length-sorted batches, bf16/fp16
  autocast, int8, progress, the corpus cache), with prompts tokenised by pretrieve (``include_prompt``: the prompt's
  tokens left out of the pooling as sentence-transformers does);
* reading a checkpoint's files *before* loading it (:class:`ModelFiles`, a local directory or a hub repository):
  the module chain must be Transformer → Pooling → Dense* → Normalize? (or a ``Router`` whose routes start one), a
  ``Dense`` activation must be one sentence-transformers writes (a ``torch.nn`` activation without arguments, or
  ``Identity``: :func:`check_activation` — sentence-transformers would fall back to Tanh with a warning) — so a
  bad folder is one :class:`~pretrieve.errors.ConfigError` line and no name from it is imported; the config it reads
  (pooling, normalisation, lengths, prompts) also tells fine-tuning and pre-training what the base model does;
* the route of each side: the task ``"query"`` for queries, ``"document"`` for passages, resolved as
  sentence-transformers does (``route_mappings``, then the route named after the task, then ``default_route``);
* prompts: ``prompts`` and ``default_prompt_name`` of ``config_sentence_transformers.json`` give the query and
  passage prompts, following ``encode_query`` / ``encode_document``'s documented choice among the *saved* prompts
  (query: ``"query"``; passage: the first of ``"document"``, ``"passage"``, ``"corpus"``; otherwise the default
  prompt, as plain ``encode`` would use). Deliberate difference: sentence-transformers 6 pre-fills
  ``{"query": "", "document": ""}`` before reading the saved prompts, so its ``encode_document`` never reaches a
  saved ``"passage"`` prompt (E5-style checkpoints) and its ``encode_query``/``encode_document`` ignore
  ``default_prompt_name``; we use the saved prompts;
* CoT-MoTE's routed views of one set of weights (:meth:`DenseEncoder.with_model`).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from huggingface_hub import hf_hub_download
from torch import Tensor, nn
from torch.nn.modules import activation as _ACTIVATIONS

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.pooling import parse_pooling

ACTIVATION_MODULES = ("torch.nn.modules.activation", "torch.nn")
"""Where a Dense config's activation may come from: the names sentence-transformers writes (``fullname`` of the
module, e.g. ``torch.nn.modules.activation.Tanh``, ``torch.nn.modules.linear.Identity``) or their ``torch.nn``
spelling; nothing is imported by name."""


def check_activation(name: str | None, where: str) -> None:
    """A Dense config's ``activation_function`` is one sentence-transformers writes: a torch activation module that
    takes no argument (of ``torch.nn.modules.activation``) or ``Identity``; else one ConfigError line, before
    sentence-transformers imports anything by that name. None: sentence-transformers' default (Tanh)."""
    if name is None:
        return
    module_name, _, class_name = str(name).rpartition(".")
    allowed = (module_name in ACTIVATION_MODULES and class_name in _ACTIVATIONS.__all__) or \
        name in ("torch.nn.modules.linear.Identity", "torch.nn.Identity")
    try:
        if allowed:
            getattr(nn, class_name)()
            return
    except TypeError:   # an activation that needs arguments (Threshold, MultiheadAttention): not written bare
        pass
    raise ConfigError(f"{where}: activation '{name}' is not one sentence-transformers writes (a torch.nn activation "
                      "without arguments, e.g. torch.nn.modules.activation.Tanh, or torch.nn.modules.linear.Identity)"
                      "; pretrieve runs no other code from a model folder")


# ------------------------------------------------------------------------------------------- encoder
class DenseEncoder:
    """Texts → vectors: the tokenizer and sentence-transformers' modules of one side (Transformer first)."""

    def __init__(self, modules: Sequence[nn.Module], max_length: int, query_prompt: str | None = None,
                 passage_prompt: str | None = None, name: str = "", sentence_transformers: bool = False):
        self.modules = nn.Sequential(*modules).eval()
        self.max_length = int(max_length)
        self.query_prompt = query_prompt
        self.passage_prompt = passage_prompt
        self.name = name
        self.sentence_transformers = sentence_transformers
        self._prompt_lengths: dict[str, int] = {}

    def to(self, device: str | torch.device) -> "DenseEncoder":
        self.modules.to(device)
        return self

    def with_model(self, model: nn.Module) -> "DenseEncoder":
        """This encoder with the transformer's model replaced by ``model`` (a CoT-MoTE routed view); the other
        modules are shared."""
        transformer = copy.copy(self.modules[0])
        transformer._modules = transformer._modules.copy()
        transformer.model = model
        other = copy.copy(self)
        other.modules = nn.Sequential(transformer, *list(self.modules)[1:]).eval()
        return other

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> nn.Module:
        """The Hugging Face model inside the ``Transformer`` module."""
        return self.modules[0].auto_model

    @property
    def tokenizer(self):
        return self.modules[0].tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _of(self, kind: str) -> list[nn.Module]:
        return [module for module in self.modules if type(module).__name__ == kind]

    @property
    def pooling(self) -> tuple[str, ...]:
        mode = self._of("Pooling")[0].pooling_mode
        return parse_pooling([mode] if isinstance(mode, str) else list(mode))

    @property
    def include_prompt(self) -> bool:
        return bool(self._of("Pooling")[0].include_prompt)

    @property
    def normalize(self) -> bool:
        return bool(self._of("Normalize"))

    @property
    def dense_layers(self) -> nn.ModuleList:
        """The ``Dense`` modules after the pooling (quantised with the model at int8)."""
        return nn.ModuleList(self._of("Dense"))

    @property
    def dim(self) -> int:
        """Dimension of the output vectors."""
        dense = self._of("Dense")
        return int(dense[-1].out_features) if dense else int(self.model.config.hidden_size) * len(self.pooling)

    def describe(self) -> dict[str, Any]:
        """The settings that determine the vectors (stored in every embeddings ``meta.json``)."""
        return {"model": self.name, "pooling": "+".join(self.pooling), "normalize": self.normalize,
                "max_length": self.max_length, "dim": self.dim, "dense_layers": len(self.dense_layers),
                "query_prompt": self.query_prompt, "passage_prompt": self.passage_prompt,
                "include_prompt": self.include_prompt, "sentence_transformers": self.sentence_transformers,
                "lowercase": bool(getattr(self.modules[0], "do_lower_case", False)),
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", "")}

    # ------------------------------------------------------------------ tokens and vectors
    def prompt_length(self, prompt: str, max_length: int) -> int:
        """Tokens of the prompt alone, without a trailing special token (sentence-transformers' rule)."""
        key = f"{max_length}\0{prompt}"
        if key not in self._prompt_lengths:
            ids = self.tokenizer([prompt], truncation=True, max_length=max_length)["input_ids"][0]
            length = len(ids)
            if ids and ids[-1] in set(self.tokenizer.all_special_ids):
                length -= 1
            self._prompt_lengths[key] = length
        return self._prompt_lengths[key]

    def embed_batch(self, batch: dict[str, Tensor], prompt_length: int | None = None) -> Tensor:
        """One padded batch → ``[B, dim]`` vectors through the modules (call under ``torch.inference_mode``)."""
        features = dict(batch)
        if prompt_length:
            features["prompt_length"] = prompt_length   # Pooling leaves the prompt out (include_prompt false)
        return self.modules(features)["sentence_embedding"]

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], prompt: str | None = None) -> Tensor:
        """Embed a small list of texts in one padded batch at the encoder's length (corpora go through
        :mod:`pretrieve.retrieval.batches`)."""
        batch = self.tokenizer([prompt + text for text in texts] if prompt else list(texts), padding=True,
                               truncation=True, max_length=self.max_length, return_tensors="pt")
        features = {key: value.to(self.device) for key, value in batch.items()
                    if key in ("input_ids", "attention_mask", "token_type_ids")}
        return self.embed_batch(features, self.prompt_length(prompt, self.max_length)
                                if prompt and not self.include_prompt else None)


_PASSAGE_PROMPT_NAMES = ("document", "passage", "corpus")
ROUTER_CONFIG = "router_config.json"
TASKS = {"query": "query", "passage": "document"}
"""pretrieve's text type → sentence-transformers' task (a ``Router``'s route key)."""
_INFERENCE_NO_OPS = {"Dropout"}
TOWER_FILES = ("config.json", "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json",
               "merges.txt", "spiece.model", "sentencepiece.bpe.model")
"""The files of a transformer folder that its vectors depend on (weights, config, tokenizer), by name pattern: a
retriever's passage tower is identified by these (:func:`tower_files`), so that a tower kept frozen and copied byte
for byte (query-side fine-tuning, :mod:`pretrieve.train.query_side`) reuses the corpus vectors of the model it was
copied from. ``sentence_bert_config.json`` is not among them: the length and lower-casing it sets are settings of
the side (:meth:`DenseEncoder.describe`)."""


def tower_files(folder: str | Path) -> tuple[str, ...]:
    """The names of the :data:`TOWER_FILES` in ``folder`` (top level, sorted)."""
    folder = Path(folder)
    if not folder.is_dir():
        return ()
    return tuple(sorted({file.name for pattern in TOWER_FILES for file in folder.glob(pattern) if file.is_file()}))


# ------------------------------------------------------------------------------------- files / configs
class ModelFiles:
    """Files of a checkpoint: a local directory, or a hub repository fetched on demand."""

    def __init__(self, name_or_path: str | Path):
        self.name = str(name_or_path)
        self.local = Path(self.name).is_dir()
        if not self.local and _looks_like_path(self.name):
            raise InputError("model directory not found", path=self.name)

    def model_location(self, subfolder: str = "") -> tuple[str, dict[str, Any]]:
        """Argument and keyword arguments for ``from_pretrained`` of the model in ``subfolder``."""
        if self.local:
            return str(Path(self.name) / subfolder), {}
        return self.name, ({"subfolder": subfolder} if subfolder else {})

    def file(self, relative: str) -> Path | None:
        """Local path of ``relative`` inside the checkpoint, or None when it does not exist."""
        if self.local:
            path = Path(self.name) / relative
            return path if path.is_file() else None
        try:
            return Path(hf_hub_download(self.name, relative))
        except Exception:  # noqa: BLE001 - missing entry, unknown repo or offline: all mean "not available"
            return None

    def json(self, relative: str) -> dict | list | None:
        path = self.file(relative)
        if path is None:
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None


def _looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``owner/name``; anything else names a local path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name \
        or Path(name).exists()


@dataclass
class SentenceTransformersConfig:
    """What a sentence-transformers ``modules.json`` chain says about encoding."""

    transformer_path: str = ""
    pooling: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    dense: int = 0                 # Dense modules after the pooling (checked here, loaded by sentence-transformers)
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity: str | None = None
    routed: bool = False           # the input module is a Router: the query and passage sides may differ
    route: str | None = None       # the Router's route of the side read
    query_length: int | None = None      # sentence-transformers' per-task truncation (encode_query)
    document_length: int | None = None   # (encode_document)

    @property
    def query_prompt(self) -> str | None:
        if "query" in self.prompts:
            return self.prompts["query"] or None
        return self._default_prompt()

    @property
    def passage_prompt(self) -> str | None:
        for name in _PASSAGE_PROMPT_NAMES:
            if name in self.prompts:
                return self.prompts[name] or None
        return self._default_prompt()

    def _default_prompt(self) -> str | None:
        if self.default_prompt_name is None:
            return None
        return self.prompts.get(self.default_prompt_name) or None


def read_sentence_transformers_config(files: ModelFiles, side: str = "passage") -> SentenceTransformersConfig | None:
    """Parse ``modules.json`` and the module configs for ``side`` (``"query"`` or ``"passage"``: the route a
    ``Router`` takes for the task ``"query"`` / ``"document"``), or None when the checkpoint has no
    ``modules.json``."""
    modules = files.json("modules.json")
    if modules is None:
        return None
    where = f"{files.name}/modules.json"
    if not isinstance(modules, list) or not modules:
        raise InputError("expected a non-empty list of modules", path=where)
    chain = [(str(entry.get("type", "")), str(entry.get("path", "")))
             for entry in sorted(modules, key=lambda m: m.get("idx", 0))]
    config = SentenceTransformersConfig()
    if chain[0][0].rpartition(".")[2] in ("Router", "Asym"):
        config.routed = True
        config.route, routed = _route(files, chain[0][1], side)
        chain = routed + chain[1:]
    seen_transformer = seen_pooling = False
    for position, (module_type, path) in enumerate(chain):
        kind = module_type.rpartition(".")[2]
        if config.normalize:
            raise ConfigError(f"{where}: module '{kind}' after Normalize is not supported")
        if kind == "Transformer" and position == 0:
            seen_transformer = True
            _read_transformer(files, path, config)
        elif kind == "Pooling" and seen_transformer and not seen_pooling:
            seen_pooling = True
            _read_pooling(files, path, config)
        elif kind == "Dense" and seen_pooling:
            _check_dense(files, path)
            config.dense += 1
        elif kind == "Normalize" and seen_pooling:
            normalize_cfg = files.json(f"{path}/config.json") if path else None
            target = (normalize_cfg or {}).get("module_input_name", "sentence_embedding")
            if target != "sentence_embedding":
                raise ConfigError(f"{where}: Normalize of '{target}' (token-level models) is not supported")
            config.normalize = True
        elif kind in _INFERENCE_NO_OPS and seen_pooling:
            continue
        else:
            raise ConfigError(f"{where}: module {position} of type '{module_type}' is not supported here "
                              "(supported chain: Transformer → Pooling → Dense* → Normalize?, or a Router whose "
                              "routes start one)")
    if not seen_pooling:
        raise ConfigError(f"{where}: no Pooling module after the Transformer; cannot make one vector per text")
    st_config = files.json("config_sentence_transformers.json") or {}
    config.prompts = dict(st_config.get("prompts") or {})
    config.default_prompt_name = st_config.get("default_prompt_name")
    config.similarity = st_config.get("similarity_fn_name")
    return config


def _route(files: ModelFiles, path: str, side: str) -> tuple[str, list[tuple[str, str]]]:
    """The route and its modules (type, path) of the ``Router`` at ``path`` that a text of ``side`` goes through: the route of the
    task (``query`` / ``document``) for text as sentence-transformers resolves it (``route_mappings``, then the
    route named after the task, then one named ``text``, then ``default_route``)."""
    where = f"{files.name}/{path + '/' if path else ''}{ROUTER_CONFIG}"
    router = files.json(f"{path}/{ROUTER_CONFIG}" if path else ROUTER_CONFIG)
    if not isinstance(router, dict) or not isinstance(router.get("structure"), dict):
        raise InputError("a Router module needs a router_config.json with 'types' and 'structure'", path=where)
    task = TASKS[side]
    parameters = router.get("parameters") or {}
    mappings = {str(key).replace(" ", ""): value for key, value in (parameters.get("route_mappings") or {}).items()}
    route = (mappings.get(f"('{task}','text')") or mappings.get(f"('{task}',None)") or mappings.get("(None,'text')")
             or mappings.get("(None,None)") or next((key for key in (task, "text") if key in router["structure"]), None)
             or parameters.get("default_route"))
    if route not in router["structure"]:
        raise ConfigError(f"{where}: no route for the task '{task}' (routes: {', '.join(router['structure'])})")
    types = router.get("types") or {}
    prefix = f"{path}/" if path else ""
    return route, [(str(types.get(module_id, "")), prefix + str(module_id)) for module_id in router["structure"][route]]


def _read_transformer(files: ModelFiles, path: str, config: SentenceTransformersConfig) -> None:
    config.transformer_path = path
    prefix = f"{path}/" if path else ""
    bert_config = files.json(f"{prefix}sentence_bert_config.json") or {}
    config.query_length = bert_config.get("query_length")
    config.document_length = bert_config.get("document_length")


def _read_pooling(files: ModelFiles, path: str, config: SentenceTransformersConfig) -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling  # lazy: sentence_transformers

    if files.json(f"{path}/config.json") is None:   # also: invalid JSON is one line naming the file
        raise InputError("Pooling module has no config.json", path=f"{files.name}/{path}")
    pooling_cfg = Pooling.load_config(files.name, subfolder=path)   # legacy pooling_mode_* booleans converted
    mode = pooling_cfg.get("pooling_mode", "mean")
    config.pooling = parse_pooling([mode] if isinstance(mode, str) else list(mode))
    config.include_prompt = bool(pooling_cfg.get("include_prompt", True))


def _check_dense(files: ModelFiles, path: str) -> None:
    where = f"{files.name}/{path}"
    dense_cfg = files.json(f"{path}/config.json")
    if dense_cfg is None:
        raise InputError("Dense module has no config.json", path=where)
    if dense_cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ConfigError(f"{where}: Dense on '{dense_cfg['module_input_name']}' is not supported")
    check_activation(dense_cfg.get("activation_function"), where)


def sentence_transformer_modules(files: ModelFiles, config: SentenceTransformersConfig | None, side: str = "passage",
                                 transformer_path: str | None = None, pooling: Sequence[str] | None = None,
                                 normalize: bool | None = None) -> list[nn.Module]:
    """sentence-transformers' modules of ``side`` (the checkpoint's ``config``, checked by
    :func:`read_sentence_transformers_config`, loaded by ``SentenceTransformer``; a ``Router``'s route of the side
    followed by the modules after it), or for a checkpoint without ``modules.json`` (``config`` None) a
    ``Transformer`` + ``Pooling`` (``cls`` by default). ``pooling`` / ``normalize`` replace the checkpoint's;
    ``transformer_path`` loads the transformer from that subfolder instead (``""``: the root, where a CoT-MoTE
    export keeps its MoTE checkpoint)."""
    from sentence_transformers import SentenceTransformer  # lazy: sentence_transformers
    from sentence_transformers.base.modules import Normalize, Transformer  # lazy: sentence_transformers
    from sentence_transformers.sentence_transformer.modules import Pooling  # lazy: sentence_transformers

    def transformer(subfolder: str, **settings: Any) -> nn.Module:
        location, extra = files.model_location(subfolder)
        kwargs = {**extra, "trust_remote_code": False}   # never asks, never runs a folder's code
        return Transformer(location, model_kwargs=kwargs, processor_kwargs=kwargs, config_kwargs=kwargs, **settings)

    if config is None:
        modules: list[nn.Module] = [transformer("")]
    else:
        loaded = list(SentenceTransformer(files.name, device="cpu", trust_remote_code=False))
        modules = list(loaded[0].sub_modules[config.route]) + loaded[1:] if config.routed else loaded
    if transformer_path is not None and (config is None or transformer_path != config.transformer_path):
        modules[0] = transformer(transformer_path, max_seq_length=modules[0].max_seq_length)
    hidden = int(modules[0].auto_model.config.hidden_size)
    if pooling or config is None:
        chosen = tuple(pooling) if pooling else ("cls",)
        at = next((i for i, m in enumerate(modules) if type(m).__name__ == "Pooling"), len(modules))
        modules[at:at + 1] = [Pooling(hidden, pooling_mode=chosen[0] if len(chosen) == 1 else chosen)]
    if normalize is not None:
        modules = [m for m in modules if type(m).__name__ != "Normalize"] + ([Normalize()] if normalize else [])
    dense = [m for m in modules if type(m).__name__ == "Dense"]
    modes = next(m for m in modules if type(m).__name__ == "Pooling").pooling_mode
    pooled = hidden * (1 if isinstance(modes, str) else len(modes))
    if dense and dense[0].in_features != pooled:
        raise ConfigError(f"pooling gives {pooled}-d vectors but the checkpoint's Dense layer expects "
                          f"{dense[0].in_features}")
    return modules
