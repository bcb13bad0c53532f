"""The recipe runner: every stage end to end on a tiny collection; an interrupted run resumes to the same results."""

from __future__ import annotations

import dataclasses

import json
import re
from pathlib import Path

import pytest
import yaml

from pretrieve.errors import ConfigError, InputError
from pretrieve.recipe import load_recipe, run_recipe
from pretrieve.train import loop

from test_finetune import write_collection

FAST = {"max_steps": 4, "batch_size": 4, "warmup_ratio": 0.0, "log_every": 1, "save_every": 2}


def _recipe(tmp_path: Path, model: Path, train: Path, zero_shot: Path) -> Path:
    recipe = {
        "name": "tiny", "out": str(tmp_path / "out"), "model": str(model), "data": str(train), "seed": 7,
        "finetune": {**FAST, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20,
                     "lr": 5e-4},
        "stages": [
            {"pretrain": {**FAST, "method": "bow", "max_len": 32, "lr": 1e-3}},
            {"finetune": {"stage": 1}},
            {"mine": {"depth": 10}},
            {"finetune": {"stage": 2}},
            {"reranker": {**FAST, "num_negatives": 2, "max_len": 48, "lr": 5e-4}},
            {"teacher": {"max_negatives": 3}},
            {"finetune": {"stage": 3}},
            {"evaluate": {"collections": [str(train), str(zero_shot)], "split": "test", "zero_shot": True, "bm25": True,
                          "rerank_depth": 10, "depth": 20}},
        ],
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    root = tmp_path_factory.mktemp("collections")
    return write_collection(root / "train"), write_collection(root / "other")


def test_recipe_runs_every_stage_and_writes_results(tiny_mlm_dir, collections, tmp_path):
    recipe = _recipe(tmp_path, tiny_mlm_dir, *collections)
    results = run_recipe(recipe, show_progress=False)
    out = tmp_path / "out"
    retrievers = {row["retriever"] for row in results["rows"]}
    assert retrievers == {"bm25", "zero-shot", "finetune-s1", "finetune-s2", "finetune-s3", "finetune-s3+rerank@10"}
    assert {row["collection"] for row in results["rows"]} == {"train", "other"}
    for row in results["rows"]:
        assert Path(row["run"]).exists() and 0.0 <= row["nDCG@10"] <= 1.0
    assert (out / "results.md").read_text().count("| finetune-s") >= 6
    assert json.loads((out / "results.json").read_text())["rows"] == results["rows"]
    for stage in ("pretrain", "finetune-s1", "finetune-s2", "finetune-s3", "reranker"):
        assert (out / stage / "final").is_dir(), stage
    # stages 2 and 3 start again from the pre-trained checkpoint, not from the previous stage
    for stage in ("finetune-s2", "finetune-s3"):
        config = json.loads((out / stage / "final" / "finetune_config.json").read_text())
        assert config["config"]["model"] == str(out / "pretrain" / "final")


def test_interrupted_recipe_resumes_to_identical_results(tiny_mlm_dir, collections, tmp_path, monkeypatch):
    reference = run_recipe(_recipe(tmp_path / "a", tiny_mlm_dir, *collections), show_progress=False)

    recipe = _recipe(tmp_path / "b", tiny_mlm_dir, *collections)
    original = loop.train_step
    calls = {"n": 0}

    def killed_in_stage_two(*args, **kwargs):  # pretrain 4 + s1 4 steps, then die at s2's 4th step
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", killed_in_stage_two)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(recipe, show_progress=False)
    assert not (tmp_path / "b" / "out" / "finetune-s2" / "final").exists()
    monkeypatch.setattr(loop, "train_step", original)

    resumed = run_recipe(recipe, show_progress=False)
    strip = lambda rows: [{k: v for k, v in row.items() if k != "run"} for row in rows]  # noqa: E731
    assert strip(resumed["rows"]) == strip(reference["rows"])
    table = lambda path: path.read_text().split("## Stage times")[0]  # noqa: E731 - the times differ, the numbers not
    assert table(tmp_path / "a" / "out" / "results.md") == table(tmp_path / "b" / "out" / "results.md")
    assert "| finetune-s2 |" in (tmp_path / "b" / "out" / "results.md").read_text().split("## Stage times")[1]


def test_recipe_errors_are_clear(tmp_path, collections):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"out": "x", "model": "m", "data": str(collections[0]), "stages": ["polish"]}))
    with pytest.raises(InputError, match=r"stages\[0\]: unknown stage 'polish'"):
        load_recipe(bad)
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump({"out": "x", "model": "m", "stages": ["evaluate"]}))
    with pytest.raises(InputError, match="no 'data'"):
        load_recipe(missing)
    early = tmp_path / "early.yaml"
    early.write_text(yaml.safe_dump({"out": str(tmp_path / "o"), "model": "minilm", "data": str(collections[0]),
                                     "stages": [{"finetune": {"stage": 2}}]}))
    with pytest.raises(ConfigError, match="needs the 'mine' stage"):
        run_recipe(early, show_progress=False)


