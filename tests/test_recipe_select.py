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
    assert len(fitted_on) == 4 and not dev & trained       # one fit per candidate and the dev gate's baseline
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
    assert selection["dev_order"] == sorted(names, key=lambda n: -crossed[n])
    # the dev gate (default 0.05): every candidate before the chosen one in dev order was refused by it, with its
    # one-sided p above 0.05; the chosen one passed it or is the untrained RRF itself (or the fallback)
    gate = selection["dev_gate"]
    assert gate["p"] == 0.05 and gate["baseline"] == "rrf-zero-shot"
    baseline_fit = json.loads((out / "fuse" / "final.rrf-zero-shot" / "fusion.json").read_text())["fit"]
    assert set(baseline_fit["per_query"]) == dev and baseline_fit["score"] == gate["baseline_cross_fitted"]
    assert sum(baseline_fit["per_query"].values()) / len(dev) == pytest.approx(baseline_fit["score"])
    verdicts = {c["name"]: c.get("dev_gate") for c in selection["candidates"]}
    refused = [r["name"] for r in selection["refused"]]
    assert all(not verdicts[n]["admitted"] and verdicts[n]["p_value"] > 0.05 for n in refused)
    if selection["fallback"]:
        assert refused == selection["dev_order"] and selection["fusion"] == "rrf(k=60)"
    else:
        assert refused == selection["dev_order"][:len(refused)] and selection["chosen"] not in refused
        chosen_verdict = verdicts[selection["chosen"]]
        assert chosen_verdict is None or (chosen_verdict["admitted"] and chosen_verdict["p_value"] <= 0.05)
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
    select.stage_select(state, {"alphas": [0.5, 0.25], "dev_gate": None}, "select", False)   # amendment 2's rule
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
    select.stage_select(state, {"alphas": [0.5], "dev_gate": None}, "select", False)   # the guard alone
    selection = state.named("fusion")["final"]["selection"]
    assert checked == ["finetune-s2", "wise-0.5"] and selection["chosen"] == "wise-0.5"
    assert state.named("fusion")["final"]["runs"] == ["bm25", "wise-0.5"]
    assert not selection["guard"]["fallback"] and selection["guard"]["p"] == 0.1
    assert [("guard" in c) for c in selection["candidates"]] == [False, True, True]
    # every candidate refused: final is the untrained RRF of BM25 and the off-the-shelf model
    monkeypatch.setattr(select, "guard_check", lambda *a: {"admitted": False, "pooled": {}, "per_collection": {}})
    state.given.pop("fusion")
    select.stage_select(state, {"alphas": [0.5], "dev_gate": None}, "select", False)
    entry = state.named("fusion")["final"]
    assert entry["runs"] == ["bm25", "zero-shot"] and entry["spec"].method == "rrf" and entry["fitted"] is None
    assert entry["selection"]["guard"]["fallback"] and entry["selection"]["fusion"] == "rrf(k=60)"


def test_the_guard_runs_end_to_end_and_its_queries_are_never_evaluated(tiny_mlm_dir, collections, tmp_path):
    train, other = collections
    guarded = {"select": {**SELECT["select"], "guard": [str(train), str(other)], "dev_gate": None}}
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
    assert {r["collection"]: r["use"] for r in results["recommended"]} == {train.name: "final", other.name: "rrf-zero-shot"}
    # amendment 16: the untrained fusion is recommended where the model was not trained, guard or not
    assert f"| {other.name} | `rrf-zero-shot` |" in markdown


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


