"""The objective interface: what a pre-training "head" is, and the registry that names them.

An objective turns (batch, encoder output, encoder) into a scalar loss plus logs. Everything a method does
beyond encoding the masked input once is an objective: MLM, bag-of-words prediction, the auto-encoding,
auto-regressive and enhanced decoders of Drop your Decoder (Ma et al. 2024), and later DupMAE's OT-BoW, CPDAE's MLP decoder,
CDMAE's bottleneck decoder, CoT-MAE's context decoder. Adding one is one new file::

    @register_objective
    class MyObjective(Objective):
        name = "mine"
        requires = frozenset({"original"})   # batch features the collator must produce

        def __init__(self, encoder, *, my_param: int = 2):   # keyword-only params = the config surface
            super().__init__(encoder)
            self.head = nn.Linear(encoder.hidden_size, 8)     # parameters the objective owns

        def forward(self, batch, enc, encoder):
            ...
            return ObjectiveOutput(loss, {"loss": loss.detach()})

Ownership rule: an objective registers only the parameters it owns (fresh decoder layers, projections).
Shared modules (input embeddings, position embeddings, MLM head) are reached through the ``encoder``
argument of :meth:`Objective.forward`, never stored as sub-modules, so every parameter is registered once
(``save``/``load`` and DDP see no duplicates) and :meth:`Objective.head_state_dict` is exactly what the
trainer saves as "heads" beside the encoder.

Batch features (``requires``) known today (built by ``pretrieve.train.collator``): ``mlm_labels``,
``decoder`` (``decoder_input_ids`` + ``decoder_labels``), ``original`` (``original_input_ids`` +
``original_labels``), ``enhanced_mask``, ``bow_targets``. Later objectives add e.g.
``second_view`` (two masked views of one text), ``context`` (a second text per example), ``text_type``
(query/passage routing) and extra attention masks: they declare the name here and the collator gains a
builder for it.

Bottleneck: the objectives that decode a sentence vector (``bow``, ``ae``, ``ar``, ``enhanced``, ``cpdae``, the
contextual decoders) read it with :func:`bottleneck`, never ``enc.cls`` directly. The pre-training model sets
``enc.bottleneck`` to the attention-masked mean of the last hidden states when the method says ``bottleneck:
mean`` (:data:`BOTTLENECKS`); otherwise it is the [CLS] vector (position 0), the papers' choice.

Logs: values are detached 0-d tensors (``float(v)`` gives the number), so the trainer decides when to copy
them to the host and can all-reduce them across processes before printing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch.nn.functional as F
from torch import Tensor, nn

from pretrieve.errors import ConfigError
from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.precision import full_precision


BOTTLENECKS = ("cls", "mean")
"""The sentence vector the decoder objectives read: ``cls`` (position 0, the papers') or ``mean`` (the
attention-masked mean of the last hidden states, a mean-pooled sentence-transformers retriever's vector)."""


def bottleneck(enc: EncoderOutput) -> Tensor:
    """The sentence vector ``[B, H]`` of an encoding: the pooled ``enc.bottleneck`` when the pre-training model set
    one (method ``bottleneck: mean``), else the [CLS] vector."""
    pooled = getattr(enc, "bottleneck", None)
    return enc.cls if pooled is None else pooled


@dataclass
class ObjectiveOutput:
    """A scalar loss and the values to log (detached 0-d tensors or floats)."""

    loss: Tensor
    logs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Citation:
    """The paper an objective implements: its short name, first author, year and title."""

    paper: str
    first_author: str
    year: int
    title: str

    def __str__(self) -> str:
        return f"{self.paper} ({self.first_author} et al. {self.year}), \"{self.title}\""


BERT = Citation("BERT", "Devlin", 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language "
                "Understanding")
DROP_YOUR_DECODER = Citation("Drop your Decoder", "Ma", 2024, "Drop your Decoder: Pre-training with Bag-of-Word "
                             "Prediction for Dense Passage Retrieval")
RETROMAE = Citation("RetroMAE", "Xiao", 2022, "RetroMAE: Pre-Training Retrieval-oriented Language Models Via Masked "
                    "Auto-Encoder")
DUPMAE = Citation("DupMAE", "Xiao", 2022, "RetroMAE v2: Duplex Masked Auto-Encoder For Pre-Training "
                  "Retrieval-Oriented Language Models")
CPDAE = Citation("CPDAE", "Ma", 2022, "A Contrastive Pre-training Approach to Learn Discriminative Autoencoder for "
                 "Dense Retrieval")
COT_MAE = Citation("CoT-MAE", "Wu", 2023, "ConTextual Masked Auto-Encoder for Dense Passage Retrieval")
COT_MOTE = Citation("CoT-MoTE", "Ma", 2023, "CoT-MoTE: Exploring ConTextual Masked Auto-Encoder Pre-training with "
                    "Mixture-of-Textual-Experts for Passage Retrieval")
# Papers of what a method or a retriever uses besides its objectives (a masker, experts, a trainer, a representation)
CDMAE = Citation("CDMAE", "Li", 2023, "Challenging Decoder helps in Masked Auto-Encoder Pre-training for Dense "
                 "Passage Retrieval")
TSDAE = Citation("TSDAE", "Wang", 2021, "TSDAE: Using Transformer-based Sequential Denoising Auto-Encoder for "
                 "Unsupervised Sentence Embedding Learning")
SPLADE = Citation("SPLADE", "Formal", 2021, "SPLADE: Sparse Lexical and Expansion Model for First Stage Ranking")
SBERT = Citation("Sentence-BERT", "Reimers", 2019, "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks")


class Objective(nn.Module):
    """Base class of pre-training objectives; subclasses set ``name``, ``requires`` and ``citation``."""

    name: str = ""
    citation: Citation | None = None
    """The paper whose equation the objective computes."""
    requires: frozenset[str] = frozenset()
    uses_mlm_head: bool = True
    """Whether the loss goes through the encoder's MLM head (``mlm_logits``) on every batch; an objective with its
    own vocabulary decoder sets False (the training loop's DDP setup reads it)."""

    def __init__(self, encoder: Encoder, **params: Any):
        super().__init__()
        if params:
            raise ConfigError(f"objective '{self.name}' got unknown parameters {sorted(params)}")

    def forward(self, batch: dict[str, Tensor], enc: EncoderOutput, encoder: Encoder) -> ObjectiveOutput:
        raise NotImplementedError

    def head_state_dict(self) -> dict[str, Tensor]:
        """The parameters this objective owns (empty for objectives that only reuse the encoder)."""
        return self.state_dict()


OBJECTIVES: dict[str, type[Objective]] = {}

T = TypeVar("T", bound=type[Objective])


def register_objective(cls: T) -> T:
    """Class decorator: make an objective buildable by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} must set a non-empty class attribute 'name'")
    if cls.name in OBJECTIVES and OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"objective name '{cls.name}' is already registered by {OBJECTIVES[cls.name].__name__}")
    OBJECTIVES[cls.name] = cls
    return cls


def objective_class(name: str) -> type[Objective]:
    """The registered class for ``name``; :class:`ConfigError` listing the known names otherwise."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ConfigError(f"unknown objective '{name}'; known objectives: {', '.join(sorted(OBJECTIVES))}") from None


def objective_params(name: str) -> dict[str, Any]:
    """The keyword parameters objective ``name`` accepts, with their defaults."""
    signature = inspect.signature(objective_class(name).__init__)
    return {p.name: p.default for p in signature.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_objective_params(name: str, params: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` when ``params`` names a parameter objective ``name`` does not take."""
    known = objective_params(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        accepted = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"objective '{name}' has no parameter(s) {', '.join(unknown)}; it accepts: {accepted}")


def build_objective(name: str, encoder: Encoder, **params: Any) -> Objective:
    """Instantiate objective ``name`` for ``encoder`` with its keyword ``params``."""
    check_objective_params(name, params)
    return objective_class(name)(encoder, **params)


def positive_int(name: str, param: str, value: Any) -> int:
    """Validate an integer ≥ 1 parameter (shared by the decoder objectives)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"objective '{name}': parameter '{param}' must be an integer ≥ 1, got {value!r}")
    return value


def token_prediction_loss(encoder: Encoder, hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy of the MLM head at the positions where ``labels != -100``.

    The hidden states are gathered *before* the vocabulary projection, so only the scored positions pay
    the ``H × V`` matrix product. Returns ``(loss, number of scored tokens)``; with no scored token the loss
    is an exact zero that still depends on ``hidden`` (every parameter keeps a gradient, as DDP requires).
    """
    selected = labels != -100
    count = selected.sum()
    if not bool(count):
        return hidden.sum() * 0.0, count
    logits = encoder.mlm_logits(hidden[selected])
    return F.cross_entropy(full_precision(logits), labels[selected]), count

