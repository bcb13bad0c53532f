"""Input-token coverage (paper 000 Algorithm 1): the batched implementation against plain loops.

A tiny random encoder gets a few MLM-head biases raised (some input tokens, every special token, the
stopword "the") so that the top-k lists contain hits, and so that a special token or a stopword would win
if it were not excluded. The brute force encodes one text at a time and ranks the vocabulary with
``sorted`` — no shared code with the implementation beyond the model itself.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_bert_config
from pretrieve.analysis.coverage import (CoverageReport, format_examples, frequent_token_ids, input_token_sets,
                                         plot_coverage, stopword_ids, token_coverage)
from pretrieve.errors import InputError
from pretrieve.modeling import Encoder

TEXTS = [
    "the cat sat on the mat",
    "dense retrieval with bag of words prediction",
    "the quick brown fox jumps over the lazy dog",
    "masked auto encoders compress lexical signals into the cls vector",
    "an unbelievably tokenized sentence",
]
KS = (1, 3, 10, 50)


@pytest.fixture(scope="module")
def encoder(tokenizer) -> Encoder:
    torch.manual_seed(0)
    enc = Encoder.from_config(tiny_bert_config()).eval()
    bias = enc.model.cls.predictions.bias
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        words = sorted({i for text in TEXTS for i in tokenizer(text)["input_ids"]})
        bias[torch.tensor(words)] += 6.0 * torch.rand(len(words), generator=generator)  # some hits, some misses
        bias[torch.tensor(tokenizer.all_special_ids)] = 100.0   # would top every list if ranked
        bias[tokenizer.convert_tokens_to_ids("the")] = 50.0     # a stopword that would always be a hit
    return enc


def brute_force(encoder: Encoder, tokenizer, texts, ks, excluded: set[int], max_len: int = 144):
    """Per-text loops: top-k of the head's logits over non-excluded tokens, membership in the input set."""
    ratio = {k: [] for k in ks}
    recall = {k: [] for k in ks}
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=max_len)["input_ids"]
            tensor = torch.tensor([ids])
            logits = encoder.mlm_logits(encoder(tensor, torch.ones_like(tensor)).cls)[0].tolist()
            ranking = sorted((i for i in range(len(logits)) if i not in excluded), key=lambda i: -logits[i])
            input_set = {i for i in ids if i not in excluded}
            for k in ks:
                found = sum(1 for token in ranking[:k] if token in input_set)
                ratio[k].append(found / k)
                recall[k].append(found / len(input_set))
    return ({k: sum(v) / len(v) for k, v in ratio.items()}, {k: sum(v) / len(v) for k, v in recall.items()})


def test_ratio_equals_brute_force(encoder, tokenizer):
    report = token_coverage(encoder, tokenizer, TEXTS, ks=KS, batch_size=2)   # padding inside batches
    expected_ratio, expected_recall = brute_force(encoder, tokenizer, TEXTS, KS, set(tokenizer.all_special_ids))
    assert report.ks == KS and report.num_texts == len(TEXTS)
    for k in KS:
        assert report.ratio[k] == pytest.approx(expected_ratio[k], abs=1e-9)
        assert report.input_recall[k] == pytest.approx(expected_recall[k], abs=1e-9)
    assert 0 < report.ratio[10] < 1  # the test is not trivial: hits and misses both occur


def test_special_tokens_never_count(encoder, tokenizer):
    report = token_coverage(encoder, tokenizer, TEXTS, ks=(5,), num_examples=len(TEXTS), show_top=20)
    specials = set(tokenizer.all_special_tokens)
    shown = [t["token"] for example in report.examples for t in example["top_tokens"]]
    assert len(shown) == 20 * len(TEXTS) and not specials & set(shown)
    # "the" (bias 50) ranks first and is a hit exactly in the texts that contain it
    for text, example in zip(TEXTS, report.examples):
        assert example["top_tokens"][0] == {"token": "the", "hit": "the" in text.split()}


def test_exclude_stopwords_removes_them_from_ranking_and_input(encoder, tokenizer):
    stop = set(stopword_ids(tokenizer))
    assert tokenizer.convert_tokens_to_ids("the") in stop and tokenizer.convert_tokens_to_ids("cat") not in stop
    report = token_coverage(encoder, tokenizer, TEXTS, ks=KS, exclude_stopwords=True, num_examples=len(TEXTS))
    shown = {t["token"] for example in report.examples for t in example["top_tokens"]}
    assert not shown & set(tokenizer.convert_ids_to_tokens(sorted(stop)))
    expected_ratio, expected_recall = brute_force(encoder, tokenizer, TEXTS, KS,
                                                  set(tokenizer.all_special_ids) | stop)
    for k in KS:
        assert report.ratio[k] == pytest.approx(expected_ratio[k], abs=1e-9)
        assert report.input_recall[k] == pytest.approx(expected_recall[k], abs=1e-9)
    with_stopwords = token_coverage(encoder, tokenizer, TEXTS, ks=(1,))
    assert with_stopwords.ratio[1] != report.ratio[1]   # "the" was a top-1 hit in 3 of 5 texts


