"""The sentence-transformers architecture as pretrieve runs it (transformer → pooling → Dense* → Normalize), and
the reader of its files (:func:`read_sentence_transformers_config`; the writer is :mod:`pretrieve.modeling.export`).

:class:`DenseEncoder` turns a padded batch of token ids into one vector per text: ``AutoModel``
(``last_hidden_state``) → pooling → optional Dense layers → optional L2 normalisation. It is built from a
checkpoint's ``modules.json`` (or from explicit settings for any other checkpoint) by
:func:`pretrieve.retrieval.load.load_dense_encoder`.

Pooling is :func:`pretrieve.modeling.pooling.pool` (sentence-transformers' padded-batch arithmetic). ``Dense``
modules are ``activation(linear(x))`` with an optional residual, as sentence-transformers' ``Dense``.

The files of a checkpoint (:class:`ModelFiles`: a local directory or a hub repository), read as
sentence-transformers (v2 to v6) does:

* the ``Transformer`` module's folder holds the Hugging Face model and its ``sentence_bert_config.json``
  (``max_seq_length`` caps the tokenizer; ``do_lower_case`` prepends a ``Lowercase`` normaliser unless
  the tokenizer already has one);
* the ``Pooling`` module's ``config.json``: the modern ``pooling_mode`` (one mode or a list,
  concatenated) or the legacy ``pooling_mode_*_tokens`` booleans (concatenated in sentence-transformers'
  order cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken; none set means mean), and
  ``include_prompt``;
* ``Dense`` modules (``nn.Linear`` + activation, optional residual) are loaded with their weights;
  ``Dropout`` is the identity at inference; a ``Normalize`` module (which must come last) sets
  ``normalize=True``; any other module raises :class:`~pretrieve.errors.ConfigError`;
* a ``Router`` (``router_config.json``; sentence-transformers ≥ 5) as the first module: each side reads the chain
  of its route — the task ``"query"`` for queries, ``"document"`` for passages, resolved as sentence-transformers
  does (``route_mappings``, then the route named after the task, then ``default_route``) — followed by the modules
  after the Router (``SentenceTransformersConfig.routed`` tells that the sides may differ);
* ``config_sentence_transformers.json``: ``prompts`` and ``default_prompt_name`` give the query and
  passage prompts, following ``encode_query`` / ``encode_document``'s documented choice among the
  *saved* prompts (query: ``"query"``; passage: the first of ``"document"``, ``"passage"``,
  ``"corpus"``; otherwise the default prompt, as plain ``encode`` would use). Deliberate difference:
  sentence-transformers 6 pre-fills ``{"query": "", "document": ""}`` before reading the saved prompts,
  so its ``encode_document`` never reaches a saved ``"passage"`` prompt (E5-style checkpoints) and its
  ``encode_query``/``encode_document`` ignore ``default_prompt_name``; we use the saved prompts.

When the files give no ``max_seq_length``, the length is :func:`default_max_length`:
``min(tokenizer.model_max_length, config.max_position_embeddings)`` as in sentence-transformers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from huggingface_hub import hf_hub_download
from safetensors.torch import load_file
from tokenizers.normalizers import Lowercase, Sequence as NormalizerSequence
from torch import Tensor, nn
from torch.nn.modules import activation as _ACTIVATIONS

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.pooling import exclude_prompt, parse_pooling, pool

# --------------------------------------------------------------------------------------- dense layers
class DenseLayer(nn.Module):
    """sentence-transformers' ``Dense`` module: ``activation(linear(x))`` (+ optional residual)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: nn.Module | None = None, use_residual: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation if activation is not None else nn.Identity()
        self.use_residual = use_residual
        if use_residual and in_features != out_features:
            self.residual = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


ACTIVATION_MODULES = ("torch.nn.modules.activation", "torch.nn")
"""Where a Dense config's activation may come from: the names sentence-transformers writes (``fullname`` of the
module, e.g. ``torch.nn.modules.activation.Tanh``, ``torch.nn.modules.linear.Identity``) or their ``torch.nn``
spelling; nothing is imported by name."""


def activation_from_name(name: str | None, where: str) -> nn.Module:
    """``torch.nn.modules.activation.Tanh`` → ``nn.Tanh()``: only torch's activation modules (those of
    ``torch.nn.modules.activation`` that take no argument) and ``Identity`` — no module is imported by name."""
    if name is None:
        return nn.Tanh()  # sentence-transformers' default when the key is absent
    module_name, _, class_name = str(name).rpartition(".")
    allowed = (module_name in ACTIVATION_MODULES and class_name in _ACTIVATIONS.__all__) or \
        name in ("torch.nn.modules.linear.Identity", "torch.nn.Identity")
    try:
        if allowed:
            return getattr(nn, class_name)()
    except TypeError:   # an activation that needs arguments (Threshold, MultiheadAttention): not written bare
        pass
    raise ConfigError(f"{where}: activation '{name}' is not one sentence-transformers writes (a torch.nn activation "
                      "without arguments, e.g. torch.nn.modules.activation.Tanh, or torch.nn.modules.linear.Identity)"
                      "; pretrieve runs no other code from a model folder")



