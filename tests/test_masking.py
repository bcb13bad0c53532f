"""Tests of pretrieve.masking: vocabulary lookups, word segmentation, random masking, enhanced-decoding masks."""

from __future__ import annotations

import random

import pytest
import torch

from pretrieve.errors import ConfigError, InputError
from pretrieve.masking import (
    IGNORE_INDEX,
    RandomMasker,
    VocabInfo,
    enhanced_decoding_mask,
    masking_budget,
    masking_latency,
    to_additive_mask,
    visible_per_row,
    word_ids,
)
from pretrieve.masking.enhanced import _eligible, _keep_smallest

SCIENCE_SENTENCES = [
    "Mitochondrial dysfunction contributes to neurodegeneration in Parkinson's disease.",
    "Randomized controlled trials showed no significant reduction in cardiovascular mortality.",
    "The immunohistochemical analysis revealed overexpression of p53 in tumour biopsies.",
    "Hypermethylation of promoter regions silences tumour-suppressor genes.",
    "Antiretroviral therapy reduces the transmission of HIV-1 between serodiscordant couples.",
    "Single-cell RNA sequencing characterizes heterogeneity among haematopoietic progenitors.",
    "Vitamin D supplementation did not prevent fractures in community-dwelling adults.",
    "Microglial activation precedes amyloid plaque deposition in transgenic mice.",
    "Bioinformatics pipelines quantified differential expression across 1,024 samples.",
    "Phosphorylation of tau by GSK3beta impairs axonal transport.",
    "Statins lower low-density lipoprotein cholesterol by inhibiting HMG-CoA reductase.",
    "Chronic inflammation is associated with insulin resistance and type 2 diabetes.",
]


