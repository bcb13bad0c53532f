"""Packing pre-training text (pretrieve.data.packing): the rule by hand, whole sentences, documents never crossed
unless asked, the authors' short_seq_prob, the same examples for one build process or two, and the packed share of
real text on a BookCorpus-like stream (the run that resumes mid-epoch is in tests/test_pretrain.py)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from pretrieve.data import parallel
from pretrieve.data.packing import Packer, Packing, document_key, split_sentences, uniform
from pretrieve.data.pretrain_text import TokenizedCorpus
from pretrieve.errors import InputError


def ids(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def test_the_rule_by_hand():
    packer = Packer(budget=10)
    a, b, c, d, e = ids(4, 100), ids(4, 200), ids(4, 300), ids(12, 400), ids(3, 500)
    blocks = packer.add_document([a, b, c, d, e], key=1)
    # a+b fit (8); c would make 12 > 10 → new block; d (12 > budget) → a piece of 10, its 2 left start a block + e
    assert blocks == [a + b, c, d[:10], d[10:] + e]
    assert packer.finish() == []


def test_documents_are_not_crossed_unless_asked_and_an_empty_one_ends_the_run():
    first, second = [ids(3, 10), ids(3, 20)], [ids(3, 30)]
    within = Packer(budget=10)
    assert within.add_document(first, 1) == [ids(3, 10) + ids(3, 20)]
    assert within.add_document(second, 2) == [ids(3, 30)]
    across = Packer(budget=10, across=True)
    assert across.add_document(first, 1) == []
    assert across.add_document(second, 2) == []            # 9 tokens still open
    assert across.add_document([], 3) == [ids(3, 10) + ids(3, 20) + ids(3, 30)]   # a blank line ends the run
    assert across.add_document([ids(2, 40)], 4) == [] and across.finish() == [ids(2, 40)]


def test_short_targets_follow_short_seq_prob_and_are_deterministic():
    budget, p = 100, 0.15
    targets = []
    for key in range(4000):
        packer = Packer(budget, short_seq_prob=p, across=True)   # across: the block (and its target) stays open
        packer.add_document([[1]], key)
        targets.append(packer.target)
    short = [t for t in targets if t < budget]
    # a short target is uniform in [3, budget]; it equals budget with probability 1/98, so the share is ~p
    assert abs(len(short) / len(targets) - p) < 0.025
    assert min(short) >= 3 and max(targets) == budget
    assert len(set(short)) > 60                              # spread over [3, 99]
    again = Packer(budget, short_seq_prob=p, across=True)
    again.add_document([[1]], 7)
    assert again.target == targets[7]
    assert 0 <= uniform(2**64 - 1, 10**9) < 1


def test_sentences_keep_abbreviations():
    text = "Dr. Smith arrived at 3 p.m. on Jan. 5. He stayed, e.g. at the U.S. Capitol! Did he? Yes."
    assert split_sentences(text) == ["Dr. Smith arrived at 3 p.m. on Jan. 5.", "He stayed, e.g. at the U.S. Capitol!",
                                     "Did he?", "Yes."]
    assert split_sentences("  ") == []


def book(i: int, rng: random.Random) -> list[str]:
    words = "the a man woman door house walked looked said quiet night morning back away".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))).capitalize() + "."
            for _ in range(rng.randint(30, 80))]


@pytest.fixture
def books(tmp_path) -> tuple[Path, list[list[str]]]:
    """BERT's format: one sentence per line, a blank line between books."""
    rng = random.Random(0)
    texts = [book(i, rng) for i in range(40)]
    path = tmp_path / "books.txt"
    path.write_text("\n\n".join("\n".join(sentences) for sentences in texts) + "\n", encoding="utf-8")
    return path, texts


def examples(corpus: TokenizedCorpus) -> list[list[int]]:
    return [corpus.tokens[corpus.offsets[i]:corpus.offsets[i + 1]].tolist() for i in range(len(corpus))]


