"""Pre-training and fine-tuning keep the base model's pooling and similarity: all-MiniLM-L6-v2 (mean pooling,
Normalize, cosine) pre-trained and then fine-tuned is still mean + cosine, and the logs say what was kept or
changed."""

from __future__ import annotations

import json
import logging

import pretrieve
from pretrieve.modeling.sentence_transformer import ModelFiles, read_sentence_transformers_config

from test_finetune import write_collection


def test_pretrain_then_finetune_of_minilm_keeps_mean_pooling_and_cosine(minilm, tmp_path, caplog):
    data = write_collection(tmp_path / "data" / "tiny")
    caplog.set_level(logging.INFO, logger="pretrieve")
    encoder = pretrieve.pretrain(minilm, data, tmp_path / "pretrain", method="bow", max_steps=1, batch_size=2,
                                 max_len=32, show_progress=False)
    kept = read_sentence_transformers_config(ModelFiles(str(encoder)))
    assert kept is not None and kept.pooling == ("mean",) and kept.normalize and kept.similarity in (None, "cosine")
    assert "keeps the sentence-transformers modules of minilm" in caplog.text and "mean pooling, normalised, cosine similarity" in caplog.text

    tuned = pretrieve.finetune(encoder, data, tmp_path / "finetune", max_steps=1, batch_size=2, num_negatives=1,
                               show_progress=False)
    representation = json.loads((tuned / "dual_encoder.json").read_text())["representation"]
    assert representation["pooling"] == "mean" and representation["normalize"] is True
    st = read_sentence_transformers_config(ModelFiles(str(tuned)))
    assert st.pooling == ("mean",) and st.normalize and st.similarity == "cosine"   # the export's own files

    caplog.clear()   # asked for another pooling: done, and said
    pretrieve.finetune(encoder, data, tmp_path / "finetune-cls", max_steps=1, batch_size=2, num_negatives=1,
                       pooling="cls", show_progress=False)
    assert "fine-tuning changes that to cls" in caplog.text


def test_a_notebook_is_told_what_the_command_line_prints_when_pretraining_minilm(minilm, tmp_path, capsys,
                                                                                  monkeypatch):
    """No logging configured (a notebook): ``pretrain`` still says, on stderr, the pooling it keeps, the precision
    it trains at and — for bow's default [CLS] bottleneck on a mean-pooled model — that it will not help."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])   # pytest's capture handler off: nothing configured
    data = write_collection(tmp_path / "data" / "tiny")
    pretrieve.pretrain(minilm, data, tmp_path / "pretrain", method="bow", max_steps=1, batch_size=2, max_len=32,
                       show_progress=False)
    told = capsys.readouterr().err
    assert "pretrieve: the pre-trained model keeps the sentence-transformers modules of minilm" in told
    assert "mean pooling" in told and " precision on cpu" in told
    assert "this pre-training will not help its retrieval" in told and "bottleneck: mean" in told
    assert not logging.getLogger("pretrieve").handlers   # removed afterwards: no global state changed
