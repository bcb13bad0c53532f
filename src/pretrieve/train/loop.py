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
* **Optimisation.** AdamW (no weight decay on biases and LayerNorm weights), warmup +
  linear/cosine/constant schedule (transformers' schedulers), gradient clipping, bf16 autocast via
  accelerate. Each micro-batch's loss is the model's own mean and gradients are averaged over
  micro-batches (usual DDP semantics).
* **Logging.** ``logs.jsonl`` (every ``log_every`` steps: each logged loss, learning rate, samples/s)
  and TensorBoard scalars under ``tb/``; a progress bar with ETA.
* **Checkpoints.** Every ``save_every`` steps, atomically (:mod:`pretrieve.train.checkpoint`);
  ``resume=True`` restarts from the newest complete one — only when that checkpoint was written with the
  same settings (``run_info["config"]``, bookkeeping such as logging, checkpoint frequency, micro-batch size
  and the step budget aside): resuming under other settings would silently mix two runs, so it is refused
  with the differing keys (:func:`check_resumable`).
* **Export.** ``export(unwrapped_model, directory)`` writes the final artefact into a temporary
  directory that is renamed to ``<out>/final`` only when complete, so its existence means the run
  finished.

Distributed training: launch the same command with ``accelerate launch`` or ``torchrun``.
A non-finite loss stops the run with :class:`FloatingPointError` (the last checkpoint stays usable).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping

import numpy as np
import torch

from pretrieve.errors import ConfigError, StaleOutputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.provenance import provenance
from pretrieve.train import checkpoint as ckpt

logger = logging.getLogger(__name__)

SCHEDULES = ("linear", "cosine", "constant")


@dataclass
class LoopConfig:
    """Optimisation and bookkeeping settings common to every trainer."""

    batch_size: int = 32
    micro_batch_size: int | None = None
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    schedule: str = "linear"
    max_steps: int = 0
    epochs: float = 1.0
    max_grad_norm: float = 1.0
    bf16: bool = False
    seed: int = 42
    save_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    num_workers: int = 0
    resume: bool = False
    show_progress: bool = True

    def validate(self, world_size: int = 1) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule '{self.schedule}' (choose from {', '.join(SCHEDULES)})")
        if self.batch_size < 1 or self.lr <= 0:
            raise ConfigError("batch_size must be ≥ 1 and lr > 0")
        micro = self.micro(world_size)
        if self.batch_size % micro or (self.batch_size // micro) % world_size:
            raise ConfigError(f"batch_size {self.batch_size} must split into micro-batches of {micro} "
                              f"evenly over {world_size} process(es)")
        if self.max_steps < 0 or self.epochs <= 0:
            raise ConfigError("max_steps must be ≥ 0 and epochs > 0")

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
    DataLoader's round-robin over workers restores step order.
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
        examples = [self.dataset[int(i)] for i in indices[j * self.micro:(j + 1) * self.micro]]
        generator = torch.Generator().manual_seed(micro_batch_seed(self.seed, step, j))
        return self.collator(examples, generator=generator)


def build_optimizer(model: torch.nn.Module, config: LoopConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr)


def build_scheduler(optimizer, config: LoopConfig, total_steps: int):
    from transformers import get_scheduler

    name = {"constant": "constant_with_warmup"}.get(config.schedule, config.schedule)
    return get_scheduler(name, optimizer, num_warmup_steps=int(config.warmup_ratio * total_steps),
                         num_training_steps=total_steps)


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


def _mean_logs(logs: list[dict[str, float]]) -> dict[str, float]:
    keys = {key for entry in logs for key in entry}
    return {key: float(np.mean([entry[key] for entry in logs if key in entry])) for key in sorted(keys)}


def make_accelerator(config: LoopConfig):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # Objectives may leave shared parameters unused in a step (e.g. a head only some batches reach).
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    # Without an accelerator, accelerate only sets up multi-process (gloo) training under torchrun /
    # accelerate launch when told it runs on the CPU.
    # step_scheduler_with_optimizer=False: our batch_size is already global, so the schedule advances
    # once per optimizer step (accelerate would otherwise step it once per process).
    return Accelerator(mixed_precision="bf16" if config.bf16 else "no", kwargs_handlers=[ddp],
                       cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False)


# Settings that do not change what a run computes: how it is logged, checkpointed and fed.
BOOKKEEPING = ("resume", "show_progress", "save_every", "keep_checkpoints", "log_every", "num_workers")
# Settings that may also change between an interrupted run and its resumption: micro-batching splits the same
# global batch, the cache only holds tokenized text, and the step budget only says how far the run goes.
RESUMABLE_CHANGES = frozenset(BOOKKEEPING) | {"micro_batch_size", "cache_dir", "max_steps", "epochs"}


def differing_settings(recorded: Mapping[str, Any], current: Mapping[str, Any],
                       ignore: Collection[str] = ()) -> list[str]:
    """Keys (outside ``ignore``) whose values differ once ``current`` is JSON-normalised as ``recorded`` was."""
    current = json.loads(json.dumps(dict(current), default=str))
    return sorted(name for name in set(recorded) | set(current)
                  if name not in ignore and recorded.get(name) != current.get(name))


def finished_run(out: str | Path, settings: dict[str, Any], config_file: str, marker: str,
                 key: str | None = "settings", ignore: tuple[str, ...] = ()) -> Path | None:
    """``<out>/final`` when it holds a complete run (``marker`` and ``config_file`` present) with these
    settings; None when there is none; a :class:`StaleOutputError` naming the differing settings otherwise.

    ``config_file`` records the settings under ``key`` (the whole file when None); keys in ``ignore`` are
    not compared.
    """
    final = Path(out) / "final"
    saved = final / config_file
    if not (final / marker).exists() or not saved.exists():
        return None
    recorded = json.loads(saved.read_text(encoding="utf-8"))
    recorded = recorded.get(key, {}) if key else recorded
    differing = differing_settings(recorded, settings, ignore)
    if differing:
        raise StaleOutputError(f"{final} holds a finished run with different settings ({', '.join(differing)}); "
                               "choose another --out or remove it", out)
    return final


def check_resumable(checkpoint: Path, state: Mapping[str, Any], run_info: dict[str, Any]) -> None:
    """Refuse to resume from ``checkpoint`` (its trainer ``state``) when it was written under other settings
    than ``run_info``'s."""
    recorded, current = state.get("config"), run_info.get("config")
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return
    differing = differing_settings(recorded, current, RESUMABLE_CHANGES)
    if differing:
        def shown(value: Any) -> str:
            text = json.dumps(value, default=str)
            return text if len(text) <= 60 else text[:57] + "..."

        changes = "; ".join(f"{key}: {shown(recorded.get(key))} -> {shown(current.get(key))}" for key in differing)
        raise StaleOutputError(f"{checkpoint} was written by a run with other settings ({changes}); resume with "
                               f"the same settings, or start afresh in another output directory (or remove "
                               f"{checkpoint.parent})", checkpoint.parent.parent)


def train(model: torch.nn.Module, dataset, collator, config: LoopConfig, out_dir: str | Path,
          export: Callable[[torch.nn.Module, Path], None], run_info: dict[str, Any],
          accelerator=None, description: str = "train") -> Path:
    """Train ``model`` and export it to ``<out_dir>/final``; returns that directory."""
    from tqdm.auto import tqdm

    accelerator = accelerator or make_accelerator(config)
    world, rank = accelerator.num_processes, accelerator.process_index
    config.validate(world)
    out = Path(out_dir)
    total_steps = config.total_steps(len(dataset))
    micro = config.micro(world)
    accum = config.batch_size // micro // world

    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    start_step = 0
    writer = LogWriter(out, accelerator.is_main_process)
    resume_from = ckpt.latest_checkpoint(out) if config.resume else None
    if resume_from is not None:
        resumed_state = ckpt.read_state(resume_from)
        check_resumable(resume_from, resumed_state, run_info)
        accelerator.load_state(str(resume_from))
        start_step = resumed_state["step"]
        writer.truncate_after(start_step)
        logger.info("resumed from %s (step %d)", resume_from, start_step)
    else:
        writer.reset()
    state = {**run_info, "total_steps": total_steps}

    batches = torch.utils.data.DataLoader(
        StepBatches(dataset, collator, config.batch_size, micro, config.seed, start_step, total_steps, rank, world),
        batch_size=None, num_workers=config.num_workers,
        # A private generator: the DataLoader draws a base seed when iteration starts, which must not
        # consume the global RNG (dropout) — otherwise a resumed run would drift from the original.
        generator=torch.Generator().manual_seed(config.seed))
    progress = tqdm(total=total_steps, initial=start_step, desc=description, unit="step",
                    disable=not (config.show_progress and accelerator.is_main_process))
    model.train()
    window: list[dict[str, float]] = []
    window_start = time.perf_counter()
    for step, micro_batches in batches:
        step_logs = train_step(model, micro_batches, optimizer, scheduler, accelerator, accum, config.max_grad_norm)
        window.append(step_logs)
        done = step + 1
        progress.update(1)
        progress.set_postfix(loss=f"{step_logs['loss']:.4f}")
        if done % config.log_every == 0 or done == total_steps:
            elapsed = time.perf_counter() - window_start
            writer.write(done, _mean_logs(window) | {"lr": scheduler.get_last_lr()[0],
                                                     "samples_per_s": len(window) * config.batch_size / elapsed})
            window, window_start = [], time.perf_counter()
        if config.save_every and done % config.save_every == 0 and done < total_steps:
            ckpt.save_checkpoint(accelerator, out, done, state, config.keep_checkpoints)
    progress.close()
    writer.close()

    final_dir = out / "final"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with atomic_dir(final_dir) as tmp:
            export(accelerator.unwrap_model(model), tmp)
            write_json(tmp / "provenance.json", provenance({"seed": config.seed, "steps": total_steps}))
    accelerator.wait_for_everyone()
    return final_dir


def train_step(model, micro_batches, optimizer, scheduler, accelerator, accum: int, max_grad_norm: float):
    """One optimizer step over this process's micro-batches; returns logs averaged over the world."""
    logs: list[dict[str, float]] = []
    for i, batch in enumerate(micro_batches):
        batch = {key: value.to(accelerator.device) for key, value in batch.items()}
        last = i == len(micro_batches) - 1
        context = contextlib.nullcontext() if last else accelerator.no_sync(model)
        with context, accelerator.autocast():
            loss, micro_logs = model(batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {loss.item()} ({micro_logs})")
            accelerator.backward(loss / accum)
        logs.append({"loss": float(loss.detach()), **{k: float(v) for k, v in micro_logs.items()}})
    if max_grad_norm and max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    local = _mean_logs(logs)
    if accelerator.num_processes > 1:
        keys = sorted(local)
        values = accelerator.reduce(torch.tensor([local[k] for k in keys], device=accelerator.device), "mean")
        local = dict(zip(keys, values.tolist()))
    return local