def science_texts(count: int, seed: int = 0) -> list[str]:
    """SciFact-like abstracts of varied length, built from fixed sentences."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(SCIENCE_SENTENCES, k=rng.randint(1, 9))) for _ in range(count)]


@pytest.fixture(scope="module")
def info(tokenizer) -> VocabInfo:
    return VocabInfo.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def batch(tokenizer):
    """64 x 128 real-tokenized batch with varied lengths (so there is padding)."""
    encoded = tokenizer(science_texts(64), truncation=True, max_length=128, padding="max_length",
                        return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def maskable_positions(input_ids, attention_mask, info):
    return attention_mask.bool() & ~info.is_special[input_ids]


# --------------------------------------------------------------------------- vocabulary and words


def test_vocab_info_wordpiece(tokenizer, info):
    assert info.vocab_size == 30522
    assert info.mask_token_id == tokenizer.mask_token_id and info.pad_token_id == tokenizer.pad_token_id
    assert set(info.special_ids.tolist()) == {0, 100, 101, 102, 103}
    assert info.is_special[[0, 100, 101, 102, 103]].all() and int(info.is_special.sum()) == 5
    assert not torch.isin(info.replacement_ids, info.special_ids).any()
    assert info.replacement_ids.numel() == 30522 - 5
    ids = tokenizer.convert_tokens_to_ids(["##s", "##ing", "the", "bio", "[CLS]"])
    assert info.is_continuation[ids].tolist() == [True, True, False, False, False]


def test_word_ids_hand_example(tokenizer, info):
    tokens = ["[CLS]", "the", "una", "##ffa", "##ble", "bio", "##in", "##form", "##atics", "paradigm", ",",
              "hello", "!", "[SEP]"]
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokens)])
    assert word_ids(ids, info).tolist() == [[-1, 0, 1, 1, 1, 2, 2, 2, 2, 3, 4, 5, 6, -1]]


def test_word_ids_continuation_after_special_starts_a_word_and_padding_is_minus_one(tokenizer, info):
    tokens = [["[CLS]", "##ffa", "##ble", "the", "[SEP]", "##s", "[PAD]", "[PAD]"],
              ["[CLS]", "hello", "##s", "[SEP]", "[PAD]", "[PAD]", "[PAD]", "[PAD]"]]
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(row) for row in tokens])
    assert word_ids(ids, info).tolist() == [[-1, 0, 0, 1, -1, 2, -1, -1],
                                            [-1, 0, 0, -1, -1, -1, -1, -1]]
    # attention_mask marks extra padding even when the id is not the pad id
    attention = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1] * 8])
    assert word_ids(ids, info, attention)[0].tolist() == [-1, 0, 0, -1, -1, -1, -1, -1]


def test_word_ids_match_the_tokenizers_own_words(tokenizer, info):
    texts = science_texts(8, seed=3)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    ours = word_ids(encoded["input_ids"], info)
    for row, text in enumerate(texts):
        tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][row])
        words: dict[int, str] = {}
        for token, word in zip(tokens, ours[row].tolist()):
            if word >= 0:
                words[word] = words.get(word, "") + token.removeprefix("##")
        # WordPiece words are the basic-tokenizer words: whitespace and punctuation split
        expected = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.backend_tokenizer
                                                                              .normalizer.normalize_str(text))
        assert [words[i] for i in range(len(words))] == [piece for piece, _ in expected]


def test_out_of_vocabulary_ids_and_bad_shapes_are_input_errors(info):
    masker = RandomMasker(info, 0.15)
    with pytest.raises(InputError):
        masker(torch.tensor([[101, 40000, 102]]), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(InputError):
        masker(torch.tensor([101, 2000, 102]), torch.ones(3, dtype=torch.long))
    with pytest.raises(InputError):
        masker(torch.tensor([[101, 2000, 102]]), torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(InputError):
        masker(torch.tensor([[101, 2000, 102]]), torch.ones(1, 3), importance=torch.ones(1, 2))


# --------------------------------------------------------------------------- random masking


@pytest.mark.parametrize("ratio", [0.15, 0.3])
def test_token_mode_masks_exactly_the_budget(batch, info, ratio):
    input_ids, attention_mask = batch
    out = RandomMasker(info, ratio, whole_word=False)(input_ids, attention_mask, seeded(0))
    maskable = maskable_positions(input_ids, attention_mask, info)
    n = maskable.sum(dim=1)
    expected = torch.tensor([max(1, round(ratio * int(count))) for count in n])
    assert torch.equal(out.mask.sum(dim=1), expected)
    assert not (out.mask & ~maskable).any()


@pytest.mark.parametrize("ratio", [0.15, 0.3, 0.5])
def test_whole_word_ratio_within_tolerance(batch, info, ratio):
    input_ids, attention_mask = batch
    out = RandomMasker(info, ratio)(input_ids, attention_mask, seeded(1))
    maskable = maskable_positions(input_ids, attention_mask, info)
    achieved = out.mask.sum().item() / maskable.sum().item()
    assert ratio - 0.02 <= achieved <= ratio + 0.01
    # per sequence: within budget unless the first drawn word alone exceeds it
    budget = masking_budget(maskable.sum(dim=1), ratio)
    words = word_ids(input_ids, info, attention_mask)
    longest_word = torch.stack([torch.bincount(row[row >= 0]).max() for row in words])
    assert (out.mask.sum(dim=1) <= torch.maximum(budget, longest_word)).all()


def test_whole_words_are_masked_entirely(batch, info):
    input_ids, attention_mask = batch
    words = word_ids(input_ids, info, attention_mask)
    for seed in range(5):
        out = RandomMasker(info, 0.3)(input_ids, attention_mask, seeded(seed))
        slot = torch.where(words >= 0, words, words.shape[1])
        masked_per_word = torch.zeros(words.shape[0], words.shape[1] + 1).scatter_add_(1, slot, out.mask.float())
        size_per_word = torch.zeros_like(masked_per_word).scatter_add_(1, slot, torch.ones_like(out.mask.float()))
        partial = (masked_per_word > 0) & (masked_per_word < size_per_word)
        assert not partial[:, :-1].any()
    longest_word = torch.stack([torch.bincount(row[row >= 0]).max() for row in words])
    assert (longest_word > 1).sum() >= 60  # the batch really has '##' words


@pytest.mark.parametrize("whole_word", [True, False])
def test_specials_and_padding_never_masked_and_every_sequence_gets_one(batch, info, whole_word):
    input_ids, attention_mask = batch
    out = RandomMasker(info, 0.01, whole_word=whole_word)(input_ids, attention_mask, seeded(2))
    maskable = maskable_positions(input_ids, attention_mask, info)
    assert not (out.mask & ~maskable).any()
    assert (attention_mask == 0).any(), "the batch should contain padding"
    assert (out.mask.sum(dim=1) >= 1).all()
    assert torch.equal(out.input_ids[~out.mask], input_ids[~out.mask])


def test_sequence_without_maskable_tokens_gets_no_mask(tokenizer, info):
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]", "[PAD]", "[PAD]"]),
                        tokenizer.convert_tokens_to_ids(["[CLS]", "cell", "[SEP]", "[PAD]"])])
    attention = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    out = RandomMasker(info, 0.15, replace_probs=(1.0, 0.0, 0.0))(ids, attention, seeded(0))
    assert out.mask.tolist() == [[False] * 4, [False, True, False, False]]
    assert out.input_ids[1, 1].item() == info.mask_token_id


def test_labels_hold_original_ids_exactly_at_masked_positions(batch, info):
    input_ids, attention_mask = batch
    out = RandomMasker(info, 0.3)(input_ids, attention_mask, seeded(3))
    assert torch.equal(out.labels[out.mask], input_ids[out.mask])
    assert (out.labels[~out.mask] == IGNORE_INDEX).all()
    assert out.input_ids.dtype == torch.long and out.labels.dtype == torch.long and out.mask.dtype == torch.bool


def test_80_10_10_proportions(batch, info):
    input_ids, attention_mask = batch
    masker = RandomMasker(info, 0.5)
    as_mask = as_random = kept = 0
    for seed in range(4):
        out = masker(input_ids, attention_mask, seeded(seed))
        new, old = out.input_ids[out.mask], input_ids[out.mask]
        as_mask += int((new == info.mask_token_id).sum())
        as_random += int(((new != info.mask_token_id) & (new != old)).sum())
        kept += int((new == old).sum())
        replaced = new[(new != info.mask_token_id) & (new != old)]
        assert not info.is_special[replaced].any()
    total = as_mask + as_random + kept
    assert total > 8000
    assert abs(as_mask / total - 0.8) < 0.02
    assert abs(as_random / total - 0.1) < 0.015
    assert abs(kept / total - 0.1) < 0.015


def test_always_mask_token_when_replace_probs_are_1_0_0(batch, info):
    input_ids, attention_mask = batch
    out = RandomMasker(info, 0.3, replace_probs=(1, 0, 0))(input_ids, attention_mask, seeded(0))
    assert (out.input_ids[out.mask] == info.mask_token_id).all()


@pytest.mark.parametrize("whole_word", [True, False])
def test_determinism_with_a_seeded_generator(batch, info, whole_word):
    input_ids, attention_mask = batch
    masker = RandomMasker(info, 0.3, whole_word=whole_word)
    first, again, other = (masker(input_ids, attention_mask, seeded(s)) for s in (7, 7, 8))
    for field in ("input_ids", "labels", "mask"):
        assert torch.equal(getattr(first, field), getattr(again, field))
    assert not torch.equal(first.mask, other.mask)


def test_importance_ranks_whole_words_by_their_max_token(tokenizer, info):
    tokens = ["[CLS]", "the", "una", "##ffa", "##ble", "bio", "##in", "##form", "##atics", "paradigm", ",",
              "hello", "!", "[SEP]", "[PAD]"]
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokens)])
    attention = torch.tensor([[1] * 14 + [0]])
    importance = torch.zeros(1, 15)
    importance[0, 0] = 100.0  # [CLS]: never maskable, whatever its score
    importance[0, 14] = 90.0  # padding
    importance[0, 7] = 5.0  # '##form' -> word 'bioinformatics' (4 tokens) ranks first
    importance[0, 11] = 4.0  # 'hello'
    importance[0, 3] = 3.0  # '##ffa' -> word 'unaffable' (3 tokens)
    importance[0, 9] = 2.0  # 'paradigm'
    # 12 maskable tokens; ratio 0.55 -> budget round(6.6) = 7: bioinformatics (4) + hello (1) = 5,
    # unaffable would make 8 > 7 so selection stops there (paradigm, which would fit, is not reached).
    masker = RandomMasker(info, 0.55, replace_probs=(1, 0, 0))
    out = masker(ids, attention, seeded(0), importance=importance)
    assert torch.nonzero(out.mask[0]).flatten().tolist() == [5, 6, 7, 8, 11]
    # the first word is taken even when it alone exceeds the budget
    out = RandomMasker(info, 0.1)(ids, attention, seeded(0), importance=importance)
    assert torch.nonzero(out.mask[0]).flatten().tolist() == [5, 6, 7, 8]
    # token mode: the `budget` (0.25 * 12 = 3) most important tokens
    out = RandomMasker(info, 0.25, whole_word=False)(ids, attention, seeded(0), importance=importance)
    assert torch.nonzero(out.mask[0]).flatten().tolist() == [3, 7, 11]


def test_importance_on_a_big_batch_picks_the_top_words(batch, info):
    input_ids, attention_mask = batch
    words = word_ids(input_ids, info, attention_mask)
    # importance = word index: the last words of every sequence are the most important
    importance = words.float()
    out = RandomMasker(info, 0.15, replace_probs=(1, 0, 0))(input_ids, attention_mask, seeded(0), importance)
    masked_words = torch.where(out.mask, words, -1)
    lowest_masked = torch.where(out.mask, words, 10**6).min(dim=1).values
    # every word after the lowest masked word is masked, none before it
    expected = (words >= lowest_masked.unsqueeze(1)) & (words >= 0)
    assert torch.equal(out.mask, expected)
    assert (masked_words.max(dim=1).values == words.max(dim=1).values).all()


def test_invalid_configs_raise_config_error(info):
    for ratio in (0.0, -0.1, 1.5):
        with pytest.raises(ConfigError):
            RandomMasker(info, ratio)
    with pytest.raises(ConfigError):
        RandomMasker(info, 0.15, replace_probs=(0.8, 0.1, 0.2))
    with pytest.raises(ConfigError):
        RandomMasker(info, 0.15, replace_probs=(1.2, -0.1, -0.1))
    RandomMasker(info, 1.0)  # the upper bound is allowed


# --------------------------------------------------------------------------- byte-level BPE (RoBERTa-style)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A tiny byte-level BPE tokenizer trained offline, wrapped like RoBERTa's fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(SCIENCE_SENTENCES, trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", backend.token_to_id("</s>")),
                                                          ("<s>", backend.token_to_id("<s>")))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                   cls_token="<s>", sep_token="</s>", pad_token="<pad>",
                                   mask_token="<mask>", unk_token="<unk>")


def test_byte_level_bpe_word_boundaries_follow_the_space_marker(bpe_tokenizer):
    info = VocabInfo.from_tokenizer(bpe_tokenizer)
    assert set(info.special_ids.tolist()) == {bpe_tokenizer.convert_tokens_to_ids(t)
                                              for t in ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]}
    texts = ["retrieval of unbelievable hypermethylation", "Dense models"]
    encoded = bpe_tokenizer(texts, padding=True, return_tensors="pt")
    ids = encoded["input_ids"]
    words = word_ids(ids, info)
    tokens = bpe_tokenizer.convert_ids_to_tokens(ids[0])
    assert len(tokens) > 4 + 2, "the tiny vocabulary should split the rare words"
    for row, text in enumerate(texts):
        spelled: dict[int, list[int]] = {}
        for token_id, word in zip(ids[row].tolist(), words[row].tolist()):
            if word >= 0:
                spelled.setdefault(word, []).append(token_id)
        assert [bpe_tokenizer.decode(spelled[w]).strip() for w in range(len(spelled))] == text.split()
        assert words[row][encoded["attention_mask"][row] == 0].eq(-1).all()
    marker = "\u0120"
    starts = [t.startswith(marker) for t in tokens[1:-1]]
    assert info.is_continuation[ids[0, 1:-1]].tolist() == [not s for s in starts]


def test_byte_level_bpe_whole_word_masking(bpe_tokenizer):
    info = VocabInfo.from_tokenizer(bpe_tokenizer)
    encoded = bpe_tokenizer(science_texts(16), truncation=True, max_length=64, padding=True, return_tensors="pt")
    ids, attention = encoded["input_ids"], encoded["attention_mask"]
    out = RandomMasker(info, 0.3)(ids, attention, seeded(0))
    words = word_ids(ids, info, attention)
    for row in range(ids.shape[0]):
        masked = set(words[row][out.mask[row]].tolist())
        assert masked and -1 not in masked
        assert torch.equal(out.mask[row], torch.isin(words[row], torch.tensor(sorted(masked))))


# --------------------------------------------------------------------------- enhanced decoding


def test_visible_per_row_rule():
    n = torch.tensor([150, 10, 7, 2, 1, 0])
    assert visible_per_row(n, visible_ratio=0.5).tolist() == [74, 4, 2, 1, 0, 0]  # n - 1 - round(n / 2)
    assert visible_per_row(n, visible_ratio=1.0).tolist() == [149, 9, 6, 1, 0, 0]
    assert visible_per_row(n, visible_ratio=0.0).tolist() == [1, 1, 1, 1, 0, 0]
    assert visible_per_row(n, num_visible=8).tolist() == [8, 8, 6, 1, 0, 0]
    for bad in (dict(), dict(visible_ratio=0.5, num_visible=3), dict(visible_ratio=1.5),
                dict(num_visible=0), dict(num_visible=2.5)):
        with pytest.raises(ConfigError):
            visible_per_row(n, **bad)


def ragged_attention(lengths: list[int], length: int) -> torch.Tensor:
    return (torch.arange(length).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()


SAMPLERS = ["independent", "cyclic"]
LENGTHS = [150, 150, 120, 77, 31, 3, 2, 1, 0]


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("rule", [dict(visible_ratio=0.5), dict(visible_ratio=0.15), dict(num_visible=12),
                                  dict(visible_ratio=1.0)])
def test_enhanced_mask_properties(sampler, rule):
    attention = ragged_attention(LENGTHS * 4, 150)
    valid = attention.bool()
    visible = enhanced_decoding_mask(attention, generator=seeded(0), sampler=sampler, **rule)
    assert visible.shape == (36, 150, 150) and visible.dtype == torch.bool
    assert not visible.diagonal(dim1=1, dim2=2).any()
    assert not (visible & ~valid.unsqueeze(1)).any(), "padding columns are never visible"
    assert not (visible & ~valid.unsqueeze(2)).any(), "padding rows see nothing"
    assert torch.equal(visible[:, 1:, 0], valid[:, 1:]), "every valid row i != 0 sees position 0"
    count = visible_per_row(valid.sum(dim=1), **rule)
    assert torch.equal(visible.sum(dim=2), torch.where(valid, count.unsqueeze(1), 0))
    n = valid.sum(dim=1)
    assert (visible.any(dim=2) | ~valid | (n < 2).unsqueeze(1)).all(), "no valid row fully masked"


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_enhanced_mask_determinism(sampler):
    attention = ragged_attention([40, 33, 12], 40)
    first, again, other = (enhanced_decoding_mask(attention, 0.5, generator=seeded(s), sampler=sampler)
                           for s in (3, 3, 4))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_enhanced_mask_samples_are_uniform(sampler):
    """Each row's sampled set is uniform over the valid positions other than 0 and i."""
    n, copies = 8, 3000
    attention = ragged_attention([n] * copies + [5] * 10, 10)
    visible = enhanced_decoding_mask(attention, num_visible=4, generator=seeded(0), sampler=sampler)[:copies]
    frequency = visible.float().mean(dim=0)[:n, :n]
    for i in range(1, n):
        others = [j for j in range(1, n) if j != i]
        # 3 of the 6 positions other than 0 and i
        assert torch.allclose(frequency[i, others], torch.full((6,), 0.5), atol=0.04)
    assert torch.allclose(frequency[0, 1:n], torch.full((7,), 4 / 7), atol=0.04)
    # whole subsets too: row 3 picks each of the C(6, 3) = 20 subsets about equally often
    row = visible[:, 3, :n].long()
    codes = (row * (2 ** torch.arange(n))).sum(dim=1)
    counts = torch.bincount(codes, minlength=2 ** n)
    used = counts[counts > 0]
    assert used.numel() == 20
    assert (used - copies / 20).abs().max() < 60


