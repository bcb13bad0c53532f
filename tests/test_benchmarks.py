"""The papers' benchmarks by name: ``pretrieve data list`` names them (CQADupStack, TREC DL 2020 as a split,
DPR's NQ/TriviaQA), and CQADupStack is evaluated by name as one row, the mean of its 12 forums' scores (BEIR's
number), checked against each forum evaluated alone on small fake forums."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pretrieve.api import evaluate
from pretrieve.cli import app
from pretrieve.data import registry
from pretrieve.errors import ConfigError
from pretrieve.evaluation.metrics import EvalResult, mean_of_parts


def _forum(root: Path, index: int) -> None:
    """Forum ``index``: 2 + index % 3 queries; the first query's relevant document shares its words, the others'
    relevant documents share none, so BM25's scores differ between forums and between query counts."""
    (root / "qrels").mkdir(parents=True)
    n = 2 + index % 3
    docs = [{"_id": f"d{i}", "title": "", "text": f"topic{i} words{i} forum{index}"} for i in range(n)]
    docs += [{"_id": "x", "title": "", "text": " ".join(f"topic{i}" for i in range(1, n))}]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"topic{i} words{i}"}) + "\n"
                                                for i in range(n)))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\t{'d0' if i == 0 else 'zzz'}\t1\n" for i in range(n)))


@pytest.fixture
def cqadupstack(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)
    monkeypatch.setenv(registry.DATA_ENV, str(tmp_path / "data"))
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    for index, forum in enumerate(registry.CQADUPSTACK_FORUMS):
        _forum(tmp_path / "data" / "cqadupstack" / forum, index)
    return tmp_path / "data" / "cqadupstack"


def test_cqadupstack_is_one_row_the_mean_of_its_12_forums(cqadupstack, tmp_path):
    table = evaluate(models=["bm25"], data="cqadupstack", measures=["nDCG@10", "MRR@10"], depth=10,
                     show_progress=False, test=None)
    alone = [evaluate(models=["bm25"], data=str(cqadupstack / forum), measures=["nDCG@10", "MRR@10"], depth=10,
                      show_progress=False, test=None) for forum in registry.CQADUPSTACK_FORUMS]
    for measure in ("nDCG@10", "MRR@10"):
        forums = [t.tables[forum].results["bm25"].aggregate[measure]
                  for t, forum in zip(alone, registry.CQADUPSTACK_FORUMS)]
        assert len(set(forums)) > 1   # the forums differ: the mean of means is not the mean over all queries
        assert table.tables["cqadupstack"].results["bm25"].aggregate[measure] == pytest.approx(np.mean(forums))
    assert table.beir.collections == ["cqadupstack"]


def test_mean_of_parts_by_hand():
    def result(values):
        return EvalResult({"m": float(np.mean(values))}, {"m": {f"q{i}": v for i, v in enumerate(values)}}, ["m"],
                          judged_queries=tuple(f"q{i}" for i in range(len(values))))

    merged = mean_of_parts({"a": result([1.0, 0.0, 0.0, 0.0]), "b": result([1.0])})
    assert merged.aggregate == {"m": 0.625}   # (0.25 + 1) / 2, not 2 / 5
    assert merged.per_query["m"] == {"a/q0": 1.0, "a/q1": 0.0, "a/q2": 0.0, "a/q3": 0.0, "b/q0": 1.0}
    with pytest.raises(ConfigError):
        mean_of_parts({})


def test_data_list_names_the_papers_benchmarks(tmp_path, monkeypatch):
    from pretrieve.cli import data as data_cli

    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)
    monkeypatch.delenv(registry.DATA_ENV, raising=False)
    monkeypatch.setattr(data_cli.out, "width", 400)   # the console was made at import, whatever COLUMNS says now
    result = CliRunner().invoke(app, ["data", "list", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert "dl19,dl20" in rows["msmarco-titled"] and "train,dev,dl19,dl20" in rows["msmarco-passage"]
    assert "4e41456d7df8ee7760a7f866133bda78" in rows["cqadupstack"] and "12" in rows["cqadupstack"]
    for name in ("dpr-nq", "dpr-trivia", "dpr-curatedtrec", "dpr-wiki", "msmarco-bm25-negatives"):
        assert name in rows
    assert "answer accuracy" in rows["dpr-nq"]


@pytest.mark.parametrize("encoding, message", [
    ({"title_joint": "sep"}, "zero_shot_encoding.title_joint: unknown key"),
    ({"title_join": "[SEP]"}, "zero_shot_encoding.title_join: 'space' or 'sep'"),
    ({"passage_max_len": 0}, "zero_shot_encoding.passage_max_len: a positive number of tokens"),
])
def test_a_released_retrievers_encoding_is_checked(encoding, message):
    from pretrieve.recipe.stages.evaluate import check_evaluate

    with pytest.raises(ConfigError, match=message):
        check_evaluate({"zero_shot": True, "zero_shot_encoding": encoding}, "stages[0].evaluate")
    with pytest.raises(ConfigError, match="set zero_shot: true"):
        check_evaluate({"zero_shot_encoding": {"title_join": "sep"}}, "stages[0].evaluate")


def test_the_released_recipe_names_its_source_and_tolerance():
    from pretrieve.recipe.schema import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[1] / "configs" / "released-cotmae.yaml")
    (expected,) = recipe["expected"]
    assert recipe["model"] == "caskcsg/cotmae_base_msmarco_retriever" and expected["row"] == "zero-shot"
    assert expected["values"] == {"MRR@10": 0.391, "R@1000": 0.988} and expected["tolerance"] == 0.005
    assert "0.391029" in expected["table"] and "0.394431" in expected["table"]   # both README rows, within 0.005
    assert abs(0.394431 - 0.391) <= expected["tolerance"] and abs(0.986676 - 0.988) <= expected["tolerance"]


def test_runs_on_the_benchmark_as_a_whole_are_refused_with_the_way_to_do_it(cqadupstack, tmp_path):
    run = tmp_path / "x.trec"
    run.write_text("q0 Q0 d0 1 1.0 r\n")
    with pytest.raises(ConfigError, match=r"cqadupstack is a benchmark .*evaluate models on it .*cqadupstack/android"):
        evaluate(str(run), data="cqadupstack")