def test_the_results_page_recommends_final_in_domain_and_the_untrained_fusion_elsewhere():
    """Amendment 16: in-domain ``final``; on every collection the model was not trained on ``rrf-zero-shot``,
    guard or not, with ``final`` beside it and a sentence where it is significantly below or above."""
    from pretrieve.recipe.results import results_markdown, row_to_use

    assert row_to_use(_final_row("scifact", 0.03, 0.01, True)) == ("final", "trained on it (in-domain)", None)
    assert row_to_use(_final_row("scifact", -0.05, 0.01, True))[2] is None    # in-domain is not "not trained on"
    for guard in (True, False):
        assert row_to_use(_final_row("med", 0.01, 0.5, False, guard=guard)) == \
            ("rrf-zero-shot", "not trained on it: the untrained fusion, what you had there", None)
    assert row_to_use(_final_row("med", -0.05, 0.01, False))[::2] == ("rrf-zero-shot", "below")
    assert row_to_use(_final_row("med", 0.05, 0.01, False))[::2] == ("rrf-zero-shot", "above")
    assert row_to_use(_final_row("med", -0.05, 0.2, False))[2] is None
    rows = [_final_row("scifact", 0.03, 0.01, True), _final_row("med", -0.048, 0.012, False),
            _final_row("lisa", 0.052, 0.03, False), _final_row("adi", 0.01, 0.6, False)]
    baseline = [{"retriever": "rrf-zero-shot", "collection": c, "nDCG@10": 0.5, "measures": ["nDCG@10"]}
                for c in ("scifact", "med", "lisa", "adi")]
    markdown = results_markdown({"recipe": "r", "rows": rows + baseline})
    assert "| scifact | `final` | 0.5300 | (this row) | trained on it (in-domain) |" in markdown
    assert ("| med | `rrf-zero-shot` | 0.5000 | 0.4520, -0.0480 (p = 0.012) | not trained on it: the untrained "
            "fusion, what you had there |") in markdown
    assert "the page recommends the untrained fusion `rrf-zero-shot` whatever the selection did" in markdown
    assert ("**Fine-tuning hurt med**, a collection it was not trained on: `final` is below the untrained fusion "
            "`rrf-zero-shot` by -0.0480 [-0.0680, -0.0280] (p = 0.012); use `rrf-zero-shot` there.") in markdown
    assert ("Fine-tuning helped lisa, a collection it was not trained on: `final` is above the untrained fusion "
            "`rrf-zero-shot` by +0.0520 [+0.0320, +0.0720] (p = 0.03). The page still recommends `rrf-zero-shot` "
            "there") in markdown
    assert "hurt scifact" not in markdown and "helped scifact" not in markdown and "adi, a collection" not in markdown
    from pretrieve.recipe.results import recommended_rows   # results.json's "recommended": the same rule

    assert [(r["collection"], r["use"], r["final_vs_rrf-zero-shot"]) for r in recommended_rows(rows + baseline)] == \
        [("scifact", "final", None), ("med", "rrf-zero-shot", "below"), ("lisa", "rrf-zero-shot", "above"),
         ("adi", "rrf-zero-shot", None)]


# ----------------------------------------------------------------------------------------- the dev gate (amendment 16)
def test_the_dev_gate_is_a_paired_one_sided_t_test_against_the_untrained_fusion():
    from scipy import stats

    base = [0.5, 0.6, 0.4, 0.7, 0.3]
    # differences 0.1, 0, 0.2, 0.1, 0.1: mean 0.1, sd √(0.02 / 4) = 0.0707, t = 0.1 / (0.0707 / √5) = 3.1623 on
    # 4 degrees of freedom, one-sided p = 0.01705 (half the two-sided 0.0341): admitted at 0.05, refused at 0.01
    better = [b + d for b, d in zip(base, [0.1, 0.0, 0.2, 0.1, 0.1])]
    verdict = select.dev_gate_verdict(_scores(base), _scores(better), 0.05)
    assert verdict["p_value"] == pytest.approx(0.01705, abs=1e-5) and verdict["admitted"]
    assert verdict["p_value"] == pytest.approx(stats.ttest_rel(better, base, alternative="greater").pvalue)
    assert verdict["mean_difference"] == pytest.approx(0.1) and verdict["queries"] == 5
    assert not select.dev_gate_verdict(_scores(base), _scores(better), 0.01)["admitted"]
    # higher on average but not significantly (t 1.2337, one-sided p 0.1424): refused
    slight = [b + d for b, d in zip(base, [0.1, -0.05, 0.2, 0.0, 0.02])]
    verdict = select.dev_gate_verdict(_scores(base), _scores(slight), 0.05)
    assert verdict["p_value"] == pytest.approx(0.1424, abs=1e-4) and not verdict["admitted"]
    # significantly *below* is not "above": one-sided, p near 1; the baseline against itself: p 1
    worse = [b - d for b, d in zip(base, [0.1, 0.0, 0.2, 0.1, 0.1])]
    assert select.dev_gate_verdict(_scores(base), _scores(worse), 0.05)["p_value"] == pytest.approx(1 - 0.01705,
                                                                                                   abs=1e-5)
    assert select.dev_gate_verdict(_scores(base), _scores(base), 0.05) == \
        {"queries": 5, "mean_difference": 0.0, "p_value": 1.0, "admitted": False, "p": 0.05}
    # one dev query cannot be tested: never admitted
    assert not select.dev_gate_verdict({"q": 0.1}, {"q": 0.9}, 0.05)["admitted"]


