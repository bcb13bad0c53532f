"""Pre-training: any method (maskers + objectives + weights) on the shared training loop.

:func:`pretrain` tokenizes the corpus once (cached), builds the encoder, the objectives of the method and
the collator, and hands them to :func:`pretrieve.train.loop.train` (data order, accumulation, DDP,
checkpoints and resume are documented there). The exported ``<out>/final`` holds the encoder loadable
with ``AutoModel.from_pretrained`` / ``AutoModelForMaskedLM.from_pretrained``, the decoder heads and
``method.json`` beside it for continued pre-training, the tokenizer, the resolved config and provenance.
A run whose ``final`` already exists is not trained again when its sidecar records the same settings and the
same inputs (the starting checkpoint's and the corpus's content), and is refused (naming what differs) when it
does not, as fine-tuning does (:func:`pretrieve.train.loop.finished_run`).

Defaults follow Drop your Decoder (Ma et al. 2024) §4 where they fit a small machine (paper: AdamW, lr 3e-4, batch 2048,
max-len 512 on Wikipedia/BookCorpus, 144 on MS MARCO, 20 epochs); the recipes set the papers' values.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pretrieve import artifacts, outputs, ranks
from pretrieve.errors import ConfigError
from pretrieve.io_utils import write_json
from pretrieve.train.loop import BOOKKEEPING, LoopConfig, check_restart, finished_run, make_accelerator, run_inputs, train

logger = logging.getLogger(__name__)

CONFIG_FILE = "pretrain_config.json"
KIND = "pretrained-model"
# Not compared when deciding whether a finished run can be reused: bookkeeping (where files live is not a setting).
NOT_COMPARED = (*BOOKKEEPING, "micro_batch_size", "num_proc")   # num_proc: how fast the token cache is built
# Paths: the run's inputs are compared by content (artifacts.fingerprint), never by where they are.
PATH_SETTINGS = ("model", "corpus", "out", "cache_dir")


@dataclass
class PretrainConfig(LoopConfig):
    """One pre-training run: what to train on, the method, and the loop settings."""

    model: str = ""
    corpus: str = ""
    out: str = ""
    method: Any = "bow"
    max_len: int = 144
    cache_dir: str | None = None
    num_proc: int | None = None  # processes that build the token cache (default: by input size, up to the CPUs)

    def loop(self) -> LoopConfig:
        return LoopConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoopConfig)})


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
    from pretrieve.train.method import MethodConfig, resolve_method

    return config.method if isinstance(config.method, MethodConfig) else resolve_method(config.method)


def run_settings(config: PretrainConfig, method) -> tuple[dict[str, Any], dict[str, Path]]:
    """``(settings, inputs)`` of a pre-training run: the resolved settings without paths, and its inputs (the
    starting checkpoint and the corpus file) to fingerprint by content."""
    from pretrieve.data.pretrain_text import resolve_text_source

    resolved = dataclasses.asdict(config) | {"method": method.to_dict()}
    settings = {key: value for key, value in resolved.items() if key not in PATH_SETTINGS}
    source = resolve_text_source(config.corpus)   # a file or a save_to_disk directory by content; a hub name by name
    inputs, named = run_inputs(model=config.model, corpus=source.path or str(source))
    if source.split:
        named["corpus_split"] = source.split
    return settings | named, inputs


def pretrain(config: PretrainConfig) -> Path:
    """Run (or resume) pre-training; returns the directory of the exported final model.

    The output directory is checked and locked first (:func:`pretrieve.outputs.writing`)."""
    needed, largest = outputs.training_space(config.model, config.keep_checkpoints)
    with outputs.writing(config.out, needed_bytes=needed, largest_file=largest):
        return _pretrain(config)


def _pretrain(config: PretrainConfig) -> Path:
    from transformers import AutoTokenizer, AutoConfig

    from pretrieve.data.pretrain_text import TokenizedCorpus
    from pretrieve.modeling import Encoder
    from pretrieve.modeling.pretrain_model import PretrainModel
    from pretrieve.train.collator import PretrainCollator

    method = resolved_method(config)
    out = Path(config.out)
    resolved = dataclasses.asdict(config) | {"method": method.to_dict()}
    settings, inputs = run_settings(config, method)
    done = None if config.overwrite else finished_run(out, KIND, settings, inputs, ignore=NOT_COMPARED)
    if done is not None:
        logger.info("%s is complete with the same settings; not training again", done)
        return done
    check_restart(out, config, files=(CONFIG_FILE,))
    fingerprints = {name: artifacts.fingerprint(path) for name, path in inputs.items()}
    check_max_len(config.max_len, AutoConfig.from_pretrained(config.model))
    accelerator = make_accelerator(config)
    config.validate(accelerator.num_processes)

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    cache_dir = config.cache_dir or str(out / "cache")

    def build_dataset(show_progress: bool):
        if method.context is not None:  # CoT-MAE / CoT-MoTE: (anchor, context) spans or (passage, query) pairs
            from pretrieve.data.spans import build_span_dataset

            return build_span_dataset(method.context, config.corpus, tokenizer, config.max_len, cache_dir,
                                      seed=config.seed)
        return TokenizedCorpus.build(config.corpus, tokenizer, config.max_len, cache_dir, show_progress=show_progress,
                                     num_proc=config.num_proc)

    # The main process tokenizes (and caches) first; the others then read its cache.
    dataset = None
    if accelerator.is_main_process:
        with ranks.guard("tokenize the pre-training corpus"):
            dataset = build_dataset(config.show_progress)
    ranks.barrier("tokenize the pre-training corpus")
    if dataset is None:
        dataset = build_dataset(False)

    torch.manual_seed(config.seed)
    model = PretrainModel(Encoder.from_pretrained(config.model), method)
    def build_collator() -> PretrainCollator:
        return PretrainCollator(tokenizer, method, model.required_features(), config.max_len, config.seed,
                                corpus=dataset)

    # Same for the n-gram statistics of importance-aware maskers: counted once on the main process, cached.
    collator = None
    if accelerator.is_main_process:
        with ranks.guard("count the masking statistics"):
            collator = build_collator()
    ranks.barrier("count the masking statistics")
    if collator is None:
        collator = build_collator()

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / CONFIG_FILE, resolved)

    def export(unwrapped, directory: Path) -> None:
        unwrapped.save(directory)
        tokenizer.save_pretrained(directory)
        write_json(directory / CONFIG_FILE, resolved)

    return train(model, dataset, collator, config.loop(), out, export, {"config": settings | {"inputs": fingerprints}},
                 accelerator=accelerator, description=f"pretrain {method.name}",
                 record={"kind": KIND, "settings": settings, "inputs": inputs})
