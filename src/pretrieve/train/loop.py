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
    overwrite: bool = False
    allow_inexact_resume: bool = False
    divergence_factor: float = 10.0
    divergence_warmup: int = 5

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
        if self.divergence_factor < 0 or (0 < self.divergence_factor <= 1) or self.divergence_warmup < 1:
            raise ConfigError("divergence_factor must be > 1 (0 turns the check off) and divergence_warmup ≥ 1")
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues the run in the output directory and --overwrite discards it: "
                              "give one of them")

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
BOOKKEEPING = ("resume", "show_progress", "save_every", "keep_checkpoints", "log_every", "num_workers", "overwrite",
               "allow_inexact_resume", "divergence_factor", "divergence_warmup")
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

    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

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
        batch_size=None, num_workers=config.num_workers,
        # A private generator: the DataLoader draws a base seed when iteration starts, which must not
        # consume the global RNG (dropout) — otherwise a resumed run would drift from the original.
        generator=torch.Generator().manual_seed(config.seed))
    progress = tqdm(total=total_steps, initial=start_step, desc=description, unit="step",
                    disable=not (config.show_progress and accelerator.is_main_process))
    model.train()
    window: list[dict[str, float]] = []
    window_start = time.perf_counter()
    guard = DivergenceGuard(config.divergence_factor, config.divergence_warmup)
    for step, micro_batches in batches:
        done = step + 1
        try:
            step_logs = train_step(model, micro_batches, optimizer, scheduler, accelerator, accum,
                                   config.max_grad_norm)
        except FloatingPointError as exc:   # a non-finite loss, caught before its update
            progress.close()
            stop_diverged(accelerator, out, done, guard.first_abnormal_step(done), str(exc))
        problem = guard.check(done, step_logs["loss"])
        if problem:
            progress.close()
            stop_diverged(accelerator, out, done, guard.first_abnormal_step(done), problem)
        window.append(step_logs)
        progress.update(1)
        progress.set_postfix(loss=f"{step_logs['loss']:.4f}")
        if done % config.log_every == 0 or done == total_steps:
            elapsed = time.perf_counter() - window_start
            writer.write(done, _mean_logs(window) | {"lr": scheduler.get_last_lr()[0],
                                                     "samples_per_s": len(window) * config.batch_size / elapsed})
            window, window_start = [], time.perf_counter()
        if config.save_every and done % config.save_every == 0 and done < total_steps:
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
