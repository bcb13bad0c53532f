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
