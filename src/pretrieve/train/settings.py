"""Every training setting, declared once and without torch: its type, its default, its help and its check.

This module is the only place a training setting's default is written. What reads it:

* the command line builds the options of ``pretrain``, ``finetune`` and ``reranker train`` from the fields
  (:func:`pretrieve.cli.options.settings_command`: the flag, its help and its shown default come from here);
* config files, recipes and the Python API are validated against the same dataclasses (:mod:`pretrieve.options`);
  a recipe stage's options are its trainer's settings, ``--smoke`` reads their defaults (only its caps are its own);
* the trainers (:mod:`pretrieve.train.pretrainer`, :mod:`~pretrieve.train.finetuner`,
  :mod:`~pretrieve.train.reranker`) subclass these with what a run does with them.

The classes: :class:`LoopConfig` (what every trainer shares: optimisation and bookkeeping), :class:`PretrainSettings`
(+ :class:`PretrainOptions`, the method overrides a file or the flags may add), :class:`FinetuneSettings` and
:class:`RerankerSettings`. A field is declared with :func:`setting` (default, help, how the command line shows it);
a trainer whose default differs from the loop's gives its own with :func:`tuned` (the declaration, help and check
stay the loop's): fine-tuning and the reranker train with other learning rates, batch sizes and epochs than
pre-training. The checks are the classes' ``validate`` / ``check`` methods, beside the fields.

:data:`BOOKKEEPING` settings do not change what a run computes (how it is logged, checkpointed and fed): they are
left out when a finished run's settings are compared. :data:`RESUMABLE_CHANGES` may also differ between an
interrupted run and its resumption. :func:`check_trackers` checks ``report_to``, the experiment trackers a run logs
to (accelerate's, by accelerate's names).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from pretrieve.data.records import TITLE_JOINS
from pretrieve.errors import ConfigError
from pretrieve.train.presets import PRESETS

if TYPE_CHECKING:
    import torch

SCHEDULES = ("linear", "cosine", "constant")
TRAIN_TOWERS = ("both", "query")
QUERY_SIDE_FIXED = ("stage", "groups", "representation", "similarity", "num_negatives", "passage_max_len",
                    "title_join", "passage_prompt", "tied", "in_batch", "gather", "bm25_depth", "grad_cache_chunk",
                    "alpha", "teacher_temperature")
"""Settings of passages and negatives that query-side fine-tuning (``train_towers: query``) does not use: the
passage side is the base model's and the negatives are the whole corpus (:mod:`pretrieve.train.query_side`)."""
STAGES = (1, 2, 3)
ON_UNKNOWN = ("error", "skip")


def setting(default: Any = None, help: str = "", *, flags: Sequence[str] = (), shown: str | None = None,
            cli: bool = True, multiple: bool = False, required: bool = False, factory: Any = None) -> Any:
    """A declared setting: its ``default`` and ``help``, and how the command line offers it (:mod:`pretrieve.cli
    .options`): ``flags`` (default ``--name-with-dashes``, ``--name/--no-name`` for a boolean), ``shown`` (the
    default as the help shows it, when the value does not say it: ``None`` meaning "the checkpoint's"), ``cli``
    (false: no flag), ``multiple`` (a repeatable option), ``required`` (given here or in the config file)."""
    metadata = {"help": help, "flags": tuple(flags), "shown": shown, "cli": cli, "multiple": multiple,
                "required": required}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def tuned(base: type, name: str, default: Any, help: str | None = None) -> Any:
    """A trainer's own default of a setting declared in ``base`` (its flags and shown default kept; ``help``, when
    given, replaces the base's)."""
    declared = {f.name: f for f in dataclasses.fields(base)}[name]
    metadata = dict(declared.metadata)
    if help is not None:
        metadata["help"] = help
    return field(default=default, metadata=metadata)


