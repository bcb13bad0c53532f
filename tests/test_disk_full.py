"""A disk that fills during a checkpoint save loses nothing: one `error:` line and exit 2, the last good checkpoint
kept, the half-written one removed, and --resume continues bit-exactly once space is free; the space preflight
reserves the real peak (keep + 1 checkpoints), removes a killed save's temporary first and, on a resume, counts
only what is left to write. A disk that fills during the final model save is one line too, naming ``final`` and the
checkpoint ``--resume`` continues from (issue 39)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from pretrieve import outputs
from pretrieve.errors import InputError
from pretrieve.train import checkpoint as ckpt
from pretrieve.train.checkpoint import CheckpointWriteError
from pretrieve.train.loop import read_logs
from pretrieve.train.pretrainer import pretrain

from test_guards import _config, corpus  # noqa: F401 - corpus is a fixture

#: Runs the CLI with accelerate's save_state failing like a full disk at its second call (after a partial write).
FULL_DISK_CLI = """
import errno, sys
from pathlib import Path
from accelerate import Accelerator
original, calls = Accelerator.save_state, {"n": 0}
def save_state(self, output_dir=None, **kwargs):
    calls["n"] += 1
    if calls["n"] == 2:
        Path(output_dir, "optimizer.bin").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(output_dir, "optimizer.bin")))
    return original(self, output_dir, **kwargs)
Accelerator.save_state = save_state
from pretrieve.cli import main
sys.argv = ["pretrieve", *sys.argv[1:]]
main()
"""


def _args(model, corpus, out, *extra):  # noqa: F811
    return ["pretrain", "--model", str(model), "--corpus", str(corpus), "--out", str(out), "--method", "mlm",
            "--max-len", "32", "--batch-size", "4", "--steps", "6", "--lr", "5e-4", "--warmup-ratio", "0",
            "--save-every", "2", "--log-every", "1", "--seed", "42", *extra]


def _run(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    command = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "pretrieve", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_a_full_disk_mid_save_exits_2_keeps_the_last_checkpoint_and_resume_is_exact(tiny_mlm_dir, corpus,  # noqa: F811
                                                                                     tmp_path):
    reference = tmp_path / "reference"
    assert _run(*_args(tiny_mlm_dir, corpus, reference)).returncode == 0
    out = tmp_path / "run"
    failed = _run(*_args(tiny_mlm_dir, corpus, out), script=FULL_DISK_CLI)
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert failed.returncode == 2 and len(errors) == 1, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr and "No space left on device" in errors[0]
    assert "--resume to continue from step 2" in errors[0]
    assert [step for step, _ in ckpt.list_checkpoints(out)] == [2]
    assert not list((out / "checkpoints").glob(".*.tmp")), "the half-written checkpoint must be removed"
    resumed = _run(*_args(tiny_mlm_dir, corpus, out, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_logs(out) and [
        {k: v for k, v in row.items() if k != "samples_per_s"} for row in read_logs(out)] == [
        {k: v for k, v in row.items() if k != "samples_per_s"} for row in read_logs(reference)]


def test_a_failed_save_raises_one_line_and_removes_its_temporary(tiny_mlm_dir, corpus, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    from accelerate import Accelerator

    def no_space(self, output_dir=None, **kwargs):
        Path(output_dir, "model.safetensors").write_bytes(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed\nmore detail")

    monkeypatch.setattr(Accelerator, "save_state", no_space)
    with pytest.raises(CheckpointWriteError) as failed:
        pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "run"))
    assert "\n" not in str(failed.value) and "no earlier checkpoint" in str(failed.value)
    assert ckpt.list_checkpoints(tmp_path / "run") == []
    assert not (tmp_path / "run" / "checkpoints" / ".step-2.tmp").exists()


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),   # safetensors'
])
def test_a_full_disk_during_the_final_save_is_one_line_naming_final_and_the_resume(tiny_mlm_dir, corpus,  # noqa: F811
                                                                                  tmp_path, monkeypatch, failure):
    from pretrieve.train.pretrainer import PretrainingRun

    def no_space(self, unwrapped, directory):
        (Path(directory) / "model.safetensors").write_bytes(b"half")
        raise failure

    monkeypatch.setattr(PretrainingRun, "export", no_space)
    out = tmp_path / "run"
    with pytest.raises(CheckpointWriteError) as failed:
        pretrain(_config(tiny_mlm_dir, corpus, out, max_steps=5))
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"{out / 'final'}: the trained model could not be written")
    assert "No space left on device" in message and "--resume (it continues from step 4)" in message
    assert not (out / "final").exists() and not [p for p in out.iterdir() if p.name.startswith(".final")]
    assert [step for step, _ in ckpt.list_checkpoints(out)] == [2, 4]


def test_an_error_of_the_final_save_that_is_no_write_failure_is_not_hidden(tiny_mlm_dir, corpus,  # noqa: F811
                                                                          tmp_path, monkeypatch):
    from pretrieve.train.pretrainer import PretrainingRun

    def broken(self, unwrapped, directory):
        raise KeyError("a bug")

    monkeypatch.setattr(PretrainingRun, "export", broken)
    with pytest.raises(KeyError):
        pretrain(_config(tiny_mlm_dir, corpus, tmp_path / "run", max_steps=2))


def test_the_space_check_reserves_the_peak_and_a_resume_counts_only_what_is_left(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    assert outputs.training_space(model, keep_checkpoints=2) == (1000 * (3 * 3 + 1), 2000)   # 3 exist at the peak
    assert outputs.training_space(model, keep_checkpoints=2, written=2) == (1000 * (3 + 1), 2000)

    # A 15 kB disk: free space is what the files under `out` leave of it.
    out = tmp_path / "out"
    leftover = out / "checkpoints" / ".step-4.tmp"
    leftover.mkdir(parents=True)
    (leftover / "optimizer.bin").write_bytes(b"\0" * 6000)
    os.utime(leftover, (1, 1))   # left by a process killed long ago
    for step in (2, 3):
        (out / "checkpoints" / f"step-{step}").mkdir()
        (out / "checkpoints" / f"step-{step}" / "optimizer.bin").write_bytes(b"\0" * 3000)

    def disk_usage(path):
        used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        return namedtuple("usage", "total used free")(15000, used, 15000 - used)

    monkeypatch.setattr(outputs.shutil, "disk_usage", disk_usage)
    needed, largest = outputs.training_space(model, 2, written=2)
    with outputs.writing(out, needed_bytes=needed, largest_file=largest):   # 4 kB fit once the leftover is gone
        assert not leftover.exists()
    with pytest.raises(InputError, match="only .* free"):
        with outputs.writing(out, needed_bytes=outputs.training_space(model, 2)[0]):
            pass