def test_float_ties_at_the_threshold_are_resolved_exactly():
    attention = ragged_attention([6, 4], 6)
    valid = attention.bool()
    scores = torch.full((2, 6, 6), 0.5)  # every eligible score ties
    count = torch.tensor([3, 2])
    visible = _keep_smallest(scores, _eligible(valid), valid, count)
    assert torch.equal(visible.sum(dim=2), torch.where(valid, count.unsqueeze(1), 0))
    assert visible[0, 3].nonzero().flatten().tolist() == [0, 1, 2]  # column 0, then the stable order
    assert visible[0, 0].nonzero().flatten().tolist() == [1, 2, 3]


def test_selection_falls_back_to_ranking_when_fillers_run_short():
    attention = ragged_attention([6, 3], 6)
    valid = attention.bool()
    count = torch.tensor([5, 0])  # row counts no rule produces: 5 fillers needed, 4 available
    visible = _keep_smallest(torch.rand(2, 6, 6, generator=seeded(0)), _eligible(valid), valid, count)
    assert torch.equal(visible.sum(dim=2), torch.where(valid, count.unsqueeze(1), 0))
    assert not visible[1].any()


def test_enhanced_mask_rejects_bad_input():
    with pytest.raises(InputError):
        enhanced_decoding_mask(torch.ones(4, dtype=torch.long), 0.5)
    with pytest.raises(ConfigError):
        enhanced_decoding_mask(torch.ones(1, 4, dtype=torch.long), 0.5, sampler="bogus")
    with pytest.raises(ConfigError):
        enhanced_decoding_mask(torch.ones(1, 4, dtype=torch.long))


