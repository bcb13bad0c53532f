"""``pretrieve bench quality``: methods × seeds end to end on a tiny collection, failures, resume, statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
from scipy import stats
from typer.testing import CliRunner

import pretrieve.recipe
from pretrieve.bench.quality import recipes, report, run as quality, settings as qsettings, summary as qsummary
from pretrieve.cli import app
from pretrieve.data.beir import load_qrels
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError

from test_finetune import write_collection

PRETRAIN = {"max_steps": 2, "batch_size": 4, "max_len": 32, "lr": 1e-3, "warmup_ratio": 0.0, "save_every": 0,
            "log_every": 1}
FINETUNE = {"max_steps": 2, "batch_size": 4, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32,
            "bm25_depth": 20, "lr": 5e-4, "warmup_ratio": 0.0, "save_every": 0, "log_every": 1, "pooling": "cls"}
SEEDS = (3, 4)
FAILING = "ar"


def settings_for(model: Path, collections, out: Path, methods, seeds=SEEDS, **overrides):
    train, other = collections
    values = dict(base=str(model), train=str(train), out=str(out), methods=tuple(methods), eval=(str(train), str(other)),
                  seeds=tuple(seeds), pretrain=dict(PRETRAIN), finetune=dict(FINETUNE), depth=100, coverage_texts=6,
                  dev_queries=0, bootstrap=200)
    values.update(overrides)
    return qsettings.QualityBenchSettings(**values)


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_collections")
    return write_collection(root / "train"), write_collection(root / "other")


def _fail_one_method(monkeypatch) -> None:
    """The FAILING method's pre-training 'diverges': the training loop's non-finite-loss error."""
    from pretrieve.train import pretrainer

    original = pretrainer.pretrain

    def pretrain(config):
        if pretrainer.resolved_method(config).name == FAILING:
            raise FloatingPointError("non-finite loss nan ({'mlm': nan})")
        return original(config)

    monkeypatch.setattr(pretrainer, "pretrain", pretrain)


@pytest.fixture(scope="module")
def bench(tiny_mlm_dir, collections, tmp_path_factory):
    """none, mlm, bow and a failing method × 2 seeds, run once for the tests below."""
    out = tmp_path_factory.mktemp("bench") / "quality"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fail_one_method(monkeypatch)
        settings = settings_for(tiny_mlm_dir, collections, out, ("none", "mlm", FAILING, "bow"))
        summary = quality.run_quality_bench(settings)
    return settings, out, summary


def _count_recipes(monkeypatch, interrupt_at: int | None = None) -> list[str]:
    calls: list[str] = []
    original = pretrieve.recipe.run_recipe
    seen = {"n": 0}

    def counted(path, *args, **kwargs):
        calls.append(json.loads(Path(path).read_text())["name"])
        seen["n"] += 1
        if seen["n"] == interrupt_at:
            raise KeyboardInterrupt
        return original(path, *args, **kwargs)

    monkeypatch.setattr(pretrieve.recipe, "run_recipe", counted)
    return calls


def _per_query_ndcg(run_path: Path, qrels_path: Path) -> dict[str, float]:
    """nDCG@10 per query straight from pytrec_eval (independent of pretrieve.evaluation)."""
    evaluator = pytrec_eval.RelevanceEvaluator(load_qrels(qrels_path), {"ndcg_cut.10"})
    return {qid: values["ndcg_cut_10"] for qid, values in evaluator.evaluate(read_run(run_path)).items()}


# ------------------------------------------------------------------------------------------------ end to end
def test_every_method_and_seed_is_run_and_reported(bench, collections, tiny_mlm_dir):
    settings, out, summary = bench
    assert set(summary["methods"]) == {"none", "mlm", FAILING, "bow"}
    for method in ("none", "mlm", "bow"):
        entry = summary["methods"][method]
        assert entry["status"] == "done" and entry["seeds"] == list(SEEDS)
        for seed in SEEDS:
            directory = out / method / f"seed{seed}"
            assert (directory / "train-test" / "runs" / "finetune-s1__train.trec").exists()
            assert (directory / "train-test" / "runs" / "finetune-s1__other.trec").exists()
            assert (directory / "pretrain" / "final").is_dir() == (method != "none")
            assert not list(directory.glob("**/checkpoints"))       # cleaned after success
            assert (directory / "recipe.json").exists() == (method != "none")
            if method != "none":
                recipe = json.loads((directory / "recipe.json").read_text())
                assert [next(iter(stage)) for stage in recipe["stages"]] == ["pretrain"]
            recipe = json.loads((directory / "train-test" / "recipe.json").read_text())
            assert [next(iter(stage)) for stage in recipe["stages"]] == ["finetune", "evaluate"]
            assert recipe["model"] == (str(directory / "pretrain" / "final") if method != "none"
                                       else str(tiny_mlm_dir))
            groups = recipe["stages"][0]["finetune"]["groups"]     # one BM25 groups file shared by every run
            assert groups == str(out / "groups" / "train-train-bm25-20.jsonl")
        for measure in recipes.MEASURES:
            for name in ("train", "other", "avg"):
                assert 0.0 <= entry["scores"][measure][name]["mean"] <= 1.0
        assert 0.0 <= entry["coverage"]["ratio"]["10"] <= 1.0
    # every pre-trained method used the same budget; speed comes from the trainer's logs
    for method in ("mlm", "bow"):
        config = json.loads((out / method / "seed3" / "pretrain" / "pretrain_config.json").read_text())
        assert (config["max_steps"], config["batch_size"], config["max_len"]) == (2, 4, 32)
        speed = summary["methods"][method]["pretrain"]
        assert speed["samples_per_s"] > 0 and speed["wall_s"] > 0
    assert summary["methods"]["none"]["pretrain"]["samples_per_s"] is None
    for name in ("results.md", "results.json", "results.png", "bench.json"):
        assert (out / name).exists(), name
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_method_is_reported_and_the_others_complete(bench):
    _, out, summary = bench
    entry = summary["methods"][FAILING]
    assert entry["status"] == "failed" and entry["seeds"] == []
    assert set(entry["failed"]) == {str(s) for s in SEEDS}
    assert all("FloatingPointError: non-finite loss nan" in error for error in entry["failed"].values())
    status = json.loads((out / FAILING / "status.json").read_text())
    assert {run["status"] for run in status["runs"].values()} == {"failed"}
    assert "Traceback" in status["runs"]["seed3"]["traceback"]
    markdown = (out / "results.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {FAILING} | failed: "))
    assert "FloatingPointError" in row
    assert "## Failures" in markdown
    assert json.loads((out / "results.json").read_text())["methods"][FAILING]["status"] == "failed"


# ------------------------------------------------------------------------------------------------ statistics
def test_cells_are_mean_and_std_over_seeds_of_the_evaluate_scores(bench, collections):
    _, out, summary = bench
    for method in ("none", "mlm", "bow"):
        for collection in collections:
            scores = [np.mean(list(_per_query_ndcg(out / method / f"seed{s}" / "train-test" / "runs" /
                                                   f"finetune-s1__{collection.name}.trec",
                                                   collection / "qrels" / "test.tsv").values())) for s in SEEDS]
            cell = summary["methods"][method]["scores"]["nDCG@10"][collection.name]
            assert cell["per_seed"] == pytest.approx({str(s): v for s, v in zip(SEEDS, scores)}, abs=1e-12)
            assert cell["mean"] == pytest.approx(np.mean(scores), abs=1e-12)
            assert cell["std"] == pytest.approx(np.std(scores, ddof=1), abs=1e-12)
        avg = summary["methods"][method]["scores"]["nDCG@10"]["avg"]
        per_seed = [np.mean([summary["methods"][method]["scores"]["nDCG@10"][c.name]["per_seed"][str(s)]
                             for c in collections]) for s in SEEDS]
        assert avg["mean"] == pytest.approx(np.mean(per_seed)) and avg["std"] == pytest.approx(np.std(per_seed, ddof=1))


def test_p_values_are_paired_ttests_on_seed_averaged_per_query_scores(bench, collections):
    _, out, summary = bench
    checked = 0
    for collection in collections:
        def seed_mean(method):
            per_seed = [_per_query_ndcg(out / method / f"seed{s}" / "train-test" / "runs" /
                                        f"finetune-s1__{collection.name}.trec",
                                        collection / "qrels" / "test.tsv") for s in SEEDS]
            return {qid: np.mean([scores[qid] for scores in per_seed]) for qid in per_seed[0]}

        for method in ("bow", "mlm", "none"):
            run = seed_mean(method)
            for baseline in ("mlm", "none"):
                if baseline == method:
                    assert baseline not in summary["methods"][method]["scores"]["nDCG@10"][collection.name]["vs"]
                    continue
                base = seed_mean(baseline)
                queries = sorted(run)
                x, y = np.array([run[q] for q in queries]), np.array([base[q] for q in queries])
                test = summary["methods"][method]["scores"]["nDCG@10"][collection.name]["vs"][baseline]
                assert test["n"] == len(queries) == 4
                if np.any(x != y):
                    expected = stats.ttest_rel(x, y)
                    assert test["p_value"] == pytest.approx(expected.pvalue, rel=1e-9, nan_ok=True)
                    assert test["statistic"] == pytest.approx(expected.statistic, rel=1e-9, nan_ok=True)
                    checked += 1
                else:
                    assert test["p_value"] == 1.0
                assert test["mean_difference"] == pytest.approx(float(np.mean(x - y)), abs=1e-12)
    assert checked > 0   # at least one comparison exercised scipy's formula


def test_every_number_is_regenerated_by_pretrieve_evaluate(bench, collections, tmp_path):
    _, out, summary = bench
    runner = CliRunner()
    for collection in collections:
        for method in ("mlm", "bow"):
            run = out / method / "seed4" / "train-test" / "runs" / f"finetune-s1__{collection.name}.trec"
            target = tmp_path / f"{method}-{collection.name}.json"
            result = runner.invoke(app, ["evaluate", "--data", str(collection), "--split", "test", "--measures",
                                         "nDCG@10,MRR@10,R@100", "--json", str(target), str(run)])
            assert result.exit_code == 0, result.output
            aggregate = json.loads(target.read_text())["runs"][0]["aggregate"]
            for measure in recipes.MEASURES:
                cell = summary["methods"][method]["scores"][measure][collection.name]
                assert cell["per_seed"]["4"] == pytest.approx(aggregate[measure], abs=1e-12)
    # and the report can be recomputed from the saved runs alone
    qsummary._EVALUATED.clear()
    assert qsummary.summarize(out)["methods"]["bow"]["scores"] == summary["methods"]["bow"]["scores"]


def test_markdown_table_shows_mean_std_marks_and_coverage(bench):
    _, out, summary = bench
    markdown = report.results_markdown(summary)
    for measure in recipes.MEASURES:
        assert f"## {measure}" in markdown
    bow = summary["methods"]["bow"]["scores"]["nDCG@10"]["train"]
    row = next(line for line in markdown.splitlines() if line.startswith("| bow | "))
    assert f"{bow['mean']:.4f} ± {bow['std']:.4f}" in row
    assert f"{summary['methods']['bow']['coverage']['ratio']['10']:.3f}" in row
    assert "## Input-token coverage" in markdown and "## p-values" in markdown
    assert report.significance_marks({"vs": {"mlm": {"significant": True, "mean_difference": 0.1},
                                              "none": {"significant": True, "mean_difference": -0.1}}}) == "m▲ n▼"


# ------------------------------------------------------------------------------------------------ resume
def test_a_finished_comparison_is_not_run_again_and_failed_runs_only_on_request(bench, tiny_mlm_dir, collections,
                                                                                monkeypatch):
    settings, out, _ = bench
    calls = _count_recipes(monkeypatch)
    _fail_one_method(monkeypatch)
    quality.run_quality_bench(settings)
    assert calls == []
    quality.run_quality_bench(settings.__class__(**{**settings.__dict__, "retry_failed": True}))
    assert calls == [f"bench-quality-{FAILING}-seed{s}" for s in SEEDS]   # (pre-training fails: no fold runs)


def test_an_interrupted_comparison_restarts_with_the_next_method(tiny_mlm_dir, collections, tmp_path, monkeypatch):
    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "bow", "mlm"), seeds=(1,))
    calls = _count_recipes(monkeypatch, interrupt_at=3)   # dies in the second method's fold, after its pre-training
    with pytest.raises(KeyboardInterrupt):
        quality.run_quality_bench(settings)
    state = json.loads((tmp_path / "q" / "bench.json").read_text())
    assert state["runs"]["none/seed1"]["status"] == "done" and state["runs"]["bow/seed1"]["status"] == "running"
    calls.clear()
    summary = quality.run_quality_bench(settings)
    assert calls == ["bench-quality-bow-seed1-train-test", "bench-quality-mlm-seed1",
                     "bench-quality-mlm-seed1-train-test"]
    assert all(entry["status"] == "done" for entry in summary["methods"].values())


def test_a_removed_method_directory_is_pending_and_rerun(tiny_mlm_dir, collections, tmp_path, monkeypatch):
    import shutil

    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "bow"), seeds=(1,))
    quality.run_quality_bench(settings)
    shutil.rmtree(tmp_path / "q" / "bow")                 # a user deleting one method to run it again
    summary = qsummary.summarize(tmp_path / "q")          # the report still builds, with bow pending
    assert summary["methods"]["bow"]["status"] == "pending" and summary["methods"]["none"]["status"] == "done"
    calls = _count_recipes(monkeypatch)
    summary = quality.run_quality_bench(settings)
    assert calls == ["bench-quality-bow-seed1", "bench-quality-bow-seed1-train-test"]
    assert summary["methods"]["bow"]["status"] == "done"


def test_a_rerun_with_other_settings_is_refused(bench, tiny_mlm_dir, collections):
    settings, out, _ = bench
    changed = settings.__class__(**{**settings.__dict__, "pretrain": {**PRETRAIN, "max_steps": 3}})
    with pytest.raises(ConfigError, match="pretrain"):
        quality.run_quality_bench(changed)


@pytest.mark.filterwarnings("ignore:.*routes queries through its query FFN expert")   # the MoTE export's note
def test_methods_with_pairs_and_pmi_statistics_run_through(tiny_mlm_dir, collections, tmp_path):
    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("cotmote", "cdmae"), seeds=(1,))
    summary = quality.run_quality_bench(settings)
    assert {m: e["status"] for m, e in summary["methods"].items()} == {"cotmote": "done", "cdmae": "done"}
    method = json.loads((tmp_path / "q" / "cotmote" / "seed1" / "pretrain" / "final" / "method.json").read_text())
    assert method["context"]["pairs"] == str(tmp_path / "q" / "pairs" / "train-train.jsonl") and method["mote"]


# ------------------------------------------------------------------------------------------------ settings
def test_settings_are_checked_before_any_work(tiny_mlm_dir, collections, tmp_path):
    with pytest.raises(ConfigError, match="unknown method"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("none", "bert")).resolved()
    with pytest.raises(ConfigError, match="listed twice"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("bow", "bow")).resolved()
    with pytest.raises(ConfigError, match="unknown option"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("bow",), finetune={"epoch": 2}).resolved()
    with pytest.raises(ConfigError, match="distinct directory names"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("bow",), eval=(str(collections[0]),) * 2).resolved()
    assert not (tmp_path / "bench.json").exists()


def test_pair_methods_get_the_training_pairs_and_overrides_parse(tiny_mlm_dir, collections, tmp_path):
    settings = settings_for(tiny_mlm_dir, collections, tmp_path, ("cotmote", "cotmae"), dev_queries=2).resolved()
    data = quality.derived_collection(settings)
    pairs = quality.prepare_pairs(settings, data)
    lines = [json.loads(line) for line in pairs.read_text().splitlines()]
    assert len(lines) == 18 and {"passage", "query"} <= set(lines[0])      # dev's 2 queries left out
    recipe = recipes.pretrain_recipe("n", tmp_path, "base", str(data), 3, "cotmote", PRETRAIN, "corpus", tmp_path, pairs)
    assert recipe["stages"][0]["pretrain"]["method"] == {"base": "cotmote", "context": {"pairs": str(pairs)}}
    recipe = recipes.pretrain_recipe("n", tmp_path, "base", str(data), 3, "cotmae", PRETRAIN, "corpus", tmp_path)
    assert recipe["stages"][0]["pretrain"]["method"] == "cotmae"
    with pytest.raises(ConfigError, match="judged pairs: no fold may evaluate on the train split"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("none", "cotmote"),
                     folds=("train:test", "test:train")).resolved()
    assert qsettings.parse_overrides("lr=2e-5,pooling=mean,epochs=1", "finetune") == {
        "lr": 2e-5, "pooling": "mean", "epochs": 1}
    file = tmp_path / "ft.yaml"
    file.write_text("lr: 3.0e-5\nmethods:\n  dupmae: {representation: dupmae}\n")
    values, per_method = qsettings.split_finetune_overrides(qsettings.parse_overrides(str(file), "finetune"), "ft")
    assert values == {"lr": 3e-5} and per_method == {"dupmae": {"representation": "dupmae"}}


# ------------------------------------------------------------------------------------- a retrieval-ready base
def test_a_retrieval_ready_base_gets_its_own_pooling_and_a_gentler_budget(tiny_mlm_dir, minilm):
    pretrain, finetune = qsettings.defaults_for_base(str(minilm))
    assert finetune["pooling"] == "mean" and finetune["normalize"] is True and finetune["temperature"] == 0.05
    assert finetune["lr"] == 2e-5 and pretrain["lr"] == 5e-5
    assert qsettings.defaults_for_base(str(tiny_mlm_dir)) == (qsettings.DEFAULT_PRETRAIN, qsettings.DEFAULT_FINETUNE)


def test_a_mean_pooling_base_without_mlm_head_runs_through(tiny_bert_dir, collections, tmp_path):
    """A MiniLM-like checkpoint (sentence-transformers mean pooling + Normalize, no MLM head): pre-training creates
    the head, fine-tuning and evaluation use mean pooling and normalised vectors."""
    from test_dense import LEGACY_MEAN, make_st_checkpoint

    base = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN)
    _, finetune = qsettings.defaults_for_base(str(base))
    finetune.update({k: v for k, v in FINETUNE.items() if k != "pooling"})
    settings = settings_for(base, collections, tmp_path / "q", ("none", "mlm"), seeds=(3,), finetune=finetune)
    summary = quality.run_quality_bench(settings)
    assert all(entry["status"] == "done" for entry in summary["methods"].values())
    for method in ("none", "mlm"):
        config = json.loads((tmp_path / "q" / method / "seed3" / "train-test" / "finetune-s1" / "final" /
                             "finetune_config.json")
                            .read_text())["config"]
        assert config["pooling"] == "mean" and config["normalize"] is True and config["temperature"] == 0.05
    assert summary["methods"]["mlm"]["coverage"]["head_created"] is False      # pre-training trained the new head
    assert summary["methods"]["none"]["coverage"]["head_created"] is True


# ------------------------------------------------------------------------ cross-fitting, dev, selection, A/A
@pytest.fixture(scope="module")
def crossfit(tiny_mlm_dir, collections, tmp_path_factory):
    """none, mlm and mlm's A/A control × 2 seeds, cross-fitted both ways, 3 dev queries, a 2-point lr grid."""
    out = tmp_path_factory.mktemp("crossfit") / "q"
    settings = settings_for(tiny_mlm_dir, collections, out, ("none", "mlm", "mlm-aa"), seeds=(1, 2),
                            folds=("train:test", "test:train"), dev_queries=3, dev_seed=5,
                            grid={"lr": (1e-4, 1e-3), "epochs": (1,)}, contrasts=("mlm-none", "mlm-aa-mlm"),
                            pretrain_data=(str(collections[0]), str(collections[1])))
    return settings, out, quality.run_quality_bench(settings)


