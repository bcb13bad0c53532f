"""``pretrieve bench quality``: methods × seeds end to end on a tiny collection, failures, resume from records (on a
fresh clone too), cells side by side, one precision, statistics."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
from scipy import stats
from typer.testing import CliRunner
from transformers.utils import logging as hf_logging

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
                  dev_queries=0, bootstrap=200, threads=1)
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
    """nDCG@10 per query straight from pytrec_eval (independent of pretrieve.evaluation), to the 6 decimals a
    record keeps."""
    evaluator = pytrec_eval.RelevanceEvaluator(load_qrels(qrels_path), {"ndcg_cut.10"})
    return {qid: round(values["ndcg_cut_10"], 6) for qid, values in evaluator.evaluate(read_run(run_path)).items()}


def _record(records: Path, arm: str, seed: int) -> dict:
    return json.loads((records / "cells" / arm / f"seed{seed}.json").read_text())


def _without_records_path(summary: dict) -> dict:
    """A summary without where its records were read (the one thing that differs between two checkouts)."""
    return {key: value for key, value in summary.items() if key != "records"}


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
    # each record counts its folds' fine-tuning seconds from the trainer's logs (complete across resumes)
    for method in ("none", "mlm"):
        record = json.loads((out / "records" / "cells" / method / "seed3.json").read_text())
        assert record["timings"]["finetune_train_s"] > 0
    for name in ("results.md", "results.json", "results.png", "per_query.tsv"):
        assert (out / name).exists(), name
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "bench.json").exists()
    # the comparison's state is its records: tier.json and one record per arm × seed, without any path
    records = out / "records"
    assert summary["records"] == str(records)
    tier = json.loads((records / "tier.json").read_text())
    assert tier["precision"] == "fp32" and tier["methods"] == ["none", "mlm", FAILING, "bow"]
    assert tier["seeds"] == list(SEEDS)
    assert tier["fingerprint"]["train"]["name"] == "train" and tier["fingerprint"]["train"]["digest"].startswith(
        "sha256:")
    assert [e["name"] for e in tier["fingerprint"]["eval"]] == ["train", "other"]
    for path in records.rglob("*.json"):
        assert str(out) not in path.read_text() and str(collections[0]) not in path.read_text(), path
    assert sorted(p.relative_to(records).as_posix() for p in records.rglob("*.json")) == sorted(
        ["tier.json"] + [f"cells/{m}/seed{s}.json" for m in ("none", "mlm", FAILING, "bow") for s in SEEDS] +
        [f"folds/{m}/seed{s}/train-test.json" for m in ("none", "mlm", "bow") for s in SEEDS])   # none of FAILING
    for method in ("none", "mlm", "bow"):
        for seed in SEEDS:
            record = _record(records, method, seed)
            assert record["status"] == "done" and (record["arm"], record["seed"]) == (method, seed)
            assert record["precision"] == "fp32" and record["tier_digest"] == tier["digest"]
            assert set(record["scores"]) == {"train", "other"}
            assert set(record["scores"]["train"]) == {"train:test"} and set(record["scores"]["other"]) == {"train:test"}
            assert set(record["scores"]["train"]["train:test"]) == set(recipes.MEASURES)
            assert set(record["machine"]) >= {"cpu", "threads", "device", "torch"} and record["machine"]["threads"] == 1
            assert "commit" in record["code"] and record["protocol"] == {}
            assert record["coverage"]["variants"]["no-stopwords"]["per_text"].keys() == {"10"}
            assert (record["checkpoint_sha256"] is None) == (method == "none")


def test_a_failing_method_is_reported_and_the_others_complete(bench):
    _, out, summary = bench
    entry = summary["methods"][FAILING]
    assert entry["status"] == "failed" and entry["seeds"] == []
    assert set(entry["failed"]) == {str(s) for s in SEEDS}
    assert all("FloatingPointError: non-finite loss nan" in error for error in entry["failed"].values())
    for seed in SEEDS:                                      # a failed cell is recorded too, with its error
        record = _record(out / "records", FAILING, seed)
        assert record["status"] == "failed" and record["precision"] == "fp32"
        assert "Traceback" in record["traceback"] and "FloatingPointError" in record["error"]
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
            per_query = [_per_query_ndcg(out / method / f"seed{s}" / "train-test" / "runs" /
                                         f"finetune-s1__{collection.name}.trec", collection / "qrels" / "test.tsv")
                         for s in SEEDS]
            for seed, expected in zip(SEEDS, per_query):      # the record keeps every query's score of the run
                recorded = _record(out / "records", method, seed)["scores"][collection.name]["train:test"]
                assert recorded["nDCG@10"] == pytest.approx(expected, abs=1e-12)
            scores = [np.mean(list(values.values())) for values in per_query]
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
                assert cell["per_seed"]["4"] == pytest.approx(aggregate[measure], abs=1e-6)   # records keep 6 digits
    # and the report is recomputed from the records alone
    assert _without_records_path(qsummary.summarize(out / "records")) == _without_records_path(summary)


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
    quality.run_quality_bench(replace(settings, retry_failed=True))
    assert calls == [f"bench-quality-{FAILING}-seed{s}" for s in SEEDS]   # (pre-training fails: no fold runs)


def test_an_interrupted_comparison_restarts_with_the_next_method(tiny_mlm_dir, collections, tmp_path, monkeypatch):
    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "bow", "mlm"), seeds=(1,))
    calls = _count_recipes(monkeypatch, interrupt_at=3)   # dies in the second method's fold, after its pre-training
    with pytest.raises(KeyboardInterrupt):
        quality.run_quality_bench(settings)
    records = tmp_path / "q" / "records"
    assert _record(records, "none", 1)["status"] == "done"
    assert not (records / "cells" / "bow").exists()        # a cell in flight leaves no record
    calls.clear()
    summary = quality.run_quality_bench(settings)
    assert calls == ["bench-quality-bow-seed1-train-test", "bench-quality-mlm-seed1",
                     "bench-quality-mlm-seed1-train-test"]
    assert all(entry["status"] == "done" for entry in summary["methods"].values())


def test_a_removed_record_is_pending_and_rerun(tiny_mlm_dir, collections, tmp_path, monkeypatch):
    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "bow"), seeds=(1,))
    first = quality.run_quality_bench(settings)
    records = tmp_path / "q" / "records"
    (records / "cells" / "bow" / "seed1.json").unlink()   # a user deleting one cell's record to run it again
    summary = qsummary.summarize(records)                   # the report still builds, with bow pending
    assert summary["methods"]["bow"]["status"] == "pending" and summary["methods"]["none"]["status"] == "done"
    assert summary["progress"]["cells_todo"] == ["bow/seed1"] and summary["progress"]["cells_done"] == 1
    calls = _count_recipes(monkeypatch)
    summary = quality.run_quality_bench(settings)           # the scratch of this machine is reused: no recipe
    assert calls == [] and summary["methods"]["bow"]["status"] == "done"
    assert _without_records_path(summary) == _without_records_path(first)
    (records / "cells" / "bow" / "seed1.json").unlink()
    shutil.rmtree(records / "folds" / "bow")                # its fold's record too,
    shutil.rmtree(tmp_path / "q" / "bow")                   # and without its scratch it runs again
    summary = quality.run_quality_bench(settings)
    assert calls == ["bench-quality-bow-seed1", "bench-quality-bow-seed1-train-test"]
    assert summary["methods"]["bow"]["status"] == "done"


def test_a_rerun_with_other_settings_is_refused(bench, tiny_mlm_dir, collections, monkeypatch, tmp_path):
    """tier.json names the settings that differ (and only those), before any work; what may grow (arms, seeds,
    contrasts, the grid) is not a difference."""
    settings, out, _ = bench
    before = (out / "records" / "tier.json").read_text()
    calls = _count_recipes(monkeypatch)
    with pytest.raises(ConfigError, match=r"other settings \(pretrain: recorded") as info:
        quality.run_quality_bench(replace(settings, pretrain={**PRETRAIN, "max_steps": 3}))
    assert "\n" not in str(info.value) and "precision" not in str(info.value)
    with pytest.raises(ConfigError, match=r"other settings \(depth, pretrain: recorded"):
        quality.run_quality_bench(replace(settings, pretrain={**PRETRAIN, "max_steps": 3}, depth=200))
    with pytest.raises(ConfigError, match=r"other settings \(precision: recorded") as info:
        quality.run_quality_bench(replace(settings, precision="bf16"))
    assert '{"precision":"fp32"}' in str(info.value)
    assert calls == [] and (out / "records" / "tier.json").read_text() == before
    from pretrieve.bench.quality.records import Records

    shutil.copy(out / "records" / "tier.json", tmp_path / "tier.json")     # more arms and seeds: the same tier
    grown = replace(settings, methods=("none", "mlm", "mlm-aa"), seeds=(5, 3)).resolved()
    tier = Records(tmp_path).open(grown.fingerprint(), grown.precision, grown.growing())
    assert tier["digest"] == json.loads(before)["digest"] and tier["seeds"] == [3, 4, 5]
    assert tier["methods"] == ["none", "mlm", FAILING, "bow", "mlm-aa"]


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
    with pytest.raises(ConfigError, match="not auto"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("bow",), precision="auto").resolved()
    with pytest.raises(ConfigError, match="precision is the comparison's own"):
        settings_for(tiny_mlm_dir, collections, tmp_path, ("bow",), finetune={**FINETUNE, "precision": "bf16"}
                     ).resolved()
    with pytest.raises(ConfigError, match="not an arm of the comparison"):
        quality.run_quality_bench(settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "bow")),
                                  cells=["bert:1"])
    assert not (tmp_path / "records").exists() and not (tmp_path / "q").exists()


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
def crossfit_settings(model: Path, collections, out: Path, **overrides) -> qsettings.QualityBenchSettings:
    return settings_for(model, collections, out, ("none", "mlm", "mlm-aa"), seeds=(1, 2),
                        folds=("train:test", "test:train"), dev_queries=3, dev_seed=5,
                        grid={"lr": (1e-4, 1e-3), "epochs": (1,)}, contrasts=("mlm-none", "mlm-aa-mlm"),
                        pretrain_data=(str(collections[0]), str(collections[1])), probe_steps=(2,), **overrides)


@pytest.fixture(scope="module")
def crossfit(tiny_mlm_dir, collections, tmp_path_factory):
    """none, mlm and mlm's A/A control × 2 seeds, cross-fitted both ways, 3 dev queries, a 2-point lr grid, the
    first seeds probed at the last step; one cell at a time (``jobs`` 1, one thread)."""
    out = tmp_path_factory.mktemp("crossfit") / "q"
    settings = crossfit_settings(tiny_mlm_dir, collections, out)
    return settings, out, quality.run_quality_bench(settings)


def test_a_pre_training_of_another_comparison_is_reused_when_it_trains_the_same(crossfit, tiny_mlm_dir, collections,
                                                                                 tmp_path):
    """``pretrained_from``: an arm × seed pre-trained in another comparison's scratch with the same settings from
    passages of the same content is copied (its weights, and its logs: what it cost), so its record names the same
    checkpoint; an arm that comparison did not pre-train (``bow``) is pre-trained here."""
    _, first, _ = crossfit
    out = tmp_path / "q"
    settings = settings_for(tiny_mlm_dir, collections, out, ("mlm", "bow"), seeds=(2,), folds=("test:train",),
                            pretrain_data=(str(collections[0]), str(collections[1])), dev_queries=3, dev_seed=5,
                            pretrained_from=str(first))
    quality.run_quality_bench(settings)
    for name in ("logs.jsonl", "final/model.safetensors"):
        assert (out / "mlm" / "seed2" / "pretrain" / name).read_bytes() == \
            (first / "mlm" / "seed2" / "pretrain" / name).read_bytes(), name
    assert _record(out / "records", "mlm", 2)["checkpoint_sha256"] == \
        _record(first / "records", "mlm", 2)["checkpoint_sha256"]
    assert (out / "bow" / "seed2" / "pretrain" / "final" / "model.safetensors").exists()
    assert not (first / "bow").exists()


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
    # the records keep each fold model's scores of the queries it did not train on, and nothing of dev
    test_queries = set(load_qrels(collections[0] / "qrels" / "test.tsv"))
    for arm in ("none", "mlm", "mlm-aa"):
        for seed in settings.resolved().arm_seeds(arm):
            scores = _record(out / "records", arm, seed)["scores"]
            assert set(scores["train"]["train:test"]["nDCG@10"]) == test_queries
            assert set(scores["train"]["test:train"]["nDCG@10"]) == original_train - dev
            assert set(scores["other"]) == {"train:test", "test:train"}             # zero-shot: both fold models
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
    selection = summary["selection"]
    assert selection["arm"] == "mlm" and selection["seed"] == 1 and selection["fold"] == "train:test"
    assert set(selection["scores"]) == {"lr0.0001-epochs1", "lr0.001-epochs1"} and selection["todo"] == []
    dev = set(load_qrels(out / "collections" / "train" / "qrels" / "dev.tsv"))
    for name, score in selection["scores"].items():     # one record per grid point: its per-query dev scores
        record = json.loads((out / "records" / "select" / f"{name}.json").read_text())
        assert record["status"] == "done" and record["name"] == name and record["precision"] == "fp32"
        assert (record["arm"], record["seed"], record["fold"]) == ("mlm", 1, "train:test")
        assert set(record["dev"]["per_query"]) == dev and record["dev"]["measure"] == "nDCG@10"
        assert score == pytest.approx(np.mean(list(record["dev"]["per_query"].values())), abs=1e-12)
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
            assert _record(out / "records", arm, seed)["protocol"] == selection["chosen"]
    assert "## Fine-tuning protocol (chosen once on dev)" in (out / "results.md").read_text()


def test_the_aa_arm_runs_other_seeds_and_contrasts_are_reported_with_holm(crossfit):
    _, out, summary = crossfit
    assert summary["methods"]["mlm-aa"]["seeds"] == [1001, 1002]
    assert (out / "mlm-aa" / "seed1001" / "pretrain" / "final").is_dir()
    recipe = json.loads((out / "mlm-aa" / "seed1001" / "recipe.json").read_text())
    assert recipe["seed"] == 1001 and recipe["stages"][0]["pretrain"]["method"] == "mlm"
    entries = summary["contrasts"]["nDCG@10"]["train"]
    assert [e["contrast"] for e in entries] == ["mlm-none", "mlm-aa-mlm"]
    assert [e["family"] for e in entries] == ["primary", "aa"]      # the A/A control is its own family
    for entry in entries:                                           # each a family of one: Holm leaves p as is
        assert entry["family_size"] == 1 and entry["p_holm"] == pytest.approx(entry["p_value"], abs=1e-12)
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
    assert "## Contrasts (nDCG@10" in markdown and "| train | mlm-aa − mlm (aa) |" in markdown


def test_bench_claims_recomputes_a_tier_and_refuses_a_directory_without_a_comparison(crossfit, tmp_path):
    """`bench claims` on a finished comparison's records: the A/A row carries the tier's own bootstrap and Holm p,
    the rows whose arms or tiers are missing are pending; a directory without tier.json is one line, exit 2."""
    _, out, summary = crossfit
    recorded = next(e for e in summary["contrasts"]["nDCG@10"]["train"] if e["contrast"] == "mlm-aa-mlm")
    expected = "passed" if recorded["p_holm"] >= 0.05 else "failed"
    result = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out / "records")])
    assert result.exit_code == 0, result.output
    assert f"**pending** (so far: {expected})" in result.output          # 2 seeds, Tier 1 fixes 3
    result = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out / "records"), "--any-seeds", "--out",
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
    # a tier's records as Tier 2b's, with the base's gate report kept beside them (claims.sh tier2b puts it there):
    # bench claims reads it without --scratch-gate
    scratch = tmp_path / "tier2b"
    shutil.copytree(out / "records", scratch)
    (scratch / "gate.json").write_text('{"accuracy": 0.31, "gate": {"accuracy_at_least": 0.25, "passed": true}}')
    result = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out / "records"), "--scratch", str(scratch),
                                      "--any-seeds", "--out", str(tmp_path / "with-scratch")])
    assert result.exit_code == 0, result.output
    h1 = next(c for c in json.loads((tmp_path / "with-scratch.json").read_text())["claims"] if c["id"] == "h1")
    gate = next(e for e in h1["evidence"] if e and e.get("label") == "from-scratch base gate")
    assert gate["accuracy"] == 0.31
    # a base below the gate runs no cell: its records hold the gate's report alone, and that is enough
    failed = tmp_path / "tier2b-failed"
    failed.mkdir()
    (failed / "gate.json").write_text('{"accuracy": 0.18, "gate": {"accuracy_at_least": 0.25, "passed": false}}')
    result = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out / "records"), "--scratch", str(failed),
                                      "--any-seeds", "--out", str(tmp_path / "gate-only")])
    assert result.exit_code == 0, result.output
    h1 = next(c for c in json.loads((tmp_path / "gate-only.json").read_text())["claims"] if c["id"] == "h1")
    assert next(e for e in h1["evidence"] if e and e.get("label") == "from-scratch base gate")["passed"] is False
    from test_input_guards import assert_one_line_error, run_cli

    assert_one_line_error(run_cli("bench", "claims", "--tier1", str(out)), "tier.json missing", "tier1")


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
                                      "--methods", "none,mlm,mlm-aa", "--contrasts", "mlm-none,mlm-aa-mlm",
                                      "--threads", "1"])
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
    query of every split and the coverage variants, kept in the first seed's record; the gates are computed from
    the records with their inputs."""
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
    for arm, steps in (("mlm", ("2", "4")), ("bow", ("2", "4")), ("none", ("0",))):
        first, second = _record(out / "records", arm, 1), _record(out / "records", arm, 2)
        assert tuple(first["probes"]) == steps and second["probes"] == {}
        kept = first["probes"][steps[-1]]
        assert set(kept["retrieval"]) == {"dot", "cos"} and set(kept["coverage"]["variants"]) == {
            "raw", "no-stopwords", "no-frequent"}
    recorded = _record(out / "records", "bow", 1)["probes"]["4"]["retrieval"]["cos"]["train:test"]
    assert recorded["per_query"]["nDCG@10"] == pytest.approx(
        step4["retrieval"]["cos"]["train:test"]["per_query"]["nDCG@10"], abs=1e-6)
    gates = summary["gates"]
    assert gates == qsummary.summarize(out / "records")["gates"]
    bow = gates["objectives_move_representation"]["arms"]["bow"]
    assert bow["inputs"]["probe"] == "bow/seed1 probe step 4"           # records, not paths
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


