"""Answer accuracy (``Acc@k``, DPR's top-k accuracy) against hand-computed values: DPR's SimpleTokenizer and
uncased token-sequence matching, regex answers (CuratedTREC), the mean over every question, and the same numbers
through ``pretrieve evaluate`` and the Python API on a small collection judged by answers only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pretrieve.api import evaluate
from pretrieve.cli import app
from pretrieve.data.beir import Answers, load_answers
from pretrieve.data.collection import BeirCollection
from pretrieve.errors import ConfigError, InputError
from pretrieve.evaluation.answers import AnswerEvaluator, has_answer, split_evaluator, tokenize


def test_tokens_are_dprs_simple_tokenizer_uncased():
    assert tokenize('Aaron ( or ; "Ahärôn") is U.S.-born') == [
        "aaron", "(", "or", ";", '"', "ahärôn", '"', ")", "is", "u", ".", "s", ".", "-", "born"]
    assert tokenize("3,000 km²") == ["3", ",", "000", "km²"]   # ² is a number (\p{N})


@pytest.mark.parametrize("answer,text,expected", [
    ("Paris", "The Eiffel Tower is in Paris, France.", True),
    ("paris, FRANCE", "The Eiffel Tower is in Paris, France.", True),     # uncased, punctuation a token
    ("Par", "The Eiffel Tower is in Paris, France.", False),              # whole tokens only
    ("Tower in", "The Eiffel Tower is in Paris, France.", False),         # a contiguous sequence
    ("Ahärôn", 'Aaron ( or ; "Aha\u0308ro\u0302n") is a prophet', True),  # NFD on both sides
    ("U.S.", "born in the U.S. in 1950", True),
    ("", "anything", False),
])
def test_string_answers_match_as_dprs_has_answer(answer, text, expected):
    assert has_answer(Answers((answer,)), text) is expected


def test_regex_answers_as_curatedtrec():
    assert has_answer(Answers((r"Paris|Lyon",), "regex"), "the capital is PARIS")   # case ignored
    assert has_answer(Answers((r"19[56]0s?",), "regex"), "in the 1960s")
    assert not has_answer(Answers((r"[unclosed",), "regex"), "[unclosed")            # invalid: matches nothing
    assert not has_answer(Answers((r"^London$",), "regex"), "London Bridge")


TEXTS = {"d1": "The Eiffel Tower is in Paris.", "d2": "Lyon is a city.", "d3": "Aaron is a prophet.",
         "d4": "Nothing here.", "d5": "Bordeaux wine."}
ANSWERS = {"q1": Answers(("Paris",)), "q2": Answers(("prophet", "priest")), "q3": Answers(("Bordeaux",)),
           "q4": Answers(("Mars",))}
# q1: hit at rank 2; q2: hit at rank 1; q3: hit at rank 2 (d5 ranks above d2 on their tie: trec_eval's order, id
# descending); q4: never; q5 (not a question) ignored. Acc@1 = 1/4, Acc@2 = 3/4, Acc@3 = 3/4.
RUN = {"q1": {"d4": 3.0, "d1": 2.0, "d2": 1.0}, "q2": {"d3": 1.0, "d1": 0.5},
       "q3": {"d4": 9.0, "d2": 5.0, "d5": 5.0}, "q4": {"d1": 1.0}, "q5": {"d1": 1.0}}
# the same run with d2 above d5: q3's hit moves to rank 3
LATER = {**RUN, "q3": {"d4": 9.0, "d2": 5.0, "d5": 4.0}}


def test_accuracy_at_k_by_hand():
    result = AnswerEvaluator(ANSWERS, ["Acc@1", "Acc@2", "Acc@3"], texts=TEXTS)(RUN)
    assert result.aggregate == {"Acc@1": 0.25, "Acc@2": 0.75, "Acc@3": 0.75}
    assert result.per_query["Acc@2"] == {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0}
    later = AnswerEvaluator(ANSWERS, ["Acc@1", "Acc@2", "Acc@3"], texts=TEXTS)(LATER)
    assert later.aggregate == {"Acc@1": 0.25, "Acc@2": 0.5, "Acc@3": 0.75}
    assert result.unjudged_queries == 1
    partial = AnswerEvaluator(ANSWERS, ["Acc@20"], texts=TEXTS)({"q2": RUN["q2"]})   # absent questions score 0
    assert partial.aggregate == {"Acc@20": 0.25} and partial.missing_queries == ("q1", "q3", "q4")


def test_bad_names_and_unknown_passages():
    with pytest.raises(ConfigError, match="unknown answer measure 'Acc@0'"):
        AnswerEvaluator(ANSWERS, ["Acc@0"], texts=TEXTS)
    with pytest.raises(InputError, match="1 retrieved passages are not in the corpus \\(first: 'dX'\\)"):
        AnswerEvaluator(ANSWERS, ["Acc@1"], texts=TEXTS)({"q1": {"dX": 1.0}})


def _qa_collection(root: Path) -> Path:
    """A collection judged by answers only (dev) and by qrels (test), as the registry writes DPR's sets."""
    (root / "answers").mkdir(parents=True)
    (root / "qrels").mkdir()
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "Paris" if d == "d4" else "",
                                                           "text": t}) + "\n" for d, t in TEXTS.items()))
    questions = {"q1": "where is the eiffel tower", "q2": "who was aaron", "q3": "which wine", "q4": "is lyon a city"}
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in questions.items()))
    (root / "answers" / "dev.jsonl").write_text("".join(json.dumps({"_id": q, "answers": list(a.answers)}) + "\n"
                                                        for q, a in ANSWERS.items()))
    (root / "answers" / "test.jsonl").write_text(json.dumps({"_id": "q1", "answers": ["paris"]}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return root


def _trec(run, path: Path) -> Path:
    path.write_text("".join(f"{q} Q0 {d} {rank} {s} r\n" for q, docs in run.items()
                            for rank, (d, s) in enumerate(docs.items(), 1)))
    return path


def test_a_collection_judged_by_answers(tmp_path):
    root = _qa_collection(tmp_path / "qa")
    collection = BeirCollection(root)
    assert collection.splits() == ["dev", "test"] and list(collection.load_queries("dev")) == list(ANSWERS)
    assert load_answers(collection.answers_path("dev")) == ANSWERS
    result = split_evaluator(collection, "dev", "Acc@1,Acc@3")(RUN)   # the title "Paris" of d4 is not matched
    assert result.aggregate == {"Acc@1": 0.25, "Acc@3": 0.75}
    both = split_evaluator(collection, "test", ["MRR@10", "Acc@1"])(RUN)   # qrels measures beside Acc@k
    assert both.aggregate == {"MRR@10": 0.5, "Acc@1": 0.0}
    with pytest.raises(ConfigError, match="judged by answer strings only.*use Acc@k"):
        split_evaluator(collection, "dev", "nDCG@10")


def test_evaluate_prints_answer_accuracy_in_the_cli_and_the_api(tmp_path):
    root = _qa_collection(tmp_path / "qa")
    run = _trec(LATER, tmp_path / "dense.trec")
    result = CliRunner().invoke(app, ["evaluate", str(run), "--data", str(root), "--split", "dev",
                                      "--measures", "Acc@1,Acc@2,Acc@3"], env={**os.environ, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.strip().startswith("dense"))
    assert [cell for cell in row.split()[1:] if cell != "│"] == ["0.2500", "0.5000", "0.7500"]
    default = CliRunner().invoke(app, ["evaluate", str(run), "--data", str(root), "--split", "dev"],
                                 env={**os.environ, "COLUMNS": "200"})
    assert default.exit_code == 0 and "Acc@5" in default.output and "Acc@100" in default.output
    table = evaluate({"dense": LATER}, data=root, split="dev", measures=["Acc@2"])
    assert table.value("dense", "Acc@2") == 0.5


def test_a_recipe_prints_answer_accuracy(tiny_mlm_dir, tmp_path):
    """An evaluate stage on a collection judged by answers: BM25's row carries Acc@k, the number of the same run
    scored by hand-checked code, with the paper's number beside it."""
    import yaml

    from pretrieve.api import run_recipe
    from pretrieve.data.trec import read_run

    root = _qa_collection(tmp_path / "qa")
    recipe = {"name": "qa", "out": str(tmp_path / "out"), "model": str(tiny_mlm_dir), "data": str(root),
              "expected": [{"collection": f"{root}:dev", "row": "bm25", "table": "DPR (Karpukhin et al. 2020), Table 2",
                            "values": {"Acc@3": 0.75}}],
              "stages": [{"evaluate": {"collections": [f"{root}:dev"], "bm25": True, "zero_shot": True, "depth": 5,
                                       "measures": ["Acc@1", "Acc@3"]}}]}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    results = run_recipe(tmp_path / "recipe.yaml", show_progress=False)
    rows = {row["retriever"]: row for row in results["rows"]}
    assert rows["bm25"]["measures"] == ["Acc@1", "Acc@3"] and set(rows) == {"bm25", "zero-shot"}
    by_hand = AnswerEvaluator(ANSWERS, ["Acc@1", "Acc@3"], texts=TEXTS)(read_run(rows["bm25"]["run"]))
    assert rows["bm25"]["Acc@3"] == round(by_hand.aggregate["Acc@3"], 4)
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| Acc@1 | Acc@3 | paper | Δ |" in markdown and "Table 2" in markdown
