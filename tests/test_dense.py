"""Dense retrieval: pooling by hand, sentence-transformers compatibility, the batch encoder (padding, sources,
precisions), index shards and their freshness, FAISS (exact streaming search, factories, the GPU path), CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pretrieve.data.beir import Corpus
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.pooling import exclude_prompt, pool
from pretrieve.retrieval.batches import encode_all
from pretrieve.ranks import shard_bounds
from pretrieve.retrieval.index import SearchOptions, backend, find_shards, open_index
from pretrieve.retrieval.index.dense import DenseSearcher, build_faiss, exact_search, faiss_search
from pretrieve.retrieval.index.topk import merge_topk
from pretrieve.retrieval.load import load_dense_encoder, load_retriever
from pretrieve.retrieval.search import build_index, search

TEXTS = [
    "Cats sleep most of the day.",
    "The stock market fell sharply on Monday after the announcement of new tariffs.",
    "Dogs",
    "Protein folding is predicted from sequence by deep networks trained on structures.",
    "Rain is expected in the north, with strong winds along the coast.",
]


def encode_texts(retriever, texts, batch_size: int = 64, side: str = "passage", **options) -> np.ndarray:
    """The batch encoder's vectors of ``texts`` through one side of a retriever."""
    return encode_all(getattr(retriever, side), texts, batch_size, **options)["embeddings"]


def dense(path, **options):
    """A dense retriever in fp32 on the CPU (exact comparisons)."""
    return load_retriever(path, device="cpu", precision=options.pop("precision", "fp32"), **options)


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
        retriever = dense(tiny_bert_dir, pooling=mode)
        encoder = retriever.passage_encoder
        assert encoder.normalize is False and encoder.max_length == 160  # min(tokenizer 512, positions 160)
        assert retriever.kind == "dense" and retriever.query_encoder is encoder
        got = encode_texts(retriever, TEXTS, batch_size=2)
        for i, text in enumerate(TEXTS):  # one text at a time: no padding at all
            inputs = tokenizer(text, return_tensors="pt")
            with torch.no_grad():
                hidden = model(**inputs).last_hidden_state[0]
            expected = hidden[0] if mode == "cls" else hidden.mean(0)
            np.testing.assert_allclose(got[i], expected.numpy(), atol=1e-5)


