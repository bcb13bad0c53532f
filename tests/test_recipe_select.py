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


# ----------------------------------------------------------------------------------------------- the guard (issue 56)
def _scores(values: list[float], prefix: str = "q") -> dict[str, float]:
    return {f"{prefix}{i}": v for i, v in enumerate(values)}


def test_the_guard_refuses_a_candidate_significantly_below_the_untrained_fusion_pooled_or_in_one_collection():
    base = [0.5, 0.6, 0.4, 0.7, 0.3, 0.5, 0.6, 0.4]
    worse = [b - d for b, d in zip(base, [0.10, 0.12, 0.09, 0.11, 0.10, 0.13, 0.08, 0.10])]   # Δ −0.10375
    noisy = [b + d for b, d in zip(base, [0.2, -0.2, 0.1, -0.1, 0.15, -0.15, 0.05, -0.06])]  # Δ ≈ 0, p ≈ 0.98
    better = [b + 0.05 for b in base]
    refused = select.guard_verdict({"med": (_scores(base), _scores(worse))}, 0.10)
    assert not refused["admitted"] and refused["pooled"]["below"] and refused["per_collection"]["med"]["below"]
    assert refused["pooled"]["mean_difference"] == pytest.approx(-0.10375, abs=1e-6) and refused["pooled"]["queries"] == 8
    assert select.guard_verdict({"med": (_scores(base), _scores(noisy))}, 0.10)["admitted"]
    assert select.guard_verdict({"med": (_scores(base), _scores(better))}, 0.10)["admitted"]   # above is never refused
    # one collection significantly below is enough, even when the pool is not (a gain elsewhere must not hide it)
    mixed = select.guard_verdict({"med": (_scores(base), _scores(worse)),
                                  "lisa": (_scores(base, "l"), _scores([b + 0.3 for b in base], "l"))}, 0.10)
    assert not mixed["pooled"]["below"] and mixed["per_collection"]["med"]["below"] and not mixed["admitted"]
    # the threshold is the rule's p: a drop with p between 0.05 and 0.10 is refused at 0.10, admitted at 0.05
    slight = [b - d for b, d in zip(base, [0.05, -0.02, 0.06, 0.02, 0.05, -0.03, 0.04, 0.03])]
    p = select.guard_verdict({"med": (_scores(base), _scores(slight))}, 0.10)["pooled"]["p_value"]
    assert 0.05 < p <= 0.10
    assert not select.guard_verdict({"med": (_scores(base), _scores(slight))}, 0.10)["admitted"]
    assert select.guard_verdict({"med": (_scores(base), _scores(slight))}, 0.05)["admitted"]
    # the untrained fusion against itself: Δ 0 on every query, never refused
    assert select.guard_verdict({"med": (_scores(base), _scores(base))}, 0.10)["admitted"]


def test_dev_order_keeps_ties_in_the_listed_order():
    assert select.dev_order({"zero-shot": 0.5, "wise-0.5": 0.52, "finetune-s2": 0.52}) == \
        ["wise-0.5", "finetune-s2", "zero-shot"]


def test_the_guard_admits_the_best_dev_candidate_that_does_not_hurt_the_other_domains(tmp_path, monkeypatch):
    """finetune-s2 is best on dev but falls below the untrained RRF on the guard: refused; wise-0.5, next in dev
    order, is admitted; the candidates after it are never searched on the guard."""
    (tmp_path / "data").mkdir()
    state = RunState(recipe={"dev": {"seed": 0}, "finetune": {}}, out=tmp_path, data=tmp_path / "data",
                     base_model="base", given={"retriever": {"finetune-s2": "ft2"}})
    dev = {"zero-shot": 0.60, "wise-0.5": 0.63, "finetune-s2": 0.65}
    monkeypatch.setattr(select, "fit_fusion", lambda state, name, components, *a: FusionSpec(
        "wsum", "zscore", (0.5, 0.5), fit={"score": 0.7, "queries": 20, "cross_fitted": dev[components[-1]],
                                           "single_runs": {"run1": 0.4}}))
    monkeypatch.setattr(select, "interpolated", lambda state, finetuned, alpha, out: f"{finetuned}@{alpha}")
    monkeypatch.setattr(select, "guard_collections", lambda state, options, label: {"med": tmp_path / "med"})
    checked = []

    def fake_check(state, name, runs, candidate, spec, baseline, guards, options, show_progress):
        checked.append(candidate)
        return {"admitted": candidate != "finetune-s2", "pooled": {"mean_difference": -0.05, "p_value": 0.01},
                "per_collection": {}, "p": 0.1}

    monkeypatch.setattr(select, "guard_check", fake_check)
    monkeypatch.setattr(select, "split_query_ids", lambda path, split: {"a", "b"})
    select.stage_select(state, {"alphas": [0.5]}, "select", False)
    selection = state.named("fusion")["final"]["selection"]
    assert checked == ["finetune-s2", "wise-0.5"] and selection["chosen"] == "wise-0.5"
    assert state.named("fusion")["final"]["runs"] == ["bm25", "wise-0.5"]
    assert not selection["guard"]["fallback"] and selection["guard"]["p"] == 0.1
    assert [("guard" in c) for c in selection["candidates"]] == [False, True, True]
    # every candidate refused: final is the untrained RRF of BM25 and the off-the-shelf model
    monkeypatch.setattr(select, "guard_check", lambda *a: {"admitted": False, "pooled": {}, "per_collection": {}})
    state.given.pop("fusion")
    select.stage_select(state, {"alphas": [0.5]}, "select", False)
    entry = state.named("fusion")["final"]
    assert entry["runs"] == ["bm25", "zero-shot"] and entry["spec"].method == "rrf" and entry["fitted"] is None
    assert entry["selection"]["guard"]["fallback"] and entry["selection"]["fusion"] == "rrf(k=60)"


