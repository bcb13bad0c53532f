"""Search with sparse/hybrid fine-tuned models (paper 004 Table 3): every mode against brute-force scoring by the
model itself, RRF by hand, the corpus cache, CoT-MoTE routing (queries through Q-FFN), the mining dispatch and
``pretrieve dense --mode`` against the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import tiny_bert_config
from pretrieve.data.beir import Corpus
from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder
from pretrieve.modeling.dual_encoder import DualEncoder
from pretrieve.modeling.export import export_retriever
from pretrieve.modeling.representations.sparse import HybridRepresentation, SparseRepresentation
from pretrieve.retrieval.batches import encode_all
from pretrieve.retrieval.index import SearchOptions, backend, find_shards, open_index
from pretrieve.retrieval.index.sparse import resolve_mode, shard_searcher, storage
from pretrieve.retrieval.index.topk import rrf_fuse
from pretrieve.retrieval.load import load_retriever, retriever_kind
from pretrieve.retrieval.search import build_index, search

from test_finetune import write_collection

QUERY_LEN, PASSAGE_LEN = 12, 24
ALPHA, BETA = 0.7, 1.3
MLM_BIAS = -0.35   # a random MLM head gives every term a positive logit; this bias leaves a few hundred per text
INDEX_DIR = "shard-0-of-1"


def dense_search(model_dir, corpus, queries, k, cache_dir=None, mode=None, precision="fp32", **options):
    """The one search path (:func:`pretrieve.retrieval.search.search`) with the model loaded on the CPU."""
    retriever = load_retriever(model_dir, device="cpu", precision=precision)
    return search(retriever, queries, corpus, k=k, cache_dir=cache_dir, mode=mode, show_progress=False,
                  options=SearchOptions(**options))


@pytest.fixture(scope="module")
def sparse_mlm_dir(tmp_path_factory, tokenizer) -> Path:
    """The tiny random BertForMaskedLM with a negative MLM bias, so its SPLADE vectors are sparse."""
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_bert_config())
    with torch.no_grad():
        model.cls.predictions.bias.fill_(MLM_BIAS)
    out = tmp_path_factory.mktemp("sparse_mlm")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def saved_model(base: Path, representation, out: Path) -> Path:
    """A dual encoder with ``representation`` saved as fine-tuning saves it (lengths in ``training``)."""
    model = DualEncoder.from_pretrained(base, representation=representation)
    from transformers import AutoTokenizer

    return export_retriever(model, AutoTokenizer.from_pretrained(str(base)), out, PASSAGE_LEN,
                            training={"query_max_len": QUERY_LEN, "passage_max_len": PASSAGE_LEN})


@pytest.fixture(scope="module")
def hybrid_dir(sparse_mlm_dir, tmp_path_factory) -> Path:
    rep = HybridRepresentation(32, dense_weight=ALPHA, sparse_weight=BETA)
    return saved_model(sparse_mlm_dir, rep, tmp_path_factory.mktemp("hybrid") / "final")


@pytest.fixture(scope="module")
def synthetic(tokenizer) -> tuple[Corpus, dict[str, str]]:
    """300 passages and 9 queries of random whole-word vocabulary entries (seeded)."""
    rng = np.random.default_rng(0)
    words = [w for w in tokenizer.convert_ids_to_tokens(list(range(2000, 8000))) if w.isalpha()]
    texts = [" ".join(rng.choice(words, rng.integers(8, 30))) for _ in range(300)]
    corpus = Corpus([f"d{i}" for i in range(300)], [""] * 300, texts)
    queries = {f"q{i}": " ".join(rng.choice(words, rng.integers(2, 6))) for i in range(9)}
    return corpus, queries


def reference_parts(model_dir: Path, corpus: Corpus, queries: dict[str, str]):
    """Brute force by the model itself: one padded batch per side, ``representation.split`` → dense, sparse."""
    model = DualEncoder.load(model_dir).eval()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def encode(texts, side, length):
        batch = tokenizer(texts, padding=True, truncation=True, max_length=length, return_tensors="pt")
        with torch.no_grad():
            rep = model.encode(side, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        if model.representation.kind == "hybrid":
            return [part.double().numpy() for part in model.representation.split(rep)]
        return [None, rep.double().numpy()]

    q = encode([queries[qid] for qid in queries], "query", QUERY_LEN)
    p = encode(corpus.full_texts(), "passage", PASSAGE_LEN)
    return model, q, p


def assert_top_k(run: dict, query_ids, corpus: Corpus, reference: np.ndarray, k: int, tol: float = 1e-4) -> None:
    """``run`` is the brute-force top-``k`` of ``reference [Q, N]`` (float64): same scores at the returned rows,
    descending, nothing better left out; identical rankings apart from swaps within ``tol``."""
    for q, qid in enumerate(query_ids):
        ranked = sorted(run[qid].items(), key=lambda item: -item[1])
        assert len(ranked) == k
        rows = np.array([corpus.row(doc) for doc, _ in ranked])
        scores = np.array([score for _, score in ranked])
        kth = np.sort(reference[q])[::-1][k - 1]
        assert np.allclose(scores, reference[q, rows], atol=tol)
        assert np.all(reference[q, rows] >= kth - tol)
        order = np.lexsort((np.arange(reference.shape[1]), -reference[q]))[:k]
        differ = rows != order
        assert np.all(np.abs(reference[q, rows[differ]] - reference[q, order[differ]]) <= tol)


# ------------------------------------------------------------------------------------------------ exactness
def test_hybrid_sparse_and_dense_top_100_equal_brute_force(hybrid_dir, synthetic, tmp_path):
    corpus, queries = synthetic
    model, (q_dense, q_sparse), (p_dense, p_sparse) = reference_parts(hybrid_dir, corpus, queries)
    assert 20 < (p_sparse > 0).sum(axis=1).mean() < 5000                      # sparse vectors, not dense ones
    references = {"dense": q_dense @ p_dense.T, "sparse": q_sparse @ p_sparse.T,
                  "hybrid": ALPHA * (q_dense @ p_dense.T) + BETA * (q_sparse @ p_sparse.T)}
    with torch.no_grad():   # the model's own score (eq. 6 with the trained α, β) is the hybrid reference
        reps = [torch.from_numpy(np.concatenate(part, axis=1)) for part in ((q_dense, q_sparse), (p_dense, p_sparse))]
        assert np.allclose(model.score(*reps).numpy(), references["hybrid"], atol=1e-8)
    cache = tmp_path / "cache"
    for mode in ("hybrid", "sparse", "dense"):
        run = dense_search(hybrid_dir, corpus, queries, k=100, cache_dir=cache, mode=mode)
        assert_top_k(run, list(queries), corpus, references[mode], 100)
    default = dense_search(hybrid_dir, corpus, queries, k=100, cache_dir=cache)
    assert default == dense_search(hybrid_dir, corpus, queries, k=100, cache_dir=cache,
                                   mode="hybrid")                            # a hybrid model searches as trained
    meta = json.loads((cache / INDEX_DIR / "meta.json").read_text())
    assert meta["passage"]["max_length"] == PASSAGE_LEN and meta["passage"]["representation"]["dense_weight"] == ALPHA
    approximate = dense_search(hybrid_dir, corpus, queries, k=10, cache_dir=cache, mode="dense", factory="HNSW16",
                               ef_search=300)                                # a FAISS index for the [CLS] part
    exact = dense_search(hybrid_dir, corpus, queries, k=10, cache_dir=cache, mode="dense")
    assert (cache / f"{INDEX_DIR}.HNSW16.ip" / "index.faiss").exists()
    assert np.mean([len(set(approximate[q]) & set(exact[q])) / 10 for q in queries]) >= 0.9


def test_sparse_model_searches_sparse_by_default_and_refuses_dense_modes(sparse_mlm_dir, synthetic, tmp_path):
    corpus, queries = synthetic
    model_dir = saved_model(sparse_mlm_dir, SparseRepresentation(), tmp_path / "sparse")
    assert retriever_kind(model_dir) == "sparse" and resolve_mode("sparse", None) == "sparse"
    _, (_, q_sparse), (_, p_sparse) = reference_parts(model_dir, corpus, queries)
    run = dense_search(model_dir, corpus, queries, k=100)
    assert_top_k(run, list(queries), corpus, q_sparse @ p_sparse.T, 100)
    for mode in ("dense", "hybrid", "rrf"):
        with pytest.raises(ConfigError, match="needs the dense"):
            dense_search(model_dir, corpus, queries, k=5, mode=mode)


def test_weights_can_be_overridden_and_the_cache_is_reused(hybrid_dir, synthetic, tmp_path, monkeypatch):
    from pretrieve.retrieval import search as module

    corpus, queries = synthetic
    _, (q_dense, q_sparse), (p_dense, p_sparse) = reference_parts(hybrid_dir, corpus, queries)
    cache = tmp_path / "cache"
    dense_search(hybrid_dir, corpus, queries, k=3, cache_dir=cache)
    calls = []
    windows, everything = module.encode_windows, module.encode_all
    monkeypatch.setattr(module, "encode_windows", lambda side, *a, **kw: calls.append(side.text_type)
                        or windows(side, *a, **kw))
    monkeypatch.setattr(module, "encode_all", lambda side, *a, **kw: calls.append(side.text_type)
                        or everything(side, *a, **kw))
    run = dense_search(hybrid_dir, corpus, queries, k=50, cache_dir=cache, dense_weight=0.0, sparse_weight=2.0)
    assert calls == ["query"]                                                   # passages came from the cache
    assert_top_k(run, list(queries), corpus, 2.0 * (q_sparse @ p_sparse.T), 50)
    changed = Corpus(corpus.ids, corpus.titles, corpus.texts[:-1] + ["a different last passage"])
    dense_search(hybrid_dir, changed, queries, k=3, cache_dir=cache)
    assert calls[1:] == ["passage", "query"]                                    # edited texts: re-encoded


# ------------------------------------------------------------------------------------------------------ RRF
def test_rrf_fuses_ranks_as_by_hand():
    dense, sparse = np.array([[2, 0, 1], [5, 7, -1]]), np.array([[0, 3, 2], [7, 5, -1]])
    scores, rows = rrf_fuse([dense, sparse], k=10)
    # query 0: d0 = 1/62 + 1/61, d2 = 1/61 + 1/63, d3 = 1/62, d1 = 1/63; query 1: a tie, the lower row first
    assert rows[0].tolist() == [0, 2, 3, 1]
    assert np.allclose(scores[0], [1 / 61 + 1 / 62, 1 / 61 + 1 / 63, 1 / 62, 1 / 63], rtol=1e-12)
    assert rows[1].tolist() == [5, 7, -1, -1] and scores[1, 0] == scores[1, 1] == 1 / 61 + 1 / 62
    assert np.isneginf(scores[1, 2:]).all()
    assert rrf_fuse([dense, sparse], k=2)[1].tolist() == [[0, 2], [5, 7]]
    assert np.allclose(rrf_fuse([dense], k=1, rrf_k=0)[0], [[1.0], [1.0]])


def test_rrf_mode_fuses_the_exact_dense_and_sparse_rankings(hybrid_dir, synthetic, tmp_path):
    """RRF by hand over the complete dense and sparse runs (depth 1000 > N; both checked against brute force
    above; deep ranks hold float32 near-ties, so the hand fusion starts from the searched rankings)."""
    corpus, queries = synthetic
    cache = tmp_path / "cache"
    run = dense_search(hybrid_dir, corpus, queries, k=20, cache_dir=cache, mode="rrf")
    full = [dense_search(hybrid_dir, corpus, queries, k=len(corpus), cache_dir=cache, mode=mode)
            for mode in ("dense", "sparse")]
    for qid in queries:
        fused: dict[int, float] = {}
        for ranking in full:
            rows = sorted((corpus.row(doc) for doc in ranking[qid]), key=lambda row: (-ranking[qid][corpus.ids[row]], row))
            for rank, row in enumerate(rows, start=1):
                fused[row] = fused.get(row, 0.0) + 1.0 / (60 + rank)
        expected = sorted(fused, key=lambda row: (-fused[row], row))[:20]
        got = sorted(run[qid], key=lambda doc: (-run[qid][doc], corpus.row(doc)))
        assert [corpus.row(doc) for doc in got] == expected
        assert np.allclose([run[qid][doc] for doc in got], [fused[row] for row in expected], rtol=1e-9)


def test_index_holds_the_encoder_outputs_and_every_mode_searches_it(hybrid_dir, synthetic, tmp_path):
    """The index ``build_index`` writes holds exactly what the batch encoder gives; the back-end's searcher of each
    mode (a searcher composed of searchers for hybrid and rrf) gives the run of :func:`search`, one query per
    score block gives the same ranking, and the storage is what the stored arrays take."""
    corpus, queries = synthetic
    retriever = load_retriever(hybrid_dir, device="cpu", precision="fp32")
    assert (retriever.passage.max_length, retriever.query.max_length) == (PASSAGE_LEN, QUERY_LEN)
    encoded = encode_all(retriever.passage, corpus.full_texts(), batch_size=7)
    build_index(retriever, corpus, tmp_path / "index", batch_size=7, show_progress=False)
    index = open_index(find_shards(tmp_path / "index")[0])
    assert index.kind == "hybrid" and index.id_list() == corpus.ids
    assert np.array_equal(index.array("embeddings"), encoded["embeddings"])
    assert (index.matrix("sparse") != encoded["sparse"]).nnz == 0
    q = encode_all(retriever.query, list(queries.values()))
    for mode in ("dense", "sparse", "hybrid", "rrf"):
        scores, rows = backend("hybrid").open_searcher([index], SearchOptions(), mode).search(q, 30)
        run = search(retriever, queries, tmp_path / "index", k=30, mode=mode, show_progress=False)
        for position, qid in enumerate(queries):
            found = rows[position] >= 0
            assert list(run[qid]) == [corpus.ids[row] for row in rows[position][found]]
            assert np.array_equal(list(run[qid].values()), scores[position][found].tolist())
    hybrid = shard_searcher(index, SearchOptions(), "hybrid")                    # α·dense + β·sparse, one shard
    whole_block = hybrid.search(q, 30)
    hybrid.block_elements = 1                                                   # one query per score block
    one = hybrid.search(q, 30)
    # the same scores and ranking up to float rounding: score blocks of other shapes round differently on some CPUs
    # (AVX512), so two passages whose scores tie to 1e-6 may swap places, and nothing else may
    np.testing.assert_allclose(one[0], whole_block[0], rtol=1e-6)
    scores = whole_block[0]
    for query, position in zip(*np.nonzero(one[1] != whole_block[1])):
        neighbours = scores[query, max(position - 1, 0):position + 2]
        assert np.sum(np.isclose(neighbours, scores[query, position], rtol=1e-6)) >= 2, (query, position)
    stored = storage(index)
    assert stored["dense_bytes"] == 32 * 4
    assert stored["sparse_bytes"] == pytest.approx(encoded["sparse"].nnz / len(corpus) * (4 + 2) + 4 * 301 / 300)


def test_three_shards_give_every_mode_of_one_index(hybrid_dir, synthetic, tmp_path):
    """The index format and the streaming merge are the same for every kind: a hybrid model's corpus in three
    shards searches like one index holding the same vectors, in each mode — RRF included (it fuses the global
    rankings, not the shards')."""
    import scipy.sparse as sp

    corpus, queries = synthetic
    retriever = load_retriever(hybrid_dir, device="cpu", precision="fp32")
    for shard in range(3):
        build_index(retriever, corpus, tmp_path / "three", shard=shard, num_shards=3, batch_size=16,
                    show_progress=False)
    shards = [open_index(path) for path in find_shards(tmp_path / "three")]
    whole_dense = np.concatenate([shard.array("embeddings") for shard in shards]).astype(np.float64)
    whole_sparse = sp.vstack([shard.matrix("sparse") for shard in shards]).astype(np.float64)
    encoded = encode_all(retriever.query, list(queries.values()))
    dense_scores = encoded["embeddings"].astype(np.float64) @ whole_dense.T
    sparse_scores = (encoded["sparse"].astype(np.float64) @ whole_sparse.T).toarray()
    references = {"dense": dense_scores, "sparse": sparse_scores, "hybrid": ALPHA * dense_scores + BETA * sparse_scores}
    for mode in ("dense", "sparse", "hybrid"):                 # the exact top-k of the same vectors
        three = search(retriever, queries, tmp_path / "three", k=30, mode=mode, show_progress=False)
        assert_top_k(three, list(queries), corpus, references[mode], 30)
    run = search(retriever, queries, tmp_path / "three", k=20, mode="rrf", show_progress=False)
    full = [search(retriever, queries, tmp_path / "three", k=len(corpus), mode=mode, show_progress=False)
            for mode in ("dense", "sparse")]                    # the global rankings, merged over the shards
    for qid in queries:
        fused: dict[int, float] = {}
        for ranking in full:
            rows = sorted((corpus.row(doc) for doc in ranking[qid]),
                          key=lambda row: (-ranking[qid][corpus.ids[row]], row))
            for rank, row in enumerate(rows, start=1):
                fused[row] = fused.get(row, 0.0) + 1.0 / (60 + rank)
        expected = sorted(fused, key=lambda row: (-fused[row], row))[:20]
        assert [corpus.row(doc) for doc in sorted(run[qid], key=lambda d: (-run[qid][d], corpus.row(d)))] == expected


def test_int8_and_bf16_dual_encoders_search_close_to_fp32(hybrid_dir, synthetic, tmp_path):
    """Every precision runs through the same loader and encoder for every kind; the cache keeps them apart."""
    corpus, queries = synthetic
    exact = dense_search(hybrid_dir, corpus, queries, k=20, cache_dir=tmp_path, mode="sparse")
    for precision in ("int8", "bf16"):
        run = dense_search(hybrid_dir, corpus, queries, k=20, cache_dir=tmp_path, mode="sparse", precision=precision)
        assert json.loads((tmp_path / INDEX_DIR / "meta.json").read_text())["precision"] == precision
        overlap = np.mean([len(set(run[q]) & set(exact[q])) / 20 for q in queries])
        assert overlap >= 0.6, (precision, overlap)


# ------------------------------------------------------------------------------------------------ MoTE routing
def test_mote_model_encodes_queries_through_q_ffn_and_passages_through_p_ffn(tokenizer, synthetic, tmp_path):
    from pretrieve.modeling.mote import enable_mote, expert_parameters, routed_views
    from pretrieve.modeling.representations.sparse import content_positions

    corpus, queries = synthetic
    torch.manual_seed(0)
    encoder = Encoder.from_config(tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    with torch.no_grad():
        encoder.model.cls.predictions.bias.fill_(MLM_BIAS)
        enable_mote(encoder.model)
        generator = torch.Generator().manual_seed(2)
        for p in expert_parameters(encoder.model, "query"):                 # make the two experts differ
            p.add_(0.2 * torch.randn(p.shape, generator=generator))
    encoder.save_pretrained(tmp_path / "mote")
    tokenizer.save_pretrained(tmp_path / "mote")
    model_dir = saved_model(tmp_path / "mote", HybridRepresentation(32), tmp_path / "final")

    retriever = load_retriever(model_dir, device="cpu", precision="fp32")
    passage_len, query_len = retriever.passage.max_length, retriever.query.max_length
    query_texts = list(queries.values())
    query_view, passage_view = routed_views(Encoder.from_pretrained(model_dir).eval().model)

    def by_view(view, texts, length):
        """[CLS] and SPLADE (max over content positions of log(1 + ReLU(logits))) from a fixed-route view."""
        batch = tokenizer(texts, padding=True, truncation=True, max_length=length, return_tensors="pt")
        with torch.no_grad():
            out = view(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       output_hidden_states=True)
        keep = content_positions(batch["attention_mask"]).unsqueeze(-1)
        splade = torch.log1p(torch.relu(out.logits.masked_fill(~keep, -1e9).max(dim=1).values))
        return out.hidden_states[-1][:, 0].numpy(), splade.numpy()

    encoded = encode_all(retriever.query, query_texts)
    q_dense, q_sparse = by_view(query_view, query_texts, query_len)
    qp_dense, qp_sparse = by_view(passage_view, query_texts, query_len)
    assert np.allclose(encoded["embeddings"], q_dense, atol=1e-5)
    assert np.allclose(encoded["sparse"].toarray(), q_sparse, atol=1e-5)
    assert not np.allclose(q_dense, qp_dense, atol=1e-3)                      # the experts do differ

    run = dense_search(model_dir, corpus, queries, k=50, cache_dir=tmp_path / "cache")
    index = open_index(tmp_path / "cache" / INDEX_DIR)
    p_dense, p_sparse = by_view(passage_view, corpus.full_texts(), passage_len)
    assert np.allclose(index.array("embeddings"), p_dense, atol=1e-5) and np.allclose(
        index.matrix("sparse").toarray(), p_sparse, atol=1e-5)
    reference = q_dense.astype(np.float64) @ p_dense.T + q_sparse.astype(np.float64) @ p_sparse.T
    assert_top_k(run, list(queries), corpus, reference, 50)


# ------------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def tiny_collection(tmp_path_factory) -> Path:
    return write_collection(tmp_path_factory.mktemp("sparse_search_data") / "tiny")


def test_cli_dense_mode_sparse_gives_the_python_api_run(sparse_mlm_dir, tiny_collection, tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    config = tmp_path / "ft.yaml"
    config.write_text(yaml.safe_dump({"representation": "sparse:lq=1e-3,ld=1e-3", "lr": 1e-3}))
    out = tmp_path / "ft"
    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "--config", str(config), "--model", str(sparse_mlm_dir),
                                 "--data", str(tiny_collection), "--out", str(out), "--steps", "2",
                                 "--batch-size", "4", "--num-negatives", "2", "--passage-max-len", "32",
                                 "--query-max-len", "16", "--bm25-depth", "10"])
    assert result.exit_code == 0, result.output
    final = out / "final"
    assert retriever_kind(final) == "sparse" and json.loads((final / "dual_encoder.json").read_text())[
        "representation"]["type"] == "sparse"
    collection = BeirCollection(tiny_collection)
    corpus, queries = collection.load_corpus(), collection.load_queries("test")
    expected = dense_search(final, corpus, queries, k=15, mode="sparse", precision="auto")
    for flags in (["--mode", "sparse"], []):                                 # a sparse model searches sparse anyway
        run_file = tmp_path / f"run{len(flags)}.trec"
        result = runner.invoke(app, ["dense", "--model", str(final), "--data", str(tiny_collection), "--out",
                                     str(run_file), "--split", "test", "--k", "15", "--device", "cpu", *flags])
        assert result.exit_code == 0, result.output
        got = read_run(run_file)
        assert set(got) == set(expected) == set(queries)
        for qid in expected:
            assert sorted(got[qid], key=lambda d: -got[qid][d]) == sorted(expected[qid], key=lambda d: -expected[qid][d])
            assert all(got[qid][doc] == pytest.approx(expected[qid][doc], abs=1e-6) for doc in expected[qid])
    for mode, message in (("fused", "--mode must be one of"), ("hybrid", "needs the dense")):
        bad = runner.invoke(app, ["dense", "--model", str(final), "--data", str(tiny_collection), "--out",
                                  str(tmp_path / "x.trec"), "--mode", mode])
        assert bad.exit_code != 0 and isinstance(bad.exception, ConfigError) and message in str(bad.exception)


def test_mode_is_refused_for_models_without_a_sparse_part(tiny_bert_dir, synthetic):
    corpus, queries = synthetic
    with pytest.raises(ConfigError, match="sparse or hybrid"):
        dense_search(tiny_bert_dir, corpus, queries, k=5, mode="sparse")
    with pytest.raises(ConfigError, match="unknown search mode"):
        dense_search(tiny_bert_dir, corpus, queries, k=5, mode="fused")


# ---------------------------------------------------------------------------------------------- recipe
def test_recipe_evaluates_one_row_per_mode(sparse_mlm_dir, tiny_collection, tmp_path):
    from pretrieve.data.trec import read_run as read
    from pretrieve.recipe import run_recipe

    fast = {"max_steps": 2, "batch_size": 4, "warmup_ratio": 0.0, "save_every": 0}
    recipe = {"name": "modes", "out": str(tmp_path / "out"), "model": str(sparse_mlm_dir),
              "data": str(tiny_collection), "seed": 3,
              "finetune": {**fast, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32,
                           "bm25_depth": 10, "representation": "hybrid"},
              "stages": [{"finetune": {"stage": 1}},
                         {"evaluate": {"split": "test", "depth": 20, "zero_shot": True, "precision": "fp32",
                                       "batch_size": 8, "modes": ["dense", "sparse", "hybrid"]}}]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    rows = run_recipe(path, show_progress=False)["rows"]
    assert [row["retriever"] for row in rows] == ["zero-shot", "finetune-s1-dense", "finetune-s1-sparse",
                                                  "finetune-s1-hybrid"]
    final = tmp_path / "out" / "finetune-s1" / "final"
    collection = BeirCollection(tiny_collection)
    corpus, queries = collection.load_corpus(), collection.load_queries("test")
    for row in rows[1:]:
        mode = row["retriever"].rsplit("-", 1)[1]
        expected = dense_search(final, corpus, queries, k=20, mode=mode)
        got = read(row["run"])
        # the same scores in the same order; documents tied on a score may come in either order
        assert got.keys() == expected.keys()
        for q in got:
            assert sorted(got[q].values(), reverse=True) == pytest.approx(sorted(expected[q].values(), reverse=True),
                                                                          abs=1e-5)
            for doc_id in got[q].keys() & expected[q].keys():
                assert got[q][doc_id] == pytest.approx(expected[q][doc_id], abs=1e-5)
    index_dirs = list((tmp_path / "out" / "embeddings").glob(f"finetune-s1__*/{INDEX_DIR}"))
    assert json.loads((index_dirs[0] / "meta.json").read_text())["precision"] == "fp32"
    assert len(index_dirs) == 1                                                 # one corpus encoding for all modes
    with pytest.raises(ConfigError, match="modes"):
        recipe["stages"][1]["evaluate"]["modes"] = ["dense", "bm25"]
        path.write_text(yaml.safe_dump(recipe))
        run_recipe(path, show_progress=False)