def test_encode_texts_keeps_input_order_and_is_padding_invariant(tiny_bert_dir):
    retriever = dense(tiny_bert_dir, pooling="mean", normalize=True)
    batched = encode_texts(retriever, TEXTS, batch_size=3)
    single = np.stack([encode_texts(retriever, [t], batch_size=1)[0] for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert encode_texts(retriever, []).shape == (0, retriever.passage_encoder.dim)
    windowed = encode_texts(retriever, TEXTS, batch_size=2, window=2)       # windows of 2 texts, same order
    np.testing.assert_allclose(windowed, batched, atol=1e-5)
    bf16 = encode_texts(dense(tiny_bert_dir, pooling="mean", normalize=True, precision="bf16"), TEXTS, batch_size=3)
    assert bf16.dtype == np.float32 and np.abs(bf16 - batched).max() < 0.1


def test_pad_rows_by_hand_on_both_sides():
    from pretrieve.retrieval.batches import pad_rows

    ids, mask = pad_rows([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    ids, mask = pad_rows([[5, 6, 7], [8], [9, 10]], pad_id=-1, left=True)
    assert ids.tolist() == [[5, 6, 7], [-1, -1, 8], [-1, 9, 10]] and mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]


def test_any_sliceable_source_of_texts_and_a_contiguous_slice(tiny_bert_dir):
    """A list, a corpus and a dataset-like source whose slices are dicts of columns give the same vectors."""
    from pretrieve.retrieval.batches import encode_windows

    class Columns:   # what datasets.Dataset[i:j] returns: a dict of lists
        def __init__(self, corpus):
            self.corpus = corpus

        def __len__(self):
            return len(self.corpus)

        def __getitem__(self, rows):
            return {"_id": self.corpus.ids[rows], "title": self.corpus.titles[rows], "text": self.corpus.texts[rows]}

    retriever = dense(tiny_bert_dir, pooling="mean")
    corpus = tiny_corpus(9)
    expected = encode_texts(retriever, corpus.full_texts(), batch_size=4)
    np.testing.assert_allclose(encode_texts(retriever, corpus, batch_size=4), expected, atol=1e-6)
    np.testing.assert_allclose(encode_texts(retriever, Columns(corpus), batch_size=4), expected, atol=1e-6)
    windows = list(encode_windows(retriever.passage, corpus, batch_size=2, start=3, end=8, window=2))
    assert [first for first, _ in windows] == [3, 5, 7]
    np.testing.assert_allclose(np.concatenate([w["embeddings"] for _, w in windows]), expected[3:8], atol=1e-6)
    with pytest.raises(ConfigError):
        list(encode_windows(retriever.passage, corpus, start=5, end=20))


def test_a_tokenizer_error_in_the_background_thread_reaches_the_caller(tiny_bert_dir):
    retriever = dense(tiny_bert_dir, pooling="cls")

    def broken(*args, **kwargs):
        raise RuntimeError("tokenizer exploded")

    retriever.passage.tokenizer = broken
    with pytest.raises(RuntimeError, match="exploded"):
        encode_texts(retriever, TEXTS)


def test_max_length_truncates(tiny_bert_dir):
    from pretrieve.retrieval.batches import tokenize

    assert load_dense_encoder(tiny_bert_dir, pooling="cls", max_length=8).max_length == 8
    long_text = " ".join(["protein"] * 50)
    side = load_retriever(tiny_bert_dir, pooling="cls", max_length=8, device="cpu").passage
    assert side.max_length == 8 and len(tokenize(side, [long_text])[0][0]) == 8


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
    retriever = dense(checkpoint)
    assert retriever.passage_encoder.sentence_transformers and retriever.passage.max_length == 24
    ours = encode_texts(retriever, texts, batch_size=3)
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_explicit_arguments_override_the_checkpoint(tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN)
    default = load_dense_encoder(checkpoint)
    assert (default.pooling, default.normalize, default.max_length) == (("mean",), True, 24)
    override = load_dense_encoder(checkpoint, pooling="cls", normalize=False, max_length=12)
    assert (override.pooling, override.normalize, override.max_length) == (("cls",), False, 12)


def test_unsupported_modules_and_bad_paths_are_clear_errors(tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN, normalize=False,
                                    extra_modules=[{"path": "2_LSTM", "type": "sentence_transformers.models.LSTM"}])
    with pytest.raises(ConfigError, match="LSTM"):
        load_dense_encoder(checkpoint)
    with pytest.raises(InputError):
        load_dense_encoder(tmp_path / "does-not-exist")
    with pytest.raises(ConfigError):
        load_retriever(tiny_bert_dir, pooling="median")
    with pytest.raises(ConfigError, match="precision"):
        load_retriever(tiny_bert_dir, precision="fp8")


@pytest.mark.parametrize("include_prompt", [True, False])
def test_prompts_are_read_from_the_config(include_prompt, tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling={**LEGACY_MEAN,
                                                                             "include_prompt": include_prompt})
    (checkpoint / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    retriever = dense(checkpoint)
    encoder = retriever.passage_encoder
    assert (encoder.query_prompt, encoder.passage_prompt) == ("query: ", "passage: ")
    assert encoder.include_prompt is include_prompt
    assert (retriever.query.prompt, retriever.passage.prompt) == ("query: ", "passage: ")
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(checkpoint), device="cpu")
    ours = encode_texts(retriever, [TEXTS[0]], side="query")
    np.testing.assert_allclose(ours, model.encode_query([TEXTS[0]]), atol=1e-5)
    passages = encode_texts(retriever, TEXTS)
    # sentence-transformers 6 injects a default "document": "" prompt, so its encode_document would skip
    # "passage"; we follow the documented candidate order document → passage → corpus of saved prompts.
    np.testing.assert_allclose(passages, model.encode(TEXTS, prompt_name="passage"), atol=1e-5)


# ------------------------------------------------------------------------------------ FAISS
def test_faiss_flat_equals_brute_force_topk(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    path = build_vectors_index(tmp_path / "flat", docs)
    searcher = backend("dense").open_searcher([open_index(path)], SearchOptions())   # the search path's searcher
    scores, rows = searcher.search({"embeddings": queries}, k=10)
    brute = queries @ docs.T
    expected_rows = np.argsort(-brute, axis=1)[:, :10]
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected_rows, axis=1), rtol=1e-5, atol=1e-5)

    l2 = DenseSearcher(open_index(path), SearchOptions(metric="l2"))
    _, l2_rows = l2.search({"embeddings": queries}, k=5)
    distances = ((queries[:, None, :] - docs[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(l2_rows, np.argsort(distances, axis=1)[:, :5])

    flat = build_faiss(docs, factory="Flat", metric="ip")                       # a FAISS index (DupMAE's [CLS] part)
    assert faiss_search(flat, queries, k=10)[1].tolist() == rows.tolist()
    assert searcher.search({"embeddings": queries}, k=1000)[0].shape == (20, 300)  # k clamped to the index size
    assert faiss_search(flat, queries, k=1000)[0].shape == (20, 300)
    l2_flat = build_faiss(docs, metric="l2")
    np.testing.assert_array_equal(faiss_search(l2_flat, queries, 5, metric="l2")[1], l2_rows)


def test_faiss_factory_indexes_train_and_find_neighbours(tmp_path):
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((2000, 16)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)  # unit vectors: each query's best match is its source
    queries = docs[:50] + 0.01 * rng.standard_normal((50, 16)).astype(np.float32)
    path = build_vectors_index(tmp_path / "shard-0-of-1", docs)
    for factory, options in (("HNSW16", {"ef_search": 64}), ("IVF16,Flat", {"nprobe": 16}),
                             ("IVF16,Flat", {"nprobe": 1, "train_size": 500})):
        searcher = DenseSearcher(open_index(path), SearchOptions(factory=factory, **options))
        _, rows = searcher.search({"embeddings": queries}, k=1)
        assert (rows[:, 0] == np.arange(50)).mean() >= (0.95 if options.get("nprobe", 16) > 1 else 0.5), factory
    with pytest.raises(ConfigError):
        DenseSearcher(open_index(path), SearchOptions(factory="NotAnIndex"))


def test_merge_topk_is_a_stable_merge():
    scores = [np.array([[3.0, 1.0]]), np.array([[3.0, 2.0]])]
    docs = [np.array([["a", "b"]], dtype=object), np.array([["c", "d"]], dtype=object)]
    merged_scores, merged_docs = merge_topk(scores, docs, 3)
    assert merged_docs.tolist() == [["a", "c", "d"]] and merged_scores.tolist() == [[3.0, 3.0, 2.0]]


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_streaming_exact_search_equals_brute_force(metric, tmp_path):
    """Blocks of 7 rows read from the .npy file (not mapped), merged as they come = brute force over all rows."""
    rng = np.random.default_rng(4)
    docs = rng.standard_normal((101, 12)).astype(np.float32)
    queries = rng.standard_normal((6, 12)).astype(np.float32)
    np.save(tmp_path / "embeddings.npy", docs)
    scores, rows = exact_search(queries, tmp_path / "embeddings.npy", k=20, metric=metric, block_rows=7)
    brute = queries @ docs.T if metric == "ip" else -((queries[:, None] - docs[None]) ** 2).sum(-1)
    expected = np.argsort(-brute, axis=1, kind="stable")[:, :20]
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, axis=1), rtol=1e-4, atol=1e-4)
    in_memory = exact_search(queries, docs, k=200, metric=metric, block_rows=1000)
    assert in_memory[1].shape == (6, 101)                                       # k clamped to the row count
    with pytest.raises(InputError):
        exact_search(queries[:, :5], docs, k=3)


def test_gpu_path_is_taken_when_faiss_reports_a_gpu(monkeypatch, tmp_path):
    """A faked FAISS GPU: exact blocks and approximate indexes go through index_cpu_to_all_gpus, results equal
    the CPU's; asking for a GPU where FAISS sees none is a one-line error."""
    import faiss

    from pretrieve.retrieval.index.dense import use_gpus

    rng = np.random.default_rng(5)
    docs = rng.standard_normal((300, 8)).astype(np.float32)
    queries = rng.standard_normal((4, 8)).astype(np.float32)
    cpu = exact_search(queries, docs, k=10, block_rows=64, use_gpu=False)
    with pytest.raises(ConfigError, match="GPU"):
        exact_search(queries, docs, k=10, use_gpu=True)
    cloned = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index: cloned.append(index) or index, raising=False)
    assert use_gpus(None) is True and use_gpus(False) is False
    gpu = exact_search(queries, docs, k=10, block_rows=64)                     # default: on the GPU when there is one
    assert len(cloned) == 5                                                     # one flat index per block
    np.testing.assert_array_equal(gpu[1], cpu[1])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5)
    retriever_index = build_vectors_index(tmp_path / "idx", docs)
    searcher = DenseSearcher(open_index(retriever_index), SearchOptions(factory="IVF4,Flat", nprobe=4))
    assert cloned[-1] is searcher.faiss and len(cloned) == 6             # the IVF index went to the GPUs


def build_vectors_index(path: Path, vectors: np.ndarray) -> Path:
    """A dense index directory holding ``vectors`` (as the batch encoder would write it)."""
    from pretrieve.retrieval.index import save_arrays, writing

    ids = [f"d{i}" for i in range(len(vectors))]
    with writing(path, "dense", ids, {"passage": {"dim": vectors.shape[1]}}, {"test": 1}) as tmp:
        save_arrays(tmp, {"embeddings": vectors})
    return path


def test_approximate_index_is_built_once_and_rebuilt_when_its_vectors_change(tmp_path):
    rng = np.random.default_rng(6)
    docs = rng.standard_normal((500, 8)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)          # unit vectors: each one's best match is itself
    path = build_vectors_index(tmp_path / "shard-0-of-1", docs)
    options = SearchOptions(factory="IVF8,Flat", nprobe=8)
    first = DenseSearcher(open_index(path), options)
    cached = tmp_path / "shard-0-of-1.IVF8_Flat.ip"
    assert (cached / "index.faiss").exists() and find_shards(tmp_path) == [path]   # a sibling, not a shard
    stamp = (cached / "index.faiss").stat().st_mtime_ns
    again = DenseSearcher(open_index(path), options)
    assert (cached / "index.faiss").stat().st_mtime_ns == stamp                   # reused
    queries = docs[:5] + 0.001
    assert again.search({"embeddings": queries}, 1)[1][:, 0].tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(first.search({"embeddings": queries}, 3)[1], again.search({"embeddings": queries}, 3)[1])
    build_vectors_index(path, docs[::-1].copy())                                # other vectors: rebuilt
    rebuilt = DenseSearcher(open_index(path), options)
    assert rebuilt.search({"embeddings": queries}, 1)[1][:, 0].tolist() == [499, 498, 497, 496, 495]


# ------------------------------------------------------------------------------------ precision
def test_auto_precision_follows_the_hardware(monkeypatch):
    from pretrieve import precision

    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert precision.resolve_precision("auto", cpu) == "fp32"                   # AVX2 only: bf16 would be emulated
    for flag in ("avx512_bf16", "amx_bf16"):
        monkeypatch.setattr(precision, "cpu_flags", lambda flag=flag: frozenset({"avx2", flag}))
        assert precision.resolve_precision("auto", cpu) == "bf16"
    cuda = torch.device("cuda")
    for supported, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert precision.resolve_precision("auto", cuda) == expected
    assert precision.resolve_precision("fp16", cuda) == "fp16"
    with pytest.raises(ConfigError, match="CPU only"):
        precision.resolve_precision("int8", cuda)
    with pytest.raises(ConfigError, match="unknown precision"):
        precision.resolve_precision("fp64", cpu)


def test_int8_quantises_the_linear_layers_and_stays_close_to_fp32(tmp_path, tiny_bert_dir):
    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN)
    fp32 = dense(checkpoint)
    int8 = dense(checkpoint, precision="int8")
    assert int8.precision == "int8" and int8.settings()["precision"] == "int8"
    modules = list(int8.passage_encoder.model.modules())
    assert any(type(m).__module__.startswith("torch.ao.nn.quantized.dynamic") for m in modules)
    assert not any(isinstance(m, torch.nn.Linear) for m in modules)           # every linear layer quantised
    texts = TEXTS * 4
    a, b = encode_texts(fp32, texts), encode_texts(int8, texts)
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cosines.min() > 0.98 and not np.allclose(a, b, atol=1e-6)


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
    retriever = dense(tiny_bert_dir, pooling="mean", normalize=True)
    corpus = tiny_corpus()
    queries = {"q1": "protein gene", "q2": "stock market wind", "q3": "cat"}
    for shard in range(3):
        build_index(retriever, corpus, tmp_path / "three", shard=shard, num_shards=3, batch_size=4,
                    show_progress=False)
    build_index(retriever, corpus, tmp_path / "one", batch_size=8, show_progress=False)
    one = open_index(tmp_path / "one" / "shard-0-of-1")
    parts = [open_index(d) for d in find_shards(tmp_path / "three")]
    assert sum((p.id_list() for p in parts), []) == corpus.ids == one.id_list()
    np.testing.assert_allclose(np.concatenate([p.array("embeddings") for p in parts]), one.array("embeddings"),
                               atol=1e-6)
    assert parts[1].meta["rows"] == [7, 15] and parts[1].count == 8

    run_three = search(retriever, queries, tmp_path / "three", k=10, show_progress=False)
    run_one = search(retriever, queries, tmp_path / "one", k=10, show_progress=False)
    assert {q: list(d) for q, d in run_three.items()} == {q: list(d) for q, d in run_one.items()}
    for qid in queries:
        assert run_three[qid] == pytest.approx(run_one[qid], abs=1e-5)
    query_emb = encode_texts(retriever, list(queries.values()), side="query")
    brute = query_emb @ one.array("embeddings").T
    for q, qid in enumerate(queries):
        assert list(run_one[qid]) == [corpus.ids[i] for i in np.argsort(-brute[q], kind="stable")[:10]]
    blocks = [search(retriever, {q: queries[q]}, tmp_path / "three", k=10, query_block=1, show_progress=False)
              for q in queries]                                                 # query blocks of one
    merged = {q: d for block in blocks for q, d in block.items()}
    assert {q: list(d) for q, d in merged.items()} == {q: list(d) for q, d in run_three.items()}
    assert all(merged[q] == pytest.approx(run_three[q], abs=1e-5) for q in queries)   # padding changes the last bits

    shutil.rmtree(tmp_path / "three" / "shard-1-of-3")
    with pytest.raises(InputError, match="missing shard"):
        find_shards(tmp_path / "three")


