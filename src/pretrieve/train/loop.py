"""The training loop shared by pre-training, dual-encoder fine-tuning and reranker training.

Contract: a *dataset* (``len`` + ``dataset[i]``), a *collator* ``collator(examples, generator) -> batch``
(dict of tensors, batch dimension first) and a *model* ``model(batch) -> (loss, logs)``. The loop owns:

* **Data order.** Epoch ``e`` visits the examples in ``numpy.random.default_rng(seed + e)`` permutation
  order, ``batch_size`` examples per optimizer step (the last incomplete batch of an epoch is dropped).
  A step's batch is cut into micro-batches of ``micro_batch_size``; process ``r`` of ``W`` takes
  micro-batches ``r, r+W, ...`` and accumulates their gradients. All collation randomness (masking,
  negative sampling) of micro-batch ``j`` at step ``s`` comes from a generator seeded with
  ``(seed, s, j)``. A run is therefore a function of its seed: ``resume`` continues exactly, and any
  split of the same micro-batches over processes × accumulation (2 processes, or 1 process
  accumulating 2) gives the same losses — for losses local to a micro-batch. A loss that looks across
  processes (cross-device in-batch negatives in fine-tuning) deliberately sees more negatives under DDP
  than under accumulation.
  Datasets that re-draw part of an example every time it is drawn (CoT-MAE's context spans) expose
  ``dataset.draw(index, epoch)``, which the loop calls instead of ``dataset[index]``; every micro-batch also
  carries ``training_progress`` (``step / total_steps``, a 0-d float tensor) for objectives whose weight
  follows the schedule (the BoW authors' cosine decay of the BoW weight).
* **Optimisation.** AdamW (no weight decay on biases and LayerNorm weights), warmup (``warmup_ratio`` or
  ``warmup_steps``) + linear/cosine/constant schedule (transformers' schedulers), optionally decaying to a
  floor ``min_lr_ratio`` instead of 0 (the BoW authors' ``cosine`` with ``min_lr_ratio 0.1``), gradient
  clipping. Each micro-batch's loss is the model's own mean and gradients are averaged over micro-batches
  (usual DDP semantics).
* **Precision** (``precision: fp32 | bf16 | fp16``; ``bf16: true`` is the deprecated spelling of ``precision:
  bf16``): ``torch.autocast`` around the forward pass, and for fp16 a ``torch.amp.GradScaler`` (dynamic loss
  scaling; its state is checkpointed). The loop owns both, on every device, rather than accelerate's
  ``mixed_precision``, which on the CPU silently trains fp16 runs in fp32; on CUDA it is the same autocast +
  GradScaler accelerate would use (:class:`MixedPrecision`).
* **GPU efficiency.** Micro-batches are pinned (CUDA) and copied with ``non_blocking``; DataLoader workers
  (``num_workers``) collate ahead of the GPU; per-step logs stay on the device and are copied to the host (and
  all-reduced) once per ``log_every`` steps, so no step waits for the host (the fp16 GradScaler's overflow
  check is the one per-step sync left, inherent to dynamic loss scaling); DDP searches for unused parameters
  only when the model says it may leave some unused (:func:`leaves_parameters_unused`);
  ``gradient_checkpointing`` recomputes the encoder's activations in the backward pass
  (:func:`enable_gradient_checkpointing`); a model with ``grad_cache_chunk`` set (fine-tuning with in-batch
  negatives) is stepped by :func:`pretrieve.train.grad_cache.grad_cached_step`; under several processes on
  one node each process uses ``cores / processes`` threads unless ``OMP_NUM_THREADS`` says otherwise.
* **Logging.** ``logs.jsonl`` (every ``log_every`` steps: each logged loss, learning rate, samples/s)
  and TensorBoard scalars under ``tb/``; a progress bar with ETA.
* **Checkpoints.** Every ``save_every`` steps, atomically (:mod:`pretrieve.train.checkpoint`);
  ``resume=True`` restarts from the newest complete one — only when that checkpoint was written with the
  same settings (``run_info["config"]``, bookkeeping such as logging, checkpoint frequency, micro-batch size
  and the step budget aside): resuming under other settings would silently mix two runs, so it is refused
  with the differing keys (:func:`check_resumable`).
* **Export.** ``export(unwrapped_model, directory)`` writes the final artefact into a temporary
  directory that is renamed to ``<out>/final`` only when complete; its sidecar (:mod:`pretrieve.artifacts`)
  records the run's settings and the fingerprints of its inputs, and :func:`finished_run` asks it whether a
  finished run may be reused (settings compare content, never where files live: a copied output directory is
  still current).
* **Guards.** A re-run on an output that holds checkpoints is refused unless it says ``resume`` or
  ``overwrite`` (:func:`check_restart`); a resume that cannot restore every process's RNG state stops with
  :class:`~pretrieve.errors.InexactResumeError` unless ``allow_inexact_resume`` (:func:`load_checkpoint`); a
  loss that is non-finite or more than ``divergence_factor`` times the running median of the losses before it
  stops the run with :class:`~pretrieve.errors.TrainingDiverged` and removes the checkpoints written from the
  first abnormal step on, so the newest kept checkpoint is one from before the divergence
  (:class:`DivergenceGuard`).

Distributed training: launch the same command with ``accelerate launch`` or ``torchrun``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping

import numpy as np
import torch

from pretrieve import artifacts
from pretrieve.errors import ConfigError, InexactResumeError, StaleOutputError, TrainingDiverged
from pretrieve.io_utils import write_json
from pretrieve.provenance import provenance
from pretrieve.train import checkpoint as ckpt

logger = logging.getLogger(__name__)

SCHEDULES = ("linear", "cosine", "constant")
PRECISIONS = ("fp32", "bf16", "fp16")
PROGRESS_KEY = "training_progress"
"""Batch key of ``step / total_steps`` (0-d float tensor), added to every micro-batch by :class:`StepBatches`
(read by objectives with a weight schedule, e.g. :data:`pretrieve.modeling.objectives.bow.PROGRESS`)."""
_FINITE_KEY = "_finite"


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
    """fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler); None = bf16 when ``bf16`` is set, else fp32."""
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
    allow_inexact_resume: bool = False
    divergence_factor: float = 10.0
    divergence_warmup: int = 5

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
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues the run in the output directory and --overwrite discards it: "
                              "give one of them")

    def resolved_precision(self) -> str:
        """``precision``, or the deprecated ``bf16`` flag's meaning when it is unset."""
        if self.precision is None:
            return "bf16" if self.bf16 else "fp32"
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision '{self.precision}' (choose from {', '.join(PRECISIONS)})")
        if self.bf16 and self.precision != "bf16":
            raise ConfigError(f"bf16: true (deprecated) contradicts precision: {self.precision}; drop bf16")
        return self.precision

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * total_steps)

    def micro(self, world_size: int) -> int:
        return self.micro_batch_size or max(1, self.batch_size // world_size)

    def total_steps(self, num_examples: int) -> int:
        steps_per_epoch = num_examples // self.batch_size
        if steps_per_epoch == 0:
            raise ConfigError(f"the data has {num_examples} examples, fewer than one batch of {self.batch_size}")
        return self.max_steps or max(1, math.ceil(self.epochs * steps_per_epoch))


def micro_batch_seed(seed: int, step: int, micro: int) -> int:
    """Seed of the collation generator of micro-batch ``micro`` at optimizer step ``step``."""
    return (seed * 1_000_003 + step * 1009 + micro) % (2**63 - 1)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(seed + epoch).permutation(num_examples)


class StepBatches(torch.utils.data.IterableDataset):
    """Yields ``(step, [collated micro-batches of this process])`` from ``start_step`` on.

    With ``num_workers`` > 0, worker ``w`` produces the steps ``s ≡ w (mod num_workers)``; the
    DataLoader's round-robin over workers restores step order. Examples come from ``dataset.draw(index,
    epoch)`` when the dataset has it (re-drawn per epoch), else ``dataset[index]``; each micro-batch gets
    :data:`PROGRESS_KEY`.
    """

    def __init__(self, dataset, collator, batch_size: int, micro_batch_size: int, seed: int, start_step: int,
                 total_steps: int, rank: int, world_size: int):
        self.dataset = dataset
        self.collator = collator
        self.batch_size = batch_size
        self.micro = micro_batch_size
        self.seed = seed
        self.start_step = start_step
        self.total_steps = total_steps
        self.rank = rank
        self.world_size = world_size
        self.steps_per_epoch = len(dataset) // batch_size

    def __iter__(self) -> Iterator[tuple[int, list[dict[str, torch.Tensor]]]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        order, order_epoch = None, -1
        for step in range(self.start_step, self.total_steps):
            if step % workers != worker:
                continue
            epoch, within = divmod(step, self.steps_per_epoch)
            if epoch != order_epoch:
                order, order_epoch = epoch_order(len(self.dataset), self.seed, epoch), epoch
            indices = order[within * self.batch_size:(within + 1) * self.batch_size]
            yield step, [self.collate(step, j, indices) for j in self.my_micro_batches()]

    def my_micro_batches(self) -> range:
        return range(self.rank, self.batch_size // self.micro, self.world_size)

    def collate(self, step: int, j: int, indices: np.ndarray) -> dict[str, torch.Tensor]:
        epoch = step // self.steps_per_epoch
        draw = getattr(self.dataset, "draw", None)
        rows = indices[j * self.micro:(j + 1) * self.micro]
        examples = [draw(int(i), epoch) for i in rows] if draw is not None else [self.dataset[int(i)] for i in rows]
        generator = torch.Generator().manual_seed(micro_batch_seed(self.seed, step, j))
        batch = self.collator(examples, generator=generator)
        batch[PROGRESS_KEY] = torch.tensor(step / self.total_steps, dtype=torch.float32)
        return batch


def build_optimizer(model: torch.nn.Module, config: LoopConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr)


def build_scheduler(optimizer, config: LoopConfig, total_steps: int):
    """transformers' schedulers; with ``min_lr_ratio`` the decay ends at that fraction of the peak instead of 0
    (cosine: transformers' ``cosine_with_min_lr``; linear: :func:`linear_with_floor`, the BoW authors' formula)."""
    import functools

    from torch.optim.lr_scheduler import LambdaLR
    from transformers import get_scheduler

    warmup = config.warmup(total_steps)
    floor = config.min_lr_ratio or 0.0
    if floor and config.schedule == "cosine":
        return get_scheduler("cosine_with_min_lr", optimizer, num_warmup_steps=warmup, num_training_steps=total_steps,
                             scheduler_specific_kwargs={"min_lr_rate": floor})
    if floor and config.schedule == "linear":
        return LambdaLR(optimizer, functools.partial(linear_with_floor, warmup=warmup, total=total_steps, floor=floor))
    name = {"constant": "constant_with_warmup"}.get(config.schedule, config.schedule)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)


def linear_with_floor(step: int, *, warmup: int, total: int, floor: float) -> float:
    """Learning-rate factor: linear warm-up to 1, then linear decay from 1 to ``floor`` at ``total``."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup)) * (1 - floor) + floor


class LogWriter:
    """Writes ``logs.jsonl`` and TensorBoard scalars (main process only)."""

    def __init__(self, out_dir: Path, enabled: bool):
        self.enabled = enabled
        self.path = out_dir / "logs.jsonl"
        self.tb = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tb"))
            except ImportError:
                logger.info("tensorboard not installed: logging to logs.jsonl only")

    def write(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **values}) + "\n")
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(key, value, step)

    def truncate_after(self, step: int) -> None:
        """Drop log lines past ``step`` (written after the checkpoint we resume from)."""
        if not self.enabled or not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in lines))

    def reset(self) -> None:
        if self.enabled and self.path.exists():
            self.path.unlink()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_logs(out_dir: str | Path) -> list[dict[str, float]]:
    """The ``logs.jsonl`` lines of a run, in step order."""
    path = Path(out_dir) / "logs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def make_accelerator(config: LoopConfig):
    """The accelerate ``Accelerator`` of a run (CPU gloo or CUDA NCCL under ``torchrun``/``accelerate launch``).

    Mixed precision is the loop's (:class:`MixedPrecision`), not accelerate's. DDP's unused-parameter search is
    switched on or off per model by :func:`train` (:func:`leaves_parameters_unused`), before ``prepare``. Under
    several processes per node, each gets ``cores / processes`` intra-op threads (:func:`set_threads_per_rank`).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    config.resolved_precision()  # a bad precision fails here, before any model is built
    if config.bf16:
        logger.warning("bf16: true is deprecated; write precision: bf16 (--precision bf16)")
    # Without an accelerator, accelerate only sets up multi-process (gloo) training under torchrun /
    # accelerate launch when told it runs on the CPU.
    # step_scheduler_with_optimizer=False: our batch_size is already global, so the schedule advances
    # once per optimizer step (accelerate would otherwise step it once per process).
    accelerator = Accelerator(mixed_precision="no", kwargs_handlers=[DistributedDataParallelKwargs()],
                              cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False)
    set_threads_per_rank()
    return accelerator


def threads_per_rank(cores: int, local_processes: int) -> int:
    """Intra-op threads for one of ``local_processes`` processes sharing ``cores`` cores (at least 1)."""
    return max(1, cores // max(1, local_processes))


def set_threads_per_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """Under several processes per node (``LOCAL_WORLD_SIZE`` > 1, set by torchrun and accelerate launch), give
    each ``cores / processes`` threads — unless ``OMP_NUM_THREADS`` was set, which wins. Returns the number set."""
    environ = os.environ if environ is None else environ
    local = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if local <= 1 or "OMP_NUM_THREADS" in environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = threads_per_rank(cores, local)
    torch.set_num_threads(threads)
    return threads


def leaves_parameters_unused(model: torch.nn.Module) -> bool:
    """Whether DDP must search for parameters a step leaves without gradient (``find_unused_parameters``).

    Models say so with ``may_leave_parameters_unused()`` (pre-training: from the objectives and experts;
    fine-tuning: from the towers and representation; see those classes); a model that does not say is searched.
    """
    decide = getattr(model, "may_leave_parameters_unused", None)
    return True if decide is None else bool(decide())


def enable_gradient_checkpointing(model: torch.nn.Module) -> int:
    """Activation checkpointing in every outermost transformers model inside ``model`` (non-reentrant, so the
    recomputed forward replays the same dropout masks); returns how many were switched on.

    Refused for query/passage experts (CoT-MoTE): their routing is set per forward call, so the recomputed
    forward of a query batch would be routed as the passage batch encoded last.
    """
    from transformers import PreTrainedModel

    from pretrieve.modeling.mote import is_mote

    found = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    outermost = [m for m in found if not any(m is not other and any(m is sub for sub in other.modules())
                                                 for other in found)]
    if any(is_mote(m) for m in found):
        raise ConfigError("gradient_checkpointing is not supported with query/passage experts (CoT-MoTE): the "
                          "recomputed forward would be routed to the wrong expert")
    enabled = 0
    for m in outermost:
        if getattr(m, "supports_gradient_checkpointing", False):
            if hasattr(m, "activation_checkpointing_enable"):          # transformers ≥ 5.x's name
                m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            enabled += 1
    if not enabled:
        raise ConfigError("gradient_checkpointing: the model holds no transformers model that supports it")
    return enabled


def precision_settings(precision: str, device_type: str) -> tuple[torch.dtype | None, bool]:
    """``(autocast dtype or None, use a GradScaler)`` of ``precision`` on ``device_type`` ("cpu", "cuda", ...).

    fp16 always gets a GradScaler (its gradients underflow without loss scaling); bf16 has fp32's range and
    needs none. The same settings on every device: torch supports fp16 autocast and GradScaler on the CPU too.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return dtype, precision == "fp16"


class MixedPrecision:
    """Autocast and (fp16) dynamic loss scaling for one device type, with ``torch.amp``."""

    def __init__(self, precision: str = "fp32", device_type: str = "cpu"):
        self.precision = precision
        self.device_type = device_type
        self.dtype, scaled = precision_settings(precision, device_type)
        self.scaler = torch.amp.GradScaler(device_type) if scaled else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        """``optimizer.step()``; with a GradScaler, skipped when the gradients overflowed, and the scale updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


# Settings that do not change what a run computes: how it is logged, checkpointed and fed, and how memory is
# traded for compute (gradient checkpointing and gradient caching give the same gradients).
BOOKKEEPING = ("resume", "show_progress", "save_every", "keep_checkpoints", "log_every", "num_workers",
               "gradient_checkpointing", "grad_cache_chunk", "overwrite", "allow_inexact_resume", "divergence_factor",
               "divergence_warmup")
# Settings that may also change between an interrupted run and its resumption: micro-batching splits the same
# global batch, the cache only holds tokenized text, and the step budget only says how far the run goes.
RESUMABLE_CHANGES = frozenset(BOOKKEEPING) | {"micro_batch_size", "cache_dir", "max_steps", "epochs"}


def finished_run(out: str | Path, kind: str, settings: Mapping[str, Any], inputs: Mapping[str, str | Path],
                 ignore: Collection[str] = ()) -> Path | None:
    """``<out>/final`` when it holds a complete run of ``kind`` made with these settings from these inputs (its
    sidecar says so, :func:`pretrieve.artifacts.check`); None when there is no finished run (or only an
    incomplete one); a :class:`StaleOutputError` naming what differs when it was made otherwise.

    ``settings`` keys in ``ignore`` are not compared; inputs (model weights, corpus, groups) compare by content.
    """
    final = Path(out) / "final"
    status = artifacts.check(final, settings, inputs, kind=kind, ignore=ignore)
    if status.current:
        return final
    sidecar = artifacts.read_sidecar(final) if status.exists else None
    if sidecar is not None and sidecar.get("kind") != kind:
        raise StaleOutputError(f"{final} holds a {sidecar.get('kind')}, not a {kind}; choose another --out", out)
    if status.differing:
        recorded = sidecar.get("settings", {}) if sidecar else {}
        changed = artifacts.differing_values(recorded, settings, ignore)
        what = (f"different settings ({artifacts.describe_changes(recorded, settings, changed)})" if changed
                else f"different inputs ({', '.join(status.differing)} changed)")
        raise StaleOutputError(f"{final} holds a finished run with {what}; choose another --out, or rerun with "
                               "--overwrite to replace it", out)
    if status.exists:
        logger.info("%s is not a complete, recorded run (%s): training (again)", final, status.reason)
    return None


def run_inputs(**paths: str | Path | None) -> tuple[dict[str, Path], dict[str, str]]:
    """Split a run's inputs into local files/directories (fingerprinted by content) and names (a hub model):
    ``({"model": Path(...)}, {})`` or ``({}, {"model": "bert-base-uncased"})``; None values are left out."""
    local, named = {}, {}
    for name, value in paths.items():
        if value is None:
            continue
        if Path(str(value)).exists():
            local[name] = Path(str(value))
        else:
            named[name] = str(value)
    return local, named


def check_restart(out: str | Path, config: LoopConfig, files: Collection[str] = ()) -> None:
    """Before a run starts without ``resume``: refuse an output directory that holds a previous run's checkpoints
    (naming ``--resume`` and ``--overwrite``); with ``overwrite``, remove that run (checkpoints, ``final/``,
    logs and ``files``) first."""
    out = Path(out)
    previous = [out / name for name in ("checkpoints", "final", "logs.jsonl", "tb", *files) if (out / name).exists()]
    if config.resume or not previous:
        return
    if config.overwrite:
        for path in previous:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        logger.info("--overwrite: removed the previous run in %s", out)
        return
    checkpoints = ckpt.list_checkpoints(out)
    if checkpoints:
        raise ConfigError(f"{out} holds checkpoints of a previous run (up to step {checkpoints[-1][0]}); continue it "
                          "with --resume, or start afresh with --overwrite (deletes them), or choose another --out")


def check_resumable(checkpoint: Path, state: Mapping[str, Any], run_info: dict[str, Any]) -> None:
    """Refuse to resume from ``checkpoint`` (its trainer ``state``) when it was written under other settings
    than ``run_info``'s."""
    recorded, current = state.get("config"), run_info.get("config")
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return
    differing = artifacts.differing_values(recorded, current, RESUMABLE_CHANGES)
    if differing:
        changes = artifacts.describe_changes(recorded, current, differing)
        raise StaleOutputError(f"{checkpoint} was written by a run with other settings ({changes}); resume with "
                               f"the same settings, or start afresh with --overwrite or in another output "
                               "directory", checkpoint.parent.parent)


def train(model: torch.nn.Module, dataset, collator, config: LoopConfig, out_dir: str | Path,
          export: Callable[[torch.nn.Module, Path], None], run_info: dict[str, Any],
          accelerator=None, description: str = "train", record: Mapping[str, Any] | None = None) -> Path:
    """Train ``model`` and export it to ``<out_dir>/final``; returns that directory.

    ``record`` (``{"kind", "settings", "inputs"}``) describes the export in its sidecar (:mod:`pretrieve.artifacts`),
    which :func:`finished_run` reads to decide whether the run is finished and current.
    """
    from tqdm.auto import tqdm

    accelerator = accelerator or make_accelerator(config)
    world, rank = accelerator.num_processes, accelerator.process_index
    config.validate(world)
    out = Path(out_dir)
    total_steps = config.total_steps(len(dataset))
    micro = config.micro(world)
    accum = config.batch_size // micro // world

    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if accelerator.ddp_handler is not None:
        accelerator.ddp_handler.find_unused_parameters = leaves_parameters_unused(model)
    precision = MixedPrecision(config.resolved_precision(), accelerator.device.type)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if precision.scaler is not None:
        accelerator.register_for_checkpointing(precision.scaler)   # exact resume of fp16 loss scaling

    start_step = 0
    writer = LogWriter(out, accelerator.is_main_process)
    resume_from = ckpt.latest_checkpoint(out) if config.resume else None
    if resume_from is not None:
        resumed_state = ckpt.read_state(resume_from)
        check_resumable(resume_from, resumed_state, run_info)
        load_checkpoint(accelerator, resume_from, config.allow_inexact_resume)
        start_step = resumed_state["step"]
        writer.truncate_after(start_step)
        logger.info("resumed from %s (step %d)", resume_from, start_step)
    else:
        writer.reset()
    state = {**run_info, "total_steps": total_steps}

    batches = torch.utils.data.DataLoader(
        StepBatches(dataset, collator, config.batch_size, micro, config.seed, start_step, total_steps, rank, world),
        batch_size=None, num_workers=config.num_workers, pin_memory=accelerator.device.type == "cuda",
        # A private generator: the DataLoader draws a base seed when iteration starts, which must not
        # consume the global RNG (dropout) — otherwise a resumed run would drift from the original.
        generator=torch.Generator().manual_seed(config.seed))
    progress = tqdm(total=total_steps, initial=start_step, desc=description, unit="step",
                    disable=not (config.show_progress and accelerator.is_main_process))
    model.train()
    window = LogWindow(accelerator)
    window_start = time.perf_counter()
    guard = DivergenceGuard(config.divergence_factor, config.divergence_warmup)
    for step, micro_batches in batches:
        done = step + 1
        window.add(step, train_step(model, micro_batches, optimizer, scheduler, accelerator, accum,
                                    config.max_grad_norm, precision))
        progress.update(1)
        log_now = done % config.log_every == 0 or done == total_steps
        save_now = bool(config.save_every) and done % config.save_every == 0 and done < total_steps
        if log_now or save_now:   # the guard sees every step's loss, copied to the host once per window
            problem = window.check_divergence(guard)
            if problem:
                progress.close()
                stop_diverged(accelerator, out, done, guard.first_abnormal_step(done), problem)
        if log_now:
            elapsed = time.perf_counter() - window_start
            steps = window.steps
            values = window.flush()
            progress.set_postfix(loss=f"{values['loss']:.4f}")
            writer.write(done, values | {"lr": scheduler.get_last_lr()[0],
                                         "samples_per_s": steps * config.batch_size / elapsed})
            window_start = time.perf_counter()
        if save_now:
            keep = config.keep_checkpoints if guard.steady(done - config.save_every) else 0   # 0: no pruning
            ckpt.save_checkpoint(accelerator, out, done, state, keep)
    progress.close()
    writer.close()

    final_dir = out / "final"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        record = dict(record or {"kind": "model"})
        with artifacts.write_dir(final_dir, record["kind"], record.get("settings"), record.get("inputs")) as tmp:
            export(accelerator.unwrap_model(model), tmp)
            write_json(tmp / "provenance.json", provenance({"seed": config.seed, "steps": total_steps}))
    accelerator.wait_for_everyone()
    return final_dir


# ------------------------------------------------------------------------------------------------ guards
class DivergenceGuard:
    """Watches the loss of every step. A loss that is non-finite, or more than ``factor`` times the median of the
    normal losses among the last ``window`` steps, is *abnormal* (abnormal losses never enter the reference, so it
    stays the pre-divergence level while the loss explodes). Divergence is a non-finite loss, or an abnormal one
    once ``warmup`` normal losses were seen, or ``warmup`` abnormal losses in a row (an explosion inside the
    warm-up). ``factor`` 0 checks only for non-finite losses. Every pretrieve loss is a cross-entropy/KL in nats (a
    few units at the start), so a tenfold jump over the running median is far outside ordinary step-to-step noise.
    Abnormal losses date the divergence and stop checkpoint pruning (:meth:`steady`)."""

    def __init__(self, factor: float = 10.0, warmup: int = 5, window: int = 100):
        self.factor = factor
        self.warmup = warmup
        self.window = window
        self.history: list[tuple[int, float, bool]] = []   # (step, loss, abnormal)

    def check(self, step: int, loss: float) -> str | None:
        """None while the run is sane; a description of the divergence otherwise."""
        recent = self.history[-self.window:]
        normal = [value for _, value, abnormal in recent if not abnormal]
        median = statistics.median(normal) if normal else 0.0
        ratio_exceeded = bool(self.factor) and median > 0 and loss > self.factor * median
        self.history.append((step, float(loss), not math.isfinite(loss) or ratio_exceeded))
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        in_a_row = len(self.history) >= self.warmup and all(a for _, _, a in self.history[-self.warmup:])
        if ratio_exceeded and (len(normal) >= self.warmup or in_a_row):
            return (f"the loss {loss:.4g} is {loss / median:.3g} times the median {median:.4g} of the "
                    f"{len(normal)} normal losses before it (divergence_factor {self.factor:g})")
        return None

    def first_abnormal_step(self, default: int) -> int:
        """The first abnormal step among the last ``window`` (the start of the divergence; a loss may explode
        during the warm-up, before the check is armed), ``default`` when there is none."""
        return next((step for step, _, abnormal in self.history[-self.window:] if abnormal), default)

    def steady(self, since: int) -> bool:
        """No abnormal loss from step ``since`` on: older checkpoints may be pruned (otherwise they are kept, so a
        divergence still finds one from before it)."""
        return not any(abnormal for step, _, abnormal in self.history if step >= since)


def stop_diverged(accelerator, out: Path, step: int, first_bad: int, problem: str) -> None:
    """Remove the checkpoints whose weights produced (or followed) the first abnormal loss and stop the run.

    The loss logged at step ``s`` is computed with the weights after ``s - 1`` updates, i.e. those of
    checkpoint ``step-(s-1)``: checkpoints from ``first_bad - 1`` on are removed.
    """
    accelerator.wait_for_everyone()
    removed = []
    if accelerator.is_main_process:
        for saved, path in ckpt.list_checkpoints(out):
            if saved >= first_bad - 1:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(saved)
    accelerator.wait_for_everyone()
    kept = ckpt.latest_checkpoint(out)
    where = f"step {step}" + (f" (abnormal from step {first_bad})" if first_bad < step else "")
    detail = (f"removed the checkpoints of steps {', '.join(map(str, removed))}; " if removed else "")
    last = f"the newest kept checkpoint is {kept.name}" if kept else "no checkpoint from before it is kept"
    raise TrainingDiverged(f"training diverged at {where}: {problem}; {detail}{last}. Lower the learning rate "
                           "(--lr) and start again with --overwrite or in another --out (divergence_factor: 0 "
                           "turns the ratio check off)")


def load_checkpoint(accelerator, checkpoint: Path, allow_inexact: bool = False) -> None:
    """``accelerator.load_state(checkpoint)``, checked: every process's RNG state must be restored exactly
    (accelerate only logs, at INFO, when it cannot read a ``random_states_<rank>.pkl``). A process that could not
    restore it fails the resume on every process (:class:`InexactResumeError` naming the file), or, with
    ``allow_inexact``, gets a warning and continues (its losses will differ from the uninterrupted run's).
    A model, optimizer or scheduler state that cannot be loaded always stops the resume."""
    rng_file = checkpoint / f"random_states_{accelerator.process_index}.pkl"
    problem = None
    expected = None
    try:
        expected = torch.load(rng_file, map_location="cpu", weights_only=False)
        for key in ("random_state", "numpy_random_seed", "torch_manual_seed"):
            if key not in expected:
                raise ValueError(f"it holds no '{key}'")
    except Exception as exc:  # noqa: BLE001 - any unreadable state is reported the same way
        problem = f"{rng_file}: cannot restore the random number generators' state ({exc.__class__.__name__}: {exc})"
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as exc:  # noqa: BLE001 - a missing or corrupt model/optimizer/scheduler file: cannot continue
        raise InexactResumeError(f"{checkpoint}: cannot restore the training state ({exc.__class__.__name__}: "
                                 f"{str(exc)[:200]}); resume from an earlier checkpoint (remove this one) or start "
                                 "afresh with --overwrite") from None
    if problem is None and not (torch.equal(torch.get_rng_state(), expected["torch_manual_seed"])
                                and random.getstate() == expected["random_state"]):
        problem = f"{rng_file}: the random number generators' state was not restored"
    failed = torch.tensor([0.0 if problem is None else 1.0], device=accelerator.device)
    if accelerator.num_processes > 1:
        failed = accelerator.reduce(failed, "sum")
    if float(failed.item()) == 0:
        return
    problem = problem or f"another process could not restore its random number generators from {checkpoint}"
    if not allow_inexact:
        raise InexactResumeError(f"{problem}: the run would not continue exactly as it was interrupted. Resume "
                                 "from an earlier checkpoint (remove this one), start afresh with --overwrite, or "
                                 "accept an inexact continuation with --allow-inexact-resume")
    logger.warning("INEXACT RESUME (--allow-inexact-resume): %s; the losses from here on will differ from an "
                   "uninterrupted run's", problem)


def train_step(model, micro_batches, optimizer, scheduler, accelerator, accum: int, max_grad_norm: float,
               precision: MixedPrecision | None = None) -> dict[str, torch.Tensor]:
    """One optimizer step over this process's micro-batches.

    Returns this process's logs as 0-d tensors on the device (means over its micro-batches, plus a finiteness
    flag of the losses), without copying anything to the host: :class:`LogWindow` does that once per log line.
    A model with ``grad_cache_chunk`` set is stepped by :func:`pretrieve.train.grad_cache.grad_cached_step`
    (sub-batch re-forward with cached representation gradients; gradients averaged over processes by hand).
    """
    precision = precision or MixedPrecision("fp32", accelerator.device.type)
    unwrapped = accelerator.unwrap_model(model)
    chunk = getattr(unwrapped, "grad_cache_chunk", None)
    sums: dict[str, torch.Tensor] = {}
    finite = torch.ones((), dtype=torch.bool, device=accelerator.device)
    for i, batch in enumerate(micro_batches):
        batch = {key: value.to(accelerator.device, non_blocking=True) for key, value in batch.items()}
        if chunk:
            from pretrieve.train.grad_cache import grad_cached_step

            loss, micro_logs = grad_cached_step(unwrapped, batch, chunk, precision, 1.0 / accum)
        else:
            last = i == len(micro_batches) - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                with precision.autocast():
                    loss, micro_logs = model(batch)
                accelerator.backward(precision.scale(loss / accum))
        loss = loss.detach()
        finite &= torch.isfinite(loss)
        for key, value in {"loss": loss, **micro_logs}.items():
            value = torch.as_tensor(value, device=accelerator.device).detach().float()
            sums[key] = sums[key] + value if key in sums else value
    if chunk and accelerator.num_processes > 1:
        from pretrieve.train.grad_cache import average_gradients

        average_gradients(unwrapped)
    precision.unscale_(optimizer)
    if max_grad_norm and max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    precision.step(optimizer)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    logs = {key: value / len(micro_batches) for key, value in sums.items()}
    logs[_FINITE_KEY] = finite.float()
    return logs


class LogWindow:
    """The steps between two log lines: their logs summed on the device, copied to the host (and averaged over
    processes with one all-reduce) only by :meth:`flush`, which also stops the run on a non-finite loss."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.step_losses: list[tuple[int, torch.Tensor]] = []   # (step, loss) not yet seen by the guard

    def add(self, step: int, logs: Mapping[str, torch.Tensor]) -> None:
        for key, value in logs.items():
            self.sums[key] = self.sums[key] + value if key in self.sums else value
            self.counts[key] = self.counts.get(key, 0) + 1
        self.steps += 1
        self.first_step = step if self.first_step is None else self.first_step
        self.last_step = step
        self.step_losses.append((step, logs["loss"]))

    def check_divergence(self, guard: "DivergenceGuard") -> str | None:
        """Feed the losses of the steps since the last check (averaged over processes, copied to the host in one
        transfer) to ``guard`` in step order; its description of a divergence, or None."""
        if not self.step_losses:
            return None
        steps = [step for step, _ in self.step_losses]
        losses = torch.stack([loss for _, loss in self.step_losses])
        if self.accelerator.num_processes > 1:
            losses = self.accelerator.reduce(losses, "mean")
        self.step_losses = []
        for step, loss in zip(steps, losses.tolist()):
            problem = guard.check(step + 1, loss)
            if problem:
                return problem
        return None

    def _host_means(self) -> dict[str, float]:
        keys = sorted(self.sums)
        values = torch.stack([self.sums[key] / self.counts[key] for key in keys])
        if self.accelerator.num_processes > 1:
            values = self.accelerator.reduce(values, "mean")
        return dict(zip(keys, values.tolist()))

    def _raise_if_not_finite(self, means: Mapping[str, float]) -> None:
        if means.get(_FINITE_KEY, 1.0) < 1.0:
            shown = ", ".join(f"{key} {value:.4g}" for key, value in means.items() if key != _FINITE_KEY)
            raise FloatingPointError(f"non-finite loss between steps {self.first_step + 1} and {self.last_step + 1} "
                                     f"(window means: {shown}); the last checkpoint is from before it")

    def flush(self) -> dict[str, float]:
        """Means over the window's steps (and processes); the window is emptied."""
        if not self.steps:
            return {}
        means = self._host_means()
        self._raise_if_not_finite(means)
        self.__init__(self.accelerator)
        means.pop(_FINITE_KEY, None)
        return means
