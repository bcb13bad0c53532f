"""The encoder wrapper: one BERT-style masked language model, whatever its family.

:class:`Encoder` owns a Hugging Face ``AutoModelForMaskedLM`` and exposes exactly what the pre-training
objectives need, without assuming attribute names such as ``lm.bert`` or ``lm.cls`` (the pitfall that broke
RoBERTa for RetroMAE users):

* the transformer body is ``model.base_model`` and the input embeddings ``model.get_input_embeddings()``;
* the MLM head is "every child of the MaskedLM model that is not the body", applied in registration order
  (BERT ``cls``, RoBERTa/XLM-R/MPNet ``lm_head``, ModernBERT ``head`` → ``decoder``); families whose forward
  applies them in another order are listed in :data:`HEAD_ORDER` (DistilBERT). Every encoder checks once,
  at construction, that this generic head reproduces the model's own MLM logits and raises
  :class:`~pretrieve.errors.ConfigError` otherwise, so an unsupported layout fails loudly instead of
  training a silently wrong head;
* a checkpoint without an MLM head (a plain ``BertModel`` such as all-MiniLM-L6-v2) gets one created:
  transform and LayerNorm fresh, decoder tied to the input embeddings, bias zero, and a warning is logged.

``text_type`` (0 = query, 1 = passage) given to :meth:`Encoder.forward` routes every example to its FFN expert
when the body has CoT-MoTE's query/passage experts (:mod:`pretrieve.modeling.mote`; ignored otherwise), and
:meth:`Encoder.from_pretrained` restores both experts of a MoTE checkpoint.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel

from pretrieve.errors import ConfigError
from pretrieve.modeling.mote import mote_routing, restore_mote
from pretrieve.models import named_weights_errors, no_remote_code, resolve_model

logger = logging.getLogger(__name__)

#: Families whose MaskedLM forward applies the head children in an order different from registration.
HEAD_ORDER: dict[str, tuple[str, ...]] = {
    "distilbert": ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
}


@dataclass
class EncoderOutput:
    """Hidden states of the last layer ``[B, L, H]`` and the [CLS] (position 0) vector ``[B, H]``."""

    last_hidden_state: Tensor
    cls: Tensor



class HeldTieNotices(logging.Filter):
    """Holds back transformers' "This checkpoint seem corrupted" notice while a checkpoint loads, and lets through
    afterwards only those that are not about the MLM head (:meth:`release`).

    transformers (5.x) prints it when both weights of a tied pair are absent from the checkpoint. A checkpoint
    without an MLM head (a plain ``BertModel`` such as all-MiniLM-L6-v2) lacks ``cls.predictions.bias`` and
    ``cls.predictions.decoder.bias``, which BERT ties: nothing is corrupted, the head is created and said so by
    :meth:`Encoder.from_pretrained`'s own warning. A missing tied pair elsewhere is a real problem and is shown."""

    MESSAGE = re.compile(r"This checkpoint seem corrupted.*?tie (\S+) to (\S+),")

    def __init__(self, logger_name: str = "transformers.modeling_utils"):
        super().__init__()
        self.logger = logging.getLogger(logger_name)
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.MESSAGE.search(record.getMessage()):
            self.held.append(record)
            return False
        return True

    def __enter__(self) -> "HeldTieNotices":
        self.logger.addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeFilter(self)

    def release(self, head_prefixes: tuple[str, ...]) -> None:
        """Show the held notices whose tied weights are not both in the MLM head (names starting with a prefix)."""
        for record in self.held:
            tied = self.MESSAGE.search(record.getMessage()).groups()
            if not all(name.startswith(head_prefixes) for name in tied):
                self.logger.handle(record)
        self.held.clear()

