"""The install holds on GPU images: BM25 never starts JAX, and exact dense search runs without FAISS.

GPU images often ship JAX, and bm25s' ``selection`` module imports ``jax.lax`` and runs a top-k with it at
import when it can, which starts XLA and preallocates most of the GPU's memory. A fake ``jax`` package that
records every use stands in for it here, in a fresh interpreter (bm25s may already be imported in this one).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

_FAKE_JAX = {
    "__init__.py": "import os\nopen(os.environ['FAKE_JAX_LOG'], 'a').write('import jax\\n')\n",
    "lax.py": textwrap.dedent("""
        import os
        open(os.environ['FAKE_JAX_LOG'], 'a').write('import jax.lax\\n')

        def top_k(scores, k):
            import numpy as np
            open(os.environ['FAKE_JAX_LOG'], 'a').write('jax.lax.top_k\\n')
            order = np.argsort(-np.asarray(scores), kind="stable")[:k]
            return np.asarray(scores)[order], order
    """),
}

_BM25_SEARCH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    if sys.argv[2] == "first":
        import jax            # a program that uses JAX itself, before BM25
    from pretrieve.retrieval.bm25 import BM25Index
    index = BM25Index.build_from_texts(["d1", "d2", "d3"], ["the cat sat on the mat", "dogs chase cats",
                                                            "a study of mats and rugs"])
    run = index.search({"q1": "cat mats"}, k=3)
    import bm25s.selection
    print(json.dumps({"run": run, "jax_available": bm25s.selection.JAX_IS_AVAILABLE,
                      "backend": index.retriever.backend, "jax_kept": sys.argv[2] != "first" or "jax" in sys.modules}))
""")


