"""The settings every trainer shares (:class:`LoopConfig`) and which of them are bookkeeping.

:data:`BOOKKEEPING` settings do not change what a run computes (how it is logged, checkpointed and fed): they are
left out when a finished run's settings are compared. :data:`RESUMABLE_CHANGES` may also differ between an
interrupted run and its resumption. :func:`check_trackers` checks ``report_to``, the experiment trackers a run
logs to (accelerate's, by accelerate's names).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from accelerate.tracking import get_available_trackers
from accelerate.utils import LoggerType

from pretrieve.errors import ConfigError
from pretrieve.precision import check_precision, resolve_precision

if TYPE_CHECKING:
    import torch

SCHEDULES = ("linear", "cosine", "constant")


@dataclass
class LoopConfig:
    """Optimisation and bookkeeping settings common to every trainer."""

    batch_size: int = 32
    micro_batch_size: int | None = None
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    warmup_steps: int | None = None
    """Warm-up steps; overrides ``warmup_ratio`` when set (the BoW authors: 4000 in pre-training)."""
    schedule: str = "linear"
    min_lr_ratio: float | None = None
    """Floor of the linear/cosine decay as a fraction of ``lr`` (the BoW authors: 0.1); None = 0."""
    max_steps: int = 0
    epochs: float = 1.0
    max_grad_norm: float = 1.0
    bf16: bool = False
    """Deprecated: ``precision: bf16``."""
    precision: str | None = None
    """auto | fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler; auto: bf16 where the hardware computes it
    natively, else fp32); None = bf16 when ``bf16`` is set, else fp32."""
    tf32: bool = False
    """fp32 matrix products on CUDA tensor cores in TF32 (compute capability ≥ 8.0; pretrieve.precision.set_tf32)."""
    gradient_checkpointing: bool = False
    """Recompute the encoder's activations in the backward pass (less memory, ~30 % more compute)."""
    seed: int = 42
    save_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    num_workers: int = 0
    resume: bool = False
    show_progress: bool = True
    overwrite: bool = False
    reuse_from: str | None = None
    """Another run's output directory: when it holds a finished run made with this run's settings from the same
    inputs (the freshness rule), its ``final`` is copied in instead of training (one process; see
    :meth:`pretrieve.train.run.TrainingRun.reuse`)."""
    allow_inexact_resume: bool = False
    divergence_factor: float = 10.0
    """A loss above this multiple of the running level (median + MAD, at least 1 nat) for several steps in a row
    is a divergence (:class:`pretrieve.train.guard.DivergenceGuard`); 0: only non-finite losses stop a run."""
    divergence_warmup: int = 5
    """Normal losses the guard's reference needs before 3 abnormal ones in a row stop the run (until then it takes
    this many in a row)."""
    report_to: str | list[str] | None = None
    """Experiment trackers besides ``logs.jsonl``: accelerate's names (tensorboard, wandb, mlflow, comet_ml, aim,
    clearml, dvclive, swanlab, trackio, or all: every installed one), comma-separated or a list; None or none: no
    tracker (:func:`check_trackers`)."""

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


NO_TRACKER = "none"


def check_trackers(report_to: str | Sequence[str] | None, where: str = "report_to") -> list[str]:
    """accelerate's tracker names in ``report_to`` (``"tensorboard,wandb"`` or a list; ``none`` names none), each
    once, in order. A name accelerate does not know, or a tracker whose package is not installed, is a
    :class:`ConfigError` naming ``where``."""
    given = report_to.split(",") if isinstance(report_to, str) else list(report_to or [])
    names = [str(name).strip().lower() for name in given]
    names = list(dict.fromkeys(name for name in names if name and name != NO_TRACKER))
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
