"""Training the cross-encoder reranker on groups (re-ranking and teacher scores: :mod:`pretrieve.retrieval.rerank`).

:func:`train_reranker` — listwise cross-entropy over each query's group (positive + ``num_negatives`` hard
negatives, no in-batch negatives; CDMAE (Li et al. 2023) §3.4) as a :class:`~pretrieve.train.run.TrainingRun` on
the shared loop (:mod:`pretrieve.train.loop`); the model is exported to ``<out>/final``
(``AutoModelForSequenceClassification`` + tokenizer + :data:`~pretrieve.modeling.cross_encoder.CONFIG_FILE`).

Inputs are ``[CLS] query [SEP] title + " " + text [SEP]`` cut to ``max_len`` tokens (longest side first, which
cuts the passage for any usual query; :func:`pretrieve.modeling.cross_encoder.tokenize_pairs`). Defaults: lr 3e-5
(SimLM's reranker scripts, ELECTRA-base), 7 negatives per query (group 8), batch 16 queries, 1 epoch, ``max_len``
192. Passages are read from the memory-mapped Arrow corpus (:class:`pretrieve.data.arrow.CorpusTexts`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from transformers import AutoTokenizer

from pretrieve import artifacts
from pretrieve.data.arrow import CorpusTexts, groups_dataset
from pretrieve.ranks import built_once
from pretrieve.data.beir import Corpus
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import TrainingGroup
from pretrieve.errors import InputError
from pretrieve.io_utils import write_json
from pretrieve.modeling.cross_encoder import CONFIG_FILE, CrossEncoder, tokenize_pairs
from pretrieve.models import no_remote_code, resolve_model
from pretrieve.options import build
from pretrieve.train.collator import sampled_groups
from pretrieve.train.loop import read_logs
from pretrieve.train.run import TrainingRun
from pretrieve.train.run_config import validated_values
from pretrieve.train.settings import BOOKKEEPING, RerankerSettings

logger = logging.getLogger(__name__)

KIND = "reranker"
# Paths: the run's inputs are compared by content (artifacts.fingerprint), never by where they are.
PATH_SETTINGS = ("model", "data", "groups", "out")


@dataclass
class RerankerConfig(RerankerSettings):
    """Cross-encoder training (its settings and their checks: :class:`~pretrieve.train.settings.RerankerSettings`)."""


# ------------------------------------------------------------------------------------------- batches
class PairGroupCollator:
    """Groups → ``[B·G]`` (query, passage) pairs, each group positive first, + ``group_size``."""

    def __init__(self, tokenizer, corpus: "Corpus | CorpusTexts", num_negatives: int, max_len: int = 192):
        self.tokenizer = tokenizer
        self.corpus = corpus
        self.num_negatives = num_negatives
        self.max_len = max_len

    def __call__(self, groups: Sequence[TrainingGroup],
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        queries: list[str] = []
        ids: list[str] = []
        for group, positive, negatives in sampled_groups(groups, self.num_negatives, generator):
            for doc_id in [group.positives[positive]] + [group.negatives[i] for i in negatives]:
                queries.append(group.query)
                ids.append(doc_id)
        passages = self.corpus.texts_of(ids)
        encoded = tokenize_pairs(self.tokenizer, queries, passages, self.max_len)
        batch = {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded}
        batch["group_size"] = torch.tensor(1 + self.num_negatives)
        return batch


# ------------------------------------------------------------------------------------------ training
def train_reranker(config: RerankerConfig) -> Path:
    """Train (resume, or skip when finished with the same settings) a reranker; returns ``<out>/final``.

    The output directory is checked and locked first (:func:`pretrieve.outputs.writing`)."""
    return RerankerRun(config).run()


class RerankerRun(TrainingRun):
    """Cross-encoder training as a :class:`~pretrieve.train.run.TrainingRun`: corpus and groups built once, a
    :class:`CrossEncoder` and its :class:`PairGroupCollator`; a reranker still at chance level is reported."""

    kind = KIND
    config_file = CONFIG_FILE
    description = "train reranker"

    def check(self) -> None:
        self.config.check()

    def describe(self) -> tuple[dict[str, Any], dict[str, Path]]:
        config = self.config
        self.model_path = resolve_model(config.model)
        if not Path(config.groups).exists():
            raise InputError("training groups file not found", path=config.groups)
        settings = {k: v for k, v in dataclasses.asdict(config).items()
                    if k not in BOOKKEEPING and k not in PATH_SETTINGS}
        inputs, named = artifacts.run_inputs(model=self.model_path, corpus=BeirCollection(Path(config.data)).corpus_path,
                                   groups=config.groups)
        self.settings = settings | named
        return self.settings, inputs

    def build_data(self):
        # Corpus and groups as memory-mapped Arrow datasets (built by rank 0, then opened by every rank): memory
        # does not grow with the number of passages or groups.
        config = self.config
        corpus_data = built_once(BeirCollection(Path(config.data)).corpus_dataset)
        groups = built_once(lambda: groups_dataset(config.groups, corpus=corpus_data, on_unknown=config.on_unknown),
                            "read the training groups")
        self.corpus = CorpusTexts(corpus_data)
        self.groups = groups.trainable(need_negatives=True, max_groups=config.max_groups)
        return self.groups

    def build_model(self) -> torch.nn.Module:
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, **no_remote_code(self.model_path))
        return CrossEncoder.from_pretrained(self.model_path)

    def build_collator(self, model, dataset) -> "PairGroupCollator":
        return PairGroupCollator(self.tokenizer, self.corpus, self.config.num_negatives, self.config.max_len)

    def config_record(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def export(self, unwrapped, directory: Path) -> None:
        unwrapped.save(directory)
        self.tokenizer.save_pretrained(str(directory))
        write_json(directory / CONFIG_FILE, {"settings": self.settings, "groups_stats": self.groups.stats.as_dict()})

    def finish(self, final: Path) -> None:
        if self.accelerator.is_main_process:
            warn_if_not_learning(read_logs(self.out), 1 + self.config.num_negatives, self.out)


def warn_if_not_learning(logs: Sequence[Mapping[str, float]], group_size: int, out: Path,
                         tolerance: float = 0.05) -> bool:
    """Warn (and return True) when the last logged loss is still within ``tolerance`` of ``ln(G)``.

    ``ln(G)`` is the listwise loss of a scorer that gives every pair of a group the same score: a reranker
    ending there ranks by noise and would make re-ranked runs and stage-3 teacher scores worse than the
    retriever's. A freshly created classification head starts there (its logits are ~0.02 apart), so small
    budgets at small learning rates can end before training leaves the plateau.
    """
    losses = [entry["loss"] for entry in logs if "loss" in entry]
    if not losses or group_size < 2:
        return False
    chance = float(np.log(group_size))
    if losses[-1] < (1.0 - tolerance) * chance:
        return False
    logger.warning("%s: the reranker's last loss %.4f is at chance level (ln %d = %.4f): it has not learned to "
                   "rank; train longer or with a larger learning rate (e.g. --lr 3e-4 for a small model)",
                   out, losses[-1], group_size, chance)
    return True


def build_reranker_config(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                          resume: bool = False, where: str = "reranker config") -> RerankerConfig:
    """A :class:`RerankerConfig` from a config file's values overridden by the given flags (validated and coerced
    by :mod:`pretrieve.options`)."""
    values = validated_values(RerankerConfig, file_values, flags, where)
    values["resume"] = resume or bool(values.get("resume", False))
    config = build(RerankerConfig, values)
    config.check()
    return config
