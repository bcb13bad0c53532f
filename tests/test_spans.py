"""Contextual spans (CoT-MAE / CoT-MoTE): sentence packing, nearby/overlap/random contexts from the same document,
overlap ≤ 50 %, determinism in (seed, index), query pairs, and both directions of every pair in a batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pretrieve.data.spans import (ContextSpec, PairDataset, SpanCorpus, SpanDataset, build_span_dataset, pack_spans,
                                  split_sentences, write_qrels_pairs)
from pretrieve.errors import ConfigError, InputError
from pretrieve.train.collator import PretrainCollator
from pretrieve.train.method import method_from_mapping, preset

WORDS = ("cells protein gene tumor immune signal receptor binding pathway mutation expression membrane "
         "response virus enzyme kinase growth factor tissue blood").split()


def document(seed: int, sentences: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(" ".join(["The"] + list(rng.choice(WORDS, size=int(rng.integers(4, 14))))) + "."
                    for _ in range(sentences))


@pytest.fixture(scope="module")
def span_corpus(tmp_path_factory, tokenizer) -> SpanCorpus:
    root = tmp_path_factory.mktemp("spans")
    docs = [document(i, n) for i, n in enumerate([14, 9, 1, 20, 6, 11])]   # doc 2: one sentence → no context
    docs.append("Short. " + "word " * 60 + ". Tail sentence here.")          # one sentence longer than a span
    (root / "docs.txt").write_text("\n".join(docs) + "\n")
    return SpanCorpus.build(root / "docs.txt", tokenizer, max_len=32, cache_dir=root / "cache")


def overlap_size(first: tuple[int, int], second: tuple[int, int]) -> int:
    return max(0, min(first[1], second[1]) - max(first[0], second[0]))


def test_sentence_splitting_and_packing():
    assert split_sentences("One cell. Two cells! Is it 3? (Yes) ok. e.g. not split") == \
        ["One cell.", "Two cells!", "Is it 3?", "(Yes) ok. e.g. not split"]
    assert pack_spans([3, 4, 2, 9, 1], budget=9) == [0, 3, 4, 5]       # [3+4+2] [9] [1]
    assert pack_spans([], budget=5) == [0]


def test_corpus_spans_are_packed_sentences_within_budget(span_corpus):
    meta = span_corpus.meta
    assert meta["documents_without_context"] == 1 and meta["documents"] == 6
    budget = span_corpus.max_len - 2
    for doc in range(span_corpus.num_documents):
        spans = span_corpus.document_spans(doc)
        assert len(spans) >= 2
        ranges = [span_corpus.span_token_range(s) for s in spans]
        assert ranges[0][0] == span_corpus.document_token_range(doc)[0]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))   # contiguous cover of the document
        assert all(0 < end - start <= budget for start, end in ranges)
        bounds = set(span_corpus.sentence_bounds(doc).tolist())
        assert all(start in bounds and end in bounds for start, end in ranges)   # cut at sentence boundaries


@pytest.mark.parametrize("kind", ["nearby", "overlap", "random"])
def test_contexts_come_from_the_same_document(span_corpus, kind):
    dataset = SpanDataset(span_corpus, kind, seed=3)
    budget = span_corpus.max_len - 2
    for index in range(len(dataset)):
        example = dataset[index]
        doc = example["document"]
        tokens = span_corpus.document_tokens(doc).tolist()
        anchor, context = example["anchor_range"], example["context_range"]
        assert 0 <= context[0] < context[1] <= len(tokens) and context[1] - context[0] <= budget
        assert example["input_ids"][1:-1] == tokens[anchor[0]:anchor[1]]
        assert example["context_input_ids"][1:-1] == tokens[context[0]:context[1]]
        assert example["text_type"] == example["context_text_type"] == 1
        shared = overlap_size(anchor, context)
        if kind == "overlap":
            assert 1 <= shared <= (anchor[1] - anchor[0]) / 2
        else:
            assert shared == 0 and context != anchor
        if kind == "nearby":
            assert context[0] == anchor[1] or context[1] == anchor[0]


def test_mixed_kinds_and_determinism(span_corpus):
    first, again, other = SpanDataset(span_corpus, "mixed", 7), SpanDataset(span_corpus, "mixed", 7), \
        SpanDataset(span_corpus, "mixed", 8)
    assert {first[i]["context_kind"] for i in range(len(first))} == {"nearby", "overlap", "random"}
    assert all(first[i] == again[i] for i in range(len(first)))      # a function of (seed, index)
    assert any(first[i]["context_range"] != other[i]["context_range"] for i in range(len(first)))


def test_pairs_dataset_and_errors(tmp_path, tokenizer):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"passage": "The tumor grows fast.", "query": "does the tumor grow"}) + "\n"
                    + json.dumps({"passage": "Kinase binding.", "queries": ["what binds", "kinase role"]}) + "\n")
    dataset = PairDataset(path, tokenizer, max_len=16, query_max_len=8, seed=0)
    example = dataset[0]
    assert tokenizer.decode(example["input_ids"][1:-1]) == "the tumor grows fast."
    assert tokenizer.decode(example["context_input_ids"][1:-1]) == "does the tumor grow"
    assert (example["text_type"], example["context_text_type"]) == (1, 0)
    assert tokenizer.decode(dataset[1]["context_input_ids"][1:-1]) in {"what binds", "kinase role"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"passage": "x", "query": "y"}) + "\n" + json.dumps({"text": "no passage"}) + "\n")
    with pytest.raises(InputError) as error:
        PairDataset(bad, tokenizer, max_len=16)
    assert error.value.line == 2 and error.value.field == "passage"
    with pytest.raises(ConfigError):
        build_span_dataset(ContextSpec(kind="pairs"), None, tokenizer, 16, tmp_path)
    with pytest.raises(ConfigError):
        ContextSpec.from_dict({"kind": "sideways"})


def test_qrels_pairs_from_a_collection(tmp_path, tokenizer):
    from pretrieve.data.collection import BeirCollection
    from test_finetune import write_collection

    root = write_collection(tmp_path / "collection")
    count = write_qrels_pairs(BeirCollection(root), "train", tmp_path / "pairs.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert count == len(lines) > 0 and all(set(line) == {"passage", "query"} for line in lines)


def test_batch_has_both_directions_and_text_types(span_corpus, tokenizer):
    dataset = SpanDataset(span_corpus, "mixed", seed=0)
    collator = PretrainCollator(tokenizer, preset("cotmae"), max_len=32, seed=0)
    examples = [dataset[i] for i in range(6)]
    batch = collator(examples, generator=torch.Generator().manual_seed(0))
    for key in ("input_ids", "context_input_ids", "decoder_input_ids", "context_decoder_input_ids",
                "mlm_labels", "context_mlm_labels", "decoder_labels", "context_decoder_labels"):
        assert key in batch and batch[key].shape[0] == 6
    # anchor→context targets are the contexts' tokens, context→anchor targets the anchors' (decoder labels
    # hold the original ids at the masked positions)
    for row, example in enumerate(examples):
        for side, ids in (("", example["input_ids"]), ("context_", example["context_input_ids"])):
            labels = batch[f"{side}decoder_labels"][row]
            masked = labels != -100
            assert masked.any()
            assert torch.equal(labels[masked], torch.tensor(ids)[masked[:len(ids)]])
    assert batch["text_type"].tolist() == batch["context_text_type"].tolist() == [1] * 6
    with pytest.raises(InputError):
        collator([{"input_ids": example["input_ids"]} for example in examples])


def test_pairs_batch_routes_queries_and_passages(tmp_path, tokenizer):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"passage": f"passage number {i} about cells.", "query": f"query {i}"}) + "\n"
                            for i in range(4)))
    method = method_from_mapping({"base": "cotmote", "context": {"pairs": str(path)}})
    dataset = build_span_dataset(method.context, None, tokenizer, 32, tmp_path, seed=0)
    batch = PretrainCollator(tokenizer, method, max_len=32)([dataset[i] for i in range(4)],
                                                           generator=torch.Generator().manual_seed(1))
    assert batch["text_type"].tolist() == [1] * 4 and batch["context_text_type"].tolist() == [0] * 4
    assert {"original_input_ids", "context_original_ids", "context_original_labels"} <= set(batch)


def test_anchors_are_one_random_span_per_document_per_draw_unless_every_span(span_corpus):
    dataset = SpanDataset(span_corpus, "nearby", seed=5)                        # CoT-MAE's CotMAEDataset
    assert dataset.anchors == "document" and len(dataset) == span_corpus.num_documents
    for doc in range(len(dataset)):
        start = span_corpus.document_token_range(doc)[0]
        spans = {span_corpus.span_token_range(s) for s in span_corpus.document_spans(doc)}
        draws = [dataset.draw(doc, epoch) for epoch in range(200)]
        assert {d["document"] for d in draws} == {doc}
        anchors = {(d["anchor_range"][0] + start, d["anchor_range"][1] + start) for d in draws}
        assert anchors == spans                                                   # every span drawn, at random
        assert draws[0] == dataset[doc]
    again, other = SpanDataset(span_corpus, "nearby", seed=5), SpanDataset(span_corpus, "nearby", seed=6)
    assert all(again.draw(i, e) == dataset.draw(i, e) for i in range(len(dataset)) for e in range(3))
    assert any(other.draw(i, e) != dataset.draw(i, e) for i in range(len(dataset)) for e in range(3))
    every = SpanDataset(span_corpus, "nearby", seed=5, anchors="span")          # every span an anchor
    assert len(every) == len(span_corpus.spans) - 1
    for index in range(len(every)):
        example = every.draw(index, 1)
        start = span_corpus.document_token_range(example["document"])[0]
        assert (example["anchor_range"][0] + start, example["anchor_range"][1] + start) == \
            span_corpus.span_token_range(index)
    assert preset("cotmae").context.anchors == "document"
    assert ContextSpec.from_dict({"kind": "mixed", "anchors": "span"}).anchors == "span"
    with pytest.raises(ConfigError, match="context.anchors must be one of document, span"):
        ContextSpec.from_dict({"kind": "mixed", "anchors": "tokens"})
