"""Training guards: divergence stops a run and keeps only checkpoints from before it; a resume that cannot restore
the RNG state fails loudly; an output with checkpoints is not silently restarted; failed starts leave nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrieve.errors import ConfigError, InexactResumeError, InputError, TrainingDiverged
from pretrieve.train import checkpoint as ckpt
from pretrieve.train import loop
from pretrieve.train.loop import read_logs
from pretrieve.train.pretrainer import PretrainConfig, pretrain

from test_finetune import make_config, write_collection


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = "retrieval dense passage encoder query document ranking vector index token model training".split()
    lines = [" ".join(words[(i * 5 + j) % len(words)] for j in range(10 + i % 7)) + "." for i in range(64)]
    path = tmp_path_factory.mktemp("corpus") / "passages.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(model, corpus, out, **kw) -> PretrainConfig:
    values = dict(model=str(model), corpus=str(corpus), out=str(out), method="mlm", max_len=32, batch_size=4,
                  lr=5e-4, max_steps=6, warmup_ratio=0.0, log_every=1, save_every=2, show_progress=False,
                  cache_dir=str(Path(out).parent / "cache"))
    values.update(kw)
    return PretrainConfig(**values)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300", **(env or {})}
    return subprocess.run([sys.executable, "-m", "pretrieve", *args], capture_output=True, text=True, env=full,
                          timeout=300)


def _interrupt_at(monkeypatch, call: int) -> None:
    original, calls = loop.train_step, {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", interrupted)


# ------------------------------------------------------------------------------------------ divergence
def test_lr_1000_stops_with_a_divergence_message_and_keeps_only_earlier_checkpoints(tiny_mlm_dir, corpus, tmp_path):
    out = tmp_path / "run"
    result = _cli("pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(corpus), "--out", str(out),
                  "--method", "mlm", "--max-len", "32", "--batch-size", "4", "--steps", "30", "--lr", "1000",
                  "--warmup-ratio", "0.5", "--save-every", "1", "--log-every", "1", "--seed", "3")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "training diverged at step" in lines[0] and "Traceback" not in result.stderr
    assert not (out / "final").exists()
    losses = {row["step"]: row["loss"] for row in read_logs(out)}
    first = losses[1]
    kept = ckpt.list_checkpoints(out)
    assert kept, "the first update (learning rate 0 in the warm-up) left a sane checkpoint: it must be kept"
    for step, _ in kept:
        # the weights of checkpoint step-K produce the loss logged at step K + 1: it is a pre-divergence loss
        assert math.isfinite(losses[step + 1]) and losses[step + 1] < 10 * first, (step, losses)


# ------------------------------------------------------------------------------------------ exact resume
def test_a_corrupted_rng_state_file_makes_resume_fail_loudly(tiny_mlm_dir, corpus, tmp_path, monkeypatch, caplog):
    out = tmp_path / "run"
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        pretrain(_config(tiny_mlm_dir, corpus, out))
    monkeypatch.undo()
    rng_file = out / "checkpoints" / "step-2" / "random_states_0.pkl"
    rng_file.write_bytes(b"not a pickle")
    with pytest.raises(InexactResumeError, match=r"step-2/random_states_0\.pkl: cannot restore"):
        pretrain(_config(tiny_mlm_dir, corpus, out, resume=True))
    result = _cli("pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(corpus), "--out", str(out),
                  "--method", "mlm", "--max-len", "32", "--batch-size", "4", "--steps", "6", "--lr", "5e-4",
                  "--warmup-ratio", "0", "--save-every", "2", "--log-every", "1", "--resume")
    assert result.returncode == 2 and "random_states_0.pkl" in result.stderr and "Traceback" not in result.stderr
    assert "--allow-inexact-resume" in result.stderr
    with caplog.at_level("WARNING", logger="pretrieve.train.checkpoint"):
        final = pretrain(_config(tiny_mlm_dir, corpus, out, resume=True, allow_inexact_resume=True))
    assert (final / "model.safetensors").exists() and "INEXACT RESUME" in caplog.text
    # an optimizer state that cannot be read stops any resume, with the checkpoint named
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "second"))
    monkeypatch.undo()
    (tmp_path / "second" / "checkpoints" / "step-2" / "optimizer.bin").write_bytes(b"truncated")
    with pytest.raises(InexactResumeError, match=r"step-2: cannot restore the training state"):
        pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "second", resume=True, allow_inexact_resume=True))


# ------------------------------------------------------------------------------------------ restarts
def test_an_output_with_checkpoints_is_not_restarted_without_resume_or_overwrite(tiny_mlm_dir, corpus, tmp_path,
                                                                                monkeypatch):
    out = tmp_path / "run"
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        pretrain(_config(tiny_mlm_dir, corpus, out))
    monkeypatch.undo()
    logs_before = (out / "logs.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"holds checkpoints of a previous run \(up to step 2\).*--resume.*"
                                          r"--overwrite"):
        pretrain(_config(tiny_mlm_dir, corpus, out))
    assert (out / "logs.jsonl").read_text() == logs_before and ckpt.latest_checkpoint(out).name == "step-2"
    with pytest.raises(ConfigError, match="give one of them"):
        pretrain(_config(tiny_mlm_dir, corpus, out, resume=True, overwrite=True))
    final = pretrain(_config(tiny_mlm_dir, corpus, out, overwrite=True))
    assert [row["step"] for row in read_logs(out)] == [1, 2, 3, 4, 5, 6] and (final / "model.safetensors").exists()


def test_a_failed_start_leaves_no_config_file_and_no_empty_directory(tiny_bert_dir, tmp_path):
    collection = write_collection(tmp_path / "tiny")
    groups = tmp_path / "groups.jsonl"
    groups.write_text(json.dumps({"query_id": "q0", "query": "x", "positives": ["nope"], "negatives": ["d1"]}) + "\n")
    out = tmp_path / "out"
    from pretrieve.train.finetuner import finetune

    with pytest.raises(InputError):
        finetune(make_config(tiny_bert_dir, collection, out, groups=str(groups), stage=2))
    assert not out.exists()


def test_leftovers_of_killed_writes_are_removed_on_start(tiny_mlm_dir, corpus, tmp_path):
    out = tmp_path / "run"
    final = pretrain(_config(tiny_mlm_dir, corpus, out, max_steps=2, save_every=0))
    old = time.time() - 3600
    leftovers = [out / ".logs.jsonl.abc123.tmp", out / "checkpoints" / ".step-4.tmp", out / "runs" / ".x.trec.1.tmp"]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if path.name.startswith(".step") else path.write_text("partial")
        os.utime(path, (old, old))
    fresh = out / ".another-writer.tmp"
    fresh.write_text("being written right now")
    assert pretrain(_config(tiny_mlm_dir, corpus, out, max_steps=2, save_every=0)) == final
    assert not any(path.exists() for path in leftovers) and fresh.exists()
