"""Cross-device negatives under DDP: 2 gloo processes must reproduce 1 process holding the whole batch.

One spawn (module fixture) runs every scenario in the two processes; each test compares a part of it with
the single-process computation done here, in the parent (where ``gather=True`` is a no-op).

How the comparison works. Rank ``r`` back-propagates ``W · ∂L/∂(its own representations)`` (the default
gradient scaling); DDP then *averages* parameter gradients over the ``W`` ranks. For representations used as
leaves, that average is the rank's gradient divided by ``W`` — so ``grad_r / W`` gathered back in rank order
must equal the single-process gradient of the whole batch. ``test_ddp_parameter_gradients_*`` checks the
same on a real ``DistributedDataParallel`` encoder with no factor applied by the test.
"""

from __future__ import annotations

from functools import partial
from unittest import mock

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_utils import run_distributed
from pretrieve.modeling import losses
from pretrieve.modeling.distributed import _gather_with_grad, gather_with_grad, global_rank, world_size
from pretrieve.modeling.losses import combined_distillation_loss, contrastive_loss

pytestmark = pytest.mark.ddp

WORLD = 2
G = 3            # passages per query: positive + 2 hard negatives
DIM = 4
IN_FEATURES = 5
EVEN = [2, 2]    # queries per rank
UNEVEN = [1, 3]
F64 = torch.float64


def full_batch() -> dict[str, torch.Tensor]:
    """The whole batch: 4 queries, 4·G passages (groups contiguous), teacher scores, encoder inputs."""
    gen = torch.Generator().manual_seed(0)
    return {"q": torch.randn(4, DIM, generator=gen, dtype=F64),
            "p": torch.randn(4 * G, DIM, generator=gen, dtype=F64),
            "teacher": torch.randn(4, G, generator=gen, dtype=F64),
            "xq": torch.randn(4, IN_FEATURES, generator=gen, dtype=F64),
            "xp": torch.randn(4 * G, IN_FEATURES, generator=gen, dtype=F64)}


def local_part(batch: dict[str, torch.Tensor], rank: int, sizes: list[int]) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s queries (``sizes[rank]`` of them, after those of lower ranks) and their groups."""
    start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
    return {"q": batch["q"][start:stop], "p": batch["p"][start * G:stop * G],
            "teacher": batch["teacher"][start:stop], "xq": batch["xq"][start:stop],
            "xp": batch["xp"][start * G:stop * G]}


def split_score(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A DupMAE-like score: dense half + 0.5 × second half."""
    return q[:, :2] @ p[:, :2].T + 0.5 * q[:, 2:] @ p[:, 2:].T


def leaf_gradients(part: dict[str, torch.Tensor], **options) -> dict[str, torch.Tensor]:
    """Loss value and gradients w.r.t. the representations, taken as leaves."""
    q, p = part["q"].clone().requires_grad_(), part["p"].clone().requires_grad_()
    loss = contrastive_loss(q, p, **options)
    loss.backward()
    return {"loss": loss.detach(), "q": q.grad, "p": p.grad}


def tiny_encoder() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(IN_FEATURES, DIM, dtype=F64)


def encoder_loss(model: nn.Module, part: dict[str, torch.Tensor], kind: str, gather: bool) -> torch.Tensor:
    reps = model(torch.cat([part["xq"], part["xp"]]))            # one forward for queries and passages
    q, p = reps[:len(part["xq"])], reps[len(part["xq"]):]
    if kind == "contrastive":
        return contrastive_loss(q, p, gather=gather)
    return combined_distillation_loss(q, p, part["teacher"], gather=gather).loss


def ddp_gradients(part: dict[str, torch.Tensor], kind: str) -> dict[str, object]:
    model = DistributedDataParallel(tiny_encoder())
    loss = encoder_loss(model, part, kind, gather=True)
    loss.backward()
    return {"loss": loss.detach(), "grads": [w.grad.clone() for w in model.parameters()]}


def scenarios(rank: int, world: int) -> dict[str, object]:
    """Everything the tests check, computed in one process of the group."""
    batch = full_batch()
    even, uneven = local_part(batch, rank, EVEN), local_part(batch, rank, UNEVEN)
    out: dict[str, object] = {"rank": global_rank(), "world": world_size()}

    local = uneven["q"].clone().requires_grad_()
    gathered = gather_with_grad(local)
    weights = torch.arange(gathered.numel(), dtype=F64).view_as(gathered)
    (gathered * weights).sum().backward()
    out["gather"] = {"value": gathered.detach(), "local_grad": local.grad}

    out["dot"] = leaf_gradients(even, gather=True)
    out["cos"] = leaf_gradients(even, gather=True, similarity="cos", temperature=0.05)
    out["score_fn"] = leaf_gradients(even, gather=True, score_fn=split_score)
    out["uneven"] = leaf_gradients(uneven, gather=True)
    out["unscaled"] = leaf_gradients(even, gather=True, scale_grad_by_world_size=False)
    out["not_gathered"] = leaf_gradients(even)
    # the reference repos' bug: the local slice at the node-local rank (0 for every process here)
    with mock.patch.object(losses, "gather_with_grad", partial(_gather_with_grad, rank_override=0)):
        out["wrong_placement"] = leaf_gradients(even, gather=True)

    try:   # rank 0 keeps G = 3 passages per query, rank 1 sends 2: both ranks must refuse, none may hang
        contrastive_loss(even["q"], even["p"] if rank == 0 else even["p"][:2 * len(even["q"])], gather=True)
        out["group_size_mismatch"] = None
    except ValueError as error:
        out["group_size_mismatch"] = str(error)

    out["ddp_contrastive"] = ddp_gradients(even, "contrastive")
    out["ddp_uneven"] = ddp_gradients(uneven, "contrastive")
    out["ddp_distill"] = ddp_gradients(even, "distill")
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_distributed(scenarios, world_size=WORLD, timeout=120)


