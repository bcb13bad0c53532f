"""Rows compared in one table share one query set (issue 22, item 4): when BM25 answers nothing for a judged query
(a query whose words are not in the corpus), the recipe's BM25 row, `pretrieve evaluate` on its run file, the
paired t-test of the final row against it and the closing paragraph of results.md all use one mean — pytrec_eval's
with that query scored 0 — never the mean over the answered queries only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytrec_eval
import yaml
from typer.testing import CliRunner

from pretrieve.cli import app
from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import read_run
from pretrieve.recipe import run_recipe

from test_finetune import write_collection

UNANSWERED = "t3"


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    """The tiny collection, with test query t3's words in no document: BM25 returns nothing for it."""
    root = write_collection(tmp_path_factory.mktemp("query-set") / "tiny")
    lines = [json.loads(line) for line in (root / "queries.jsonl").read_text().splitlines()]
    for query in lines:
        if query["_id"] == UNANSWERED:
            query["text"] = "xylophone zeppelin"
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in lines))
    return root


def test_every_number_of_a_recipe_uses_all_judged_queries(tiny_mlm_dir, collection, tmp_path):
    out = tmp_path / "out"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "out": str(out), "model": str(tiny_mlm_dir), "data": str(collection),
        "stages": [{"evaluate": {"split": "test", "depth": 20, "bm25": True, "zero_shot": True,
                                 "final": "zero-shot", "compare": ["bm25"]}}]}))
    results = run_recipe(recipe, show_progress=False)
    rows = {row["retriever"]: row for row in results["rows"]}
    qrels = BeirCollection(collection).load_qrels("test")
    bm25_run = read_run(out / "runs" / "bm25__tiny.trec")
    assert UNANSWERED in qrels and UNANSWERED not in bm25_run and len(bm25_run) == len(qrels) - 1

    def pytrec_mean(run) -> float:   # nDCG@10, an unanswered judged query scored 0
        scores = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
        return sum(scores.get(q, {}).get("ndcg_cut_10", 0.0) for q in qrels) / len(qrels)

    expected = {"bm25": pytrec_mean(bm25_run), "zero-shot": pytrec_mean(read_run(out / "runs" / "zero-shot__tiny.trec"))}
    for name in expected:
        assert rows[name]["nDCG@10"] == pytest.approx(expected[name], abs=1e-4)   # the recipe's table
    answered_only = pytrec_mean(bm25_run) * len(qrels) / (len(qrels) - 1)
    assert rows["bm25"]["nDCG@10"] != pytest.approx(answered_only, abs=1e-4)
    # `pretrieve evaluate` on the same run file
    evaluated = tmp_path / "eval.json"
    result = CliRunner().invoke(app, ["evaluate", str(out / "runs" / "bm25__tiny.trec"), "--data", str(collection),
                                      "--split", "test", "--measures", "nDCG@10", "--json", str(evaluated)])
    assert result.exit_code == 0, result.output
    assert f"{expected['bm25']:.4f}" in result.output
    # the paired t-test pairs every judged query, and its Δ is the difference of the table's means
    test = rows["zero-shot"]["vs"]["bm25"]
    delta = expected["zero-shot"] - expected["bm25"]
    assert test["n"] == len(qrels) and test["mean_difference"] == pytest.approx(delta, abs=1e-9)
    # results.md: the t-test table and the closing paragraph print the same Δ
    markdown = (out / "results.md").read_text()
    assert f"| tiny | {delta:+.4f}" in markdown and f"{delta:+.4f} over `bm25`" in markdown
