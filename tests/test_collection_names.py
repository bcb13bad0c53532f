"""One name, one collection: every command that takes a collection finds ``--data NAME`` (``--fit-data``,
``--corpus``, a recipe's ``data``) the same way, under ``$PRETRIEVE_DATA``, without trying to download it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pretrieve.cli import app
from pretrieve.data import registry
from pretrieve.data.trec import read_run
from pretrieve.errors import InputError

from conftest import isolated_data_root
from test_finetune import write_collection

NAME = "scifact"   # a name of the download registry: a resolver that missed $PRETRIEVE_DATA would download it


@pytest.fixture
def named_collection(tmp_path, monkeypatch) -> Path:
    """A tiny collection at ``$PRETRIEVE_DATA/scifact``; no other data root, an empty cache, no network, and a
    working directory without a ``./scifact``."""
    return write_collection(isolated_data_root(tmp_path, monkeypatch) / NAME)


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_resolves_the_same_name_through_pretrieve_data(named_collection, tiny_mlm_dir, tmp_path):
    fast = ["--steps", "2", "--batch-size", "4", "--warmup-ratio", "0", "--save-every", "100"]
    runs = tmp_path / "runs"
    invoke("data", "check", NAME)
    for split in ("test", "train"):
        invoke("bm25", "--data", NAME, "--split", split, "--out", runs / f"bm25-{split}.trec", "--k", "20")
    assert set(read_run(runs / "bm25-test.trec")) == {f"t{i}" for i in range(4)}

    invoke("pretrain", "--model", tiny_mlm_dir, "--corpus", NAME, "--out", tmp_path / "pt", "--max-len", "32", *fast)
    config = json.loads((tmp_path / "pt" / "final" / "pretrain_config.json").read_text())
    assert json.dumps(config).count(str(named_collection)) >= 1

    invoke("finetune", "--model", tmp_path / "pt" / "final", "--data", NAME, "--out", tmp_path / "ft",
           "--num-negatives", "1", "--query-max-len", "16", "--passage-max-len", "32", *fast)
    config = json.loads((tmp_path / "ft" / "final" / "finetune_config.json").read_text())
    assert config["config"]["data"] == str(named_collection)

    for split in ("test", "train"):
        invoke("dense", "--model", tmp_path / "ft" / "final", "--data", NAME, "--split", split,
               "--out", runs / f"dense-{split}.trec", "--k", "20", "--precision", "fp32")
    table = invoke("evaluate", "--data", NAME, runs / "bm25-test.trec", runs / "dense-test.trec")
    assert "bm25-test" in table and "dense-test" in table
    invoke("fuse", runs / "bm25-test.trec", runs / "dense-test.trec", "--out", runs / "fused.trec", "--method", "wsum",
           "--fit-data", NAME, "--fit-runs", f"{runs / 'bm25-train.trec'},{runs / 'dense-train.trec'}")
    assert set(read_run(runs / "fused.trec")) == {f"t{i}" for i in range(4)}

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "named", "out": str(tmp_path / "recipe-out"), "model": str(tiny_mlm_dir),
                                      "data": NAME, "stages": [{"evaluate": {"bm25": True, "zero_shot": True, "depth": 20,
                                                                               "precision": "fp32"}}]}))
    invoke("run", recipe)
    results = json.loads((tmp_path / "recipe-out" / "results.json").read_text())
    assert {row["collection"] for row in results["rows"]} == {NAME}
    bm25_row = next(row for row in results["rows"] if row["retriever"] == "bm25")
    recipe_run, command_run = read_run(bm25_row["run"]), read_run(runs / "bm25-test.trec")
    assert set(recipe_run) == set(command_run)
    for qid, ranking in command_run.items():
        assert recipe_run[qid] == pytest.approx(ranking, abs=1e-4)


def test_the_search_order_and_what_a_missing_name_says(named_collection, tmp_path, monkeypatch):
    mine = write_collection(tmp_path / "mine" / NAME)
    assert registry.resolve_collection(NAME) == named_collection                           # $PRETRIEVE_DATA
    assert registry.resolve_collection(NAME, data_root=tmp_path / "mine") == mine          # data_root first
    assert registry.resolve_collection(str(mine)) == mine                                  # a path as given
    cached = write_collection(tmp_path / "cache" / "collections" / NAME)
    monkeypatch.setenv("PRETRIEVE_DATA", str(tmp_path / "nowhere"))
    assert registry.resolve_collection(NAME) == cached                                     # then the cache
    assert registry.resolve_corpus(NAME) == str(cached)
    assert registry.resolve_corpus("hf:wikitext:wikitext-2-raw-v1@train") == "hf:wikitext:wikitext-2-raw-v1@train"
    with pytest.raises(InputError, match=r"unknown collection 'nosuchset' \(looked in .*nowhere/nosuchset.*"
                                         r"known collections: .*scifact.*data root holding <name>/corpus.jsonl"):
        registry.resolve_collection("nosuchset")
    with pytest.raises(InputError, match="collection directory not found"):
        invoke("bm25", "--data", "./nosuchset", "--out", tmp_path / "x.trec")
