"""The cross-encoder reranker: ``[CLS] query [SEP] passage [SEP]`` → one relevance score.

:class:`CrossEncoder` wraps ``AutoModelForSequenceClassification(num_labels=1)`` (the papers' teacher is
initialised from ELECTRA-base following SimLM; any encoder checkpoint works — the classification head is created
when the checkpoint has none). Training (CDMAE, Li et al. 2023, §3.4) is the retriever's listwise contrastive loss with the
parametric score ``s_ce(q, d) = CE(concat(q, d))`` and **no in-batch negatives**: each query's group of
``G`` pairs (positive first) is a softmax over its own ``G`` scores
(:func:`pretrieve.modeling.losses.listwise_ce`), as in RetroMAE's and SimLM's rerankers.

Batch layout for ``forward``: ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) of ``[B·G, L]`` pairs,
each query's ``G`` pairs contiguous with the positive first, and ``group_size`` (a 0-d tensor holding ``G``).
Pairs are tokenised by :func:`tokenize_pairs` (training and scoring alike); a trained reranker records its pair
length in :data:`CONFIG_FILE` (:func:`trained_max_len`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn
from transformers import AutoModelForSequenceClassification

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.losses import listwise_ce
from pretrieve.models import named_weights_errors, no_remote_code

#: The settings a trained reranker is exported with (written by :mod:`pretrieve.train.reranker`).
CONFIG_FILE = "reranker_config.json"
DEFAULT_MAX_LEN = 192


def tokenize_pairs(tokenizer, queries: Sequence[str], passages: Sequence[str], max_len: int,
                   padding: bool = True) -> dict[str, Any]:
    """``[CLS] q [SEP] p [SEP]`` encodings of parallel lists (tensors when ``padding``, else lists)."""
    return tokenizer(list(queries), list(passages), truncation="longest_first", max_length=max_len,
                     padding=padding, return_tensors="pt" if padding else None)


def trained_max_len(model_dir: str | Path) -> int:
    """The pair length a reranker was trained with (its :data:`CONFIG_FILE`), else 192."""
    path = Path(str(model_dir)) / CONFIG_FILE
    if path.exists():
        value = json.loads(path.read_text(encoding="utf-8")).get("settings", {}).get("max_len")
        if value:
            return int(value)
    return DEFAULT_MAX_LEN


class CrossEncoder(nn.Module):
    """A sequence-pair scorer with one output; ``forward(batch) -> (listwise loss, logs)``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        if getattr(model.config, "num_labels", 1) != 1:
            raise ConfigError(f"a reranker needs one output score, the model has {model.config.num_labels} labels")
        self.model = model

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path) -> "CrossEncoder":
        """Load a checkpoint; a fresh one-output classification head is created when it has none."""
        try:
            with named_weights_errors(name_or_path):
                model = AutoModelForSequenceClassification.from_pretrained(str(name_or_path), num_labels=1,
                                                                           **no_remote_code(name_or_path))
        except OSError as exc:
            raise InputError(f"cannot load model: {exc}", path=str(name_or_path)) from None
        return cls(model)

    load = from_pretrained

    def may_leave_parameters_unused(self) -> bool:
        """A sequence-classification model uses all its parameters on every batch (BERT: pooler + classifier;
        ELECTRA: its classification head), so DDP need not search for unused ones."""
        return False

    @property
    def config(self):
        return self.model.config

    def score(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """``[N]`` relevance scores of ``N`` tokenized (query, passage) pairs."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        return self.model(**inputs).logits.squeeze(-1)

    def group_scores(self, batch: Mapping[str, Tensor]) -> Tensor:
        """``[B, G]`` scores of a training batch (positive in column 0)."""
        scores = self.score(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        size = int(batch["group_size"])
        if size < 1 or scores.shape[0] % size:
            raise ValueError(f"{scores.shape[0]} pairs cannot be split into groups of {size}")
        return scores.view(-1, size)

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        scores = self.group_scores(batch)
        loss = listwise_ce(scores)
        with torch.no_grad():
            accuracy = (scores.detach().argmax(dim=1) == 0).float().mean()
        return loss, {"accuracy": accuracy}

    def save(self, directory: str | Path) -> Path:
        """``save_pretrained`` (safetensors): loads with ``AutoModelForSequenceClassification`` and :meth:`load`."""
        self.model.save_pretrained(str(directory), safe_serialization=True)
        return Path(directory)
