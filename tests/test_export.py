"""Export: sentence-transformers and pretrieve's loader load the fine-tuned retriever and encode alike — siamese,
separate towers and CoT-MoTE (through sentence-transformers' Router), with their prompts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pretrieve.modeling.dual_encoder import TOWER_FOLDERS, DualEncoder
from pretrieve.modeling.export import export_retriever
from pretrieve.modeling.representations import DenseRepresentation
from pretrieve.retrieval.load import load_dense_encoder, load_retriever

TEXTS = ["what causes rain?", "Protein folding is predicted from sequence by deep networks. " * 12, "dogs",
         "The stock market fell sharply on Monday after the announcement of new tariffs."]
MAX_LEN = 40  # shorter than the long text: truncation must agree too


def model_vectors(model: DualEncoder, tokenizer, texts, text_type: str) -> np.ndarray:
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
    with torch.no_grad():
        return model.eval().encode(text_type, encoded["input_ids"], encoded["attention_mask"],
                                   encoded.get("token_type_ids")).numpy()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_transformers_and_dense_encoder_agree(tiny_bert_dir, tokenizer, tmp_path, pooling, normalize):
    from sentence_transformers import SentenceTransformer

    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation(pooling, normalize,
                                                                           temperature=0.05 if normalize else 1.0))
    out = export_retriever(model, tokenizer, tmp_path / "exported", MAX_LEN)
    st = SentenceTransformer(str(out), device="cpu")
    assert st.max_seq_length == MAX_LEN
    st_vectors = st.encode(TEXTS, convert_to_numpy=True, batch_size=2)
    encoder = load_dense_encoder(out)
    assert encoder.pooling == (pooling,) and encoder.normalize is normalize and encoder.max_length == MAX_LEN
    ours = encoder.embed(TEXTS).numpy()
    np.testing.assert_allclose(st_vectors, ours, atol=1e-5)
    np.testing.assert_allclose(ours, model_vectors(model, tokenizer, TEXTS, "passage"), atol=1e-5)
    config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert config["similarity_fn_name"] == ("cosine" if normalize else "dot")
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == MAX_LEN


def test_cosine_model_gets_a_normalize_module(tiny_bert_dir, tokenizer, tmp_path):
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("cls", similarity="cos", temperature=0.05))
    out = export_retriever(model, tokenizer, tmp_path / "cos", MAX_LEN)
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    vectors = load_dense_encoder(out).embed(TEXTS).numpy()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    raw = model_vectors(model, tokenizer, TEXTS, "passage")  # trained on cosine: same direction
    np.testing.assert_allclose(vectors, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)


def assert_sides_match(out, model, tokenizer):
    """``SentenceTransformer(out).encode_query/encode_document`` and pretrieve's loader both give the model's query
    and passage vectors (max abs diff ≤ 1e-5)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(out), device="cpu")
    retriever = load_retriever(out, device="cpu", precision="fp32")
    queries = model_vectors(model, tokenizer, TEXTS, "query")
    passages = model_vectors(model, tokenizer, TEXTS, "passage")
    np.testing.assert_allclose(st.encode_query(TEXTS, convert_to_numpy=True), queries, atol=1e-5)
    np.testing.assert_allclose(st.encode_document(TEXTS, convert_to_numpy=True), passages, atol=1e-5)
    np.testing.assert_allclose(retriever.query_encoder.embed(TEXTS).numpy(), queries, atol=1e-5)
    np.testing.assert_allclose(retriever.passage_encoder.embed(TEXTS).numpy(), passages, atol=1e-5)
    assert not np.allclose(queries, passages, atol=1e-3)   # the two sides really differ


def test_separate_towers_export_through_a_router(tiny_bert_dir, tokenizer, tmp_path):
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean"), tied=False)
    with torch.no_grad():
        for param in model.tower("query").parameters():
            param.add_(0.01 * torch.randn_like(param))
    out = export_retriever(model, tokenizer, tmp_path / "sep", MAX_LEN)
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Router", "Pooling"]
    assert json.loads((out / "router_config.json").read_text())["structure"] == {
        "query": [TOWER_FOLDERS["query"]], "document": [TOWER_FOLDERS["passage"]]}
    assert not (out / "query").exists() and len(list(out.rglob("*.safetensors"))) == 2   # each tower once
    assert_sides_match(out, model, tokenizer)
    assert DualEncoder.load(out).tied is False