def _gate_state(tmp_path, monkeypatch, dev: dict[str, list[float]], methods: dict[str, str] | None = None):
    """A select stage whose fits are given: per candidate (and ``rrf-zero-shot``, the baseline) its per-query
    cross-fitted dev scores; ``methods``: each candidate's fusion method (default wsum)."""
    (tmp_path / "data").mkdir(exist_ok=True)
    state = RunState(recipe={"dev": {"seed": 0}, "finetune": {}}, out=tmp_path, data=tmp_path / "data",
                     base_model="base", given={"retriever": {"finetune-s2": "ft2"}})
    fitted = []

    def fake_fit(state, name, components, candidates, *args):
        fitted.append(name)
        key = "rrf-zero-shot" if name.endswith(".rrf-zero-shot") else components[-1]
        per_query = _scores(dev[key])
        method = "rrf" if key == "rrf-zero-shot" else (methods or {}).get(key, "wsum")
        mean = sum(per_query.values()) / len(per_query)
        fit = {"score": mean, "cross_fitted": mean, "queries": len(per_query), "per_query": per_query,
               "single_runs": {"run1": 0.4}}
        return (FusionSpec("rrf", fit=fit) if method == "rrf" else
                FusionSpec("wsum", "zscore", (0.5, 0.5), fit=fit))

    monkeypatch.setattr(select, "fit_fusion", fake_fit)
    monkeypatch.setattr(select, "interpolated", lambda state, finetuned, alpha, out: f"{finetuned}@{alpha}")
    return state, fitted


BASE = [0.5, 0.6, 0.4, 0.7, 0.3]


def _plus(deltas: list[float]) -> list[float]:
    return [b + d for b, d in zip(BASE, deltas)]


def test_the_dev_gate_admits_the_first_candidate_in_dev_order_that_beats_the_untrained_fusion(tmp_path, monkeypatch):
    """finetune-s2 leads on dev but not significantly (refused by the gate); wise-0.5 is significantly above the
    untrained RRF (admitted: final); the results page names the refused candidate with its rule, Δ and p."""
    from pretrieve.recipe.results import results_markdown

    dev = {"rrf-zero-shot": BASE, "zero-shot": _plus([0.0, 0.01, -0.01, 0.0, 0.0]),
           "wise-0.5": _plus([0.1, 0.0, 0.2, 0.1, 0.1]), "finetune-s2": _plus([0.5, -0.3, 0.3, -0.1, 0.2])}
    state, fitted = _gate_state(tmp_path, monkeypatch, dev)
    select.stage_select(state, {"alphas": [0.5]}, "select", False)
    entry = state.named("fusion")["final"]
    selection = entry["selection"]
    assert fitted[-1] == "final.rrf-zero-shot" and selection["dev_order"] == ["finetune-s2", "wise-0.5", "zero-shot"]
    assert selection["chosen"] == "wise-0.5" and entry["runs"] == ["bm25", "wise-0.5"] and not selection["fallback"]
    assert [(r["name"], r["rule"]) for r in selection["refused"]] == [("finetune-s2", "dev gate")]
    assert selection["refused"][0]["mean_difference"] == pytest.approx(0.12) and selection["refused"][0]["p_value"] > 0.05
    gates = {c["name"]: c.get("dev_gate") for c in selection["candidates"]}
    assert gates["wise-0.5"]["p_value"] == pytest.approx(0.01705, abs=1e-5) and gates["zero-shot"] is None
    assert selection["dev_gate"]["p"] == 0.05 and not selection["dev_gate"]["kept_baseline"]
    row = {"retriever": "final", "collection": "c", "nDCG@10": 0.5, "measures": ["nDCG@10"],
           "fusion": {"runs": entry["runs"], "method": "wsum", "selection": selection}}
    markdown = results_markdown({"recipe": "r", "rows": [row]})
    assert "dev gate: Δ (one-sided p) |" in markdown and "| +0.1000 (0.017) admitted |" in markdown
    assert "Refused: `finetune-s2` by the dev gate (Δ +0.1200, p = " in markdown
    assert "with the dev gate, admitted only above the untrained RRF of bm25 + the off-the-shelf model" in markdown


