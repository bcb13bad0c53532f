"""A model folder's weights and Dense config are data, never code, and a bad one is one line naming the file: a
pickle that would run code (``pytorch_model.bin``, zip or legacy format; in the model or in a sentence-transformers
Dense module) and a truncated, random or inconsistent ``model.safetensors`` are refused with the file's path, and a
Dense config may name only the activations sentence-transformers itself writes (issue 39, review items N1/N3)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrieve.errors import ConfigError, InputError

from test_dense import make_st_checkpoint
from test_finetune import tiny_collection  # noqa: F401 - a fixture


class Payload:
    """Unpickling it would run ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _safetensors_header(path: Path) -> None:
    """Point a tensor's data past the end of the file (the review's ``m_st_header``)."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    name = next(key for key in header if key != "__metadata__")
    header[name]["data_offsets"] = [0, 10 ** 9]
    encoded = json.dumps(header).encode()
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + bytes(data[8 + size:]))


def corrupt(folder: Path, how: str, marker: Path) -> Path:
    """Spoil ``folder``'s weights ``how``; returns the spoilt file."""
    weights = folder / "model.safetensors"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "random":
        weights.write_bytes(os.urandom(5000))
    elif how == "offsets":
        _safetensors_header(weights)
    else:
        weights.unlink()
        weights = folder / "pytorch_model.bin"
        if how == "pickle-zip":
            torch.save({"embeddings.word_embeddings.weight": Payload(marker)}, weights)
        else:   # legacy (non-zip) pickle
            with open(weights, "wb") as handle:
                pickle.dump({"embeddings.word_embeddings.weight": Payload(marker)}, handle)
    return weights


HOW = ["truncated", "random", "offsets", "pickle-zip", "pickle-legacy"]


@pytest.mark.parametrize("how", HOW)
def test_bad_weights_are_one_error_naming_the_file_and_run_nothing(how, tiny_bert_dir, tiny_mlm_dir, tmp_path):
    import pretrieve
    from pretrieve.modeling.cross_encoder import CrossEncoder
    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.modeling.encoder import Encoder

    marker = tmp_path / "MARK"
    model = Path(shutil.copytree(tiny_bert_dir, tmp_path / "m"))
    bad = corrupt(model, how, marker)
    mlm = Path(shutil.copytree(tiny_mlm_dir, tmp_path / "mlm"))
    bad_mlm = corrupt(mlm, how, marker)
    for load, folder, file in [(pretrieve.load_retriever, model, bad), (DualEncoder.from_pretrained, model, bad),
                               (CrossEncoder.from_pretrained, model, bad), (Encoder.from_pretrained, mlm, bad_mlm)]:
        with pytest.raises(InputError) as caught:
            load(str(folder))
        assert str(caught.value).startswith(f"{file}: cannot read the model's weights"), (load, caught.value)
    assert not marker.exists()


def test_the_cli_says_it_in_one_line(tiny_bert_dir, tiny_collection, tmp_path):
    marker = tmp_path / "MARK"
    model = Path(shutil.copytree(tiny_bert_dir, tmp_path / "m"))
    bad = corrupt(model, "pickle-zip", marker)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "pretrieve", "dense", "--model", str(model), "--data",
                             str(tiny_collection), "--out", str(tmp_path / "r.trec")], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}: cannot read the model's weights"), result.stderr
    assert not marker.exists()


def test_a_dense_modules_bad_weights_name_that_file(tiny_bert_dir, tmp_path):
    from pretrieve import load_retriever

    marker = tmp_path / "MARK"
    root = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, {"embedding_dimension": 32, "pooling_mode": "cls"},
                              dense=True)
    (root / "2_Dense" / "model.safetensors").unlink()
    torch.save({"linear.weight": Payload(marker)}, root / "2_Dense" / "pytorch_model.bin")
    with pytest.raises(InputError) as caught:
        load_retriever(str(root))
    assert str(caught.value).startswith(f"{root / '2_Dense' / 'pytorch_model.bin'}: cannot read the model's weights")
    assert not marker.exists()


@pytest.mark.parametrize("name", ["os.system", "torch.nn.modules.activation.Tanh.__init__", "torch.hub.load",
                                  "torch.distributed.run.main", "torch.nn.modules.activation.Threshold",
                                  "torch.nn.modules.linear.Linear", "torch.nn.modules.activation.MultiheadAttention"])
def test_a_dense_config_names_only_activations_sentence_transformers_writes(name):
    from pretrieve.modeling.sentence_transformer import check_activation

    imported = set(sys.modules)
    with pytest.raises(ConfigError, match="not one sentence-transformers writes"):
        check_activation(name, "m/2_Dense")
    assert not {module for module in set(sys.modules) - imported if module.startswith("torch")}


@pytest.mark.parametrize("name", ["torch.nn.modules.activation.Tanh", "torch.nn.modules.linear.Identity",
                                  "torch.nn.modules.activation.GELU", "torch.nn.ReLU", None])
def test_the_activations_it_writes_pass_the_check(name):
    from pretrieve.modeling.sentence_transformer import check_activation

    check_activation(name, "m/2_Dense")
