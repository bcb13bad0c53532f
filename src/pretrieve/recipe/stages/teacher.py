"""The ``teacher`` stage: the reranker's scores of the mined groups, the soft labels of fine-tuning stage 3
(:func:`pretrieve.retrieval.rerank.teacher_groups`), in ``teacher/groups.jsonl``.

``max_negatives`` is the depth stage 3 samples from: the teacher scores each group's first ``max_negatives`` mined
negatives (all of them when unset), and fine-tuning stage 3 draws its ``num_negatives`` from those at every step,
seeded and re-drawn every epoch (:class:`pretrieve.train.collator.GroupCollator`) — CDMAE's K₃ = 200 and DupMAE's
``sample_neg_from_topk 200`` are ``max_negatives: 200`` over a ``mine`` of depth 200.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pretrieve import outputs
from pretrieve.errors import ConfigError
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import stage
from pretrieve.retrieval.rerank import teacher_groups


@dataclass
class TeacherOptions:
    """Options of the ``teacher`` stage (:func:`pretrieve.retrieval.rerank.teacher_groups`)."""

    max_negatives: int | None = None
    batch_size: int = 64
    max_len: int | None = None
    device: str = "auto"
    precision: str = "auto"


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if "reranker" not in given or "mined" not in given:
        raise ConfigError(f"{where}: needs a 'reranker' stage and mined groups earlier in the recipe")


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: at most 3 negatives scored per group."""
    options["max_negatives"] = min(int(options.get("max_negatives", 31)), 3)
    return options


@stage("teacher", TeacherOptions, needs=needs, gives="teacher", smoke=smoke)
def stage_teacher(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    out = state.out / "teacher" / "groups.jsonl"
    outputs.remove_leftovers(out.parent, depth=0)
    state.give("teacher", label, str(teacher_groups(state.latest("reranker"), state.data, state.latest("mined"), out,
                                                    show_progress=show_progress, **options)))