# ------------------------------------------------------------------------------------------- encoder
@dataclass
class TokenizedTexts:
    """Unpadded token ids of a list of texts (plus token type ids when the model uses them)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    prompt_length: int | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


class DenseEncoder:
    """Texts → vectors: tokenizer, transformer, pooling, Dense layers, normalisation."""

    def __init__(self, model, tokenizer, pooling: Sequence[str] = ("cls",), normalize: bool = False,
                 max_length: int = 512, dense_layers: Sequence[DenseLayer] = (), include_prompt: bool = True,
                 query_prompt: str | None = None, passage_prompt: str | None = None,
                 name: str = "", sentence_transformers: bool = False):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = parse_pooling(pooling)
        self.normalize = normalize
        self.max_length = int(max_length)
        self.dense_layers = nn.ModuleList(dense_layers).eval()
        self.include_prompt = include_prompt
        self.query_prompt = query_prompt
        self.passage_prompt = passage_prompt
        self.name = name
        self.sentence_transformers = sentence_transformers
        self._prompt_lengths: dict[str, int] = {}

    def to(self, device: str | torch.device) -> "DenseEncoder":
        self.model.to(device)
        self.dense_layers.to(device)
        return self

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        """Dimension of the output vectors."""
        if len(self.dense_layers):
            return self.dense_layers[-1].linear.out_features
        return int(self.model.config.hidden_size) * len(self.pooling)

    def describe(self) -> dict[str, Any]:
        """The settings that determine the vectors (stored in every embeddings ``meta.json``)."""
        return {"model": self.name, "pooling": "+".join(self.pooling), "normalize": self.normalize,
                "max_length": self.max_length, "dim": self.dim, "dense_layers": len(self.dense_layers),
                "query_prompt": self.query_prompt, "passage_prompt": self.passage_prompt,
                "include_prompt": self.include_prompt, "sentence_transformers": self.sentence_transformers,
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", "")}

    # ------------------------------------------------------------------ tokenizing
    def tokenize(self, texts: Sequence[str], max_length: int | None = None,
                 prompt: str | None = None) -> TokenizedTexts:
        """Unpadded token ids, truncated to ``max_length`` (default: the encoder's), prompt prepended."""
        length = max_length or self.max_length
        inputs = [prompt + text for text in texts] if prompt else list(texts)
        encoded = self.tokenizer(inputs, truncation=True, max_length=length, padding=False,
                                 return_attention_mask=False)
        token_types = encoded.get("token_type_ids") if "token_type_ids" in self.tokenizer.model_input_names else None
        prompt_length = self.prompt_length(prompt, length) if prompt and not self.include_prompt else None
        return TokenizedTexts(list(encoded["input_ids"]), list(token_types) if token_types is not None else None,
                              prompt_length)

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

    # ------------------------------------------------------------------ embedding
    def embed_batch(self, batch: dict[str, Tensor], prompt_length: int | None = None) -> Tensor:
        """One padded batch → ``[B, dim]`` vectors (call under ``torch.inference_mode``)."""
        hidden = self.model(**batch, return_dict=True).last_hidden_state
        mask = batch["attention_mask"]
        if prompt_length:
            mask = exclude_prompt(mask, prompt_length)
        vectors = pool(hidden, mask, self.pooling)
        for layer in self.dense_layers:
            vectors = layer(vectors)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], max_length: int | None = None, prompt: str | None = None) -> Tensor:
        """Embed a small list of texts in one padded batch (no sorting, no progress; corpora go through
        :mod:`pretrieve.retrieval.batches`)."""
        tokenized = self.tokenize(texts, max_length=max_length, prompt=prompt)
        features = {"input_ids": tokenized.input_ids}
        if tokenized.token_type_ids is not None:
            features["token_type_ids"] = tokenized.token_type_ids
        batch = self.tokenizer.pad(features, return_tensors="pt")
        return self.embed_batch({key: value.to(self.device) for key, value in batch.items()}, tokenized.prompt_length)


#: sentence-transformers' legacy boolean keys, in the order it concatenates the modes.
LEGACY_POOLING_KEYS: dict[str, str] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}