@pytest.mark.parametrize("jax_imported", ["never", "first"])
def test_bm25_leaves_jax_alone(tmp_path, jax_imported):
    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True)
    for name, text in _FAKE_JAX.items():
        (fake / name).write_text(text)
    log = tmp_path / "jax.log"
    env = {**__import__("os").environ, "FAKE_JAX_LOG": str(log)}
    result = subprocess.run([sys.executable, "-c", _BM25_SEARCH, str(tmp_path / "site"), jax_imported],
                            capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    used = log.read_text().splitlines() if log.exists() else []
    assert used == (["import jax"] if jax_imported == "first" else []), used   # bm25s neither imported nor ran it
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["jax_available"] is False and report["backend"] == "numpy" and report["jax_kept"]
    ranking = list(report["run"]["q1"])
    assert ranking[0] == "d1" and sorted(ranking) == ["d1", "d2", "d3"]             # the search still searches


# ------------------------------------------------------------------------------- exact search without FAISS
def _without_faiss(monkeypatch):
    """``import faiss`` fails, as on a GPU image without it."""
    monkeypatch.setitem(sys.modules, "faiss", None)


def _tied_vectors():
    """Small-integer vectors (every product exact in float32) with many tied scores, some at the top-k cut."""
    rng = np.random.default_rng(37)
    docs = rng.integers(-2, 3, size=(203, 8)).astype(np.float32)
    docs[50:60] = docs[3]                       # ten copies of one passage, spread over two blocks below
    docs[120:125] = docs[3]
    queries = rng.integers(-2, 3, size=(9, 8)).astype(np.float32)
    queries[0] = 0                              # every passage ties for this query
    return queries, docs


def _by_score_then_row(scores: np.ndarray, k: int) -> np.ndarray:
    return np.stack([np.lexsort((np.arange(len(row)), -row))[:k] for row in scores])


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_exact_search_is_the_same_with_and_without_faiss(metric, tmp_path, monkeypatch):
    from pretrieve.retrieval.index.dense import exact_engine, exact_search

    pytest.importorskip("faiss")
    queries, docs = _tied_vectors()
    np.save(tmp_path / "embeddings.npy", docs)
    with_faiss = exact_search(queries, tmp_path / "embeddings.npy", k=15, metric=metric, block_rows=64)
    assert exact_engine(None) == ("faiss", "cpu")
    _without_faiss(monkeypatch)
    assert exact_engine(None) == ("torch", "cpu")
    without = exact_search(queries, tmp_path / "embeddings.npy", k=15, metric=metric, block_rows=64)
    brute = queries @ docs.T if metric == "ip" else -((queries[:, None] - docs[None]) ** 2).sum(-1)
    expected = _by_score_then_row(brute, 15)                          # ties: the lower row first, also at the cut
    for scores, rows in (with_faiss, without):
        np.testing.assert_array_equal(rows, expected)
        np.testing.assert_array_equal(scores, np.take_along_axis(brute, expected, axis=1))
    if metric == "ip":
        assert without[1][0].tolist() == list(range(15))              # the all-tie query
    small_chunks = exact_search(queries, docs, k=15, metric=metric, block_rows=64)
    np.testing.assert_array_equal(small_chunks[1], expected)          # an array, not a file


def test_torch_top_k_keeps_the_lowest_columns_of_a_tie_at_the_cut():
    import torch

    from pretrieve.retrieval.index.dense import top_k_by_row

    scores = torch.tensor([[1.0, 5.0, 3.0, 3.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    values, columns = top_k_by_row(scores, 3)
    assert columns.tolist() == [[1, 2, 3], [0, 1, 2]] and values.tolist() == [[5.0, 3.0, 3.0], [2.0, 2.0, 2.0]]


def test_the_chunked_torch_search_bounds_the_score_matrix(monkeypatch):
    """Queries go through the product in chunks: no chunk's scores exceed the block's element budget."""
    import torch

    from pretrieve.retrieval.index import dense

    queries, docs = _tied_vectors()
    shapes = []
    real_top_k = dense.top_k_by_row
    monkeypatch.setattr(dense, "top_k_by_row", lambda scores, k: shapes.append(tuple(scores.shape))
                        or real_top_k(scores, k))
    search = dense._torch_block_search("ip", "cpu", block_elements=4 * len(docs))
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")                        # TF32 allowed by the caller …
    try:
        scores, rows = search(queries, docs, 10)
        assert torch.get_float32_matmul_precision() == "high"         # … and allowed again after the search
    finally:
        torch.set_float32_matmul_precision(saved)
    assert shapes == [(4, 203), (4, 203), (1, 203)]
    np.testing.assert_array_equal(rows, _by_score_then_row(queries @ docs.T, 10))


def test_the_same_run_with_and_without_faiss_through_search(tmp_path, tiny_bert_dir, monkeypatch):
    """The search path's run (three shards, blocks of 5 rows) is the same when FAISS cannot be imported."""
    from pretrieve.data.beir import Corpus
    from pretrieve.retrieval.index import SearchOptions
    from pretrieve.retrieval.load import load_retriever
    from pretrieve.retrieval.search import build_index, search

    retriever = load_retriever(tiny_bert_dir, device="cpu", precision="fp32", pooling="mean", normalize=True)
    texts = [f"passage {i} about {'protein gene cat stock market wind'.split()[i % 6]}" for i in range(23)]
    corpus = Corpus(ids=[f"d{i}" for i in range(23)], titles=[""] * 23, texts=texts)
    for shard in range(3):
        build_index(retriever, corpus, tmp_path / "idx", shard=shard, num_shards=3, batch_size=8,
                    show_progress=False)
    queries = {"q1": "protein gene", "q2": "stock market wind", "q3": "cat"}
    pytest.importorskip("faiss")
    options = SearchOptions(block_rows=5)
    with_faiss = search(retriever, queries, tmp_path / "idx", k=10, options=options, show_progress=False)
    _without_faiss(monkeypatch)
    without = search(retriever, queries, tmp_path / "idx", k=10, options=options, show_progress=False)
    assert {q: list(d) for q, d in without.items()} == {q: list(d) for q, d in with_faiss.items()}
    for qid in queries:
        assert without[qid] == pytest.approx(with_faiss[qid], abs=1e-6)


def test_gpu_requests_without_faiss(monkeypatch):
    """No FAISS: torch on CUDA when torch sees a GPU (faked here), the CPU when told; a GPU asked for where
    there is none is a ConfigError."""
    import torch

    from pretrieve.errors import ConfigError
    from pretrieve.retrieval.index.dense import exact_engine, exact_search

    _without_faiss(monkeypatch)
    with pytest.raises(ConfigError, match="GPU"):
        exact_search(np.zeros((1, 2), np.float32), np.zeros((3, 2), np.float32), k=2, use_gpu=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert exact_engine(None) == ("torch", "cuda") and exact_engine(True) == ("torch", "cuda")
    assert exact_engine(False) == ("torch", "cpu")