def _queries_of_groups(path: Path) -> set[str]:
    return {json.loads(line)["query_id"] for line in path.read_text().splitlines() if line.strip()}


def test_cross_fitting_never_evaluates_a_query_that_trained_the_fold_and_dev_is_in_neither(crossfit, collections):
    settings, out, summary = crossfit
    derived = out / "collections" / "train"
    dev = set(load_qrels(derived / "qrels" / "dev.tsv"))
    original_train = set(load_qrels(collections[0] / "qrels" / "train.tsv"))
    assert len(dev) == 3 and dev <= original_train
    pooled = set()
    for arm in ("none", "mlm", "mlm-aa"):
        for seed in settings.resolved().arm_seeds(arm):
            for fold, (train_split, test_split) in (("train-test", ("train", "test")),
                                                    ("test-train", ("test", "train"))):
                recipe = json.loads((out / arm / f"seed{seed}" / fold / "recipe.json").read_text())
                assert recipe["finetune"]["split"] == train_split
                trained = _queries_of_groups(Path(recipe["stages"][0]["finetune"]["groups"]))
                tag = "train" if test_split == "test" else f"train:{test_split}"
                evaluated = set(read_run(out / arm / f"seed{seed}" / fold / "runs" / f"finetune-s1__{tag}.trec"))
                assert trained and evaluated and not trained & evaluated      # the fold's model never saw them
                assert not dev & trained and not dev & evaluated
                pooled |= {(fold, q) for q in evaluated}
    assert {q for _, q in pooled} == (original_train - dev) | set(load_qrels(collections[0] / "qrels" / "test.tsv"))
    # the pooled statistics count each non-dev judged query once
    entry = next(e for e in summary["contrasts"]["nDCG@10"]["train"] if e["contrast"] == "mlm-none")
    assert entry["n_queries"] == 17 + 4 and entry["folds"] == {"train:test": 4, "test:train": 17}
    rows = [line.split("\t") for line in (out / "per_query.tsv").read_text().splitlines()]
    assert rows[0][:5] == ["arm", "seed", "collection", "fold", "query"]
    mlm = {(r[3], r[4]) for r in rows[1:] if r[0] == "mlm" and r[1] == "1" and r[2] == "train"}
    assert mlm == {("train:test", q) for q in load_qrels(derived / "qrels" / "test.tsv")} | \
        {("test:train", q) for q in original_train - dev}


