"""The ``pretrain`` stage: a pre-training phase (:func:`pretrieve.train.pretrainer.pretrain`) in ``pretrain/``.

Several ``pretrain`` stages are phases (Drop your Decoder, Ma et al. 2024: Wikipedia + BookCorpus, then MS MARCO):
each continues from the previous one's encoder, in ``pretrain/``, ``pretrain-2/``, …; fine-tuning starts from the
last. The corpus defaults to the training collection; a collection name is resolved like every other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pretrieve.data.pretrain_text import split_corpus
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import RECIPE_SETS, placeholder_config, stage
from pretrieve.train import pretrainer
from pretrieve.train.run_config import build_pretrain_config, resolve_pretrain_method
from pretrieve.train.settings import PretrainOptions


def check_pretrain(options: dict[str, Any], where: str) -> None:
    values = dict(options)
    resolve_pretrain_method(values, {}, where=f"{where}.method")
    placeholder_config(pretrainer.PretrainConfig, values).validate(1)


#: ``--smoke``: option → the smoke cap (its default: the declaration's).
SMOKE_CAPS = {"max_len": 48}


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    """``--smoke``: the training budget, a small text corpus standing for ``corpus`` (and for the sources packed
    across documents), and the method's pairs file sliced (its PMI statistics files dropped)."""
    options = kit.training(options, PretrainOptions, SMOKE_CAPS)
    if "corpus" in options:
        options["corpus"] = kit.text_corpus(options["corpus"])
        if options.get("pack_across"):
            options["pack_across"] = [options["corpus"]]
    if "method" in options:
        options["method"] = kit.method(options["method"])
    return options


def reads(options: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The collection names among its ``corpus`` (passages only): neither a file nor a hub dataset (``hf:NAME`` is
    the pre-trainer's to load)."""
    corpus = options.get("corpus")
    return [(str(c), None) for c in (split_corpus(corpus) if corpus else [])
            if not str(c).startswith("hf:") and not Path(str(c)).expanduser().exists()]


@stage("pretrain", PretrainOptions, set_by_recipe={k: v for k, v in RECIPE_SETS.items() if k != "data"},
       check=check_pretrain, gives="pretrained", smoke=smoke, reads=reads)
def stage_pretrain(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    out = state.out / label   # a second pretrain stage (pretrain-2) continues from the first's encoder
    values = state.seeded(options)
    sources = [str(state.collections.get(str(source), source)) for source in split_corpus(values.get("corpus")
                                                                                         or state.data)]
    values["corpus"] = sources[0] if len(sources) == 1 else sources   # several: concatenated in order
    if values.get("pack_across"):   # named as in corpus
        values["pack_across"] = [str(state.collections.get(str(source), source)) for source in values["pack_across"]]
    flags = {**values, "model": state.init_model, "out": str(out), "show_progress": show_progress}
    config = build_pretrain_config({}, flags, {}, resume=True)
    state.give("pretrained", label, str(pretrainer.pretrain(config)))   # skipped when finished with the same settings