def test_a_probe_encodes_each_corpus_once_and_its_cosine_is_the_encoded_one(tiny_mlm_dir, collections, tmp_path,
                                                                             monkeypatch):
    """dot and cos share one encode of each corpus (the cosine index is the dot vectors normalised) and score
    exactly as a cosine probe that encodes its own index."""
    import pretrieve.retrieval.search as search_module
    from pretrieve.analysis.probe import cls_probe

    calls = []
    original = search_module.encode_corpus
    monkeypatch.setattr(search_module, "encode_corpus",
                        lambda retriever, corpus, root, **kw: calls.append(Path(root).name) or
                        original(retriever, corpus, root, **kw))
    both = cls_probe(tiny_mlm_dir, collections, tmp_path / "both", precision="fp32")
    assert sorted(calls) == sorted(f"dot__{Path(c).name}" for c in collections)
    calls.clear()
    alone = cls_probe(tiny_mlm_dir, collections, tmp_path / "alone", similarities=("cos",), precision="fp32")
    assert sorted(calls) == sorted(f"cos__{Path(c).name}" for c in collections)
    assert alone["cos"] == both["cos"] and set(both) == {"dot", "cos"}


def test_several_pretraining_collections_are_one_corpus_in_a_fixed_order(crossfit, collections):
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    _, out, summary = crossfit
    union = out / "pretrain-data" / "train+other.jsonl"
    texts = [json.loads(line)["text"] for line in union.read_text().splitlines()]
    assert texts == [*iter_pretrain_texts(str(collections[0])), *iter_pretrain_texts(str(collections[1]))]
    for arm, seed in (("mlm", 1), ("mlm-aa", 1002)):
        recipe = json.loads((out / arm / f"seed{seed}" / "recipe.json").read_text())
        assert recipe["stages"][0]["pretrain"]["corpus"] == str(union)
    assert summary["settings"]["pretrain_data"] == ["train", "other"]          # by name, identified by content
    identities = summary["settings"]["identities"]["pretrain_data"]
    assert [i["name"] for i in identities] == ["train", "other"]
    assert all(i["digest"].startswith("sha256:") for i in identities)
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
    the pre-training settings, the fingerprint tier.json compares, and each arm's pre-trained method."""
    captured = {}

    def run_quality_bench(settings, progress=None, **options):   # the CLI's settings, nothing run
        captured["s"], captured["options"] = settings, options
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
    assert captured["s"].precision == "fp32" and captured["options"] == {"cells": None, "select_only": False,
                                                                         "jobs": 1, "commit_records": False}
    result = CliRunner().invoke(app, ["bench", "quality", "--base", str(tiny_mlm_dir), "--train", str(train),
                                      "--out", str(tmp_path / "cli"), "--records", str(tmp_path / "records"),
                                      "--cells", "mlm:1,bow", "--jobs", "2", "--select-only", "--commit",
                                      "--precision", "bf16", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert captured["options"] == {"cells": ["mlm:1", "bow"], "select_only": True, "jobs": 2, "commit_records": True}
    chosen = captured["s"]
    assert (chosen.precision, chosen.records, chosen.threads) == ("bf16", str(tmp_path / "records"), 1)
    with pytest.raises(ConfigError, match="'method' is set by the harness"):
        settings_for(tiny_mlm_dir, collections, tmp_path / "bad", ("bow",), pretrain={**PRETRAIN, "method": "mlm"}
                     ).resolved()
    with pytest.raises(ConfigError, match="bottleneck"):
        settings_for(tiny_mlm_dir, collections, tmp_path / "bad", ("bow",), pretrain={**PRETRAIN, "botleneck": "mean"}
                     ).resolved()

    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("bow",), seeds=(3,),
                            pretrain={**PRETRAIN, "bottleneck": "mean"}).resolved()
    bench = quality.Bench(settings)
    final = Path(bench.pretrained("bow", 3))
    method = json.loads((final / "method.json").read_text())
    assert method["name"] == "bow" and method["bottleneck"] == "mean"


# ------------------------------------------------------------------ issue 36: cells, records, jobs, one precision
def _comparable(records: Path) -> dict[str, dict]:
    """Every record of a records directory without what says where, when and how fast it was made."""
    kept = {"cells": ("status", "arm", "seed", "method", "protocol", "finetune", "scores", "coverage", "probes",
                      "precision", "tier_digest"),
            "folds": ("status", "arm", "seed", "fold", "protocol", "scores", "checkpoint_sha256", "precision",
                      "tier_digest"),
            "select": ("status", "name", "point", "arm", "seed", "fold", "dev", "precision", "tier_digest")}
    out = {}
    for path in sorted(records.rglob("*.json")):
        name = path.relative_to(records).as_posix()
        record = json.loads(path.read_text())
        kind = name.split("/")[0]
        out[name] = {key: record.get(key) for key in kept[kind]} if kind in kept else record
    return out


def test_two_jobs_give_the_same_records_as_one(crossfit, tiny_mlm_dir, collections, tmp_path, capfd):
    """`--jobs 2` (each cell in its own spawned process, one thread each) writes the same records as `--jobs 1`
    (the `crossfit` comparison): every dev-grid point's dev scores, and the per-query scores, coverage, probes and
    protocol of `mlm` seed 1 (whose pre-training the grid made, in this process) and `mlm-aa` seed 1001 (pre-trained
    and probed in a worker); each cell in parts (its folds side by side in two processes, then the cell)."""
    _, out, summary = crossfit
    twin = crossfit_settings(tiny_mlm_dir, collections, tmp_path / "q")
    lines = []
    hf_logging.disable_progress_bar()      # as the CLI does in this (the parent) process; the cells are spawned
    try:
        parallel = quality.run_quality_bench(twin, progress=lines.append, jobs=2, cells=["mlm:1", "mlm-aa:1001"])
    finally:
        hf_logging.enable_progress_bar()
    running = [line.split("] ", 1)[1].removesuffix(": running") for line in lines if line.endswith(": running")]
    folds = [f"fold {fold}" for fold in twin.resolved().folds]
    assert running[:2] == ["select lr0.0001-epochs1", "select lr0.001-epochs1"]       # the grid's 2 points, then
    assert sorted(running[2:]) == sorted(["prepare mlm-aa/seed1001", "cell mlm/seed1", "cell mlm-aa/seed1001",  # parts
                                          *(f"{cell} {fold}" for cell in ("fold mlm/seed1", "fold mlm-aa/seed1001")
                                            for fold in folds)])
    for arm in ("mlm/seed1", "mlm-aa/seed1001"):    # a cell's folds run once it is pre-trained, the cell after them
        parts = [i for i, line in enumerate(running) if arm in line and not line.startswith(("cell", "prepare"))]
        assert running.index(f"cell {arm}") > max(parts)
    assert running.index("prepare mlm-aa/seed1001") < running.index(f"fold mlm-aa/seed1001 {folds[0]}")
    ours, theirs = _comparable(tmp_path / "q" / "records"), _comparable(out / "records")
    fold_records = [f"folds/{cell}/{qsettings.fold_dir(fold)}.json" for cell in ("mlm-aa/seed1001", "mlm/seed1")
                    for fold in twin.resolved().folds]
    assert sorted(ours) == ["cells/mlm-aa/seed1001.json", "cells/mlm/seed1.json", *sorted(fold_records),
                            "select/lr0.0001-epochs1.json", "select/lr0.001-epochs1.json", "tier.json"]
    for name in ours:
        assert ours[name] == theirs[name], name
    assert ours["cells/mlm/seed1.json"]["probes"] and ours["cells/mlm-aa/seed1001.json"]["probes"]
    assert _record(tmp_path / "q" / "records", "mlm", 1)["machine"]["threads"] == 1
    assert parallel["progress"]["cells_done"] == 2 and parallel["selection"] == summary["selection"]
    assert "Loading weights" not in capfd.readouterr().err      # the spawned cells draw no library tqdm frames


def test_the_grid_model_is_the_selection_arms_first_fold_and_reusing_it_changes_no_number(crossfit, tmp_path):
    """The dev grid's chosen point fine-tuned `mlm` seed 1 on the first fold with the chosen protocol: that fold
    reuses its model (same bytes) instead of training it again, and the other folds and seeds train. With a
    scratch `--out` that has no grid models (another machine), `mlm` seed 1 trains that fold itself and its record
    is the same."""
    settings, out, summary = crossfit
    chosen = summary["selection"]["chosen"]
    fold = qsettings.fold_dir(settings.folds[0])
    grid_model = out / "select" / qsettings.point_name(chosen) / "finetune-s1" / "final" / "model.safetensors"
    reused = out / "mlm" / "seed1" / fold / "finetune-s1" / "final" / "model.safetensors"
    assert reused.read_bytes() == grid_model.read_bytes()
    assert not (out / "mlm" / "seed1" / fold / "finetune-s1" / "logs.jsonl").exists()     # nothing trained there
    assert (out / "mlm" / "seed2" / fold / "finetune-s1" / "logs.jsonl").exists()         # another seed trains
    records = tmp_path / "records"
    shutil.copytree(out / "records", records)
    (records / "cells" / "mlm" / "seed1.json").unlink()
    shutil.rmtree(records / "folds" / "mlm" / "seed1")        # its folds were not recorded either
    lines = []
    quality.run_quality_bench(replace(settings, out=str(tmp_path / "other-machine"), records=str(records)),
                              cells=["mlm:1"], progress=lines.append)
    assert (tmp_path / "other-machine" / "mlm" / "seed1" / fold / "finetune-s1" / "logs.jsonl").exists()   # trained
    assert not (tmp_path / "other-machine" / "select").exists()
    assert _comparable(records)["cells/mlm/seed1.json"] == _comparable(out / "records")["cells/mlm/seed1.json"]


def test_a_fresh_clone_with_the_records_alone_runs_no_cell_and_rebuilds_the_report_and_the_claims(
        crossfit, tmp_path, monkeypatch):
    """Only the records directory is copied (as a clone of the repository has it): with a new, empty `--out` and
    the same settings, every recorded cell and grid point counts as done — nothing is trained, pre-trained or
    evaluated — and the summary equals the original's; `bench claims --tier1 RECORDS` rebuilds the decision table
    from the records alone."""
    settings, out, summary = crossfit
    clone = tmp_path / "clone" / "results" / "claims" / "tier1"
    shutil.copytree(out / "records", clone)
    called = []

    def forbidden(name):
        def call(*args, **kwargs):
            called.append(name)
            raise AssertionError(f"{name} ran on a fresh clone")
        return call

    monkeypatch.setattr(quality, "fold_part", forbidden("fold_part"))
    monkeypatch.setattr(quality.Bench, "select_point", forbidden("select_point"))
    monkeypatch.setattr(quality.Bench, "pretrained", forbidden("pretrained"))
    monkeypatch.setattr(quality, "run_job", forbidden("run_job"))
    monkeypatch.setattr(quality.Bench, "prepare", forbidden("prepare"))
    lines = []
    fresh = quality.run_quality_bench(replace(settings, out=str(tmp_path / "fresh"), records=str(clone)),
                                      progress=lines.append)
    assert called == []
    assert sum("recorded, skipped" in line for line in lines) == 6
    assert _without_records_path(fresh) == _without_records_path(summary)
    assert fresh["records"] == str(clone) and fresh["progress"]["cells_todo"] == []
    assert (tmp_path / "fresh" / "results.md").exists()
    assert not list((tmp_path / "fresh").glob("mlm*")) and not (tmp_path / "fresh" / "none").exists()
    # the decision table from the records alone, with no --out: the same as from the original records
    from_clone = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(clone), "--any-seeds"])
    from_original = CliRunner().invoke(app, ["bench", "claims", "--tier1", str(out / "records"), "--any-seeds"])
    assert from_clone.exit_code == 0 and from_original.exit_code == 0, from_clone.output
    assert from_clone.stdout.startswith("# Decision table") and "A/A control" in from_clone.stdout
    assert str(clone) in from_clone.stdout                                   # the inputs it names
    assert from_clone.stdout.replace(str(clone), "RECORDS") == from_original.stdout.replace(str(out / "records"),
                                                                                            "RECORDS")