def test_to_additive_mask():
    visible = enhanced_decoding_mask(ragged_attention([5, 3], 5), 0.5, generator=seeded(0))
    additive = to_additive_mask(visible, torch.float16)
    assert additive.shape == (2, 1, 5, 5) and additive.dtype == torch.float16
    assert (additive[:, 0][visible] == 0).all()
    assert (additive[:, 0][~visible] == torch.finfo(torch.float16).min).all()
    attention = torch.softmax(torch.zeros(2, 1, 5, 5) + to_additive_mask(visible), dim=-1)
    assert torch.isfinite(attention).all()  # fully masked padding rows stay finite
    rows_with_context = visible.any(dim=2, keepdim=True)
    assert torch.allclose(attention[:, 0][~visible & rows_with_context], torch.tensor(0.0))
    with pytest.raises(ConfigError):
        to_additive_mask(visible, torch.int64)


# --------------------------------------------------------------------------- latency


def test_masking_latency_reports_each_kind(tokenizer):
    kinds = ("random", "whole_word", "enhanced", "enhanced_independent")
    timings = masking_latency(tokenizer, science_texts(5), batch_size=8, max_len=32, repeats=2, kinds=kinds)
    assert set(timings) == set(kinds)
    assert all(isinstance(v, float) and v > 0 for v in timings.values())
    with pytest.raises(ConfigError):
        masking_latency(tokenizer, ["x"], kinds=("nope",))
    with pytest.raises(InputError):
        masking_latency(tokenizer, [])
