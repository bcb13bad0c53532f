"""The dual encoder: a query tower, a passage tower, a representation, and the fine-tuning loss.

Towers. A tower maps token ids to last-layer hidden states: ``tower(input_ids, attention_mask,
token_type_ids, text_type) -> [B, L, H]``, where ``text_type`` is ``"query"`` or ``"passage"``.

* :class:`TransformerTower` wraps a Hugging Face ``AutoModel`` (the default);
* :class:`MaskedLMTower` wraps :class:`pretrieve.modeling.Encoder` (an ``AutoModelForMaskedLM`` with its MLM
  head) and is chosen automatically when the representation needs the head (``needs_mlm_head``).

Both accept ``text_type`` and pass it down (the MaskedLM encoder as its 0/1 tensor), so a later tower that
routes query and passage tokens to different FFN experts (CoT-MoTE (Ma et al. 2023)) registers itself with
:func:`register_tower` and plugs in without changing the dual encoder or the trainer.

Siamese or separate (CoT-MoTE, Ma et al. 2023, §2): ``tied=True`` (default, Drop your Decoder, DupMAE, CDMAE, and CoT-MoTE's shared attention) uses
one tower for both sides; ``tied=False`` holds two copies initialised from the same checkpoint that are trained
independently ("fully separated"). The model stores only distinct modules, so a tied model's state holds one
tower (no shared tensors in checkpoints).

Loss (:class:`RetrievalLoss`). ``model(batch) -> (loss, logs)`` with ``batch`` holding the tokenized queries
``query_input_ids`` / ``query_attention_mask`` (``[B, Lq]``, optional ``query_token_type_ids``) and passages
``passage_*`` (``[B·G, Lp]``, each query's group contiguous, its positive first) and, for distillation,
``teacher_scores`` ``[B, G]``. Without teacher scores the loss is InfoNCE over in-batch + hard negatives
(CDMAE, Li et al. 2023, eq. 10, DupMAE (Xiao & Liu 2022) eq. 14); with them it is ``KL(P_teacher ‖ P_student) + α · InfoNCE`` (CDMAE (Li et al. 2023)
eq. 11, α = 0.2). ``gather=True`` scores against the passages of every process under DDP (cross-device
negatives; a no-op in one process). Note that cross-device negatives make a W-process run differ from one
process accumulating W micro-batches (each micro-batch then sees only its own in-batch negatives); with
``gather=False`` the two are identical.

Checkpoint layout (:meth:`DualEncoder.save`)::

    dual_encoder.json          format, tied, tower kind, representation config, loss settings, training info
    config.json, model.safetensors          the tower (tied) — loads with AutoModel.from_pretrained
    query_0_Transformer/…, document_0_Transformer/…
                                            the two towers (tied=False), each loadable with AutoModel — the
                                            folders sentence-transformers' Router.for_query_document saves its
                                            query and document Transformers in, so an export stores each tower
                                            once (:data:`TOWER_FOLDERS`; ``query/``, ``passage/`` are read too)
    representation.safetensors              only for representations with learnable parameters
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel

from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json
from pretrieve.modeling.encoder import Encoder
from pretrieve.modeling.losses import combined_distillation_loss, contrastive_loss, group_scores
from pretrieve.modeling.mote import is_mote_checkpoint
from pretrieve.models import named_weights_errors, no_remote_code
from pretrieve.precision import full_precision
from pretrieve.modeling.representations import DenseRepresentation, Representation, representation_from_config

TEXT_TYPES = ("query", "passage")
CONFIG_FILE = "dual_encoder.json"
REPRESENTATION_WEIGHTS = "representation.safetensors"
TOWER_FOLDERS = {"query": "query_0_Transformer", "passage": "document_0_Transformer"}
"""Text type → the folder of its tower when the towers are separate (sentence-transformers' Router folders)."""
FORMAT = "pretrieve-dual-encoder/1"


# ------------------------------------------------------------------------------------------------ towers
class Tower(nn.Module):
    """Token ids → last hidden states ``[B, L, H]``; knows whether it encodes queries or passages."""

    kind: ClassVar[str] = ""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
                text_type: str = "passage") -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path) -> "Tower":  # pragma: no cover - interface
        raise NotImplementedError

    def save_pretrained(self, directory: str | Path) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def hidden_size(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError


TOWERS: dict[str, type[Tower]] = {}


def register_tower(cls: type[Tower]) -> type[Tower]:
    """Class decorator: make a tower kind loadable from saved dual encoders and configs."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} needs a non-empty 'kind'")
    TOWERS[cls.kind] = cls
    return cls


def _check_text_type(text_type: str) -> None:
    if text_type not in TEXT_TYPES:
        raise ValueError(f"text_type must be one of {TEXT_TYPES}, got {text_type!r}")


def _model_inputs(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None) -> dict[str, Tensor]:
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        inputs["token_type_ids"] = token_type_ids
    return inputs


@register_tower
class TransformerTower(Tower):
    """A Hugging Face ``AutoModel`` (any encoder family); ``text_type`` is accepted and not used."""

    kind = "auto"

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        pooler = getattr(model, "pooler", None)
        if isinstance(pooler, nn.Module):   # never used (a tower returns hidden states): frozen, so DDP need not
            pooler.requires_grad_(False)    # search for unused parameters; its weights are exported unchanged

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path) -> "TransformerTower":
        try:
            with named_weights_errors(name_or_path):
                return cls(AutoModel.from_pretrained(str(name_or_path), **no_remote_code(name_or_path)))
        except OSError as exc:
            raise InputError(f"cannot load model: {exc}", path=str(name_or_path)) from None

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
                text_type: str = "passage") -> Tensor:
        _check_text_type(text_type)
        return self.model(**_model_inputs(input_ids, attention_mask, token_type_ids)).last_hidden_state

    def save_pretrained(self, directory: str | Path) -> None:
        self.model.save_pretrained(str(directory), safe_serialization=True)

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return int(self.model.get_input_embeddings().embedding_dim)


@register_tower
class MaskedLMTower(Tower):
    """:class:`pretrieve.modeling.Encoder` (MLM head kept) for representations that project to the vocabulary.

    ``text_type`` reaches :meth:`Encoder.forward` as a ``[B]`` tensor (0 = query, 1 = passage), the form its
    MoTE extension point expects.
    """

    kind = "mlm"

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path) -> "MaskedLMTower":
        try:
            return cls(Encoder.from_pretrained(str(name_or_path)))
        except OSError as exc:
            raise InputError(f"cannot load model: {exc}", path=str(name_or_path)) from None

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
                text_type: str = "passage") -> Tensor:
        _check_text_type(text_type)
        types = torch.full((input_ids.shape[0],), TEXT_TYPES.index(text_type), dtype=torch.long,
                           device=input_ids.device)
        return self.encoder(input_ids, attention_mask, token_type_ids=token_type_ids, text_type=types).last_hidden_state

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        return self.encoder.mlm_logits(hidden)

    def save_pretrained(self, directory: str | Path) -> None:
        self.encoder.save_pretrained(directory)

    @property
    def config(self):
        return self.encoder.config

    @property
    def hidden_size(self) -> int:
        return self.encoder.hidden_size


def default_tower_kind(representation: Representation) -> str:
    return "mlm" if representation.needs_mlm_head else "auto"


# -------------------------------------------------------------------------------------------------- loss
@dataclass
class RetrievalLoss:
    """Fine-tuning loss settings (the representation owns the similarity and the temperature τ).

    Args:
        in_batch: the other queries' passages are negatives too (DupMAE eq. 14, CDMAE eq. 10).
        gather: cross-device negatives under DDP (no-op in one process).
        alpha: weight of the contrastive term in the distillation stage (CDMAE (Li et al. 2023): 0.2, after SimLM).
        teacher_temperature: temperature of the teacher's softmax in the KL term (papers: 1).
    """

    in_batch: bool = True
    gather: bool = True
    alpha: float = 0.2
    teacher_temperature: float = 1.0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RetrievalLoss":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


# ----------------------------------------------------------------------------------------- dual encoder
class DualEncoder(nn.Module):
    """Query and passage towers + a representation; ``forward(batch) -> (loss, logs)``.

    ``grad_cache_chunk`` (None by default): when set, the training loop steps the model with gradient caching in
    sub-batches of that many texts (:mod:`pretrieve.train.grad_cache`).
    """

    grad_cache_chunk: int | None = None

    def __init__(self, query_tower: Tower, passage_tower: Tower | None = None,
                 representation: Representation | None = None, loss: RetrievalLoss | None = None):
        super().__init__()
        self.query_tower = query_tower
        if passage_tower is not None and passage_tower is not query_tower:
            self.passage_tower = passage_tower
        else:
            self.passage_tower = None
        self.representation = representation if representation is not None else DenseRepresentation()
        self.loss_config = loss if loss is not None else RetrievalLoss()
        if self.representation.needs_mlm_head and not hasattr(query_tower, "mlm_logits"):
            raise ConfigError(f"representation '{self.representation.kind}' needs the MLM head: use 'mlm' towers")

    # ------------------------------------------------------------------ construction
    @property
    def tied(self) -> bool:
        """Siamese: one tower encodes queries and passages."""
        return self.passage_tower is None

    def tower(self, text_type: str) -> Tower:
        _check_text_type(text_type)
        if text_type == "passage" and self.passage_tower is not None:
            return self.passage_tower
        return self.query_tower

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, representation: Representation | None = None,
                        tied: bool = True, tower: str | None = None,
                        loss: RetrievalLoss | None = None) -> "DualEncoder":
        """Initialise from a pre-trained encoder checkpoint (both towers from it when ``tied=False``).

        ``tower`` picks the tower kind (default: ``"mlm"`` when the representation needs the MLM head,
        else ``"auto"``).
        """
        representation = representation if representation is not None else DenseRepresentation()
        path = Path(str(name_or_path))
        # a CoT-MoTE checkpoint needs the Encoder-based tower, which restores its experts and routes by text type
        kind = tower or ("mlm" if is_mote_checkpoint(path) else default_tower_kind(representation))
        tower_cls = _tower_class(kind)
        if (path / CONFIG_FILE).exists() and not (path / "config.json").exists():
            raise InputError("this is a saved dual encoder with separate towers; load it with DualEncoder.load",
                             path=path)
        query = tower_cls.from_pretrained(name_or_path)
        passage = None if tied else tower_cls.from_pretrained(name_or_path)
        return cls(query, passage, representation, loss)

    # ------------------------------------------------------------------ computation
    def encode(self, text_type: str, input_ids: Tensor, attention_mask: Tensor,
               token_type_ids: Tensor | None = None) -> Tensor:
        """Representations of a batch of queries or passages (``text_type`` reaches the tower)."""
        tower = self.tower(text_type)
        hidden = tower(input_ids, attention_mask, token_type_ids=token_type_ids, text_type=text_type)
        return self.representation.encode(hidden, attention_mask, input_ids, tower)

    def encode_batch(self, batch: Mapping[str, Tensor], text_type: str) -> Tensor:
        """:meth:`encode` of the ``{text_type}_input_ids`` / ``_attention_mask`` / ``_token_type_ids`` of a batch."""
        return self.encode(text_type, batch[f"{text_type}_input_ids"], batch[f"{text_type}_attention_mask"],
                           batch.get(f"{text_type}_token_type_ids"))

    def score(self, q_rep: Tensor, p_rep: Tensor) -> Tensor:
        return self.representation.score(q_rep, p_rep)

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        return self.loss(self.encode_batch(batch, "query"), self.encode_batch(batch, "passage"), batch)

    def loss(self, q: Tensor, p: Tensor, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The fine-tuning loss of query and passage representations ``q`` ``[B, ·]`` / ``p`` ``[B·G, ·]`` (teacher
        scores, when present, from ``batch``); split from :meth:`forward` so that gradient caching
        (:mod:`pretrieve.train.grad_cache`) can compute it on cached representations.

        Scores and loss are computed in float32 with autocast off, whatever the training precision: under bf16 /
        fp16 autocast the score matmul would run in half precision, too coarse for a small temperature (bf16
        resolves 2^-8 near 1: 0.08 of a logit at τ = 0.05). Half-precision representations are upcast to float32;
        float32 and float64 ones are used as they are, so in fp32 nothing changes."""
        with torch.autocast(device_type=q.device.type, enabled=False):
            return self._loss(full_precision(q), full_precision(p), batch)

    def _loss(self, q: Tensor, p: Tensor, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        options = self.representation.loss_options()
        temperature = self.representation.temperature
        settings = self.loss_config
        logs: dict[str, Tensor] = {}
        teacher = batch.get("teacher_scores")
        if teacher is not None:
            result = combined_distillation_loss(q, p, teacher, alpha=settings.alpha, temperature=temperature,
                                                teacher_temperature=settings.teacher_temperature,
                                                in_batch=settings.in_batch, gather=settings.gather, **options)
            loss = result.loss
            logs["loss/kl"] = result.kl.detach()
            logs["loss/contrastive"] = result.contrastive.detach()
        else:
            loss = contrastive_loss(q, p, temperature=temperature, in_batch=settings.in_batch,
                                    gather=settings.gather, **options)
            logs["loss/contrastive"] = loss.detach()
        for name, value in self.representation.regularization(q, p).items():   # e.g. FLOPS for sparse vectors
            loss = loss + value
            logs[f"loss/{name}"] = value.detach()
        with torch.no_grad():
            own = group_scores(q.detach(), p.detach(), **options)
            logs["accuracy"] = (own.argmax(dim=1) == 0).float().mean()
        return loss, logs

    def may_leave_parameters_unused(self) -> bool:
        """Whether a training step may leave a trainable parameter without gradient (DDP then searches for them).

        Every tower's parameters feed both representations' encoders, and a tower's pooler is frozen (a tower
        returns hidden states, never the pooled output); left unused is only the MLM head of a masked-LM tower
        (CoT-MoTE checkpoints load one) under a representation that does not project to the vocabulary.
        """
        return self.query_tower.kind == "mlm" and not self.representation.needs_mlm_head

    # ------------------------------------------------------------------ persistence
    def describe(self, training: Mapping[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"format": FORMAT, "tied": self.tied, "tower": self.query_tower.kind,
                                "representation": self.representation.config(), "loss": asdict(self.loss_config)}
        if training:
            info["training"] = dict(training)
        return info

    def save(self, directory: str | Path, training: Mapping[str, Any] | None = None) -> Path:
        """Write the towers, learnable representation parameters and ``dual_encoder.json`` into ``directory``.

        ``training`` (e.g. the query/passage max lengths used) is stored under ``"training"`` for the tools
        that encode with this model later.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.tied:
            self.query_tower.save_pretrained(directory)
        else:
            self.query_tower.save_pretrained(directory / TOWER_FOLDERS["query"])
            self.passage_tower.save_pretrained(directory / TOWER_FOLDERS["passage"])
        state = self.representation.state_dict()
        if state:
            save_file({key: value.detach().contiguous().cpu() for key, value in state.items()},
                      str(directory / REPRESENTATION_WEIGHTS))
        write_json(directory / CONFIG_FILE, self.describe(training))
        return directory

    @classmethod
    def load(cls, directory: str | Path, info: Mapping[str, Any] | None = None) -> "DualEncoder":
        """Load a model written by :meth:`save` (``info``: its ``dual_encoder.json`` when already read)."""
        directory = Path(directory)
        info = read_dual_encoder_config(directory) if info is None else info
        representation = representation_from_config(info["representation"])
        weights = directory / REPRESENTATION_WEIGHTS
        if weights.exists():
            representation.load_state_dict(load_file(str(weights)))
        tower_cls = _tower_class(info.get("tower", "auto"))
        if info.get("tied", True):
            query, passage = tower_cls.from_pretrained(directory), None
        else:
            query, passage = (tower_cls.from_pretrained(tower_folder(directory, side)) for side in TEXT_TYPES)
        return cls(query, passage, representation, RetrievalLoss.from_dict(info.get("loss", {})))


def tower_folder(directory: str | Path, text_type: str) -> Path:
    """The folder of the ``text_type`` tower of separate towers saved in ``directory`` (:data:`TOWER_FOLDERS`, or
    ``query/`` / ``passage/`` as pretrieve wrote them before)."""
    folder = Path(directory) / TOWER_FOLDERS[text_type]
    return folder if folder.is_dir() or not (Path(directory) / text_type).is_dir() else Path(directory) / text_type


def read_dual_encoder_config(directory: str | Path) -> dict[str, Any]:
    """The ``dual_encoder.json`` of a saved model (:class:`InputError` when missing or not ours)."""
    path = Path(directory) / CONFIG_FILE
    if not path.exists():
        raise InputError(f"not a pretrieve dual encoder ({CONFIG_FILE} missing)", path=directory)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    if info.get("format") != FORMAT or "representation" not in info:
        raise InputError(f"unsupported dual encoder format {info.get('format')!r} (expected {FORMAT})", path=path,
                         field="format")
    return info


def _tower_class(kind: str) -> type[Tower]:
    if kind not in TOWERS:
        raise ConfigError(f"unknown tower kind '{kind}' (known: {', '.join(sorted(TOWERS))})")
    return TOWERS[kind]
