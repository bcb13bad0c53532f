"""Pre-training collator: shapes, required features only, targets, determinism and generator state."""

from __future__ import annotations

import pytest
import torch

from pretrieve.errors import ConfigError, InputError
from pretrieve.train import collator as collator_module
from pretrieve.train.collator import PretrainCollator, unique_token_ids
from pretrieve.train.method import preset

TEXTS = ["the cat sat on the mat , the end", "retrieval oriented pre-training of dense encoders",
         "a b"]
BASE_KEYS = {"input_ids", "attention_mask", "mlm_labels"}


@pytest.fixture(scope="module")
def examples(tokenizer):
    return [{"input_ids": tokenizer(text)["input_ids"]} for text in TEXTS]


def make(tokenizer, name="retromae", **kwargs):
    return PretrainCollator(tokenizer, preset(name), max_len=kwargs.pop("max_len", 32), **kwargs)


@pytest.mark.parametrize("name, extra", [
    ("mlm", set()),
    ("bow", {"bow_targets"}),
    ("ae", {"decoder_input_ids", "decoder_labels"}),
    ("ar", {"original_input_ids", "original_labels"}),
    ("retromae", {"original_input_ids", "original_labels", "enhanced_mask"}),
])
def test_only_the_required_features_are_built(tokenizer, examples, name, extra):
    batch = make(tokenizer, name)(examples)
    assert set(batch) == BASE_KEYS | extra
    longest = max(len(e["input_ids"]) for e in examples)
    for key, value in batch.items():
        if key == "bow_targets":
            continue  # [B, K], K = largest bag (checked below)
        expected = (3, longest, longest) if key == "enhanced_mask" else (3, longest)
        assert value.shape == expected, key
    if "enhanced_mask" in batch:
        assert batch["enhanced_mask"].dtype == torch.bool


def test_explicit_required_set_and_unknown_feature(tokenizer, examples):
    collator = PretrainCollator(tokenizer, preset("retromae"), required={"mlm_labels", "bow_targets"}, max_len=32)
    assert set(collator(examples)) == BASE_KEYS | {"bow_targets"}
    with pytest.raises(ConfigError, match="cannot build batch feature\\(s\\) no_such_feature"):
        PretrainCollator(tokenizer, preset("bow"), required={"no_such_feature"}, max_len=32)


def test_padding_masking_and_targets(tokenizer, examples):
    batch = make(tokenizer, "retromae", pad_to_multiple_of=8)(examples)
    ids, attention = batch["original_input_ids"], batch["attention_mask"]
    assert ids.shape[1] % 8 == 0
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        assert ids[row, :n].tolist() == example["input_ids"]
        assert attention[row].tolist() == [1] * n + [0] * (ids.shape[1] - n)
        assert (ids[row, n:] == tokenizer.pad_token_id).all()
    special = torch.tensor(tokenizer.get_special_tokens_mask(ids[0].tolist(), already_has_special_tokens=True))
    masked = batch["mlm_labels"] != -100
    assert masked.any(dim=1).all()                         # every text has masked tokens
    assert torch.equal(batch["mlm_labels"][masked], ids[masked])
    assert not (masked & ~attention.bool()).any()
    assert not masked[0][special.bool()].any()             # never [CLS]/[SEP]
    unmasked = ~masked
    assert torch.equal(batch["input_ids"][unmasked], ids[unmasked])
    labels = batch["original_labels"]
    assert (labels[:, 0] == -100).all() and (labels[~attention.bool()] == -100).all()
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        assert labels[row, n - 1] == -100                  # final [SEP]
        assert torch.equal(labels[row, 1:n - 1], ids[row, 1:n - 1])


def test_decoder_masker_works_on_the_original_ids(tokenizer, examples):
    batch = make(tokenizer, "ae")(examples)
    ids = torch.tensor([e["input_ids"] for e in examples[:1]])
    decoder_masked = batch["decoder_labels"] != -100
    assert torch.equal(batch["decoder_labels"][0, : ids.shape[1]][decoder_masked[0, : ids.shape[1]]],
                       ids[0][decoder_masked[0, : ids.shape[1]]])
    assert decoder_masked.sum() > (batch["mlm_labels"] != -100).sum()    # 0.5 vs 0.3
    assert not torch.equal(decoder_masked, batch["mlm_labels"] != -100)


def test_bow_targets_are_unique_non_special_ids(tokenizer, examples):
    batch = make(tokenizer, "bow")(examples)
    targets = batch["bow_targets"]
    special = set(tokenizer.all_special_ids)
    for row, example in enumerate(examples):
        expected = sorted(set(example["input_ids"]) - special)
        got = targets[row][targets[row] != -100].tolist()
        assert got == expected
    assert targets.shape[1] == max(len(set(e["input_ids"]) - special) for e in examples)
    # "the" occurs three times in the first text and is one target
    assert targets[0].tolist().count(tokenizer.convert_tokens_to_ids("the")) == 1


def test_unique_token_ids_by_hand():
    ids = torch.tensor([[5, 3, 5, 9, 0], [7, 7, 7, 0, 0], [1, 2, 0, 0, 0]])
    keep = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    assert unique_token_ids(ids, keep).tolist() == [[3, 5, 9], [7, -100, -100], [-100, -100, -100]]


def test_same_seed_same_batch_and_generator_state_round_trip(tokenizer, examples):
    first, second = make(tokenizer, "retromae", seed=3), make(tokenizer, "retromae", seed=3)
    a, b = first(examples), second(examples)
    assert all(torch.equal(a[key], b[key]) for key in a)
    other = make(tokenizer, "retromae", seed=4)(examples)
    assert not torch.equal(other["enhanced_mask"], a["enhanced_mask"])

    state = first.state_dict()
    expected = first(examples)
    resumed = make(tokenizer, "retromae", seed=99)
    resumed.load_state_dict(state)
    got = resumed(examples)
    assert all(torch.equal(expected[key], got[key]) for key in expected)


def test_dataloader_workers_get_distinct_reproducible_streams(tokenizer, examples, monkeypatch):
    class Worker:
        def __init__(self, id):
            self.id = id

    def masks_in_worker(worker_id):
        collator = make(tokenizer, "mlm", seed=1)
        monkeypatch.setattr(collator_module, "get_worker_info", lambda: Worker(worker_id))
        return collator(examples)["mlm_labels"]

    assert torch.equal(masks_in_worker(0), masks_in_worker(0))
    assert not torch.equal(masks_in_worker(0), masks_in_worker(1))


def test_bad_examples(tokenizer, examples):
    collator = make(tokenizer, "bow", max_len=8)
    with pytest.raises(InputError, match="more than max_len=8"):
        collator(examples)
    with pytest.raises(InputError, match="no 'input_ids'"):
        collator([{"text": "x"}])
    with pytest.raises(InputError, match="empty"):
        collator([{"input_ids": []}])
    with pytest.raises(InputError, match="empty list"):
        collator([])


def test_bow_without_encoder_masking(tokenizer, examples):
    from pretrieve.train.method import resolve_method
    collator = PretrainCollator(tokenizer, resolve_method(objectives="bow", encoder_mask=0), max_len=32)
    batch = collator(examples)
    assert (batch["mlm_labels"] == -100).all()
    assert torch.equal(batch["input_ids"][batch["attention_mask"].bool()],
                       torch.tensor([i for e in examples for i in e["input_ids"]]))
