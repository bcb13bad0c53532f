"""The ``reranker`` stage: a cross-encoder trained on the latest mined groups (or a ``groups`` file)
(:func:`pretrieve.train.reranker.train_reranker`), in ``reranker/``; by default from the recipe's base model."""

from __future__ import annotations

from typing import Any, Mapping

from pretrieve.errors import ConfigError
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import RECIPE_SETS, check_training, stage
from pretrieve.train.reranker import RerankerConfig, build_reranker_config, train_reranker


#: ``--smoke``: option → the smoke cap (its default: the declaration's).
SMOKE_CAPS = {"num_negatives": 3, "max_len": 64}


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if "mined" not in given and "groups" not in options:
        raise ConfigError(f"{where}: needs mined groups (a 'mine' stage earlier) or a 'groups' option")


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: the training budget, and a tiny model of the family of the one it names."""
    options = kit.training(options, RerankerConfig, SMOKE_CAPS)
    if "model" in options:
        options["model"] = kit.tiny_model(options["model"])
    return options


@stage("reranker", RerankerConfig, set_by_recipe={k: v for k, v in RECIPE_SETS.items() if k != "model"},
       check=check_training(RerankerConfig), needs=needs, gives="reranker", smoke=smoke, trains=True)
def stage_reranker(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    values = state.seeded(options)
    values.setdefault("groups", state.latest("mined"))
    values.setdefault("model", state.base_model)
    flags = {**values, "data": str(state.data), "out": str(state.out / "reranker"), "show_progress": show_progress}
    state.give("reranker", label, str(train_reranker(build_reranker_config({}, flags, resume=True))))
