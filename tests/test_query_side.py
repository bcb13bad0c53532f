"""Query-side fine-tuning (``train_towers: query``): the full-corpus loss by hand, the passage tower kept byte for
byte, the corpus vectors of the base model reused (no passage encoded in training or in later searches), the
settings it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import pretrieve
from pretrieve import artifacts
from pretrieve.errors import ConfigError
from pretrieve.modeling.dual_encoder import TOWER_FOLDERS
from pretrieve.modeling.losses import full_corpus_loss
from pretrieve.retrieval import cache as embedding_cache
from pretrieve.retrieval import search as search_module
from pretrieve.retrieval.load import load_retriever
from pretrieve.train.finetuner import finetune
from pretrieve.train.loop import read_logs
from test_finetune import make_config, write_collection


def test_full_corpus_loss_equals_the_pairwise_softmax_by_hand():
    torch.manual_seed(0)
    q, passages = torch.randn(3, 4), torch.randn(10, 4)
    positives = torch.tensor([[2, 5, -1], [0, -1, -1], [9, 1, 0]])
    logits = q @ passages.T / 0.5
    by_hand = []
    for i in range(3):
        rows = [r for r in positives[i].tolist() if r >= 0]
        for p in rows:   # each positive against the corpus minus the query's other positives
            keep = [j for j in range(10) if j not in rows or j == p]
            by_hand.append(torch.logsumexp(logits[i, keep], 0) - logits[i, p])
    assert torch.allclose(full_corpus_loss(q @ passages.T, positives, 0.5), torch.stack(by_hand).mean())
    with pytest.raises(ValueError, match="first column"):
        full_corpus_loss(q @ passages.T, torch.tensor([[-1], [0], [1]]), 0.5)


def sentence_transformer_of(bert_dir, out):
    """A tiny sentence-transformers model of ``bert_dir``: mean pooling, normalised (all-MiniLM-L6-v2's layout)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    SentenceTransformer(modules=[Transformer(str(bert_dir), max_seq_length=64), Pooling(32, pooling_mode="mean"),
                                 Normalize()], device="cpu").save(str(out))
    return out


@pytest.fixture(scope="module")
def tiny_st_dir(tmp_path_factory, tiny_bert_dir):
    return sentence_transformer_of(tiny_bert_dir, tmp_path_factory.mktemp("tiny_st"))


def test_query_side_trains_queries_only_and_search_reuses_the_base_models_corpus_vectors(tiny_st_dir, tmp_path,
                                                                                       monkeypatch):
    data = write_collection(tmp_path / "tiny")
    before = pretrieve.search(str(tiny_st_dir), str(data), k=10, show_progress=False)   # fills the user cache
    base = load_retriever(tiny_st_dir)
    index = embedding_cache.corpus_index_dir(base, data / "corpus.jsonl")
    assert (index / "shard-0-of-1" / "embeddings.npy").exists()

    encoded = []
    real = search_module.encode_windows
    monkeypatch.setattr(search_module, "encode_windows", lambda *a, **k: encoded.append(a[0].text_type) or real(*a, **k))
    final = finetune(make_config(tiny_st_dir, data, tmp_path / "qs", train_towers="query", lr=1e-3, max_steps=12,
                                 num_negatives=7, passage_max_len=144, bm25_depth=1000))
    assert encoded == []   # training read the cached vectors: no passage encoded
    logs = read_logs(tmp_path / "qs")
    assert "loss/full_corpus" in logs[0] and "accuracy" in logs[0]
    assert np.mean([r["loss"] for r in logs[-3:]]) < 0.8 * np.mean([r["loss"] for r in logs[:3]])
    info = json.loads((final / "dual_encoder.json").read_text())
    assert info["tied"] is False and info["training"]["train_towers"] == "query"
    assert info["training"]["passage_max_len"] == base.passage.max_length

    # the passage tower is the base model's files, byte for byte; the query tower changed
    tuned = load_retriever(final)
    tower = final / TOWER_FOLDERS["passage"]
    for name in base.passage_files.names:
        assert (tower / name).read_bytes() == (tiny_st_dir / name).read_bytes(), name
    assert artifacts.fingerprint(tuned.passage_files) == artifacts.fingerprint(base.passage_files)
    assert tuned.settings() == base.settings()
    texts = ["protein folding is studied", "jazz music report", "what about comets?"]
    assert np.array_equal(pretrieve.encode(tuned, texts), pretrieve.encode(base, texts))
    assert not np.allclose(pretrieve.encode(tuned, texts, side="query"), pretrieve.encode(base, texts, side="query"))

    # its search uses the base model's corpus index: only queries are encoded
    encoded.clear()
    after = pretrieve.search(tuned, str(data), k=10, show_progress=False)
    assert "passage" not in encoded and embedding_cache.corpus_index_dir(tuned, data / "corpus.jsonl") == index
    assert set(after) == set(before) and after != before