def test_shipped_recipes_parse():
    root = Path(__file__).resolve().parents[1] / "configs"
    recipes = sorted(root.glob("*.yaml"))
    assert recipes, "no recipes shipped in configs/"
    for path in recipes:
        load_recipe(path)


def test_the_evaluate_stage_reranks_the_named_retriever(tmp_path):
    from pretrieve.errors import ConfigError
    from pretrieve.recipe.runner import RunState
    from pretrieve.recipe.stages.evaluate import reranked_retriever

    state = RunState(recipe={}, out=tmp_path, data=tmp_path, base_model="m",
                     given={"retriever": {"finetune-s1": "a", "finetune-s2": "b", "finetune-s3": "c"}})
    assert reranked_retriever(state, None) == "finetune-s3"
    assert reranked_retriever(state, "finetune-s2") == "finetune-s2"
    with pytest.raises(ConfigError, match="no retriever named 'finetune-s9'.*finetune-s1"):
        reranked_retriever(state, "finetune-s9")


def test_changed_settings_are_refused_or_redone_with_the_old_output_kept(tiny_mlm_dir, collections, tmp_path):
    from pretrieve.errors import StaleOutputError

    train, _ = collections

    def recipe(pretrain_lr: float, finetune_lr: float) -> Path:
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump({
            "name": "tiny", "out": str(tmp_path / "out"), "model": str(tiny_mlm_dir), "data": str(train), "seed": 7,
            "finetune": {**FAST, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20,
                         "lr": finetune_lr},
            "stages": [{"pretrain": {**FAST, "method": "bow", "max_len": 32, "lr": pretrain_lr}},
                       {"finetune": {"stage": 1}},
                       {"evaluate": {"collections": [str(train)], "split": "test", "depth": 20}}]}))
        return path

    out = tmp_path / "out"
    run_recipe(recipe(1e-3, 5e-4), show_progress=False)
    first_s1 = (out / "finetune-s1" / "final" / "model.safetensors").read_bytes()

    with pytest.raises(StaleOutputError, match=r"finetune-s1: .*different settings \(lr: 0.0005 -> 0.001\).*--redo-changed"):
        run_recipe(recipe(1e-3, 1e-3), show_progress=False)
    run_recipe(recipe(1e-3, 1e-3), show_progress=False, redo_changed=True)
    [aside] = sorted(out.glob("finetune-s1.replaced-*"))
    assert (aside / "final" / "model.safetensors").read_bytes() == first_s1          # the old run is kept
    assert json.loads((out / "finetune-s1" / "final" / "finetune_config.json").read_text())["config"]["lr"] == 1e-3
    assert not list(out.glob("pretrain.replaced-*"))

    # a changed pre-training redoes it and, through the changed checkpoint, the fine-tuning after it
    (aside).rename(out / "old-s1")
    with pytest.raises(StaleOutputError, match=r"pretrain: .*different settings \(lr: 0.001 -> 0.002\)"):
        run_recipe(recipe(2e-3, 1e-3), show_progress=False)
    run_recipe(recipe(2e-3, 1e-3), show_progress=False, redo_changed=True)
    assert len(list(out.glob("pretrain.replaced-*"))) == 1 and len(list(out.glob("finetune-s1.replaced-*"))) == 1