def test_packed_books_keep_whole_sentences_of_one_book(books, tokenizer, tmp_path, monkeypatch):
    path, texts = books
    monkeypatch.setattr(parallel, "PART_BYTES", 2000)   # many parts: a part's end ends a run too
    packing = Packing(short_seq_prob=0.1, across=(str(path),))
    one = TokenizedCorpus.build(path, tokenizer, 64, tmp_path / "one", show_progress=False, num_proc=1,
                                packing=packing)
    two = TokenizedCorpus.build(path, tokenizer, 64, tmp_path / "two", show_progress=False, num_proc=2,
                                packing=packing)
    assert np.array_equal(one.tokens, two.tokens) and np.array_equal(one.offsets, two.offsets)
    assert one.meta["packing"]["across"] == [str(path)] and one.meta["passages"] == sum(map(len, texts))
    encoded = [[tokenizer(s, add_special_tokens=False)["input_ids"] for s in sentences] for sentences in texts]
    where = {}   # each sentence's ids → the books that hold it
    for b, sentences in enumerate(encoded):
        for sentence in sentences:
            where.setdefault(tuple(sentence), set()).add(b)
    for example in examples(one):
        assert 0 < len(example) <= 62
        # the example is a concatenation of whole sentences of one book, in order
        for b, sentences in enumerate(encoded):
            flat = [s for s in sentences]
            for start in range(len(flat)):
                run, end = [], start
                while len(run) < len(example) and end < len(flat):
                    run += flat[end]
                    end += 1
                if run == example:
                    break
            else:
                continue
            break
        else:
            pytest.fail(f"example is not whole consecutive sentences of one book: {example[:12]}...")
    # every token of the books is in one example, none twice (no text lost)
    assert len(one.tokens) == sum(len(s) for sentences in encoded for s in sentences)


def test_a_document_is_split_into_sentences_and_packed_within_itself(tokenizer, tmp_path):
    path = tmp_path / "articles.jsonl"
    path.write_text('{"text": "One two three. Four five six."}\n{"text": "Seven eight. Nine."}\n', encoding="utf-8")
    corpus = TokenizedCorpus.build(path, tokenizer, 16, tmp_path / "c", show_progress=False, num_proc=1,
                                   packing=Packing())
    decoded = [tokenizer.decode(example) for example in examples(corpus)]
    assert decoded == ["one two three. four five six.", "seven eight. nine."]
    unpacked = TokenizedCorpus.build(path, tokenizer, 16, tmp_path / "c", show_progress=False, num_proc=1)
    assert len(unpacked) == 2 and unpacked.meta["packing"] is None   # a cache of its own


def test_pack_across_must_name_a_source(tokenizer, tmp_path, books):
    path, _ = books
    with pytest.raises(InputError, match="pack_across names .*other.txt"):
        other = tmp_path / "other.txt"
        other.write_text("x\n")
        TokenizedCorpus.build(path, tokenizer, 64, tmp_path / "c", show_progress=False, num_proc=1,
                              packing=Packing(across=(str(other),)))


def real_share(corpus: TokenizedCorpus, micro_batch: int, seed: int = 0) -> float:
    """Real-text tokens over computed tokens when shuffled examples are padded to their micro-batch's longest."""
    lengths = corpus.lengths()[np.random.default_rng(seed).permutation(len(corpus))]
    usable = len(lengths) // micro_batch * micro_batch
    batches = lengths[:usable].reshape(-1, micro_batch)
    return float(batches.sum() / (batches.max(axis=1) * micro_batch).sum())


