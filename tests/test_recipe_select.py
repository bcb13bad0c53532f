"""The ``select`` stage ("do no harm", issue 21): the off-the-shelf model, WiSE-FT interpolations and the fine-tuned
model, each fused with BM25 with weights fitted on dev; the final fusion uses what dev prefers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pretrieve.errors import ConfigError
from pretrieve.modeling.interpolate import weight_key
from pretrieve.recipe import load_recipe, run_recipe
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.stages import select
from pretrieve.retrieval.fusion import FusionSpec

from test_pipeline import _fusion_recipe, collections, spy_on_fits, training_queries  # noqa: F401  (a fixture)

SELECT = {"select": {"name": "final", "alphas": [0.5], "step": 0.25, "depth": 20}}


def test_select_compares_every_candidate_on_dev_and_the_final_row_uses_the_best(tiny_mlm_dir, collections, tmp_path,
                                                                                monkeypatch):
    fitted_on = spy_on_fits(monkeypatch)
    train, other = collections
    results = run_recipe(_fusion_recipe(tmp_path, tiny_mlm_dir, train, other, final=SELECT), show_progress=False)
    out = tmp_path / "out"
    # no query fine-tuned or mined on is used to fit a fusion or to choose the model: every fit saw dev queries only
    dev = set(json.loads(next(out.glob("dev-split/*/folds.json")).read_text())["queries"]["dev"])
    trained = training_queries(out)
    assert len(fitted_on) == 3 and not dev & trained       # one fit per candidate (rrf fits nothing)
    assert all(used <= dev for used in fitted_on)
    finals = [row for row in results["rows"] if row["retriever"] == "final"]
    selection = finals[0]["fusion"]["selection"]
    names = [c["name"] for c in selection["candidates"]]
    assert names == ["zero-shot", "wise-0.5", "finetune-s1"] and selection["split"] == "dev"
    assert selection["model"] == "finetune-s1"
    # results.json keeps every select stage's choice, with or without an evaluate stage (recipe_defaults.py reads it)
    assert json.loads((out / "results.json").read_text())["selections"] == {"final": selection}
    scores = {c["name"]: c["fused"] for c in selection["candidates"]}
    crossed = {c["name"]: c["cross_fitted"] for c in selection["candidates"]}    # method auto: chosen cross-fitted
    assert selection["chosen"] == next(n for n in names if crossed[n] == max(crossed.values()))
    assert recipe_defaults().dev_scores(out) == {"final": crossed[selection["chosen"]], "chosen": selection["chosen"],
                                                 "alone": selection["candidates"][-1]["alone"],
                                                 "queries": selection["queries"]}
    for c in selection["candidates"]:   # each model's fusion: the method whose cross-fitted score is highest
        assert [m["fusion"].split("(")[0] for m in c["methods"]] == ["rrf", "wsum"]
        assert c["cross_fitted"] == max(m["cross_fitted"] for m in c["methods"])
        assert c["methods"][0]["cross_fitted"] == c["methods"][0]["score"]   # RRF fits nothing
    assert all(row["fusion"]["runs"] == ["bm25", selection["chosen"]] for row in finals)
    for candidate in names:
        fitted = json.loads((out / "fuse" / f"final.{candidate}" / "fusion.json").read_text())
        assert fitted["fit"]["split"] == "dev" and fitted["fit"]["score"] == scores[candidate]
    # the interpolation is the mean of the weights fine-tuning started from and the fine-tuned ones
    wise = out / "select" / "wise-0.5"
    record = json.loads((wise / "interpolation.json").read_text())
    assert record["alpha"] == 0.5 and record["base"] == str(tiny_mlm_dir) and record["tensors_interpolated"] > 0
    base = {weight_key(n): t for path in tiny_mlm_dir.glob("*.safetensors") for n, t in load_file(str(path)).items()}
    compared = 0
    for path in wise.rglob("*.safetensors"):
        tuned = load_file(str(Path(record["finetuned"]) / path.relative_to(wise)))
        for name, tensor in load_file(str(path)).items():
            if tensor.is_floating_point() and weight_key(name) in base and not tuned[name].equal(base[weight_key(name)]):
                assert torch.allclose(tensor, 0.5 * base[weight_key(name)] + 0.5 * tuned[name], atol=1e-6), name
                compared += 1
    assert compared > 0
    markdown = (out / "results.md").read_text()
    assert "Dev selection of `final`" in markdown and f"**{selection['chosen']}** (chosen)" in markdown
    assert "ties go to the candidate closest to the off-the-shelf model" in markdown
    assert "| candidate | alone | fused | cross-fitted | fusion | every fusion tried: fused / cross-fitted |" in markdown
    assert markdown.count("rrf(k=60) ") >= len(selection["candidates"])     # each candidate's RRF is listed
    for row in finals:   # test rows exist for the chosen candidate's fusion on both collections
        assert Path(row["run"]).exists()


def experiment_script(name: str):
    """scripts/experiments/NAME.py as a module (a script beside its siblings, not a package)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts" / "experiments"
    spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe_defaults():
    return experiment_script("recipe_defaults")


