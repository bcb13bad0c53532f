"""``pretrieve cache list | size | prune`` over a cache the real code wrote (a search with a tiny model: its Arrow
datasets and encoded corpus; ``encode`` of a long list of texts; a Hub collection), aged by hand."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pretrieve
from pretrieve.cli import app
from pretrieve.errors import ConfigError
from pretrieve.usercache import cache_entries, parse_age

from test_finetune import write_collection

DAY = 86400


def invoke(*args: str):
    return CliRunner().invoke(app, ["cache", *map(str, args)], catch_exceptions=False)


def age(paths, days: float) -> None:
    then = time.time() - days * DAY
    for path in paths:
        for file in [path, *path.rglob("*")] if path.is_dir() else [path]:
            os.utime(file, (then, then))


@pytest.fixture
def cache(tiny_bert_dir, tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("PRETRIEVE_CACHE", str(root))
    data = write_collection(tmp_path / "data" / "tiny")
    pretrieve.search(tiny_bert_dir, data, k=5, show_progress=False)
    pretrieve.encode(tiny_bert_dir, [f"text number {i}" for i in range(300)], show_progress=False)
    hub = root / "collections" / "hub" / "hf--BeIR--toy"
    hub.mkdir(parents=True)
    (hub / "corpus.jsonl").write_text('{"_id": "d", "title": "", "text": "x"}\n')
    (hub / "source.json").write_text('{"kind": "hf", "id": "BeIR/toy"}\n')
    return root


def test_list_names_every_entry_with_its_model(cache, tiny_bert_dir):
    entries = cache_entries(cache)
    kinds = sorted(e.kind for e in entries)
    assert kinds == ["arrow", "collection", "embeddings", "texts"]
    by_kind = {e.kind: e for e in entries}
    assert by_kind["embeddings"].model == str(tiny_bert_dir) and by_kind["collection"].what == "hf:BeIR/toy"
    assert by_kind["texts"].model == Path(tiny_bert_dir).name
    assert all(e.size > 0 for e in entries)
    assert by_kind["embeddings"].size == sum(f.stat().st_size for f in by_kind["embeddings"].paths[0].rglob("*")
                                             if f.is_file())
    result = invoke("list")
    assert result.exit_code == 0 and "4 entries" in result.output and "hf:BeIR/toy" in result.output
    assert "encoded corpus" in result.output
    size = invoke("size")
    assert size.exit_code == 0 and "total" in size.output and "embeddings" in size.output


def test_prune_by_age_dry_run_first(cache):
    old = [e for e in cache_entries(cache) if e.kind in ("arrow", "texts")]
    age([p for e in old for p in e.paths], days=40)
    dry = invoke("prune", "--older-than", "30d", "--dry-run")
    assert dry.exit_code == 0 and "would remove 2 entries" in dry.output
    assert len(cache_entries(cache)) == 4
    done = invoke("prune", "--older-than", "30d")
    assert done.exit_code == 0 and "removed 2 entries" in done.output
    assert sorted(e.kind for e in cache_entries(cache)) == ["collection", "embeddings"]
    assert all(not p.exists() for e in old for p in e.paths)
    assert not any(p.name.startswith(".") for p in (cache / "arrow").iterdir())   # nothing left aside


def test_prune_by_model_keeps_other_models_and_collections(cache, tiny_bert_dir):
    assert "removed 0 entries" in invoke("prune", "--model", "some-other-model").output
    result = invoke("prune", "--model", Path(tiny_bert_dir).name)
    assert result.exit_code == 0 and "removed 2 entries" in result.output
    assert sorted(e.kind for e in cache_entries(cache)) == ["arrow", "collection"]


def test_prune_needs_a_filter_and_a_readable_age(cache):
    with pytest.raises(ConfigError, match="give --older-than, --model or --kind"):
        invoke("prune")
    with pytest.raises(ConfigError, match="'30 days' is not an age"):
        invoke("prune", "--older-than", "30 days")
    assert parse_age("2w") == 14 * DAY and parse_age("12h") == 12 * 3600
    assert len(cache_entries(cache)) == 4