def test_records_an_interrupted_run_left_uncommitted_are_committed_by_the_next_run(crossfit, tmp_path, monkeypatch):
    """A run killed between writing a record and committing it (a session's end) leaves the record in the working
    tree: the next run with ``--commit`` counts the cell as done and commits it — exactly the records, not a killed
    write's hidden temporary."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    settings, out, _ = crossfit
    repo = tmp_path / "repo"
    clone = repo / "results" / "claims" / "tier1"
    shutil.copytree(out / "records", clone)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    left = sorted((clone / "cells" / "mlm").glob("*.json"))                  # written, not committed
    subprocess.run([*git, "-C", str(repo), "add", "--", *[str(p) for p in clone.rglob("*.json") if p not in left]],
                   check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "records"], check=True)
    (clone / "cells" / "mlm" / ".seed9.json.abc.tmp").write_text("{")          # a killed write's temporary
    monkeypatch.setattr(quality, "run_job", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("ran a job")))
    for name, value in (("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@example.org"),
                        ("GIT_COMMITTER_NAME", "t"), ("GIT_COMMITTER_EMAIL", "t@example.org")):
        monkeypatch.setenv(name, value)
    quality.run_quality_bench(replace(settings, out=str(tmp_path / "fresh"), records=str(clone)),
                              commit_records=True)
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert status == ["?? results/claims/tier1/cells/mlm/.seed9.json.abc.tmp"]
    message = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s"], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert left and message == f"Claims records (tier1): {len(left)} record(s) an interrupted run had not committed"
    committed = subprocess.run(["git", "-C", str(repo), "show", "--name-only", "--format="], capture_output=True,
                               text=True, check=True).stdout.split()
    assert sorted(committed) == sorted(str(p.relative_to(repo)) for p in left)


def test_a_stale_index_lock_is_removed_and_a_live_one_is_waited_for(tmp_path, monkeypatch):
    """A git killed mid-commit (a session's end) leaves ``.git/index.lock`` and every later commit fails: a lock
    older than ``STALE_LOCK_S`` is removed and the record committed; a recent one (a live git) is left alone."""
    import os
    import time

    from pretrieve.bench.quality import records as qrecords

    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for name, value in (("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@example.org"),
                        ("GIT_COMMITTER_NAME", "t"), ("GIT_COMMITTER_EMAIL", "t@example.org")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(qrecords.time, "sleep", lambda seconds: None)
    lock = repo / ".git" / "index.lock"
    first, second = repo / "cells" / "a.json", repo / "cells" / "b.json"
    first.parent.mkdir()
    first.write_text("{}")
    second.write_text("{}")
    lock.write_text("")
    old = time.time() - qrecords.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    assert qrecords.commit([first], "first") and not lock.exists()
    lock.write_text("")                                                        # a live git's lock
    assert not qrecords.commit([second], "second", attempts=2) and lock.exists()
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert log == ["first"]


def test_a_recorded_fold_is_not_run_again_on_the_next_machine_when_its_checkpoint_has_the_same_bytes(
        crossfit, tmp_path, monkeypatch):
    """A machine replaced between a cell's folds: the records hold the first fold's record, not the cell's. A new
    machine (an empty scratch `--out`) pre-trains the cell again (same bytes), fine-tunes only the other fold, and
    writes the cell record the uninterrupted run wrote; its `parts` say where each fold ran. A fold record made from
    a checkpoint with other bytes does not count: that fold runs again."""
    settings, out, _ = crossfit
    records = tmp_path / "records"
    shutil.copytree(out / "records", records)
    first, second = (qsettings.fold_dir(fold) for fold in settings.folds)
    (records / "cells" / "mlm-aa" / "seed1001.json").unlink()
    (records / "folds" / "mlm-aa" / "seed1001" / f"{second}.json").unlink()
    progress = qsummary.summarize(records)["progress"]
    assert progress["folds_recorded"] == {"mlm-aa/seed1001": [settings.folds[0]]}
    assert f"mlm-aa/seed1001: fold {settings.folds[0]} recorded" in report.results_markdown(qsummary.summarize(records))
    recipes_run = _count_recipes(monkeypatch)
    lines = []
    quality.run_quality_bench(replace(settings, out=str(tmp_path / "next"), records=str(records)),
                              cells=["mlm-aa:1001"], progress=lines.append)
    assert recipes_run == ["bench-quality-mlm-aa-seed1001", f"bench-quality-mlm-aa-seed1001-{second}"]
    assert not any(f"fold mlm-aa/seed1001 {settings.folds[0]}" in line for line in lines), lines   # not handed out
    assert not (tmp_path / "next" / "mlm-aa" / "seed1001" / first).exists()
    ours, theirs = _comparable(records), _comparable(out / "records")
    assert ours == theirs
    cell = _record(records, "mlm-aa", 1001)
    assert sorted(cell["parts"]) == sorted(settings.folds) and all(p["machine"] for p in cell["parts"].values())

    # the same fold record, but made from a checkpoint with other bytes: not current, the fold trains again
    path = records / "folds" / "mlm-aa" / "seed1001" / f"{first}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "checkpoint_sha256": "0" * 64}))
    (records / "cells" / "mlm-aa" / "seed1001.json").unlink()
    recipes_run.clear()
    quality.run_quality_bench(replace(settings, out=str(tmp_path / "third"), records=str(records)),
                              cells=["mlm-aa:1001"])
    assert recipes_run == ["bench-quality-mlm-aa-seed1001", f"bench-quality-mlm-aa-seed1001-{first}"]   # only it
    assert _comparable(records) == theirs


def test_the_report_says_on_which_machines_each_seeds_arms_and_folds_ran(crossfit, tmp_path):
    """Each contrast pairs arms within a seed: the report lists, per seed, the machines of its arms' cells and of
    their folds' records (`parts`), so a seed whose arms ran on two CPU models shows it."""
    settings, out, _ = crossfit
    records = tmp_path / "records"
    shutil.copytree(out / "records", records)
    path = records / "cells" / "mlm" / "seed2.json"
    cell = json.loads(path.read_text())
    fold = settings.folds[1]
    cell["parts"][fold]["machine"] = {**cell["machine"], "cpu": "Other CPU"}          # one fold ran elsewhere
    path.write_text(json.dumps(cell))
    summary = qsummary.summarize(records)
    by_seed = summary["progress"]["machines_by_seed"]
    here = f"{cell['machine']['cpu']} (cpu, 1 threads)"
    assert by_seed["seed 1"] == {here: ["none", "mlm", "mlm-aa"]}                  # mlm-aa's seed 1001 is its first
    assert by_seed["seed 2"] == {here: ["none", "mlm", "mlm-aa"], "Other CPU (cpu, 1 threads)": ["mlm"]}
    assert "seed 2: " in report.results_markdown(summary) and "Other CPU (cpu, 1 threads) (mlm)" in \
        report.results_markdown(summary)


def test_a_record_of_another_precision_does_not_count_and_its_cell_runs_again(crossfit, tmp_path, monkeypatch):
    from pretrieve.bench.quality.records import Records

    settings, out, summary = crossfit
    records = tmp_path / "records"
    shutil.copytree(out / "records", records)
    for cell in [records / "cells" / "none" / "seed1.json", *(records / "folds" / "none" / "seed1").glob("*.json")]:
        cell.write_text(json.dumps({**json.loads(cell.read_text()), "precision": "bf16"}))   # the cell's and folds'
    other = qsummary.summarize(records)
    assert other["methods"]["none"]["pending"] == [1] and other["methods"]["none"]["seeds"] == [2]
    assert other["methods"]["none"]["status"] == "partial" and other["progress"]["cells_todo"] == ["none/seed1"]
    tier = json.loads((records / "tier.json").read_text())
    assert Records(records).cell("none", 1, tier, summary["selection"]["chosen"]) is None
    assert all(Records(records).fold("none", 1, fold, tier, summary["selection"]["chosen"], None) is None and
               Records(out / "records").fold("none", 1, fold, tier, summary["selection"]["chosen"], None)
               for fold in settings.folds)
    jobs = []

    def run_job(settings_, tier, kind, payload):     # what the harness would run, nothing run
        jobs.append((kind, dict(payload)))
        return {"path": None, "status": "done", "line": "not run"}

    monkeypatch.setattr(quality, "run_job", run_job)
    quality.run_quality_bench(replace(settings, out=str(tmp_path / "fresh"), records=str(records)))
    chosen = summary["selection"]["chosen"]
    assert jobs == [*(("fold", {"arm": "none", "seed": 1, "fold": fold, "protocol": chosen})
                      for fold in settings.folds),
                    ("cell", {"arm": "none", "seed": 1, "protocol": chosen, "parts_s": 0.0})]     # in parts
    # a grid point of another precision does not count either: no protocol is chosen, so no cell is done
    point = records / "select" / "lr0.001-epochs1.json"
    point.write_text(json.dumps({**json.loads(point.read_text()), "precision": "bf16"}))
    other = qsummary.summarize(records)
    assert other["selection"]["todo"] == ["lr0.001-epochs1"] and other["selection"]["chosen"] is None
    assert other["progress"]["cells_done"] == 0


def test_a_tier_of_another_precision_is_refused_in_one_line(tiny_mlm_dir, collections, tmp_path):
    """tier.json fixes the comparison's precision: a run at another one is refused before any work, one line,
    exit code 2, naming `precision`."""
    from test_input_guards import assert_one_line_error, run_cli

    train, _ = collections
    args = ["bench", "quality", "--base", str(tiny_mlm_dir), "--train", str(train), "--methods", "none",
            "--dev-queries", "0", "--out", str(tmp_path / "out"), "--records", str(tmp_path / "records"),
            "--select-only"]
    result = CliRunner().invoke(app, args)          # records the tier (at fp32); there is no grid, so no cell runs
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "records" / "tier.json").read_text())["precision"] == "fp32"
    assert not (tmp_path / "records" / "cells").exists()
    refused = run_cli(*args, "--precision", "bf16")
    assert_one_line_error(refused, "tier.json", "other settings (precision: recorded")
    assert json.loads((tmp_path / "records" / "tier.json").read_text())["precision"] == "fp32"