def test_the_cross_collection_check_adds_the_zero_shot_collections_to_the_demos_own_run(tmp_path):
    """Amendment 7: the shipped recipe, on the demo's output, with one more evaluate stage — every other stage and
    setting as shipped (so the run's models, dev choice and run files are reused, not recomputed)."""
    across = experiment_script("recipe_across_collections")
    shipped = yaml.safe_load(across.RECIPE.read_text())
    recipe = across.zero_shot_recipe(tmp_path / "demo")
    assert recipe["out"] == str((tmp_path / "demo").resolve())
    assert {k: v for k, v in recipe.items() if k not in ("out", "stages")} == \
        {k: v for k, v in shipped.items() if k not in ("out", "stages")}
    assert recipe["stages"][:-1] == shipped["stages"]
    added = recipe["stages"][-1]["evaluate"]
    assert added["collections"] == ["med", "lisa", "time", "adi"] and added["retrievers"] == ["finetune-s2"]
    assert added["final"] == "final" and added["compare"] == shipped["stages"][-1]["evaluate"]["compare"]
    assert not set(added["collections"]) & {c for stage in shipped["stages"] if "evaluate" in stage
                                              for c in stage["evaluate"]["collections"]}
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert [next(iter(stage)) for stage in load_recipe(path)["stages"]][-2:] == ["evaluate", "evaluate"]


def test_choose_prefers_the_best_and_on_a_tie_the_candidate_closest_to_the_off_the_shelf_model():
    assert select.choose({"zero-shot": 0.5, "wise-0.5": 0.5, "finetune-s2": 0.4}) == "zero-shot"
    assert select.choose({"zero-shot": 0.5, "wise-0.5": 0.5 + 1e-14, "finetune-s2": 0.4}) == "zero-shot"
    assert select.choose({"zero-shot": 0.5, "wise-0.5": 0.51, "finetune-s2": 0.52}) == "finetune-s2"
    assert select.choose({"zero-shot": 0.5, "wise-0.5": 0.53, "finetune-s2": 0.52}) == "wise-0.5"


def test_where_fine_tuning_hurts_on_dev_final_is_the_fitted_zero_shot_fusion(tmp_path, monkeypatch):
    state = RunState(recipe={"dev": {"seed": 0}, "finetune": {}}, out=tmp_path, data=tmp_path, base_model="base",
                     given={"retriever": {"finetune-s1": "ft1", "finetune-s2": "ft2"}})
    dev_scores = {"zero-shot": 0.61, "wise-0.25": 0.60, "wise-0.5": 0.58, "finetune-s2": 0.55}   # cross-fitted
    in_sample = {"zero-shot": 0.62, "wise-0.25": 0.63, "wise-0.5": 0.64, "finetune-s2": 0.66}   # optimistic: unused
    fits = []

    def fake_fit(state, name, components, candidates, split, measure, step, depth, k, show_progress):
        fits.append((name, components, split, candidates))
        candidate = components[-1]
        return FusionSpec("wsum", "zscore", (0.5, 0.5), fit={"score": in_sample[candidate], "queries": 81,
                                                              "cross_fitted": dev_scores[candidate],
                                                              "single_runs": {"run0": 0.4, "run1": 0.3}})

    monkeypatch.setattr(select, "fit_fusion", fake_fit)
    monkeypatch.setattr(select, "interpolated", lambda state, finetuned, alpha, out: f"{finetuned}@{alpha}")
    select.stage_select(state, {"alphas": [0.5, 0.25]}, "select", False)
    assert [f[0] for f in fits] == ["final.zero-shot", "final.wise-0.25", "final.wise-0.5", "final.finetune-s2"]
    assert all(split == "dev" and components[0] == "bm25" for _, components, split, _ in fits)
    assert all(candidates == [("rrf", None), ("wsum", "zscore")] for *_, candidates in fits)   # method auto
    assert state.named("candidate") == {"wise-0.25": "ft2@0.25", "wise-0.5": "ft2@0.5"}
    entry = state.named("fusion")["final"]
    assert state.report["selections"]["final"] is entry["selection"]
    assert entry["runs"] == ["bm25", "zero-shot"] and entry["selection"]["chosen"] == "zero-shot"
    assert entry["fitted"] == tmp_path / "fuse" / "final.zero-shot" / "fusion.json"
    assert [c["cross_fitted"] for c in entry["selection"]["candidates"]] == list(dev_scores.values())
    assert [c["fused"] for c in entry["selection"]["candidates"]] == list(in_sample.values())


@pytest.mark.parametrize("stage, dev, message", [
    ({"select": {"alphas": [0.5, 1.0]}}, {"seed": 0}, "strictly between 0 and 1"),
    ({"select": {"alphas": [0.5, 0.5]}}, {"seed": 0}, "distinct"),
    ({"select": {"model": "finetune-s7"}}, {"seed": 0}, r"select\.model: no retriever named 'finetune-s7'"),
    ({"select": {}}, None, "would fit the weight of finetune-s1 on the 'train' queries it was trained on"),
    ({"select": {"method": "best"}}, {"seed": 0}, "fusion method must be one of"),
])
def test_select_errors_are_clear_before_anything_runs(tmp_path, collections, stage, dev, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(_fusion_recipe(tmp_path, Path("m"), *collections, dev=dev, final=stage))
