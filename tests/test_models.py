"""Model resolution: local paths, offline aliases, hub names without a network."""

from __future__ import annotations

import socket
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoTokenizer

from conftest import minilm_path
from pretrieve import models
from pretrieve.cli import main
from pretrieve.errors import ConfigError, InputError, StaleOutputError
from pretrieve.modeling import Encoder


def test_local_directory_and_missing_path(tmp_path):
    assert models.resolve_model(tmp_path) == str(tmp_path)
    with pytest.raises(InputError, match="model directory not found"):
        models.resolve_model(str(tmp_path / "nope"))


def test_unreachable_hub_fails_at_once_with_the_reason(monkeypatch):
    monkeypatch.setattr(models, "hub_cached", lambda name: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.pretrieve-test.invalid")  # .invalid never resolves (RFC 2606)
    began = time.perf_counter()
    with pytest.raises(InputError, match=r"model 'bert-base-uncased' is not a local directory, not an offline alias "
                                         r"\(.*minilm.*hub cannot be reached \(hub\.pretrieve-test\.invalid:443: "):
        models.resolve_model("bert-base-uncased")
    assert time.perf_counter() - began < 10


def test_offline_mode_is_named_and_cached_or_reachable_hub_names_pass(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "hub_cached", lambda name: False)
    with pytest.raises(InputError, match="HF_HUB_OFFLINE is set"):
        models.resolve_model("bert-base-uncased")
    monkeypatch.setattr(models, "hub_cached", lambda name: True)      # in the local cache: loads offline
    assert models.resolve_model("bert-base-uncased") == "bert-base-uncased"

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(models, "hub_cached", lambda name: False)
    opened = []

    class Connection:
        def close(self):
            opened.append("closed")

    monkeypatch.setattr(socket, "create_connection", lambda address, timeout: opened.append(address) or Connection())
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example:8080")
    assert models.resolve_model("bert-base-uncased") == "bert-base-uncased"
    assert opened == [("mirror.example", 8080), "closed"]


def test_hub_cache_lookup_rejects_invalid_ids_quietly():
    assert models.hub_cached("not a valid/repo/id with spaces") is False


def test_parse_shape():
    assert models.parse_shape("L2-H128") == (2, 128) and models.parse_shape(" L12-H768 ") == (12, 768)
    for bad in ("L2H128", "L0-H128", "L2-H100", "L2-H32", "H128-L2", "l2-h128", ""):
        with pytest.raises(ConfigError, match="expected L<layers>-H<hidden>"):
            models.parse_shape(bad)


def test_init_model_is_a_seeded_random_bert_with_the_tokenizers_vocabulary(tmp_path):
    vocabulary = str(minilm_path())
    first = models.init_model("L1-H64", vocabulary, tmp_path / "a", seed=5)
    state = torch.random.get_rng_state()
    again = models.init_model("L1-H64", vocabulary, tmp_path / "b", seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)            # the caller's RNG is left alone
    other = models.init_model("L1-H64", vocabulary, tmp_path / "c", seed=6)
    weights = [load_file(str(path / "model.safetensors")) for path in (first, again, other)]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not torch.equal(weights[0]["bert.embeddings.word_embeddings.weight"],
                           weights[2]["bert.embeddings.word_embeddings.weight"])
    model = AutoModelForMaskedLM.from_pretrained(str(first))
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size) == (
        1, 64, 1, 256)
    tokenizer = AutoTokenizer.from_pretrained(str(first))
    assert config.vocab_size == len(tokenizer) == len(AutoTokenizer.from_pretrained(vocabulary)) == 30522
    assert tokenizer("Hello")["input_ids"] == AutoTokenizer.from_pretrained(vocabulary)("Hello")["input_ids"]
    assert not Encoder.from_pretrained(first).head_created                 # ready for an MLM recipe
    assert models.init_model("L1-H64", vocabulary, first, seed=5) == first  # same settings: kept
    with pytest.raises(StaleOutputError, match=r"seed: 5 -> 7"):
        models.init_model("L1-H64", vocabulary, first, seed=7)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(StaleOutputError, match="already exists"):
        models.init_model("L1-H64", vocabulary, tmp_path / "busy")


def test_init_model_command(tmp_path, monkeypatch, capsys):
    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["pretrieve", "init-model", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        captured = capsys.readouterr()
        return exit_.value.code, captured.out, captured.err

    code, _, err = run("--shape", "L2-H100", "--tokenizer", str(minilm_path()), "--out", str(tmp_path / "m"))
    assert code == 2 and err.startswith("error: --shape 'L2-H100': expected") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists()
    code, out, _ = run("--shape", "L1-H64", "--tokenizer", str(minilm_path()), "--out", str(tmp_path / "m"),
                       "--seed", "3")
    assert code == 0 and "initialised model:" in out and (tmp_path / "m" / "config.json").exists()