def test_the_protocol_is_chosen_once_on_dev_and_applied_everywhere(crossfit):
    _, out, summary = crossfit
    selection = json.loads((out / "bench.json").read_text())["selection"]
    assert selection["arm"] == "mlm" and selection["seed"] == 1 and selection["fold"] == "train:test"
    assert set(selection["scores"]) == {"lr0.0001-epochs1", "lr0.001-epochs1"}
    best = max(selection["scores"], key=lambda name: (selection["scores"][name], name == "lr0.0001-epochs1"))
    assert selection["chosen"]["lr"] == (1e-4 if best == "lr0.0001-epochs1" else 1e-3)
    assert selection["chosen"]["epochs"] == 1 and selection["chosen"]["max_steps"] == 0
    for name in selection["scores"]:   # each point scored on dev only, with its own lr
        cell = out / "select" / name
        assert [p.name for p in (cell / "runs").glob("*.trec")] == ["finetune-s1__train:dev.trec"]
        config = json.loads((cell / "finetune-s1" / "final" / "finetune_config.json").read_text())["config"]
        assert config["lr"] == (1e-4 if name.startswith("lr0.0001") else 1e-3)
    for arm, seed in (("none", 1), ("mlm", 2), ("mlm-aa", 1001)):
        for fold in ("train-test", "test-train"):
            config = json.loads((out / arm / f"seed{seed}" / fold / "finetune-s1" / "final" /
                                 "finetune_config.json").read_text())["config"]
            assert config["lr"] == selection["chosen"]["lr"] and config["epochs"] == 1 and config["max_steps"] == 0
    assert "## Fine-tuning protocol (chosen once on dev)" in (out / "results.md").read_text()


