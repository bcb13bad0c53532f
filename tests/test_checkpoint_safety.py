"""A checkpoint never runs code: a code-running pickle planted in any file a resume reads is refused, not run."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from pretrieve.errors import InexactResumeError
from pretrieve.train.pretrainer import pretrain

from test_guards import _cli, _config, _interrupt_at, corpus  # noqa: F401 - corpus is a fixture


class Payload:
    """Unpickling this runs ``touch <marker>`` (what an attacker would plant in a shared checkpoint)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def interrupted(tiny_mlm_dir, corpus, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("interrupted") / "run"
    monkeypatch = pytest.MonkeyPatch()
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        pretrain(_config(tiny_mlm_dir, corpus, out))
    monkeypatch.undo()
    return out


def _plant(run: Path, name: str, marker: Path) -> None:
    path = run / "checkpoints" / "step-2" / name
    assert path.exists(), sorted(p.name for p in path.parent.iterdir())
    if path.suffix in (".bin", ".pkl"):
        torch.save({"x": Payload(marker)}, path)   # the format accelerate writes: a zip of a pickle
    else:
        path.write_bytes(pickle.dumps({"x": Payload(marker)}))


@pytest.mark.parametrize("name", ["random_states_0.pkl", "optimizer.bin", "scheduler.bin", "model.safetensors",
                                  "trainer_state.json"])
def test_a_planted_pickle_is_refused_and_never_run(interrupted, tiny_mlm_dir, corpus, tmp_path, name):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(interrupted, run)
    marker = tmp_path / "PWNED"
    _plant(run, name, marker)
    with pytest.raises(InexactResumeError) as refused:
        pretrain(_config(tiny_mlm_dir, corpus, run, resume=True))
    assert not marker.exists(), f"resuming ran the code planted in {name}"
    message = str(refused.value)
    assert "\n" not in message and "step-2" in message


def test_the_cli_refuses_a_planted_rng_file_in_one_line_with_exit_2(interrupted, tiny_mlm_dir, corpus,  # noqa: F811
                                                                    tmp_path):
    run = tmp_path / "run"
    shutil.copytree(interrupted, run)
    marker = tmp_path / "PWNED"
    _plant(run, "random_states_0.pkl", marker)
    result = _cli("pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(corpus), "--out", str(run),
                  "--method", "mlm", "--max-len", "32", "--batch-size", "4", "--steps", "6", "--lr", "5e-4",
                  "--warmup-ratio", "0", "--save-every", "2", "--log-every", "1", "--resume")
    assert not marker.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "random_states_0.pkl" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