def test_encoded_shards_are_reused_only_while_current(tmp_path, tiny_bert_dir, monkeypatch):
    """Same model, settings and texts: reused; other pooling, an edited passage, or a zero-byte / truncated
    embeddings.npy (freshness contract): re-encoded, never reported cached."""
    import pretrieve.retrieval.search as search_module

    retriever = dense(tiny_bert_dir, pooling="cls")
    corpus = tiny_corpus(6)
    shard_dir = build_index(retriever, corpus, tmp_path, show_progress=False)
    embeddings = shard_dir / "embeddings.npy"
    stamp = embeddings.stat().st_mtime_ns
    calls = []
    original = search_module.encode_windows
    monkeypatch.setattr(search_module, "encode_windows", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    assert build_index(retriever, corpus, tmp_path, show_progress=False) == shard_dir
    assert embeddings.stat().st_mtime_ns == stamp and calls == []
    meta = json.loads((shard_dir / "meta.json").read_text())
    assert meta["passage"]["pooling"] == "cls" and meta["count"] == 6

    mean = dense(tiny_bert_dir, pooling="mean")
    build_index(mean, corpus, tmp_path, show_progress=False)
    assert len(calls) == 1 and json.loads((shard_dir / "meta.json").read_text())["passage"]["pooling"] == "mean"
    corpus.texts[3] = "an edited passage"
    build_index(mean, corpus, tmp_path, show_progress=False)
    assert len(calls) == 2
    for damage in (lambda path: path.write_bytes(b""), lambda path: path.write_bytes(path.read_bytes()[:-16])):
        damage(embeddings)
        with pytest.raises(InputError, match="incomplete or modified"):
            open_index(shard_dir)
        build_index(mean, corpus, tmp_path, show_progress=False)
        assert open_index(shard_dir).array("embeddings").shape == (6, 32)
    assert len(calls) == 4


def test_a_cosine_index_derived_from_the_dot_index_is_the_one_encoding_writes(tmp_path, tiny_bert_dir, monkeypatch):
    """One encode per probe: the dot index's vectors, normalised, are the cosine encoder's vectors (bit for bit)
    with the record that encoding writes, so either is reused as current; a source of other settings is refused."""
    import pretrieve.retrieval.search as search_module
    from pretrieve.retrieval.search import encode_corpus, normalized_index, normalizes_in_float32

    corpus = tiny_corpus(23)
    dot, cos = dense(tiny_bert_dir, pooling="cls"), dense(tiny_bert_dir, pooling="cls", normalize=True)
    encode_corpus(cos, corpus, tmp_path / "encoded", batch_size=4, show_progress=False)
    encode_corpus(dot, corpus, tmp_path / "dot", batch_size=4, show_progress=False)
    calls = []
    original = search_module.encode_windows
    monkeypatch.setattr(search_module, "encode_windows", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    assert normalizes_in_float32(cos) and not normalizes_in_float32(dot)
    normalized_index(cos, corpus, tmp_path / "dot", tmp_path / "derived")
    assert calls == []                                                              # nothing encoded
    encoded, derived = (open_index(tmp_path / name / "shard-0-of-1") for name in ("encoded", "derived"))
    assert np.array_equal(encoded.array("embeddings"), derived.array("embeddings"))
    assert derived.id_list() == corpus.ids and derived.meta["passage"] == encoded.meta["passage"]
    assert np.linalg.norm(derived.array("embeddings"), axis=1) == pytest.approx(1.0, abs=1e-6)
    stamp = (tmp_path / "derived" / "shard-0-of-1" / "embeddings.npy").stat().st_mtime_ns
    encode_corpus(cos, corpus, tmp_path / "derived", show_progress=False)               # current: reused as is
    normalized_index(cos, corpus, tmp_path / "dot", tmp_path / "encoded")               # and the other way round
    assert calls == [] and (tmp_path / "derived" / "shard-0-of-1" / "embeddings.npy").stat().st_mtime_ns == stamp
    queries = {"q1": "protein gene", "q2": "stock market wind"}
    assert search(cos, queries, tmp_path / "derived", k=5, show_progress=False) == \
        search(cos, queries, tmp_path / "encoded", k=5, show_progress=False)
    with pytest.raises(ConfigError, match="not the unnormalised index"):
        normalized_index(cos, corpus, tmp_path / "encoded", tmp_path / "other")         # already normalised
    with pytest.raises(ConfigError, match="not the unnormalised index"):
        normalized_index(dense(tiny_bert_dir, pooling="mean", normalize=True), corpus, tmp_path / "dot",
                         tmp_path / "other")                                           # another pooling
    corpus.texts[3] = "an edited passage"
    with pytest.raises(ConfigError, match="not the unnormalised index"):
        normalized_index(cos, corpus, tmp_path / "dot", tmp_path / "other")             # other texts
    with pytest.raises(ConfigError, match="normalises its float32 vectors"):
        normalized_index(dot, corpus, tmp_path / "dot", tmp_path / "other")


def test_query_encoder_must_match_the_passage_vectors(tmp_path, tiny_bert_dir):
    build_index(dense(tiny_bert_dir, pooling="cls"), tiny_corpus(5), tmp_path, show_progress=False)
    wider = dense(tiny_bert_dir, pooling="cls+mean")
    with pytest.raises(InputError, match="64-d"):
        search(wider, {"q": "cat"}, tmp_path, k=3, show_progress=False)


def test_a_copied_model_folder_is_the_same_encoder_another_model_is_warned_about(tmp_path, tiny_bert_dir, caplog):
    """The index records the encoding model's content fingerprint: searching with a copy of that folder (another
    path, the same weights, e.g. an output folder moved elsewhere) gives no warning; other weights do."""
    build_index(dense(tiny_bert_dir, pooling="cls"), tiny_corpus(5), tmp_path / "index", show_progress=False)
    copy = shutil.copytree(tiny_bert_dir, tmp_path / "copy")
    with caplog.at_level("WARNING", logger="pretrieve.retrieval.search"):
        search(dense(copy, pooling="cls"), {"q": "cat"}, tmp_path / "index", k=3, show_progress=False)
    assert "differs" not in caplog.text
    weights = next(copy.glob("*.safetensors"))
    tensors = load_file(str(weights))
    name = next(n for n, t in tensors.items() if t.is_floating_point())
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, str(weights))
    with caplog.at_level("WARNING", logger="pretrieve.retrieval.search"):
        search(dense(copy, pooling="cls"), {"q": "cat"}, tmp_path / "index", k=3, show_progress=False)
    assert "query encoder differs" in caplog.text and "model:" in caplog.text


# ----------------------------------------------------------------------------- real model vs sentence-transformers
@pytest.mark.slow
def test_minilm_matches_sentence_transformers_on_scifact_sample(scifact, minilm):
    """Embeddings (to 1e-5) and top-10 rankings equal SentenceTransformer.encode + exact search."""
    st = pytest.importorskip("sentence_transformers")
    from pretrieve.data.collection import BeirCollection

    collection = BeirCollection(scifact)
    corpus = collection.load_corpus()
    qrels = collection.load_qrels("test")
    queries = dict(list(collection.load_queries("test").items())[:60])
    relevant = [d for q in queries for d in qrels[q] if d in corpus]
    rows = sorted({corpus.row(d) for d in relevant} | set(range(0, len(corpus), 50)))[:120]
    texts = [corpus.full_text(i) for i in rows]

    retriever = dense(minilm)
    ours_docs = encode_texts(retriever, texts, batch_size=32)
    query_ids = list(queries)
    ours_queries = encode_texts(retriever, [queries[q] for q in query_ids], side="query")
    model = st.SentenceTransformer(str(minilm), device="cpu")
    ref_docs = model.encode(texts, batch_size=32)
    ref_queries = model.encode([queries[q] for q in query_ids], batch_size=32)
    np.testing.assert_allclose(ours_docs, ref_docs, atol=1e-5)
    np.testing.assert_allclose(ours_queries, ref_queries, atol=1e-5)

    _, our_rows = exact_search(ours_queries, ours_docs, k=10)
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
                                  str(tmp_path / "nothing"), "--out", str(search_out), "--overwrite"])
    assert missing.exit_code != 0 and isinstance(missing.exception, InputError)


def test_tokenising_in_chunks_gives_the_ids_of_one_call(tiny_bert_dir, monkeypatch):
    from pretrieve.retrieval import batches

    retriever = dense(tiny_bert_dir, pooling="cls")
    texts = [f"passage {i} " + "word " * (i % 7) for i in range(23)]
    monkeypatch.setattr(batches, "TOKENIZE_CHUNK", 10_000)
    whole = batches.tokenize(retriever.passage, texts)
    monkeypatch.setattr(batches, "TOKENIZE_CHUNK", 5)
    chunked = batches.tokenize(retriever.passage, texts)
    assert chunked == whole and len(chunked[0]) == 23
    assert whole[0] == retriever.passage.tokenizer(texts, truncation=True,
                                                   max_length=retriever.passage.max_length)["input_ids"]
