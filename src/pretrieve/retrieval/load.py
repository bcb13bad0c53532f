"""The one loader of retrievers: ``load_retriever(path_or_name)`` → the model(s), its representation kind, and
the two *sides* (query, passage) that the batch encoder runs.

It reads a model's configuration once, here and nowhere else:

* ``dual_encoder.json`` — a retriever fine-tuned by pretrieve (:mod:`pretrieve.modeling.dual_encoder`): its
  representation kind (``dense``, ``dupmae`` = DupMAE's [CLS] + ordinary-token vectors, ``sparse``, ``hybrid``),
  whether the towers are tied, the query/passage lengths it was trained with, and how it joined a passage's title
  and text (``title_join``: ``sep`` = the tokenizer's [SEP] between them, as the authors' pre-processing; the
  passage side joins the corpus alike, :func:`joining_titles`);
* the sentence-transformers files (``modules.json`` and the module folders) of dense models, checked by
  :func:`pretrieve.modeling.sentence_transformer.read_sentence_transformers_config` and loaded by
  ``SentenceTransformer(path)``.

A **dense** retriever is run by :class:`~pretrieve.modeling.sentence_transformer.DenseEncoder` (sentence-transformers'
modules: transformer → pooling → Dense* → Normalize): one encoder for both sides, or one per route of a sentence-transformers
``Router`` (task ``query`` / ``document``: pretrieve's export of separate towers and of CoT-MoTE experts,
:mod:`pretrieve.modeling.export`), or — for a CoT-MoTE checkpoint without one (a pre-trained encoder) — two views
of one model routed to its query and passage FFN experts. Query / passage prompts saved with a model are used
unless the caller gives its own. Any checkpoint without ``modules.json`` (``bert-base-uncased``, a pre-trained
pretrieve encoder) uses the pooling the caller names (``cls`` by default, the papers' choice) and no
normalisation; explicit arguments override what a checkpoint says. The **other kinds** are run by
:class:`~pretrieve.modeling.dual_encoder.DualEncoder` (``encode(text_type, …)``), whose representation rows are
turned into search parts by the kind's back-end (:mod:`pretrieve.retrieval.index`).

When no ``max_seq_length`` is given, the length is ``min(tokenizer.model_max_length,
config.max_position_embeddings)`` as in sentence-transformers. A fine-tuned model's query length defaults to the
one it was trained with (``dual_encoder.json``), its passage length to its ``max_seq_length`` (dense) or the
trained passage length (other kinds; 144 / 32 when not recorded).

**Precision** is chosen at load time (:func:`pretrieve.precision.resolve_precision`; ``auto`` by
default): ``int8`` quantises the models' linear layers here; ``bf16`` / ``fp16`` run under autocast in the batch
encoder. The resolved precision is part of every index's settings, so vectors of another precision are never
taken from a cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor
from transformers import AutoModel, AutoTokenizer

from pretrieve.artifacts import FileSet
from pretrieve.data.records import title_separator
from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.dual_encoder import DualEncoder, read_dual_encoder_config
from pretrieve.modeling.mote import is_mote_checkpoint, routed_views
from pretrieve.modeling.pooling import parse_pooling
from pretrieve.modeling.sentence_transformer import (DenseEncoder, ModelFiles, read_sentence_transformers_config,
                                                     sentence_transformer_modules, tower_files)
from pretrieve.models import named_weights_errors, no_remote_code, resolve_model
from pretrieve.precision import resolve_precision
from pretrieve.retrieval.batches import Side, quantize_int8, resolve_device
from pretrieve.retrieval.index import BACKENDS, PartsEncoder, backend

logger = logging.getLogger(__name__)

KINDS = tuple(BACKENDS)
"""Representation kinds with a search back-end (:data:`pretrieve.retrieval.index.BACKENDS`)."""
DUAL_ENCODER_CONFIG = "dual_encoder.json"
DEFAULT_PASSAGE_LENGTH, DEFAULT_QUERY_LENGTH = 144, 32
"""Lengths of a fine-tuned non-dense model whose ``dual_encoder.json`` records none (the fine-tuning defaults)."""



# ------------------------------------------------------------------------------------------ dense encoders
def load_dense_encoder(name_or_path: str | Path, pooling: str | Sequence[str] | None = None,
                       normalize: bool | None = None, max_length: int | None = None,
                       device: str | torch.device = "cpu", side: str = "passage",
                       transformer_path: str | None = None) -> DenseEncoder:
    """A :class:`DenseEncoder` of a checkpoint: its sentence-transformers modules (checked, then loaded by
    sentence-transformers), explicit arguments overriding them. ``side`` picks the route of a ``Router`` model
    (``"query"`` or ``"passage"``); ``transformer_path`` loads the transformer from that subfolder instead of the one
    the files name (``""``: the root, where a CoT-MoTE export keeps its MoTE checkpoint)."""
    name_or_path = resolve_model(name_or_path)
    files = ModelFiles(name_or_path)
    st = read_sentence_transformers_config(files, side)
    location, extra = files.model_location(st.transformer_path if st and transformer_path is None
                                           else transformer_path or "")
    no_remote_code(location, extra.get("subfolder", ""))
    try:
        with named_weights_errors(name_or_path):
            modules = sentence_transformer_modules(files, st, side, transformer_path,
                                                   parse_pooling(pooling) if pooling else None, normalize)
    except OSError as exc:
        raise InputError(f"cannot load model: {exc}", path=str(name_or_path)) from None
    side_length = st and (st.query_length if side == "query" else st.document_length)
    encoder = DenseEncoder(modules, max_length or side_length or modules[0].max_seq_length,
                           query_prompt=st.query_prompt if st else None,
                           passage_prompt=st.passage_prompt if st else None,
                           name=str(name_or_path), sentence_transformers=st is not None)
    if st is not None and st.similarity == "cosine" and not encoder.normalize:
        logger.warning("%s is scored by cosine similarity but embeddings are not normalised; inner-product "
                       "search will differ from cosine (pass normalize=True)", name_or_path)
    return encoder.to(resolve_device(device))


# --------------------------------------------------------------------------------------- retriever configs
def read_retriever_config(path: str | Path) -> dict[str, Any] | None:
    """The ``dual_encoder.json`` of a retriever fine-tuned by pretrieve (None for any other model): the one
    reader of that file."""
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


# ------------------------------------------------------------------------------------------------ sides
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
    passage_files: FileSet | None = None


    def settings(self) -> dict[str, Any]:
        """What the passage outputs depend on besides the model's files (recorded with every corpus index)."""
        return {"model": self.model_name, "kind": self.kind, "precision": self.precision,
                "passage": self.passage.settings}

    def describe(self) -> str:
        """One line of what encoding uses — kind, pooling, normalisation, dimension, passage length, precision,
        device — as ``pretrieve dense`` / ``encode`` print it and :func:`pretrieve.load_retriever` logs it."""
        passage = self.passage.settings
        details = (f"pooling={passage['pooling']} normalize={passage['normalize']} dim={passage['dim']} "
                   if self.kind == "dense" else "")
        return (f"kind={self.kind} {details}max_length={self.passage.max_length} precision={self.precision} "
                f"device={self.passage.device}")

    def inputs(self) -> dict[str, Path | FileSet]:
        """What the passage outputs are made from, fingerprinted by content for the freshness contract: the passage
        tower's files (:attr:`passage_files`) when they are known, else the model directory when it is local."""
        if self.passage_files is not None:
            return {"passage tower": self.passage_files}
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
        return {"embeddings": np.zeros((0, encoder.dim), np.float32)}

    settings = {key: value for key, value in encoder.describe().items()
                if key not in ("model", "query_prompt", "passage_prompt")}
    settings.update(max_length=int(max_length), prompt=prompt)
    return Side(text_type, encoder.tokenizer, int(max_length), forward, empty, encoder.device, precision, settings,
                prompt)


