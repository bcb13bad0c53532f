"""Cross-device pieces of the fine-tuning losses: rank and world size, an all-gather that keeps the local
gradient, and the gradient scaling that makes a loss over the gathered batch DDP-correct.

Everything here is a no-op in a single process (no initialised ``torch.distributed`` group, or a group of
one), so the losses call these helpers unconditionally and the same code runs on a laptop and on many GPUs.

Why a gather "with grad" and why a gradient scale
-------------------------------------------------
Cross-device negatives (Tevatron, SimLM, RetroMAE/DupMAE fine-tuning) all-gather the query and passage
representations so that every query is scored against the passages of all ``W`` processes.
``torch.distributed.all_gather`` returns tensors without autograd history, so :func:`gather_with_grad` puts
the *local* tensor itself back at this process's slot: the gathered matrix is numerically identical on
every rank, and on rank ``r`` gradients flow into rank ``r``'s own representations only.

Each rank then computes the **same** loss ``L = mean over all W·B gathered queries``. Rank ``r``
back-propagates ``∂L/∂(its own reps)`` — exactly its share of the full-batch gradient, because every
representation lives on exactly one rank. DDP then *averages* the parameter gradients over the ``W`` ranks,
which divides that sum by ``W``. Multiplying the gradient by ``W`` on every rank undoes the average:

    (1/W) · Σ_r W · ∂L/∂θ|_(via rank r's reps) = ∂L/∂θ = the single-process gradient of the full batch.

So Tevatron's ``loss * world_size`` (also SimLM's default ``use_scaled_loss``) is right *for this
formulation* (mean over the gathered queries). It would be wrong for a mean over the local queries only
against gathered passages (SimLM's ``use_scaled_loss=False``): there the passages of rank ``r`` never
receive the gradient of the other ranks' queries, which no constant factor restores. FlagEmbedding's and
RetroMAE's fine-tuning code gather but do not rescale, so their gradient is the full-batch gradient divided
by ``W``. Under SGD that is a learning rate divided by the number of GPUs; under Adam/AdamW, whose update is
invariant to a constant scale of the gradient, it changes only the weight of ``eps`` and what gradient
clipping (``max_grad_norm``) cuts.

:func:`scale_grad` applies the factor to the gradient only (identity in the forward pass), so the loss
*value* stays the full-batch loss — the same number on every rank, directly loggable, where Tevatron's
logged value is ``W`` times it — while its gradient is ``W`` times larger.
``tests/test_distributed_losses.py`` proves the equality with 2 gloo processes and a real DDP model.

Global rank, not local rank: the gathered list is ordered by the rank *in the process group*
(``torch.distributed.get_rank(group)``). Placing the local slice at the *local* rank (the GPU index on its
node, as RetroMAE's cross-encoder ``dist_gather_tensor`` does with ``train_args.local_rank``) is correct on a
single node only; on node 2 the slice overwrites the data of a rank on node 1, that data is lost and the own
data appears twice.

Unequal per-rank batch sizes (a last, smaller batch) are supported: the sizes are gathered first and the
tensors padded to the largest before the all-gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed(group: dist.ProcessGroup | None = None) -> bool:
    """True when a ``torch.distributed`` process group with more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_size(group: dist.ProcessGroup | None = None) -> int:
    """Number of processes in ``group`` (the default group when None); 1 when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def global_rank(group: dist.ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (the default group: its global rank); 0 when not distributed.

    This is the slot ``all_gather`` fills with this process's tensor — never the node-local rank.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


def gather_with_grad(t: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """All-gather ``t`` along dim 0 from every process; the local slice keeps its autograd history.

    Returns the concatenation ``[t_rank0; t_rank1; ...]`` (identical values on every rank), where the slice
    at this process's **global** rank is ``t`` itself, so gradients of anything computed on the result flow
    back into ``t``; the other slices are constants. Shapes may differ in dim 0 across ranks (the other dims
    must agree). Returns ``t`` unchanged when not distributed.
    """
    return _gather_with_grad(t, group=group)


def _gather_with_grad(t: Tensor, group: dist.ProcessGroup | None = None,
                      rank_override: int | None = None) -> Tensor:
    """:func:`gather_with_grad`; ``rank_override`` places the local slice elsewhere — only for tests that
    show a wrong placement (e.g. the local rank 0 on every process) breaks the gradient equality."""
    if not is_distributed(group):
        return t
    sizes = _gather_sizes(t.shape[0], t.device, group)
    largest = max(sizes)
    sendable = t.detach().contiguous()
    if sendable.shape[0] < largest:
        padding = sendable.new_zeros((largest - sendable.shape[0], *sendable.shape[1:]))
        sendable = torch.cat([sendable, padding], dim=0)
    received = [torch.empty_like(sendable) for _ in sizes]
    dist.all_gather(received, sendable, group=group)
    pieces = [buffer[:size] for buffer, size in zip(received, sizes)]
    pieces[global_rank(group) if rank_override is None else rank_override] = t
    return torch.cat(pieces, dim=0)


def _gather_sizes(size: int, device: torch.device, group: dist.ProcessGroup | None) -> list[int]:
    """Dim-0 size of every rank's tensor, in rank order (one tiny all-gather)."""
    local = torch.tensor([size], dtype=torch.long, device=device)
    sizes = [torch.empty_like(local) for _ in range(world_size(group))]
    dist.all_gather(sizes, local, group=group)
    return [int(s.item()) for s in sizes]


class _ScaleGrad(torch.autograd.Function):
    """Identity in the forward pass; multiplies the incoming gradient by a constant in the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad * ctx.factor, None


def scale_grad(t: Tensor, factor: float) -> Tensor:
    """``t`` unchanged in value, with its gradient multiplied by ``factor`` (no-op when ``factor == 1``)."""
    if factor == 1:
        return t
    return _ScaleGrad.apply(t, float(factor))
