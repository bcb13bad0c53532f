"""The evaluate stage's ``ignore_identical_ids`` (BEIR's, for ArguAna and Quora): a query's own document (the same
id) is dropped from its ranking before scoring, in the collections it names and nowhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrieve.data import read_run
from pretrieve.errors import ConfigError
from pretrieve.evaluation import evaluate
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import validate_recipe
from pretrieve.recipe.stages.evaluate import stage_evaluate

ARGUMENTS = {"a1": "school uniforms reduce bullying and cost for poor families",
             "a2": "uniforms limit the free expression of pupils at school",
             "a3": "nuclear power is a clean source of energy for the grid",
             "a4": "nuclear waste stays dangerous for thousands of years",
             "a5": "bullying happens with or without uniforms at school",
             "a6": "energy from the wind is cheaper than nuclear power"}
COUNTER = {"a1": "a5", "a2": "a1", "a3": "a4", "a4": "a6"}   # each query (an argument) → its counter-argument


def write_arguments(root: Path) -> Path:
    """An ArguAna-like collection: every query is an argument of the corpus, under the same id."""
    root.mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n"
                                               for i, t in ARGUMENTS.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": ARGUMENTS[q]}) + "\n" for q in COUNTER))
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"{q}\t{d}\t1\n" for q, d in COUNTER.items()))
    return root


def rows(tmp_path: Path, ignored: list[str]) -> dict[str, dict]:
    data = {"argu": write_arguments(tmp_path / "argu"), "copy": write_arguments(tmp_path / "copy")}
    state = RunState(recipe={"data": "argu"}, out=tmp_path / "out", data=data["argu"], base_model="m",
                     collections=data)
    options = {"collections": ["argu", "copy"], "bm25": True, "measures": ["MRR@10", "R@1"],
               "ignore_identical_ids": ignored}
    return {row["collection"]: row for row in stage_evaluate(state, options, "evaluate", False)}


def test_ignore_identical_ids_drops_exactly_each_query_own_document_in_the_named_collections(tmp_path):
    scored = rows(tmp_path, ["argu"])
    run = read_run(scored["argu"]["run"])
    assert all(run[q] and next(iter(sorted(run[q].items(), key=lambda kv: -kv[1])))[0] == q for q in COUNTER)
    without_self = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
    assert sum(map(len, run.values())) - sum(map(len, without_self.values())) == len(COUNTER)   # one per query
    qrels = {q: {d: 1} for q, d in COUNTER.items()}
    for measure in ("MRR@10", "R@1"):
        assert scored["argu"][measure] == round(evaluate(qrels, without_self, [measure]).aggregate[measure], 4)
        assert scored["copy"][measure] == round(evaluate(qrels, run, [measure]).aggregate[measure], 4)   # not named
    assert scored["argu"]["R@1"] > scored["copy"]["R@1"] == 0.0     # its own argument no longer takes rank 1


def test_ignore_identical_ids_names_collections_the_stage_evaluates():
    recipe = {"out": "o", "model": "m", "data": "argu",
              "stages": [{"evaluate": {"zero_shot": True, "collections": ["argu"], "ignore_identical_ids": ["quora"]}}]}
    with pytest.raises(ConfigError, match=r"ignore_identical_ids\[0\]: 'quora' is not a collection this stage"):
        validate_recipe(recipe)
    recipe["stages"][0]["evaluate"]["ignore_identical_ids"] = ["argu"]
    validate_recipe(recipe)


# A hand-made run: each query's own id ranks first (q1) or second (q2); the relevant documents are d1 and d4.
HAND_RUN = {"q1": {"q1": 3.0, "d1": 2.0, "d2": 1.0}, "q2": {"d3": 3.0, "q2": 2.0, "d4": 1.0}}
HAND_QRELS = {"q1": {"d1": 1}, "q2": {"d4": 1}}
# Computed by hand. As scored: d1 at rank 2 (RR 1/2, nDCG 1/log2 3), d4 at rank 3 (RR 1/3, nDCG 1/log2 4 = 1/2).
# Without each query's own id (BEIR): d1 at rank 1 (RR 1, nDCG 1), d4 at rank 2 (RR 1/2, nDCG 1/log2 3).
LOG2_3 = 1.584962500721156
KEPT = {"MRR@10": (1 / 2 + 1 / 3) / 2, "nDCG@10": (1 / LOG2_3 + 1 / 2) / 2}
DROPPED = {"MRR@10": (1 + 1 / 2) / 2, "nDCG@10": (1 + 1 / LOG2_3) / 2}


def test_dropping_identical_ids_matches_a_hand_computation():
    for ignore, expected in ((False, KEPT), (True, DROPPED)):
        got = evaluate(HAND_QRELS, HAND_RUN, list(expected), ignore_identical_ids=ignore).aggregate
        assert got == pytest.approx(expected, abs=1e-9)


def write_hand_collection(root: Path) -> Path:
    root.mkdir(parents=True)
    docs = ["q1", "q2", "d1", "d2", "d3", "d4"]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": f"text {d}"}) + "\n"
                                               for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"text {q}"}) + "\n" for q in HAND_QRELS))
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{g}\n" for q, docs_ in HAND_QRELS.items() for d, g in docs_.items()))
    return root


@pytest.mark.parametrize("ignored, dropped", [(True, {"one", "two"}), (["two"], {"two"}), (False, set())])
def test_ignore_identical_ids_true_scores_every_collection_of_the_stage_as_beir(tmp_path, monkeypatch, ignored,
                                                                                dropped):
    """``ignore_identical_ids: true`` is BEIR's default for every dataset; a list names collections; false: none."""
    from pretrieve.data.trec import write_run
    from pretrieve.recipe.stages import evaluate as evaluate_stage

    def hand_run(state, collection, split, depth):   # the stage scores this run instead of searching BM25
        path = state.run_path("bm25", collection.root, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_run(HAND_RUN, path)
        return path

    monkeypatch.setattr(evaluate_stage, "bm25_run", hand_run)
    data = {name: write_hand_collection(tmp_path / name) for name in ("one", "two")}
    recipe = {"out": "o", "model": "m", "data": "one",
              "stages": [{"evaluate": {"zero_shot": True, "collections": ["one", "two"],
                                       "ignore_identical_ids": ignored}}]}
    validate_recipe(recipe)   # true/false are accepted besides a list of names
    state = RunState(recipe={"data": "one"}, out=tmp_path / "out", data=data["one"], base_model="m", collections=data)
    options = {"collections": ["one", "two"], "bm25": True, "measures": ["MRR@10", "nDCG@10"],
               "ignore_identical_ids": ignored}
    scored = {row["collection"]: row for row in stage_evaluate(state, options, "evaluate", False)}
    for name in ("one", "two"):
        expected = DROPPED if name in dropped else KEPT
        assert {m: scored[name][m] for m in expected} == {m: round(v, 4) for m, v in expected.items()}
