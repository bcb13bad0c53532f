"""A collection that ships its own ``dev`` split (qrels/train.tsv, dev.tsv, test.tsv, as MS MARCO, FiQA, HotpotQA):
the held-out dev queries are drawn from it (:func:`pretrieve.data.folds.held_out_dev`), the recipe runs on it — not
only under ``--smoke`` —, fits and chooses on dev queries that were never trained on, and writes nothing into the
collection's directory; a collection without one is carved exactly as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrieve.data.collection import BeirCollection
from pretrieve.data.folds import derive_collection, has_own_dev, held_out_dev
from pretrieve.errors import ConfigError
from pretrieve.recipe import load_recipe, run_recipe
from pretrieve.recipe.dev import dev_line, prepare_dev
from pretrieve.recipe.smoke import smoke_recipe

from test_finetune import TOPICS, write_collection
from test_pipeline import _fusion_recipe, spy_on_fits, training_queries

OWN_DEV = 8


def write_collection_with_dev(root: Path, also_trained: tuple[str, ...] = ()) -> Path:
    """test_finetune's collection (train q0-q19, test t0-t3) plus its own dev split: v0-v7, query vi → document di
    (and any ``also_trained`` training query judged in dev as well)."""
    write_collection(root)
    with open(root / "queries.jsonl", "a", encoding="utf-8") as handle:
        for i in range(OWN_DEV):
            handle.write(json.dumps({"_id": f"v{i}", "text": f"tell me about {TOPICS[i]}"}) + "\n")
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                            + "".join(f"v{i}\td{i}\t1\n" for i in range(OWN_DEV))
                                            + "".join(f"{qid}\td{qid[1:]}\t1\n" for qid in also_trained))
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` (hidden ones too): size and modification time."""
    return {str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in [root, *root.rglob("*")]}


def test_the_dev_queries_are_drawn_from_the_collections_own_dev_split(tmp_path):
    source = write_collection_with_dev(tmp_path / "src", also_trained=("q3",))
    before = snapshot(source)
    assert has_own_dev(source) and not has_own_dev(source, train="dev")
    out = held_out_dev(source, tmp_path / "a", size=5, seed=3)
    derived, original = BeirCollection(out), BeirCollection(source)
    dev = set(derived.load_qrels("dev"))
    own = {f"v{i}" for i in range(OWN_DEV)}
    assert len(dev) == 5 and dev < own                                 # at most the size, never q3 (also trained)
    assert derived.load_qrels("train") == original.load_qrels("train")   # the training split stays whole
    assert derived.load_qrels("test") == original.load_qrels("test")
    assert sorted(derived.splits()) == ["dev", "test", "train"]
    record = json.loads((out / "folds.json").read_text())
    assert record["seed"] == 3 and record["of"] == OWN_DEV + 1 and record["also_in_train"] == ["q3"]
    assert sorted(record["queries"]["dev"]) == sorted(dev)
    # seeded: the same again (reused), another seed another draw; a size above the split's takes all of it
    assert held_out_dev(source, tmp_path / "b", size=5, seed=3) and \
        set(BeirCollection(tmp_path / "b").load_qrels("dev")) == dev
    assert set(BeirCollection(held_out_dev(source, tmp_path / "c", size=5, seed=4)).load_qrels("dev")) != dev
    assert set(BeirCollection(held_out_dev(source, tmp_path / "d", size=100, seed=0)).load_qrels("dev")) == own
    assert snapshot(source) == before                                  # nothing written into the collection


