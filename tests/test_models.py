"""Model resolution: local paths, offline aliases, hub names without a network."""

from __future__ import annotations

import socket
import time

import pytest

from pretrieve import models
from pretrieve.errors import InputError


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
