"""Gradient caching for fine-tuning with in-batch negatives: a large contrastive batch in the memory of a sub-batch.

GradCache (Gao, Zhang, Han, Callan, 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup"; the ``grad_cache`` package Tevatron and CoT-MAE-qc use) splits one training step in three:

1. **Representations without a graph.** Queries and passages are encoded in sub-batches of ``chunk`` texts under
   ``torch.no_grad()``; only the ``[B, d]`` / ``[B·G, d]`` representations are kept. The random state of each
   sub-batch is recorded first (:class:`RandContext`).
2. **Loss and representation gradients on the full batch.** The loss (:meth:`DualEncoder.loss`: in-batch and
   cross-device negatives, distillation, regularisers) is computed on those representations, made leaves that
   require grad, and back-propagated to them only: ``g = ∂L/∂reps``, a ``[B + B·G, d]`` cache.
3. **Sub-batch re-forward.** Each sub-batch is encoded again with a graph, replaying its recorded random state
   (same dropout masks), and ``reps · g`` is back-propagated — which puts exactly ``∂L/∂θ`` restricted to that
   sub-batch into the parameters' gradients, after which the sub-batch's graph is freed.

So the gradient is that of the plain step (same loss, same masks; equal up to float rounding — tested to 1e-5),
while activation memory is that of one sub-batch plus the ``[B + B·G, d]`` representations; the price is one
extra forward pass of the encoders (measured in docs/benchmarks.md, "Gradient caching").

Under several processes the loop calls the model itself (not its DDP wrapper) and averages the gradients over
processes with one all-reduce per parameter after the step's micro-batches (:func:`average_gradients`), which is
what DDP's averaging would have done; the cross-device gather inside the loss (:mod:`pretrieve.modeling.
distributed`) is unchanged.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.checkpoint import get_device_states, set_device_states

TEXT_TYPES = ("query", "passage")


class RandContext:
    """The random state (CPU and the devices of ``tensors``) at construction; ``with ctx:`` replays it in a forked
    RNG, so the global random stream is left where it was."""

    def __init__(self, *tensors: Tensor):
        self.cpu_state = torch.get_rng_state()
        self.devices, self.device_states = get_device_states(*tensors)
        self._fork = None

    def __enter__(self) -> None:
        self._fork = torch.random.fork_rng(devices=self.devices, enabled=True)
        self._fork.__enter__()
        torch.set_rng_state(self.cpu_state)
        set_device_states(self.devices, self.device_states)

    def __exit__(self, *exc) -> None:
        self._fork.__exit__(*exc)
        self._fork = None


def sub_batches(batch: Mapping[str, Tensor], text_type: str, chunk: int) -> list[dict[str, Tensor]]:
    """The ``{text_type}_*`` tensors of ``batch`` cut into consecutive row ranges of at most ``chunk`` rows."""
    keys = [key for key in batch if key.startswith(f"{text_type}_")]
    rows = batch[f"{text_type}_input_ids"].shape[0]
    return [{key: batch[key][start:start + chunk] for key in keys} for start in range(0, rows, chunk)]


def grad_cached_step(model, batch: Mapping[str, Tensor], chunk: int, precision, scale: float = 1.0
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """Accumulate ``scale · ∂loss/∂θ`` of one (micro-)batch into the gradients of ``model`` (a
    :class:`~pretrieve.modeling.dual_encoder.DualEncoder`) in sub-batches of ``chunk`` texts; returns the loss
    (detached) and the logs, as ``model(batch)`` would.

    ``precision`` (:class:`pretrieve.precision.MixedPrecision`) supplies autocast and, for fp16, the loss scale
    (the cached representation gradients are scaled, so the parameters' gradients are scaled as in the plain
    step and unscaled by the loop).
    """
    cached: dict[str, list[tuple[dict[str, Tensor], RandContext, Tensor]]] = {}
    with torch.no_grad():
        for text_type in TEXT_TYPES:
            cached[text_type] = []
            for part in sub_batches(batch, text_type, chunk):
                state = RandContext(*part.values())
                with precision.autocast():
                    reps = model.encode_batch(part, text_type)
                cached[text_type].append((part, state, reps))
    leaves = {text_type: torch.cat([reps for _, _, reps in cached[text_type]]).detach().requires_grad_()
              for text_type in TEXT_TYPES}
    with precision.autocast():
        loss, logs = model.loss(leaves["query"], leaves["passage"], batch)
    precision.scale(loss * scale).backward()
    for text_type in TEXT_TYPES:
        start = 0
        for part, state, reps in cached[text_type]:
            gradient = leaves[text_type].grad[start:start + reps.shape[0]]
            start += reps.shape[0]
            with state, precision.autocast():
                again = model.encode_batch(part, text_type)
            torch.dot(again.flatten().float(), gradient.flatten().float()).backward()
    return loss.detach(), logs


def average_gradients(model: torch.nn.Module) -> None:
    """Average every trainable parameter's gradient over the processes (a missing gradient counts as zero)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    gradients = []
    for parameter in model.parameters():
        if not parameter.requires_grad:
            continue
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        gradients.append(parameter.grad)
    handles = [dist.all_reduce(gradient, async_op=True) for gradient in gradients]
    for handle in handles:
        handle.wait()
    for gradient in gradients:
        gradient.div_(world)
