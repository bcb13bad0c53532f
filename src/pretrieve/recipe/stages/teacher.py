"""The ``teacher`` stage: the reranker's scores of the mined groups, the soft labels of fine-tuning stage 3
(:func:`pretrieve.train.reranker.teacher_groups`), in ``teacher/groups.jsonl``."""

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
    """Options of the ``teacher`` stage (:func:`pretrieve.train.reranker.teacher_groups`)."""

    max_negatives: int | None = None
    batch_size: int = 64
    max_len: int | None = None
    device: str = "auto"
    precision: str = "auto"


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if "reranker" not in given or "mined" not in given:
        raise ConfigError(f"{where}: needs a 'reranker' stage and mined groups earlier in the recipe")


@stage("teacher", TeacherOptions, needs=needs, gives="teacher")
def stage_teacher(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    out = state.out / "teacher" / "groups.jsonl"
    outputs.remove_leftovers(out.parent, depth=0)
    state.groups["teacher"] = str(teacher_groups(state.reranker, state.data, state.groups["mined"], out,
                                                 show_progress=show_progress, **options))
