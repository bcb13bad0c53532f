"""Title and text joined as the authors' code joins them (fidelity review N1): ``title_join: sep`` puts the
tokenizer's [SEP] between a passage's title and its text (RetroMAE's ``preprocess.py``, Tevatron's
``TrainPreProcessor``: ``title + tokenizer.sep_token + text``), in training and — read back from the model's
training record — in every encoding of the corpus; ``space`` (the default) keeps ``title + " " + text``."""

from __future__ import annotations

import json

import pytest
import torch

from pretrieve.data.arrow import CorpusTexts
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import TrainingGroup
from pretrieve.data.records import title_separator
from pretrieve.errors import ConfigError
from pretrieve.retrieval import batches
from pretrieve.retrieval.load import load_retriever
from pretrieve.train.collator import GroupCollator
from pretrieve.train.finetuner import finetune
from test_finetune import make_config, tiny_collection, write_collection  # noqa: F401  (fixture)


def test_title_separator_is_a_space_or_the_tokenizers_sep_token(tokenizer):
    assert title_separator(None) == title_separator("space") == " "
    assert title_separator("sep", tokenizer) == tokenizer.sep_token == "[SEP]"
    with pytest.raises(ValueError, match="title_join"):
        title_separator("colon", tokenizer)


def passage_ids(tokenizer, title: str, text: str, sep: bool) -> list[int]:
    """What the authors' pre-processing gives: [CLS] title [SEP] text [SEP] (sep), [CLS] title text [SEP] (space)."""
    title_ids = tokenizer(title, add_special_tokens=False)["input_ids"]
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    middle = [tokenizer.sep_token_id] if sep else []
    return [tokenizer.cls_token_id] + title_ids + middle + text_ids + [tokenizer.sep_token_id]


@pytest.mark.parametrize("sep", [True, False])
def test_the_collator_joins_title_and_text_as_asked(tokenizer, tiny_collection, sep):
    corpus = CorpusTexts(BeirCollection(tiny_collection).corpus_dataset())
    doc = BeirCollection(tiny_collection).load_corpus()["d0"]
    groups = [TrainingGroup("q0", "protein?", ["d0"], ["d20", "d21"])]
    collator = GroupCollator(tokenizer, corpus, num_negatives=2, query_max_len=8, passage_max_len=64,
                             title_sep=title_separator("sep" if sep else "space", tokenizer))
    batch = collator(groups, torch.Generator().manual_seed(0))
    row = batch["passage_input_ids"][0][batch["passage_attention_mask"][0].bool()].tolist()
    assert row == passage_ids(tokenizer, doc.title, doc.text, sep)
    assert row.count(tokenizer.sep_token_id) == (2 if sep else 1)


def test_a_retriever_trained_with_the_sep_join_encodes_the_corpus_with_it(tiny_bert_dir, tiny_collection, tmp_path,
                                                                          monkeypatch):
    final = finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "sep", max_steps=1, title_join="sep"))
    record = json.loads((final / "finetune_config.json").read_text())
    assert record["settings"]["title_join"] == "sep"
    assert json.loads((final / "dual_encoder.json").read_text())["training"]["title_join"] == "sep"
    retriever = load_retriever(final, device="cpu")
    assert retriever.passage.title_sep == "[SEP]" and retriever.query.title_sep == " "
    assert retriever.settings()["passage"]["title_join"] == "sep"   # an index of another join is not reused
    seen: list[str] = []
    real = batches.window_batches
    monkeypatch.setattr(batches, "window_batches", lambda side, texts, size: seen.extend(texts) or real(side, texts,
                                                                                                         size))
    corpus = BeirCollection(tiny_collection).corpus_dataset()
    list(batches.encode_windows(retriever.passage, corpus, batch_size=8, end=2))
    assert seen == ["Protein Folding[SEP]protein folding is studied in detail. the protein folding report explains "
                    "the causes of protein folding.",
                    "Solar Energy[SEP]solar energy is studied in detail. the solar energy report explains the causes "
                    "of solar energy."]


def test_the_default_join_is_a_space_and_leaves_earlier_runs_current(tiny_bert_dir, tiny_collection, tmp_path):
    config = make_config(tiny_bert_dir, tiny_collection, tmp_path / "space")
    assert config.title_join == "space" and "title_join" not in config.settings()
    sep = make_config(tiny_bert_dir, tiny_collection, tmp_path / "x", title_join="sep")
    assert sep.settings()["title_join"] == "sep"
    with pytest.raises(ConfigError, match="title_join must be one of space, sep"):
        make_config(tiny_bert_dir, tiny_collection, tmp_path / "x", title_join="colon").check()
    texts = CorpusTexts(BeirCollection(tiny_collection).corpus_dataset())
    assert batches.text_slice(texts, 0, 1) == texts[0:1] == [texts.texts_of(["d0"])[0]]
    assert batches.text_slice(texts, 0, 1, "[SEP]") == texts.texts_of(["d0"], "[SEP]")
