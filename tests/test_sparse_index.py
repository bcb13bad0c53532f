"""The sparse inverted index, over a part of an index directory written by the index writer: exact top-k against
brute force (dense and sparse queries, through the back-end's searcher of shards too), candidate scoring,
construction from top-k pairs, ties, storage accounting (uint16 term ids), the stored arrays (a damaged file is
refused) and input errors."""

from __future__ import annotations


import numpy as np
import pytest
import scipy.sparse as sp

from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.index import (SearchOptions, backend, open_index, save_arrays, sparse_part_bytes,
                                       term_id_dtype, writing)
from pretrieve.retrieval.index.sparse import SparseSearcher, storage, topk_matrix
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


def sparse_index(path, matrix, ids=None) -> SparseSearcher:
    """An index directory (kind ``sparse``) holding ``matrix`` as its ``sparse`` part, opened and searched."""
    ids = [f"d{i}" for i in range(matrix.shape[0])] if ids is None else ids
    with writing(path, "sparse", ids, {}, {"test": 1}) as tmp:
        save_arrays(tmp, {"sparse": sp.csr_matrix(matrix, dtype=np.float32)})
    return SparseSearcher(open_index(path))


def reference_top(scores: np.ndarray, k: int) -> np.ndarray:
    """Brute-force top-k: score descending, then row ascending."""
    return np.array([np.lexsort((np.arange(len(row)), -row))[:k] for row in scores])


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_search_is_exact_for_dense_and_sparse_queries(corpus, kind, tmp_path):
    indices, values, dense = corpus
    rng = np.random.default_rng(2)
    if kind == "dense":
        queries = rng.standard_normal((9, V)).astype(np.float32)
        as_array = queries.astype(np.float64)
    else:   # SPLADE-style queries: a few positive terms each
        queries = sp.random(9, V, density=0.02, random_state=3, dtype=np.float32,
                            data_rvs=lambda n: rng.uniform(0.1, 2.0, n)).tocsr()
        as_array = queries.toarray().astype(np.float64)
    index = sparse_index(tmp_path / "index", topk_matrix(indices, values, V))
    reference = as_array @ dense.T
    for block_elements in (N, 1 << 26):                       # one query per block, and all at once
        index.block_elements = block_elements
        scores, rows = index.search({"sparse": queries}, 50)
        assert np.array_equal(rows, reference_top(reference, 50))
        assert np.allclose(scores, np.take_along_axis(reference, rows, axis=1), atol=1e-4)
    assert np.allclose(index.score_rows({"sparse": queries}, rows), scores, atol=1e-5)
    searcher = backend("sparse").open_searcher([open_index(tmp_path / "index")], SearchOptions(), "sparse")
    for got, expected in zip(searcher.search({"sparse": queries}, 50), (scores, rows)):
        assert np.array_equal(got, expected)                    # the back-end's searcher of shards, one shard


def test_postings_are_the_inverted_forward_rows(corpus, tmp_path):
    indices, values, dense = corpus
    index = sparse_index(tmp_path / "index", topk_matrix(indices, values, V))
    term = int(indices[0, 0])
    docs = index.postings[term].indices
    assert np.array_equal(docs, np.flatnonzero(dense[:, term]))
    assert np.allclose(index.postings[term].data, dense[docs, term])


def test_from_topk_drops_padding_and_zeros_and_sums_repeats(tmp_path):
    matrix = topk_matrix(np.array([[3, -1, 1], [2, 2, 0]]), np.array([[1.5, 9.0, 0.0], [1.0, 2.0, 0.5]]), 4)
    assert matrix.toarray().tolist() == [[0, 0, 0, 1.5], [0.5, 0, 3.0, 0]] and matrix.nnz == 3
    index = sparse_index(tmp_path / "index", matrix)
    assert index.matrix.toarray().tolist() == [[0, 0, 0, 1.5], [0.5, 0, 3.0, 0]] and index.matrix.nnz == 3
    with pytest.raises(InputError, match="term indices"):
        topk_matrix(np.array([[4]]), np.array([[1.0]]), 4)


def test_ties_break_by_row_and_documents_without_overlap_score_zero(tmp_path):
    index = sparse_index(tmp_path / "index", np.array([[0, 1.0], [2.0, 0], [0, 1.0], [0, 0]]))
    scores, rows = index.search({"sparse": np.array([[0.0, 1.0]])}, 4)
    assert rows.tolist() == [[0, 2, 1, 3]] and scores.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert top_k_rows(np.array([[1.0, 3.0, 3.0, 2.0]]), 2).tolist() == [[1, 2]]
    assert index.score_rows({"sparse": np.array([[0.0, 1.0]])}, np.array([[3, -1]])).tolist() == [[0.0, -np.inf]]


