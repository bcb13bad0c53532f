"""The notebook user's small surprises (issue 38): ``pretrieve --version``; run files refuse to be overwritten like
every other output (``--overwrite`` to allow); ``bm25`` / ``dense`` / ``evaluate`` write nothing under a data folder;
``data list`` says where a name resolves; the Python API checks its arguments before any download."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import pretrieve
from pretrieve.cli import app
from pretrieve.errors import ConfigError

from conftest import isolated_data_root
from test_finetune import write_collection


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def main_error(monkeypatch, capsys, *args: str) -> tuple[int, list[str]]:
    """Exit code and stderr lines of ``pretrieve ARGS`` run through the console entry point (its error lines)."""
    import sys

    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def files_under(path):
    return sorted((p.relative_to(path).as_posix(), p.stat().st_size) for p in path.rglob("*"))


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"pretrieve {pretrieve.__version__}"


def test_an_existing_run_file_is_refused_unless_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    data = write_collection(tmp_path / "tiny")
    run = tmp_path / "bm25.trec"
    assert invoke("bm25", "--data", data, "--out", run, "--k", 5).exit_code == 0
    before = run.read_text()
    run.write_text(before + "# a line of mine\n")
    code, errors = main_error(monkeypatch, capsys, "bm25", "--data", data, "--out", run, "--k", 5)
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error:") and "exists" in errors[0]
    assert "--overwrite" in errors[0]
    assert run.read_text().endswith("# a line of mine\n")            # untouched
    assert invoke("bm25", "--data", data, "--out", run, "--k", 5, "--overwrite").exit_code == 0
    assert run.read_text() == before
    fused = tmp_path / "fused.trec"
    assert invoke("fuse", run, run, "--out", fused, "--allow-disjoint").exit_code == 0
    code, errors = main_error(monkeypatch, capsys, "fuse", run, run, "--out", fused, "--allow-disjoint")
    assert code == 2 and len(errors) == 1 and "--overwrite" in errors[0]


def test_bm25_dense_and_evaluate_write_nothing_under_the_data_folder(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    data = write_collection(tmp_path / "data" / "tiny")
    before = files_under(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    assert invoke("bm25", "--data", data, "--out", out / "bm25.trec", "--k", 5).exit_code == 0
    result = invoke("dense", "--model", tiny_bert_dir, "--data", data, "--out", out / "dense.trec", "--k", 5,
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    result = invoke("evaluate", out / "bm25.trec", out / "dense.trec", "--data", data)
    assert result.exit_code == 0, result.output
    result = invoke("evaluate", "--model", "bm25", "--data", data, "--out", out / "eval")
    assert result.exit_code == 0, result.output
    assert files_under(tmp_path / "data") == before


def test_data_list_says_a_collection_under_the_data_root_is_here(tmp_path, monkeypatch):
    root = isolated_data_root(tmp_path, monkeypatch)
    write_collection(root / "scifact")
    write_collection(root / "adi")
    result = invoke("data", "list")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert rows["scifact"].split("│")[4].strip() == "yes" and rows["nfcorpus"].split("│")[4].strip() == "no"
    assert rows["adi"].split("│")[4].strip() == "yes" and "local" in rows["adi"]
    assert f"scifact: {root / 'scifact'}" in result.output.replace("\n", "")


def test_api_arguments_are_checked_before_any_download(tmp_path, monkeypatch):
    isolated_data_root(tmp_path, monkeypatch)   # scifact is nowhere: resolving it would try a download
    with pytest.raises(ConfigError, match="num_negative: unknown option; did you mean num_negatives"):
        pretrieve.finetune("minilm", "scifact", tmp_path / "x", num_negative=3)
    with pytest.raises(ConfigError, match="max_step: unknown option; did you mean max_steps"):
        pretrieve.pretrain("minilm", "scifact", tmp_path / "y", max_step=3)


def test_significance_against_a_chosen_baseline(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    data = write_collection(tmp_path / "tiny")
    good = pretrieve.bm25(data, k=10)
    worse = {qid: {doc: -score for doc, score in docs.items()} for qid, docs in good.items()}
    table = pretrieve.evaluate({"bm25": good, "reversed": worse, "again": good}, data, baseline="reversed")
    assert table.baseline == "reversed" and set(table.comparisons) == {"bm25", "again"}
    assert list(table.results) == ["reversed", "bm25", "again"]
    with pytest.raises(ConfigError, match="baseline: no run or model is named 'nope'"):
        pretrieve.evaluate({"bm25": good, "reversed": worse}, data, baseline="nope")
    beir = pretrieve.evaluate(models=["bm25"], data=[data], baseline="bm25", show_progress=False)
    assert beir.baseline == "bm25"


def test_the_average_over_collections_is_tested_too():
    """The Average row's p: a paired t-test over the collections' means (scipy's ttest_rel)."""
    from scipy import stats

    from pretrieve.evaluation import EvalResult, collections_table

    def result(name, scores):
        ids = tuple(f"q{i}" for i in range(len(scores)))
        return EvalResult(aggregate={"nDCG@10": sum(scores) / len(scores)},
                          per_query={"nDCG@10": dict(zip(ids, scores))}, measures=["nDCG@10"], judged_queries=ids)

    base = {"a": [0.1, 0.2, 0.3], "b": [0.5, 0.4, 0.6], "c": [0.2, 0.2, 0.1]}
    better = {"a": [0.3, 0.3, 0.5], "b": [0.6, 0.6, 0.6], "c": [0.2, 0.4, 0.2]}
    table = collections_table({"base": {c: result("base", s) for c, s in base.items()},
                               "better": {c: result("better", s) for c, s in better.items()}}, "nDCG@10")
    means = lambda runs: [sum(s) / len(s) for s in runs.values()]   # noqa: E731
    expected = stats.ttest_rel(means(better), means(base)).pvalue
    assert abs(table.average_p("better", "nDCG@10") - expected) < 1e-12
    header, rows = table.grid()
    assert rows[-1][0] == "Average" and rows[-1][header.index("p")] != ""
    assert "over the 3 collections" in table.legend()
    assert abs(table.to_dict()["average_p"]["better"]["nDCG@10"] - expected) < 1e-12
