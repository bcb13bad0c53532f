"""Pre-training loop: losses go down for every preset, exact resume, atomic checkpoints, DDP == accumulation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrieve.errors import ConfigError
from pretrieve.train import checkpoint as ckpt
from pretrieve.train import loop
from pretrieve.train.loop import read_logs
from pretrieve.train.pretrainer import PretrainConfig, pretrain
from pretrieve.train.run_config import build_pretrain_config

from conftest import tiny_bert_config

PRESETS = ["mlm", "bow", "ae", "ar", "retromae"]


@pytest.fixture(scope="module")
def tiny_nodrop_dir(tmp_path_factory, tokenizer) -> Path:
    """Tiny random BERT with dropout off (bitwise-comparable runs across process layouts)."""
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_nodrop")
    config = tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertForMaskedLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """200 passages of real-looking text (no shared data needed)."""
    words = ("retrieval dense passage encoder query document ranking vector index token model training "
             "protein cell gene cancer patient clinical trial study effect risk").split()
    lines = []
    for i in range(200):
        picked = [words[(i * 7 + j * 3) % len(words)] for j in range(12 + i % 20)]
        lines.append(" ".join(picked) + ".")
    path = tmp_path_factory.mktemp("corpus") / "passages.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(model, corpus, out, **kw) -> PretrainConfig:
    values = dict(model=str(model), corpus=str(corpus), out=str(out), method="bow", max_len=48, batch_size=8,
                  lr=5e-4, max_steps=12, warmup_ratio=0.0, log_every=1, save_every=0, show_progress=False,
                  cache_dir=str(Path(out).parent / "cache"))
    values.update(kw)
    return PretrainConfig(**values)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_lowers_each_objective_loss_on_scifact(preset, scifact, tiny_mlm_dir, tmp_path):
    # 100 steps: every objective of every preset is at ~0.78 of its step-10 value by then (0.72 at 200 steps)
    config = _config(tiny_mlm_dir, scifact, tmp_path / preset, method=preset, max_steps=100, batch_size=8,
                     max_len=64, lr=1e-3, warmup_ratio=0.05, log_every=10, cache_dir=str(tmp_path / "cache"))
    final = pretrain(config)
    logs = read_logs(tmp_path / preset)
    assert logs[-1]["step"] == 100
    objectives = [key for key in logs[0] if key.startswith("loss/")]
    assert objectives, logs[0]
    for key in objectives:
        first, last = logs[0][key], logs[-1][key]
        assert last < first * 0.9, f"{preset}: {key} went from {first:.3f} to {last:.3f}"
    from transformers import AutoModel

    AutoModel.from_pretrained(final)  # the export loads with plain transformers


@pytest.mark.parametrize("pack", [False, True], ids=["chunked", "packed"])
def test_resume_after_interruption_gives_identical_losses(pack, tiny_mlm_dir, small_corpus, tmp_path, monkeypatch):
    # packed: the one-sentence lines packed into one another (as BookCorpus), random short targets included
    packing = dict(pack=True, pack_across=[str(small_corpus)], short_seq_prob=0.2) if pack else {}
    full = _config(tiny_mlm_dir, small_corpus, tmp_path / "full", method="retromae", max_steps=12, save_every=6,
                   **packing)
    pretrain(full)
    reference = read_logs(tmp_path / "full")

    # Interrupt the second run right after step 8 (after the step-6 checkpoint), as a kill would.
    original = loop.train_step
    calls = {"n": 0}

    def killed_after_8(*args, **kwargs):
        if calls["n"] == 8:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", killed_after_8)
    interrupted = _config(tiny_mlm_dir, small_corpus, tmp_path / "resumed", method="retromae", max_steps=12,
                          save_every=6, **packing)
    with pytest.raises(KeyboardInterrupt):
        pretrain(interrupted)
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path / "resumed")] == [6]
    assert not (tmp_path / "resumed" / "final").exists()
    monkeypatch.setattr(loop, "train_step", original)

    interrupted.resume = True
    pretrain(interrupted)
    resumed = read_logs(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == list(range(1, 13))
    for a, b in zip(reference, resumed):
        for key in a:
            if key != "samples_per_s":
                assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), (a["step"], key)


def test_resume_under_other_settings_is_refused_but_bookkeeping_may_change(tiny_mlm_dir, small_corpus, tmp_path):
    config = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=4, save_every=2)
    pretrain(config)
    shutil.rmtree(tmp_path / "run" / "final")  # as if the run had been killed after its step-2 checkpoint
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path / "run")] == [2]

    changed = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=4, save_every=2, lr=1e-3, resume=True)
    with pytest.raises(ConfigError, match=r"step-2 was written by a run with other settings \(lr: 0.0005 -> 0.001\)"):
        pretrain(changed)
    other_method = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=4, save_every=2, method="mlm",
                           resume=True)
    with pytest.raises(ConfigError, match=r"method: "):
        pretrain(other_method)

    # logging, checkpoint frequency and the step budget are not settings of the run's maths
    extended = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=6, save_every=3, log_every=2,
                       resume=True)
    pretrain(extended)
    assert [row["step"] for row in read_logs(tmp_path / "run")] == [1, 2, 4, 6]


def test_finished_run_is_reused_with_the_same_settings_and_refused_with_others(tiny_mlm_dir, small_corpus,
                                                                                 tmp_path, monkeypatch):
    config = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=2)
    final = pretrain(config)
    weights = (final / "model.safetensors").read_bytes()

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(loop, "train_step", no_training)
    again = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=2, log_every=5, resume=True,
                    cache_dir=str(tmp_path / "other-cache"))          # bookkeeping and cache may differ
    assert pretrain(again) == final and (final / "model.safetensors").read_bytes() == weights
    with pytest.raises(ConfigError, match=r"holds a finished run with different settings \(max_steps: 2 -> 3\)"):
        pretrain(_config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=3))
    with pytest.raises(ConfigError, match=r"different settings \(method: "):
        pretrain(_config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=2, method="mlm"))


def test_another_outputs_finished_run_is_reused_only_with_the_same_settings_and_inputs(tiny_mlm_dir, small_corpus,
                                                                                       tmp_path, monkeypatch):
    """``reuse_from``: the finished run of another output, made with these settings from inputs of the same
    content (a copied corpus), is copied in without training; other settings train; an output with a run of its
    own is never replaced."""
    final = pretrain(_config(tiny_mlm_dir, small_corpus, tmp_path / "first", max_steps=2, save_every=1,
                             keep_checkpoints=0))
    weights = (final / "model.safetensors").read_bytes()
    corpus = tmp_path / "elsewhere" / "passages.txt"               # the same passages under another path
    corpus.parent.mkdir()
    shutil.copy(small_corpus, corpus)
    trained = []
    original = loop.train_step
    monkeypatch.setattr(loop, "train_step", lambda *a, **kw: trained.append(1) or original(*a, **kw))
    reused = pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "second", max_steps=2, reuse_from=str(tmp_path / "first"),
                              cache_dir=str(tmp_path / "other-cache")))          # bookkeeping may differ
    assert trained == [] and reused == tmp_path / "second" / "final"
    assert (reused / "model.safetensors").read_bytes() == weights
    assert read_logs(tmp_path / "second") == read_logs(tmp_path / "first")         # what it cost, as it ran
    assert pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "second", max_steps=2)) == reused   # now its own
    other = pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "third", max_steps=2, lr=1e-3,
                             reuse_from=str(tmp_path / "first")))              # another lr: trained
    assert trained and (other / "model.safetensors").read_bytes() != weights
    trained.clear()
    edited = tmp_path / "edited.txt"
    edited.write_text(small_corpus.read_text().replace("protein", "proteins"))
    pretrain(_config(tiny_mlm_dir, edited, tmp_path / "fourth", max_steps=2, reuse_from=str(tmp_path / "first")))
    assert trained                                                               # other passages: trained
    trained.clear()
    pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "fifth", max_steps=2, reuse_from=str(tmp_path / "nowhere")))
    assert trained                                                               # nothing there: trained


def test_checkpoint_is_never_half_written(tiny_mlm_dir, small_corpus, tmp_path, monkeypatch):
    config = _config(tiny_mlm_dir, small_corpus, tmp_path / "run", max_steps=8, save_every=4)
    from accelerate import Accelerator

    original = Accelerator.save_state
    calls = {"n": 0}

    def crash_on_second_save(self, output_dir=None, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            Path(output_dir, "partial.bin").write_bytes(b"half")
            raise OSError("disk full")
        return original(self, output_dir, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", crash_on_second_save)
    config.max_steps, config.save_every = 12, 4
    with pytest.raises(ckpt.CheckpointWriteError, match="disk full"):
        pretrain(config)
    steps = [step for step, _ in ckpt.list_checkpoints(tmp_path / "run")]
    assert steps == [4]  # the failed step-8 save left no step-8 directory
    assert ckpt.latest_checkpoint(tmp_path / "run").name == "step-4"


def test_clear_errors_before_training(tiny_mlm_dir, small_corpus, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match="unknown"):
        build_pretrain_config({}, dict(model=str(tiny_mlm_dir), corpus=str(small_corpus), out=str(tmp_path)),
                              dict(method="nonexistent"))
    with pytest.raises(ConfigError, match="weight"):
        build_pretrain_config({}, dict(model=str(tiny_mlm_dir), corpus=str(small_corpus), out=str(tmp_path)),
                              dict(method=None, objectives="mlm,bow", weights="1"))
    with pytest.raises(ConfigError, match="unknown option"):
        build_pretrain_config({"learning_rate": 1}, dict(model="m", corpus="c", out="o"), {})
    with pytest.raises(ConfigError, match="positions"):
        pretrain(_config(tiny_mlm_dir, small_corpus, tmp_path / "long", max_len=1024))
    from pretrieve.errors import InputError

    with pytest.raises(InputError, match="no text"):
        pretrain(_config(tiny_mlm_dir, empty, tmp_path / "empty"))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_cli(args, env_extra=None, nproc=1):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env_extra or {}))
    if nproc == 1:
        command = [sys.executable, "-m", "pretrieve", *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   f"--master_port={_free_port()}", "-m", "pretrieve", *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.ddp
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(tiny_nodrop_dir, small_corpus, tmp_path):
    common = ["pretrain", "--model", str(tiny_nodrop_dir), "--corpus", str(small_corpus), "--method", "retromae",
              "--max-len", "48", "--batch-size", "8", "--micro-batch-size", "4", "--steps", "6", "--lr", "5e-4",
              "--log-every", "1", "--save-every", "0", "--warmup-ratio", "0"]
    _run_cli([*common, "--out", str(tmp_path / "one")])
    _run_cli([*common, "--out", str(tmp_path / "two")], nproc=2)
    one, two = read_logs(tmp_path / "one"), read_logs(tmp_path / "two")
    assert len(one) == len(two) == 6
    for a, b in zip(one, two):
        for key in ("loss", "loss/mlm", "loss/enhanced"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key, a[key], b[key])


def test_context_methods_pretrain_from_the_loop(tiny_mlm_dir, small_corpus, tmp_path):
    """cotmae builds (anchor, context) span examples from the corpus instead of plain chunks."""
    final = pretrain(_config(tiny_mlm_dir, small_corpus, tmp_path / "cotmae", method="cotmae", max_steps=3,
                             max_len=32))
    logs = read_logs(tmp_path / "cotmae")
    assert "loss/context_ae" in logs[-1] and "loss/mlm_spans" in logs[-1]
    assert (final / "method.json").exists()


def test_tied_decoder_save_notice_is_demoted_and_other_shared_tensors_still_warn(caplog):
    import logging

    from pretrieve.train.checkpoint import TiedDecoderNotice, tied_decoder_notice

    def record(names):
        return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 1,
                                 f"Removed shared tensor {names} while saving. This should be OK", (), None)

    notice = TiedDecoderNotice()
    with caplog.at_level(logging.DEBUG, logger="pretrieve.train.checkpoint"):
        tied = record({"encoder.model.cls.predictions.decoder.bias", "encoder.model.cls.predictions.decoder.weight"})
        assert notice.filter(tied) is False
    assert "tied decoder tensors saved once" in caplog.text
    assert notice.filter(record({"encoder.model.cls.predictions.decoder.weight", "heads.ae.proj.weight"})) is True
    assert notice.filter(logging.LogRecord("other", logging.WARNING, __file__, 1, "unrelated", (), None)) is True
    installed = lambda: any(isinstance(f, TiedDecoderNotice)   # noqa: E731
                            for f in logging.getLogger("accelerate.utils.other").filters)
    assert not installed()                 # importing the module changes no logger: only a save installs it
    with tied_decoder_notice():
        assert installed()
    assert not installed()