def test_storage_accounting_and_the_stored_arrays(corpus, tmp_path):
    indices, values, dense = corpus
    matrix = topk_matrix(indices, values, V)
    index = sparse_index(tmp_path / "sparse", matrix)
    path = tmp_path / "sparse"
    stored = storage(open_index(path))
    assert stored["sparse_entries"] == K_DOC and stored["dense_bytes"] == 0                 # a sparse-only index
    assert stored["sparse_bytes"] == stored["total_bytes"] == pytest.approx(K_DOC * 6 + (N + 1) * 4 / N)  # uint16 ids
    saved = {part: np.load(path / f"sparse.{part}.npy") for part in ("data", "indices", "indptr")}
    assert saved["indices"].dtype == np.uint16 and saved["indptr"].dtype == np.int32
    assert sum(array.nbytes for array in saved.values()) == sparse_part_bytes(open_index(path), "sparse")["total"]
    assert open_index(path).id_list() == [f"d{i}" for i in range(N)] and (index.matrix != matrix).nnz == 0
    assert sp.csr_matrix((saved["data"], saved["indices"], saved["indptr"])).shape[0] == N   # plain scipy CSR arrays
    queries = np.random.default_rng(5).standard_normal((3, V))
    scores, rows = index.search({"sparse": queries}, 7)
    reference = queries @ dense.T
    assert np.array_equal(rows, reference_top(reference, 7))
    assert np.allclose(scores, np.take_along_axis(reference, rows, axis=1), atol=1e-4)


@pytest.mark.parametrize("dim,stored", [(65536, np.uint16), (65537, np.int32)])
def test_term_ids_are_uint16_up_to_65536_terms_else_int32(dim, stored, tmp_path):
    assert term_id_dtype(dim) is stored
    rng = np.random.default_rng(7)
    indices = np.stack([rng.choice(dim, 12, replace=False) for _ in range(40)])
    indices[0, 0] = dim - 1                                                  # the largest id must survive
    matrix = topk_matrix(indices, rng.uniform(0.1, 1, indices.shape), dim)
    loaded = sparse_index(tmp_path / "s", matrix)
    assert np.load(tmp_path / "s" / "sparse.indices.npy").dtype == stored
    assert storage(open_index(tmp_path / "s"))["sparse_bytes"] == pytest.approx(
        12 * (4 + np.dtype(stored).itemsize) + 41 * 4 / 40)
    assert (loaded.matrix != matrix).nnz == 0 and loaded.matrix[0, dim - 1] == matrix[0, dim - 1] != 0
    queries = sp.random(4, dim, density=0.01, random_state=8, dtype=np.float32).tocsr()
    reference = (queries @ matrix.T).toarray().astype(np.float64)
    assert np.array_equal(loaded.search({"sparse": queries}, 10)[1], reference_top(reference, 10))


def test_a_damaged_or_interrupted_index_is_refused(corpus, tmp_path):
    indices, values, _ = corpus
    path = tmp_path / "s"
    sparse_index(path, topk_matrix(indices, values, V))
    data = path / "sparse.data.npy"
    data.write_bytes(data.read_bytes()[:-8])                                 # truncated after it was written
    with pytest.raises(InputError, match="incomplete or modified.*sparse.data.npy"):
        open_index(path)
    (path / "artifact.json").unlink()                                        # no record of how it was written
    with pytest.raises(InputError, match="no record"):
        open_index(path)


def test_bad_inputs_raise_clear_errors(corpus, tmp_path):
    indices, values, _ = corpus
    index = sparse_index(tmp_path / "s", topk_matrix(indices, values, V))
    with pytest.raises(InputError, match="dimension"):
        index.search({"sparse": np.zeros((1, V + 1))}, 5)
    with pytest.raises(ConfigError, match="k must be"):
        index.search({"sparse": np.zeros((1, V))}, 0)
    with pytest.raises(InputError, match="sparse' vectors"):
        index.search({"embeddings": np.zeros((1, V))}, 5)
    with pytest.raises(InputError, match="ids"):
        sparse_index(tmp_path / "one", index.matrix, ids=["only-one"])
    with pytest.raises(InputError, match="not a pretrieve index"):
        open_index(tmp_path)
