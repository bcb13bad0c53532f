"""The sparse inverted index: exact top-k against brute force (dense and sparse queries), candidate scoring,
construction from top-k pairs, ties, storage accounting (uint16 term ids), save/load in the index format (a
damaged file is refused) and input errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.index import term_id_dtype
from pretrieve.retrieval.index.sparse import SparseIndex
from pretrieve.retrieval.index.topk import top_k_rows

N, V, K_DOC = 1500, 800, 25


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices [N, k], values [N, k], the same documents as a dense float64 [N, V] matrix)."""
    rng = np.random.default_rng(1)
    indices = np.stack([rng.choice(V, K_DOC, replace=False) for _ in range(N)])
    values = rng.standard_normal((N, K_DOC)).astype(np.float32)
    dense = np.zeros((N, V))
    np.put_along_axis(dense, indices, values, axis=1)
    return indices, values, dense


def reference_top(scores: np.ndarray, k: int) -> np.ndarray:
    """Brute-force top-k: score descending, then row ascending."""
    return np.array([np.lexsort((np.arange(len(row)), -row))[:k] for row in scores])


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_search_is_exact_for_dense_and_sparse_queries(corpus, kind):
    indices, values, dense = corpus
    rng = np.random.default_rng(2)
    if kind == "dense":
        queries = rng.standard_normal((9, V)).astype(np.float32)
        as_array = queries.astype(np.float64)
    else:   # SPLADE-style queries: a few positive terms each
        queries = sp.random(9, V, density=0.02, random_state=3, dtype=np.float32,
                            data_rvs=lambda n: rng.uniform(0.1, 2.0, n)).tocsr()
        as_array = queries.toarray().astype(np.float64)
    index = SparseIndex.from_topk(indices, values, V, ids=[f"d{i}" for i in range(N)])
    reference = as_array @ dense.T
    for block_elements in (N, 1 << 26):                       # one query per block, and all at once
        scores, rows = index.search(queries, 50, block_elements=block_elements)
        assert np.array_equal(rows, reference_top(reference, 50))
        assert np.allclose(scores, np.take_along_axis(reference, rows, axis=1), atol=1e-4)
    assert np.allclose(index.score_rows(queries, rows), scores, atol=1e-5)
    run = index.search_run(queries, [f"q{i}" for i in range(9)], 3)
    assert list(run["q0"]) == [f"d{r}" for r in rows[0, :3]]


def test_postings_are_the_inverted_forward_rows(corpus):
    indices, values, dense = corpus
    index = SparseIndex.from_topk(indices, values, V)
    term = int(indices[0, 0])
    docs = index.postings[term].indices
    assert np.array_equal(docs, np.flatnonzero(dense[:, term]))
    assert np.allclose(index.postings[term].data, dense[docs, term])


def test_from_topk_drops_padding_and_zeros_and_sums_repeats():
    index = SparseIndex.from_topk(np.array([[3, -1, 1], [2, 2, 0]]), np.array([[1.5, 9.0, 0.0], [1.0, 2.0, 0.5]]), 4)
    assert index.matrix.toarray().tolist() == [[0, 0, 0, 1.5], [0.5, 0, 3.0, 0]]
    assert index.nnz == 3 and index.ids == ["0", "1"]
    with pytest.raises(InputError, match="term indices"):
        SparseIndex.from_topk(np.array([[4]]), np.array([[1.0]]), 4)


def test_ties_break_by_row_and_documents_without_overlap_score_zero():
    index = SparseIndex.from_dense(np.array([[0, 1.0], [2.0, 0], [0, 1.0], [0, 0]]))
    scores, rows = index.search(np.array([[0.0, 1.0]]), 4)
    assert rows.tolist() == [[0, 2, 1, 3]] and scores.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert top_k_rows(np.array([[1.0, 3.0, 3.0, 2.0]]), 2).tolist() == [[1, 2]]
    assert index.score_rows(np.array([[0.0, 1.0]]), np.array([[3, -1]])).tolist() == [[0.0, -np.inf]]


def test_storage_accounting_and_save_load_round_trip(corpus, tmp_path):
    indices, values, _ = corpus
    index = SparseIndex.from_topk(indices, values, V, ids=[f"d{i}" for i in range(N)])
    storage = index.storage_bytes()
    assert storage["per_entry"] == 4 + 2 and storage["entries_per_document"] == K_DOC     # uint16 term ids
    assert storage["per_document"] == pytest.approx(K_DOC * 6 + (N + 1) * 4 / N)
    path = index.save(tmp_path / "sparse")
    saved = {part: np.load(path / f"sparse.{part}.npy") for part in ("data", "indices", "indptr")}
    assert saved["indices"].dtype == np.uint16 and saved["indptr"].dtype == np.int32
    assert sum(array.nbytes for array in saved.values()) == storage["total"]
    loaded = SparseIndex.load(path)
    assert list(loaded.ids) == index.ids and (loaded.matrix != index.matrix).nnz == 0
    assert sp.csr_matrix((saved["data"], saved["indices"], saved["indptr"])).shape[0] == N   # plain scipy CSR arrays
    queries = np.random.default_rng(5).standard_normal((3, V))
    for original, reread in zip(index.search(queries, 7), loaded.search(queries, 7)):
        assert np.array_equal(original, reread)                              # identical results, not just close


@pytest.mark.parametrize("dim,stored", [(65536, np.uint16), (65537, np.int32)])
def test_term_ids_are_uint16_up_to_65536_terms_else_int32(dim, stored, tmp_path):
    assert term_id_dtype(dim) is stored
    rng = np.random.default_rng(7)
    indices = np.stack([rng.choice(dim, 12, replace=False) for _ in range(40)])
    indices[0, 0] = dim - 1                                                  # the largest id must survive
    index = SparseIndex.from_topk(indices, rng.uniform(0.1, 1, indices.shape), dim)
    assert index.storage_bytes()["per_entry"] == 4 + np.dtype(stored).itemsize
    loaded = SparseIndex.load(index.save(tmp_path / "s"))
    assert (loaded.matrix != index.matrix).nnz == 0 and loaded.matrix[0, dim - 1] == index.matrix[0, dim - 1] != 0
    queries = sp.random(4, dim, density=0.01, random_state=8, dtype=np.float32).tocsr()
    assert np.array_equal(loaded.search(queries, 10)[1], index.search(queries, 10)[1])


def test_a_damaged_or_interrupted_index_is_refused(corpus, tmp_path):
    indices, values, _ = corpus
    path = SparseIndex.from_topk(indices, values, V).save(tmp_path / "s")
    data = path / "sparse.data.npy"
    data.write_bytes(data.read_bytes()[:-8])                                 # truncated after it was written
    with pytest.raises(InputError, match="incomplete or modified.*sparse.data.npy"):
        SparseIndex.load(path)
    (path / "artifact.json").unlink()                                        # no record of how it was written
    with pytest.raises(InputError, match="no record"):
        SparseIndex.load(path)


def test_bad_inputs_raise_clear_errors(corpus, tmp_path):
    indices, values, _ = corpus
    index = SparseIndex.from_topk(indices, values, V)
    with pytest.raises(InputError, match="dimension"):
        index.search(np.zeros((1, V + 1)), 5)
    with pytest.raises(ConfigError, match="k must be"):
        index.search(np.zeros((1, V)), 0)
    with pytest.raises(InputError, match="ids"):
        SparseIndex(index.matrix, ids=["only-one"])
    with pytest.raises(InputError, match="not a pretrieve index"):
        SparseIndex.load(tmp_path)
