"""Errors raised from Python name Python parameters, never command-line flags; ``run_recipe(dict)`` writes nothing
into an output directory another run holds."""

from __future__ import annotations

import json

import pytest

import pretrieve
from pretrieve.errors import ConfigError, OutputBusyError
from pretrieve.modeling.dual_encoder import CONFIG_FILE, FORMAT
from pretrieve.outputs import DirectoryLock
from pretrieve.retrieval.fusion import FusionSpec


def test_load_retriever_names_its_pooling_and_normalize_parameters(tmp_path):
    model = tmp_path / "finetuned"
    model.mkdir()
    (model / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, "representation": {"type": "dense"}}))
    for settings in ({"pooling": "mean"}, {"normalize": True}):
        with pytest.raises(ConfigError, match=r"^pooling/normalize do not apply") as caught:
            pretrieve.load_retriever(model, **settings)
        assert "--" not in str(caught.value)


def test_fusion_spec_errors_name_no_flag():
    with pytest.raises(ConfigError, match="rrf fuses ranks") as caught:
        FusionSpec("rrf", weights=(0.5, 0.5)).check(2)
    assert "--" not in str(caught.value) and "method wsum" in str(caught.value)


def test_a_recipe_dict_is_kept_only_once_the_output_is_locked(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "recipe.yaml").write_text("# the recipe of the run that holds this directory\n")
    recipe = {"name": "dict", "out": str(out), "model": "minilm", "data": "scifact",
              "stages": [{"evaluate": {"zero_shot": True}}]}
    holder = DirectoryLock(out)
    holder.acquire()
    try:
        with pytest.raises(OutputBusyError, match="being written by another pretrieve process"):
            pretrieve.run_recipe(recipe)
    finally:
        holder.release()
    assert (out / "recipe.yaml").read_text() == "# the recipe of the run that holds this directory\n"
