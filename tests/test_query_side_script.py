"""scripts/experiments/query_side_finetune.py: its full-corpus softmax loss against a hand computation."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "experiments" / "query_side_finetune.py"


def load_script():
    spec = importlib.util.spec_from_file_location("query_side_finetune", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_corpus_loss_matches_a_hand_computation():
    import torch

    loss = load_script().full_corpus_loss
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 0.0, 3.0, 1.0]])
    # query 0: positives 0 and 2, each against the corpus minus the other positive; query 1: positive 3
    first = math.log(math.exp(2.0) + math.exp(1.0) + math.exp(-1.0)) - 2.0
    second = math.log(math.exp(1.0) + math.exp(0.0) + math.exp(-1.0)) - 0.0
    third = math.log(math.exp(0.5) + math.exp(0.0) + math.exp(3.0) + math.exp(1.0)) - 1.0
    assert loss(logits, [[0, 2], [3]]).item() == pytest.approx((first + second + third) / 3, rel=1e-6)
    assert loss(logits, [[0], [2]]).item() < loss(logits, [[3], [1]]).item()   # right positives: a lower loss