class Encoder(nn.Module):
    """A BERT-style encoder with its MLM head, built around a Hugging Face ``*ForMaskedLM`` model."""

    def __init__(self, model: PreTrainedModel, *, check_head: bool = True):
        super().__init__()
        self.model = model
        self.head_created = False  # True when from_pretrained had to create a missing MLM head
        self._head_names = _head_module_names(model)
        if check_head:
            _check_head_matches_model(self)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **kwargs) -> "Encoder":
        """Load a checkpoint (hub name, directory or offline alias); create and log the MLM head when missing."""
        name_or_path = resolve_model(name_or_path)
        with named_weights_errors(name_or_path), HeldTieNotices() as tie_notices:
            model, info = AutoModelForMaskedLM.from_pretrained(str(name_or_path), output_loading_info=True,
                                                               **no_remote_code(name_or_path), **kwargs)
        head_prefixes = tuple(f"{name}." for name in _head_module_names(model))
        tie_notices.release(head_prefixes)
        missing_head = sorted(key for key in info.get("missing_keys", ()) if key.startswith(head_prefixes))
        if missing_head:
            _create_head(model)
            logger.warning("checkpoint %s has no MLM head (missing %s); created one: transform and LayerNorm "
                           "freshly initialised, decoder tied to the input embeddings, bias zero",
                           name_or_path, ", ".join(missing_head))
        restore_mote(model, name_or_path)  # a CoT-MoTE checkpoint: rebuild the query/passage FFN experts
        encoder = cls(model)
        encoder.head_created = bool(missing_head)
        return encoder

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "Encoder":
        """A randomly initialised encoder (tests, from-scratch runs)."""
        return cls(AutoModelForMaskedLM.from_config(config))

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return int(self.model.get_input_embeddings().embedding_dim)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The input token embeddings (tied with the MLM head's decoder)."""
        return self.model.get_input_embeddings()

    @property
    def embeddings(self) -> nn.Module:
        """The body's embedding layer (word + position (+ type) + LayerNorm + dropout)."""
        return self.model.base_model.embeddings

    # ------------------------------------------------------------------ computation
    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
                text_type: Tensor | None = None) -> EncoderOutput:
        """Encode a batch; ``text_type [B]`` routes each example to its query/passage FFN expert (MoTE models)."""
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        with mote_routing(self.model, text_type):
            hidden = self.model.base_model(**kwargs).last_hidden_state
        return EncoderOutput(last_hidden_state=hidden, cls=hidden[:, 0])

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Apply the full MLM head (transform, LayerNorm, tied decoder + bias) to ``hidden [..., H]``.

        Only the vectors passed in are projected to the vocabulary: objectives gather the positions they
        score first, which is what makes MLM on CPU 2–4× faster than projecting every position.
        """
        out = hidden
        for name in self._head_names:
            out = getattr(self.model, name)(out)
        return out

    def position_ids(self, input_ids: Tensor) -> Tensor:
        """The position ids the embedding layer uses for ``input_ids`` (``[B, L]``).

        BERT-like families count from 0; RoBERTa-like families (embedding layer with ``padding_idx``) start at
        ``padding_idx + 1`` and give padding the id ``padding_idx``.
        """
        padding_idx = getattr(self.embeddings, "padding_idx", None)
        if padding_idx is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            return positions.unsqueeze(0).expand_as(input_ids)
        not_pad = input_ids.ne(padding_idx).long()
        return torch.cumsum(not_pad, dim=1) * not_pad + padding_idx

    def embed_tokens(self, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """The encoder's embedding-layer output for decoder inputs ``[B, L, H]`` (shared weights)."""
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        return self.embeddings(input_ids=input_ids, position_ids=position_ids)

    def embed_vectors(self, vectors: Tensor, position_ids: Tensor) -> Tensor:
        """The embedding layer applied to given vectors ``[B, L, H]`` instead of token embeddings: + position (and
        token-type 0) embeddings, LayerNorm, dropout (DupMAE's decoder query stream)."""
        return self.embeddings(inputs_embeds=vectors, position_ids=position_ids)

    def position_embeddings(self, position_ids: Tensor) -> Tensor:
        """The raw absolute position embeddings (no LayerNorm, no dropout)."""
        return self.embeddings.position_embeddings(position_ids)

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, directory: str | Path) -> None:
        """Save as a standard ``*ForMaskedLM`` checkpoint (safetensors) loadable by ``AutoModel`` too."""
        self.model.save_pretrained(str(directory), safe_serialization=True)


def _head_module_names(model: PreTrainedModel) -> tuple[str, ...]:
    """Names of the MaskedLM model's children that form the MLM head, in the order the forward applies them."""
    order = HEAD_ORDER.get(getattr(model.config, "model_type", ""))
    if order is not None:
        return order
    body = model.base_model
    return tuple(name for name, child in model.named_children()
                 if child is not body and not isinstance(child, nn.modules.loss._Loss))


def _create_head(model: PreTrainedModel) -> None:
    """Fresh head: transform + LayerNorm re-initialised, decoder tied to the input embeddings, vocabulary bias 0."""
    decoder = model.get_output_embeddings()
    std = float(getattr(model.config, "initializer_range", 0.02))
    for name in _head_module_names(model):
        for module in getattr(model, name).modules():
            if module is decoder:
                continue
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
    model.config.tie_word_embeddings = True
    decoder.weight = model.get_input_embeddings().weight
    with torch.no_grad():
        for name in _head_module_names(model):
            for param_name, param in getattr(model, name).named_parameters():
                if param_name.endswith("bias") and param.shape == (decoder.weight.shape[0],):
                    param.zero_()


@torch.no_grad()
def _check_head_matches_model(encoder: Encoder) -> None:
    """Compare :meth:`Encoder.mlm_logits` on the body's output with the model's own logits (4 tokens)."""
    model = encoder.model
    was_training = model.training
    model.eval()
    try:
        vocab = encoder.vocab_size
        device = model.get_input_embeddings().weight.device
        ids = ((torch.arange(4, device=device) + 5) % vocab).unsqueeze(0)
        mask = torch.ones_like(ids)
        expected = model(input_ids=ids, attention_mask=mask).logits
        try:
            got: Tensor | None = encoder.mlm_logits(encoder(ids, mask).last_hidden_state)
        except (RuntimeError, TypeError, ValueError):
            got = None
    finally:
        model.train(was_training)
    if got is None or got.shape != expected.shape or not torch.allclose(got.float(), expected.float(),
                                                                         atol=1e-3, rtol=1e-3):
        raise ConfigError(
            f"unsupported MLM head layout for model type '{model.config.model_type}': applying the head modules "
            f"{list(encoder._head_names)} does not reproduce the model's logits; add the family to "
            "pretrieve.modeling.encoder.HEAD_ORDER")