def test_set_aside_never_reuses_a_name(tmp_path):
    from pretrieve.recipe.runner import set_aside

    names = []
    for content in ("a", "b", "c"):
        (tmp_path / "stage").mkdir()
        (tmp_path / "stage" / "f").write_text(content)
        names.append(set_aside(tmp_path / "stage"))
    assert len(set(names)) == 3 and [(n / "f").read_text() for n in names] == ["a", "b", "c"]
    assert not (tmp_path / "stage").exists()


DEV = {"queries": 6, "seed": 0}


def _fusion_recipe(tmp_path: Path, model: Path, train: Path, zero_shot: Path, dev=DEV, final=None, **evaluate) -> Path:
    recipe = {
        "name": "tiny-fusion", "out": str(tmp_path / "out"), "model": str(model), "data": str(train), "seed": 7,
        "dev": dev,
        "finetune": {**FAST, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20,
                     "lr": 5e-4},
        "stages": [
            {"finetune": {"stage": 1}},
            {"mine": {"depth": 10}},
            {"fuse": {"name": "rrf-zero-shot", "runs": ["bm25", "zero-shot"], "method": "rrf"}},
            final or {"fuse": {"name": "final", "runs": ["bm25", "finetune-s1"], "method": "wsum", "norm": "zscore",
                               "step": 0.25, "depth": 20}},
            {"evaluate": {"collections": [str(train), str(zero_shot)], "split": "test", "zero_shot": True,
                          "bm25": True, "depth": 20, "final": "final", "compare": ["bm25", "zero-shot", "rrf-zero-shot"],
                          **evaluate}},
        ],
    }
    if dev is None:
        del recipe["dev"]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def assert_same_run(run: dict, expected: dict) -> None:
    assert run.keys() == expected.keys()
    for qid, docs in run.items():
        assert docs == pytest.approx(expected[qid], abs=1e-12), qid


