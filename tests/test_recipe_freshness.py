"""The recipe never reports a number from an output another model (or a cut file) produced; outputs are
relocatable; the whole recipe is checked (options and collections) before its first stage runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pretrieve.errors import ConfigError, InputError
from pretrieve.recipe import load_recipe, results_are_current, run_recipe
from pretrieve.train import loop

from test_finetune import write_collection

FAST = {"max_steps": 4, "batch_size": 4, "warmup_ratio": 0.0, "log_every": 1, "save_every": 2}
RUN = Path("runs") / "finetune-s1__train:train.trec"   # collection "train", split "train" (not test)


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    return write_collection(tmp_path_factory.mktemp("collections") / "train")


def _recipe(path: Path, out: Path, model: Path, data: Path, lr: float = 5e-4, **extra) -> Path:
    recipe = {"name": "tiny", "out": str(out), "model": str(model), "data": str(data), "seed": 7,
              "finetune": {**FAST, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20,
                           "lr": lr},
              "stages": [{"finetune": {"stage": 1}},
                         {"evaluate": {"collections": [str(data)], "split": "train", "depth": 20}}], **extra}
    path.write_text(yaml.safe_dump(recipe))
    return path


def _rows(results):
    return [{k: v for k, v in row.items() if k != "run"} for row in results["rows"]]


def test_redo_changed_reports_the_new_models_numbers(tiny_mlm_dir, collection, tmp_path):
    out = tmp_path / "out"
    run_recipe(_recipe(tmp_path / "a.yaml", out, tiny_mlm_dir, collection, lr=5e-4), show_progress=False)
    old_run = (out / RUN).read_text()

    changed = _recipe(tmp_path / "b.yaml", out, tiny_mlm_dir, collection, lr=5e-3)
    redone = run_recipe(changed, show_progress=False, redo_changed=True)
    fresh = run_recipe(_recipe(tmp_path / "c.yaml", tmp_path / "fresh", tiny_mlm_dir, collection, lr=5e-3),
                       show_progress=False)
    new_run = (out / RUN).read_text()
    assert new_run != old_run                                      # the retrained model ranks differently ...
    assert new_run == (tmp_path / "fresh" / RUN).read_text()       # ... and its run is the one evaluated
    assert _rows(redone) == _rows(fresh)
    assert json.loads((out / "results.json").read_text())["rows"] == redone["rows"]
    assert results_are_current(out)


def test_a_truncated_run_file_is_searched_again(tiny_mlm_dir, collection, tmp_path):
    recipe = _recipe(tmp_path / "r.yaml", tmp_path / "out", tiny_mlm_dir, collection)
    first = run_recipe(recipe, show_progress=False)
    run_file = tmp_path / "out" / RUN
    full = run_file.read_text()
    lines = full.splitlines(keepends=True)
    run_file.write_text("".join(lines[:len(lines) // 3]))           # cut at a line boundary: still a valid run
    assert not results_are_current(tmp_path / "out")
    again = run_recipe(recipe, show_progress=False)
    assert run_file.read_text() == full and _rows(again) == _rows(first)


def test_a_copied_output_directory_is_reused_not_refused(tiny_mlm_dir, collection, tmp_path, monkeypatch):
    first = run_recipe(_recipe(tmp_path / "r.yaml", tmp_path / "out", tiny_mlm_dir, collection), show_progress=False)
    shutil.copytree(tmp_path / "out", tmp_path / "moved" / "out")      # e.g. moved to another disk
    shutil.rmtree(tmp_path / "out")

    def no_training(*args, **kwargs):
        raise AssertionError("a finished stage was trained again")

    monkeypatch.setattr(loop, "train_step", no_training)
    moved = run_recipe(_recipe(tmp_path / "m.yaml", tmp_path / "moved" / "out", tiny_mlm_dir, collection),
                       show_progress=False)
    assert _rows(moved) == _rows(first)


# ------------------------------------------------------------------------------------------ validation
def _write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _full_recipe(tmp_path: Path, data: Path) -> dict:
    return {"name": "x", "out": str(tmp_path / "out"), "model": "minilm", "data": str(data), "seed": 1,
            "finetune": {"lr": 2e-5},
            "stages": [{"pretrain": {"method": "bow", "max_steps": 2}}, {"finetune": {"stage": 1}},
                       {"mine": {"depth": 10}}, {"finetune": {"stage": 2}}, {"reranker": {"max_steps": 2}},
                       {"teacher": {"max_negatives": 3}}, {"finetune": {"stage": 3}},
                       {"evaluate": {"collections": [str(data)], "zero_shot": True}}]}


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["stages"][5]["teacher"].update(max_negative=3),
     r"stages\[5\]\.teacher\.max_negative: unknown option; did you mean max_negatives\?"),
    (lambda r: r["stages"][2]["mine"].update(dept=3), r"stages\[2\]\.mine\.dept: unknown option; did you mean depth\?"),
    (lambda r: r["stages"][4]["reranker"].update(num_negative=3),
     r"stages\[4\]\.reranker\.num_negative: unknown option; did you mean num_negatives\?"),
    (lambda r: r["stages"][7]["evaluate"].update(zeroshot=True),
     r"stages\[7\]\.evaluate\.zeroshot: unknown option; did you mean zero_shot\?"),
    (lambda r: r.update(sed=3), r"recipe\.yaml: sed: unknown option; did you mean seed\?"),
    (lambda r: r["finetune"].update(lr="abc"), r"finetune\.lr: expected a number, got 'abc'"),
    (lambda r: r["stages"][0]["pretrain"].update(max_steps="many"),
     r"stages\[0\]\.pretrain\.max_steps: expected an integer, got 'many'"),
    (lambda r: r["stages"][0]["pretrain"].update(method="bowl"), r"stages\[0\]\.pretrain: unknown method 'bowl'"),
    (lambda r: r["stages"][1]["finetune"].update(out="x"), r"stages\[1\]\.finetune\.out: each stage writes under"),
    (lambda r: r["stages"].insert(0, {"mine": {}}), r"stages\[0\]\.mine: needs a fine-tuned retriever"),
])
def test_every_typo_in_a_recipe_is_refused_with_its_path_before_any_stage_runs(tmp_path, collection, monkeypatch,
                                                                             edit, message):
    from pretrieve.recipe import runner

    recipe = _full_recipe(tmp_path, collection)
    edit(recipe)
    ran = []
    monkeypatch.setattr(runner, "run_stage", lambda *args, **kwargs: ran.append(args))
    with pytest.raises((ConfigError, InputError), match=message):
        run_recipe(_write(tmp_path, recipe), show_progress=False)
    assert not ran and not (tmp_path / "out").exists()


def test_yaml_numbers_that_pyyaml_reads_as_text_are_coerced(tmp_path, collection):
    path = tmp_path / "recipe.yaml"
    path.write_text(f"out: {tmp_path / 'out'}\nmodel: minilm\ndata: {collection}\nfinetune:\n  lr: 1e-4\n"
                    "stages:\n  - finetune: {stage: 1, epochs: 2, max_steps: '3'}\n  - evaluate: {}\n")
    assert yaml.safe_load(path.read_text())["finetune"]["lr"] == "1e-4"      # YAML 1.1: a string
    recipe = load_recipe(path)
    assert recipe["finetune"]["lr"] == 1e-4 and recipe["stages"][0]["finetune"]["max_steps"] == 3


def test_every_missing_collection_is_reported_before_the_first_stage(tmp_path, collection, monkeypatch):
    monkeypatch.setenv("PRETRIEVE_OFFLINE", "1")
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PRETRIEVE_DATA", str(tmp_path / "data"))
    from pretrieve.data import registry

    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)   # this machine's ../shared/data has cranfield
    recipe = _full_recipe(tmp_path, collection)
    recipe["stages"][-1]["evaluate"]["collections"] = [str(collection), "cranfield", "nosuchset"]
    with pytest.raises(InputError) as error:
        run_recipe(_write(tmp_path, recipe), show_progress=False, data_root=tmp_path / "mine")
    message = str(error.value)
    assert "'cranfield'" in message and "'nosuchset'" in message
    assert str(tmp_path / "mine" / "cranfield") in message and str(tmp_path / "data" / "nosuchset") in message
    assert not (tmp_path / "out").exists()
    # --data-root points a recipe at the user's own copies
    (tmp_path / "mine").mkdir()
    shutil.copytree(collection, tmp_path / "mine" / "cranfield")
    shutil.copytree(collection, tmp_path / "mine" / "nosuchset")
    from pretrieve.data.registry import resolve_collections
    from pretrieve.recipe.schema import recipe_collections

    found = resolve_collections(recipe_collections(load_recipe(_write(tmp_path, recipe))), {},
                                data_root=tmp_path / "mine")
    assert found["cranfield"] == tmp_path / "mine" / "cranfield"
