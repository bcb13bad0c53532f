"""Export: sentence-transformers and pretrieve's loader load the fine-tuned retriever and encode alike;
a CoT-MoTE export warns that sentence-transformers runs its passage expert only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pretrieve.modeling.dual_encoder import DualEncoder
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
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == MAX_LEN


def test_cosine_model_gets_a_normalize_module(tiny_bert_dir, tokenizer, tmp_path):
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("cls", similarity="cos", temperature=0.05))
    out = export_retriever(model, tokenizer, tmp_path / "cos", MAX_LEN)
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    vectors = load_dense_encoder(out).embed(TEXTS).numpy()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    raw = model_vectors(model, tokenizer, TEXTS, "passage")  # trained on cosine: same direction
    np.testing.assert_allclose(vectors, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)


def test_separate_towers_are_two_sentence_transformers_folders(tiny_bert_dir, tokenizer, tmp_path):
    from sentence_transformers import SentenceTransformer


    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean"), tied=False)
    with torch.no_grad():
        for param in model.tower("query").parameters():
            param.add_(0.01 * torch.randn_like(param))
    out = export_retriever(model, tokenizer, tmp_path / "sep", MAX_LEN)
    assert not (out / "modules.json").exists() and (out / "dual_encoder.json").exists()
    retriever = load_retriever(out, device="cpu", precision="fp32")
    query_encoder, passage_encoder = retriever.query_encoder, retriever.passage_encoder
    for side, encoder in (("query", query_encoder), ("passage", passage_encoder)):
        expected = model_vectors(model, tokenizer, TEXTS, side)
        np.testing.assert_allclose(encoder.embed(TEXTS).numpy(), expected, atol=1e-5)
        st = SentenceTransformer(str(out / side), device="cpu")
        np.testing.assert_allclose(st.encode(TEXTS, convert_to_numpy=True), expected, atol=1e-5)
    assert not np.allclose(query_encoder.embed(TEXTS).numpy(), passage_encoder.embed(TEXTS).numpy())
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


def test_mote_export_warns_that_sentence_transformers_runs_the_passage_expert_only(tokenizer, tmp_path):
    """sentence-transformers cannot route queries to Q-FFN: the export says so (warning + flag in its config),
    SentenceTransformer encodes every text with the passage expert, and pretrieve's loaders route both."""
    from sentence_transformers import SentenceTransformer

    from conftest import tiny_bert_config
    from pretrieve.modeling import Encoder
    from pretrieve.modeling.export import MoTEExportWarning
    from pretrieve.modeling.mote import enable_mote, expert_parameters

    torch.manual_seed(0)
    encoder = Encoder.from_config(tiny_bert_config())
    enable_mote(encoder.model)
    with torch.no_grad():
        for param in expert_parameters(encoder.model, "query"):
            param.add_(0.1 * torch.randn_like(param))
    encoder.save_pretrained(tmp_path / "mote")
    tokenizer.save_pretrained(tmp_path / "mote")
    model = DualEncoder.from_pretrained(tmp_path / "mote", DenseRepresentation("cls"))
    with pytest.warns(MoTEExportWarning, match="passage expert only"):
        out = export_retriever(model, tokenizer, tmp_path / "exported", MAX_LEN)
    config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert config["mote_passage_expert_only"] is True
    st_vectors = SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_numpy=True)
    passages = model_vectors(model, tokenizer, TEXTS, "passage")
    queries = model_vectors(model, tokenizer, TEXTS, "query")
    np.testing.assert_allclose(st_vectors, passages, atol=1e-5)               # P-FFN for every text
    assert not np.allclose(st_vectors, queries, atol=1e-3)
    retriever = load_retriever(out, device="cpu", precision="fp32")
    query_encoder, passage_encoder = retriever.query_encoder, retriever.passage_encoder
    np.testing.assert_allclose(query_encoder.embed(TEXTS).numpy(), queries, atol=1e-5)
    np.testing.assert_allclose(passage_encoder.embed(TEXTS).numpy(), passages, atol=1e-5)


def test_plain_export_does_not_warn(tiny_bert_dir, tokenizer, tmp_path):
    import warnings

    from pretrieve.modeling.export import MoTEExportWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", MoTEExportWarning)
        out = export_retriever(DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("cls")), tokenizer,
                               tmp_path / "plain", MAX_LEN)
    assert "mote_passage_expert_only" not in json.loads((out / "config_sentence_transformers.json").read_text())
