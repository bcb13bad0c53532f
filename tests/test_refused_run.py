"""A refused `pretrieve run` leaves its output directory as it found it (issue 22, item 6): refused after the lock
is taken (the dev split cannot be carved) or at stage 1 (a stage precondition fails), it writes no
`recipe.resolved.json` and leaves no lock file — a fresh output directory is not created at all, an existing one
keeps exactly its files — and a corrected recipe then runs in it normally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pretrieve.errors import ConfigError
from pretrieve.outputs import LOCK_FILE, DirectoryLock
from pretrieve.recipe import run_recipe

from test_finetune import write_collection


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_collection(tmp_path_factory.mktemp("refused") / "tiny")


def _recipe(path: Path, out: Path, model: Path, data: Path, stages: list, **extra) -> Path:
    path.write_text(yaml.safe_dump({"out": str(out), "model": str(model), "data": str(data), "stages": stages,
                                    **extra}))
    return path


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# refused after the lock is taken (20 training queries cannot give 1000 dev queries), and at stage 1 (the tiny
# model has 160 positions)
REFUSALS = {
    "after the lock": ({"dev": {"queries": 1000}}, [{"evaluate": {"split": "test", "depth": 20, "zero_shot": True}}],
                       "leaves none to fine-tune on"),
    "at stage 1": ({}, [{"pretrain": {"method": "mlm", "max_len": 512, "max_steps": 2, "batch_size": 4}},
                        {"evaluate": {"split": "test", "depth": 20, "zero_shot": True}}], "exceeds the model's 160 positions"),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_refused_run_does_not_create_its_output_directory(tiny_mlm_dir, data, tmp_path, refusal):
    extra, stages, message = REFUSALS[refusal]
    out = tmp_path / "new" / "out"
    recipe = _recipe(tmp_path / "recipe.yaml", out, tiny_mlm_dir, data, stages, **extra)
    with pytest.raises(ConfigError, match=message):
        run_recipe(recipe, show_progress=False)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_refused_run_leaves_an_existing_output_directory_as_it_was(tiny_mlm_dir, data, tmp_path, refusal):
    extra, stages, message = REFUSALS[refusal]
    out = tmp_path / "out"
    out.mkdir()
    (out / "recipe.resolved.json").write_text(json.dumps({"name": "the previous recipe"}))
    (out / "notes.txt").write_text("the user's own file\n")
    before = _snapshot(out)
    recipe = _recipe(tmp_path / "recipe.yaml", out, tiny_mlm_dir, data, stages, **extra)
    with pytest.raises(ConfigError, match=message):
        run_recipe(recipe, show_progress=False)
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "recipe.resolved.json"]   # no lock, no stage dir


def test_a_corrected_recipe_runs_where_one_was_refused(tiny_mlm_dir, data, tmp_path):
    out = tmp_path / "out"
    extra, stages, message = REFUSALS["at stage 1"]
    with pytest.raises(ConfigError, match=message):
        run_recipe(_recipe(tmp_path / "refused.yaml", out, tiny_mlm_dir, data, stages), show_progress=False)
    evaluate = [{"evaluate": {"split": "test", "depth": 20, "zero_shot": True}}]
    results = run_recipe(_recipe(tmp_path / "fixed.yaml", out, tiny_mlm_dir, data, evaluate, name="fixed"),
                         show_progress=False)
    assert [row["retriever"] for row in results["rows"]] == ["zero-shot"]
    resolved = json.loads((out / "recipe.resolved.json").read_text())
    assert resolved["name"] == "fixed" and resolved["stages"] == evaluate
    assert not (out / LOCK_FILE).exists()
    with DirectoryLock(out):   # released: the next command takes it
        pass


def test_a_lock_leaves_no_file_behind(tmp_path):
    with DirectoryLock(tmp_path):
        assert (tmp_path / LOCK_FILE).exists()
    assert list(tmp_path.iterdir()) == []
