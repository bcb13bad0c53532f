"""Stage-3 negatives are a seeded sample from the teacher-scored depth (CDMAE's K3 = 200, DupMAE's
``sample_neg_from_topk 200``), re-drawn per epoch, and the same under 1 and 2 processes (gloo).

The teacher keeps ``max_negatives`` (the depth) of each mined group; the stage-3 collator draws ``num_negatives`` of
them per step (:class:`pretrieve.train.collator.GroupCollator` on the loop's :class:`StepBatches`). Each group's
teacher scores here encode the group and the negative's rank (``1000 · group + rank``), so the collated
``teacher_scores`` show which negatives were drawn.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from transformers import AutoTokenizer

from conftest import REPO
from ddp_utils import run_distributed
from pretrieve.data.groups import TrainingGroup
from pretrieve.recipe.schema import load_recipe, stage_labels
from pretrieve.train.collator import GroupCollator
from pretrieve.train.loop import StepBatches

DEPTH = 200        # the teacher-scored negatives of each group (K3)
SAMPLED = 63       # CDMAE stage 3: group 64
GROUPS = 8
BATCH, MICRO = 4, 2
EPOCHS = 2
SEED = 42


class IdTexts:
    """A corpus whose text of a document is its id."""

    def texts_of(self, ids):
        return list(ids)


def groups() -> list[TrainingGroup]:
    return [TrainingGroup(f"q{g}", f"query {g}", [f"p{g}"], [f"d{g}-{r}" for r in range(DEPTH)],
                          [1000.0 * g - 1], [1000.0 * g + r for r in range(DEPTH)]) for g in range(GROUPS)]


def drawn(tokenizer_path: str, rank: int, world: int) -> dict[tuple[int, int], list[tuple[int, list[int]]]]:
    """(step, micro-batch) → [(group, ranks of its sampled negatives)] of the micro-batches of this process."""
    collator = GroupCollator(AutoTokenizer.from_pretrained(tokenizer_path), IdTexts(), SAMPLED, 8, 8,
                             teacher_scores=True)
    data = groups()
    steps = EPOCHS * (len(data) // BATCH)
    batches = StepBatches(data, collator, BATCH, MICRO, SEED, 0, steps, rank, world)
    out = {}
    for step, micro_batches in batches:
        for j, batch in zip(batches.my_micro_batches(), micro_batches):
            rows = []
            for scores in batch["teacher_scores"].tolist():
                group = round(scores[0] + 1) // 1000
                rows.append((group, [round(s) - 1000 * group for s in scores[1:]]))
            out[(step, j)] = rows
    return out


def drawn_under_ddp(rank: int, world: int, tokenizer_path: str):
    return drawn(tokenizer_path, dist.get_rank(), dist.get_world_size())


@pytest.fixture(scope="module")
def single(minilm) -> dict:
    return drawn(str(minilm), 0, 1)


def test_stage3_negatives_are_a_seeded_sample_of_the_whole_depth_not_the_top_k(single, minilm):
    assert single == drawn(str(minilm), 0, 1)                       # the seed fixes the sample
    ranks = [r for rows in single.values() for _, sampled in rows for r in sampled]
    for rows in single.values():
        for _, sampled in rows:
            assert len(sampled) == SAMPLED and len(set(sampled)) == SAMPLED
            assert all(0 <= r < DEPTH for r in sampled)
            assert sampled != list(range(SAMPLED))                  # not the top 63 in rank order
    assert max(ranks) >= DEPTH - 10 and sum(r >= SAMPLED for r in ranks) > len(ranks) / 2   # ~2/3 lie past 63


def test_stage3_negatives_are_re_drawn_every_epoch(single):
    per_epoch: dict[int, dict[int, list[int]]] = {}
    steps_per_epoch = GROUPS // BATCH
    for (step, _), rows in single.items():
        for group, sampled in rows:
            per_epoch.setdefault(step // steps_per_epoch, {})[group] = sampled
    assert sorted(per_epoch) == list(range(EPOCHS)) and all(len(g) == GROUPS for g in per_epoch.values())
    for group in range(GROUPS):
        assert set(per_epoch[0][group]) != set(per_epoch[1][group])


@pytest.mark.ddp
def test_two_processes_draw_the_same_stage3_groups_as_one(single, minilm):
    merged = {}
    for part in run_distributed(drawn_under_ddp, world_size=2, args=(str(minilm),), timeout=120):
        assert not merged.keys() & part.keys()                      # each micro-batch on one process
        merged.update(part)
    assert merged == single


@pytest.mark.parametrize("recipe, sampled", [("cdmae-msmarco", 63), ("dupmae-msmarco", 15)])
def test_paper_recipes_sample_stage3_negatives_from_the_mined_depth(recipe, sampled):
    loaded = load_recipe(REPO / "configs" / f"{recipe}.yaml")
    options = {label: opts for _, label, opts in stage_labels(loaded)}
    mine = options.get("mine-2", options["mine"])
    assert options["teacher"]["max_negatives"] == mine["depth"] == 200
    assert {**loaded["finetune"], **options["finetune-s3"]}["num_negatives"] == sampled
