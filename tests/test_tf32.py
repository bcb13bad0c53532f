"""The TF32 switch (pretrieve.precision.set_tf32, the training setting ``tf32``): on only for CUDA devices of
compute capability ≥ 8.0 — checked on the CPU by faking the capability, as the other GPU-path tests do."""

from __future__ import annotations

import logging

import pytest
import torch

from pretrieve.precision import set_tf32
from pretrieve.train.settings import LoopConfig


@pytest.fixture
def restored():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("capability, on", [((9, 0), True), ((8, 0), True), ((7, 0), False)])
def test_tf32_follows_the_capability(capability, on, restored, monkeypatch, caplog):
    torch.set_float32_matmul_precision("highest")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "faked GPU")
    with caplog.at_level(logging.WARNING, logger="pretrieve.precision"):
        assert set_tf32(True, torch.device("cuda", 0)) is on
    assert torch.get_float32_matmul_precision() == ("high" if on else "highest")
    assert ("no effect" in caplog.text) is not on
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: pytest.fail("CUDA asked"))
    assert set_tf32(False, torch.device("cuda", 0)) is False   # the next run without it: off again, CUDA not asked
    assert torch.get_float32_matmul_precision() == "highest"


def test_tf32_is_a_no_op_on_the_cpu(restored, caplog):
    torch.set_float32_matmul_precision("highest")
    with caplog.at_level(logging.WARNING, logger="pretrieve.precision"):
        assert set_tf32(True, torch.device("cpu")) is False
    assert torch.get_float32_matmul_precision() == "highest" and "no effect on cpu" in caplog.text
    assert LoopConfig().tf32 is False    # off by default, as in torch