def test_the_dev_gate_keeps_the_untrained_fusion_when_no_candidate_beats_it(tmp_path, monkeypatch):
    from pretrieve.recipe.results import results_markdown

    noisy = {"rrf-zero-shot": BASE, "zero-shot": _plus([0.02, -0.01, 0.0, 0.01, 0.0]),
             "wise-0.5": _plus([0.1, -0.05, 0.2, 0.0, 0.02]), "finetune-s2": _plus([0.3, -0.2, 0.1, 0.0, -0.1])}
    # the off-the-shelf model's own dev choice is a weighted sum: gated and refused too; final is the untrained RRF
    state, _ = _gate_state(tmp_path, monkeypatch, noisy)
    select.stage_select(state, {"alphas": [0.5]}, "select", False)
    entry = state.named("fusion")["final"]
    selection = entry["selection"]
    assert [r["name"] for r in selection["refused"]] == selection["dev_order"] and selection["fallback"]
    assert entry["runs"] == ["bm25", "zero-shot"] and entry["spec"].method == "rrf" and entry["fitted"] is None
    assert selection["dev_gate"]["kept_baseline"]
    row = {"retriever": "final", "collection": "c", "nDCG@10": 0.5, "measures": ["nDCG@10"],
           "fusion": {"runs": entry["runs"], "method": "rrf", "selection": selection}}
    assert ("Every candidate was refused by the dev gate: `final` is the untrained RRF of the off-the-shelf model "
            "(`rrf-zero-shot`).") in results_markdown({"recipe": "r", "rows": [row]})
    # the off-the-shelf model fused by RRF is the baseline itself: never gated, chosen when reached in dev order
    state, _ = _gate_state(tmp_path, monkeypatch, {**noisy, "zero-shot": BASE}, methods={"zero-shot": "rrf"})
    select.stage_select(state, {"alphas": [0.5]}, "select", False)
    selection = state.named("fusion")["final"]["selection"]
    assert selection["chosen"] == "zero-shot" and not selection["fallback"] and selection["dev_gate"]["kept_baseline"]
    assert "dev_gate" not in selection["candidates"][0]
    row = {"retriever": "final", "collection": "c", "nDCG@10": 0.5, "measures": ["nDCG@10"],
           "fusion": {"runs": ["bm25", "zero-shot"], "method": "rrf", "selection": selection}}
    assert "The dev gate kept the untrained fusion: `final` is `rrf-zero-shot`." in \
        results_markdown({"recipe": "r", "rows": [row]})
    # switched off (null), the highest cross-fitted dev score wins as before (amendment 2), and no baseline is fitted
    state, fitted = _gate_state(tmp_path, monkeypatch, noisy)
    select.stage_select(state, {"alphas": [0.5], "dev_gate": None}, "select", False)
    selection = state.named("fusion")["final"]["selection"]
    assert selection["chosen"] == "wise-0.5" and "dev_gate" not in selection and not selection["refused"]
    assert "final.rrf-zero-shot" not in fitted


def test_with_a_guard_too_a_candidate_must_pass_the_dev_gate_and_the_guard(tmp_path, monkeypatch):
    dev = {"rrf-zero-shot": BASE, "zero-shot": _plus([0.0, 0.0, 0.01, 0.0, 0.0]),
           "wise-0.5": _plus([0.1, 0.0, 0.2, 0.1, 0.1]), "finetune-s2": _plus([0.2, 0.1, 0.3, 0.2, 0.2]),
           "wise-0.75": _plus([0.3, 0.2, 0.1, 0.4, 0.2])}
    state, _ = _gate_state(tmp_path, monkeypatch, dev)
    monkeypatch.setattr(select, "guard_collections", lambda state, options, label: {"med": tmp_path / "med"})
    monkeypatch.setattr(select, "split_query_ids", lambda path, split: {"a", "b"})
    checked = []

    def fake_check(state, name, runs, candidate, spec, baseline, guards, options, show_progress):
        checked.append(candidate)
        admitted = candidate != "wise-0.75"
        return {"admitted": admitted, "pooled": {"mean_difference": -0.05 if not admitted else 0.0,
                                                 "p_value": 0.01 if not admitted else 1.0}, "per_collection": {}}

    monkeypatch.setattr(select, "guard_check", fake_check)
    select.stage_select(state, {"alphas": [0.5, 0.75]}, "select", False)
    selection = state.named("fusion")["final"]["selection"]
    # dev order: wise-0.75, finetune-s2, wise-0.5, zero-shot; wise-0.75 passes the gate but not the guard;
    # finetune-s2 passes both
    assert selection["dev_order"][:2] == ["wise-0.75", "finetune-s2"]
    assert checked == ["wise-0.75", "finetune-s2"] and selection["chosen"] == "finetune-s2"
    assert selection["refused"] == [{"name": "wise-0.75", "rule": "guard", "mean_difference": -0.05, "p_value": 0.01}]


