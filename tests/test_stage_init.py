"""Where a fine-tuning stage starts (``init: pretrained | previous``): STAR (CPDAE) continues stage 2 from the
stage-1 model; the other papers restart every stage from the pre-trained checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import REPO
from pretrieve.errors import ConfigError
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import load_recipe, stage_labels, validate_recipe
from pretrieve.recipe.stages.finetune import stage_finetune
from pretrieve.train.finetuner import BM25_GROUPS_FILE
from test_finetune import write_collection

TINY = {"batch_size": 4, "num_negatives": 3, "warmup_ratio": 0.0, "log_every": 1, "save_every": 0,
        "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20, "pooling": "mean"}


def weights(directory: str | Path) -> dict:
    return load_file(str(Path(directory) / "model.safetensors"))


def differs(a: dict, b: dict) -> bool:
    return any(not a[name].allclose(b[name], atol=1e-6) for name in a)


def test_init_previous_starts_stage2_from_the_stage1_weights(tiny_bert_dir, tmp_path):
    data = write_collection(tmp_path / "tiny")
    state = RunState(recipe={"finetune": TINY, "seed": 0}, out=tmp_path / "out", data=data,
                     base_model=str(tiny_bert_dir))
    stage_finetune(state, {"stage": 1, "max_steps": 5, "lr": 1e-3}, "finetune-s1", False)
    stage1 = weights(state.named("retriever")["finetune-s1"])
    assert differs(stage1, weights(tiny_bert_dir))
    state.give("mined", "mine", str(tmp_path / "out" / "finetune-s1" / BM25_GROUPS_FILE))
    # one step at a negligible learning rate: the exported weights are where the stage started
    for init, label in (("previous", "finetune-s2"), ("pretrained", "finetune-s2-pretrained")):
        stage_finetune(state, {"stage": 2, "max_steps": 1, "lr": 1e-12, "init": init}, label, False)
    retrievers = state.named("retriever")
    continued, restarted = weights(retrievers["finetune-s2"]), weights(retrievers["finetune-s2-pretrained"])
    assert set(continued) == set(stage1) and not differs(continued, stage1)
    assert differs(restarted, stage1) and not differs(restarted, {k: v for k, v in weights(tiny_bert_dir).items()
                                                                  if k in restarted})


def test_init_previous_needs_an_earlier_fine_tuning_stage_and_a_known_value():
    base = {"out": "o", "model": "m", "data": "d"}
    with pytest.raises(ConfigError, match=r"stages\[0\]\.finetune\.init: 'previous' needs a fine-tuning stage"):
        validate_recipe({**base, "stages": [{"finetune": {"stage": 1, "init": "previous"}}]})
    with pytest.raises(ConfigError, match=r"stages\[0\]\.finetune\.init"):
        validate_recipe({**base, "stages": [{"finetune": {"stage": 1, "init": "last"}}]})
    validate_recipe({**base, "stages": [{"finetune": {"stage": 1}},
                                        {"finetune": {"stage": 2, "init": "previous", "groups": "g.jsonl"}}]})


@pytest.mark.parametrize("recipe", ["bow", "dupmae", "cpdae", "cdmae", "cotmae", "cotmote"])
def test_only_cpdae_continues_from_the_previous_stage(recipe):
    loaded = load_recipe(REPO / "configs" / f"{recipe}-msmarco.yaml")
    inits = {label: {**loaded["finetune"], **options}.get("init", "pretrained")
             for kind, label, options in stage_labels(loaded) if kind == "finetune"}
    expected = {label: "previous" if recipe == "cpdae" and label == "finetune-s2" else "pretrained" for label in inits}
    assert inits == expected