def test_fuse_stage_fits_on_dev_only_and_adds_tested_rows(tiny_mlm_dir, collections, tmp_path, monkeypatch):
    from pretrieve.recipe.schema import STAGES
    from pretrieve.data import read_run
    from pretrieve.retrieval.fusion import FusionSpec, fuse_runs

    from test_fusion import forbid_test_qrels

    real_fuse = STAGES["fuse"]
    opened: list[str] = []

    def fuse_without_test_qrels(*args, **kwargs):      # the fuse stage may read dev qrels, never test qrels
        with forbid_test_qrels(monkeypatch) as names:
            try:
                return real_fuse.run(*args, **kwargs)
            finally:
                opened.extend(names)

    monkeypatch.setitem(STAGES, "fuse", dataclasses.replace(real_fuse, run=fuse_without_test_qrels))
    train, other = collections
    results = run_recipe(_fusion_recipe(tmp_path, tiny_mlm_dir, train, other), show_progress=False)
    out = tmp_path / "out"
    assert any(name.endswith("qrels/dev.tsv") for name in opened)
    assert not any(name.endswith("qrels/train.tsv") for name in opened)     # the fine-tuning queries: never read
    rows = {(row["retriever"], row["collection"]): row for row in results["rows"]}
    assert set(rows) == {(r, c) for r in ("bm25", "zero-shot", "finetune-s1", "rrf-zero-shot", "final")
                         for c in ("train", "other")}
    fitted = json.loads((out / "fuse" / "final" / "fusion.json").read_text())
    assert fitted["method"] == "wsum" and fitted["norm"] == "zscore" and fitted["fit"]["split"] == "dev"
    assert fitted["fit"]["queries"] == DEV["queries"]
    # the dev queries' runs (split "dev" of the training collection, carved into out/dev-split/train)
    assert (out / "runs" / "finetune-s1.dev__train:dev.trec").exists() and (out / "runs" / "bm25__train:dev.trec").exists()
    assert results["dev"]["queries"] == DEV["queries"] and results["dev"]["of"] == 20
    spec = FusionSpec.from_dict(fitted)
    for collection in ("train", "other"):      # the zero-shot collection uses the weights fitted on train
        expected = fuse_runs([read_run(out / "runs" / f"bm25__{collection}.trec"),
                              read_run(out / "runs" / f"finetune-s1__{collection}.trec")], spec)
        assert_same_run(read_run(out / "runs" / f"final__{collection}.trec"), expected)
        untrained = fuse_runs([read_run(out / "runs" / f"bm25__{collection}.trec"),
                               read_run(out / "runs" / f"zero-shot__{collection}.trec")], FusionSpec("rrf"))
        assert_same_run(read_run(out / "runs" / f"rrf-zero-shot__{collection}.trec"), untrained)
        final = rows[("final", collection)]
        assert final["final"] and set(final["vs"]) == {"bm25", "zero-shot", "rrf-zero-shot"}
        assert all(0.0 <= test["p_value"] <= 1.0 or test["mean_difference"] == 0 for test in final["vs"].values())
    markdown = (out / "results.md").read_text()
    assert "**Which row to use**, per collection:" in markdown and f"pretrieve run {tmp_path / 'recipe.yaml'}" in markdown
    # the row to use (amendment 16): final in-domain, the untrained fusion where the model was not trained
    assert re.search(r"\| train \| `final` \| [0-9.]+ \| \(this row\) \| trained on it \(in-domain\) \|", markdown)
    assert re.search(r"\| other \| `rrf-zero-shot` \| [0-9.]+ \| [0-9.]+, [-+][0-9.]+ \(p = [^)]+\) \| not trained on "
                     r"it: the untrained fusion, what you had there \|", markdown)
    assert "Paired two-sided t-tests" in markdown and "`final`: wsum(zscore;" in markdown
    assert "Dev split: 6 of the 20 `train` queries (seed 0" in markdown

    fused = out / "runs" / "final__other.trec"
    before = fused.stat().st_mtime_ns
    again = run_recipe(_fusion_recipe(tmp_path, tiny_mlm_dir, train, other), show_progress=False)
    assert again["rows"] == results["rows"] and fused.stat().st_mtime_ns == before    # current: not rewritten


def training_queries(out: Path) -> set[str]:
    """Every query id of the groups the recipe's fine-tuning stages trained on and its mining stage mined for."""
    ids = set()
    for path in [*out.glob("finetune-s*/*groups.jsonl"), *out.glob("mine*/groups.jsonl")]:
        ids |= {json.loads(line)["query_id"] for line in path.read_text().splitlines() if line.strip()}
    return ids


def spy_on_fits(monkeypatch) -> list[set[str]]:
    """Every fusion fit's queries: those of the run files it is given and of the qrels of its split (all it reads)."""
    from pretrieve.data import BeirCollection, read_run
    from pretrieve.retrieval import fusion

    fitted_on: list[set[str]] = []
    real_fit = fusion.fit_on_split

    def spy(paths, collection, split, *args, **kwargs):
        fitted_on.append(set(BeirCollection(collection).load_qrels(split))
                         | {qid for path in paths for qid in read_run(path)})
        return real_fit(paths, collection, split, *args, **kwargs)

    monkeypatch.setattr(fusion, "fit_on_split", spy)
    return fitted_on


