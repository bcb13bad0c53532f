"""No model folder runs its own code: a checkpoint whose config.json or tokenizer_config.json has an ``auto_map``
(Python modules of its own for transformers to import) is refused in one line naming the file by every command and
API that loads models — whatever is typed on stdin, with or without a terminal — and every loader passes
``trust_remote_code=False``, so even a folder that got past the check cannot make transformers ask (issue 39)."""

from __future__ import annotations

import builtins
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pretrieve.errors import InputError

from test_finetune import tiny_collection, write_collection  # noqa: F401 - tiny_collection is a fixture

EVIL = '''from pathlib import Path
Path({marker!r}).write_text("ran")
from transformers import BertConfig, BertModel, BertForMaskedLM, BertTokenizerFast


class EvilConfig(BertConfig):
    model_type = "evilbert"


class EvilModel(BertModel):
    config_class = EvilConfig


class EvilMaskedLM(BertForMaskedLM):
    config_class = EvilConfig


class EvilTok(BertTokenizerFast):
    pass
'''


def plant(folder: Path, marker: Path, model_type: str = "evilbert") -> Path:
    """Turn the model ``folder`` into one that asks transformers to import its own ``evil.py`` (which writes
    ``marker``), as the review's ``m_automap2``."""
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel",
                          "AutoModelForMaskedLM": "evil.EvilMaskedLM"}
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["evil.EvilTok", "evil.EvilTok"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return folder


@pytest.fixture
def evil(tiny_mlm_dir, tmp_path) -> tuple[Path, Path]:
    marker = tmp_path / "MARK"
    return plant(Path(shutil.copytree(tiny_mlm_dir, tmp_path / "m")), marker), marker


@pytest.fixture
def evil_retriever(tiny_mlm_dir, tokenizer, tmp_path) -> tuple[Path, Path]:
    """A retriever in pretrieve's own format (dual_encoder.json), its folder planted likewise."""
    from pretrieve.modeling.dual_encoder import DualEncoder

    folder = tmp_path / "ft"
    DualEncoder.from_pretrained(str(tiny_mlm_dir)).save(folder)
    tokenizer.save_pretrained(folder)
    marker = tmp_path / "MARK"
    return plant(folder, marker), marker


def _run(args: list[str], cwd: Path, stdin) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300", "HF_HUB_OFFLINE": "1", "PRETRIEVE_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "pretrieve", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, **stdin)


def _commands(model: Path, data: Path, tmp: Path) -> dict[str, list[str]]:
    from pretrieve.data.groups import TrainingGroup, write_groups

    groups = tmp / "groups.jsonl"
    write_groups([TrainingGroup(f"q{i}", f"what is known about topic {i}?", [f"d{i}"], ["d20", "d21"])
                  for i in range(8)], groups)
    return {
        "dense": ["dense", "--model", str(model), "--data", str(data), "--out", str(tmp / "r.trec")],
        "encode": ["encode", "--model", str(model), "--data", str(data), "--out", str(tmp / "index")],
        "pretrain": ["pretrain", "--model", str(model), "--corpus", str(data), "--out", str(tmp / "pt"),
                     "--steps", "2"],
        "finetune": ["finetune", "--model", str(model), "--data", str(data), "--out", str(tmp / "ft"),
                     "--steps", "2"],
        "reranker train": ["reranker", "train", "--model", str(model), "--data", str(data), "--out", str(tmp / "rr"),
                           "--groups", str(groups), "--steps", "2"],
        "export": ["export", str(model), "--out", str(tmp / "exported")],
        "init-model": ["init-model", "--shape", "L1-H64", "--tokenizer", str(model), "--out", str(tmp / "init")],
    }


@pytest.mark.parametrize("command", ["dense", "encode", "pretrain", "finetune", "reranker train", "export",
                                     "init-model"])