def test_the_aa_arm_runs_other_seeds_and_contrasts_are_reported_with_holm(crossfit):
    _, out, summary = crossfit
    assert summary["methods"]["mlm-aa"]["seeds"] == [1001, 1002]
    assert (out / "mlm-aa" / "seed1001" / "pretrain" / "final").is_dir()
    recipe = json.loads((out / "mlm-aa" / "seed1001" / "recipe.json").read_text())
    assert recipe["seed"] == 1001 and recipe["stages"][0]["pretrain"]["method"] == "mlm"
    entries = summary["contrasts"]["nDCG@10"]["train"]
    assert [e["contrast"] for e in entries] == ["mlm-none", "mlm-aa-mlm"]
    from statsmodels.stats.multitest import multipletests

    np.testing.assert_allclose([e["p_holm"] for e in entries],
                               multipletests([e["p_value"] for e in entries], method="holm")[1])
    for entry in entries:
        assert entry["ci_low"] <= entry["delta"] <= entry["ci_high"] and entry["n_seeds"] == [2, 2]
        assert entry["decision"] in ("confirmed", "refuted-at-this-scale", "undecided")
        assert entry["mde_holm"] >= entry["mde"] > 0
    # Δ is the pooled mean of the seed-averaged per-query differences, recomputed from the runs
    def pooled(arm, seeds):
        per_seed = []
        for seed in seeds:
            scores = {}
            for fold, tag, split in (("train-test", "train", "test"), ("test-train", "train:train", "train")):
                qrels = out / "collections" / "train" / "qrels" / f"{split}.tsv"
                for qid, value in _per_query_ndcg(out / arm / f"seed{seed}" / fold / "runs" /
                                                  f"finetune-s1__{tag}.trec", qrels).items():
                    scores[(fold, qid)] = value
            per_seed.append(scores)
        keys = sorted(per_seed[0])
        return keys, np.mean([[s[k] for k in keys] for s in per_seed], axis=0)

    keys, mlm = pooled("mlm", (1, 2))
    _, none = pooled("none", (1, 2))
    assert entries[0]["delta"] == pytest.approx(float(np.mean(mlm - none)), abs=1e-12)
    markdown = (out / "results.md").read_text()
    assert "## Contrasts (nDCG@10" in markdown and "| train | mlm-aa − mlm |" in markdown


