"""A busy output is refused before any model is loaded (issue 22, item 9): `pretrain` (also with the TSDAE method),
`finetune`, `reranker train` and `run`, pointed at an output directory whose lock another process holds, fail with
the busy error at once — every model loader is made to raise here, so a command that loaded first would fail with
that instead, after the download/load the refusal should have saved."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml
from typer.testing import CliRunner

from pretrieve.cli import app
from pretrieve.errors import OutputBusyError

from test_finetune import write_collection


class ModelLoaded(AssertionError):
    """Raised by every model loader while these tests run."""


def _refuse(*args, **kwargs):
    raise ModelLoaded("a model was loaded before the output lock was checked")


@pytest.fixture()
def no_model_loading(monkeypatch):
    """Configs, tokenizers and weights: loading any of them raises :class:`ModelLoaded`."""
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    for owner in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.PretrainedConfig,
                  transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase, _BaseAutoModelClass):
        monkeypatch.setattr(owner, "from_pretrained", _refuse)


@contextlib.contextmanager
def holding(out: Path):
    """``out`` locked by another process (a running command) while the context lasts."""
    out.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pretrieve.outputs import DirectoryLock; "
                               f"lock = DirectoryLock({str(out)!r}); lock.acquire(); print('locked', flush=True); time.sleep(300)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield out
    finally:
        holder.kill()
        holder.wait(timeout=60)


def _busy(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, OutputBusyError), (result.exception, result.output[-2000:])
    assert "being written by another pretrieve process" in str(result.exception)


@pytest.fixture()
def held(tmp_path):
    with holding(tmp_path / "busy") as out:
        yield out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = write_collection(tmp_path_factory.mktemp("busy") / "tiny")
    groups = root.parent / "groups.jsonl"
    groups.write_text(json.dumps({"query_id": "q0", "positives": ["d0"], "negatives": ["d20", "d21"]}) + "\n")
    return root, groups


@pytest.mark.parametrize("method", ["mlm", "tsdae"])
def test_pretrain_refuses_a_busy_output_before_loading_the_model(tiny_mlm_dir, data, held, no_model_loading,
                                                                 method):
    _busy(["pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(data[0] / "corpus.jsonl"), "--out", str(held),
           "--method", method, "--max-len", "32", "--steps", "2", "--batch-size", "4"])


def test_finetune_refuses_a_busy_output_before_loading_the_model(tiny_mlm_dir, data, held, no_model_loading):
    _busy(["finetune", "--model", str(tiny_mlm_dir), "--data", str(data[0]), "--out", str(held), "--stage", "1",
           "--steps", "2", "--batch-size", "4"])


def test_reranker_train_refuses_a_busy_output_before_loading_the_model(tiny_mlm_dir, data, held,
                                                                       no_model_loading):
    _busy(["reranker", "train", "--model", str(tiny_mlm_dir), "--data", str(data[0]), "--groups", str(data[1]),
           "--out", str(held), "--steps", "2", "--batch-size", "2"])


@pytest.mark.parametrize("smoke", [False, True])
def test_run_refuses_a_busy_output_before_loading_a_model(tiny_mlm_dir, data, held, no_model_loading, tmp_path,
                                                           smoke):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "out": str(held), "model": str(tiny_mlm_dir), "data": str(data[0]),
        "stages": [{"finetune": {"stage": 1, "max_steps": 2, "batch_size": 4}},
                   {"evaluate": {"split": "test", "depth": 20}}]}))
    if smoke:   # --smoke writes <out>-smoke
        with holding(held.parent / f"{held.name}-smoke"):
            _busy(["run", str(recipe), "--no-progress", "--smoke"])
    else:
        _busy(["run", str(recipe), "--no-progress"])
