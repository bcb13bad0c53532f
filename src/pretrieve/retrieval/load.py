"""The one loader of retrievers: ``load_retriever(path_or_name)`` → the model(s), its representation kind, and
the two *sides* (query, passage) that the batch encoder runs.

It reads a model's configuration once, here and nowhere else:

* ``dual_encoder.json`` — a retriever fine-tuned by pretrieve (:mod:`pretrieve.modeling.dual_encoder`): its
  representation kind (``dense``, ``dupmae`` = DupMAE's [CLS] + ordinary-token vectors, ``sparse``, ``hybrid``),
  whether the towers are tied, and the query/passage lengths it was trained with;
* the sentence-transformers files (``modules.json`` and the module folders) of dense models, read exactly as
  sentence-transformers (v2 to v6) reads them (below).

A **dense** retriever is run by :class:`~pretrieve.modeling.sentence_transformer.DenseEncoder` (transformer →
pooling → Dense* → Normalize): one encoder for both sides, or the ``query/`` and ``passage/`` towers of a
fine-tuned model with separate towers, or — for a CoT-MoTE checkpoint — two views of one model routed to its
query and passage FFN experts. Any checkpoint without ``modules.json`` (``bert-base-uncased``, a pre-trained
pretrieve encoder) uses the pooling the caller names (``cls`` by default, the papers' choice) and no
normalisation; explicit arguments override what a checkpoint says. The **other kinds** are run by
:class:`~pretrieve.modeling.dual_encoder.DualEncoder` (``encode(text_type, …)``), whose representation rows are
turned into search parts by the kind's back-end (:mod:`pretrieve.retrieval.index`).

sentence-transformers files, read as sentence-transformers does:

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
* ``config_sentence_transformers.json``: ``prompts`` and ``default_prompt_name`` give the query and
  passage prompts, following ``encode_query`` / ``encode_document``'s documented choice among the
  *saved* prompts (query: ``"query"``; passage: the first of ``"document"``, ``"passage"``,
  ``"corpus"``; otherwise the default prompt, as plain ``encode`` would use). Deliberate difference:
  sentence-transformers 6 pre-fills ``{"query": "", "document": ""}`` before reading the saved prompts,
  so its ``encode_document`` never reaches a saved ``"passage"`` prompt (E5-style checkpoints) and its
  ``encode_query``/``encode_document`` ignore ``default_prompt_name``; we use the saved prompts.

When no ``max_seq_length`` is given, the length is ``min(tokenizer.model_max_length,
config.max_position_embeddings)`` as in sentence-transformers. A fine-tuned model's query length defaults to the
one it was trained with (``dual_encoder.json``), its passage length to its ``max_seq_length`` (dense) or the
trained passage length (other kinds; 144 / 32 when not recorded).

**Precision** is chosen at load time (:func:`pretrieve.retrieval.batches.resolve_precision`; ``auto`` by
default): ``int8`` quantises the models' linear layers here; ``bf16`` / ``fp16`` run under autocast in the batch
encoder. The resolved precision is part of every index's settings, so vectors of another precision are never
taken from a cache.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.sentence_transformer import (DenseEncoder, DenseLayer, activation_from_name,
                                                     parse_pooling)
from pretrieve.retrieval.batches import quantize_int8, resolve_precision
from pretrieve.retrieval.index import BACKENDS, backend

logger = logging.getLogger(__name__)

KINDS = tuple(BACKENDS)
"""Representation kinds with a search back-end (:data:`pretrieve.retrieval.index.BACKENDS`)."""
DUAL_ENCODER_CONFIG = "dual_encoder.json"
DEFAULT_PASSAGE_LENGTH, DEFAULT_QUERY_LENGTH = 144, 32
"""Lengths of a fine-tuned non-dense model whose ``dual_encoder.json`` records none (the fine-tuning defaults)."""

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
            from huggingface_hub import hf_hub_download

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


def read_sentence_transformers_config(files: ModelFiles) -> SentenceTransformersConfig | None:
    """Parse ``modules.json`` and the module configs, or None when the checkpoint has no ``modules.json``."""
    modules = files.json("modules.json")
    if modules is None:
        return None
    where = f"{files.name}/modules.json"
    if not isinstance(modules, list) or not modules:
        raise InputError("expected a non-empty list of modules", path=where)
    config = SentenceTransformersConfig()
    seen_transformer = seen_pooling = False
    for position, entry in enumerate(sorted(modules, key=lambda m: m.get("idx", 0))):
        kind = str(entry.get("type", "")).rpartition(".")[2]
        path = str(entry.get("path", ""))
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
            raise ConfigError(f"{where}: module {position} of type '{entry.get('type')}' is not supported here "
                              "(supported chain: Transformer → Pooling → Dense* → Normalize?)")
    if not seen_pooling:
        raise ConfigError(f"{where}: no Pooling module after the Transformer; cannot make one vector per text")
    st_config = files.json("config_sentence_transformers.json") or {}
    config.prompts = dict(st_config.get("prompts") or {})
    config.default_prompt_name = st_config.get("default_prompt_name")
    config.similarity = st_config.get("similarity_fn_name")
    return config


def _read_transformer(files: ModelFiles, path: str, config: SentenceTransformersConfig) -> None:
    config.transformer_path = path
    prefix = f"{path}/" if path else ""
    bert_config = files.json(f"{prefix}sentence_bert_config.json") or {}
    config.max_seq_length = bert_config.get("max_seq_length")
    config.do_lower_case = bool(bert_config.get("do_lower_case", False))


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
        from safetensors.torch import load_file

        return load_file(str(safetensors_file))
    bin_file = files.file(f"{path}/pytorch_model.bin")
    if bin_file is not None:
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise InputError("Dense module has neither model.safetensors nor pytorch_model.bin",
                     path=f"{files.name}/{path}")


def add_lowercase(tokenizer) -> None:
    """Prepend a ``Lowercase`` normaliser unless one is there (sentence-transformers' ``do_lower_case``)."""
    from tokenizers.normalizers import Lowercase, Sequence as NormalizerSequence

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


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/None → CUDA when available, else CPU."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# ------------------------------------------------------------------------------------------ dense encoders
def load_dense_encoder(name_or_path: str | Path, pooling: str | Sequence[str] | None = None,
                       normalize: bool | None = None, max_length: int | None = None,
                       device: str | torch.device = "cpu") -> DenseEncoder:
    """A :class:`DenseEncoder` of a checkpoint; sentence-transformers settings are read, explicit arguments
    override them."""
    from transformers import AutoModel, AutoTokenizer

    from pretrieve.models import resolve_model

    name_or_path = resolve_model(name_or_path)
    files = ModelFiles(name_or_path)
    st = read_sentence_transformers_config(files)
    location, extra = files.model_location(st.transformer_path if st else "")
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **extra)
        model = AutoModel.from_pretrained(location, **extra)
    except OSError as exc:
        raise InputError(f"cannot load model: {exc}", path=str(name_or_path)) from None
    if st is not None and st.do_lower_case:
        add_lowercase(tokenizer)
    length = max_length or (st.max_seq_length if st else None) or default_max_length(tokenizer, model.config)
    chosen_pooling = parse_pooling(pooling) if pooling else (st.pooling if st else ("cls",))
    chosen_normalize = normalize if normalize is not None else (st.normalize if st else False)
    if st is not None and st.similarity == "cosine" and not chosen_normalize:
        logger.warning("%s is scored by cosine similarity but embeddings are not normalised; inner-product "
                       "search will differ from cosine (pass normalize=True)", name_or_path)
    encoder = DenseEncoder(model, tokenizer, pooling=chosen_pooling, normalize=chosen_normalize, max_length=length,
                           dense_layers=st.dense_layers if st else (), include_prompt=st.include_prompt if st else True,
                           query_prompt=st.query_prompt if st else None,
                           passage_prompt=st.passage_prompt if st else None,
                           name=str(name_or_path), sentence_transformers=st is not None)
    pooled_dim = int(model.config.hidden_size) * len(chosen_pooling)
    if len(encoder.dense_layers) and encoder.dense_layers[0].linear.in_features != pooled_dim:
        raise ConfigError(f"pooling {'+'.join(chosen_pooling)} gives {pooled_dim}-d vectors but the checkpoint's "
                          f"Dense layer expects {encoder.dense_layers[0].linear.in_features}")
    return encoder.to(resolve_device(device))


