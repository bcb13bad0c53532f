"""Each paper recipe prints the paper's measures beside the paper's numbers (issue 24): relevance-level measures equal
``trec_eval -l 2`` (pytrec_eval's ``relevance_level``), per-collection ``measures`` of the evaluate stage, the recipe's
``expected`` numbers (validated, one located error per mistake) in a "paper" column with the difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytrec_eval
import yaml

from pretrieve.data import read_run
from pretrieve.errors import ConfigError
from pretrieve.evaluation import evaluate
from pretrieve.recipe import load_recipe, results_markdown, run_recipe

from test_finetune import write_collection

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAPER_RECIPES = ["bow", "dupmae", "cpdae", "cdmae", "cotmae", "cotmote"]

# grades 0-3 as in TREC DL: q1's relevant documents at grade >= 2 are a and b, at grade >= 1 also c
QRELS = {"q1": {"a": 3, "b": 2, "c": 1, "d": 0}, "q2": {"e": 2, "f": 1}}
RUN = {"q1": {"a": 0.9, "c": 0.8, "d": 0.7, "x": 0.6}, "q2": {"f": 0.9, "y": 0.5}}


def test_relevance_level_measure_equals_trec_eval_l2():
    result = evaluate(QRELS, RUN, ["R(rel=2)@1000", "R@1000", "RR(rel=2)@10", "MRR@10"])
    # by hand: q1 finds a of {a, b} at grade >= 2 (1/2), a and c of {a, b, c} at grade >= 1 (2/3); q2 finds nothing
    # at grade >= 2 (0 of {e}), f of {e, f} at grade >= 1 (1/2)
    assert result.per_query["R(rel=2)@1000"] == pytest.approx({"q1": 0.5, "q2": 0.0})
    assert result.per_query["R@1000"] == pytest.approx({"q1": 2 / 3, "q2": 0.5})
    assert result.per_query["RR(rel=2)@10"] == pytest.approx({"q1": 1.0, "q2": 0.0})
    assert result.per_query["MRR@10"] == pytest.approx({"q1": 1.0, "q2": 1.0})
    # trec_eval -l 2 -m recall.1000 (pytrec_eval is trec_eval's code)
    level2 = pytrec_eval.RelevanceEvaluator(QRELS, {"recall.1000"}, relevance_level=2).evaluate(RUN)
    assert result.per_query["R(rel=2)@1000"] == pytest.approx({q: v["recall_1000"] for q, v in level2.items()})
    assert result.aggregate["R(rel=2)@1000"] == pytest.approx(0.25)


def _graded(root: Path) -> Path:
    """The tiny collection with TREC-DL-like grades: each test query's own document at grade 1, a second judged
    document (the distractor d20+i) at grade 2."""
    write_collection(root)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"t{i}\td{i}\t1\nt{i}\td{20 + i}\t2\n" for i in range(4)))
    return root


def _recipe(tmp_path: Path, model: Path, train: Path, graded: Path, **top) -> Path:
    recipe = {
        "name": "tables", "out": str(tmp_path / "out"), "model": str(model), "data": str(train), "seed": 7,
        "finetune": {"max_steps": 2, "batch_size": 4, "warmup_ratio": 0.0, "save_every": 2, "num_negatives": 2,
                     "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20},
        "stages": [
            {"finetune": {"stage": 1}},
            {"evaluate": {"collections": [f"{train}:test", str(graded)], "bm25": True, "depth": 20,
                          "measures": {f"{train.name}:test": ["MRR@10", "R@50"],
                                       graded.name: ["nDCG@10", "R(rel=2)@1000", "R@1000"]}}},
        ],
        **top,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_recipe_rows_carry_each_collections_measures_and_the_papers_numbers(tiny_mlm_dir, tmp_path):
    train, graded = write_collection(tmp_path / "train"), _graded(tmp_path / "graded")
    expected = [{"collection": "train:test", "table": "Table 9, row 'ours'", "values": {"MRR@10": 0.5}},
                {"collection": "graded", "row": "bm25", "table": "Table 8", "values": {"R(rel=2)@1000": 0.25}}]
    results = run_recipe(_recipe(tmp_path, tiny_mlm_dir, train, graded, expected=expected), show_progress=False)
    rows = {(row["retriever"], row["collection"]): row for row in results["rows"]}
    assert set(rows) == {(r, c) for r in ("bm25", "finetune-s1") for c in ("train", "graded")}
    for retriever in ("bm25", "finetune-s1"):
        assert rows[(retriever, "train")]["measures"] == ["MRR@10", "R@50"]
        assert "nDCG@10" not in rows[(retriever, "train")]
        row = rows[(retriever, "graded")]
        assert row["measures"] == ["nDCG@10", "R(rel=2)@1000", "R@1000"]
        # the recipe's level-2 recall is trec_eval -l 2's on the row's own run file
        run = read_run(row["run"])
        qrels = {f"t{i}": {f"d{i}": 1, f"d{20 + i}": 2} for i in range(4)}
        level2 = pytrec_eval.RelevanceEvaluator(qrels, {"recall.1000"}, relevance_level=2).evaluate(run)
        assert row["R(rel=2)@1000"] == pytest.approx(sum(v["recall_1000"] for v in level2.values()) / 4, abs=1e-4)
    # the paper's numbers sit on their rows: the last fine-tuned retriever by default, or the named row
    assert rows[("finetune-s1", "train")]["paper"] == {"table": "Table 9, row 'ours'", "values": {"MRR@10": 0.5}}
    assert rows[("bm25", "graded")]["paper"]["values"] == {"R(rel=2)@1000": 0.25}
    assert "paper" not in rows[("bm25", "train")] and "paper" not in rows[("finetune-s1", "graded")]
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert markdown == results_markdown(json.loads((tmp_path / "out" / "results.json").read_text()))
    assert "| retriever | collection | MRR@10 | paper | Δ | R@50 |" in markdown
    assert "| retriever | collection | nDCG@10 | R(rel=2)@1000 | paper | Δ | R@1000 |" in markdown
    ours = rows[("finetune-s1", "train")]["MRR@10"]
    assert f"| finetune-s1 | train | {ours:.4f} | 0.500 | {ours - 0.5:+.4f} |" in markdown   # fixed decimals
    assert "- `finetune-s1` on train: Table 9, row 'ours'" in markdown and "- `bm25` on graded: Table 8" in markdown


def test_a_tolerance_says_whether_every_measure_is_within_it():
    """A released retriever's check: ``tolerance`` on an expected entry → yes / NO under "Paper numbers"."""
    def markdown(ours):
        row = {"retriever": "zero-shot", "collection": "msmarco-titled:dev", "run": "x", "measures": ["MRR@10", "R@1000"],
               "MRR@10": ours, "R@1000": 0.985,
               "paper": {"table": "README", "values": {"MRR@10": 0.391, "R@1000": 0.988}, "tolerance": 0.005}}
        return results_markdown({"recipe": "released", "rows": [row]})

    assert "- `zero-shot` on msmarco-titled:dev: README — within ±0.005 on every measure: yes" in markdown(0.388)
    assert "within ±0.005 on every measure: NO" in markdown(0.380)
    assert "| zero-shot | msmarco-titled:dev | 0.3880 | 0.391 | -0.0030 | 0.9850 | 0.988 | -0.0030 |" in markdown(0.388)


