"""`pretrieve run RECIPE --smoke`: every shipped recipe end to end with tiny models and sliced / generated data, and
the recipe → smoke-recipe transformation itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pretrieve import artifacts
from pretrieve.errors import ConfigError
from pretrieve.recipe import load_recipe, run_recipe
from pretrieve.recipe.smoke import model_family, smoke_recipe, write_fixture_collection

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[path.stem for path in RECIPES])
def test_every_shipped_recipe_passes_its_smoke_run(path, tmp_path, tokenizer):
    recipe = load_recipe(path)
    results = run_recipe(path, out=tmp_path / "out", show_progress=False, smoke=True)
    out = tmp_path / "out"
    resolved = json.loads((out / "recipe.resolved.json").read_text())
    stages = [next(iter(entry)) if isinstance(entry, dict) else entry for entry in recipe["stages"]]
    # every stage of the recipe ran, in order, with its outputs
    assert list(results["timings_s"]) == _labels(stages)
    assert results["rows"] and all(0.0 <= row[m] <= 1.0 for row in results["rows"] for m in row["measures"])
    assert all("nDCG@10" in row for row in results["rows"] if "measures" not in _evaluate_options(recipe))
    for label in _labels(stages):
        if label.startswith(("pretrain", "finetune", "reranker")):
            assert (out / label / "final").is_dir(), label
    # tiny models of the recipe's family, 2 optimizer steps per training stage
    assert Path(resolved["model"]).parent == out / "smoke-models"
    for label in _labels(stages):
        if label.startswith(("pretrain", "finetune", "reranker")):
            logs = [json.loads(line) for line in (out / label / "logs.jsonl").read_text().splitlines()]
            assert [entry["step"] for entry in logs] == [1, 2], label
    assert (out / "results.md").exists()
    # a paper recipe's tables carry the paper's measures and, beside them, the paper's numbers (issue 24)
    markdown = (out / "results.md").read_text()
    for entry in recipe.get("expected") or []:
        rows = [row for row in results["rows"] if row.get("paper") and row["paper"]["table"] == entry["table"]]
        if not rows:   # --smoke evaluates the first collections only
            continue
        assert {row["paper"]["table"] for row in rows} == {entry["table"]} and entry["table"] in markdown
        for measure in entry["values"]:
            assert f"| {measure} | paper | Δ |" in markdown, (entry, measure)
    if recipe.get("expected"):
        assert "Paper numbers (column \"paper\"" in markdown
    # a second pre-training phase continues from the first; fine-tuning starts from the last phase
    labels = _labels(stages)
    phases = [label for label in labels if label.startswith("pretrain")]
    for previous, phase in zip(phases, phases[1:]):
        config = json.loads((out / phase / "final" / "pretrain_config.json").read_text())
        assert config["model"] == str(out / previous / "final")
    if phases and "finetune-s1" in labels:
        config = json.loads((out / "finetune-s1" / "final" / "finetune_config.json").read_text())
        assert config["config"]["model"] == str(out / phases[-1] / "final")
    # the reranker and the teacher read the latest mined groups (mine-2 when there is one)
    if "reranker" in labels:
        mined = [label for label in labels[:labels.index("reranker")] if label.startswith("mine")]
        recorded = artifacts.read_sidecar(out / "reranker" / "final")["inputs"]   # inputs by content
        assert recorded["groups"] == artifacts.fingerprint(out / mined[-1] / "groups.jsonl")


def _evaluate_options(recipe) -> dict:
    return next(entry["evaluate"] for entry in recipe["stages"] if isinstance(entry, dict) and "evaluate" in entry)


def _labels(stages: list[str]) -> list[str]:
    labels, counts, finetunes = [], {}, 0
    for kind in stages:
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "finetune":
            finetunes += 1
            labels.append(f"finetune-s{finetunes}")
        else:
            labels.append(kind if counts[kind] == 1 else f"{kind}-{counts[kind]}")
    return labels


def test_the_smoke_recipe_keeps_the_stages_and_options_and_caps_the_budgets(tmp_path):
    recipe = load_recipe(CONFIGS / "cdmae-msmarco.yaml")
    smoke = smoke_recipe(recipe, tmp_path / "s")
    assert [next(iter(e)) for e in smoke["stages"]] == [next(iter(e)) for e in recipe["stages"]]
    phase2 = smoke["stages"][1]["pretrain"]
    assert phase2["method"] == "cdmae" and phase2["schedule"] == "linear" and phase2["precision"] == "fp16"
    assert phase2["max_steps"] == 2 and phase2["batch_size"] == 4 and phase2["max_len"] == 48
    assert "epochs" not in smoke["stages"][0]["pretrain"]
    stage3 = smoke["stages"][8]["finetune"]
    assert stage3["stage"] == 3 and stage3["num_negatives"] == 3 and stage3["batch_size"] == 4
    assert smoke["finetune"]["alpha"] == 0.2 and smoke["finetune"]["bm25_depth"] == 30
    reranker = smoke["stages"][6]["reranker"]
    assert Path(reranker["model"]).name == "electra" and reranker["max_len"] == 64
    assert smoke["stages"][9]["evaluate"]["rerank_depth"] == 10
    # the training collection: a generated fixture (MS MARCO is not on this machine) with every split read
    data = Path(smoke["data"])
    assert {p.stem for p in (data / "qrels").glob("*.tsv")} == {"train", "dev", "test"}
    assert smoke["out"] == str(tmp_path / "s")
    assert smoke_recipe(recipe)["out"] == recipe["out"] + "-smoke"


def test_a_local_collection_is_sliced_not_replaced(tmp_path, scifact):
    recipe = {"out": str(tmp_path / "o"), "model": "minilm", "data": str(scifact),
              "stages": [{"finetune": {"stage": 1}}, {"evaluate": {"split": "test"}}]}
    smoke = smoke_recipe(recipe)
    data = Path(smoke["data"])
    lines = (data / "corpus.jsonl").read_text().splitlines()
    first = json.loads((scifact / "corpus.jsonl").read_text().splitlines()[0])
    assert len(lines) == 300 and json.loads(lines[0])["_id"] == first["_id"]
    for split in ("train", "test"):
        judged = (data / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
        ids = {json.loads(line)["_id"] for line in lines}
        assert judged and all(line.split("\t")[1] in ids for line in judged)


def test_model_families_and_the_refusal_of_an_unknown_one(tiny_mlm_dir):
    assert model_family("bert-base-uncased") == "bert" and model_family(str(tiny_mlm_dir)) == "bert"
    assert model_family("google/electra-base-discriminator") == "electra"
    assert model_family("minilm") == "bert" and model_family("Shitao/RetroMAE") == "bert"
    with pytest.raises(ConfigError, match="no tiny stand-in for model 'facebook/opt-125m'"):
        model_family("facebook/opt-125m")


def test_fixture_collections_are_valid_beir(tmp_path):
    from pretrieve.data.collection import BeirCollection

    write_fixture_collection(tmp_path / "c", ["train", "dev"])
    collection = BeirCollection(tmp_path / "c")
    corpus = collection.load_corpus()
    for split in ("train", "dev"):
        qrels = collection.load_qrels(split)
        assert qrels and all(doc in corpus for docs in qrels.values() for doc in docs)
        assert set(collection.load_queries(split)) == set(qrels)


def test_the_cli_flag(tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"out": str(tmp_path / "o"), "model": "bert-base-uncased", "data": "msmarco",
                                      "stages": [{"finetune": {"stage": 1}}, {"evaluate": {"split": "dev"}}]}))
    result = CliRunner().invoke(app, ["run", str(recipe), "--smoke", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o-smoke" / "results.md").exists() and not (tmp_path / "o").exists()