def test_query_side_evaluates_on_the_cached_vectors_and_keeps_the_best(tiny_st_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))   # an empty user cache
    data = write_collection(tmp_path / "tiny")
    encoded = []
    real = search_module.encode_windows
    monkeypatch.setattr(search_module, "encode_windows", lambda *a, **k: encoded.append(a[0].text_type) or real(*a, **k))
    final = finetune(make_config(tiny_st_dir, data, tmp_path / "qs", train_towers="query", lr=1e-3, max_steps=6,
                                 num_negatives=7, passage_max_len=144, bm25_depth=1000, eval_steps=3,
                                 eval_split="test"))
    evaluation = json.loads((final / "evaluation.json").read_text())
    assert [row["step"] for row in evaluation["history"]] == [3, 6] and evaluation["best_step"] in (3, 6)
    assert encoded.count("passage") == 1   # the base model's corpus vectors, once, for training and every evaluation


@pytest.mark.parametrize("setting, value", [("num_negatives", 3), ("stage", 2), ("passage_max_len", 64),
                                            ("tied", False), ("grad_cache_chunk", 4), ("title_join", "sep")])
def test_settings_that_concern_passages_are_refused_by_name(tiny_st_dir, tmp_path, setting, value):
    settings = dict(train_towers="query", num_negatives=7, passage_max_len=144, bm25_depth=1000)
    config = make_config(tiny_st_dir, tmp_path, tmp_path / "out", **(settings | {setting: value}))
    with pytest.raises(ConfigError, match=f"train_towers: query.*{setting}"):
        config.check()


def test_a_base_model_whose_passage_side_is_not_one_transformer_folder_is_refused_before_loading(tiny_bert_dir,
                                                                                                  tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    with_dense = tmp_path / "dense"
    SentenceTransformer(modules=[Transformer(str(tiny_bert_dir), max_seq_length=64), Pooling(32, pooling_mode="mean"),
                                 Dense(32, 16), Normalize()], device="cpu").save(str(with_dense))
    data = write_collection(tmp_path / "tiny")
    with pytest.raises(ConfigError, match="passage side is one transformer folder"):
        finetune(make_config(with_dense, data, tmp_path / "out", train_towers="query", num_negatives=7,
                             passage_max_len=144, bm25_depth=1000))
    assert not (tmp_path / "out" / "qrels_groups.jsonl").exists()


def test_an_unknown_train_towers_value_is_refused():
    from pretrieve.train.finetuner import FinetuneConfig

    with pytest.raises(ConfigError, match="train_towers must be one of both, query"):
        FinetuneConfig(model="m", data="d", out="o", train_towers="passage").check()


def test_two_processes_train_the_query_tower_one_process_trains(tmp_path, tokenizer):
    """``torchrun --nproc_per_node 2`` (gloo) against one process, from an empty user cache each: the corpus is
    encoded once (split across the ranks), every rank scores its queries against all of it, and the trained query
    tower and the copied passage tower are those of one process (one positive per query: the per-rank means average
    to the global mean)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ddp_utils import free_port

    from transformers import BertModel

    from conftest import tiny_bert_config

    torch.manual_seed(0)   # without dropout: its random masks are drawn per process
    BertModel(tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).save_pretrained(
        tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    tiny_st_dir = sentence_transformer_of(tmp_path / "bert", tmp_path / "st")
    repo = Path(__file__).resolve().parents[1]
    data = write_collection(tmp_path / "tiny")
    args = ["-m", "pretrieve", "finetune", "--model", str(tiny_st_dir), "--data", str(data), "--train-towers", "query",
            "--batch-size", "4", "--lr", "1e-3", "--steps", "6", "--warmup-ratio", "0", "--query-max-len", "16"]
    finals = []
    for name, launcher in (("one", [sys.executable]),
                           ("two", [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2",
                                    "--master_port", str(free_port())])):
        env = {**os.environ, "PYTHONPATH": str(repo / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "OMP_NUM_THREADS": "1", "PRETRIEVE_CACHE": str(tmp_path / f"cache-{name}")}
        done = subprocess.run(launcher + args + ["--out", str(tmp_path / name)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        finals.append(tmp_path / name / "final")
    texts = ["what is known about honey bees?", "report on solar energy", "volcano eruption"]
    one, two = (load_retriever(final, precision="fp32") for final in finals)
    assert np.allclose(pretrieve.encode(one, texts, side="query"), pretrieve.encode(two, texts, side="query"),
                       atol=1e-5)
    tower = TOWER_FOLDERS["passage"]
    assert artifacts.fingerprint(artifacts.FileSet(finals[0] / tower, one.passage_files.names)) == \
        artifacts.fingerprint(artifacts.FileSet(finals[1] / tower, one.passage_files.names))