def test_results_markdown_default_measures_keep_one_table_without_paper_columns():
    rows = [{"retriever": r, "collection": c, "run": "x", "nDCG@10": 0.5, "MRR@10": 0.25, "R@100": 1.0}
            for r in ("bm25", "finetune-s1") for c in ("a", "b")]    # rows of results.json written before `measures`
    markdown = results_markdown({"recipe": "old", "rows": rows})
    assert markdown.count("| retriever | collection |") == 1 and "paper" not in markdown
    assert "| retriever | collection | nDCG@10 | MRR@10 | R@100 |\n|---|---|---|---|---|\n" in markdown
    assert "| finetune-s1 | b | 0.5000 | 0.2500 | 1.0000 |" in markdown


@pytest.mark.parametrize("change, message", [
    ({"expected": [{"collection": "train:test", "table": "T1", "valuse": {"MRR@10": 0.3}}]},
     "expected[0].valuse: unknown option; did you mean values?"),
    ({"expected": [{"collection": "train:test", "values": {"MRR@10": 0.3}}]}, "expected[0].table"),
    ({"expected": [{"collection": "train:test", "table": "T1", "values": {"MRR@10": 39.4}}]},
     "expected[0].values.MRR@10: 39.4 is not in [0, 1]"),
    ({"expected": [{"collection": "train:test", "table": "T1", "values": {"MRR@x": 0.3}}]},
     "expected[0].values.MRR@x: unknown measure"),
    ({"expected": [{"collection": "train:test", "table": "T1", "values": {"R@1000": 0.3}}]},
     "recipe.yaml: expected[0].values.R@1000: not measured on train:test by stages[1].evaluate (measures: MRR@10, "
     "R@50)"),
    ({"expected": [{"collection": "scifact", "table": "T1", "values": {"MRR@10": 0.3}}]},
     "recipe.yaml: expected[0].collection: no evaluate stage evaluates 'scifact'"),
    ({"expected": [{"collection": "train:test", "row": "finetune-s3", "table": "T1", "values": {"MRR@10": 0.3}}]},
     "recipe.yaml: expected[0].row: no row 'finetune-s3' in stages[1].evaluate"),
    ({"expected": [{"collection": "train:test", "table": "T1", "values": {"MRR@10": 0.3}},
                   {"collection": "train:test", "table": "T2", "values": {"R@50": 0.3}}]},
     "expected[1]: a second entry for row (default) on train:test"),
    ({"measures": {"train:test": ["MRR@10", "R(rel=x)@5"]}}, "stages[1].evaluate: measures.train:test: unknown measure"),
    ({"measures": {"scifact": ["MRR@10"]}}, "stages[1].evaluate.measures.scifact: not a collection this stage"),
    ({"measures": ["MRR@10"], "final": "finetune-s1", "compare": ["bm25"]},
     "stages[1].evaluate: measures: 'final' is tested on nDCG@10 per query; add it to the measures"),
])
def test_bad_measures_and_expected_numbers_are_one_located_error(tiny_mlm_dir, tmp_path, change, message):
    train, graded = write_collection(tmp_path / "train"), _graded(tmp_path / "graded")
    path = _recipe(tmp_path, tiny_mlm_dir, train, graded)
    recipe = yaml.safe_load(path.read_text())
    evaluate_stage = recipe["stages"][1]["evaluate"]
    for key in ("measures", "final", "compare"):
        if key in change:
            evaluate_stage[key] = change[key]
    if "expected" in change:
        recipe["expected"] = change["expected"]
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError) as error:
        load_recipe(path)
    assert message in str(error.value) and "\n" not in str(error.value)


