"""PMI/AMI statistics and importance-aware masking (CDMAE, paper 003 §3.2): brute force vs the fast path,
streaming counts, caching, the maskers' selection rules, the method/collator wiring, and the SciFact analysis."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from pretrieve.errors import ConfigError, InputError
from pretrieve.masking import RandomMasker, VocabInfo, masking_latency
from pretrieve.masking.pmi import (ImportanceMasker, NgramStatistics, check_pmi_params, corpus_statistics,
                                   count_ngrams, hash_base, importance_enhanced_mask, resolve_statistics,
                                   statistics_from_sequences)

WINDOW = 4


# ---------------------------------------------------------------------- brute force (plain Python loops)
def toy_corpus(seed: int = 0, vocab: int = 12) -> list[list[int]]:
    rng = random.Random(seed)
    choices = [1, 2, 3, 3, 4, 5, 5, 5, 6, 7, 8, 9, 10]  # skewed, so many n-grams repeat
    return [[rng.choice(choices) for _ in range(rng.randint(1, 15))] for _ in range(40)]


def brute_counts(corpus: list[list[int]]) -> tuple[dict[tuple[int, ...], int], list[int]]:
    counts: dict[tuple[int, ...], int] = {}
    totals = [0] * (WINDOW + 1)
    for seq in corpus:
        for n in range(1, WINDOW + 1):
            for i in range(len(seq) - n + 1):
                gram = tuple(seq[i:i + n])
                counts[gram] = counts.get(gram, 0) + 1
                totals[n] += 1
    return counts, totals


def brute_pmi(gram, counts, totals) -> float:
    """log p(w1..wn) - Σ log p(wi), counts floored at 1 (the documented smoothing for unseen n-grams)."""
    joint = math.log(max(counts.get(tuple(gram), 0), 1) / totals[len(gram)])
    return joint - sum(math.log(max(counts.get((w,), 0), 1) / totals[1]) for w in gram)


def brute_ami(seq, i, counts, totals) -> float:
    """Eq. 8: mean PMI of the n-grams (2 ≤ n ≤ L) ending at i + mean PMI of those starting at i."""
    left = [brute_pmi(seq[i - j:i + 1], counts, totals) for j in range(1, WINDOW) if i - j >= 0]
    right = [brute_pmi(seq[i:i + j + 1], counts, totals) for j in range(1, WINDOW) if i + j < len(seq)]
    return (sum(left) / len(left) if left else 0.0) + (sum(right) / len(right) if right else 0.0)


def padded_batch(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """[special, seq..., special, pad...] rows (id 0 plays [CLS]/[SEP]/[PAD]); valid = the sequence tokens."""
    length = max(len(s) for s in sequences) + 3
    ids = np.zeros((len(sequences), length), dtype=np.int64)
    valid = np.zeros_like(ids, dtype=bool)
    for row, seq in enumerate(sequences):
        ids[row, 1:1 + len(seq)] = seq
        valid[row, 1:1 + len(seq)] = True
    return ids, valid


@pytest.mark.parametrize("vocab_size", [12, 1 << 20], ids=["exact-keys", "hashed-keys"])
def test_pmi_and_ami_match_brute_force(vocab_size):
    corpus = toy_corpus()
    counts, totals = brute_counts(corpus)
    stats = statistics_from_sequences(corpus, vocab_size, WINDOW, block_tokens=7)  # many blocks and merges
    assert stats.exact == (vocab_size == 12)
    assert stats.totals.tolist() == [0, *totals[1:]]
    for gram, count in counts.items():
        assert stats.ngram_count(gram) == max(count, 1) if len(gram) > 1 else count
        assert stats.pmi(gram) == pytest.approx(brute_pmi(gram, counts, totals), abs=1e-9)
    # only n-grams seen at least twice are stored; a miss reads as count 1
    assert stats.keys.size == sum(1 for g, c in counts.items() if len(g) > 1 and c >= 2)

    unseen = [11, 11, 2, 9, 1, 11]  # n-grams that never occur in the corpus, and an unseen token
    batch = corpus[:10] + [unseen]
    ids, valid = padded_batch(batch)
    got = stats.token_importance(ids, valid)
    for row, seq in enumerate(batch):
        expected = [brute_ami(seq, i, counts, totals) for i in range(len(seq))]
        assert got[row, 1:1 + len(seq)] == pytest.approx(expected, abs=2e-5)
    assert (got[~valid] == 0).all()


def test_counts_do_not_depend_on_blocks_and_never_cross_chunks():
    corpus = toy_corpus(seed=1)
    one = statistics_from_sequences(corpus, 12, WINDOW, block_tokens=1 << 20)
    many = statistics_from_sequences(corpus, 12, WINDOW, block_tokens=3)
    for name in ("keys", "counts", "unigram_counts", "totals", "doc_freq"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    split = statistics_from_sequences([[1, 2], [3, 4], [1, 2]], 8, WINDOW)
    assert split.ngram_count([1, 2]) == 2 and split.keys.size == 1  # (2, 3) spans two chunks: never counted
    assert split.totals.tolist() == [0, 6, 3, 0, 0]
    assert split.doc_freq[1] == 2 and split.num_docs == 3
    assert split.idf()[1] == pytest.approx(math.log(4 / 3)) and split.idf()[7] == pytest.approx(math.log(4))


def test_exact_keys_for_bert_vocabulary_hashed_beyond():
    assert hash_base(30522, 4) == (1 << 15, True)
    base, exact = hash_base(250_002, 4)  # XLM-R: 18 bits × 4 > 64
    assert not exact and base % 2 == 1


def test_bad_corpus_arrays_and_params():
    with pytest.raises(InputError, match="offsets"):
        count_ngrams(np.array([1, 2, 3]), np.array([1, 3]), 8)
    with pytest.raises(InputError, match="only 3 tokens"):
        count_ngrams(np.array([1, 2, 3]), np.array([0, 5]), 8)
    with pytest.raises(ConfigError, match="window"):
        count_ngrams(np.array([1, 2, 3]), np.array([0, 3]), 8, window=1)
    stats = statistics_from_sequences([[1, 2, 3]], 8, WINDOW)
    with pytest.raises(InputError, match=r"\[0, 8\)"):
        stats.token_importance(np.array([[1, 9]]), np.ones((1, 2), dtype=bool))
    assert check_pmi_params({}) == {"window": 4, "sigma": 1.0, "whole_word": False, "statistics": None}
    for bad, match in [({"window": 1}, "window"), ({"sigma": -1}, "sigma"), ({"whole_word": "yes"}, "whole_word"),
                       ({"statistics": 3}, "statistics"), ({"L": 4}, "unknown parameter")]:
        with pytest.raises(ConfigError, match=match):
            check_pmi_params(bad)


def test_save_load_and_corpus_cache(tokenizer, tmp_path):
    from pretrieve.data.pretrain_text import TokenizedCorpus

    text = tmp_path / "passages.txt"
    text.write_text("the cat sat on the mat\nthe cat ate the rat\na dog sat on the log\n")
    corpus = TokenizedCorpus.build(text, tokenizer, 32, tmp_path / "cache", show_progress=False)
    stats = corpus_statistics(corpus, len(tokenizer), WINDOW)
    from pathlib import Path

    cached = tmp_path / "cache" / (Path(corpus.tokens.filename).parent.name + "-pmi-L4")
    assert NgramStatistics.is_saved(cached)
    loaded = NgramStatistics.load(cached)
    for name in ("keys", "counts", "unigram_counts", "totals", "doc_freq"):
        assert np.array_equal(getattr(stats, name), getattr(loaded, name))
    the_cat = tokenizer.convert_tokens_to_ids(["the", "cat"])
    assert loaded.ngram_count(the_cat) == 2 and loaded.summary()["stored_per_order"] == {2: 3, 3: 1, 4: 0}
    assert resolve_statistics(cached, window=4, vocab_size=len(tokenizer)).keys.size == stats.keys.size
    assert resolve_statistics(text, window=4, vocab_size=len(tokenizer), tokenizer=tokenizer, max_len=32,
                              cache_dir=tmp_path / "other").keys.size == stats.keys.size
    with pytest.raises(ConfigError, match="window 4"):
        resolve_statistics(cached, window=3, vocab_size=len(tokenizer))
    with pytest.raises(ConfigError, match="vocabulary"):
        resolve_statistics(cached, window=4, vocab_size=100)


# ---------------------------------------------------------------------- maskers
@pytest.fixture(scope="module")
def info(tokenizer) -> VocabInfo:
    return VocabInfo.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def text_batch(tokenizer):
    texts = ["the protein kinase regulates the cell cycle in yeast cells",
             "dense retrieval maps queries and passages to vectors",
             "a b"]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


@pytest.fixture(scope="module")
def text_stats(tokenizer, text_batch):
    ids, attention = text_batch
    rows = [row[(mask == 1) & (row != tokenizer.cls_token_id) & (row != tokenizer.sep_token_id)].tolist()
            for row, mask in zip(ids, attention)]
    return statistics_from_sequences(rows * 3, len(tokenizer), WINDOW)


def test_importance_masker_masks_the_top_tokens_with_the_random_maskers_budget(info, text_batch, text_stats):
    ids, attention = text_batch
    masker = ImportanceMasker(info, 0.3, text_stats, sigma=0.0)
    importance = masker.importance(ids, attention)
    special = info.is_special[ids] | ~attention.bool()
    assert (importance[special] == 0).all() and (importance[~special] != 0).any()
    out = masker(ids, attention, torch.Generator().manual_seed(0))
    reference = RandomMasker(info, 0.3, whole_word=False)(ids, attention, torch.Generator().manual_seed(0))
    assert torch.equal(out.mask.sum(dim=1), reference.mask.sum(dim=1))   # same budget, different choice
    assert not (out.mask & special).any()
    for row in range(ids.shape[0]):
        k = int(out.mask[row].sum())
        scores = importance[row].masked_fill(special[row], -math.inf)
        assert set(out.mask[row].nonzero().flatten().tolist()) == set(scores.topk(k).indices.tolist())
    assert torch.equal(out.labels[out.mask], ids[out.mask])


def test_noise_keeps_randomness_but_favours_important_tokens(info):
    ids = torch.full((400, 12), 2000)
    ids[:, 0], ids[:, -1] = 101, 102
    attention = torch.ones_like(ids)
    importance = torch.linspace(0, 6, 12).repeat(400, 1)                 # σ = 1 noise vs a gap of 0.55 per token
    masker = ImportanceMasker(info, 0.2, statistics_from_sequences([[1]], info.vocab_size, WINDOW), sigma=1.0)
    generator = torch.Generator().manual_seed(0)
    rate = masker(ids, attention, generator, importance=importance).mask.float().mean(dim=0)[1:-1]
    assert rate[-1] > 0.6 and rate[:3].max() < 0.01 and (rate[1:] >= rate[:-1] - 0.05).all()
    assert rate.sum() == pytest.approx(2.0)                                  # round(0.2 · 10) tokens per row
    again = masker(ids, attention, torch.Generator().manual_seed(0), importance=importance)
    assert torch.equal(again.mask, masker(ids, attention, torch.Generator().manual_seed(0),
                                          importance=importance).mask)


def test_importance_enhanced_mask_structure_and_choice(info):
    attention = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    importance = torch.tensor([[0.0, 5, 1, 4, 2, 3, 0.5, 0.0], [0.0, 1, 9, 2, 0.0, 0, 0, 0]])
    visible = importance_enhanced_mask(attention, importance, visible_ratio=0.5, sigma=0.0)
    from pretrieve.masking.enhanced import visible_per_row

    counts = visible_per_row(attention.sum(dim=1), visible_ratio=0.5)
    for b in range(2):
        n = int(attention[b].sum())
        for i in range(n):
            assert int(visible[b, i].sum()) == counts[b] and not visible[b, i, i]
            assert not visible[b, i, n:].any()
            if i:
                assert visible[b, i, 0]
        assert not visible[b, n:].any()
    # σ = 0: row 3 of the first text sees column 0 plus the 2 least important others (7 and 6), never 1 or 5
    assert visible[0, 3].nonzero().flatten().tolist() == [0, 6, 7]
    noisy = importance_enhanced_mask(attention.repeat(200, 1), importance.repeat(200, 1), 0.5, sigma=1.0,
                                     generator=torch.Generator().manual_seed(0))
    seen = noisy[0::2, 2:].float().mean(dim=(0, 1))  # how often rows 2.. of text 0 see each column
    assert seen[1] < seen[6] and seen[3] < seen[2]


def test_masking_latency_reports_pmi(tokenizer):
    texts = ["the cat sat on the mat", "dense retrieval of passages with a masked auto encoder"]
    result = masking_latency(tokenizer, texts, batch_size=4, max_len=16, repeats=2, kinds=("random", "pmi"))
    assert set(result) == {"random", "pmi"} and all(v > 0 for v in result.values())


# ---------------------------------------------------------------------- method and collator wiring
def test_pmi_masker_in_methods(tmp_path):
    from pretrieve.train.method import MaskerSpec, MethodConfig, load_method_file, preset, resolve_method

    cdmae = preset("cdmae")
    assert cdmae.decoder_masker == MaskerSpec(kind="pmi", ratio=0.5, params={"window": 4, "sigma": 1.0,
                                                                             "whole_word": False,
                                                                             "statistics": None})
    assert MethodConfig.from_dict(cdmae.to_dict()) == cdmae
    assert "params" not in preset("retromae").to_dict()["decoder_masker"]  # other kinds serialise as before
    combined = resolve_method(objectives="mlm,enhanced", decoder_masker="pmi", decoder_mask=0.4)
    assert combined.decoder_masker.kind == "pmi" and combined.decoder_masker.params["window"] == 4
    assert resolve_method("cdmae", decoder_masker="wwm").decoder_masker.params == {}
    path = tmp_path / "m.yaml"
    path.write_text("base: cdmae\ndecoder_masker: {params: {sigma: 0.5, statistics: /some/dir}}\n")
    loaded = load_method_file(path)
    assert loaded.decoder_masker.params == {"window": 4, "sigma": 0.5, "whole_word": False,
                                            "statistics": "/some/dir"}
    path.write_text("base: cdmae\ndecoder_masker: {kind: token}\n")
    assert load_method_file(path).decoder_masker == MaskerSpec(kind="token", ratio=0.5)
    path.write_text("base: retromae\ndecoder_masker: {kind: wwm, params: {window: 3}}\n")
    with pytest.raises(ConfigError, match="takes no params"):
        load_method_file(path)
    path.write_text("base: cdmae\ndecoder_masker: {params: {window: 9}}\n")
    with pytest.raises(ConfigError, match="window"):
        load_method_file(path)


def test_collator_builds_pmi_maskers_from_the_corpus_or_a_path(tokenizer, text_stats, tmp_path):
    from pretrieve.train.collator import PretrainCollator
    from pretrieve.train.method import apply_overrides, preset, resolve_method

    examples = [{"input_ids": tokenizer(t)["input_ids"]} for t in ["the cell cycle in yeast", "dense vectors"]]
    with pytest.raises(ConfigError, match="corpus=..."):
        PretrainCollator(tokenizer, preset("cdmae"), max_len=32)
    collator = PretrainCollator(tokenizer, preset("cdmae"), max_len=32, corpus=text_stats)
    assert isinstance(collator.decoder_masker, ImportanceMasker) and collator.decoder_masker.ratio == 0.5
    batch = collator(examples)
    assert {"decoder_input_ids", "decoder_labels"} <= set(batch)
    text_stats.save(tmp_path / "stats")
    method = apply_overrides(preset("cdmae"))
    from dataclasses import replace

    method = replace(method, decoder_masker=replace(method.decoder_masker,
                                                    params={"statistics": str(tmp_path / "stats")}))
    from_path = PretrainCollator(tokenizer, method, max_len=32, seed=0)(examples)
    again = PretrainCollator(tokenizer, preset("cdmae"), max_len=32, seed=0, corpus=text_stats)(examples)
    assert all(torch.equal(from_path[k], again[k]) for k in from_path)
    enhanced = PretrainCollator(tokenizer, resolve_method(objectives="mlm,enhanced", decoder_masker="pmi"),
                                max_len=32, corpus=text_stats)(examples)
    assert enhanced["enhanced_mask"].shape == (2, batch["input_ids"].shape[1], batch["input_ids"].shape[1])


# ---------------------------------------------------------------------- SciFact
def test_scifact_statistics_and_masked_stopword_share(scifact, tokenizer, tmp_path):
    from pretrieve.analysis.masking_stats import compare_maskers
    from pretrieve.data.pretrain_text import TokenizedCorpus

    corpus = TokenizedCorpus.build(scifact, tokenizer, 144, tmp_path, show_progress=False)
    stats = corpus_statistics(corpus, len(tokenizer), WINDOW)
    assert stats.totals[1] > 1_500_000 and stats.num_docs == len(corpus)
    result = compare_maskers(corpus, tokenizer, stats, ratio=0.15, max_examples=3000)
    random_share, pmi_share = result["random"].uninformative_share, result["pmi"].uninformative_share
    assert result["random"].masked_tokens == result["pmi"].masked_tokens
    assert 0.25 < random_share < 0.5          # paper 003: ~40 % on MS MARCO
    assert pmi_share < random_share / 3
    assert {t for t, _, _ in result["random"].top_terms[:5]} & {".", ",", "the", "of", "and"}