def test_bench_claims_recomputes_a_tier_and_refuses_a_directory_without_a_comparison(crossfit, tmp_path):
    """`bench claims` on a finished comparison: the A/A row carries the tier's own bootstrap and Holm p, the rows
    whose arms or tiers are missing are pending; a directory without bench.json is one line, exit 2."""
    _, out, summary = crossfit
    recorded = next(e for e in summary["contrasts"]["nDCG@10"]["train"] if e["contrast"] == "mlm-aa-mlm")
    expected = "passed" if recorded["p_holm"] >= 0.05 else "failed"
    result = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out)])
    assert result.exit_code == 0, result.output
    assert f"**pending** (so far: {expected})" in result.output          # 2 seeds, Tier 1 fixes 3
    result = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out), "--any-seeds", "--out",
                                      str(tmp_path / "claims")])
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "claims.json").read_text())
    aa = next(c for c in table["claims"] if c["id"] == "aa")
    assert aa["evidence"][0]["delta"] == pytest.approx(recorded["delta"], abs=1e-12)
    assert aa["evidence"][0]["p_holm"] == pytest.approx(recorded["p_holm"], abs=1e-12)
    assert aa["verdict"] == expected
    assert table["inputs"]["tier1"]["methods"]["mlm-aa"]["seeds"] == [1001, 1002]
    if not table["withheld"]:
        verdicts = {c["id"]: c["verdict"] for c in table["claims"]}
        assert verdicts["h1"] == verdicts["pmi"] == verdicts["minilm"] == "pending"   # no bow/retromae; no tiers
    assert (tmp_path / "claims.md").read_text().startswith("# Decision table")
    from test_input_guards import assert_one_line_error, run_cli

    assert_one_line_error(run_cli("bench", "claims", "--tier1", str(tmp_path)), "bench.json missing", "tier1")


