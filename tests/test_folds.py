"""Derived collections: seeded query parts, qrels files pointing at the source corpus, reuse and rebuild."""

from __future__ import annotations

import json

import pytest

from pretrieve import artifacts
from pretrieve.data.collection import BeirCollection
from pretrieve.data.folds import carve_queries, derive_collection
from pretrieve.errors import ConfigError

from test_finetune import write_collection


def test_carving_is_seeded_disjoint_and_independent_of_order():
    ids = [f"q{i}" for i in range(50)]
    parts = carve_queries(ids, {"dev": 10, "extra": 5}, seed=3)
    assert len(parts["dev"]) == 10 and len(parts["extra"]) == 5 and not set(parts["dev"]) & set(parts["extra"])
    assert carve_queries(list(reversed(ids)), {"dev": 10, "extra": 5}, seed=3) == parts
    assert carve_queries(ids, {"dev": 10}, seed=4)["dev"] != parts["dev"]
    with pytest.raises(ConfigError, match="cannot carve"):
        carve_queries(ids, {"dev": 51}, seed=0)


def test_a_derived_collection_points_at_the_source_and_splits_its_queries(tmp_path):
    source = write_collection(tmp_path / "src")
    out = derive_collection(source, tmp_path / "derived", carve_from="train", parts={"dev": 3}, seed=1)
    derived, original = BeirCollection(out), BeirCollection(source)
    assert derived.corpus_path.is_symlink() and derived.corpus_path.resolve() == original.corpus_path.resolve()
    assert derived.load_corpus().ids == original.load_corpus().ids
    assert sorted(derived.splits()) == ["dev", "test", "train"]
    dev, train = set(derived.load_qrels("dev")), set(derived.load_qrels("train"))
    assert len(dev) == 3 and not dev & train and dev | train == set(original.load_qrels("train"))
    assert derived.load_qrels("test") == original.load_qrels("test")
    for qid in dev:
        assert derived.load_qrels("dev")[qid] == original.load_qrels("train")[qid]
    record = json.loads((out / "folds.json").read_text())
    assert record["seed"] == 1 and sorted(record["queries"]["dev"]) == sorted(dev)
    assert artifacts.is_current(out, {"carve_from": "train", "parts": {"dev": 3}, "seed": 1},
                                {"corpus": original.corpus_path, "queries": original.queries_path,
                                 "qrels:test": original.qrels_path("test"),
                                 "qrels:train": original.qrels_path("train")}, kind="derived-collection")
    # reused as it is; rebuilt for another seed; refused when the parts take every query
    mtime = (out / "qrels" / "dev.tsv").stat().st_mtime_ns
    assert derive_collection(source, out, parts={"dev": 3}, seed=1) == out
    assert (out / "qrels" / "dev.tsv").stat().st_mtime_ns == mtime
    derive_collection(source, out, parts={"dev": 3}, seed=2)
    assert set(BeirCollection(out).load_qrels("dev")) != dev
    assert json.loads((out / "folds.json").read_text())["seed"] == 2
    with pytest.raises(ConfigError, match="no query"):
        derive_collection(source, tmp_path / "all", parts={"dev": len(original.load_qrels("train"))})
    with pytest.raises(ConfigError, match="already splits"):
        derive_collection(source, tmp_path / "clash", parts={"test": 1})


def test_halves_split_the_judged_queries_both_ways_and_the_cli_writes_them(tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app
    from pretrieve.data.folds import halves

    source = write_collection(tmp_path / "src")
    (source / "qrels" / "train.tsv").unlink()                 # a test-only collection, like Cranfield
    a, b = halves(source, tmp_path / "halves", split="test", seed=5)
    assert (a.name, b.name) == ("src-a", "src-b")
    first, second = BeirCollection(a), BeirCollection(b)
    assert sorted(first.splits()) == sorted(second.splits()) == ["test", "train"]
    whole = BeirCollection(source).load_qrels("test")
    assert first.load_qrels("train") == second.load_qrels("test") and first.load_qrels("test") == second.load_qrels("train")
    assert len(first.load_qrels("train")) == 2 and not set(first.load_qrels("train")) & set(first.load_qrels("test"))
    assert {**first.load_qrels("train"), **first.load_qrels("test")} == whole
    assert halves(source, tmp_path / "other", seed=6)[0] != a and \
        BeirCollection(halves(source, tmp_path / "other", seed=6)[0]).load_qrels("train") != first.load_qrels("train")
    result = CliRunner().invoke(app, ["data", "halves", str(source), "--out", str(tmp_path / "cli"), "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert BeirCollection(tmp_path / "cli" / "src-a").load_qrels("train") == first.load_qrels("train")
    with pytest.raises(ConfigError, match="already splits"):      # the remainder may not take an existing name
        derive_collection(write_collection(tmp_path / "both"), tmp_path / "x", carve_from="test",
                          parts={"dev": 1}, rest="train")
