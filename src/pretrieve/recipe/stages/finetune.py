"""The ``finetune`` stage: fine-tuning stage 1, 2 or 3 (:func:`pretrieve.train.finetuner.finetune`) in
``finetune-s<stage>/``.

``init`` says where a stage starts: ``pretrained`` (the default) re-initialises from the pre-trained checkpoint (or
the base model), as CDMAE, SimLM, Tevatron, bowdpr, CoT-MAE-qc and RetroMAE do; ``previous`` continues from the
latest fine-tuned retriever, as STAR (which CPDAE follows) continues stage 2 from its BM25 warm-up model. The
recipe's top-level ``finetune`` options are shared by every fine-tuning stage. Stage 2 trains on the
latest mined groups (a ``mine`` stage before it), stage 3 on the teacher's (a ``teacher`` stage), unless ``groups``
names a file. ``eval_steps`` evaluates on the recipe's dev queries by default (its ``dev`` split of the training
collection; ``eval_split`` / ``eval_data`` name others), and the stage's retriever is then the best evaluated model
(:mod:`pretrieve.train.evaluator`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pretrieve.errors import ConfigError
from pretrieve.recipe.dev import dev_split, training_split
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import RECIPE_SETS, check_training, stage
from pretrieve.train.finetuner import FinetuneConfig, build_finetune_config, finetune

#: Stage → what its groups come from (the ``gives`` of the stage that made them).
GROUPS = {2: "mined", 3: "teacher"}
PRODUCERS = {"mined": "mine", "teacher": "teacher"}
#: ``--smoke``: option → the smoke cap (its default: the declaration's).
SMOKE_CAPS = {"num_negatives": 3, "query_max_len": 16, "passage_max_len": 48, "bm25_depth": 30}


@dataclass
class FinetuneStageOptions(FinetuneConfig):
    """A fine-tuning stage's options: its run config plus where it starts from (module docstring)."""

    init: Literal["pretrained", "previous"] = "pretrained"


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    shared = recipe.get("finetune", {})
    merged = {**shared, **options}
    stage_no = int(merged.get("stage", len(given.get("retriever", [])) + 1))   # as the stage counts
    source = GROUPS.get(stage_no)
    if source is not None and "groups" not in options and "groups" not in shared and source not in given:
        raise ConfigError(f"{where}: stage {stage_no} needs the '{PRODUCERS[source]}' stage earlier in the recipe")
    if merged.get("eval_steps") and not merged.get("eval_split") and not merged.get("eval_data") \
            and dev_split(recipe) is None:
        raise ConfigError(f"{where}.eval_steps: evaluating while training needs dev queries: give the recipe a 'dev' "
                          "split (e.g. dev: {seed: 0}) or name eval_split / eval_data")
    if merged.get("init") == "previous" and "retriever" not in given:
        raise ConfigError(f"{where}.init: 'previous' needs a fine-tuning stage earlier in the recipe")


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: the training budget (:class:`pretrieve.recipe.smoke.SmokeKit`); the recipe's shared ``finetune``
    options are capped with the defaults written out, a stage's own values only (it inherits the capped shared
    ones)."""
    return kit.training(options, FinetuneConfig, SMOKE_CAPS, defaults=kit.shared)


def reads(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The training collection's split it trains on."""
    return [(str(recipe["data"]), str(options.get("split", training_split(recipe))))]


def label(options: Mapping[str, Any], recipe: Mapping[str, Any], count: int) -> str:
    """``finetune-s<stage>``: the stage's ``stage``, else the shared one, else its place among the fine-tuning
    stages."""
    return f"finetune-s{options.get('stage', (recipe.get('finetune') or {}).get('stage', count))}"


@stage("finetune", FinetuneStageOptions, set_by_recipe=RECIPE_SETS, check=check_training(FinetuneConfig), needs=needs,
       gives="retriever", smoke=smoke, reads=reads, shared="finetune", label=label, trains=True)
def stage_finetune(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    values = {**state.recipe.get("finetune", {}), **state.seeded(options)}
    init = state.latest("retriever") if values.pop("init", "pretrained") == "previous" else state.init_model
    stage_no = int(values.setdefault("stage", len(state.named("retriever")) + 1))
    if values.get("eval_steps") and not values.get("eval_split") and not values.get("eval_data"):
        values["eval_split"] = dev_split(state.recipe)   # the recipe's dev queries (checked by needs)
    if stage_no in GROUPS and "groups" not in values:
        values["groups"] = state.latest(GROUPS[stage_no])
    flags = {**values, "model": init, "data": str(state.data), "out": str(state.out / label),
             "show_progress": show_progress}
    config = build_finetune_config({}, flags, resume=True)
    state.give("retriever", label, str(finetune(config)))