_PASSAGE_PROMPT_NAMES = ("document", "passage", "corpus")
ROUTER_CONFIG = "router_config.json"
TASKS = {"query": "query", "passage": "document"}
"""pretrieve's text type → sentence-transformers' task (a ``Router``'s route key)."""
_INFERENCE_NO_OPS = {"Dropout"}


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
    max_seq_length: int | None = None
    do_lower_case: bool = False
    pooling: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    dense_layers: list[DenseLayer] = field(default_factory=list)
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity: str | None = None
    routed: bool = False           # the input module is a Router: the query and passage sides may differ
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
        chain = _route(files, chain[0][1], side) + chain[1:]
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
            config.dense_layers.append(_read_dense(files, path))
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
    side_length = config.query_length if side == "query" else config.document_length
    if side_length:   # as encode_query / encode_document truncate
        config.max_seq_length = int(side_length)
    st_config = files.json("config_sentence_transformers.json") or {}
    config.prompts = dict(st_config.get("prompts") or {})
    config.default_prompt_name = st_config.get("default_prompt_name")
    config.similarity = st_config.get("similarity_fn_name")
    return config


def _route(files: ModelFiles, path: str, side: str) -> list[tuple[str, str]]:
    """The modules (type, path) of the ``Router`` at ``path`` that a text of ``side`` goes through: the route of the
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
    return [(str(types.get(module_id, "")), prefix + str(module_id)) for module_id in router["structure"][route]]


def _read_transformer(files: ModelFiles, path: str, config: SentenceTransformersConfig) -> None:
    config.transformer_path = path
    prefix = f"{path}/" if path else ""
    bert_config = files.json(f"{prefix}sentence_bert_config.json") or {}
    config.max_seq_length = bert_config.get("max_seq_length")
    config.do_lower_case = bool(bert_config.get("do_lower_case", False))
    config.query_length = bert_config.get("query_length")
    config.document_length = bert_config.get("document_length")


def _read_pooling(files: ModelFiles, path: str, config: SentenceTransformersConfig) -> None:
    pooling_cfg = files.json(f"{path}/config.json")
    if pooling_cfg is None:
        raise InputError("Pooling module has no config.json", path=f"{files.name}/{path}")
    if "pooling_mode" in pooling_cfg:
        mode = pooling_cfg["pooling_mode"]
        config.pooling = parse_pooling([mode] if isinstance(mode, str) else list(mode))
    else:
        active = [mode for key, mode in LEGACY_POOLING_KEYS.items() if pooling_cfg.get(key, False)]
        config.pooling = tuple(active) or ("mean",)
    config.include_prompt = bool(pooling_cfg.get("include_prompt", True))


def _read_dense(files: ModelFiles, path: str) -> DenseLayer:
    where = f"{files.name}/{path}"
    dense_cfg = files.json(f"{path}/config.json")
    if dense_cfg is None:
        raise InputError("Dense module has no config.json", path=where)
    if dense_cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ConfigError(f"{where}: Dense on '{dense_cfg['module_input_name']}' is not supported")
    layer = DenseLayer(int(dense_cfg["in_features"]), int(dense_cfg["out_features"]),
                       bias=bool(dense_cfg.get("bias", True)),
                       activation=activation_from_name(dense_cfg.get("activation_function"), where),
                       use_residual=bool(dense_cfg.get("use_residual", False)))
    state = _load_weights(files, path)
    missing, unexpected = layer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{where}: Dense weights do not match its config (missing {missing}, "
                          f"unexpected {unexpected})")
    return layer.eval()


def _load_weights(files: ModelFiles, path: str) -> dict[str, Tensor]:
    safetensors_file = files.file(f"{path}/model.safetensors")
    if safetensors_file is not None:
        return load_file(str(safetensors_file))
    bin_file = files.file(f"{path}/pytorch_model.bin")
    if bin_file is not None:
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise InputError("Dense module has neither model.safetensors nor pytorch_model.bin",
                     path=f"{files.name}/{path}")


def add_lowercase(tokenizer) -> None:
    """Prepend a ``Lowercase`` normaliser unless one is there (sentence-transformers' ``do_lower_case``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        if hasattr(tokenizer, "do_lower_case"):
            tokenizer.do_lower_case = True
        return
    normalizer = backend.normalizer
    if isinstance(normalizer, Lowercase) or (isinstance(normalizer, NormalizerSequence)
                                             and any(isinstance(n, Lowercase) for n in normalizer)):
        return
    chain = [Lowercase()]
    if isinstance(normalizer, NormalizerSequence):
        chain += list(normalizer)
    elif normalizer is not None:
        chain.append(normalizer)
    backend.normalizer = NormalizerSequence(chain)


def default_max_length(tokenizer, config) -> int:
    """``min(tokenizer.model_max_length, config.max_position_embeddings)``, as sentence-transformers."""
    limits = [value for value in (getattr(tokenizer, "model_max_length", None),
                                  getattr(config, "max_position_embeddings", None))
              if isinstance(value, int) and 0 < value < 1_000_000]
    return min(limits) if limits else 512
