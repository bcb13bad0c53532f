"""Pre-training: any method (maskers + objectives + weights) on the shared training loop.

:func:`pretrain` tokenizes the corpus once (cached), builds the encoder, the objectives of the method and
the collator, and hands them to :func:`pretrieve.train.loop.train` (data order, accumulation, DDP,
checkpoints and resume are documented there). The exported ``<out>/final`` holds the encoder loadable
with ``AutoModel.from_pretrained`` / ``AutoModelForMaskedLM.from_pretrained``, the decoder heads and
``method.json`` beside it for continued pre-training, the tokenizer, the resolved config and provenance.
When the starting checkpoint is a sentence-transformers model (all-MiniLM-L6-v2: mean pooling, then Normalize,
cosine similarity), ``final`` keeps its modules (``modules.json``, pooling, normalisation, similarity; copied by
:func:`keep_sentence_transformers_modules`), so fine-tuning, search and export pool and score as the base model did
— the log says so; a base whose modules cannot be kept is named in a warning.
A run whose ``final`` already exists is not trained again when its sidecar records the same settings and the
same inputs (the starting checkpoint's and the corpus's content), and is refused (naming what differs) when it
does not, as fine-tuning does (:class:`pretrieve.train.run.TrainingRun`).

Defaults follow Drop your Decoder (Ma et al. 2024) §4 where they fit a small machine (paper: AdamW, lr 3e-4, batch 2048,
max-len 512 on Wikipedia/BookCorpus, 144 on MS MARCO, 20 epochs); the recipes set the papers' values.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from pretrieve import artifacts
from pretrieve.ranks import built_once
from pretrieve.data.packing import Packing
from pretrieve.data.pretrain_text import TokenizedCorpus, resolve_text_sources
from pretrieve.data.spans import build_span_dataset
from pretrieve.errors import ConfigError
from pretrieve.io_utils import write_json
from pretrieve.modeling import Encoder
from pretrieve.modeling.pretrain_model import PretrainModel
from pretrieve.modeling.sentence_transformer import ModelFiles, read_sentence_transformers_config
from pretrieve.models import model_label, no_remote_code
from pretrieve.train.collator import PretrainCollator
from pretrieve.train.settings import BOOKKEEPING, PretrainSettings
from pretrieve.train.method import MethodConfig, resolve_method, trainer_module
from pretrieve.train.run import TrainingRun

logger = logging.getLogger(__name__)

CONFIG_FILE = "pretrain_config.json"
KIND = "pretrained-model"
# Not compared when deciding whether a finished run can be reused: bookkeeping (where files live is not a setting).
NOT_COMPARED = (*BOOKKEEPING, "micro_batch_size", "num_proc")   # num_proc: how fast the token cache is built
# Paths: the run's inputs are compared by content (artifacts.fingerprint), never by where they are.
PATH_SETTINGS = ("model", "corpus", "out", "cache_dir")


@dataclass
class PretrainConfig(PretrainSettings):
    """One pre-training run (its settings: :class:`~pretrieve.train.settings.PretrainSettings`)."""

    def packing(self) -> Packing | None:
        """The corpus's :class:`~pretrieve.data.packing.Packing` (None: each document chunked alone)."""
        return Packing(self.short_seq_prob, tuple(self.pack_across or ())) if self.pack else None