def test_the_dev_gate_option_is_checked_before_anything_runs(tmp_path, collections):
    with pytest.raises(ConfigError, match="dev_gate must be a p-value between 0 and 1"):
        load_recipe(_fusion_recipe(tmp_path, Path("m"), *collections, final={"select": {"dev_gate": 1.5}}))


def test_the_shipped_recipe_reads_only_collections_a_fresh_machine_downloads():
    """Amendment 16: no guard in the shipped recipe, so the README demo reads SciFact and Cranfield only (both
    downloaded by name on first use; MED, LISA, TIME and ADI are not) and evaluates Cranfield's whole test split."""
    from pretrieve.data.registry import KNOWN_COLLECTIONS
    from pretrieve.recipe.schema import recipe_collections

    recipe = load_recipe(experiment_script("recipe_across_collections").RECIPE)   # configs/scifact-minilm.yaml
    assert recipe_collections(recipe) == ["scifact", "cranfield"]
    assert all(name in KNOWN_COLLECTIONS for name in recipe_collections(recipe))      # downloadable by name
    assert not any("guard" in stage.get("select", {}) for stage in recipe["stages"])


# ------------------------------------------------------------------------------ the cross-collection check (script)
def test_the_cross_collection_check_trains_on_each_case_and_tests_zero_shot_on_every_other_collection(tmp_path):
    """Amendment 16: the shipped recipe with seed 1 (fine-tuning and the dev draw), no guard, zero-shot on every
    other collection's whole test split."""
    across = experiment_script("recipe_across_collections")
    shipped = yaml.safe_load(across.RECIPE.read_text())
    assert not any("guard" in stage.get("select", {}) for stage in shipped["stages"])   # the guard is off
    for case in across.CASES:
        recipe = across.derived_recipe(case, tmp_path)
        assert recipe["data"] == case and recipe["out"] == str(tmp_path / case)
        assert recipe["seed"] == 1 and recipe["dev"] == {**shipped["dev"], "seed": 1}
        assert [s for s in recipe["stages"] if "evaluate" not in s] == \
            [s for s in shipped["stages"] if "evaluate" not in s]      # every other stage as shipped
        first, added = (s["evaluate"] for s in recipe["stages"] if "evaluate" in s)
        evaluated = first["collections"] + added["collections"]
        assert first["collections"][0] == case and across.source_of(case) not in evaluated[1:]
        assert sorted(evaluated[1:] + [across.source_of(case)]) == sorted(across.COLLECTIONS)
        assert all(":" not in c for c in evaluated)      # whole test splits
        assert added["final"] == "final" and "rrf-zero-shot" in added["compare"] and added["retrievers"] == []
    assert across.derived_recipe("scifact", tmp_path)["stages"][-2]["evaluate"]["collections"] == ["scifact", "cranfield"]
    # a guard switched on in the shipped recipe is still left out of the check; seed None keeps the shipped seeds
    guarded = across.derived_recipe("time-a", tmp_path, seed=None)
    assert guarded["seed"] == shipped["seed"] and guarded["dev"] == shipped["dev"]


def _selection(kept: bool) -> dict:
    return {"chosen": "zero-shot" if kept else "wise-0.5", "fusion": "rrf(k=60)", "dev_gate": {"kept_baseline": kept}}


