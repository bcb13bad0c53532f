"""Ctrl-C (exit 130) and SIGTERM (exit 143) while training say what was kept and that --resume continues from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrieve.train import checkpoint as ckpt

from test_guards import corpus  # noqa: F401 - a fixture


def _default_sigint() -> None:
    """In the child: SIGINT back to its default, so that Python turns it into KeyboardInterrupt even when the suite
    itself was started in the background of a shell without job control (which starts it with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sent, code, what", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_an_interrupted_run_says_what_was_kept_and_how_to_resume(tiny_mlm_dir, corpus, tmp_path, sent, code,  # noqa: F811
                                                                  what):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    process = subprocess.Popen([sys.executable, "-m", "pretrieve", "pretrain", "--model", str(tiny_mlm_dir),
                                "--corpus", str(corpus), "--out", str(out), "--method", "mlm", "--max-len", "32",
                                "--batch-size", "4", "--steps", "100000", "--lr", "5e-4", "--save-every", "2",
                                "--log-every", "1"], stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=_default_sigint)
    deadline = time.time() + 240
    while not ckpt.list_checkpoints(out) and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert ckpt.list_checkpoints(out), "no checkpoint was written"
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr[-2000:]
    kept = ckpt.list_checkpoints(out)[-1]
    lines = [line for line in stderr.splitlines() if f"interrupted ({what})" in line]
    assert len(lines) == 1 and str(kept[1]) in lines[0] and f"--resume to continue from step {kept[0]}" in lines[0]
    assert "Traceback" not in stderr
