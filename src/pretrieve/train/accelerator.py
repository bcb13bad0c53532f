"""The accelerate ``Accelerator`` of a training run and how a model is prepared for it: intra-op threads per
process, DDP's unused-parameter search, activation (gradient) checkpointing, experiment trackers."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration
from transformers import PreTrainedModel

from pretrieve.errors import ConfigError
from pretrieve.modeling.mote import is_mote
from pretrieve.precision import set_tf32
from pretrieve.train.settings import LoopConfig

logger = logging.getLogger(__name__)

TRACKERS_DIR = "trackers"
"""Where, under a run's output directory, the trackers that write files keep them (TensorBoard:
``<out>/trackers/<project>/``)."""


def make_accelerator(config: LoopConfig, out: str | Path | None = None):
    """The accelerate ``Accelerator`` of a run (CPU gloo or CUDA NCCL under ``torchrun``/``accelerate launch``).

    It logs to the trackers of ``config.report_to`` (``log_with``), with ``out`` as its project directory and
    ``out/trackers`` (:data:`TRACKERS_DIR`) as the trackers' logging directory; the loop starts them
    (:func:`pretrieve.train.loop.train`).

    Mixed precision is the loop's (:class:`pretrieve.precision.MixedPrecision`), not accelerate's; ``tf32`` is
    switched here (:func:`pretrieve.precision.set_tf32`). DDP's
    unused-parameter search is switched on or off per model by :func:`pretrieve.train.loop.train`
    (:func:`leaves_parameters_unused`), before ``prepare``. Under several processes per node, each gets ``cores / processes`` intra-op threads (:func:`set_threads_per_rank`).
    """
    config.resolved_precision()  # a bad precision fails here, before any model is built
    trackers = config.trackers()  # an unknown tracker, or one whose package is missing, too
    project = None if out is None else ProjectConfiguration(project_dir=str(out),
                                                            logging_dir=str(Path(out) / TRACKERS_DIR))
    if config.bf16:
        logger.warning("bf16: true is deprecated; write precision: bf16 (--precision bf16)")
    # Without an accelerator, accelerate only sets up multi-process (gloo) training under torchrun /
    # accelerate launch when told it runs on the CPU.
    # step_scheduler_with_optimizer=False: our batch_size is already global, so the schedule advances
    # once per optimizer step (accelerate would otherwise step it once per process).
    accelerator = Accelerator(mixed_precision="no", kwargs_handlers=[DistributedDataParallelKwargs()],
                              cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False,
                              log_with=trackers or None, project_config=project)
    set_threads_per_rank()
    if set_tf32(config.tf32, accelerator.device):
        logger.info("TF32 on for fp32 matrix products (%s)", accelerator.device)
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