def test_the_cross_collection_summary_judges_amendment_16s_bars(tmp_path):
    across = experiment_script("recipe_across_collections")
    baseline = [{"retriever": "rrf-zero-shot", "collection": c, "nDCG@10": 0.5} for c in ("a", "b", "med", "lisa")]

    def case(name: str, rows: list[dict]) -> tuple[str, Path]:
        path = tmp_path / name / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"rows": rows + baseline}))
        return name, path

    one = [_final_row("a", 0.02, 0.03, True), _final_row("med", -0.05, 0.01, False), _final_row("lisa", 0.04, 0.02, False)]
    two = [_final_row("b", 0.0, 1.0, True), _final_row("med", 0.0, 1.0, False)]
    two[0]["fusion"]["selection"] = two[1]["fusion"]["selection"] = _selection(True)
    lines = "\n".join(across.summary_lines([case("one", one), case("two", two),
                                            ("three", tmp_path / "none" / "results.json")]))
    assert "Zero-shot bar (amendment 16: the recommended row, `rrf-zero-shot` on every collection the model was not " \
           "trained on, never significantly below `rrf-zero-shot`, p ≤ 0.05): holds by construction (3 zero-shot " \
           "comparisons)." in lines
    assert "hurt 1, helped 1, unchanged 1 of 3; hurt: one on med; helped: one on lisa." in lines
    assert "mean Δ +0.0100; none significantly below (holds; section B's mean > 0: yes)" in lines
    assert "The dev gate kept the untrained fusion in 1 of 2 cases (two)." in lines
    assert "Not run (no evaluated `final` yet): three." in lines
    assert "| one | med | no | `rrf-zero-shot` | 0.5000 | 0.4500 | 0.5000 | -0.0500 | [-0.0700, -0.0300] | 0.01 | " \
           "**hurt** |" in lines
    assert "| one | a | yes | `final` | 0.5200 | 0.5200 | 0.5000 | +0.0200 |" in lines
    bad = [case("four", [_final_row("a", -0.03, 0.04, True)])]
    lines = "\n".join(across.summary_lines(bad))
    assert "**significantly below** on four on a (**fails**; section B's mean > 0: no)" in lines


def test_the_cross_collection_check_commits_each_finished_cases_records_alone(tmp_path):
    import subprocess

    across = experiment_script("recipe_across_collections")
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "other.txt").write_text("staged, not part of the records")
    subprocess.run([*git, "add", "other.txt"], check=True)
    run_dir = tmp_path / "out" / "time-a"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({"rows": [{"run": f"{across.ROOT}/outputs/x.trec"}]}))
    (run_dir / "results.md").write_text("# Results\n")
    (run_dir / "model.safetensors").write_text("a checkpoint: never a record")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    records = repo / "docs" / "across-16"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        assert across.commit_case("time-a", run_dir, "| summary |\n", records)
        assert not across.commit_case("time-a", run_dir, "| summary |\n", records)    # a re-run: nothing new
    log = subprocess.run([*git, "log", "--format=%s", "--name-only"], capture_output=True, text=True).stdout
    assert "cross-collection check records (amendment 16, issue 56): time-a landed" in log
    assert sorted(line for line in log.splitlines() if line.startswith("docs/")) == \
        ["docs/across-16/summary.md", "docs/across-16/time-a.results.json", "docs/across-16/time-a.results.md"]
    assert log.count("landed") == 1 and "other.txt" not in log       # the staged file stays staged, uncommitted
    assert json.loads((records / "time-a.results.json").read_text())["rows"][0]["run"] == "outputs/x.trec"


def test_a_finished_case_is_not_run_again_so_its_records_keep_their_stage_times(tmp_path):
    from pretrieve.recipe.results import write_results

    across = experiment_script("recipe_across_collections")
    run_dir = tmp_path / "time-a"
    (run_dir / "runs").mkdir(parents=True)
    run = run_dir / "runs" / "final__c.trec"
    run.write_text("q0 Q0 d1 1 1.0 final\n")
    assert not across.finished(run_dir)                     # not run yet
    write_results(run_dir, {"recipe": "r", "rows": [{**_final_row("c", 0.0, 1.0, True), "run": str(run)}]},
                  {"name": "r"})
    assert across.finished(run_dir)
    run.write_text("q0 Q0 d2 1 1.0 final\n")               # a run file changed since: run it again (resumes)
    assert not across.finished(run_dir)