def test_contrasts_and_folds_are_checked(tiny_mlm_dir, collections, tmp_path):
    with pytest.raises(ConfigError, match="does not name two compared arms"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("none", "mlm"), contrasts=("bow-mlm",)).resolved()
    with pytest.raises(ConfigError, match="fold 'train'"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("none",), folds=("train",)).resolved()
    with pytest.raises(ConfigError, match="same split"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("none",), folds=("train:test", "dev2:test")).resolved()
    with pytest.raises(ConfigError, match="searched on dev"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("none",), grid={"lr": (1e-4,)}).resolved()
    with pytest.raises(ConfigError, match="unknown method"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("bert-aa",)).resolved()


def test_the_smoke_path_runs_the_whole_harness_from_the_cli(tmp_path):
    """`bench quality --smoke`: a tiny random model and a synthetic collection, cross-fitted, dev-selected, with an
    A/A arm and contrasts, end to end well under a minute."""
    import time

    out = tmp_path / "smoke"
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["bench", "quality", "--smoke", "--out", str(out), "--folds",
                                      "train:test,test:train", "--grid-lr", "1e-4,1e-3", "--grid-epochs", "1",
                                      "--methods", "none,mlm,mlm-aa", "--contrasts", "mlm-none,mlm-aa-mlm"])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())
    assert {m: e["status"] for m, e in summary["methods"].items()} == {"none": "done", "mlm": "done", "mlm-aa": "done"}
    assert [e["contrast"] for e in summary["contrasts"]["nDCG@10"]["smoke"]] == ["mlm-none", "mlm-aa-mlm"]
    assert summary["settings"]["folds"] == ["train:test", "test:train"] and summary["settings"]["dev_queries"] == 4
    assert summary["selection"]["chosen"]["epochs"] == 1
    assert "## Contrasts" in result.output
    assert elapsed < 150   # ≈ 30 s on a quiet 2-core machine; generous for a shared one


