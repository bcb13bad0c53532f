"""pretrieve.evaluation and `pretrieve evaluate`: agreement with pytrec_eval, hand computations,
significance tests against scipy, report tables and the CLI."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
import typer.core
import typer.main
from scipy import stats
from typer.testing import CliRunner

from pretrieve.data.beir import save_qrels
from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import write_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.evaluation import (DEFAULT_MEASURES, EvalResult, RunEvaluator, beir_table, build_table, compare,
                                  evaluate, paired_permutation_test, paired_ttest, parse_measures, trec_eval_ranking)

RECALL_CUTOFFS = (5, 20, 50, 100, 1000)
NDCG_CUTOFFS = (10, 100)


# --------------------------------------------------------------------------- reference: pytrec_eval directly

def pytrec_eval_reference(qrels, run) -> dict[str, dict[str, float]]:
    """Per-query scores of the default measures computed by pytrec_eval itself, keyed like DEFAULT_MEASURES.

    pytrec_eval's ``recip_rank`` has no cutoff; RR@10 is derived from it exactly: the first relevant
    document is within the top 10 iff 1/rank ≥ 1/10, so RR@10 = recip_rank if recip_rank ≥ 0.1 else 0.
    (This avoids truncating the run by hand, which is ambiguous when scores tie at rank 10.)
    """
    evaluator = pytrec_eval.RelevanceEvaluator(
        qrels, {"recip_rank", "map", "recall." + ",".join(map(str, RECALL_CUTOFFS)),
                "ndcg_cut." + ",".join(map(str, NDCG_CUTOFFS))})
    scores = evaluator.evaluate(run)
    reference: dict[str, dict[str, float]] = {name: {} for name in DEFAULT_MEASURES}
    for qid, values in scores.items():
        rr = values["recip_rank"]
        reference["MRR@10"][qid] = rr if rr >= 0.1 - 1e-12 else 0.0
        for k in RECALL_CUTOFFS:
            reference[f"R@{k}"][qid] = values[f"recall_{k}"]
        for k in NDCG_CUTOFFS:
            reference[f"nDCG@{k}"][qid] = values[f"ndcg_cut_{k}"]
        reference["MAP"][qid] = values["map"]
    return reference


def assert_matches_reference(result: EvalResult, reference: dict[str, dict[str, float]]) -> None:
    for name in DEFAULT_MEASURES:
        assert set(result.per_query[name]) == set(reference[name]), name
        for qid, value in reference[name].items():
            assert result.per_query[name][qid] == pytest.approx(value, abs=1e-9), (name, qid)
        mean = sum(reference[name].values()) / len(reference[name])
        assert result.aggregate[name] == pytest.approx(mean, abs=1e-9), name


# --------------------------------------------------------------------------- synthetic data

def synthetic_qrels_and_run(seed: int = 0):
    """Graded qrels and a run full of exact ties (scores rounded to 0.1), float32-only ties, ids of
    different lengths (``d7`` vs ``d10``: string order ≠ numeric order), plus the awkward queries:
    judged but absent from the run, in the run but unjudged, judged only with grade 0, and an empty result list."""
    rng = np.random.default_rng(seed)
    doc_ids = [f"d{i}" for i in range(300)]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(40):
        qid = f"q{q}"
        judged = rng.choice(len(doc_ids), size=int(rng.integers(1, 15)), replace=False)
        qrels[qid] = {doc_ids[j]: int(rng.integers(0, 4)) for j in judged}
        retrieved = rng.choice(len(doc_ids), size=int(rng.integers(5, 150)), replace=False)
        run[qid] = {doc_ids[j]: float(np.round(rng.random(), 1)) for j in retrieved}
        for j in judged[: len(judged) // 2]:  # make relevant documents likely to be retrieved, tied with others
            run[qid][doc_ids[j]] = float(np.round(rng.random(), 1))
    qrels["q0"] = {"d1": 0, "d2": 0}                        # judged, nothing relevant
    run["q1"] = {"d5": 1.0, "d50": 1.0 + 1e-9, "d7": 1.0}   # ties in float32 only
    qrels["q1"] = {"d50": 1, "d7": 2}
    run["q2"] = {}                                          # in the run with no documents
    del run["q3"]                                           # judged, not retrieved
    run["unjudged"] = {"d1": 3.0}                           # retrieved, not judged
    return qrels, run


def test_agrees_with_pytrec_eval_on_synthetic_run_with_ties():
    qrels, run = synthetic_qrels_and_run()
    result = evaluate(qrels, run, missing="ignore")       # pytrec_eval's "answered queries only" mean
    assert_matches_reference(result, pytrec_eval_reference(qrels, run))
    assert result.missing_queries == ("q3",) and result.unjudged_queries == 1
    assert result.n_queries == len(qrels) - 1


def test_missing_queries_scored_zero_by_default():
    qrels, run = synthetic_qrels_and_run()
    reference = pytrec_eval_reference(qrels, run)
    result = evaluate(qrels, run)
    assert result.missing == "zero" and evaluate(qrels, run, missing="zero").aggregate == result.aggregate
    assert result.n_queries == len(qrels)
    for name in DEFAULT_MEASURES:
        assert result.per_query[name]["q3"] == 0.0
        assert result.aggregate[name] == pytest.approx(sum(reference[name].values()) / len(qrels), abs=1e-9)


def test_ties_are_broken_like_trec_eval():
    # trec_eval: score descending (as float32), then document id descending ("x" > "a", "d50" > "d5")
    assert trec_eval_ranking({"a": 1.0, "x": 1.0, "b": 2.0}) == ["b", "x", "a"]
    assert trec_eval_ranking({"d5": 1.0, "d50": 1.0 + 1e-9, "d7": 1.0}) == ["d7", "d50", "d5"]
    qrels = {"q": {"a": 1}}
    result = evaluate(qrels, {"q": {"a": 1.0, "x": 1.0}}, ["MRR@10", "RR"])
    # ir_measures' own MS MARCO provider would rank "a" first (RR@10 = 1); pytrec_eval ranks "x" first
    assert result.aggregate == {"MRR@10": 0.5, "RR": 0.5}


def test_hand_computed_query():
    qrels = {"q": {"d1": 2, "d3": 1, "d5": 1, "d9": 0}}
    ranking = ["d2", "d1", "d4", "d3", "d6", "d7", "d8", "d5", "d9", "d10", "d11"]
    run = {"q": {doc: float(len(ranking) - i) for i, doc in enumerate(ranking)}}
    result = evaluate(qrels, run, ["nDCG@10", "MRR@10", "R@5", "MAP", "R@1000"])
    dcg = 2 / math.log2(3) + 1 / math.log2(5) + 1 / math.log2(9)     # gains 2, 1, 1 at ranks 2, 4, 8
    ideal = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)   # gains 2, 1, 1 at ranks 1, 2, 3
    assert result.aggregate["nDCG@10"] == pytest.approx(dcg / ideal, abs=1e-12)
    assert result.aggregate["MRR@10"] == pytest.approx(1 / 2)
    assert result.aggregate["R@5"] == pytest.approx(2 / 3)            # d1, d3 of the 3 relevant (grade ≥ 1)
    assert result.aggregate["MAP"] == pytest.approx((1 / 2 + 2 / 4 + 3 / 8) / 3)
    assert result.aggregate["R@1000"] == 1.0
    # the first relevant document at rank 11 is outside MRR@10
    late_ranking = [f"n{i}" for i in range(10)] + ["d1"]
    late = {"q": {doc: float(len(late_ranking) - i) for i, doc in enumerate(late_ranking)}}
    assert evaluate(qrels, late, ["MRR@10", "RR"]).aggregate == {"MRR@10": 0.0, "RR": pytest.approx(1 / 11)}


def test_measure_names_and_errors():
    parsed = parse_measures("nDCG@10, MRR@10,Recall@100,MAP")
    assert list(parsed) == ["nDCG@10", "MRR@10", "Recall@100", "MAP"]
    assert str(parsed["MRR@10"]) == "RR@10" and str(parsed["MAP"]) == "AP"
    with pytest.raises(ConfigError, match="unknown measure 'foo@10'.*nDCG@10"):
        parse_measures("nDCG@10,foo@10")
    with pytest.raises(ConfigError, match="no measures"):
        parse_measures(" , ")
    with pytest.raises(ConfigError, match="missing"):
        evaluate({"q": {"d": 1}}, {"q": {"d": 1.0}}, missing="drop")
    with pytest.raises(InputError, match="no query of the run"):
        evaluate({"q": {"d": 1}}, {"other": {"d": 1.0}})


def test_identical_ids_dropped_only_when_asked():
    qrels = {"1": {"2": 1}}
    run = {"1": {"1": 2.0, "2": 1.0}}
    assert evaluate(qrels, run, ["MRR@10"]).aggregate["MRR@10"] == 0.5
    assert evaluate(qrels, run, ["MRR@10"], ignore_identical_ids=True).aggregate["MRR@10"] == 1.0


# --------------------------------------------------------------------------- real collection

def word_overlap_runs(root: Path, n_queries: int = 50, depth: int = 1000):
    """Two model-free runs on a BEIR collection: query-term overlap count, and idf-weighted overlap."""
    collection = BeirCollection(root)
    qrels = collection.load_qrels("test")
    queries = collection.load_queries("test")
    query_ids = list(queries)[:n_queries]
    corpus = collection.load_corpus()

    def words(text: str) -> set[str]:
        return set(re.findall(r"\w+", text.lower()))

    query_words = [words(queries[qid]) for qid in query_ids]
    vocab = {w: i for i, w in enumerate(sorted(set().union(*query_words)))}
    doc_terms = np.zeros((len(corpus), len(vocab)), dtype=np.float32)
    for row, text in enumerate(corpus.full_texts()):
        cols = [vocab[w] for w in words(text) if w in vocab]
        doc_terms[row, cols] = 1.0
    query_terms = np.zeros((len(query_ids), len(vocab)), dtype=np.float32)
    for row, ws in enumerate(query_words):
        query_terms[row, [vocab[w] for w in ws]] = 1.0
    idf = np.log((len(corpus) + 1) / (doc_terms.sum(0) + 0.5)).astype(np.float32)
    runs = []
    for scores in (query_terms @ doc_terms.T, (query_terms * idf) @ doc_terms.T):
        top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        runs.append({qid: {corpus.ids[j]: float(scores[q, j]) for j in top[q] if scores[q, j] > 0}
                     for q, qid in enumerate(query_ids)})
    return qrels, runs


@pytest.mark.slow
def test_agrees_with_pytrec_eval_on_scifact(scifact):
    qrels, (overlap, idf_overlap) = word_overlap_runs(scifact)
    evaluator = RunEvaluator(qrels, missing="ignore")     # pytrec_eval scores the answered queries only
    for run in (overlap, idf_overlap):
        result = evaluator(run)
        assert result.n_queries == 50 and len(result.missing_queries) == len(qrels) - 50
        assert_matches_reference(result, pytrec_eval_reference(qrels, run))
    # the idf-weighted run is a better ranker than raw overlap counts
    base, better = evaluator(overlap), evaluator(idf_overlap)
    assert better.aggregate["nDCG@10"] > base.aggregate["nDCG@10"] > 0.05


# --------------------------------------------------------------------------- significance

def test_ttest_matches_scipy():
    baseline = np.array([0.1, 0.5, 0.3, 0.9, 0.4, 0.0, 0.25])
    run = np.array([0.2, 0.7, 0.3, 1.0, 0.6, 0.1, 0.2])
    result = paired_ttest(baseline, run)
    expected = stats.ttest_rel(run, baseline)
    assert result.statistic == pytest.approx(expected.statistic, rel=1e-12)
    assert result.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    assert result.mean_difference == pytest.approx(np.mean(run - baseline))
    assert result.n == 7 and result.direction == 1 and result.significant == (expected.pvalue <= 0.05)
    # the 95 % interval of the mean difference, by hand: mean ± t(0.975, n − 1) · sd / √n
    diff = run - baseline
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    assert (result.ci_low, result.ci_high) == pytest.approx((diff.mean() - half, diff.mean() + half), rel=1e-9)


def test_identical_runs_are_not_significant():
    scores = np.array([0.1, 0.5, 0.3, 0.9])
    for result in (paired_ttest(scores, scores), paired_permutation_test(scores, scores)):
        assert result.p_value == 1.0 and not result.significant and result.direction == 0
    constant_gain = paired_ttest(scores, scores + 0.1)   # scipy: t = inf, p = 0
    assert constant_gain.significant and constant_gain.direction == 1
    assert math.isnan(paired_ttest(scores[:1], scores[:1] + 1).p_value)


def test_permutation_test_exact_and_seeded():
    # n = 5 → all 2**5 sign flips enumerated; only all-plus and all-minus are as extreme as the observation
    exact = paired_permutation_test(np.zeros(5), np.ones(5))
    assert exact.p_value == pytest.approx(2 / 32)
    brute = sum(abs(sum(signs)) >= 5 for signs in itertools.product((-1, 1), repeat=5)) / 32
    assert exact.p_value == pytest.approx(brute)

    rng = np.random.default_rng(1)
    baseline = rng.random(60)
    run = np.clip(baseline + rng.normal(0.05, 0.2, size=60), 0, 1)
    first = paired_permutation_test(baseline, run, n_permutations=5000, seed=7)
    again = paired_permutation_test(baseline, run, n_permutations=5000, seed=7)
    assert first == again
    assert 1 / 5001 <= first.p_value <= 1.0
    # a randomization test and a t-test agree closely on well-behaved differences
    assert first.p_value == pytest.approx(paired_ttest(baseline, run).p_value, abs=0.03)


def test_compare_pairs_queries_with_missing_as_zero():
    qrels = {"a": {"d1": 1}, "b": {"d2": 1}, "c": {"d3": 1}, "d": {"d4": 1}, "e": {"d5": 1}}
    base_run = {"a": {"d1": 1.0}, "b": {"x": 1.0, "d2": 0.5}, "c": {"d3": 1.0}}                    # d, e missing
    other_run = {"a": {"d1": 1.0}, "b": {"d2": 1.0}, "c": {"x": 1.0, "d3": 0.5}, "d": {"d4": 1.0}}  # e missing
    result = compare(evaluate(qrels, base_run, missing="ignore"), evaluate(qrels, other_run, missing="ignore"),
                     "MRR@10")
    # "d" is paired (0 for the baseline); "e", retrieved by neither, is not
    expected = stats.ttest_rel([1.0, 1.0, 0.5, 1.0], [1.0, 0.5, 1.0, 0.0])
    assert result.n == 4 and result.p_value == pytest.approx(expected.pvalue)
    assert result.mean_difference == pytest.approx((0 + 0.5 - 0.5 + 1.0) / 4)
    # scoring missing queries as zero pairs every judged query
    zero = compare(evaluate(qrels, base_run, missing="zero"), evaluate(qrels, other_run, missing="zero"), "MRR@10")
    assert zero.n == 5 and zero.p_value == pytest.approx(stats.ttest_rel([1.0, 1.0, 0.5, 1.0, 0.0],
                                                                         [1.0, 0.5, 1.0, 0.0, 0.0]).pvalue)
    base = evaluate(qrels, base_run)
    with pytest.raises(ConfigError, match="different qrels"):
        compare(base, evaluate({"a": {"d1": 1}}, {"a": {"d1": 1.0}}), "MRR@10")


# --------------------------------------------------------------------------- reports

def two_results(n: int = 30):
    """A baseline and a clearly better run (the relevant document moves from rank 3 to rank 1)."""
    qrels = {f"q{i}": {f"rel{i}": 1} for i in range(n)}
    worse = {f"q{i}": {"x": 3.0, "y": 2.0, f"rel{i}": 1.0 if i % 5 else 5.0} for i in range(n)}
    better = {f"q{i}": {f"rel{i}": 3.0, "x": 2.0} for i in range(n)}
    return qrels, worse, better


def test_results_table_markdown_and_json():
    qrels, worse, better = two_results()
    results = {"base": evaluate(qrels, worse, ["MRR@10", "R@1000"]),
               "better": evaluate(qrels, better, ["MRR@10", "R@1000"])}
    table = build_table(results)
    markdown = table.to_markdown()
    lines = markdown.splitlines()
    assert lines[0] == "| Run | MRR@10 | R@1000 |"
    base_mrr = (24 * (1 / 3) + 6 * 1.0) / 30
    assert lines[2] == f"| base | {base_mrr:.4f} | 1.0000 |"
    assert lines[3] == "| better | 1.0000†▲ | 1.0000 |"        # R@1000 equal: no mark
    assert "† significantly different from 'base'" in markdown and "p ≤ 0.05" in markdown
    data = json.loads(json.dumps(table.to_dict(per_query=True), allow_nan=False))
    better_entry = data["runs"][1]
    assert better_entry["significance"]["MRR@10"]["significant"] is True
    assert better_entry["significance"]["MRR@10"]["p_value"] < 1e-6
    assert better_entry["significance"]["R@1000"]["p_value"] == 1.0
    assert better_entry["per_query"]["MRR@10"]["q0"] == 1.0
    assert "per_query" not in table.to_dict()["runs"][0]
    # reversed order: the better run is the baseline, the worse one is marked ▼
    assert "†▼" in build_table({"better": results["better"], "base": results["base"]}).to_markdown()
    assert "†" not in build_table(results, test=None).to_markdown()


def test_beir_table_average_and_missing_collection():
    def result(value: float) -> EvalResult:
        return EvalResult(aggregate={"nDCG@10": value}, per_query={"nDCG@10": {"q": value}}, measures=["nDCG@10"])

    table = beir_table({"bm25": {"scifact": result(0.665), "nfcorpus": result(0.325)},
                        "dense": {"scifact": result(0.70), "nfcorpus": result(0.30)},
                        "partial": {"scifact": result(0.5)}})
    assert table.collections == ["scifact", "nfcorpus"]
    assert table.average("bm25", "nDCG@10") == pytest.approx(0.495)
    assert math.isnan(table.average("partial", "nDCG@10"))
    lines = table.to_markdown().splitlines()
    assert lines[0] == "| Run | scifact | nfcorpus | Avg |"
    assert lines[2] == "| bm25 | 0.6650 | **0.3250** | 0.4950 |"
    assert lines[3] == "| dense | **0.7000** | 0.3000 | **0.5000** |"
    assert lines[4] == "| partial | 0.5000 | – | – |"
    assert table.to_dict()["runs"][2]["average"] == {"nDCG@10": None}
    with pytest.raises(ConfigError, match="no score for 'MAP'"):
        beir_table({"bm25": {"scifact": result(0.6)}}, measure="MAP")


def three_runs(n: int = 30):
    """Qrels and three runs whose MRR@10 differences range from clear to none (the relevant document at rank 1–3)."""
    def rank(i: int, position: int) -> dict[str, float]:
        return {1: {f"rel{i}": 3.0, "x": 2.0}, 2: {"x": 3.0, f"rel{i}": 2.0},
                3: {"x": 3.0, "y": 2.0, f"rel{i}": 1.0}}[position]

    qrels = {f"q{i}": {f"rel{i}": 1} for i in range(n)}
    runs = {"base": {f"q{i}": rank(i, 2) for i in range(n)},
            "a": {f"q{i}": rank(i, 1 if i < 12 else 2) for i in range(n)},
            "b": {f"q{i}": rank(i, 1 if i % 3 == 0 else 3 if i % 7 == 0 else 2) for i in range(n)}}
    return qrels, runs


def test_all_pairs_tested_with_holm_over_the_pairs():
    from statsmodels.stats.multitest import multipletests   # test-only dependency, as in test_significance.py

    import pretrieve

    qrels, runs = three_runs()
    measures = ["MRR@10", "R@1"]
    results = {name: evaluate(qrels, run, measures) for name, run in runs.items()}
    table = build_table(results, pairs="all")
    pairs = [("base", "a"), ("base", "b"), ("a", "b")]
    assert list(table.pairwise) == pairs
    for m in measures:
        raw = [stats.ttest_rel([results[b].per_query[m][q] for q in sorted(qrels)],
                               [results[a].per_query[m][q] for q in sorted(qrels)]).pvalue for a, b in pairs]
        # Holm by hand: sort ascending, multiply the i-th smallest by (3 − i), running maximum, capped at 1
        order = np.argsort(raw)
        by_hand, running = [0.0] * 3, 0.0
        for i, j in enumerate(order):
            running = max(running, min(1.0, (3 - i) * raw[j]))
            by_hand[j] = running
        assert by_hand == pytest.approx(multipletests(raw, method="holm")[1])
        for (a, b), p, p_holm in zip(pairs, raw, by_hand):
            test = table.pairwise[(a, b)][m]
            assert test.p_value == pytest.approx(p, rel=1e-12) and test.p_holm == pytest.approx(p_holm, rel=1e-12)
            assert test.mean_difference == pytest.approx(results[b].aggregate[m] - results[a].aggregate[m])
        # the marks against the first run are decided on the all-pairs family
        for run in ("a", "b"):
            assert table.p_value(run, m) == pytest.approx(by_hand[pairs.index(("base", run))])
    assert table.pairwise[("a", "b")]["MRR@10"].p_value > 0.05 and table.mark("a", "MRR@10") == "†▲"
    markdown = table.to_markdown()
    assert "Holm-adjusted over all 3 pairs of runs on each measure" in markdown
    assert "Pairwise tests:" in markdown and "| Measure | A | B | Δ (B − A) | p | p (Holm) |" in markdown
    a_b = table.pairwise[("a", "b")]["MRR@10"]
    assert f"| MRR@10 | a | b | -0.0500 | {a_b.p_value:.3g} | {a_b.p_holm:.3g} |" in markdown
    assert "| MRR@10 | base | a | +0.2000† |" in markdown
    assert "p (Holm) vs base" not in markdown                     # the pairwise section replaces it
    data = json.loads(json.dumps(table.to_dict(), allow_nan=False))
    assert data["pairs"] == "all" and [(e["a"], e["b"]) for e in data["pairwise"]] == pairs
    assert data["pairwise"][2]["significance"]["R@1"]["p_holm"] == pytest.approx(
        table.pairwise[("a", "b")]["R@1"].p_holm)
    # without a correction: raw p-values decide, no Holm column
    uncorrected = build_table(results, pairs="all", correction=None)
    assert "p (Holm)" not in uncorrected.to_markdown() and "Holm" not in uncorrected.legend()
    # the default is unchanged: no pairwise tests, no new keys
    default = build_table(results)
    assert not default.pairwise and "pairwise" not in default.to_dict() and "Pairwise" not in default.to_markdown()
    with pytest.raises(ConfigError, match="unknown pairs"):
        build_table(results, pairs="some")
    with pytest.raises(ConfigError, match="choose a significance test"):
        build_table(results, pairs="all", test=None)
    # the Python API passes pairs= through (baseline= reorders first)
    api = pretrieve.evaluate(runs, qrels=qrels, measures=measures, pairs="all", baseline="b")
    assert list(api.pairwise) == [("b", "base"), ("b", "a"), ("base", "a")]
    assert api.pairwise[("b", "a")]["R@1"].p_holm == pytest.approx(table.pairwise[("a", "b")]["R@1"].p_holm)


def test_collections_table_all_pairs_per_collection():
    from pretrieve.evaluation import collections_table   # only this test needs it

    qrels, runs = three_runs()
    half = {f"q{i}": qrels[f"q{i}"] for i in range(0, 30, 2)}
    results = {name: {"full": evaluate(qrels, run, ["MRR@10"]), "half": evaluate(half, run, ["MRR@10"])}
               for name, run in runs.items()}
    table = collections_table(results, "MRR@10", pairs="all")
    sections = table.pair_tables()
    assert list(sections) == ["full", "half"] and len(sections["full"][1]) == 3
    markdown = table.to_markdown()
    assert "Pairwise tests on full:" in markdown and "Pairwise tests on half:" in markdown
    assert "Holm-adjusted over all 3 pairs of runs on each collection and measure" in markdown
    assert table.to_dict()["per_collection"]["half"]["pairs"] == "all"
    assert "Pairwise" not in collections_table(results, "MRR@10").to_markdown()


# --------------------------------------------------------------------------- CLI

def cli_args(*args: str) -> list[str]:
    """Arguments for ``pretrieve.cli.app``: typer collapses an app with a single command into that command,
    so the ``evaluate`` prefix is needed only once other commands are registered."""
    from pretrieve.cli import app

    is_group = isinstance(typer.main.get_command(app), typer.core.TyperGroup)
    return (["evaluate"] if is_group else []) + list(args)


@pytest.fixture()
def run_files(tmp_path):
    qrels, worse, better = two_results()
    save_qrels(qrels, tmp_path / "qrels.tsv")
    write_run(worse, tmp_path / "bm25.trec")
    write_run(better, tmp_path / "dense.trec")
    return tmp_path


def test_cli_two_runs_table_with_marks(run_files):
    from pretrieve.cli import app

    out = run_files / "out"
    result = CliRunner().invoke(app, cli_args(
        "--qrels", str(run_files / "qrels.tsv"), str(run_files / "bm25.trec"), str(run_files / "dense.trec"),
        "--measures", "MRR@10,R@1000,nDCG@10", "--json", str(out / "m.json"), "--md", str(out / "m.md"),
        "--per-query"))
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()[:1] in (["bm25"], ["dense"])}
    assert "†" not in rows["bm25"]
    assert "1.0000†▲" in rows["dense"] and rows["dense"].count("†▲") == 2   # MRR@10 and nDCG@10, not R@1000
    assert "significantly different from 'bm25'" in result.stdout
    report = json.loads((out / "m.json").read_text())
    assert [r["name"] for r in report["runs"]] == ["bm25", "dense"]
    assert report["runs"][1]["significance"]["MRR@10"]["significant"] is True
    assert report["runs"][0]["per_query"]["R@1000"]["q1"] == 1.0
    assert report["qrels"].endswith("qrels.tsv") and "versions" in report["provenance"]
    assert "| dense | 1.0000†▲ | 1.0000 | 1.0000†▲ |" in (out / "m.md").read_text()


def test_cli_pairs_all_prints_the_pairwise_section(tmp_path):
    from pretrieve.cli import app

    qrels, runs = three_runs()
    save_qrels(qrels, tmp_path / "qrels.tsv")
    for name, run in runs.items():
        write_run(run, tmp_path / f"{name}.trec")
    files = [str(tmp_path / f"{name}.trec") for name in runs]
    result = CliRunner().invoke(app, cli_args("--qrels", str(tmp_path / "qrels.tsv"), *files, "--measures", "MRR@10",
                                              "--pairs", "all", "--md", str(tmp_path / "t.md")),
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Pairwise tests:" in result.stdout and "Δ (B − A)" in result.stdout and "p (Holm)" in result.stdout
    rows = [[cell.strip() for cell in line.split("│")] for line in result.stdout.splitlines()
            if line.split()[:1] == ["MRR@10"]]
    assert [row[1:3] for row in rows] == [["base", "a"], ["base", "b"], ["a", "b"]]
    assert "-0.0500" in rows[2] and "Holm-adjusted over all 3 pairs" in result.stdout
    assert "| MRR@10 | a | b | -0.0500 |" in (tmp_path / "t.md").read_text()
    default = CliRunner().invoke(app, cli_args("--qrels", str(tmp_path / "qrels.tsv"), *files, "--measures", "MRR@10"))
    assert default.exit_code == 0 and "Pairwise" not in default.stdout and "p (Holm) vs base" in default.stdout


def test_cli_beir_collection_names_and_permutation(run_files, tmp_path):
    from pretrieve.cli import app

    collection = tmp_path / "collection"
    (collection / "qrels").mkdir(parents=True)
    (collection / "qrels" / "test.tsv").write_text((run_files / "qrels.tsv").read_text())
    result = CliRunner().invoke(app, cli_args(
        "--data", str(collection), "--split", "test", "--names", "first,second", "--test", "permutation",
        "--measures", "MRR@10", str(run_files / "bm25.trec"), str(run_files / "dense.trec")))
    assert result.exit_code == 0, result.output
    assert "second" in result.stdout and "1.0000†▲" in result.stdout and "randomization" in result.stdout


def test_cli_help_shows_defaults():
    from pretrieve.cli import app

    result = CliRunner().invoke(app, cli_args("--help"), env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = re.sub(r"\s+", " ", result.stdout)
    for default in ("[default: ttest]", "[default: 0.05]", "[default: zero]", "[default: test]", "MRR@10,R@5"):
        assert default in text


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """Run the console entry point ``pretrieve.cli.main`` in-process; return (exit code, stderr)."""
    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *cli_args(*args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err.replace("\n", "")  # undo rich's line wrapping


def test_cli_malformed_run_is_a_located_error(run_files, monkeypatch, capsys):
    bad = run_files / "bad.trec"
    lines = (run_files / "dense.trec").read_text().splitlines()
    parts = lines[2].split()
    lines[2] = " ".join(parts[:3] + ["third"] + parts[4:])   # rank column not an integer
    bad.write_text("\n".join(lines) + "\n")
    code, err = run_main(monkeypatch, capsys, "--qrels", str(run_files / "qrels.tsv"),
                         str(run_files / "bm25.trec"), str(bad))
    assert code == 2
    assert f"{bad}:3" in err and "rank" in err and "Traceback" not in err


def test_cli_bad_arguments_exit_2(run_files, monkeypatch, capsys):
    run = str(run_files / "bm25.trec")
    code, err = run_main(monkeypatch, capsys, "--qrels", str(run_files / "qrels.tsv"), run, "--measures", "nDCG@x")
    assert code == 2 and "unknown measure 'nDCG@x'" in err and "Traceback" not in err
    code, err = run_main(monkeypatch, capsys, run)
    assert code == 2 and "--qrels" in err
    code, err = run_main(monkeypatch, capsys, "--qrels", str(run_files / "qrels.tsv"), run, run)
    assert code == 2 and "--names" in err