def dual_encoder_side(model, tokenizer, backend: PartsEncoder, text_type: str, max_length: int, precision: str,
                      device: torch.device, prompt: str | None = None) -> Side:
    representation = model.representation
    vocab = int(model.query_tower.config.vocab_size)

    def forward(batch: dict[str, Tensor]) -> dict[str, Any]:
        rep = model.encode(text_type, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        return backend.outputs(representation, rep, text_type)

    def empty() -> dict[str, Any]:
        return backend.empty_outputs(representation, vocab, text_type)

    settings = {"representation": representation.config(), "max_length": int(max_length), "tied": model.tied}
    if prompt:
        settings["prompt"] = prompt
    return Side(text_type, tokenizer, int(max_length), forward, empty, device, precision, settings, prompt or None)


# ------------------------------------------------------------------------------------------------ loading
def load_retriever(name_or_path: str | Path, device: str | torch.device = "auto", precision: str = "auto",
                   max_length: int | None = None, query_max_length: int | None = None,
                   pooling: str | Sequence[str] | None = None, normalize: bool | None = None,
                   query_prompt: str | None = None, passage_prompt: str | None = None,
                   title_join: str | None = None) -> Retriever:
    """Load any retriever — a sentence-transformers or Hugging Face checkpoint (path, hub name or offline alias)
    or a model fine-tuned by pretrieve — with its query and passage sides (see the module docstring).

    ``max_length`` / ``query_max_length`` override the passage / query lengths; ``pooling`` / ``normalize`` apply
    to plain dense checkpoints only (a fine-tuned retriever's representation is saved with it).
    ``query_prompt`` / ``passage_prompt``: text prepended to every query / passage (E5/BGE-style ``"query: "``);
    given, they replace the prompts the checkpoint saved (``""``: none). ``title_join``: how a passage's title and
    text are joined (``sep``: the tokenizer's [SEP] between them) when the checkpoint has no training record that
    says it — a released retriever fine-tuned elsewhere (the authors' MS MARCO retrievers joined title [SEP] text).
    """
    resolved = resolve_model(name_or_path)
    path = Path(resolved) if Path(resolved).is_dir() else None
    config = read_retriever_config(path) if path is not None else None
    kind = retriever_kind(resolved, config or {})
    if config is not None and (pooling is not None or normalize is not None):
        raise ConfigError("pooling/normalize do not apply to a retriever fine-tuned by pretrieve (its "
                          "representation is saved with it)")
    torch_device = resolve_device(device)
    chosen = resolve_precision(precision, torch_device)
    training = (config or {}).get("training") or {}
    if title_join is not None and training.get("title_join") not in (None, title_join):
        raise ConfigError(f"title_join {title_join!r}: the retriever was fine-tuned with "
                          f"{training['title_join']!r} (its training record)")
    training = {**training, "title_join": training.get("title_join") or title_join}
    trained_query = int(training["query_max_len"]) if training.get("query_max_len") else None
    common = dict(name=str(resolved), kind=kind, precision=chosen, path=path, config=config)
    if kind == "dense":
        query_encoder, passage_encoder = _dense_encoders(resolved, path, pooling, normalize, max_length, torch_device)
        if query_prompt is not None:
            query_encoder.query_prompt = query_prompt or None
        if passage_prompt is not None:
            passage_encoder.passage_prompt = passage_prompt or None
        if chosen == "int8":
            for model in {id(e.model): e.model for e in (query_encoder, passage_encoder)}.values():
                quantize_int8(model)
            for encoder in (query_encoder, passage_encoder):
                quantize_int8(encoder.modules)
        query_length = query_max_length or trained_query or query_encoder.max_length
        passage_length = max_length or passage_encoder.max_length
        return Retriever(**common, query=dense_side(query_encoder, "query", query_length, chosen),
                         passage=joining_titles(dense_side(passage_encoder, "passage", passage_length, chosen),
                                                training.get("title_join")),
                         query_encoder=query_encoder, passage_encoder=passage_encoder,
                         passage_files=passage_tower_files(resolved, path))
    model = DualEncoder.load(path, info=config).to(torch_device).eval()
    if chosen == "int8":
        quantize_int8(model)
    tokenizer = AutoTokenizer.from_pretrained(str(path), **no_remote_code(path))
    passage_length = max_length or int(training.get("passage_max_len") or DEFAULT_PASSAGE_LENGTH)
    query_length = query_max_length or trained_query or DEFAULT_QUERY_LENGTH
    search = backend(kind)
    return Retriever(**common, representation=model.representation, model=model,
                     query=dual_encoder_side(model, tokenizer, search, "query", query_length, chosen, torch_device,
                                             query_prompt),
                     passage=joining_titles(dual_encoder_side(model, tokenizer, search, "passage", passage_length,
                                                              chosen, torch_device, passage_prompt),
                                            training.get("title_join")))


def passage_tower_files(resolved: str, path: Path | None) -> FileSet | None:
    """The files the passage side of a local dense model is made from: its transformer folder's weights, config and
    tokenizer (:func:`~pretrieve.modeling.sentence_transformer.tower_files`; pooling, normalisation, length, prompt
    and lower-casing are the side's settings). None — the whole folder is the input — for a hub name, a CoT-MoTE
    checkpoint (its experts are routed) and a model with Dense layers (their weights sit in other folders). Read
    from the files, without loading the model."""
    if path is None or is_mote_checkpoint(path):
        return None
    st = read_sentence_transformers_config(ModelFiles(resolved), "passage")
    if st is not None and st.dense:
        return None
    folder = path / (st.transformer_path if st is not None else "")
    names = tower_files(folder)
    return FileSet(folder, names) if names else None


def joining_titles(side: Side, join: str | None) -> Side:
    """The passage side joining title and text as the model was trained to (``title_join`` of its training record,
    :func:`pretrieve.data.records.title_separator`); a join other than the default space is part of the side's
    settings, so an index encoded with another join is never reused."""
    try:
        side.title_sep = title_separator(join, side.tokenizer)
    except ValueError as exc:
        raise ConfigError(f"the model's training record: {exc}") from None
    if join not in (None, "space"):
        side.settings["title_join"] = join
    return side


def _dense_encoders(resolved: str, path: Path | None, pooling, normalize, max_length: int | None,
                    device: torch.device) -> tuple[DenseEncoder, DenseEncoder]:
    """``(query, passage)`` encoders: two routed views of a CoT-MoTE checkpoint (its root is the source of truth;
    the per-side copies of an export are for sentence-transformers), the two routes of a sentence-transformers
    ``Router`` model (pretrieve's export of separate towers, or any such model), else one encoder for both sides."""
    if path is not None and is_mote_checkpoint(path):  # one set of weights, queries through Q-FFN, passages P-FFN
        encoder = load_dense_encoder(resolved, pooling=pooling, normalize=normalize, max_length=max_length,
                                     device=device, transformer_path="")
        query, passage = (encoder.with_model(view.eval()) for view in routed_views(encoder.model, path))
        return query, passage
    with named_weights_errors(resolved):   # a Dense module's weights
        st = read_sentence_transformers_config(ModelFiles(resolved))
    if st is not None and st.routed:
        return tuple(load_dense_encoder(resolved, pooling=pooling, normalize=normalize, max_length=max_length,
                                        device=device, side=side) for side in ("query", "passage"))
    encoder = load_dense_encoder(resolved, pooling=pooling, normalize=normalize, max_length=max_length, device=device)
    return encoder, encoder