def test_the_guard_runs_end_to_end_and_its_queries_are_never_evaluated(tiny_mlm_dir, collections, tmp_path):
    train, other = collections
    guarded = {"select": {**SELECT["select"], "guard": [str(train), str(other)]}}
    results = run_recipe(_fusion_recipe(tmp_path, tiny_mlm_dir, train, other, final=guarded), show_progress=False)
    out = tmp_path / "out"
    selection = results["selections"]["final"]
    # the training collection is left out of its own guard; the other is halved: guard / evaluated
    assert list(selection["guard"]["collections"]) == [str(other)]
    folds = json.loads((out / "guard-split" / other.name / "folds.json").read_text())["queries"]
    evaluated = {row["collection"]: row for row in results["rows"] if row.get("final")}
    other_run = {line.split()[0] for line in Path(evaluated[other.name]["run"]).read_text().splitlines()}
    assert other_run == set(folds["test"]) and not other_run & set(folds["guard"])
    assert evaluated[train.name]["in_domain"] and not evaluated[other.name]["in_domain"]
    assert any("guard" in c for c in selection["candidates"])
    markdown = (out / "results.md").read_text()
    assert "Guard of `final`" in markdown and "**Which row to use**, per collection:" in markdown
    assert f"| {other.name} | `final` | not trained on it; the selection passed a guard" in markdown