def test_no_query_used_in_fine_tuning_is_used_to_fit_fusion_weights(tiny_mlm_dir, collections, tmp_path,
                                                                       monkeypatch):
    """Every fit (the fuse stage's weights) is given only dev queries, and no dev query is in a training group."""
    fitted_on = spy_on_fits(monkeypatch)
    train, other = collections
    run_recipe(_fusion_recipe(tmp_path, tiny_mlm_dir, train, other, dev={"queries": 5, "seed": 3}), show_progress=False)
    out = tmp_path / "out"
    record = json.loads(next(out.glob("dev-split/*/folds.json")).read_text())
    dev, trained = set(record["queries"]["dev"]), training_queries(out)
    assert len(dev) == 5 and trained and fitted_on
    assert not dev & trained and dev | trained == {f"q{i}" for i in range(20)}
    for used in fitted_on:
        assert used <= dev and not used & trained


def test_fitting_a_fine_tuned_retriever_on_its_training_queries_is_refused(tmp_path, collections):
    for dev, fit_split in ((None, None), ({"seed": 0}, "train")):
        recipe = _fusion_recipe(tmp_path, Path("m"), *collections, dev=dev, final={"fuse": {
            "name": "final", "runs": ["bm25", "finetune-s1"], "method": "wsum", "norm": "zscore",
            **({"fit_split": fit_split} if fit_split else {})}})
        with pytest.raises(ConfigError, match=r"stages\[3\]\.fuse: would fit the weight of finetune-s1 on the "
                                              r"'train' queries it was trained on; add a dev split"):
            load_recipe(recipe)
    zero_shot_only = _fusion_recipe(tmp_path, Path("m"), *collections, dev=None, final={"fuse": {
        "name": "final", "runs": ["bm25", "zero-shot"], "method": "wsum", "norm": "zscore"}})
    assert load_recipe(zero_shot_only)["stages"][3]["fuse"]["runs"] == ["bm25", "zero-shot"]   # nothing trained


@pytest.mark.parametrize("dev, message", [
    ({"queries": 3, "split": "dev"}, "either 'split'"),
    ({"queries": 0}, "queries must be >= 1"),
    ({"split": "test"}, "cannot be the dev split"),
    ({"sed": 1}, r"dev\.sed: unknown option; did you mean seed"),
])
def test_dev_option_errors_are_clear(tmp_path, collections, dev, message):
    with pytest.raises((ConfigError, InputError), match=message):
        load_recipe(_fusion_recipe(tmp_path, Path("m"), *collections, dev=dev))


def test_the_dev_split_default_size_and_what_carving_too_many_says(tmp_path, collections):
    from pretrieve.recipe.dev import dev_size, prepare_dev

    assert [dev_size(n) for n in (20, 199, 200, 809, 1000, 1006, 5000)] == [20, 20, 20, 81, 100, 100, 100]
    train = collections[0]
    with pytest.raises(ConfigError, match="leaves none to fine-tune on"):
        prepare_dev({"dev": {"seed": 0}, "finetune": {}}, train, tmp_path)    # 20 of 20 queries
    data, record = prepare_dev({"dev": {"queries": 19, "seed": 0}, "finetune": {}}, train, tmp_path)
    assert data == tmp_path / "dev-split" / "train" and record["queries"] == 19 and record["of"] == 20
    assert prepare_dev({"finetune": {}}, train, tmp_path) == (train, None)


