"""The pre-training token cache (pretrieve.data.pretrain_text): the chunking rule checked by hand, the same arrays
for one part or many and one process or two, memory-mapped, reused through the freshness contract; every text
source (plain text, JSONL, BEIR, datasets directories, hf: names) and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pretrieve.data import parallel
from pretrieve.data.pretrain_text import TextSource, TokenizedCorpus, iter_pretrain_texts, resolve_text_source
from pretrieve.errors import InputError


def words(i: int) -> str:
    return " ".join(f"w{(i * 7 + k) % 13}" for k in range(1 + (i * 5) % 23))


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("".join(f"{words(i)}\n" + ("\n" if i % 7 == 0 else "") for i in range(60)), encoding="utf-8")
    return path


def expected_chunks(tokenizer, texts, max_len: int, min_chunk: int) -> list[list[int]]:
    """The chunking rule written out: pieces of max_len-2 ids; a short trailing piece only if it is the whole text."""
    size, chunks = max_len - 2, []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), size):
            piece = ids[start:start + size]
            if start == 0 or len(piece) >= min_chunk:
                chunks.append(piece)
    return chunks


def chunks_of(corpus: TokenizedCorpus) -> list[list[int]]:
    return [corpus.tokens[corpus.offsets[i]:corpus.offsets[i + 1]].tolist() for i in range(len(corpus))]


def test_chunks_follow_the_rule_in_many_parts_memory_mapped(text_file, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "PART_BYTES", 300)
    corpus = TokenizedCorpus.build(text_file, tokenizer, 10, tmp_path / "cache", min_chunk=3, show_progress=False,
                                   num_proc=1)
    assert corpus.meta["parts"] > 3
    texts = [line.strip() for line in text_file.read_text().splitlines() if line.strip()]
    want = expected_chunks(tokenizer, texts, 10, 3)
    assert chunks_of(corpus) == want and corpus.meta["passages"] == 60
    assert isinstance(corpus.tokens, np.memmap) and isinstance(corpus.offsets, np.memmap)
    assert corpus.tokens.dtype == np.uint16 and corpus.offsets[0] == 0 and corpus.offsets[-1] == len(corpus.tokens)
    assert corpus[0]["input_ids"] == [tokenizer.cls_token_id, *want[0], tokenizer.sep_token_id]
    assert corpus.lengths().tolist() == [len(c) + 2 for c in want]


def test_two_processes_build_the_same_cache(text_file, tokenizer, tmp_path):
    one = TokenizedCorpus.build(text_file, tokenizer, 12, tmp_path / "one", show_progress=False, num_proc=1)
    two = TokenizedCorpus.build(text_file, tokenizer, 12, tmp_path / "two", show_progress=False, num_proc=2)
    assert two.meta["parts"] == 2
    assert np.array_equal(one.tokens, two.tokens) and np.array_equal(one.offsets, two.offsets)


def test_cache_is_reused_while_current(text_file, tokenizer, tmp_path):
    first = TokenizedCorpus.build(text_file, tokenizer, 16, tmp_path, show_progress=False)
    directory = Path(first.tokens.filename).parent
    stamp = (directory / "tokens.npy").stat().st_mtime_ns
    again = TokenizedCorpus.build(text_file, tokenizer, 16, tmp_path, show_progress=False)
    assert Path(again.tokens.filename).parent == directory and (directory / "tokens.npy").stat().st_mtime_ns == stamp
    other = TokenizedCorpus.build(text_file, tokenizer, 24, tmp_path, show_progress=False)
    assert Path(other.tokens.filename).parent != directory
    text_file.write_text("a brand new corpus\n", encoding="utf-8")
    rebuilt = TokenizedCorpus.build(text_file, tokenizer, 16, tmp_path, show_progress=False)
    assert len(rebuilt) == 1 and rebuilt.meta["passages"] == 1


def test_errors_name_the_line_in_a_later_part(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(parallel, "PART_BYTES", 100)
    path = tmp_path / "data.jsonl"
    rows = [json.dumps({"text": words(i)}) for i in range(30)]
    rows[22] = '{"text": "broken'
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        TokenizedCorpus.build(path, tokenizer, 16, tmp_path / "c", show_progress=False, num_proc=1)
    assert info.value.line == 23 and "invalid JSON" in str(info.value)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(InputError, match="contains no text"):
        TokenizedCorpus.build(empty, tokenizer, 16, tmp_path / "c", show_progress=False)
    with pytest.raises(InputError, match="not found"):
        TokenizedCorpus.build(tmp_path / "missing.txt", tokenizer, 16, tmp_path / "c", show_progress=False)


# -------------------------------------------------------------------------------------------------- sources
def test_file_sources(tmp_path):
    (tmp_path / "beir").mkdir()
    (tmp_path / "beir" / "corpus.jsonl").write_text(
        json.dumps({"_id": "1", "title": "T", "text": "body"}) + "\n" + json.dumps({"_id": "2", "text": "x"}) + "\n")
    (tmp_path / "d.jsonl").write_text(json.dumps({"title": "A", "text": "b"}) + "\n" + json.dumps({"text": "c"}))
    (tmp_path / "t.txt").write_text("one doc\n\n  two doc  \n")
    assert list(iter_pretrain_texts(tmp_path / "beir")) == ["T body", "x"]
    assert resolve_text_source(tmp_path / "beir").kind == "beir"
    assert list(iter_pretrain_texts(tmp_path / "d.jsonl")) == ["A b", "c"]
    assert list(iter_pretrain_texts(tmp_path / "t.txt")) == ["one doc", "two doc"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="neither a BEIR collection"):
        resolve_text_source(tmp_path / "empty")


def test_datasets_directories_and_hub_names(tmp_path, tokenizer, monkeypatch):
    import datasets

    rows = {"title": ["A", None, "C"], "text": ["alpha text", "beta text", "gamma text"], "id": ["1", "2", "3"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["t1", "t2"]}),
                          "other": datasets.Dataset.from_dict({"text": ["o1"]})}).save_to_disk(str(tmp_path / "dd"))
    assert list(iter_pretrain_texts(tmp_path / "single")) == ["A alpha text", "beta text", "C gamma text"]
    assert list(iter_pretrain_texts(tmp_path / "dd")) == ["t1", "t2"]
    assert list(iter_pretrain_texts(f"{tmp_path / 'dd'}@other")) == ["o1"]
    with pytest.raises(InputError, match="no split 'nope'"):
        list(iter_pretrain_texts(f"{tmp_path / 'dd'}@nope"))
    corpus = TokenizedCorpus.build(tmp_path / "single", tokenizer, 16, tmp_path / "cache", show_progress=False)
    assert chunks_of(corpus) == expected_chunks(tokenizer, ["A alpha text", "beta text", "C gamma text"], 16, 8)

    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.load_from_disk(str(tmp_path / "single"))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    source = resolve_text_source("hf:wikimedia/wikipedia:20231101.en")
    assert source == TextSource("datasets", name="wikimedia/wikipedia", config="20231101.en")
    hub = TokenizedCorpus.build(source, tokenizer, 16, tmp_path / "cache", show_progress=False)
    assert chunks_of(hub) == chunks_of(corpus) and calls[0] == ("wikimedia/wikipedia", "20231101.en", "train")
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "notext"))
    with pytest.raises(InputError, match="no 'text' column"):
        TokenizedCorpus.build(tmp_path / "notext", tokenizer, 16, tmp_path / "cache", show_progress=False)


def test_an_arrow_corpus_directory_is_a_source(tmp_path):
    from pretrieve.data.arrow import corpus_dataset, dataset_directory

    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"_id": "1", "title": "T", "text": "body"}) + "\n")
    directory = dataset_directory(corpus_dataset(path))
    assert list(iter_pretrain_texts(directory)) == list(iter_pretrain_texts(path)) == ["T body"]