def test_a_recipe_that_evaluates_guard_queries_is_refused(tiny_mlm_dir, collections, tmp_path):
    from pretrieve.data.folds import derive_collection

    train, other = collections
    n = 4
    half = derive_collection(other, tmp_path / "halves" / "other-a", carve_from="test", parts={"half": n // 2},
                             seed=0, rest="test")   # the draw of `pretrieve data halves`: "half" is the guard half
    guarded = {"select": {**SELECT["select"], "guard": [str(other)]}}
    recipe = _fusion_recipe(tmp_path, tiny_mlm_dir, train, other, final=guarded,
                            collections=[str(train), f"{half}:half"])
    with pytest.raises(ConfigError, match="holds 2 of the guard queries of other"):
        run_recipe(recipe, show_progress=False)


def _final_row(collection: str, delta: float, p: float, in_domain: bool, guard: bool = True) -> dict:
    selection = {"chosen": "wise-0.5", "fusion": "wsum(zscore; 0.6, 0.4)", "candidates": [], "measure": "nDCG@10",
                 "queries": 20, "split": "dev", "rule": "the highest cross-fitted dev score",
                 **({"guard": {"p": 0.1, "collections": {"med": 15}, "evaluated": {"med": 15},
                               "rule": "not below on the guard"}} if guard else {})}
    return {"retriever": "final", "collection": collection, "nDCG@10": 0.5 + delta, "measures": ["nDCG@10"],
            "final": True,
            "in_domain": in_domain,
            "fusion": {"runs": ["bm25", "wise-0.5"], "method": selection["fusion"], "selection": selection},
            "vs": {"rrf-zero-shot": {"mean_difference": delta, "p_value": p, "significant": p <= 0.05,
                                     "ci_low": delta - 0.02, "ci_high": delta + 0.02}}}


def test_the_results_page_says_which_row_to_use_per_collection_and_when_fine_tuning_hurt():
    from pretrieve.recipe.results import results_markdown, row_to_use

    assert row_to_use(_final_row("scifact", 0.03, 0.01, True))[0] == "final"
    assert row_to_use(_final_row("med", 0.01, 0.5, False))[:2] == \
        ("final", "not trained on it; the selection passed a guard of other collections")
    # without a guard nothing checked the other domains: the untrained fusion is recommended there
    assert row_to_use(_final_row("med", 0.01, 0.5, False, guard=False))[0] == "rrf-zero-shot"
    assert row_to_use(_final_row("scifact", -0.01, 0.5, True, guard=False))[0] == "final"
    assert row_to_use(_final_row("med", -0.05, 0.01, False))[2] and not row_to_use(_final_row("med", -0.05, 0.2, False))[2]
    assert not row_to_use(_final_row("scifact", -0.05, 0.01, True))[2]     # in-domain is not "not trained on"
    rows = [_final_row("scifact", 0.03, 0.01, True), _final_row("med", -0.048, 0.012, False)]
    baseline = [{"retriever": "rrf-zero-shot", "collection": c, "nDCG@10": 0.5, "measures": ["nDCG@10"]}
                for c in ("scifact", "med")]
    markdown = results_markdown({"recipe": "r", "rows": rows + baseline})
    assert "| scifact | `final` | trained on it (in-domain) |" in markdown
    assert "| med | `final` | not trained on it; the selection passed a guard of other collections |" in markdown
    assert ("**Fine-tuning hurt med**, a collection it was not trained on: `final` is below the untrained fusion "
            "`rrf-zero-shot` by -0.0480 [-0.0680, -0.0280] (p = 0.012); use `rrf-zero-shot` there.") in markdown
    assert "Fine-tuning hurt scifact" not in markdown


def test_the_cross_collection_check_trains_on_each_case_and_tests_zero_shot_on_every_other_collection(tmp_path):
    across = experiment_script("recipe_across_collections")
    shipped = yaml.safe_load(across.RECIPE.read_text())
    guard = next(stage["select"] for stage in shipped["stages"] if "select" in stage)["guard"]
    assert guard == across.COLLECTIONS      # the shipped guard: every shared collection (its own left out at run time)
    for case in across.CASES:
        recipe = across.derived_recipe(case, tmp_path)
        assert recipe["data"] == case and recipe["out"] == str(tmp_path / case)
        assert [s for s in recipe["stages"] if "evaluate" not in s] == \
            [s for s in shipped["stages"] if "evaluate" not in s]      # every other stage as shipped, the guard too
        first, added = (s["evaluate"] for s in recipe["stages"] if "evaluate" in s)
        evaluated = first["collections"] + added["collections"]
        assert first["collections"][0] == case and across.source_of(case) not in evaluated[1:]
        assert sorted(evaluated[1:] + [across.source_of(case)]) == sorted(across.COLLECTIONS)
        assert added["final"] == "final" and "rrf-zero-shot" in added["compare"] and added["retrievers"] == []
    assert across.derived_recipe("scifact", tmp_path)["stages"][-2]["evaluate"]["collections"] == ["scifact", "cranfield"]


def test_the_cross_collection_summary_judges_the_bars(tmp_path):
    across = experiment_script("recipe_across_collections")
    baseline = [{"retriever": "rrf-zero-shot", "collection": c, "nDCG@10": 0.5} for c in ("a", "b", "med")]

    def case(name: str, rows: list[dict]) -> tuple[str, Path]:
        path = tmp_path / name / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"rows": rows + baseline}))
        return name, path

    good = [case("one", [_final_row("a", 0.02, 0.03, True), _final_row("med", -0.01, 0.4, False)]),
            case("two", [_final_row("b", -0.01, 0.5, True), _final_row("med", 0.0, 1.0, False)])]
    lines = "\n".join(across.summary_lines(good + [("three", tmp_path / "none" / "results.json")]))
    assert "Zero-shot bar (never significantly below `rrf-zero-shot`, p ≤ 0.05): holds." in lines
    assert "mean Δ +0.0050; none significantly below (holds; section B's mean > 0: yes)" in lines
    assert "Not run (no evaluated `final` yet): three." in lines
    assert "| one | med | no | 0.4900 | 0.5000 | -0.0100 | [-0.0300, +0.0100] | 0.4 | holds | `final` |" in lines
    bad = [case("four", [_final_row("a", 0.01, 0.3, True), _final_row("med", -0.05, 0.01, False)])]
    lines = "\n".join(across.summary_lines(bad))
    assert "**fails** on four on med" in lines and "| **below** |" in lines
