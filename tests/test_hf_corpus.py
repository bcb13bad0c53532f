"""The ``hf:NAME[:CONFIG]`` pre-training corpus path (``datasets.load_dataset``) on a local dataset in the hub's
layout (parquet shards under ``data/``, as ``wikimedia/wikipedia`` ships them): no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from pretrieve.data.pretrain_text import iter_pretrain_texts, resolve_text_source, resolve_text_sources
from pretrieve.recipe.schema import load_recipe, stage_labels

TEXTS = ["Anarchism is a political philosophy.", "Albedo is the fraction of sunlight that is reflected.",
         "A is the first letter of the Latin alphabet."]


def test_hf_corpus_loads_a_local_hub_format_dataset(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")   # not the user's cache
    repo = tmp_path / "wikipedia"
    (repo / "data").mkdir(parents=True)
    table = datasets.Dataset.from_dict({"id": ["12", "39", "290"], "title": ["Anarchism", "Albedo", "A"],
                                        "text": TEXTS})
    table.to_parquet(str(repo / "data" / "train-00000-of-00001.parquet"))
    source = resolve_text_source(f"hf:{repo}")
    assert (source.kind, source.name, source.config) == ("datasets", str(repo), None)
    titled = [f"{title} {text}" for title, text in zip(["Anarchism", "Albedo", "A"], TEXTS)]   # title + text
    assert list(iter_pretrain_texts(source)) == titled
    assert list(iter_pretrain_texts(source, start=1, end=2)) == titled[1:2]


@pytest.mark.parametrize("recipe", ["bow", "dupmae", "cpdae", "cdmae"])
def test_paper_recipes_name_a_loadable_wikipedia_with_its_config(recipe):
    loaded = load_recipe(REPO / "configs" / f"{recipe}-msmarco.yaml")
    corpora = [opts["corpus"] for kind, _, opts in stage_labels(loaded) if kind == "pretrain"]
    source = resolve_text_sources(corpora[0])[0]   # Wikipedia first (then BookCorpus where the paper adds it)
    assert (source.name, source.config) == ("wikimedia/wikipedia", "20231101.en")