def test_every_command_refuses_a_folder_with_its_own_code_whatever_is_typed(command, evil, evil_retriever,
                                                                            tiny_collection, tmp_path):
    model, marker = evil_retriever if command == "export" else evil
    args = _commands(model, tiny_collection, tmp_path)[command]
    result = _run(args, tmp_path, {"input": "y\ny\ny\n"})          # echo y | pretrieve ...
    assert not marker.exists(), result.stderr
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and str(model / "config.json") in errors[0] and "auto_map" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and "custom code" not in result.stderr


def test_a_terminal_answering_yes_runs_nothing_either(evil, tiny_collection, tmp_path):
    model, marker = evil
    leader, follower = pty.openpty()
    try:
        os.write(leader, b"y\n")
        result = _run(_commands(model, tiny_collection, tmp_path)["dense"], tmp_path,
                      {"stdin": follower})
    finally:
        os.close(leader)
        os.close(follower)
    assert not marker.exists() and result.returncode == 2, result.stderr
    assert "error:" in result.stderr and "auto_map" in result.stderr and "Traceback" not in result.stderr


def test_the_python_api_and_every_loader_refuse_it(evil, tmp_path, monkeypatch):
    import pretrieve
    from pretrieve.modeling.cross_encoder import CrossEncoder
    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.modeling.encoder import Encoder
    from pretrieve.models import resolve_model
    from pretrieve.retrieval.load import load_dense_encoder

    model, marker = evil
    monkeypatch.setattr(builtins, "input", lambda *args: "y")     # whatever a prompt would read: yes
    loaders = [pretrieve.load_retriever, resolve_model, load_dense_encoder, Encoder.from_pretrained,
               DualEncoder.from_pretrained, CrossEncoder.from_pretrained]
    for load in loaders:
        with pytest.raises(InputError, match="auto_map") as caught:
            load(str(model))
        assert str(model / "config.json") in str(caught.value), load
    assert not marker.exists()


def test_a_retriever_in_pretrieves_format_is_refused_by_every_loader(evil_retriever):
    import pretrieve
    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.modeling.export import export_model

    model, marker = evil_retriever
    for load in (pretrieve.load_retriever, DualEncoder.load, lambda path: export_model(path, model.parent / "x")):
        with pytest.raises(InputError, match="auto_map"):
            load(str(model))
    assert not marker.exists()


def test_a_known_family_with_auto_map_and_a_tower_below_are_refused_too(tiny_mlm_dir, tmp_path):
    from pretrieve.models import resolve_model

    marker = tmp_path / "MARK"
    bert = plant(Path(shutil.copytree(tiny_mlm_dir, tmp_path / "bert")), marker, model_type="bert")
    with pytest.raises(InputError, match="auto_map"):
        resolve_model(str(bert))
    outer = tmp_path / "outer"
    shutil.copytree(tiny_mlm_dir, outer)
    plant(Path(shutil.copytree(tiny_mlm_dir, outer / "query")), marker)   # a tower of a fine-tuned retriever
    with pytest.raises(InputError, match="query/tokenizer_config.json|query/config.json"):
        resolve_model(str(outer))
    assert resolve_model(str(tiny_mlm_dir)) == str(tiny_mlm_dir)          # an ordinary folder loads as before
    assert not marker.exists()


def test_loaders_pass_trust_remote_code_false_even_past_the_check(evil, monkeypatch):
    """The check switched off, transformers itself refuses (``trust_remote_code=False``): it never asks on stdin,
    and the answer "y" it would read cannot run the folder's code."""
    import pretrieve.models
    from pretrieve.modeling.encoder import Encoder
    from pretrieve.retrieval.load import load_dense_encoder

    model, marker = evil
    monkeypatch.setattr(pretrieve.models, "refuse_remote_code", lambda *args, **kwargs: None)
    asked = []
    monkeypatch.setattr(builtins, "input", lambda *args: asked.append(args) or "y")
    for load in (load_dense_encoder, Encoder.from_pretrained):
        with pytest.raises(ValueError, match="trust_remote_code"):
            load(str(model))
    assert not asked and not marker.exists()