def test_pretrieve_dense_runs_on_the_export(tiny_bert_dir, tokenizer, tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app
    from pretrieve.data.trec import read_run
    from test_finetune import write_collection

    data = write_collection(tmp_path / "beir")
    out = export_retriever(DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean")), tokenizer,
                           tmp_path / "exported", MAX_LEN)
    result = CliRunner().invoke(app, ["dense", "--model", str(out), "--data", str(data), "--out",
                                      str(tmp_path / "run.trec"), "--k", "5", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    run = read_run(tmp_path / "run.trec")
    assert set(run) == {"t0", "t1", "t2", "t3"} and all(len(docs) == 5 for docs in run.values())


def tiny_mote_retriever(tokenizer, path):
    """A tiny CoT-MoTE checkpoint saved to ``path`` (query experts moved away from the passage ones) and the dual
    encoder on it ([CLS], normalised)."""
    from conftest import tiny_bert_config
    from pretrieve.modeling import Encoder
    from pretrieve.modeling.mote import enable_mote, expert_parameters

    torch.manual_seed(0)
    encoder = Encoder.from_config(tiny_bert_config())
    enable_mote(encoder.model)
    with torch.no_grad():
        for param in expert_parameters(encoder.model, "query"):
            param.add_(0.1 * torch.randn_like(param))
    encoder.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return DualEncoder.from_pretrained(path, DenseRepresentation("cls", normalize=True, temperature=0.05))


def test_mote_export_routes_queries_to_the_query_expert(tokenizer, tmp_path):
    """CoT-MoTE: each side is written as a plain transformer (shared weights + its FFN experts) behind a Router, so
    sentence-transformers encodes queries with Q-FFN and passages with P-FFN, exactly as pretrieve; the root keeps
    the MoTE checkpoint for pretrieve (DualEncoder.load restores both experts)."""
    from pretrieve.modeling.mote import is_mote

    model = tiny_mote_retriever(tokenizer, tmp_path / "mote")
    out = export_retriever(model, tokenizer, tmp_path / "exported", MAX_LEN)
    for folder in TOWER_FOLDERS.values():
        assert "mote" not in json.loads((out / folder / "config.json").read_text())
    assert_sides_match(out, model, tokenizer)
    reloaded = DualEncoder.load(out)
    assert reloaded.tied and is_mote(reloaded.query_tower.encoder.model)


def test_prompts_are_saved_and_used_by_both_loaders(tiny_bert_dir, tokenizer, tmp_path):
    """A prompt changes the vectors exactly as prepending its text does; an exported model's prompts are used by
    SentenceTransformer.encode_query/encode_document and by pretrieve, and explicit prompts replace them."""
    from sentence_transformers import SentenceTransformer

    from pretrieve.retrieval.batches import encode_all

    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean"))
    out = export_retriever(model, tokenizer, tmp_path / "prompted", MAX_LEN,
                           prompts={"query": "query: ", "passage": "passage: "})
    assert json.loads((out / "config_sentence_transformers.json").read_text())["prompts"] == {
        "query": "query: ", "document": "passage: "}
    queries = model_vectors(model, tokenizer, ["query: " + t for t in TEXTS], "query")
    passages = model_vectors(model, tokenizer, ["passage: " + t for t in TEXTS], "passage")
    st = SentenceTransformer(str(out), device="cpu")
    np.testing.assert_allclose(st.encode_query(TEXTS, convert_to_numpy=True), queries, atol=1e-5)
    np.testing.assert_allclose(st.encode_document(TEXTS, convert_to_numpy=True), passages, atol=1e-5)
    retriever = load_retriever(out, device="cpu", precision="fp32")
    np.testing.assert_allclose(encode_all(retriever.query, TEXTS)["embeddings"], queries, atol=1e-5)
    np.testing.assert_allclose(encode_all(retriever.passage, TEXTS)["embeddings"], passages, atol=1e-5)
    other = load_retriever(out, device="cpu", precision="fp32", query_prompt="search_query: ", passage_prompt="")
    np.testing.assert_allclose(encode_all(other.query, TEXTS)["embeddings"],
                               model_vectors(model, tokenizer, ["search_query: " + t for t in TEXTS], "query"),
                               atol=1e-5)
    np.testing.assert_allclose(encode_all(other.passage, TEXTS)["embeddings"],
                               model_vectors(model, tokenizer, TEXTS, "passage"), atol=1e-5)


def test_an_interpolated_mote_export_keeps_its_side_folders_equal_to_its_experts(tokenizer, tmp_path):
    """WiSE-FT of an exported CoT-MoTE retriever: the root (both experts) and the per-side folders that
    sentence-transformers reads must stay one model — each side's FFN interpolated with the base's same expert."""
    from pretrieve.modeling.interpolate import interpolate_retriever

    model = tiny_mote_retriever(tokenizer, tmp_path / "base")
    with torch.no_grad():   # "fine-tuning": every weight moves
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    finetuned = export_retriever(model, tokenizer, tmp_path / "finetuned", MAX_LEN)
    mixed = interpolate_retriever(tmp_path / "base", finetuned, 0.5, tmp_path / "wise")
    assert_sides_match(mixed, DualEncoder.load(mixed).eval(), tokenizer)


@pytest.mark.parametrize("tied", [True, False])
def test_long_queries_and_passages_give_pretrieves_vectors_in_sentence_transformers(tiny_bert_dir, tokenizer,
                                                                                   tmp_path, tied):
    """The export carries each side's trained length (queries 32 tokens, passages 144): ``encode_query`` of a
    60-token query and ``encode_document`` of a 300-token passage equal ``pretrieve.encode`` to 1e-5."""
    import pretrieve
    from sentence_transformers import SentenceTransformer

    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean", normalize=True, temperature=0.05),
                                        tied=tied)
    out = export_retriever(model, tokenizer, tmp_path / "exported", 144,
                           training={"query_max_len": 32, "passage_max_len": 144})
    query = " ".join(["which", "proteins", "fold", "into", "stable", "structures"] * 10)   # 60 tokens
    passage = " ".join(["protein", "folding", "is", "predicted", "from", "sequence"] * 50)   # 300 tokens
    assert len(tokenizer(query, add_special_tokens=False)["input_ids"]) == 60
    assert len(tokenizer(passage, add_special_tokens=False)["input_ids"]) == 300
    st = SentenceTransformer(str(out), device="cpu")
    retriever = pretrieve.load_retriever(out, device="cpu", precision="fp32")
    ours_query = pretrieve.encode(retriever, [query], side="query", show_progress=False)
    ours_passage = pretrieve.encode(retriever, [passage], show_progress=False)
    np.testing.assert_allclose(st.encode_query([query], convert_to_numpy=True), ours_query, atol=1e-5)
    np.testing.assert_allclose(st.encode_document([passage], convert_to_numpy=True), ours_passage, atol=1e-5)
    cut = tokenizer(query, truncation=True, max_length=32)["input_ids"]   # the query really is cut at 32
    np.testing.assert_allclose(ours_query, pretrieve.encode(retriever, [tokenizer.decode(cut[1:-1])], side="query",
                                                            show_progress=False), atol=1e-5)


def test_separate_towers_saved_before_in_query_and_passage_folders_still_load(tiny_bert_dir, tmp_path):
    """A retriever with separate towers written by an earlier pretrieve (``query/``, ``passage/``) loads as saved."""
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean"), tied=False)
    with torch.no_grad():
        for param in model.tower("query").parameters():
            param.add_(0.01 * torch.randn_like(param))
    out = model.save(tmp_path / "old")
    for side, folder in TOWER_FOLDERS.items():
        (out / folder).rename(out / side)
    reloaded = DualEncoder.load(out)
    for side in ("query", "passage"):
        for mine, theirs in zip(model.tower(side).parameters(), reloaded.tower(side).parameters()):
            assert torch.equal(mine, theirs)