def test_without_its_own_dev_split_the_dev_queries_are_carved_from_train_as_before(tmp_path):
    """The claims benchmark's pre-registered splits do not change: the rule is derive_collection's carving."""
    source = write_collection(tmp_path / "src")
    assert not has_own_dev(source)
    for size, seed in ((6, 0), (0, 0), (3, 7)):
        old = derive_collection(source, tmp_path / f"old-{size}-{seed}", carve_from="train",
                                parts={"dev": size} if size else {}, seed=seed)
        new = held_out_dev(source, tmp_path / f"new-{size}-{seed}", size=size, seed=seed)
        assert {p.name: p.read_text() for p in (new / "qrels").iterdir()} == \
            {p.name: p.read_text() for p in (old / "qrels").iterdir()}
        assert json.loads((new / "folds.json").read_text()) == json.loads((old / "folds.json").read_text())
        assert json.loads((new / "artifact.json").read_text())["settings"] == \
            json.loads((old / "artifact.json").read_text())["settings"]


def test_the_recipes_dev_record_and_refusals(tmp_path):
    source = write_collection_with_dev(tmp_path / "src")
    recipe = {"dev": {"queries": 5, "seed": 1}, "finetune": {}}
    data, record = prepare_dev(recipe, source, tmp_path / "out")
    assert data == tmp_path / "out" / "dev-split" / "src"
    assert record["drawn_from"] == "dev" and record["queries"] == 5 and record["of"] == OWN_DEV
    assert not record["carved"]
    assert "5 of the 8 queries of the collection's own `dev` split (seed 1" in dev_line(record)[0]
    # the default size (10 % of 20 training queries, at least 20) is more than the split has: all of it
    _, record = prepare_dev({"dev": {"seed": 0}, "finetune": {}}, source, tmp_path / "out2")
    assert record["queries"] == OWN_DEV
    # {split: dev} still uses the split as it is, nothing derived
    assert prepare_dev({"dev": {"split": "dev"}, "finetune": {}}, source, tmp_path / "out3")[0] == source
    (source / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with pytest.raises(ConfigError, match="'dev' split of .* has no judged query that is not also in its 'train'"):
        prepare_dev(recipe, source, tmp_path / "out4")


def test_the_recipe_runs_on_a_collection_with_its_own_dev_split(tiny_mlm_dir, tmp_path, monkeypatch):
    """Not under --smoke: the shipped recipe's ``dev: {seed: 0}``, fine-tuning, mining, a fitted fusion and the
    evaluation; every fit sees own-dev queries only, none of them trained on; the collection is left untouched."""
    fitted_on = spy_on_fits(monkeypatch)
    collections = tmp_path / "collections"
    train, other = write_collection_with_dev(collections / "train"), write_collection(collections / "other")
    before = snapshot(collections)
    results = run_recipe(_fusion_recipe(tmp_path, tiny_mlm_dir, train, other, dev={"seed": 0}), show_progress=False)
    out = tmp_path / "out"
    record = json.loads(next(out.glob("dev-split/*/folds.json")).read_text())
    dev, trained = set(record["queries"]["dev"]), training_queries(out)
    assert dev == {f"v{i}" for i in range(OWN_DEV)}                 # the own split (8 < the default size 20)
    assert trained and trained <= {f"q{i}" for i in range(20)} and not dev & trained
    assert fitted_on and all(used <= dev for used in fitted_on)
    assert results["dev"]["drawn_from"] == "dev" and results["dev"]["queries"] == OWN_DEV
    assert "of the collection's own `dev` split" in (out / "results.md").read_text()
    assert {row["retriever"] for row in results["rows"]} >= {"bm25", "finetune-s1", "final"}
    assert snapshot(collections) == before


def test_smoke_keeps_the_splits_a_collection_has(tmp_path):
    """--smoke slices every split of a local collection (not only the ones the recipe names), so the smoke run's
    dev queries come from the collection's own dev split, as the real run's do."""
    source = write_collection_with_dev(tmp_path / "src")
    path = _fusion_recipe(tmp_path, Path("minilm"), source, source, dev={"seed": 0})
    smoke = smoke_recipe(load_recipe(path), tmp_path / "smoke")
    data = Path(smoke["data"])
    assert sorted(BeirCollection(data).splits()) == ["dev", "test", "train"]
    _, record = prepare_dev(smoke, data, tmp_path / "smoke")
    assert record["drawn_from"] == "dev" and record["queries"] == 4
