"""Dense retrieval: pooling by hand, sentence-transformers compatibility, encoding, shards, FAISS, CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrieve.data.beir import Corpus
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.encode import (encode_corpus, encode_queries, encode_texts, find_shards, load_shard,
                                        shard_bounds)
from pretrieve.retrieval.encoder import DenseEncoder, exclude_prompt, pool
from pretrieve.retrieval.faiss_search import FaissIndex, merge_topk, search_embeddings, search_shards

TEXTS = [
    "Cats sleep most of the day.",
    "The stock market fell sharply on Monday after the announcement of new tariffs.",
    "Dogs",
    "Protein folding is predicted from sequence by deep networks trained on structures.",
    "Rain is expected in the north, with strong winds along the coast.",
]


# ------------------------------------------------------------------------------------ pooling by hand
def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # right, none, left padding
    return hidden, mask


@pytest.mark.parametrize("mode", ["cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"])
def test_pooling_modes_match_hand_computation(mode):
    hidden, mask = padded_batch()
    expected = []
    for row in range(3):
        real = [i for i in range(5) if mask[row, i]]
        vectors = hidden[row, real]
        if mode == "cls":
            expected.append(vectors[0])
        elif mode == "mean":
            expected.append(vectors.sum(0) / len(real))
        elif mode == "mean_sqrt_len_tokens":
            expected.append(vectors.sum(0) / len(real) ** 0.5)
        elif mode == "max":
            expected.append(vectors.max(0).values)
        elif mode == "lasttoken":
            expected.append(vectors[-1])
        else:  # weights 1, 2, 3, ... from the first real token
            weights = torch.arange(1, len(real) + 1, dtype=torch.float32).unsqueeze(1)
            expected.append((vectors * weights).sum(0) / weights.sum())
    assert torch.allclose(pool(hidden, mask, mode), torch.stack(expected), atol=1e-6)


def test_concatenated_modes_and_prompt_exclusion():
    hidden, mask = padded_batch()
    both = pool(hidden, mask, ("cls", "mean"))
    assert both.shape == (3, 8)
    assert torch.allclose(both[:, :4], pool(hidden, mask, "cls"))
    assert torch.allclose(both[:, 4:], pool(hidden, mask, "mean"))
    without_prompt = exclude_prompt(mask, 2)
    assert without_prompt.tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]
    assert mask.tolist()[0] == [1, 1, 1, 0, 0]  # the input mask is untouched
    with pytest.raises(ConfigError):
        pool(hidden, mask, "median")


def test_encoder_cls_and_mean_equal_hand_pooling_of_the_model(tiny_bert_dir):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_bert_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    for mode in ("cls", "mean"):
        encoder = DenseEncoder.load(tiny_bert_dir, pooling=mode)
        assert encoder.normalize is False and encoder.max_length == 160  # min(tokenizer 512, positions 160)
        got = encode_texts(encoder, TEXTS, batch_size=2, show_progress=False)
        for i, text in enumerate(TEXTS):  # one text at a time: no padding at all
            inputs = tokenizer(text, return_tensors="pt")
            with torch.no_grad():
                hidden = model(**inputs).last_hidden_state[0]
            expected = hidden[0] if mode == "cls" else hidden.mean(0)
            np.testing.assert_allclose(got[i], expected.numpy(), atol=1e-5)


def test_encode_texts_keeps_input_order_and_is_padding_invariant(tiny_bert_dir):
    encoder = DenseEncoder.load(tiny_bert_dir, pooling="mean", normalize=True)
    batched = encode_texts(encoder, TEXTS, batch_size=3, show_progress=False)
    single = np.stack([encode_texts(encoder, [t], batch_size=1, show_progress=False)[0] for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert encode_texts(encoder, [], show_progress=False).shape == (0, encoder.dim)
    bf16 = encode_texts(encoder, TEXTS, batch_size=3, bf16=True, show_progress=False)
    assert bf16.dtype == np.float32 and np.abs(bf16 - batched).max() < 0.1


def test_max_length_truncates(tiny_bert_dir):
    encoder = DenseEncoder.load(tiny_bert_dir, pooling="cls", max_length=8)
    long_text = " ".join(["protein"] * 50)
    assert len(encoder.tokenize([long_text]).input_ids[0]) == 8
    assert len(encoder.tokenize([long_text], max_length=20).input_ids[0]) == 20


# ------------------------------------------------------------------------ sentence-transformers checkpoints
def make_st_checkpoint(root: Path, tiny_bert_dir: Path, pooling: dict, dense: bool = False, normalize: bool = True,
                       max_seq_length: int = 24, extra_modules: list | None = None) -> Path:
    """A sentence-transformers checkpoint written by hand: modules.json + module folders."""
    shutil.copytree(tiny_bert_dir, root)
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                "do_lower_case": False}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if dense:
        from safetensors.torch import save_file

        torch.manual_seed(1)
        in_features = 32 * (len(pooling["pooling_mode"]) if isinstance(pooling.get("pooling_mode"), list) else 1)
        (root / "2_Dense").mkdir()
        (root / "2_Dense" / "config.json").write_text(json.dumps({
            "in_features": in_features, "out_features": 16, "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh"}))
        save_file({"linear.weight": torch.randn(16, in_features) * 0.2, "linear.bias": torch.randn(16) * 0.1},
                  str(root / "2_Dense" / "model.safetensors"))
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    for module in extra_modules or []:
        modules.append({"idx": len(modules), "name": str(len(modules)), **module})
    if normalize:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (root / "modules.json").write_text(json.dumps(modules))
    return root


LEGACY_MEAN = {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
               "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}

ST_CASES = {
    "legacy-mean+normalize": dict(pooling=LEGACY_MEAN),
    "cls+dense+normalize": dict(pooling={"embedding_dimension": 32, "pooling_mode": "cls"}, dense=True),
    "cls,max concatenated, no normalize": dict(pooling={"embedding_dimension": 32, "pooling_mode": ["cls", "max"]},
                                               normalize=False),
    "lasttoken": dict(pooling={"word_embedding_dimension": 32, "pooling_mode_lasttoken": True}),
}


@pytest.mark.parametrize("case", list(ST_CASES))
def test_sentence_transformers_checkpoint_matches_sentence_transformers(case, tmp_path, tiny_bert_dir):
    st = pytest.importorskip("sentence_transformers")
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, **ST_CASES[case])
    texts = TEXTS + ["a much longer text " * 20]  # truncated at max_seq_length 24
    reference = st.SentenceTransformer(str(checkpoint), device="cpu").encode(texts, batch_size=4)
    encoder = DenseEncoder.load(checkpoint)
    assert encoder.sentence_transformers and encoder.max_length == 24
    ours = encode_texts(encoder, texts, batch_size=3, show_progress=False)
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_explicit_arguments_override_the_checkpoint(tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN)
    default = DenseEncoder.load(checkpoint)
    assert (default.pooling, default.normalize, default.max_length) == (("mean",), True, 24)
    override = DenseEncoder.load(checkpoint, pooling="cls", normalize=False, max_length=12)
    assert (override.pooling, override.normalize, override.max_length) == (("cls",), False, 12)


def test_unsupported_modules_and_bad_paths_are_clear_errors(tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN, normalize=False,
                                    extra_modules=[{"path": "2_LSTM", "type": "sentence_transformers.models.LSTM"}])
    with pytest.raises(ConfigError, match="LSTM"):
        DenseEncoder.load(checkpoint)
    with pytest.raises(InputError):
        DenseEncoder.load(tmp_path / "does-not-exist")
    with pytest.raises(ConfigError):
        DenseEncoder.load(tiny_bert_dir, pooling="median")


@pytest.mark.parametrize("include_prompt", [True, False])
def test_prompts_are_read_from_the_config(include_prompt, tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling={**LEGACY_MEAN,
                                                                             "include_prompt": include_prompt})
    (checkpoint / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    encoder = DenseEncoder.load(checkpoint)
    assert (encoder.query_prompt, encoder.passage_prompt) == ("query: ", "passage: ")
    assert encoder.include_prompt is include_prompt
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(checkpoint), device="cpu")
    _, ours = encode_queries(encoder, {"q": TEXTS[0]}, show_progress=False)
    np.testing.assert_allclose(ours, model.encode_query([TEXTS[0]]), atol=1e-5)
    passages = encode_texts(encoder, TEXTS, prompt=encoder.passage_prompt, show_progress=False)
    # sentence-transformers 6 injects a default "document": "" prompt, so its encode_document would skip
    # "passage"; we follow the documented candidate order document → passage → corpus of saved prompts.
    np.testing.assert_allclose(passages, model.encode(TEXTS, prompt_name="passage"), atol=1e-5)


# ------------------------------------------------------------------------------------ FAISS
def test_faiss_flat_equals_brute_force_topk(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    ids = [f"d{i}" for i in range(300)]
    index = FaissIndex.build(docs, ids, factory="Flat", metric="ip")
    scores, rows = index.search(queries, k=10)
    brute = queries @ docs.T
    expected_rows = np.argsort(-brute, axis=1)[:, :10]
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected_rows, axis=1), rtol=1e-5, atol=1e-5)

    l2 = FaissIndex.build(docs, ids, metric="l2")
    _, l2_rows = l2.search(queries, k=5)
    distances = ((queries[:, None, :] - docs[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(l2_rows, np.argsort(distances, axis=1)[:, :5])

    index.save(tmp_path / "flat")
    loaded = FaissIndex.load(tmp_path / "flat")
    assert loaded.ids == ids and loaded.search(queries, k=10)[1].tolist() == rows.tolist()
    assert index.search(queries, k=1000)[0].shape == (20, 300)  # k clamped to the index size


def test_faiss_factory_indexes_train_and_find_neighbours():
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((2000, 16)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)  # unit vectors: each query's best match is its source
    queries = docs[:50] + 0.01 * rng.standard_normal((50, 16)).astype(np.float32)
    ids = [str(i) for i in range(2000)]
    for factory, options in (("HNSW16", {"ef_search": 64}), ("IVF16,Flat", {"nprobe": 16}),
                             ("IVF16,Flat", {"nprobe": 1, "train_size": 500})):
        index = FaissIndex.build(docs, ids, factory=factory, **options)
        _, rows = index.search(queries, k=1)
        assert (rows[:, 0] == np.arange(50)).mean() >= (0.95 if options.get("nprobe", 16) > 1 else 0.5), factory
    with pytest.raises(ConfigError):
        FaissIndex.build(docs, ids, factory="NotAnIndex")


def test_merge_topk_is_a_stable_merge():
    scores = [np.array([[3.0, 1.0]]), np.array([[3.0, 2.0]])]
    docs = [np.array([["a", "b"]], dtype=object), np.array([["c", "d"]], dtype=object)]
    merged_scores, merged_docs = merge_topk(scores, docs, 3)
    assert merged_docs.tolist() == [["a", "c", "d"]] and merged_scores.tolist() == [[3.0, 3.0, 2.0]]


# ------------------------------------------------------------------------------------ shards + cache
def tiny_corpus(n: int = 23) -> Corpus:
    words = ["protein", "cell", "market", "rain", "dog", "cat", "gene", "virus", "stock", "wind", "river", "brain"]
    texts = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 5)) for i in range(n)]
    return Corpus([f"doc{i}" for i in range(n)], [f"title {i}" if i % 2 else "" for i in range(n)], texts)


def test_shard_bounds_cover_the_corpus_contiguously():
    bounds = [shard_bounds(23, i, 3) for i in range(3)]
    assert bounds == [(0, 7), (7, 15), (15, 23)]
    with pytest.raises(ConfigError):
        shard_bounds(23, 3, 3)


def test_three_shards_give_the_same_run_as_one(tmp_path, tiny_bert_dir):
    encoder = DenseEncoder.load(tiny_bert_dir, pooling="mean", normalize=True)
    corpus = tiny_corpus()
    queries = {"q1": "protein gene", "q2": "stock market wind", "q3": "cat"}
    for shard in range(3):
        encode_corpus(encoder, corpus, tmp_path / "three", shard=shard, num_shards=3, batch_size=4,
                      show_progress=False)
    encode_corpus(encoder, corpus, tmp_path / "one", batch_size=8, show_progress=False)
    one = load_shard(tmp_path / "one" / "shard-0-of-1")
    parts = [load_shard(d) for d in find_shards(tmp_path / "three")]
    assert sum((p.ids for p in parts), []) == corpus.ids == one.ids
    np.testing.assert_allclose(np.concatenate([p.embeddings for p in parts]), one.embeddings, atol=1e-6)
    assert parts[1].meta["rows"] == [7, 15] and parts[1].meta["count"] == 8

    run_three = search_embeddings(encoder, queries, tmp_path / "three", k=10, show_progress=False)
    run_one = search_embeddings(encoder, queries, tmp_path / "one", k=10, show_progress=False)
    assert {q: list(d) for q, d in run_three.items()} == {q: list(d) for q, d in run_one.items()}
    for qid in queries:
        assert run_three[qid] == pytest.approx(run_one[qid], abs=1e-5)
    query_ids, query_emb = encode_queries(encoder, queries, show_progress=False)
    brute = query_emb @ one.embeddings.T
    for q, qid in enumerate(query_ids):
        assert list(run_one[qid]) == [corpus.ids[i] for i in np.argsort(-brute[q], kind="stable")[:10]]

    shutil.rmtree(tmp_path / "three" / "shard-1-of-3")
    with pytest.raises(InputError, match="missing shard"):
        find_shards(tmp_path / "three")


def test_encoded_shards_are_cached_until_settings_change(tmp_path, tiny_bert_dir, monkeypatch):
    import pretrieve.retrieval.encode as encode_module

    encoder = DenseEncoder.load(tiny_bert_dir, pooling="cls")
    corpus = tiny_corpus(6)
    shard_dir = encode_corpus(encoder, corpus, tmp_path, show_progress=False)
    stamp = (shard_dir / "embeddings.npy").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("re-encoded a cached shard")

    monkeypatch.setattr(encode_module, "encode_texts", fail)
    assert encode_corpus(encoder, corpus, tmp_path, show_progress=False) == shard_dir
    assert (shard_dir / "embeddings.npy").stat().st_mtime_ns == stamp
    monkeypatch.undo()
    encoder.pooling = ("mean",)
    encode_corpus(encoder, corpus, tmp_path, show_progress=False)
    meta = json.loads((shard_dir / "meta.json").read_text())
    assert meta["pooling"] == "mean" and meta["dim"] == 32 and meta["count"] == 6
    corpus.texts[3] = "an edited passage"
    encode_corpus(encoder, corpus, tmp_path, show_progress=False)
    assert json.loads((shard_dir / "meta.json").read_text())["content_sha1"] != meta["content_sha1"]


def test_query_encoder_must_match_the_passage_vectors(tmp_path, tiny_bert_dir):
    encode_corpus(DenseEncoder.load(tiny_bert_dir, pooling="cls"), tiny_corpus(5), tmp_path, show_progress=False)
    wider = DenseEncoder.load(tiny_bert_dir, pooling="cls+mean")
    with pytest.raises(InputError, match="64-d"):
        search_embeddings(wider, {"q": "cat"}, tmp_path, k=3, show_progress=False)
    query_emb = np.zeros((1, 32), np.float32)
    with pytest.raises(InputError):
        search_shards(query_emb, ["q1", "q2"], tmp_path, k=3)


# ----------------------------------------------------------------------------- real model vs sentence-transformers
@pytest.mark.slow
def test_minilm_matches_sentence_transformers_on_scifact_sample(scifact, minilm):
    """Embeddings (to 1e-5) and top-10 rankings equal SentenceTransformer.encode + exact search."""
    st = pytest.importorskip("sentence_transformers")
    from pretrieve.data.beir import BeirCollection

    collection = BeirCollection(scifact)
    corpus = collection.load_corpus()
    qrels = collection.load_qrels("test")
    queries = dict(list(collection.load_queries("test").items())[:60])
    relevant = [d for q in queries for d in qrels[q] if d in corpus]
    rows = sorted({corpus.row(d) for d in relevant} | set(range(0, len(corpus), 50)))[:120]
    texts = [corpus.full_text(i) for i in rows]
    doc_ids = [corpus.ids[i] for i in rows]

    encoder = DenseEncoder.load(minilm)
    ours_docs = encode_texts(encoder, texts, batch_size=32, show_progress=False)
    query_ids, ours_queries = encode_queries(encoder, queries, show_progress=False)
    model = st.SentenceTransformer(str(minilm), device="cpu")
    ref_docs = model.encode(texts, batch_size=32)
    ref_queries = model.encode([queries[q] for q in query_ids], batch_size=32)
    np.testing.assert_allclose(ours_docs, ref_docs, atol=1e-5)
    np.testing.assert_allclose(ours_queries, ref_queries, atol=1e-5)

    _, our_rows = FaissIndex.build(ours_docs, doc_ids).search(ours_queries, k=10)
    reference_scores = ref_queries @ ref_docs.T
    for q in range(len(query_ids)):
        ours_top = our_rows[q].tolist()
        ref_top = np.argsort(-reference_scores[q], kind="stable")[:10].tolist()
        if ours_top != ref_top:  # allowed only for exact ties
            assert np.allclose(reference_scores[q, ours_top], reference_scores[q, ref_top], atol=1e-6)


# ------------------------------------------------------------------------------------ CLI
def write_collection(root: Path, corpus: Corpus, queries: dict[str, str]) -> Path:
    """A BEIR collection whose first three queries are judged in the test split."""
    (root / "qrels").mkdir(parents=True)
    corpus.save(root / "corpus.jsonl")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as handle:
        for qid, text in queries.items():
            handle.write(json.dumps({"_id": qid, "text": text}) + "\n")
    judged = list(queries)[:3]
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                             + "".join(f"{q}\tdoc{i}\t1\n" for i, q in enumerate(judged)))
    return root


def test_cli_dense_encode_and_search(tmp_path, tiny_bert_dir):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    data = write_collection(tmp_path / "toy", tiny_corpus(12), {"q1": "protein gene", "q2": "stock market",
                                                                 "q3": "cat dog", "q4": "not judged"})
    model = make_st_checkpoint(tmp_path / "model", tiny_bert_dir, pooling=LEGACY_MEAN)
    runner = CliRunner()
    dense_out = tmp_path / "dense.trec"
    result = runner.invoke(app, ["dense", "--model", str(model), "--data", str(data), "--out", str(dense_out),
                                 "--k", "3", "--device", "cpu", "--cache", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    dense_run = read_run(dense_out)
    assert set(dense_run) == {"q1", "q2", "q3"} and all(len(d) == 3 for d in dense_run.values())

    for shard in range(2):
        result = runner.invoke(app, ["encode", "--model", str(model), "--data", str(data), "--out",
                                     str(tmp_path / "emb"), "--shard", str(shard), "--num-shards", "2",
                                     "--batch-size", "2", "--device", "cpu"])
        assert result.exit_code == 0, result.output
    search_out = tmp_path / "search.trec"
    result = runner.invoke(app, ["search", "--model", str(model), "--data", str(data), "--index",
                                 str(tmp_path / "emb"), "--out", str(search_out), "--k", "3", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    searched = read_run(search_out)
    assert {q: list(d) for q, d in searched.items()} == {q: list(d) for q, d in dense_run.items()}

    help_text = runner.invoke(app, ["dense", "--help"]).output
    assert "default: test" in help_text and "1000" in help_text
    missing = runner.invoke(app, ["search", "--model", str(model), "--data", str(data), "--index",
                                  str(tmp_path / "nothing"), "--out", str(search_out)])
    assert missing.exit_code != 0 and isinstance(missing.exception, InputError)
