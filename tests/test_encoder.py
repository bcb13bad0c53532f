"""Encoder wrapper: generic MLM head over BERT / RoBERTa / DistilBERT, head creation, save/load round trips."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (AutoModel, AutoModelForMaskedLM, DistilBertConfig, DistilBertForMaskedLM, RobertaConfig,
                          RobertaForMaskedLM)

from conftest import tiny_bert_config
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder
from pretrieve.modeling import encoder as encoder_module

IDS = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 7592, 2088, 102, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


def _hf_logits(model, ids=IDS, mask=MASK):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _our_logits(encoder: Encoder, ids=IDS, mask=MASK):
    encoder.eval()
    with torch.no_grad():
        return encoder.mlm_logits(encoder(ids, mask).last_hidden_state)


def test_bert_with_head_matches_hf_and_logs_nothing(tiny_mlm_dir, caplog):
    caplog.set_level(logging.WARNING, logger="pretrieve.modeling.encoder")
    encoder = Encoder.from_pretrained(tiny_mlm_dir)
    assert not [r for r in caplog.records if r.name == "pretrieve.modeling.encoder"]
    hf = AutoModelForMaskedLM.from_pretrained(tiny_mlm_dir)
    torch.testing.assert_close(_our_logits(encoder), _hf_logits(hf), atol=1e-5, rtol=1e-5)
    assert encoder.hidden_size == 32 and encoder.vocab_size == 30522
    assert encoder.model.get_output_embeddings().weight is encoder.word_embeddings.weight
    # embed_tokens is the body's embedding layer; position_embeddings are the raw rows
    with torch.no_grad():
        torch.testing.assert_close(encoder.embed_tokens(IDS), hf.bert.embeddings(input_ids=IDS))
        positions = torch.tensor([[0, 3, 5]])
        torch.testing.assert_close(encoder.position_embeddings(positions),
                                   hf.bert.embeddings.position_embeddings.weight[[0, 3, 5]].unsqueeze(0))
    assert encoder.position_ids(IDS).tolist() == [list(range(6))] * 2


def test_bert_without_head_gets_a_created_tied_head(tiny_bert_dir, caplog):
    caplog.set_level(logging.WARNING, logger="pretrieve.modeling.encoder")
    encoder = Encoder.from_pretrained(tiny_bert_dir)
    messages = [r.getMessage() for r in caplog.records if r.name == "pretrieve.modeling.encoder"]
    assert len(messages) == 1 and "no MLM head" in messages[0] and "created" in messages[0]
    head = encoder.model.cls.predictions
    assert head.decoder.weight is encoder.word_embeddings.weight
    assert torch.count_nonzero(head.bias) == 0
    assert torch.equal(head.transform.LayerNorm.weight, torch.ones(32))
    assert torch.count_nonzero(head.transform.LayerNorm.bias) == 0
    assert 0.01 < float(head.transform.dense.weight.detach().std()) < 0.03  # fresh N(0, 0.02)
    # the body is the checkpoint's
    body = AutoModel.from_pretrained(tiny_bert_dir)
    torch.testing.assert_close(encoder.word_embeddings.weight, body.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("source", ["tiny_mlm_dir", "tiny_bert_dir"])
def test_save_then_load_with_automodel_and_automodelformaskedlm(source, request, tmp_path):
    encoder = Encoder.from_pretrained(request.getfixturevalue(source))
    encoder.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    encoder.eval()
    with torch.no_grad():
        hidden = encoder(IDS, MASK).last_hidden_state
        logits = encoder.mlm_logits(hidden)
        body = AutoModel.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(body(input_ids=IDS, attention_mask=MASK).last_hidden_state, hidden,
                                   atol=0, rtol=0)
        mlm = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(mlm(input_ids=IDS, attention_mask=MASK).logits, logits, atol=0, rtol=0)
    reloaded = Encoder.from_pretrained(tmp_path)
    torch.testing.assert_close(_our_logits(reloaded), logits, atol=0, rtol=0)


def test_roberta_family_without_bert_attribute_names(tmp_path, tokenizer):
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=40, pad_token_id=tokenizer.pad_token_id)
    RobertaForMaskedLM(config).save_pretrained(tmp_path)
    encoder = Encoder.from_pretrained(tmp_path)
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert encoder._head_names == ("lm_head",)
    torch.testing.assert_close(_our_logits(encoder), _hf_logits(hf), atol=1e-5, rtol=1e-5)
    # RoBERTa positions start after padding_idx; padding keeps padding_idx
    pad = tokenizer.pad_token_id
    assert encoder.position_ids(IDS).tolist() == [[pad + 1 + i for i in range(6)],
                                                  [pad + 1, pad + 2, pad + 3, pad + 4, pad, pad]]
    with torch.no_grad():
        torch.testing.assert_close(encoder.embed_tokens(IDS), hf.roberta.embeddings(input_ids=IDS))


def test_distilbert_head_order():
    torch.manual_seed(0)
    model = DistilBertForMaskedLM(DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=2, hidden_dim=64))
    encoder = Encoder(model)
    assert encoder._head_names == ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector")
    torch.testing.assert_close(_our_logits(encoder), _hf_logits(model), atol=1e-5, rtol=1e-5)


def test_unsupported_head_layout_fails_loudly(monkeypatch):
    monkeypatch.setitem(encoder_module.HEAD_ORDER, "bert", ("cls", "cls"))
    with pytest.raises(ConfigError, match="unsupported MLM head layout"):
        Encoder.from_config(tiny_bert_config())


def test_text_type_is_accepted_and_ignored():
    torch.manual_seed(0)
    encoder = Encoder.from_config(tiny_bert_config()).eval()
    with torch.no_grad():
        plain = encoder(IDS, MASK)
        typed = encoder(IDS, MASK, text_type=torch.tensor([0, 1]))
    torch.testing.assert_close(plain.last_hidden_state, typed.last_hidden_state)
    torch.testing.assert_close(plain.cls, plain.last_hidden_state[:, 0])


def test_real_minilm_checkpoint_gets_a_head(minilm, caplog):
    caplog.set_level(logging.WARNING, logger="pretrieve.modeling.encoder")
    encoder = Encoder.from_pretrained(minilm)
    assert any("no MLM head" in r.getMessage() for r in caplog.records)
    assert encoder.hidden_size == 384 and encoder.vocab_size == 30522
    assert encoder.model.get_output_embeddings().weight is encoder.word_embeddings.weight