def test_packed_books_are_almost_all_text(books, tokenizer, tmp_path):
    """The issue's bar on a BookCorpus-like stream: rows of single sentences of consecutive books, no boundaries
    (as the hub's bookcorpus), padded to the micro-batch's longest example."""
    _, texts = books
    path = tmp_path / "bookcorpus.txt"
    path.write_text("".join(sentence + "\n" for sentences in texts for sentence in sentences), encoding="utf-8")
    unpacked = TokenizedCorpus.build(path, tokenizer, 256, tmp_path / "u", show_progress=False, num_proc=1)
    packed = TokenizedCorpus.build(path, tokenizer, 256, tmp_path / "p", show_progress=False, num_proc=1,
                                   packing=Packing(across=(str(path),)))
    assert real_share(packed, 8) >= 0.95 > 0.8 > real_share(unpacked, 8)
    assert document_key("a") != document_key("b")


def test_bench_packing_measures_both_arms(tokenizer, tmp_path):
    from pretrieve.bench.pretrain_speed import (PretrainBenchSettings, bench_packing, bookcorpus_like,
                                                packing_markdown, parse_shape)

    stream = bookcorpus_like(tmp_path / "books.txt", books=8)
    lines = stream.read_text().splitlines()
    assert len(lines) >= 8 * 40 and all(4 <= len(line.split()) <= 18 for line in lines)
    settings = PretrainBenchSettings(presets=("mlm",), batch_size=4, max_len=64, steps=2, warmup=1)
    result = bench_packing(parse_shape("L2-H128").config(len(tokenizer), 64), tokenizer, stream, tmp_path / "c",
                           settings)
    unpacked, packed = result.arms["unpacked"], result.arms["packed"]
    assert packed["examples"] < unpacked["examples"] / 3
    assert packed["real_text_share"] > 0.85 > unpacked["real_text_share"]
    assert packed["real_tokens_per_s"] > 0 and unpacked["real_tokens_per_s"] > 0
    assert "packed / unpacked" in packing_markdown(result)


def test_a_hub_corpus_of_sentence_rows_packs_across_rows_beside_an_article_source(tmp_path, tokenizer, monkeypatch):
    """The recipes' phase 1: Wikipedia articles packed within themselves, BookCorpus's rows (hf:) across rows."""
    import datasets

    rows = ["The door opened.", "She looked back.", "Nobody was there.", "", "Night fell."]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "book"))
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None:
                        datasets.load_from_disk(str(tmp_path / "book")))
    articles = tmp_path / "wiki.jsonl"
    articles.write_text('{"title": "Tides", "text": "Tides rise. Tides fall."}\n{"text": "Moons pull."}\n')
    corpus = TokenizedCorpus.build([str(articles), "hf:bookcorpus/bookcorpus"], tokenizer, 64, tmp_path / "c",
                                   show_progress=False, num_proc=2,
                                   packing=Packing(across=("hf:bookcorpus/bookcorpus",)))
    decoded = [tokenizer.decode(example) for example in examples(corpus)]
    # the articles stay apart; the book's rows run together until its empty row
    assert decoded == ["tides tides rise. tides fall.", "moons pull.",
                       "the door opened. she looked back. nobody was there.", "night fell."]
    assert [source["passages"] for source in corpus.meta["sources"]] == [2, 4]


def test_bad_packing_settings_are_one_line_errors(tmp_path):
    from pretrieve.errors import ConfigError
    from pretrieve.train.pretrainer import PretrainConfig

    base = dict(model="m", corpus=str(tmp_path), out=str(tmp_path / "o"))
    with pytest.raises(ConfigError, match=r"short_seq_prob must be in \[0, 1\), got 1.5"):
        PretrainConfig(**base, pack=True, short_seq_prob=1.5).validate()
    with pytest.raises(ConfigError, match="set pack: true"):
        PretrainConfig(**base, pack_across=["x"]).validate()
    with pytest.raises(ConfigError, match="contextual methods pack their own spans"):
        from pretrieve.train.method import resolve_method

        PretrainConfig(**base, pack=True, method=resolve_method("cotmae")).validate()
    assert PretrainConfig(**base, pack=True, pack_across=["x"], short_seq_prob=0.15).packing() == \
        Packing(0.15, ("x",))
