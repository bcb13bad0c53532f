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
