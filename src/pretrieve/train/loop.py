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
* **Precision** (``precision: auto | fp32 | bf16 | fp16``, :mod:`pretrieve.precision`; ``bf16: true`` is the
  deprecated spelling of ``precision: bf16``): ``torch.autocast`` around the forward pass, and for fp16 a
  ``torch.amp.GradScaler`` (dynamic loss scaling; its state is checkpointed). The loop owns both, on every device,
  rather than accelerate's ``mixed_precision``, which on the CPU silently trains fp16 runs in fp32; on CUDA it is
  the same autocast + GradScaler accelerate would use (:class:`pretrieve.precision.MixedPrecision`).
* **GPU efficiency.** Micro-batches are pinned (CUDA) and copied with ``non_blocking``; DataLoader workers
  (``num_workers``) collate ahead of the GPU; per-step logs stay on the device and are copied to the host (and
  all-reduced) once per ``log_every`` steps, so no step waits for the host (the fp16 GradScaler's overflow
  check is the one per-step sync left, inherent to dynamic loss scaling); DDP searches for unused parameters
  only when the model says it may leave some unused; ``gradient_checkpointing`` recomputes the encoder's
  activations in the backward pass (both: :mod:`pretrieve.train.accelerator`); a model with ``grad_cache_chunk``
  set (fine-tuning with in-batch negatives) is stepped by :func:`pretrieve.train.grad_cache.grad_cached_step`;
  under several processes on one node each process uses ``cores / processes`` threads unless
  ``OMP_NUM_THREADS`` says otherwise.