def test_probes_at_chosen_steps_and_the_gates(tiny_mlm_dir, collections, tmp_path):
    """Probe steps keep the first seed's checkpoints; each step gets [CLS] retrieval (dot, cos) on every judged
    query of every split and the coverage variants; the gates are written into bench.json with their inputs."""
    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "mlm", "bow"), seeds=(1, 2),
                            pretrain={**PRETRAIN, "max_steps": 4}, probe_steps=(2, 4), contrasts=("bow-mlm",))
    summary = quality.run_quality_bench(settings)
    out = tmp_path / "q"
    for arm, steps in (("mlm", (2, 4)), ("bow", (2, 4)), ("none", (0,))):
        for step in steps:
            probe = json.loads((out / arm / "seed1" / "probes" / f"step-{step}" / "probe.json").read_text())
            assert probe["step"] == step and set(probe["retrieval"]) == {"dot", "cos"}
            parts = probe["retrieval"]["cos"]
            assert set(parts) == {"train:train", "train:test", "other:train", "other:test"}
            assert set(parts["train:train"]["per_query"]["nDCG@10"]) == {f"q{i}" for i in range(20)}
            assert set(probe["coverage"]["variants"]) == {"raw", "no-stopwords", "no-frequent"}
        assert not (out / arm / "seed2" / "probes").exists()                  # only the first seed is probed
        assert not list((out / arm).glob("**/checkpoints"))                   # removed once probed
    # the intermediate step is a different model from the final one
    step2 = json.loads((out / "bow" / "seed1" / "probes" / "step-2" / "probe.json").read_text())
    step4 = json.loads((out / "bow" / "seed1" / "probes" / "step-4" / "probe.json").read_text())
    assert (out / "bow" / "seed1" / "probes" / "step-2" / "model" / "model.safetensors").exists()
    assert step2["coverage"]["per_text"] != step4["coverage"]["per_text"] or \
        step2["retrieval"]["dot"] != step4["retrieval"]["dot"]
    gates = json.loads((out / "bench.json").read_text())["gates"]
    bow = gates["objectives_move_representation"]["arms"]["bow"]
    assert set(bow) >= {"probe_dot", "probe_cos", "coverage", "moved", "inputs", "step"} and bow["step"] == 4
    for key in ("probe_dot", "probe_cos", "coverage"):
        assert bow[key]["ci_low"] <= bow[key]["delta"] <= bow[key]["ci_high"]
        assert bow[key]["moved"] == (bow[key]["delta"] >= 0.02 and bow[key]["ci_low"] > 0)
    expected = np.mean(list(step4["retrieval"]["cos"]["train:test"]["per_query"]["nDCG@10"].values()))
    assert expected == pytest.approx(step4["retrieval"]["cos"]["train:test"]["aggregate"]["nDCG@10"])
    rise = gates["pre_saturation"]["arms"]["bow"]["similarities"]["dot"]
    assert (rise["step"], rise["previous_step"]) == (4, 2) and rise["rise"] == pytest.approx(
        rise["probe"] - rise["previous_probe"])
    entry = summary["contrasts"]["nDCG@10"]["train"][0]
    assert entry["representation_changed"] == bow["moved"]
    assert "## Gates" in (out / "results.md").read_text()


