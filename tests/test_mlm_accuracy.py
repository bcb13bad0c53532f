"""Held-out masked-token accuracy (``pretrieve analyze mlm-accuracy``): against the Hugging Face MLM model's own
logits on the same masked inputs, independent of the batch size; the CLI writes the gate and refuses a checkpoint
without an MLM head."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pretrieve.analysis.mlm_accuracy import GATE_ACCURACY, evaluation_masks, mlm_accuracy
from pretrieve.modeling import Encoder

from test_input_guards import assert_one_line_error, run_cli

TEXTS = ["the cat sat on the mat and looked at the dog across the room",
         "dense retrieval encodes queries and passages into vectors",
         "a",
         "masked language modelling predicts hidden tokens from their context in a sentence of words"]


def test_masks_take_the_ratio_of_each_texts_tokens_at_least_one_in_text_order():
    candidates = [list(range(1, 21)), [1], list(range(1, 8))]
    masks = evaluation_masks(candidates, 0.15, seed=3)
    assert [len(m) for m in masks] == [3, 1, 1]
    assert all(set(m) <= set(c) and len(set(m)) == len(m) for m, c in zip(masks, candidates))
    again = evaluation_masks(candidates, 0.15, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(masks, again))
    assert not np.array_equal(evaluation_masks(candidates, 0.15, seed=4)[0], masks[0])


def test_accuracy_and_loss_equal_the_mlm_models_own_logits_at_the_masked_positions(tiny_mlm_dir, tokenizer):
    from transformers import BertForMaskedLM

    encoder = Encoder.from_pretrained(tiny_mlm_dir)
    result = mlm_accuracy(encoder, tokenizer, TEXTS, max_len=16, mask_ratio=0.3, seed=7, batch_size=2)
    reference = BertForMaskedLM.from_pretrained(tiny_mlm_dir).eval()
    encoded = tokenizer(TEXTS, truncation=True, max_length=16)["input_ids"]
    special = set(tokenizer.all_special_ids)
    masks = evaluation_masks([[i for i, t in enumerate(ids) if t not in special] for ids in encoded], 0.3, seed=7)
    correct, losses = 0, []
    for ids, positions in zip(encoded, masks):
        masked = torch.tensor([ids])
        masked[0, positions] = tokenizer.mask_token_id
        with torch.no_grad():
            logits = reference(input_ids=masked, attention_mask=torch.ones_like(masked)).logits[0, positions]
        targets = torch.tensor(ids)[positions]
        correct += int((logits.argmax(-1) == targets).sum())
        losses += F.cross_entropy(logits, targets, reduction="none").tolist()
    assert result.masked_tokens == len(losses) == sum(len(m) for m in masks)
    assert result.accuracy == pytest.approx(correct / len(losses))
    assert result.loss == pytest.approx(float(np.mean(losses)), rel=1e-5)
    assert result.perplexity == pytest.approx(np.exp(result.loss))
    one_by_one = mlm_accuracy(encoder, tokenizer, TEXTS, max_len=16, mask_ratio=0.3, seed=7, batch_size=1)
    assert (one_by_one.accuracy, one_by_one.masked_tokens) == (result.accuracy, result.masked_tokens)
    assert one_by_one.loss == pytest.approx(result.loss, rel=1e-5)


def test_the_cli_writes_the_gate_and_refuses_a_checkpoint_without_mlm_head(tiny_mlm_dir, tiny_bert_dir, tmp_path):
    corpus = tmp_path / "heldout.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    result = run_cli("analyze", "mlm-accuracy", "--model", str(tiny_mlm_dir), "--corpus", str(corpus),
                     "--out", str(tmp_path / "gate"), "--max-len", "16")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "gate" / "mlm_accuracy.json").read_text())
    assert report["num_texts"] == 4 and report["masked_tokens"] >= 4
    assert report["gate"] == {"accuracy_at_least": GATE_ACCURACY, "passed": report["accuracy"] >= GATE_ACCURACY}
    assert "masked-token accuracy" in result.stdout
    assert_one_line_error(run_cli("analyze", "mlm-accuracy", "--model", str(tiny_bert_dir), "--corpus",
                                  str(corpus)), "no MLM head")