* **Logging.** ``logs.jsonl`` (every ``log_every`` steps: each logged loss, learning rate, samples/s; what resume
  and the analyses read), the same values to the experiment trackers of ``report_to`` (accelerate's: TensorBoard
  under ``<out>/trackers/``, W&B, MLflow, …; the run's resolved config, flattened, as their config), and a progress
  bar with ETA. A resumed run drops the ``logs.jsonl`` lines past its checkpoint, and TensorBoard hides the events
  past it (``purge_step``), so no step is shown twice; W&B and MLflow start a new run (see :func:`start_trackers`).
* **Evaluation** (optional, ``evaluation``): every ``eval_steps`` steps and after the last, the model exported as
  ``final`` would be is searched and scored on dev queries, the measures logged as ``eval/<measure>`` (``logs.jsonl``
  and the trackers), and ``final`` is the best evaluated model (:mod:`pretrieve.train.evaluator`; the best so far is
  checkpointed, so a resumed run ends with the same one).
* **Checkpoints.** Every ``save_every`` steps, atomically (:mod:`pretrieve.train.checkpoint`);
  ``resume=True`` restarts from the newest complete one — only when that checkpoint was written with the
  same settings (``run_info["config"]``, bookkeeping such as logging, checkpoint frequency, micro-batch size
  and the step budget aside): resuming under other settings would silently mix two runs, so it is refused
  with the differing keys (:func:`pretrieve.train.checkpoint.check_resumable`).
* **Export.** ``export(unwrapped_model, directory)`` writes the final artefact into a temporary
  directory that is renamed to ``<out>/final`` only when complete; its sidecar (:mod:`pretrieve.artifacts`)
  records the run's settings and the fingerprints of its inputs, and :func:`pretrieve.train.run.finished_run`
  asks it whether a finished run may be reused (settings compare content, never where files live: a copied
  output directory is still current). A write that fails there for lack of space (or at a size limit) is one
  :class:`~pretrieve.train.checkpoint.CheckpointWriteError` line naming ``final`` and the checkpoint ``--resume``
  continues from.
* **Guards.** A resume that cannot restore every process's RNG state stops with
  :class:`~pretrieve.errors.InexactResumeError` unless ``allow_inexact_resume``
  (:func:`pretrieve.train.checkpoint.load_checkpoint`); a diverging loss stops the run with
  :class:`~pretrieve.errors.TrainingDiverged` and keeps only checkpoints from before the divergence, and so do
  weights that are non-finite or whose norm exploded, checked before every checkpoint and the final export
  (:mod:`pretrieve.train.guard`). The steps around the loop (lock, finished or restarted runs, the accelerator,
  data built once, export) are the run template's, :mod:`pretrieve.train.run`.

Distributed training: launch the same command with ``accelerate launch`` or ``torchrun``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_scheduler

from pretrieve import artifacts
from pretrieve.interrupts import TrainingTerminated, sigterm_raises
from pretrieve.io_utils import write_json
from pretrieve.precision import MixedPrecision
from pretrieve.progress import Progress
from pretrieve.provenance import provenance
from pretrieve.train import checkpoint as ckpt
from pretrieve.train.accelerator import enable_gradient_checkpointing, leaves_parameters_unused, make_accelerator
from pretrieve.train.settings import LoopConfig
from pretrieve.train.evaluator import BEST_KEY, BestModel, Evaluation, log_values
from pretrieve.train.grad_cache import average_gradients, grad_cached_step
from pretrieve.train.guard import (WEIGHT_GROWTH, WEIGHT_NORM_KEY, DivergenceGuard, WeightCheck, stop_diverged,
                                   weight_norm)

logger = logging.getLogger(__name__)

PROGRESS_KEY = "training_progress"
"""Batch key of ``step / total_steps`` (0-d float tensor), added to every micro-batch by :class:`StepBatches`
(read by objectives with a weight schedule, e.g. :data:`pretrieve.modeling.objectives.bow.PROGRESS`)."""
_FINITE_KEY = "_finite"
PRECISION_REASONS = {"bf16": "bf16 autocast, which this device computes natively",
                     "fp32": "fp32, as this device has no native bf16"}


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
    """Writes ``logs.jsonl`` (main process only)."""

    def __init__(self, out_dir: Path, enabled: bool):
        self.enabled = enabled
        self.path = out_dir / "logs.jsonl"

    def write(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)   # a run may log before anything else made its folder
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **values}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop log lines past ``step`` (written after the checkpoint we resume from)."""
        if not self.enabled or not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in lines))

    def reset(self) -> None:
        if self.enabled and self.path.exists():
            self.path.unlink()


TRACKER_PROJECT = "pretrieve"
"""The project every run is tracked under (W&B's project, MLflow's experiment, TensorBoard's folder under
``<out>/trackers/``)."""


def start_trackers(accelerator, config: Mapping[str, Any], start_step: int) -> None:
    """Start the accelerator's trackers (``log_with``) with the run's resolved ``config`` flattened to scalars
    (:func:`flat_config`). A resumed run (``start_step`` > 0) writes TensorBoard events into the same folder with
    ``purge_step`` at the first step it redoes, so TensorBoard's reader hides the events an interrupted run logged
    past its checkpoint; W&B and MLflow start a new run (their own resumption, ``WANDB_RUN_ID`` with
    ``WANDB_RESUME=allow`` or ``MLFLOW_RUN_ID``, continues the old one)."""
    init_kwargs = {"tensorboard": {"purge_step": start_step + 1}} if start_step else None
    accelerator.init_trackers(TRACKER_PROJECT, config=flat_config(config), init_kwargs=init_kwargs)


def end_trackers(accelerator) -> None:
    """Close the trackers (main process): what ``accelerator.end_training()`` does, without also destroying the
    process group, which the export's barrier and a recipe's next stage still use."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers = []


