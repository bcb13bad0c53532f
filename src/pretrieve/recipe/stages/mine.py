"""The ``mine`` stage: hard negatives from the latest fine-tuned retriever's top-K minus the judged positives
(:func:`pretrieve.retrieval.mining.mine_negatives`), in ``mine/groups.jsonl``.

After stage 1 it mines the stage-2 negatives; a second ``mine`` after stage 2 (``mine-2/``, CDMAE's (Li et al. 2023)
K₃ negatives of the stage-2 retriever) replaces the mined groups the reranker and the teacher use. The corpus index
is the one the evaluate stage uses for the same retriever and collection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pretrieve import outputs
from pretrieve.errors import ConfigError
from pretrieve.recipe.dev import training_split
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import stage
from pretrieve.retrieval.mining import mine_negatives


@dataclass
class MineOptions:
    """Options of the ``mine`` stage (:func:`pretrieve.retrieval.mining.mine_negatives`)."""

    depth: int = 200
    split: str = "train"
    batch_size: int = 64
    max_length: int | None = None
    query_max_length: int | None = None
    device: str = "auto"
    precision: str = "auto"       # auto: bf16 only where the hardware has it natively, else fp32
    factory: str = "Flat"         # a FAISS index factory string for dense vectors; Flat: exact
    bf16: bool = False            # deprecated spelling of precision: bf16


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if "retriever" not in given:
        raise ConfigError(f"{where}: needs a fine-tuned retriever earlier in the recipe (a 'finetune' stage)")


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: depth ≤ 10."""
    options["depth"] = min(int(options.get("depth", 200)), 10)
    return options


def reads(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The training collection's split it mines for."""
    return [(str(recipe["data"]), str(options.get("split", training_split(recipe))))]


@stage("mine", MineOptions, needs=needs, gives="mined", smoke=smoke, reads=reads, trains=True)
def stage_mine(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    name, retriever = list(state.named("retriever").items())[-1]
    values = dict(options)
    split = values.pop("split", "train")
    out = state.out / label / "groups.jsonl"   # mine-2 (CDMAE: stage-2 negatives for stage 3) beside mine
    outputs.check_writable(out, directory=False)
    outputs.remove_leftovers(out.parent, depth=0)
    path = mine_negatives(retriever, state.data, split, out, cache_dir=state.embeddings(name, state.data),
                          show_progress=show_progress, **values)
    state.give("mined", label, str(path))   # the latest is the one read (mine-2 after mine)