def test_several_pretraining_collections_are_one_corpus_in_a_fixed_order(crossfit, collections):
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    _, out, summary = crossfit
    union = out / "pretrain-data" / "train+other.jsonl"
    texts = [json.loads(line)["text"] for line in union.read_text().splitlines()]
    assert texts == [*iter_pretrain_texts(str(collections[0])), *iter_pretrain_texts(str(collections[1]))]
    for arm, seed in (("mlm", 1), ("mlm-aa", 1002)):
        recipe = json.loads((out / arm / f"seed{seed}" / "recipe.json").read_text())
        assert recipe["stages"][0]["pretrain"]["corpus"] == str(union)
    assert summary["settings"]["pretrain_data"] == [str(collections[0]), str(collections[1])]
    assert "∪" in (out / "results.md").read_text()


def test_holm_corrects_within_each_declared_family():
    from pretrieve.bench.quality.arms import parse_contrasts
    from pretrieve.bench.quality.summary import contrast_entries
    from pretrieve.evaluation.significance import holm

    rng = np.random.default_rng(0)
    keys = [("train-test", f"q{i}") for i in range(200)]
    base = rng.uniform(0, 1, size=200)

    def arm(shift):
        return [{key: float(v) for key, v in zip(keys, np.clip(base + shift + rng.normal(0, 0.1, 200), 0, 1))}
                for _ in range(2)]

    per_arm = {"none": arm(0.0), "mlm": arm(0.01), "bow": arm(0.05), "tsdae": arm(0.02)}
    contrasts = parse_contrasts(["bow-mlm", "mlm-none", "anchor:tsdae-mlm"], list(per_arm))
    assert contrasts == ("bow-mlm", "mlm-none", "anchor:tsdae-mlm")
    entries = contrast_entries(per_arm, contrasts, alpha=0.05, margin=0.02, n_boot=500)
    primary = [e for e in entries if e["family"] == "primary"]
    anchor = [e for e in entries if e["family"] == "anchor"]
    assert [e["contrast"] for e in primary] == ["bow-mlm", "mlm-none"] and len(anchor) == 1
    assert [e["p_holm"] for e in primary] == pytest.approx(list(holm([e["p_value"] for e in primary])))
    assert anchor[0]["p_holm"] == pytest.approx(anchor[0]["p_value"])      # a family of one is not corrected
    with pytest.raises(ConfigError, match="listed twice"):
        parse_contrasts(["anchor:tsdae-mlm", "anchor:tsdae-mlm"], list(per_arm))


def test_pretrain_overrides_reach_every_arm_and_a_mean_bottleneck_is_pre_trained(tiny_mlm_dir, collections, tmp_path,
                                                                                   monkeypatch):
    """`--pretrain bottleneck=mean` (Tier 3: a mean-pooled retriever pre-trained on the vector it uses) goes into
    the pre-training settings, the fingerprint bench.json compares, and each arm's pre-trained method."""
    captured = {}

    def run_quality_bench(settings, progress=None):   # the CLI's settings, nothing run
        captured["s"] = settings
        return {}

    monkeypatch.setattr(quality, "run_quality_bench", run_quality_bench)
    monkeypatch.setattr(report, "results_markdown", lambda summary: "")
    train, _ = collections
    result = CliRunner().invoke(app, ["bench", "quality", "--base", str(tiny_mlm_dir), "--train", str(train),
                                      "--out", str(tmp_path / "cli"), "--pretrain", "bottleneck=mean,lr=1e-3",
                                      "--budget", "2"])
    assert result.exit_code == 0, result.output
    assert captured["s"].pretrain["bottleneck"] == "mean" and captured["s"].pretrain["max_steps"] == 2
    assert captured["s"].resolved().fingerprint()["pretrain"]["bottleneck"] == "mean"
    with pytest.raises(ConfigError, match="'method' is set by the harness"):
        settings_for(tiny_mlm_dir, collections, tmp_path / "bad", ("bow",), pretrain={**PRETRAIN, "method": "mlm"}
                     ).resolved()
    with pytest.raises(ConfigError, match="bottleneck"):
        settings_for(tiny_mlm_dir, collections, tmp_path / "bad", ("bow",), pretrain={**PRETRAIN, "botleneck": "mean"}
                     ).resolved()

    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("bow",), seeds=(3,),
                            pretrain={**PRETRAIN, "bottleneck": "mean"}).resolved()
    bench = quality.Bench(settings, quality.load_state(Path(settings.out), settings))
    final = Path(bench.pretrained("bow", 3))
    method = json.loads((final / "method.json").read_text())
    assert method["name"] == "bow" and method["bottleneck"] == "mean"
