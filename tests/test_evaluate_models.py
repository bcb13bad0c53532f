"""``pretrieve evaluate --model …``: models on several collections in one BEIR-style table (a row per collection and
the average), paired t-tests against the first model with Holm-adjusted p-values (equal to statsmodels'); Holm in the
one-collection table of run files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests
from typer.testing import CliRunner

from pretrieve.data import registry
from pretrieve.evaluation import build_table, evaluate, holm, holm_family, holm_note, paired_ttest

from test_finetune import write_collection

N_QUERIES = 30


def rank(qid: int, position: int) -> dict[str, float]:
    """A ranking of query ``qid`` with its relevant document at ``position`` (1–3)."""
    scores = {1: {f"rel{qid}": 3.0, "x": 2.0}, 2: {"x": 3.0, f"rel{qid}": 2.0},
              3: {"x": 3.0, "y": 2.0, f"rel{qid}": 1.0}}
    return scores[position]


def moderately_better(first: int) -> dict[str, dict[str, float]]:
    """Better than the baseline (rank 2 everywhere) on 5 queries from ``first``, worse on one: t-test p ≈ 0.037."""
    return {f"q{i}": rank(i, 1 if first <= i < first + 5 else 3 if i == first + 5 else 2) for i in range(N_QUERIES)}


def test_holm_equals_statsmodels():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 20):
        p = rng.uniform(0.0, 0.2, n)
        p[::3] = p[0]                                     # ties
        assert np.allclose(holm(p), multipletests(p, method="holm")[1], atol=1e-12)
    tests = [paired_ttest([0.0, 1.0, 0.5], [1.0, 1.0, 1.0]), paired_ttest([0.0], [1.0]),   # the second: no p
             paired_ttest([0.0, 1.0, 0.5], [0.5, 1.0, 0.6])]
    adjusted = holm_family(tests)
    assert math.isnan(adjusted[1].p_holm) and adjusted[1].p_value is tests[1].p_value
    assert [adjusted[0].p_holm, adjusted[2].p_holm] == pytest.approx(
        multipletests([tests[0].p_value, tests[2].p_value], method="holm")[1])


def test_several_runs_against_one_are_decided_on_holm_p_values():
    qrels = {f"q{i}": {f"rel{i}": 1} for i in range(N_QUERIES)}
    runs = {"base": {f"q{i}": rank(i, 2) for i in range(N_QUERIES)}, "a": moderately_better(0),
            "b": moderately_better(10)}
    results = {name: evaluate(qrels, run, ["MRR@10"]) for name, run in runs.items()}
    uncorrected = build_table(results, correction=None)
    table = build_table(results)
    raw = [uncorrected.comparisons[name]["MRR@10"].p_value for name in ("a", "b")]
    assert all(0.026 < p < 0.05 for p in raw)                          # each significant alone …
    assert [table.p_value(name, "MRR@10") for name in ("a", "b")] == pytest.approx(
        multipletests(raw, method="holm")[1])
    assert uncorrected.mark("a", "MRR@10") == "†▲" and table.mark("a", "MRR@10") == ""   # … not after Holm
    markdown = table.to_markdown()
    assert "Holm-adjusted over the 2 runs tested against it" in markdown
    assert "| p (Holm) vs base | a | b |" in markdown and "| MRR@10 | 0.0733 | 0.0733 |" in markdown
    significance = table.to_dict()["runs"][1]["significance"]["MRR@10"]
    assert significance["p_value"] == pytest.approx(raw[0]) and significance["significant"] is False
    assert significance["p_holm"] == pytest.approx(2 * raw[0])
    assert holm_note(raw) == ("Holm's adjustment over these 2 tests makes 2 of the 2 significant differences "
                              "(p ≤ 0.05) not significant (the p-values shown are unadjusted).")
    assert holm_note([0.001, 0.2]).startswith("Holm's adjustment over these 2 tests changes no decision")


@pytest.fixture
def two_collections(tmp_path, monkeypatch):
    """Collections ``alpha`` and ``beta`` found by name under $PRETRIEVE_DATA (nothing downloaded)."""
    write_collection(tmp_path / "data" / "alpha")
    beta = write_collection(tmp_path / "data" / "beta")
    (beta / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"t{i}\td{i if i % 2 else 20 + i}\t1\n" for i in range(4)))        # distractors relevant for half
    monkeypatch.setenv("PRETRIEVE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv(registry.OFFLINE_ENV, "1")
    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)
    return tmp_path


def test_one_command_evaluates_bm25_and_models_on_two_collections(two_collections, tiny_bert_dir, tiny_mlm_dir):
    from pretrieve.cli import app

    out = two_collections / "eval"
    args = ["evaluate", "--model", "bm25", "--model", str(tiny_bert_dir), "--model", str(tiny_mlm_dir),
            "--names", "bm25,bert,mlm", "--data", "alpha,beta", "--depth", "20", "--measures", "nDCG@10,MRR@10",
            "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cells = [[cell.strip() for cell in line.split("│")] for line in result.stdout.splitlines() if "│" in line]
    printed = {row[0]: row[1:] for row in cells}
    assert {"alpha", "beta", "Average"} <= set(printed)
    report = json.loads((out / "results.json").read_text())
    assert report["collections"] == ["alpha", "beta"] and report["baseline"] == "bm25"
    assert [run["name"] for run in report["runs"]] == ["bm25", "bert", "mlm"]
    for run in report["runs"]:
        for measure in ("nDCG@10", "MRR@10"):
            per_collection = [run["scores"][c][measure] for c in ("alpha", "beta")]
            assert run["average"][measure] == pytest.approx(sum(per_collection) / 2, abs=1e-12)
    bm25_ndcg = report["runs"][0]["average"]["nDCG@10"]
    assert printed["Average"][0] == f"{bm25_ndcg:.4f}"                      # bm25 nDCG@10, the first column
    for collection in ("alpha", "beta"):
        table = report["per_collection"][collection]
        assert table["correction"] == "holm"
        for measure in ("nDCG@10", "MRR@10"):
            tests = [run["significance"][measure] for run in table["runs"][1:]]
            assert [t["p_holm"] for t in tests] == pytest.approx(
                multipletests([t["p_value"] for t in tests], method="holm")[1])
    markdown = (out / "results.md").read_text()
    assert markdown.splitlines()[0].startswith("| Collection | bm25 nDCG@10 | bert nDCG@10 | p |")
    assert "Holm-adjusted over the 2 runs tested against it" in markdown
    runs = sorted((out / "runs").glob("*.trec"))
    assert [p.name for p in runs] == sorted(f"{model}__{collection}.trec" for model in ("bm25", "bert", "mlm")
                                            for collection in ("alpha", "beta"))
    # run again through the Python API: the runs are current, so reused (not searched again), and the table is the same
    import pretrieve

    written = {p: p.stat().st_mtime_ns for p in runs}
    table = pretrieve.evaluate(models={"bm25": "bm25", "bert": tiny_bert_dir, "mlm": tiny_mlm_dir},
                               data=["alpha", "beta"], depth=20, measures="nDCG@10,MRR@10", out=out)
    assert {p: p.stat().st_mtime_ns for p in runs} == written
    assert table.beir.to_dict() == {key: report[key] for key in ("collections", "measures", "runs")}


def test_the_recipe_t_test_table_says_whether_holm_changes_a_decision():
    from pretrieve.recipe import results_markdown

    def row(retriever, collection, score, vs=None):
        return {"retriever": retriever, "collection": collection, "nDCG@10": score, "MRR@10": score,
                "R@100": score, **({"final": True, "vs": vs} if vs else {})}

    def test(delta, p):
        return {"mean_difference": delta, "p_value": p, "significant": p <= 0.05, "ci_low": None, "ci_high": None}

    rows = [row("bm25", "a", 0.5), row("bm25", "b", 0.4), row("zero-shot", "a", 0.5), row("zero-shot", "b", 0.4),
            row("final", "a", 0.6, {"bm25": test(0.1, 0.04), "zero-shot": test(0.1, 0.001)}),
            row("final", "b", 0.5, {"bm25": test(0.1, 0.03), "zero-shot": test(0.1, 0.002)})]
    markdown = results_markdown({"recipe": "r", "rows": rows})
    # Holm over 4 tests: 0.001·4, 0.002·3, 0.03·2 = 0.06 > 0.05, 0.04 → 0.06: two of four decisions change
    assert ("Holm's adjustment over these 4 tests makes 2 of the 4 significant differences (p ≤ 0.05) not "
            "significant (the p-values shown are unadjusted).") in markdown
