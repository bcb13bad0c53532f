"""Results tables as data: ``to_pandas()`` holds the very means and per-query scores, and a table shows itself in a
console or a notebook as its means (a short repr, an HTML table), not as its fields."""

from __future__ import annotations

import math

import pytest

from pretrieve.evaluation.metrics import evaluate
from pretrieve.evaluation.report import build_table, collections_table

QRELS = {f"q{i}": {f"d{i}": 1} for i in range(30)}


def run_ranking(hit_every: int) -> dict:
    """A run that ranks the relevant document first for every ``hit_every``-th query, third otherwise."""
    return {q: ({f"d{i}": 3.0, "x": 2.0, "y": 1.0} if i % hit_every == 0 else {"x": 3.0, "y": 2.0, f"d{i}": 1.0})
            for i, q in enumerate(QRELS)}


@pytest.fixture(scope="module")
def results():
    return {name: evaluate(QRELS, run_ranking(every), ["nDCG@10", "RR@10"])
            for name, every in (("bm25", 3), ("dense", 2), ("fused", 1))}


def test_to_pandas_holds_the_means_and_the_per_query_scores(results):
    table = build_table(results)
    frame = table.to_pandas()
    assert list(frame.index) == ["bm25", "dense", "fused"] and list(frame.columns) == ["nDCG@10", "RR@10"]
    # hand-computed: RR@10 = 1 for a hit at rank 1, 1/3 at rank 3; bm25 hits 10 of 30 queries
    assert frame.loc["bm25", "RR@10"] == pytest.approx((10 * 1 + 20 / 3) / 30)
    assert frame.loc["fused", "nDCG@10"] == pytest.approx(1.0)
    assert frame.loc["dense", "nDCG@10"] == pytest.approx((15 + 15 / math.log2(4)) / 30)
    long = table.to_pandas(per_query=True)
    assert len(long) == 90 and list(long.columns) == ["run", "query", "nDCG@10", "RR@10"]
    assert long.groupby("run", sort=False)["RR@10"].mean().to_dict() == pytest.approx(frame["RR@10"].to_dict())


def test_a_table_shows_its_means_not_its_fields(results):
    table = build_table(results)
    text = repr(table)
    assert len(text) < 1000 and "per_query" not in text
    assert any(line.startswith("| fused") for line in text.splitlines())
    assert table.cell("dense", "nDCG@10") in text and "Means over 30 queries." in text
    html = table._repr_html_()
    assert html.startswith("<table>") and html.count("<tr>") == 4 and table.cell("fused", "RR@10") in html


def test_a_table_over_collections_to_pandas(results):
    other = {name: evaluate(QRELS, run_ranking(every), ["nDCG@10"]) for name, every in
             (("bm25", 1), ("dense", 3), ("fused", 2))}
    table = collections_table({run: {"a": results[run], "b": other[run]} for run in results}, "nDCG@10")
    frame = table.to_pandas()
    assert list(frame.columns) == [("a", "nDCG@10"), ("b", "nDCG@10"), ("Average", "nDCG@10")]
    for run in results:
        assert frame.loc[run, ("Average", "nDCG@10")] == pytest.approx(
            (results[run].aggregate["nDCG@10"] + other[run].aggregate["nDCG@10"]) / 2)
    long = table.to_pandas(per_query=True)
    assert len(long) == 2 * 3 * 30 and list(long.columns[:3]) == ["collection", "run", "query"]
    assert len(repr(table)) < 1500 and "<table>" in table._repr_html_()
    assert len(repr(table.beir)) < 1000