@pytest.mark.parametrize("stage, message", [
    ({"fuse": {"runs": ["bm25"]}}, "two or more distinct"),
    ({"fuse": {"runs": ["bm25", "finetune-s7"]}}, "unknown retriever 'finetune-s7'"),
    ({"fuse": {"runs": ["bm25", "zero-shot"], "method": "wsum", "fit_split": "test"}}, "never 'test'"),
    ({"fuse": {"runs": ["bm25", "zero-shot"], "weight": 0.5}}, "unknown option"),
    ({"fuse": {"runs": ["bm25", "zero-shot"], "method": "wsum", "norm": "minmax", "weights": [0.5, 0.6]}}, "sum to 1"),
])
def test_fuse_stage_errors_are_clear(tmp_path, collections, stage, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"out": str(tmp_path / "o"), "model": "minilm", "data": str(collections[0]),
                                      "stages": [stage]}))
    with pytest.raises(ConfigError, match=message):
        run_recipe(recipe, show_progress=False)


def test_a_new_stage_kind_is_one_registration_and_its_needs_are_checked_before_anything_runs(monkeypatch):
    from pretrieve.recipe.schema import STAGES, Stage, validate_recipe

    @dataclasses.dataclass
    class PolishOptions:
        strength: int = 1

    def needs(options, recipe, given, where):
        if "mined" not in given:
            raise ConfigError(f"{where}: needs mined groups earlier in the recipe")

    monkeypatch.setitem(STAGES, "polish", Stage(lambda *args: None, PolishOptions, needs=needs, gives="polished"))
    recipe = {"out": "o", "model": "m", "data": "d", "stages": [{"finetune": {"stage": 1}}, {"polish": {}}]}
    with pytest.raises(ConfigError, match=r"recipe\.stages\[1\]\.polish: needs mined groups"):
        validate_recipe(recipe)
    recipe["stages"].insert(1, {"mine": {}})
    assert validate_recipe(recipe)["stages"][2] == {"polish": {}}
    recipe["stages"][2] = {"polish": {"strenght": 2}}
    with pytest.raises(ConfigError, match=r"stages\[2\]\.polish\.strenght: unknown option; did you mean strength"):
        validate_recipe(recipe)


def test_a_fine_tuning_stage_numbered_by_its_place_needs_its_groups_before_anything_runs():
    """A second ``finetune`` without a ``stage`` is stage 2 (as it runs and is labelled): it needs a ``mine`` stage."""
    from pretrieve.recipe.schema import validate_recipe

    recipe = {"out": "o", "model": "m", "data": "d", "stages": ["finetune", "finetune"]}
    with pytest.raises(ConfigError, match=r"stages\[1\]\.finetune: stage 2 needs the 'mine' stage"):
        validate_recipe(recipe)
    recipe["stages"].insert(1, "mine")
    assert len(validate_recipe(recipe)["stages"]) == 3



def test_evaluate_retrievers_limits_the_fine_tuned_rows_and_a_wrong_name_is_refused_first(tiny_mlm_dir, collections,
                                                                                          tmp_path):
    train, other = collections
    recipe = {"name": "rows", "out": str(tmp_path / "out"), "model": str(tiny_mlm_dir), "data": str(train), "seed": 7,
              "finetune": {**FAST, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20},
              "stages": [{"finetune": {"stage": 1}},
                         {"evaluate": {"collections": [str(train)], "depth": 20, "retrievers": ["finetune-s1"]}},
                         {"evaluate": {"collections": [str(other)], "depth": 20, "bm25": True, "zero_shot": True,
                                       "retrievers": []}}]}
    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text(yaml.safe_dump({**recipe, "stages": [recipe["stages"][0],
                                                        {"evaluate": {"retrievers": ["finetune-s2"]}}]}))
    good.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError, match=r"stages\[1\]\.evaluate\.retrievers\[0\]: no fine-tuned retriever named "
                                          r"'finetune-s2' before this stage \(known: finetune-s1\)"):
        run_recipe(bad, show_progress=False)
    assert not (tmp_path / "out" / "finetune-s1").exists()   # refused before anything trained
    rows = {(row["retriever"], row["collection"]) for row in run_recipe(good, show_progress=False)["rows"]}
    assert rows == {("finetune-s1", "train"), ("bm25", "other"), ("zero-shot", "other")}
