"""A recipe is refused whole before any stage runs (issue 39, review items N4/N5): names of retrievers and fusions
that are paths, in fuse / select / evaluate, an ``out`` that is a collection's own folder, and a YAML file nested
thousands of levels deep are each one line, not a late refusal after training nor a RecursionError traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pretrieve.errors import ConfigError, InputError
from pretrieve.recipe.schema import load_recipe, validate_recipe

from test_finetune import tiny_collection  # noqa: F401 - a fixture


def _recipe(*stages) -> dict:
    return {"out": "o", "model": "m", "data": "d", "stages": [{"finetune": {"stage": 1}}, *stages]}


@pytest.mark.parametrize("stage, where", [
    ({"fuse": {"name": "../../../escaped", "runs": ["bm25", "zero-shot"]}}, r"stages\[1\]\.fuse\.name"),
    ({"fuse": {"runs": ["bm25", "zero-shot/../../../etc"]}}, r"stages\[1\]\.fuse\.runs\[1\]"),
    ({"select": {"name": "/abs"}}, r"stages\[1\]\.select\.name"),
    ({"select": {"runs": ["bm25", ".."]}}, r"stages\[1\]\.select\.runs\[1\]"),
    ({"select": {"model": "a/b"}}, r"stages\[1\]\.select\.model"),
    ({"evaluate": {"final": "../../x"}}, r"stages\[1\]\.evaluate\.final"),
    ({"evaluate": {"final": "finetune-s1", "compare": ["a b"]}}, r"stages\[1\]\.evaluate\.compare\[0\]"),
])
def test_path_like_names_are_refused_with_the_whole_recipe(stage, where):
    with pytest.raises(ConfigError, match=where + r": .* is not a name"):
        validate_recipe(_recipe(stage))


def test_ordinary_names_pass():
    validate_recipe(_recipe({"fuse": {"name": "rrf-1", "runs": ["bm25", "finetune-s1"]}},
                            {"evaluate": {"bm25": True, "final": "rrf-1", "compare": ["bm25"]}}))


def test_a_deeply_nested_recipe_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("x: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(InputError, match="nested more than 50 levels deep"):
        load_recipe(deep)
    medium = tmp_path / "medium.yaml"   # parses, but no config is 200 levels deep
    medium.write_text("out: o\nmodel: m\ndata: d\nstages: " + "[" * 200 + "]" * 200)
    with pytest.raises(InputError, match="nested more than 50 levels deep"):
        load_recipe(medium)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "pretrieve", "run", str(deep)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {deep}: config file is nested more than 50 levels deep or "
                                                  "refers to itself (a YAML alias of an enclosing node); a config is "
                                                  "a few levels deep"]


def test_out_may_not_be_the_collection_itself(tiny_mlm_dir, tiny_collection, tmp_path):
    from pretrieve.recipe import run_recipe

    before = sorted(p.relative_to(tiny_collection) for p in tiny_collection.rglob("*"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"out": str(tiny_collection), "model": str(tiny_mlm_dir),
                                      "data": str(tiny_collection),
                                      "stages": [{"evaluate": {"bm25": True, "zero_shot": True}}]}))
    with pytest.raises(InputError, match="field 'out': is the collection .* itself"):
        run_recipe(recipe, show_progress=False)
    assert sorted(p.relative_to(tiny_collection) for p in tiny_collection.rglob("*")) == before