# --------------------------------------------------------------------------------------- retriever configs
def read_retriever_config(path: str | Path) -> dict[str, Any] | None:
    """The ``dual_encoder.json`` of a retriever fine-tuned by pretrieve (None for any other model): the one
    reader of that file."""
    from pretrieve.modeling.dual_encoder import read_dual_encoder_config

    if not (Path(str(path)) / DUAL_ENCODER_CONFIG).is_file():
        return None
    return read_dual_encoder_config(path)


def retriever_kind(path: str | Path, config: Mapping[str, Any] | None = None) -> str:
    """The representation kind of a model without loading it: ``dense`` unless its ``dual_encoder.json`` (read
    here unless given as ``config``) says otherwise."""
    config = read_retriever_config(path) if config is None else config
    kind = str(((config or {}).get("representation") or {}).get("type", "dense"))
    if kind not in KINDS:
        raise ConfigError(f"{path}: representation '{kind}' has no search back-end (known: {', '.join(KINDS)})")
    return kind


def model_fingerprint(name_or_path: str | Path) -> str:
    """Sizes and modification times of a local checkpoint's weight files (the name for hub models)."""
    root = Path(str(name_or_path))
    if not root.is_dir():
        return str(name_or_path)
    weights = sorted(p for p in root.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file())
    signature = [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in weights]
    return hashlib.sha1(json.dumps(signature).encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------------------ sides
@dataclass
class Side:
    """One side (queries or passages) of a retriever, as the batch encoder runs it: tokenizer, length, prompt,
    and ``forward(padded batch) → outputs`` (part name → float32 rows or CSR rows)."""

    text_type: str
    tokenizer: Any
    max_length: int
    forward: Callable[[dict[str, Tensor]], dict[str, Any]]
    empty: Callable[[], dict[str, Any]]
    device: torch.device
    precision: str
    settings: dict[str, Any]
    prompt: str | None = None

    def empty_outputs(self) -> dict[str, Any]:
        return self.empty()


@dataclass
class Retriever:
    """A loaded retriever: its kind, its query and passage sides and what its outputs depend on."""

    name: str
    kind: str
    query: Side
    passage: Side
    precision: str
    path: Path | None = None
    config: dict[str, Any] | None = None
    representation: Any = None
    query_encoder: DenseEncoder | None = None
    passage_encoder: DenseEncoder | None = None
    model: Any = None

    def settings(self) -> dict[str, Any]:
        """What the passage outputs depend on besides the model's files (recorded with every corpus index)."""
        return {"model": self.model_name, "kind": self.kind, "precision": self.precision,
                "passage": self.passage.settings}

    def inputs(self) -> dict[str, Path]:
        """Inputs fingerprinted by content for the freshness contract: the model directory when it is local."""
        return {"model": self.path} if self.path is not None else {}

    @property
    def model_name(self) -> str:
        """The model as recorded in settings: the hub name, or ``local`` (a local model is an input)."""
        return "local" if self.path is not None else self.name


def dense_side(encoder: DenseEncoder, text_type: str, max_length: int, precision: str) -> Side:
    prompt = encoder.query_prompt if text_type == "query" else encoder.passage_prompt
    prompt_length = encoder.prompt_length(prompt, max_length) if prompt and not encoder.include_prompt else None

    def forward(batch: dict[str, Tensor]) -> dict[str, Any]:
        return {"embeddings": encoder.embed_batch(batch, prompt_length).float().cpu().numpy()}

    def empty() -> dict[str, Any]:
        import numpy as np

        return {"embeddings": np.zeros((0, encoder.dim), np.float32)}

    settings = {key: value for key, value in encoder.describe().items()
                if key not in ("model", "query_prompt", "passage_prompt")}
    settings.update(max_length=int(max_length), prompt=prompt)
    return Side(text_type, encoder.tokenizer, int(max_length), forward, empty, encoder.device, precision, settings,
                prompt)


def dual_encoder_side(model, tokenizer, backend, text_type: str, max_length: int, precision: str,
                      device: torch.device) -> Side:
    representation = model.representation
    vocab = int(model.query_tower.config.vocab_size)

    def forward(batch: dict[str, Tensor]) -> dict[str, Any]:
        rep = model.encode(text_type, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        return backend.outputs(representation, rep, text_type)

    def empty() -> dict[str, Any]:
        try:
            return backend.empty_outputs(representation, vocab, text_type)
        except TypeError:
            return backend.empty_outputs(representation, vocab)

    settings = {"representation": representation.config(), "max_length": int(max_length), "tied": model.tied}
    return Side(text_type, tokenizer, int(max_length), forward, empty, device, precision, settings)


# ------------------------------------------------------------------------------------------------ loading
def load_retriever(name_or_path: str | Path, device: str | torch.device = "auto", precision: str = "auto",
                   max_length: int | None = None, query_max_length: int | None = None,
                   pooling: str | Sequence[str] | None = None, normalize: bool | None = None) -> Retriever:
    """Load any retriever — a sentence-transformers or Hugging Face checkpoint (path, hub name or offline alias)
    or a model fine-tuned by pretrieve — with its query and passage sides (see the module docstring).

    ``max_length`` / ``query_max_length`` override the passage / query lengths; ``pooling`` / ``normalize`` apply
    to plain dense checkpoints only (a fine-tuned retriever's representation is saved with it).
    """
    from pretrieve.models import resolve_model

    resolved = resolve_model(name_or_path)
    path = Path(resolved) if Path(resolved).is_dir() else None
    config = read_retriever_config(path) if path is not None else None
    kind = retriever_kind(resolved, config or {})
    if config is not None and (pooling is not None or normalize is not None):
        raise ConfigError("--pooling/--normalize do not apply to a retriever fine-tuned by pretrieve (its "
                          "representation is saved with it)")
    torch_device = resolve_device(device)
    chosen = resolve_precision(precision, torch_device)
    training = (config or {}).get("training") or {}
    trained_query = int(training["query_max_len"]) if training.get("query_max_len") else None
    common = dict(name=str(resolved), kind=kind, precision=chosen, path=path, config=config)
    if kind == "dense":
        query_encoder, passage_encoder = _dense_encoders(resolved, path, config, pooling, normalize, max_length,
                                                         torch_device)
        if chosen == "int8":
            for model in {id(e.model): e.model for e in (query_encoder, passage_encoder)}.values():
                quantize_int8(model)
            for encoder in (query_encoder, passage_encoder):
                quantize_int8(encoder.dense_layers)
        query_length = query_max_length or trained_query or query_encoder.max_length
        passage_length = max_length or passage_encoder.max_length
        return Retriever(**common, query=dense_side(query_encoder, "query", query_length, chosen),
                         passage=dense_side(passage_encoder, "passage", passage_length, chosen),
                         query_encoder=query_encoder, passage_encoder=passage_encoder)
    from transformers import AutoTokenizer

    from pretrieve.modeling.dual_encoder import DualEncoder

    model = DualEncoder.load(path, info=config).to(torch_device).eval()
    if chosen == "int8":
        quantize_int8(model)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    passage_length = max_length or int(training.get("passage_max_len") or DEFAULT_PASSAGE_LENGTH)
    query_length = query_max_length or trained_query or DEFAULT_QUERY_LENGTH
    search = backend(kind)
    return Retriever(**common, representation=model.representation, model=model,
                     query=dual_encoder_side(model, tokenizer, search, "query", query_length, chosen, torch_device),
                     passage=dual_encoder_side(model, tokenizer, search, "passage", passage_length, chosen,
                                               torch_device))


def _dense_encoders(resolved: str, path: Path | None, config: Mapping[str, Any] | None, pooling, normalize,
                    max_length: int | None, device: torch.device) -> tuple[DenseEncoder, DenseEncoder]:
    """``(query, passage)`` encoders: the two towers of a fine-tuned model with separate towers, two routed
    views of a CoT-MoTE checkpoint, else one encoder for both sides."""
    from pretrieve.modeling.mote import is_mote_checkpoint, routed_views

    if config is not None and not config.get("tied", True):
        return (load_dense_encoder(path / "query", max_length=max_length, device=device),
                load_dense_encoder(path / "passage", max_length=max_length, device=device))
    encoder = load_dense_encoder(resolved, pooling=pooling, normalize=normalize, max_length=max_length, device=device)
    if path is not None and is_mote_checkpoint(path):  # one set of weights, queries through Q-FFN, passages P-FFN
        query, passage = copy.copy(encoder), copy.copy(encoder)
        query.model, passage.model = (view.eval() for view in routed_views(encoder.model, path))
        return query, passage
    return encoder, encoder
