"""The user's embedding cache (:mod:`pretrieve.retrieval.cache`): a second ``pretrieve.search`` of the same corpus with
the same model encodes no passage; ``encode`` reuses long lists of texts; the cache is under ``$PRETRIEVE_CACHE``,
never in the data folder; a changed corpus is encoded again; the verbs hold transformers' noise back."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import pretrieve
from pretrieve.retrieval import search as search_module

from test_finetune import write_collection


@pytest.fixture
def counted(monkeypatch) -> list[int]:
    """How many passages the corpus encoder was asked to encode, call by call."""
    calls: list[int] = []
    original = search_module.encode_windows

    def counting(side, texts, batch_size=64, start=0, end=None, **kwargs):
        calls.append((len(texts) if end is None else end) - start)
        return original(side, texts, batch_size, start, end, **kwargs)

    monkeypatch.setattr(search_module, "encode_windows", counting)
    return calls


def files_under(path):
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))


def test_a_second_search_of_the_same_corpus_encodes_no_passage(tiny_bert_dir, tmp_path, monkeypatch, counted):
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    data = write_collection(tmp_path / "data" / "tiny")
    before = files_under(data)
    retriever = pretrieve.load_retriever(tiny_bert_dir, device="cpu")
    first = pretrieve.search(retriever, data, k=5, show_progress=False)
    assert counted == [40]
    again = pretrieve.search(retriever, data, k=5, show_progress=False)
    mine = pretrieve.search(tiny_bert_dir, data, queries={"q1": "report on rain"}, k=3, show_progress=False)
    assert counted == [40]                                   # neither the same search nor one custom query re-encodes
    assert again == first and set(mine) == {"q1"} and len(mine["q1"]) == 3
    assert files_under(data) == before                       # nothing written beside the data
    cached = list((tmp_path / "cache" / "embeddings").iterdir())
    assert len(cached) == 1 and (cached[0] / "shard-0-of-1").is_dir()

    corpus = data / "corpus.jsonl"                           # an edited corpus is another entry: encoded again
    lines = corpus.read_text().splitlines()
    lines[0] = json.dumps({"_id": "d0", "title": "", "text": "an edited passage"})
    corpus.write_text("\n".join(lines) + "\n")
    pretrieve.search(retriever, data, k=5, show_progress=False)
    assert counted == [40, 40]
    pretrieve.search(retriever, data, k=5, cache=False, show_progress=False)
    assert counted == [40, 40, 40]                           # cache=False: a temporary index, as before


def test_encode_reuses_a_long_list_of_texts(tiny_bert_dir, tmp_path, monkeypatch):
    from pretrieve.retrieval import batches

    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    calls = []
    original = batches.encode_all
    monkeypatch.setattr(batches, "encode_all", lambda side, texts, *a, **k: calls.append(len(texts)) or
                        original(side, texts, *a, **k))
    texts = [f"passage number {i} about rain and snow" for i in range(300)]
    first = pretrieve.encode(tiny_bert_dir, texts, show_progress=False)
    second = pretrieve.encode(tiny_bert_dir, texts, show_progress=False)
    np.testing.assert_array_equal(first, second)
    assert calls == [300]
    pretrieve.encode(tiny_bert_dir, texts, side="query", show_progress=False)   # another side: its own entry
    pretrieve.encode(tiny_bert_dir, texts[:3], show_progress=False)             # a few texts: never cached
    pretrieve.encode(tiny_bert_dir, texts[:3], show_progress=False)
    assert calls == [300, 300, 3, 3]


def test_progress_is_shown_by_default_without_logging_configured(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(logging.getLogger("pretrieve.progress"), "hasHandlers", lambda: False)
    data = write_collection(tmp_path / "data" / "tiny")
    pretrieve.search(tiny_bert_dir, data, k=5, batch_size=8)
    assert "encode passages: 40/40 texts (100%)" in capsys.readouterr().err
    pretrieve.search(tiny_bert_dir, data, k=5, batch_size=8, cache=False, show_progress=False)
    assert "encode passages" not in capsys.readouterr().err


def test_verbs_hold_back_transformers_noise_and_restore_it(tiny_mlm_dir, capfd):
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    pretrieve.load_retriever(tiny_mlm_dir, device="cpu")       # an MLM checkpoint loaded into an encoder
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "LOAD REPORT" not in err
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before