def model_max_length(config) -> int:
    """Longest input the encoder's position embeddings allow (RoBERTa reserves padding_idx + 1)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return 10**9
    if getattr(config, "model_type", "") in {"roberta", "xlm-roberta", "camembert", "longformer"}:
        return positions - (config.pad_token_id or 1) - 1
    return positions


def check_max_len(max_len: int, model_config) -> None:
    limit = model_max_length(model_config)
    if max_len > limit:
        raise ConfigError(f"max_len {max_len} exceeds the model's {limit} positions")


def resolved_method(config: PretrainConfig):
    return config.method if isinstance(config.method, MethodConfig) else resolve_method(config.method)


def run_settings(config: PretrainConfig, method) -> tuple[dict[str, Any], dict[str, Path]]:
    """``(settings, inputs)`` of a pre-training run: the resolved settings without paths, and its inputs (the
    starting checkpoint and the corpus file) to fingerprint by content."""
    resolved = dataclasses.asdict(config) | {"method": method.to_dict()}
    settings = {key: value for key, value in resolved.items() if key not in PATH_SETTINGS}
    # each source: a file or a save_to_disk directory by content, a hub name by name (one source: "corpus")
    sources = resolve_text_sources(config.corpus)
    keys = ["corpus"] if len(sources) == 1 else [f"corpus{i}" for i in range(len(sources))]
    inputs, named = artifacts.run_inputs(model=config.model,
                                         **{key: source.path or str(source) for key, source in zip(keys, sources)})
    for key, source in zip(keys, sources):
        if source.split:
            named[f"{key}_split"] = source.split
    return settings | named, inputs


def pretrain(config: PretrainConfig) -> Path:
    """Run (or resume) pre-training; returns the directory of the exported final model.

    The output directory is checked and locked first (:func:`pretrieve.outputs.writing`)."""
    return PretrainingRun(config).run()


class PretrainingRun(TrainingRun):
    """Pre-training as a :class:`~pretrieve.train.run.TrainingRun`: the corpus tokenized (and cached) once, the
    method's encoder + objectives, its collator (the maskers' statistics counted once)."""

    kind = KIND
    config_file = CONFIG_FILE
    not_compared = NOT_COMPARED

    def __init__(self, config: PretrainConfig):
        super().__init__(config)
        self.method = resolved_method(config)
        self.resolved = dataclasses.asdict(config) | {"method": self.method.to_dict()}
        self.tokenizer = None

    @property
    def description(self) -> str:
        return f"pretrain {self.method.name}"

    def describe(self) -> tuple[dict[str, Any], dict[str, Path]]:
        return run_settings(self.config, self.method)

    def check_model(self) -> None:
        check_max_len(self.config.max_len, AutoConfig.from_pretrained(self.config.model,
                                                                      **no_remote_code(self.config.model)))
        warn_if_training_an_unpooled_vector(self.config.model, self.method)

    def build_data(self):
        config, method = self.config, self.method
        self.tokenizer = tokenizer = AutoTokenizer.from_pretrained(config.model, **no_remote_code(config.model))
        cache_dir = config.cache_dir or str(self.out / "cache")
        show_progress = config.show_progress and self.accelerator.is_main_process

        def build():
            if method.context is not None:  # CoT-MAE / CoT-MoTE: (anchor, context) spans or (passage, query) pairs
                return build_span_dataset(method.context, config.corpus, tokenizer, config.max_len, cache_dir,
                                          seed=config.seed)
            return TokenizedCorpus.build(config.corpus, tokenizer, config.max_len, cache_dir,
                                         show_progress=show_progress, num_proc=config.num_proc,
                                         packing=config.packing())

        return built_once(build, "tokenize the pre-training corpus")

    def build_model(self) -> torch.nn.Module:
        if self.method.trainer is not None:  # e.g. TSDAE: its own model and collator on the same corpus, loop and export
            model, self._trainer_collator = trainer_module(self.method).build(self.config.model, self.method,
                                                                              self.tokenizer)
            return model
        return PretrainModel(Encoder.from_pretrained(self.config.model), self.method)

    def build_collator(self, model, dataset):
        if self.method.trainer is not None:
            return self._trainer_collator
        # the n-gram statistics of importance-aware maskers: counted once on the main process, cached
        config = self.config
        return built_once(lambda: PretrainCollator(self.tokenizer, self.method, model.required_features(),
                                                   config.max_len, config.seed, corpus=dataset),
                          "count the masking statistics")

    def config_record(self) -> dict[str, Any]:
        return self.resolved

    def export(self, unwrapped, directory: Path) -> None:
        unwrapped.save(directory)
        self.tokenizer.save_pretrained(directory)
        write_json(directory / CONFIG_FILE, self.resolved)
        keep_sentence_transformers_modules(self.config.model, directory)


def warn_if_training_an_unpooled_vector(base: str, method: MethodConfig) -> bool:
    """Warn (and return True) when ``method``'s decoder objectives would train the [CLS] vector (``bottleneck:
    cls``) of a base that retrieves with its mean-pooled vector (a sentence-transformers model such as
    all-MiniLM-L6-v2): that pre-training leaves the vector fine-tuning and search use as it was."""
    if method.bottleneck != "cls" or all(objective.name in ("mlm", "mlm_views") for objective in method.objectives):
        return False
    try:
        declared = read_sentence_transformers_config(ModelFiles(base))
    except Exception:  # noqa: BLE001 - an unreadable config: nothing declared, nothing to warn about
        return False
    if declared is None or "mean" not in declared.pooling:
        return False
    logger.warning("%s retrieves with its mean-pooled vector, but %s trains the [CLS] vector (bottleneck: cls), which "
                   "it never uses: this pre-training will not help its retrieval; pre-train with bottleneck: mean "
                   "(method={'base': '%s', 'bottleneck': 'mean'}, --bottleneck mean) to train the vector it pools",
                   model_label(base), method.name, method.name)
    return True


#: The files of a sentence-transformers model besides the transformer's own, and of each module after it.
ST_ROOT_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
ST_MODULE_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")


def keep_sentence_transformers_modules(base: str, directory: Path) -> bool:
    """Copy the sentence-transformers modules of ``base`` (a local folder or a hub model) after its root
    ``Transformer`` — pooling, Dense, Normalize — and its similarity into the pre-trained ``directory``, whose
    transformer replaces the base's; returns whether they were kept. The files are sentence-transformers' own,
    copied as they are. A base without ``modules.json`` has nothing to keep; one whose input module is not a root
    ``Transformer`` (a ``Router``) is named in a warning."""
    if (directory / "modules.json").exists():   # the method wrote its own (TSDAE: sentence-transformers' save)
        return True
    files = ModelFiles(base)
    modules = files.json("modules.json")
    if modules is None:
        return False
    chain = sorted(modules, key=lambda m: m.get("idx", 0)) if isinstance(modules, list) else []
    if not chain or not str(chain[0].get("type", "")).endswith(".Transformer") or chain[0].get("path", "") != "":
        logger.warning("%s is a sentence-transformers model whose modules cannot be kept (its input module is not a "
                       "Transformer at the root): the pre-trained model has none, so fine-tuning uses its own "
                       "defaults (cls pooling, dot product) unless given pooling=/normalize=", base)
        return False
    for name in ST_ROOT_FILES:
        source = files.file(name)
        if source is not None:
            shutil.copyfile(source, directory / name)
    for module in chain[1:]:
        path = str(module.get("path", ""))
        (directory / path).mkdir(parents=True, exist_ok=True)
        for name in ST_MODULE_FILES:
            source = files.file(f"{path}/{name}")
            if source is not None:
                shutil.copyfile(source, directory / path / name)
    kept = read_sentence_transformers_config(ModelFiles(str(directory)))
    logger.info("the pre-trained model keeps the sentence-transformers modules of %s: %s pooling%s, %s similarity "
                "(fine-tuning, search and export use them; pass pooling=/normalize= to fine-tuning to change them)",
                model_label(base),
                "+".join(kept.pooling), ", normalised" if kept.normalize else "",
                kept.similarity or ("cosine" if kept.normalize else "dot"))
    return True