def default_of(schema: type, name: str) -> Any:
    """The declared default of the setting ``name`` of ``schema`` (a dataclass)."""
    declared = {f.name: f for f in dataclasses.fields(schema)}[name]
    if declared.default is not dataclasses.MISSING:
        return declared.default
    return declared.default_factory()   # type: ignore[misc]


PRECISION_HELP = ("auto | fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler; auto: bf16 where the hardware "
                  "computes it natively, else fp32).")
DIVERGENCE_HELP = ("Stop when the loss stays above this multiple of its running median (+ MAD, at least 1) "
                   "for 3 steps in a row (0: only non-finite losses).")
REPORT_TO_HELP = ("Experiment trackers besides OUT/logs.jsonl, comma-separated, by accelerate's names: tensorboard "
                  "(events in OUT/trackers/), wandb, mlflow, comet_ml, aim, clearml, dvclive, swanlab, trackio; all "
                  "(every installed one) or none.")


@dataclass
class LoopConfig:
    """Optimisation and bookkeeping settings common to every trainer (the defaults are pre-training's)."""

    batch_size: int = setting(32, "Examples per optimizer step, all processes together.")
    micro_batch_size: int | None = setting(None, "Examples per forward pass (gradient accumulation).",
                                           shown="batch_size / processes")
    lr: float = setting(1e-4, "Peak learning rate.")
    weight_decay: float = setting(0.01, "AdamW weight decay.")
    warmup_ratio: float = setting(0.1, "Warmup share of the steps.")
    warmup_steps: int | None = setting(None, "Warmup steps (overrides --warmup-ratio; the BoW authors: 4000 in "
                                       "pre-training).")
    schedule: str = setting("linear", "linear | cosine | constant.")
    min_lr_ratio: float | None = setting(None, "Floor of the linear/cosine decay, as a fraction of --lr (the BoW "
                                         "authors: cosine to 0.1).", shown="0")
    max_steps: int = setting(0, "Optimizer steps (0 = use --epochs).", flags=("--steps",))
    epochs: float = setting(1.0, "Epochs when --steps (config: max_steps) is 0.")
    max_grad_norm: float = setting(1.0, "Gradient clipping: the largest gradient norm.")
    bf16: bool = setting(False, "Deprecated: --precision bf16.")
    precision: str | None = setting(None, PRECISION_HELP, shown="fp32")
    tf32: bool = setting(False, "fp32 matrix products on CUDA tensor cores in TF32 (compute capability >= 8.0; "
                         "pretrieve.precision.set_tf32).")
    gradient_checkpointing: bool = setting(False, "Recompute the encoder's activations in the backward pass (less "
                                           "memory, ~30 % more compute).", flags=("--gradient-checkpointing",))
    seed: int = setting(42, "Seed of masking or sampling, data order and init.")
    save_every: int = setting(500, "Checkpoint every N steps.")
    keep_checkpoints: int = setting(2, "Checkpoints kept in OUT (the newest).")
    log_every: int = setting(10, "Log every N steps.")
    num_workers: int = setting(0, "DataLoader workers for collation.")
    resume: bool = setting(False, "Continue from the newest checkpoint in --out.", flags=("--resume",))
    show_progress: bool = setting(True, "Progress bars.", cli=False)
    overwrite: bool = setting(False, "Discard a previous run in --out (checkpoints, final/, logs) and start afresh.",
                              flags=("--overwrite",))
    reuse_from: str | None = setting(None, "Another run's --out: when it holds a finished run made with these "
                                     "settings from the same inputs (compared by content), copy its final/ instead "
                                     "of training (one process; pretrieve.train.run.TrainingRun.reuse).")
    allow_inexact_resume: bool = setting(False, "Resume even when a checkpoint's RNG state cannot be restored "
                                         "(warns; losses differ from an uninterrupted run).",
                                         flags=("--allow-inexact-resume",))
    divergence_factor: float = setting(10.0, DIVERGENCE_HELP)
    divergence_warmup: int = setting(5, "Normal losses the divergence guard's reference needs before 3 abnormal ones "
                                     "in a row stop the run (until then it takes this many in a row).")
    report_to: str | list[str] | None = setting(None, REPORT_TO_HELP, shown="none")

    def validate(self, world_size: int = 1) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule '{self.schedule}' (choose from {', '.join(SCHEDULES)})")
        self.resolved_precision()
        if self.min_lr_ratio is not None and not 0 <= self.min_lr_ratio < 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1), got {self.min_lr_ratio}")
        if self.min_lr_ratio and self.schedule == "constant":
            raise ConfigError("min_lr_ratio is the floor of a decaying schedule: use schedule linear or cosine")
        if self.warmup_steps is not None and (isinstance(self.warmup_steps, bool) or self.warmup_steps < 0):
            raise ConfigError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.batch_size < 1 or self.lr <= 0:
            raise ConfigError("batch_size must be ≥ 1 and lr > 0")
        micro = self.micro(world_size)
        if self.batch_size % micro or (self.batch_size // micro) % world_size:
            raise ConfigError(f"batch_size {self.batch_size} must split into micro-batches of {micro} "
                              f"evenly over {world_size} process(es)")
        if self.max_steps < 0 or self.epochs <= 0:
            raise ConfigError("max_steps must be ≥ 0 and epochs > 0")
        if self.divergence_factor < 0 or (0 < self.divergence_factor <= 1) or self.divergence_warmup < 1:
            raise ConfigError("divergence_factor must be > 1 (0 turns the check off) and divergence_warmup ≥ 1")
        self.trackers()
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues the run in the output directory and --overwrite discards it: "
                              "give one of them")

    def resolved_precision(self, device: "torch.device | None" = None) -> str:
        """``precision``, or the deprecated ``bf16`` flag's meaning when it is unset; ``auto`` is resolved for
        ``device`` when one is given (:func:`pretrieve.precision.resolve_precision`)."""
        if self.precision is None:
            return "bf16" if self.bf16 else "fp32"
        from pretrieve.precision import check_precision, resolve_precision   # lazy: torch

        check_precision(self.precision, training=True)
        if self.bf16 and self.precision != "bf16":
            raise ConfigError(f"bf16: true (deprecated) contradicts precision: {self.precision}; drop bf16")
        return self.precision if device is None else resolve_precision(self.precision, device, training=True)

    def trackers(self) -> list[str]:
        """The trackers ``report_to`` names, checked (:func:`check_trackers`)."""
        return check_trackers(self.report_to)

    def loop(self) -> "LoopConfig":
        """The loop settings alone (a trainer's config is these plus its own)."""
        return LoopConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoopConfig)})

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * total_steps)

    def micro(self, world_size: int) -> int:
        return self.micro_batch_size or max(1, self.batch_size // world_size)

    def total_steps(self, num_examples: int) -> int:
        steps_per_epoch = num_examples // self.batch_size
        if steps_per_epoch == 0:
            raise ConfigError(f"the data has {num_examples} examples, fewer than one batch of {self.batch_size}")
        return self.max_steps or max(1, math.ceil(self.epochs * steps_per_epoch))


# ------------------------------------------------------------------------------------------ pre-training
@dataclass
class PretrainSettings(LoopConfig):
    """One pre-training run: what to train on, the method, and the loop settings. Defaults follow Drop your Decoder
    (Ma et al. 2024) §4 where they fit a small machine; the recipes set the papers' values."""

    model: str = setting("", "Encoder to start from: local path, offline alias (minilm, splade-tiny) or hub name "
                         "(bert-base-uncased).", required=True)
    # "\\[": typer reads help as rich markup, where "[@SPLIT]" would be a tag and vanish
    corpus: str | list[str] = setting("", "Pre-training text: BEIR directory, corpus.jsonl, JSONL with 'text', plain "
                                      "text (one document per line), a datasets save_to_disk directory "
                                      "(DIR\\[@SPLIT]), or hf:NAME[:CONFIG]\\[@SPLIT]; several (repeated or "
                                      "comma-separated) are concatenated in order.", multiple=True, required=True)
    out: str = setting("", "Output directory (checkpoints, logs, final/).", required=True)
    method: Any = setting("bow", "Preset: " + ", ".join(PRESETS) + " (docs/methods.md); or a method YAML/JSON file.")
    max_len: int = setting(144, "Maximum tokens per example.")
    cache_dir: str | None = setting(None, "Where the tokenized corpus is cached.", shown="OUT/cache")
    num_proc: int | None = setting(None, "Processes that build the token cache.",
                                   shown="one per 16 MB of input, up to the CPUs")
    pack: bool = setting(False, "Pack consecutive sentences of each document into examples of up to --max-len "
                         "tokens (as RetroMAE/bowdpr prepare Wikipedia and BookCorpus; pretrieve.data.packing).")
    pack_across: list[str] | None = setting(None, "A --corpus source whose consecutive documents are packed into one "
                                            "another (BookCorpus's sentence rows); repeatable.", multiple=True)
    short_seq_prob: float = setting(0.0, "Packing: the probability that an example's target length is drawn "
                                    "uniformly from [3, max_len - 2].")

    def validate(self, world_size: int = 1) -> None:
        super().validate(world_size)
        if not 0 <= self.short_seq_prob < 1:
            raise ConfigError(f"short_seq_prob must be in [0, 1), got {self.short_seq_prob}")
        if not self.pack and (self.pack_across or self.short_seq_prob):
            raise ConfigError("pack_across and short_seq_prob are packing settings: set pack: true")
        if self.pack and getattr(self.method, "context", None) is not None:
            raise ConfigError("pack: the contextual methods pack their own spans (pretrieve.data.spans); drop pack")


@dataclass
class PretrainOptions(PretrainSettings):
    """What a pre-training config file, the flags or a recipe's ``pretrain`` stage may set: the run's settings plus
    the method overrides (applied to ``method``; :func:`pretrieve.train.run_config.resolve_pretrain_method`)."""

    objectives: str | list[str] | None = setting(None, "Comma-separated objectives, e.g. mlm,bow,enhanced.")
    weights: str | list[float] | None = setting(None, "Comma-separated weights, one per objective.")
    encoder_mask: float | None = setting(None, "Encoder mask ratio.")
    decoder_mask: float | None = setting(None, "Decoder mask ratio.")
    encoder_masker: str | None = setting(None, "Encoder masker kind (wwm, token, ...).")
    decoder_masker: str | None = setting(None, "Decoder masker kind (wwm, token, pmi, none).")
    bottleneck: str | None = setting(None, "Sentence vector the decoder objectives read: cls or mean (masked mean, "
                                     "for mean-pooled retrievers).", shown="cls")


#: The method overrides of :class:`PretrainOptions` (applied to the method, not settings of the run).
METHOD_OVERRIDES = tuple(f.name for f in dataclasses.fields(PretrainOptions)
                         if f.name not in {g.name for g in dataclasses.fields(PretrainSettings)})


# ------------------------------------------------------------------------------------------ training on groups
@dataclass
class GroupSettings(LoopConfig):
    """What the trainers on training groups (a query, its positives, its hard negatives) share."""

    num_negatives: int = setting(7, "Hard negatives per query per step (the papers fine-tune retrievers with 15).")
    max_groups: int | None = setting(None, "Train on the first N groups only (quick runs).")
    on_unknown: str = setting("error", "Document ids missing from the corpus: error | skip (drop and count them).")

    def check_groups(self, required: Sequence[str]) -> None:
        """The required paths are given, and the group settings are in range."""
        missing = [name for name in required if not getattr(self, name)]
        if missing:
            raise ConfigError(f"missing required option(s): {', '.join('--' + m for m in missing)}")
        if self.max_groups is not None and self.max_groups < 1:
            raise ConfigError(f"max_groups must be >= 1, got {self.max_groups}")
        if self.on_unknown not in ON_UNKNOWN:
            raise ConfigError(f"on_unknown must be 'error' or 'skip', got {self.on_unknown!r}")


@dataclass
class FinetuneSettings(GroupSettings):
    """One fine-tuning stage: data, model, representation, loss and loop settings (defaults:
    :mod:`pretrieve.train.finetuner`)."""

    model: str = setting("", "Pre-trained encoder to start from (every stage starts from it): path, offline alias "
                         "(minilm) or hub name.", flags=("--model", "-m"), required=True)
    data: str = setting("", "Collection in BEIR layout.", flags=("--data", "-d"), required=True)
    out: str = setting("", "Output directory (checkpoints, logs, final/).", flags=("--out", "-o"), required=True)
    split: str = setting("train", "Qrels split of the training queries.")
    stage: int = setting(1, "1: BM25 negatives; 2: mined negatives; 3: + distillation.")
    groups: str | None = setting(None, "Training groups JSONL; stage 1 builds BM25 groups when absent, stages 2/3 "
                                 "require it.")
    query_max_len: int = setting(32, "Query token limit.")
    passage_max_len: int = setting(144, "Passage token limit (title + text).")
    title_join: str = setting("space", "Between a passage's title and its text: space (title + ' ' + text) | sep "
                              "(title + the tokenizer's [SEP] + text, as RetroMAE's and Tevatron's pre-processing); "
                              "saved with the model, so that search joins them alike.")
    representation: str = setting("dense", "Representation type, e.g. dense, dupmae:cls:384,ot:260.")
    pooling: str | None = setting(None, "cls | mean; default: the checkpoint's sentence-transformers pooling, else "
                                  "cls (papers).")
    normalize: bool | None = setting(None, "L2-normalise vectors; default: whether the checkpoint has a Normalize "
                                     "module.")
    query_prompt: str | None = setting(None, "Text put before every query in training and saved with the model, so "
                                       "that search uses it too (E5/BGE-style 'query: '); default: the checkpoint's "
                                       "saved sentence-transformers query prompt; '': none.")
    passage_prompt: str | None = setting(None, "Text put before every passage in training and saved with the model; "
                                         "default: the checkpoint's saved sentence-transformers passage prompt; '': "
                                         "none.")
    similarity: str = setting("dot", "dot (papers) | cos.")
    temperature: float | None = setting(None, "Softmax temperature; default: 1 for dot products, 0.05 for "
                                        "cosine/normalised vectors.")
    tied: bool = setting(True, "Siamese towers (shared weights); --separate: separate towers.",
                         flags=("--tied/--separate",), shown="tied")
    train_towers: str = setting("both", "both | query: query-side fine-tuning — only the query tower trains, each "
                                "query scored against the whole corpus's vectors; the passage tower stays the base "
                                "model (saved byte for byte), so the corpus is encoded once, by the base model, into "
                                "the user cache that search reuses before and after.")
    alpha: float = setting(0.2, "Weight of the contrastive term in stage 3 (CDMAE, Li et al. 2023).")
    teacher_temperature: float = setting(1.0, "Temperature of the teacher's softmax (stage 3).")
    in_batch: bool = setting(True, "Use the other queries' passages as negatives too.", shown="in-batch")
    gather: bool = setting(True, "Cross-device negatives under DDP.", shown="gather")
    bm25_depth: int = setting(1000, "K1: BM25 depth of the stage-1 negatives.")
    grad_cache_chunk: int | None = setting(None, "Gradient caching: encode in sub-batches of this many texts (same "
                                           "gradients, one sub-batch of activation memory, one extra forward pass); "
                                           "None: off.")
    eval_steps: int = setting(0, "Evaluate on dev queries every N steps and at the end, logging the measures to "
                              "logs.jsonl and the trackers; final/ is then the best evaluated model by "
                              "--metric-for-best (0: no evaluation, final/ is the last step).")
    eval_data: str | None = setting(None, "Collection of the dev queries (name or path); default: --data (a recipe: "
                                    "its dev split).")
    eval_split: str | None = setting(None, "Qrels split of the dev queries; default: dev (a recipe: its dev split).")
    eval_measures: str = setting("nDCG@10,MRR@10,R@100", "Measures logged at each evaluation (ir_measures names, "
                                 "comma-separated).")
    metric_for_best: str = setting("nDCG@10", "The measure that picks the best evaluated model (higher is better; "
                                   "ties keep the earlier step).")
    # the loop settings whose defaults differ for fine-tuning (the papers: batch 64, lr 2e-5, 3 epochs)
    batch_size: int = tuned(LoopConfig, "batch_size", 16, "Queries per optimizer step, all processes together.")
    lr: float = tuned(LoopConfig, "lr", 2e-5, "Peak learning rate (papers: 2e-5).")
    epochs: float = tuned(LoopConfig, "epochs", 3.0, "Epochs when --steps (config: max_steps) is 0 (papers: 3).")

    def check(self) -> None:
        """Validate the settings that do not depend on files (raises :class:`ConfigError`)."""
        self.check_groups(("model", "data", "out"))
        if self.stage not in STAGES:
            raise ConfigError(f"stage must be 1, 2 or 3, got {self.stage}")
        if self.num_negatives < 0:
            raise ConfigError(f"num_negatives must be >= 0, got {self.num_negatives}")
        if self.num_negatives == 0 and not self.in_batch:
            raise ConfigError("num_negatives 0 without in-batch negatives leaves no negative at all")
        if self.stage == 3 and self.num_negatives == 0:
            raise ConfigError("stage 3 distils the teacher over each query's group: num_negatives must be >= 1")
        for name in ("query_max_len", "passage_max_len", "bm25_depth"):
            if getattr(self, name) < 2:
                raise ConfigError(f"{name} must be >= 2, got {getattr(self, name)}")
        if self.title_join not in TITLE_JOINS:
            raise ConfigError(f"title_join must be one of {', '.join(TITLE_JOINS)}, got {self.title_join!r}")
        self.check_evaluation()
        self.check_towers()
        if self.grad_cache_chunk is not None and (isinstance(self.grad_cache_chunk, bool)
                                                  or not isinstance(self.grad_cache_chunk, int)
                                                  or self.grad_cache_chunk < 1):
            raise ConfigError(f"grad_cache_chunk must be an integer >= 1, got {self.grad_cache_chunk!r}")

    def check_towers(self) -> None:
        """``train_towers``: one of :data:`TRAIN_TOWERS`; ``query`` refuses the :data:`QUERY_SIDE_FIXED` settings
        changed from their defaults (they would silently do nothing)."""
        if self.train_towers not in TRAIN_TOWERS:
            raise ConfigError(f"train_towers must be one of {', '.join(TRAIN_TOWERS)}, got {self.train_towers!r}")
        if self.train_towers == "query":
            changed = [name for name in QUERY_SIDE_FIXED if getattr(self, name) != default_of(type(self), name)]
            if changed:
                raise ConfigError(f"train_towers: query trains the query tower against the base model's vectors of "
                                  f"the whole corpus: {', '.join(changed)} do(es) not apply (leave at the default)")

    def check_evaluation(self) -> None:
        """The evaluation while training: a step count, known measures, dev queries other than the training ones."""
        if isinstance(self.eval_steps, bool) or not isinstance(self.eval_steps, int) or self.eval_steps < 0:
            raise ConfigError(f"eval_steps must be an integer >= 0, got {self.eval_steps!r}")
        if not self.eval_steps:
            return
        from pretrieve.evaluation.metrics import parse_measure, parse_measures   # lazy: scipy

        parse_measures(self.eval_measures)
        parse_measure(self.metric_for_best)
        if not self.eval_data and (self.eval_split or DEFAULT_EVAL_SPLIT) == self.split:
            raise ConfigError(f"eval_split: '{self.split}' is the split this run trains on; evaluate on held-out "
                              "queries (another split, or eval_data: another collection)")


DEFAULT_EVAL_SPLIT = "dev"


@dataclass
class RerankerSettings(GroupSettings):
    """Cross-encoder training: model, groups and loop settings (defaults: :mod:`pretrieve.train.reranker`)."""

    model: str = setting("", "Encoder to initialise the cross-encoder from: path, alias or hub name.",
                         flags=("--model", "-m"), required=True)
    data: str = setting("", "Collection in BEIR layout (passage texts).", flags=("--data", "-d"), required=True)
    groups: str = setting("", "Training groups JSONL (e.g. from `pretrieve mine`).", required=True)
    out: str = setting("", "Output directory (checkpoints, logs, final/).", flags=("--out", "-o"), required=True)
    max_len: int = setting(192, "Token limit of a (query, passage) pair.")
    # the loop settings whose defaults differ for the reranker (SimLM's reranker scripts: lr 3e-5)
    batch_size: int = tuned(LoopConfig, "batch_size", 16, "Queries per optimizer step, all processes together.")
    lr: float = tuned(LoopConfig, "lr", 3e-5)

    def check(self) -> None:
        """Validate the settings that do not depend on files (raises :class:`ConfigError`)."""
        self.check_groups(("model", "data", "groups", "out"))
        if self.num_negatives < 1:
            raise ConfigError("the listwise loss needs negatives: num_negatives must be >= 1, "
                              f"got {self.num_negatives}")
        if self.max_len < 4:
            raise ConfigError(f"max_len must be >= 4, got {self.max_len}")


# ------------------------------------------------------------------------------------------ trackers
NO_TRACKER = "none"


def check_trackers(report_to: str | Sequence[str] | None, where: str = "report_to") -> list[str]:
    """accelerate's tracker names in ``report_to`` (``"tensorboard,wandb"`` or a list; ``none`` names none), each
    once, in order. A name accelerate does not know, or a tracker whose package is not installed, is a
    :class:`ConfigError` naming ``where``."""
    given = report_to.split(",") if isinstance(report_to, str) else list(report_to or [])
    names = [str(name).strip().lower() for name in given]
    names = list(dict.fromkeys(name for name in names if name and name != NO_TRACKER))
    if not names:
        return names
    from accelerate.tracking import get_available_trackers   # lazy: accelerate
    from accelerate.utils import LoggerType   # lazy: accelerate

    known = LoggerType.list()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"choose from {NO_TRACKER}, {', '.join(known)}"
            raise ConfigError(f"{where}: unknown tracker '{name}'; {hint}")
        if name != "all" and LoggerType(name) not in get_available_trackers():
            raise ConfigError(f"{where}: the tracker '{name}' needs its package, which is not installed "
                              f"(pip install {name})")
    return names


# Settings that do not change what a run computes: how it is logged, checkpointed and fed, and how memory is
# traded for compute (gradient checkpointing and gradient caching give the same gradients).
BOOKKEEPING = ("resume", "show_progress", "save_every", "keep_checkpoints", "log_every", "num_workers", "reuse_from",
               "gradient_checkpointing", "grad_cache_chunk", "overwrite", "allow_inexact_resume", "divergence_factor",
               "divergence_warmup", "report_to")
# Settings that may also change between an interrupted run and its resumption: micro-batching splits the same
# global batch, the cache only holds tokenized text, and the step budget only says how far the run goes.
RESUMABLE_CHANGES = frozenset(BOOKKEEPING) | {"micro_batch_size", "cache_dir", "max_steps", "epochs"}