def single_process(**options) -> dict[str, torch.Tensor]:
    return leaf_gradients(full_batch(), **options)


def gathered_back(ranks: list[dict], scenario: str, name: str) -> torch.Tensor:
    """Rank-ordered concatenation of each rank's gradient, divided by W as DDP's average does."""
    return torch.cat([r[scenario][name] for r in ranks]) / WORLD


def assert_matches_single_process(ranks: list[dict], scenario: str, **options) -> None:
    reference = single_process(**options)
    for r in ranks:
        torch.testing.assert_close(r[scenario]["loss"], reference["loss"], atol=1e-6, rtol=0)
    torch.testing.assert_close(gathered_back(ranks, scenario, "q"), reference["q"], atol=1e-6, rtol=0)
    torch.testing.assert_close(gathered_back(ranks, scenario, "p"), reference["p"], atol=1e-6, rtol=0)


def test_processes_see_their_global_rank(ranks):
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == WORLD for r in ranks)


def test_gather_places_each_slice_at_its_rank_and_keeps_the_local_gradient(ranks):
    everything = full_batch()["q"]
    weights = torch.arange(everything.numel(), dtype=F64).view_as(everything)
    for rank, r in enumerate(ranks):                  # uneven sizes: 1 and 3 rows
        torch.testing.assert_close(r["gather"]["value"], everything, atol=0, rtol=0)
        start, stop = sum(UNEVEN[:rank]), sum(UNEVEN[:rank + 1])
        torch.testing.assert_close(r["gather"]["local_grad"], weights[start:stop], atol=0, rtol=0)


def test_two_processes_equal_one_process_holding_the_whole_batch(ranks):
    assert_matches_single_process(ranks, "dot")


def test_cosine_and_temperature_under_ddp(ranks):
    assert_matches_single_process(ranks, "cos", similarity="cos", temperature=0.05)


def test_custom_score_fn_under_ddp(ranks):
    assert_matches_single_process(ranks, "score_fn", score_fn=split_score)


def test_uneven_batches_under_ddp(ranks):
    assert_matches_single_process(ranks, "uneven")


def test_without_the_world_size_factor_the_gradient_is_w_times_too_small(ranks):
    reference = single_process()
    torch.testing.assert_close(ranks[0]["unscaled"]["loss"], reference["loss"], atol=1e-6, rtol=0)
    q_grad = gathered_back(ranks, "unscaled", "q")
    torch.testing.assert_close(q_grad * WORLD, reference["q"], atol=1e-6, rtol=0)
    assert not torch.allclose(q_grad, reference["q"], atol=1e-3)


def test_wrong_placement_of_the_local_slice_does_not_match(ranks):
    reference = single_process()
    assert not torch.allclose(ranks[1]["wrong_placement"]["loss"], reference["loss"], atol=1e-3)
    assert not torch.allclose(gathered_back(ranks, "wrong_placement", "q"), reference["q"], atol=1e-3)
    assert not torch.allclose(gathered_back(ranks, "wrong_placement", "p"), reference["p"], atol=1e-3)


def test_without_gather_each_process_only_sees_its_own_batch(ranks):
    reference = single_process()
    assert not torch.allclose(ranks[0]["not_gathered"]["loss"], reference["loss"], atol=1e-3)


def test_different_group_sizes_across_processes_are_refused_on_every_rank(ranks):
    assert all("different group sizes" in (r["group_size_mismatch"] or "") for r in ranks)


@pytest.mark.parametrize("scenario, kind", [("ddp_contrastive", "contrastive"), ("ddp_uneven", "contrastive"),
                                            ("ddp_distill", "distill")])
def test_ddp_parameter_gradients_equal_single_process(ranks, scenario, kind):
    model = tiny_encoder()
    loss = encoder_loss(model, full_batch(), kind, gather=True)
    loss.backward()
    for r in ranks:
        for got, expected in zip(r[scenario]["grads"], [w.grad for w in model.parameters()]):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    if kind == "contrastive":   # the distillation value holds this rank's KL only (DDP averages it)
        for r in ranks:
            torch.testing.assert_close(r[scenario]["loss"], loss.detach(), atol=1e-6, rtol=0)