def test_a_missing_contrast_counts_as_p_1_and_the_family_keeps_its_size():
    """The missing-contrast bug (claims-audit.md §3, bug 2): with the registered family of 5 and `retromae`
    without results, the other three contrasts' Holm p is Holm over 5 with p = 1 for the two missing ones — not
    Holm over the 3 that have results."""
    from pretrieve.bench.quality.arms import DEFAULT_CONTRASTS, parse_contrasts
    from pretrieve.bench.quality.summary import contrast_entries
    from pretrieve.evaluation.significance import holm

    rng = np.random.default_rng(0)
    keys = [("train:test", f"q{i}") for i in range(200)]
    base = rng.uniform(0, 1, size=200)

    def arm(shift):
        return [{key: float(v) for key, v in zip(keys, np.clip(base + shift + rng.normal(0, 0.1, 200), 0, 1))}
                for _ in range(2)]

    per_arm = {"none": arm(0.0), "mlm": arm(0.02), "bow": arm(0.05), "retromae": []}
    contrasts = parse_contrasts(list(DEFAULT_CONTRASTS), list(per_arm))
    assert contrasts == DEFAULT_CONTRASTS
    entries = contrast_entries(per_arm, contrasts, alpha=0.05, margin=0.02, n_boot=500)
    assert [e["contrast"] for e in entries] == ["bow-mlm", "bow-none", "mlm-none"]
    raw = {e["contrast"]: e["p_value"] for e in entries}
    full = holm([raw.get(name, 1.0) for name in DEFAULT_CONTRASTS])
    expected = dict(zip(DEFAULT_CONTRASTS, full))
    assert min(raw.values()) < 0.2                                   # the family adjusts something
    for entry in entries:
        assert entry["p_holm"] == pytest.approx(expected[entry["contrast"]], abs=1e-12)
        assert entry["family_size"] == 5
    assert [e["p_holm"] for e in entries] != pytest.approx(list(holm(list(raw.values()))))   # not Holm over 3