def flat_config(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` with nested mappings flattened to dotted keys (``method.name``), lists as JSON and other objects as
    text: the scalars (str, int, float, bool, None) trackers take as a run's config."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value, default=str)
        elif value is None or isinstance(value, (str, int, float, bool)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def read_logs(out_dir: str | Path) -> list[dict[str, float]]:
    """The ``logs.jsonl`` lines of a run, in step order."""
    path = Path(out_dir) / "logs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def train(model: torch.nn.Module, dataset, collator, config: LoopConfig, out_dir: str | Path,
          export: Callable[[torch.nn.Module, Path], None], run_info: dict[str, Any],
          accelerator=None, description: str = "train", record: Mapping[str, Any] | None = None,
          tracked_config: Mapping[str, Any] | None = None, evaluation: Evaluation | None = None) -> Path:
    """Train ``model`` and export it to ``<out_dir>/final``; returns that directory.

    ``record`` (``{"kind", "settings", "inputs"}``) describes the export in its sidecar (:mod:`pretrieve.artifacts`),
    which :func:`pretrieve.train.run.finished_run` reads to decide whether the run is finished and current.
    ``tracked_config`` (default: ``run_info["config"]``) is the config the trackers record (:func:`start_trackers`).
    ``evaluation``: dev measures every ``evaluation.every`` steps, and ``final`` the best evaluated model
    (:mod:`pretrieve.train.evaluator`).
    """
    accelerator = accelerator or make_accelerator(config, out_dir)
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
    precision = MixedPrecision(config.resolved_precision(accelerator.device), accelerator.device.type)
    if accelerator.is_main_process:
        logger.info("%s: %s precision on %s%s", description, precision.precision, accelerator.device.type,
                    f" (precision {config.precision}: {PRECISION_REASONS.get(precision.precision, '')})"
                    if config.precision == "auto" else "")
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    start_step = 0
    writer = LogWriter(out, accelerator.is_main_process)
    resume_from = ckpt.latest_checkpoint(out) if config.resume else None
    resumed_state: dict[str, Any] = {}
    if resume_from is not None:
        resumed_state = ckpt.read_state(resume_from)
        ckpt.check_resumable(resume_from, resumed_state, run_info)
        ckpt.load_checkpoint(accelerator, resume_from, config.allow_inexact_resume, resumed_state, precision.scaler)
        start_step = resumed_state["step"]
        writer.truncate_after(start_step)
        logger.info("resumed from %s (step %d)", resume_from, start_step)
    else:
        writer.reset()
    best = None
    if evaluation is not None and accelerator.is_main_process:
        best = BestModel.start(out, evaluation.metric, resumed_state.get(BEST_KEY), start_step)
        evaluation.history = [row for row in read_logs(out) if any(key.startswith("eval/") for key in row)]
    start_trackers(accelerator, run_info.get("config", {}) if tracked_config is None else tracked_config, start_step)
    weights = WeightCheck(resumed_state.get(WEIGHT_NORM_KEY) or weight_norm(model),
                          WEIGHT_GROWTH if config.divergence_factor else 0.0)
    state = {**run_info, "total_steps": total_steps, WEIGHT_NORM_KEY: weights.start}

    batches = torch.utils.data.DataLoader(
        StepBatches(dataset, collator, config.batch_size, micro, config.seed, start_step, total_steps, rank, world),
        batch_size=None, num_workers=config.num_workers, pin_memory=accelerator.device.type == "cuda",
        # A private generator: the DataLoader draws a base seed when iteration starts, which must not
        # consume the global RNG (dropout) — otherwise a resumed run would drift from the original.
        generator=torch.Generator().manual_seed(config.seed))
    progress = Progress(total=total_steps, initial=start_step, desc=description, unit="step",
                    disable=not (config.show_progress and accelerator.is_main_process))
    model.train()
    window = LogWindow(accelerator)
    window_start = time.perf_counter()
    guard = DivergenceGuard(config.divergence_factor, config.divergence_warmup)
    done = start_step
    with reported_interruptions(out, lambda: done, accelerator.is_main_process, progress):
        for step, micro_batches in batches:
            done = step + 1
            window.add(step, train_step(model, micro_batches, optimizer, scheduler, accelerator, accum,
                                        config.max_grad_norm, precision))
            progress.update(1)
            eval_now = evaluation is not None and evaluation.due(done, total_steps)
            log_now = done % config.log_every == 0 or done == total_steps or eval_now
            save_now = bool(config.save_every) and done % config.save_every == 0 and done < total_steps
            if log_now or save_now:   # the guard sees every step's loss, copied to the host once per window
                problem = window.check_divergence(guard)
                if problem:
                    stop_diverged(accelerator, out, done, guard.first_abnormal_step(done), problem)
            if log_now:
                elapsed = time.perf_counter() - window_start
                steps = window.steps
                values = window.flush()
                progress.set_postfix(loss=f"{values['loss']:.4f}")
                values |= {"lr": scheduler.get_last_lr()[0], "samples_per_s": steps * config.batch_size / elapsed}
                writer.write(done, values)
                accelerator.log(values, step=done)
                window_start = time.perf_counter()
            if eval_now:
                evaluate_now(model, accelerator, evaluation, best, export, done, writer)
                state[BEST_KEY] = best.record() if best is not None else None
                window_start = time.perf_counter()   # the evaluation's time is not training throughput
            if save_now or done == total_steps:   # no checkpoint, nor the final model, from diverged weights
                problem = weights.check(model)
                if problem:
                    stop_diverged(accelerator, out, done, guard.first_abnormal_step(done + 1), problem)
            if save_now:
                keep = config.keep_checkpoints if guard.steady(done - config.save_every) else 0   # 0: no pruning
                ckpt.save_checkpoint(accelerator, out, done, state, keep, precision.scaler)
                if best is not None:
                    best.keep_for([ckpt.read_state(path).get(BEST_KEY) for _, path in ckpt.list_checkpoints(out)])
    progress.close()
    end_trackers(accelerator)

    final_dir = out / "final"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        record = dict(record or {"kind": "model"})
        try:
            with artifacts.write_dir(final_dir, record["kind"], record.get("settings"), record.get("inputs")) as tmp:
                if best is not None:
                    best.finish(tmp, evaluation)
                else:
                    export(accelerator.unwrap_model(model), tmp)
                write_json(tmp / "provenance.json", provenance({"seed": config.seed, "steps": total_steps}))
        except Exception as exc:  # noqa: BLE001 - safetensors and torch raise their own on a full disk
            if not ckpt.is_write_failure(exc):
                raise
            raise ckpt.CheckpointWriteError(ckpt.final_write_failure(final_dir, out, exc)) from None
    accelerator.wait_for_everyone()
    return final_dir


def evaluate_now(model, accelerator, evaluation: Evaluation, best: BestModel | None, export, step: int,
                 writer: LogWriter) -> None:
    """Evaluate the model after ``step`` (main process; the others wait): export it as ``final`` would be, score that
    folder, log the measures and keep it when it is the best so far (:mod:`pretrieve.train.evaluator`). The global
    random state is left as it was, so evaluating does not change the training."""
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        started = time.perf_counter()
        with torch.random.fork_rng(devices=[accelerator.device] if accelerator.device.type == "cuda" else []):
            unwrapped.eval()
            try:
                directory = best.scratch(step)
                export(unwrapped, directory)
                values = dict(evaluation.score(directory))
            finally:
                unwrapped.train()
        kept = best.consider(step, directory, values)
        logged = log_values(values)
        writer.write(step, logged)
        accelerator.log(logged, step=step)
        evaluation.history.append({"step": step, **logged})
        logger.info("step %d: %s on %s (%.0f s)%s", step,
                    ", ".join(f"{name} {value:.4f}" for name, value in values.items()), evaluation.describe,
                    time.perf_counter() - started,
                    f"; the best so far by {evaluation.metric}" if kept else
                    f"; the best stays step {best.step} ({evaluation.metric} {best.value:.4f})")
    accelerator.wait_for_everyone()


@contextlib.contextmanager
def reported_interruptions(out: Path, steps_done: Callable[[], int], report: bool, progress) -> Iterator[None]:
    """Ctrl-C (``KeyboardInterrupt``: exit 130) and SIGTERM (:class:`TrainingTerminated`: exit 143) while training
    say (when ``report``) which checkpoint was kept and that ``--resume`` continues from it; the interruption then
    goes on as before. Any exception closes the progress bar first."""
    with sigterm_raises():
        try:
            yield
        except BaseException as exc:
            progress.close()   # whatever stops the run, its message starts on a line of its own
            if report and isinstance(exc, (KeyboardInterrupt, TrainingTerminated)):
                logger.warning(interruption_message(out, steps_done(), "SIGTERM" if isinstance(exc, SystemExit)
                                                    else "Ctrl-C"))
                exc.reported = True   # a recipe's stage report (pretrieve.recipe.runner) need not repeat it
            raise


def interruption_message(out: Path, steps_done: int, what: str) -> str:
    """What an interrupted run kept and how to continue it."""
    kept = ckpt.list_checkpoints(out)
    if not kept:
        return (f"interrupted ({what}) at step {steps_done}, before the first checkpoint: nothing was kept; run "
                "the same command again (with --overwrite) to start afresh")
    step, path = kept[-1]
    return (f"interrupted ({what}) at step {steps_done}: kept the checkpoint {path}; run the same command with "
            f"--resume to continue from step {step}")


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

    def check_divergence(self, guard: DivergenceGuard) -> str | None:
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