def test_excluded_ids_leave_ranking_and_input_and_per_text_values_average_to_the_ratio(encoder, tokenizer):
    frequent = frequent_token_ids(tokenizer, TEXTS, n=4, batch_size=2)
    counts = {}
    for text in TEXTS:
        for i in tokenizer(text, add_special_tokens=False)["input_ids"]:
            counts[i] = counts.get(i, 0) + 1
    assert frequent == sorted(counts, key=lambda i: (-counts[i], i))[:4]
    assert frequent[0] == tokenizer.convert_tokens_to_ids("the")
    report = token_coverage(encoder, tokenizer, TEXTS, ks=KS, exclude_ids=frequent, num_examples=len(TEXTS))
    shown = {t["token"] for example in report.examples for t in example["top_tokens"]}
    assert not shown & set(tokenizer.convert_ids_to_tokens(frequent))
    expected_ratio, expected_recall = brute_force(encoder, tokenizer, TEXTS, KS,
                                                  set(tokenizer.all_special_ids) | set(frequent))
    for k in KS:
        assert report.ratio[k] == pytest.approx(expected_ratio[k], abs=1e-9)
        assert report.input_recall[k] == pytest.approx(expected_recall[k], abs=1e-9)
        assert len(report.per_text[k]) == len(TEXTS)
        assert sum(report.per_text[k]) / len(TEXTS) == pytest.approx(report.ratio[k], abs=1e-12)
    assert report.to_dict()["per_text"]["1"] == report.per_text[1]


def test_input_token_sets_by_hand():
    ids = torch.tensor([[101, 7, 9, 7, 102], [101, 5, 102, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    excluded = torch.zeros(200, dtype=torch.bool)
    excluded[[0, 101, 102]] = True
    present = input_token_sets(ids, mask, excluded, 200)
    assert present[0].nonzero().flatten().tolist() == [7, 9]
    assert present[1].nonzero().flatten().tolist() == [5]


def test_bad_input_is_an_input_error(encoder, tokenizer):
    with pytest.raises(InputError):
        token_coverage(encoder, tokenizer, [], ks=(10,))
    with pytest.raises(InputError):
        token_coverage(encoder, tokenizer, TEXTS, ks=(0,))
    with pytest.raises(InputError):   # nothing but special tokens to cover
        token_coverage(encoder, tokenizer, ["", "[SEP]"], ks=(1,))


def test_plot_and_examples(tmp_path, encoder, tokenizer):
    report = token_coverage(encoder, tokenizer, TEXTS[:2], ks=(1, 5))
    text = format_examples(report)
    assert text.count("text: ") == 2 and ("✓" in text or "✗" in text)
    other = CoverageReport(model="b", ks=(1, 5), ratio={1: 0.5, 5: 0.2}, num_texts=2,
                           input_recall={1: 0.1, 5: 0.3}, head_created=True)
    path = tmp_path / "plots" / "coverage.png"
    plot_coverage({"a": report, "b": other}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_coverage(tmp_path, tiny_mlm_dir, tiny_bert_dir):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "coverage"
    result = CliRunner().invoke(app, ["analyze", "coverage", "--model", str(tiny_mlm_dir), "--model",
                                      str(tiny_bert_dir), "--corpus", str(corpus), "--num-texts", "4",
                                      "--ks", "5,10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "k=5" in result.output and "k=10" in result.output and "✗" in result.output
    data = json.loads((out / "coverage.json").read_text())
    checkpoints = data["checkpoints"]
    assert data["settings"]["num_texts"] == 4 and set(data["settings"]["ks"]) == {5, 10}
    assert checkpoints[str(tiny_mlm_dir)]["head_created"] is False
    assert checkpoints[str(tiny_bert_dir)]["head_created"] is True   # BertModel: head created and flagged
    assert set(checkpoints[str(tiny_mlm_dir)]["coverage"]) == {"5", "10"}
    assert len(checkpoints[str(tiny_mlm_dir)]["examples"]) == 3
    assert (out / "coverage.png").read_bytes()[:4] == b"\x89PNG" and (out / "provenance.json").exists()

    bad = CliRunner().invoke(app, ["analyze", "coverage", "--model", str(tiny_mlm_dir), "--corpus",
                                   str(corpus), "--ks", "ten"])
    assert bad.exit_code != 0 and isinstance(bad.exception, InputError)
    missing = CliRunner().invoke(app, ["analyze", "coverage", "--model", str(tiny_mlm_dir), "--corpus",
                                       str(tmp_path / "nope.txt")])
    assert missing.exit_code != 0 and isinstance(missing.exception, InputError)