def test_an_aa_contrast_without_a_family_label_is_its_own_family():
    from pretrieve.bench.quality.arms import parse_contrasts
    from pretrieve.bench.quality.summary import contrast_entries

    arms = ["none", "mlm", "bow", "mlm-aa"]
    assert parse_contrasts(["bow-mlm", "mlm-none", "mlm-aa-mlm"], arms) == ("bow-mlm", "mlm-none", "aa:mlm-aa-mlm")
    with pytest.raises(ConfigError, match="listed twice"):
        parse_contrasts(["mlm-aa-mlm", "aa:mlm-aa-mlm"], arms)
    rng = np.random.default_rng(1)
    keys = [("train:test", f"q{i}") for i in range(100)]
    per_arm = {arm: [{key: float(v) for key, v in zip(keys, rng.uniform(0, 1, 100))} for _ in range(2)]
               for arm in arms}
    entries = contrast_entries(per_arm, parse_contrasts(["bow-mlm", "mlm-none", "mlm-aa-mlm"], arms), alpha=0.05,
                               margin=0.02, n_boot=200)
    families = {e["contrast"]: (e["family"], e["family_size"]) for e in entries}
    assert families == {"bow-mlm": ("primary", 2), "mlm-none": ("primary", 2), "mlm-aa-mlm": ("aa", 1)}