#: The recipes whose authors fine-tuned on RocketQA's MS MARCO passages with titles (docs/methods.md).
TITLED = ("bow", "dupmae", "cotmae", "cotmote")


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_paper_recipes_ask_for_their_papers_measures_and_cite_a_table_for_each_number(name):
    recipe = load_recipe(CONFIGS / f"{name}-msmarco.yaml")
    evaluate_stage = next(opts["evaluate"] for opts in recipe["stages"] if "evaluate" in opts)
    marco = "msmarco-titled" if name in TITLED else "msmarco"   # CPDAE: STAR's official collection; CDMAE: SimLM's
    assert recipe["data"] == marco
    dev = evaluate_stage["measures"][f"{marco}:dev"]
    assert dev[0] == "MRR@10" and "R@1000" in dev and ("R@50" in dev) == (name != "cpdae") and ("R@1" in dev) == (
        name == "cotmote")
    assert evaluate_stage["measures"][f"{marco}:test"] == ["nDCG@10", "R(rel=2)@1000"]
    expected = recipe["expected"]
    assert {entry["collection"] for entry in expected} >= {f"{marco}:dev"}
    assert all(entry["table"].startswith(("Table", "CoT-MoTE", "CDMAE")) for entry in expected)
    # titles joined as the authors' pre-processing joins them: title + [SEP] + text
    assert recipe["finetune"].get("title_join", "space") == ("sep" if name in TITLED else "space")


@pytest.mark.parametrize("name", ["bow", "dupmae", "cdmae", "cpdae"])
def test_general_pre_training_reads_the_papers_corpora_in_order(name):
    recipe = load_recipe(CONFIGS / f"{name}-msmarco.yaml")
    first = next(opts["pretrain"] for opts in recipe["stages"] if "pretrain" in opts)["corpus"]
    wikipedia, bookcorpus = "hf:wikimedia/wikipedia:20231101.en", "hf:bookcorpus/bookcorpus"
    assert first == (wikipedia if name == "cpdae" else [wikipedia, bookcorpus])   # CPDAE: English Wikipedia only


BEIR_SETS = {"trec-covid", "nfcorpus", "nq", "hotpotqa", "fiqa", "arguana", "webis-touche2020", "quora",
             "dbpedia-entity", "scidocs", "fever", "climate-fever", "scifact"}


@pytest.mark.parametrize("name, table", [("bow-beir", 'Table 6, column "30%"'),
                                         ("dupmae-beir", 'Table 2, column "DupMAE"'),
                                         ("cdmae-msmarco", 'Table 3, column "CDMAE"')])
def test_beir_tables_cover_every_downloadable_set_scored_as_beir_scores_them(name, table):
    recipe = load_recipe(CONFIGS / f"{name}.yaml")
    stage = [opts["evaluate"] for opts in recipe["stages"] if "evaluate" in opts][-1]
    assert set(stage["collections"]) == BEIR_SETS and stage["measures"] == ["nDCG@10"]
    assert stage["ignore_identical_ids"] is True   # BEIR's evaluate drops a query's own id in every dataset
    assert stage.get("retrievers") in (None, ["finetune-s3"])   # CDMAE: only the row with the paper's numbers
    beir = {entry["collection"]: entry for entry in recipe["expected"] if entry["collection"] in BEIR_SETS}
    assert set(beir) == BEIR_SETS and all(entry["table"].startswith(table) for entry in beir.values())
    assert all(list(entry["values"]) == ["nDCG@10"] for entry in beir.values())
    if name.endswith("-beir"):   # the separate BEIR fine-tuning: general corpus only, one stage, group 2, lr 1e-5
        kinds = [next(iter(entry)) for entry in recipe["stages"]]
        assert kinds == ["pretrain", "finetune", "evaluate"]
        assert recipe["data"] == "msmarco"   # RetroMAE's BEIR preprocess.py runs without --use_title
        shared = recipe["finetune"]
        assert (shared["num_negatives"], shared["lr"], shared["epochs"], shared["batch_size"]) == (1, 1e-5, 10, 1024)