def test_cells_are_parsed_and_checked(tiny_mlm_dir, collections, tmp_path):
    """`--cells mlm:1,bow`: one cell, then every seed of an arm (an A/A arm's own seeds); an unknown arm or seed
    is one ConfigError line, before any work (the CLI passes `--cells` through: see the test of `--pretrain`)."""
    settings = settings_for(tiny_mlm_dir, collections, tmp_path / "q", ("none", "mlm", "bow", "mlm-aa"),
                            seeds=(1, 2)).resolved()
    assert quality.parse_cells(["mlm:1", "bow"], settings) == [("mlm", 1), ("bow", 1), ("bow", 2)]
    assert quality.parse_cells(["mlm-aa", "mlm:2", "mlm:2"], settings) == [("mlm-aa", 1001), ("mlm-aa", 1002),
                                                                           ("mlm", 2)]
    assert quality.parse_cells([" mlm-aa:1002"], settings) == [("mlm-aa", 1002)]
    for item, message in (("bert:1", "'bert' is not an arm of the comparison (none, mlm, bow, mlm-aa)"),
                          ("mlm:3", "seed 3 is not one of mlm's seeds [1, 2]"),
                          ("mlm-aa:1", "seed 1 is not one of mlm-aa's seeds [1001, 1002]"),
                          ("mlm:one", "the seed must be a number, e.g. mlm:1")):
        with pytest.raises(ConfigError) as info:
            quality.parse_cells(["none", item], settings)
        assert message in str(info.value) and f"cell '{item}'" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="seed 7 is not one of mlm's seeds"):     # before any work
        quality.run_quality_bench(replace(settings, out=str(tmp_path / "run")), cells=["mlm:1", "mlm:7"])
    assert not (tmp_path / "run").exists()
