"""BM25: hand-computed Lucene scores, analysis (stemming, stopwords), persistence, SciFact quality, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pretrieve.data.beir import Corpus
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.bm25 import BM25Index


def toy_corpus() -> Corpus:
    ids = ["d1", "d2", "d3", "d4", "d5"]
    titles = ["Cats", "", "Dogs", "", "Weather"]
    texts = [
        "The cat sat on the mat and the cat slept.",
        "A dog runs in the park; dogs love running.",
        "Dog training for puppies and older dogs.",
        "Stock markets fell sharply on Monday.",
        "Rain and wind are expected in the north.",
    ]
    return Corpus(ids, titles, texts)


@pytest.fixture(scope="module")
def toy_index() -> BM25Index:
    return BM25Index.build(toy_corpus())


def test_ranking_puts_the_matching_document_first(toy_index):
    run = toy_index.search({"q1": "cat", "q2": "stock markets", "q3": "rain wind"}, k=10)
    assert next(iter(run["q1"])) == "d1"
    assert list(run["q2"]) == ["d4"]  # only matching documents are returned, as in Lucene
    assert list(run["q3"]) == ["d5"]
    for docs in run.values():
        scores = list(docs.values())
        assert scores == sorted(scores, reverse=True)


def test_score_equals_hand_computed_lucene_bm25():
    """Query 'cat': Lucene (>= 8) idf times saturated tf, without the constant (k1 + 1) factor."""
    corpus = Corpus(["a", "b", "c"], ["", "", ""], ["cat cat mouse", "mouse house garden tree", "bird"])
    index = BM25Index.build(corpus, k1=0.9, b=0.4)
    lengths = [3, 4, 1]  # tokens left after analysis
    avgdl = sum(lengths) / 3
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    tf = 2
    expected = idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * lengths[0] / avgdl))
    run = index.search({"q": "cats"}, k=3)
    assert list(run["q"]) == ["a"]
    assert run["q"]["a"] == pytest.approx(expected, rel=1e-5)


def test_stemming_matches_inflected_forms(toy_index):
    run = toy_index.search({"q": "running dogs"}, k=10)
    assert set(run["q"]) == {"d2", "d3"}  # "runs"/"running" → run, "dog"/"dogs" → dog
    no_stem = BM25Index.build(toy_corpus(), stemmer=None).search({"q": "puppy"}, k=10)
    assert no_stem["q"] == {}  # without stemming "puppy" does not match "puppies"
    assert "d3" in toy_index.search({"q": "puppy"}, k=10)["q"]


def test_stopwords_are_ignored(toy_index):
    assert toy_index.search({"q": "the and on of in"}, k=10)["q"] == {}
    with_stopwords = toy_index.search({"q": "the cat on the mat"}, k=10)["q"]
    without = toy_index.search({"q": "cat mat"}, k=10)["q"]
    assert with_stopwords == pytest.approx(without)
    keep_stopwords = BM25Index.build(toy_corpus(), stopwords=None)
    assert keep_stopwords.search({"q": "the"}, k=10)["q"] != {}


def test_title_is_indexed(toy_index):
    assert next(iter(toy_index.search({"q": "weather"}, k=10)["q"])) == "d5"


def test_unknown_and_empty_queries_give_empty_rankings(toy_index):
    run = toy_index.search({"q1": "zebra quantum", "q2": "", "q3": "!!!"}, k=10)
    assert run == {"q1": {}, "q2": {}, "q3": {}}


def test_k_larger_than_corpus_and_exclude_self():
    corpus = Corpus(["q1", "x", "y"], ["", "", ""], ["apple pie recipe", "apple tart", "banana bread"])
    index = BM25Index.build(corpus)
    run = index.search({"q1": "apple pie"}, k=100)
    assert list(run["q1"]) == ["q1", "x"]
    run = index.search({"q1": "apple pie"}, k=1, exclude_self=True)
    assert list(run["q1"]) == ["x"]


def test_save_load_gives_identical_results(tmp_path, toy_index):
    queries = {"a": "cat on a mat", "b": "dog running", "c": "markets", "d": "nothing here zebra"}
    before = toy_index.search(queries, k=10)
    toy_index.save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25")
    assert loaded.params == toy_index.params
    assert loaded.search(queries, k=10) == before
    with pytest.raises(InputError):
        BM25Index.load(tmp_path)


def test_threads_do_not_change_results(toy_index):
    queries = {f"q{i}": text for i, text in enumerate(["cat", "dog", "rain", "stock", "mat dog", "north wind"] * 5)}
    assert toy_index.search(queries, k=3, n_threads=0) == toy_index.search(queries, k=3, n_threads=2)


def test_invalid_parameters_are_config_errors():
    with pytest.raises(ConfigError):
        BM25Index.build(toy_corpus(), b=1.5)
    with pytest.raises(ConfigError):
        BM25Index.build(toy_corpus(), method="tfidf")
    with pytest.raises(ConfigError):
        BM25Index.build(toy_corpus(), stemmer="klingon")


@pytest.mark.slow
def test_scifact_ndcg_in_published_range(scifact):
    """nDCG@10 on SciFact test within [0.64, 0.70] (Pyserini flat: 0.679); index + search take ~1 s."""
    import pytrec_eval

    from pretrieve.data.collection import BeirCollection

    collection = BeirCollection(scifact)
    qrels = collection.load_qrels("test")
    run = BM25Index.build(collection.load_corpus()).search(collection.load_queries("test"), k=1000)
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    ndcg = float(np.mean([m["ndcg_cut_10"] for m in per_query.values()]))
    assert 0.64 <= ndcg <= 0.70, ndcg


def write_tiny_collection(root: Path) -> Path:
    """A 5-document BEIR collection with 3 judged test queries."""
    (root / "qrels").mkdir(parents=True)
    corpus = toy_corpus()
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for doc_id, title, text in zip(corpus.ids, corpus.titles, corpus.texts):
            handle.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    queries = {"q1": "cat on the mat", "q2": "dog running", "q3": "stock market crash", "q4": "unjudged query"}
    with open(root / "queries.jsonl", "w", encoding="utf-8") as handle:
        for qid, text in queries.items():
            handle.write(json.dumps({"_id": qid, "text": text}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td4\t1\n")
    return root


def test_cli_bm25(tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    data = write_tiny_collection(tmp_path / "toy")
    out = tmp_path / "runs" / "bm25.trec"
    result = CliRunner().invoke(app, ["bm25", "--data", str(data), "--out", str(out), "--k", "2",
                                      "--save-index", str(tmp_path / "index")])
    assert result.exit_code == 0, result.output
    run = read_run(out)
    assert set(run) == {"q1", "q2", "q3"}  # only queries judged in the split
    assert next(iter(run["q1"])) == "d1" and len(run["q2"]) == 2
    saved = BM25Index.load(tmp_path / "index").search({"q1": "cat on the mat"}, k=2)
    assert saved["q1"] == pytest.approx(run["q1"], abs=1e-5)  # float32 scores via a text run file

    bad = CliRunner().invoke(app, ["bm25", "--data", str(data), "--out", str(out.with_name("dev.trec")), "--split",
                                   "dev"])
    assert bad.exit_code != 0 and isinstance(bad.exception, InputError)


# ------------------------------------------------------------------------------------------- at scale
def bm25s_reference(corpus: Corpus, method: str = "lucene"):
    """bm25s used directly, as its README shows: tokenise everything, BM25.index."""
    from pretrieve.retrieval.bm25 import BM25Params, import_bm25s, make_tokenizer

    bm25s = import_bm25s()
    tokenizer = make_tokenizer(BM25Params(method=method))
    ids = tokenizer.tokenize(corpus.full_texts(), update_vocab=True, return_as="ids", show_progress=False)
    reference = bm25s.BM25(k1=0.9, b=0.4, method=method)
    reference.index((ids, tokenizer.get_vocab_dict()), show_progress=False)
    return reference


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_streamed_index_is_bm25s_index_bit_for_bit_whatever_the_chunk_size(tmp_path, method):
    from pretrieve.retrieval.bm25 import BM25Params, write_index

    corpus = toy_corpus()
    corpus = Corpus(corpus.ids + ["empty"], corpus.titles + [""], corpus.texts + ["the of and"])  # no term left
    reference = bm25s_reference(corpus, method)
    documents = [(corpus.ids[i], corpus.full_text(i)) for i in range(len(corpus))]
    for chunk_docs in (1, 2, 100):
        write_index(documents, tmp_path / f"c{chunk_docs}", BM25Params(method=method), chunk_docs=chunk_docs)
        index = BM25Index.load(tmp_path / f"c{chunk_docs}")
        for key in ("data", "indices", "indptr"):
            ours, theirs = index.retriever.scores[key], reference.scores[key]
            assert isinstance(ours, np.memmap)  # searched memory-mapped
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), (chunk_docs, key)
        assert list(index.doc_ids) == corpus.ids
        assert not (tmp_path / f"c{chunk_docs}" / "_chunks").exists()


def test_search_paths_and_threads_agree_and_stream_in_input_order(toy_index, monkeypatch):
    import pretrieve.retrieval.bm25 as bm25

    queries = [(f"q{i}", text) for i, text in enumerate(["cat mat", "dogs", "rain north", "the", "stock cat dog"] * 7)]
    sparse = list(toy_index.iter_search(queries, k=3, n_threads=0, batch_size=4))
    assert [qid for qid, _ in sparse] == [qid for qid, _ in queries]
    assert list(toy_index.iter_search(queries, k=3, n_threads=2, batch_size=1)) == sparse
    monkeypatch.setattr(bm25, "_DENSE_SHARE", 0.0)  # every query through the dense score array
    assert list(toy_index.iter_search(queries, k=3, n_threads=2, batch_size=3)) == sparse


def test_duplicate_document_ids_name_both_lines(tmp_path):
    from pretrieve.retrieval.bm25 import corpus_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "text": "x y"}\n{"_id": "b", "text": "y z"}\n\n{"_id": "a", "text": "z"}\n')
    with pytest.raises(InputError, match=r"corpus.jsonl:4: field '_id': duplicate document id 'a' \(first seen on "
                                         r"line 1\)"):
        with corpus_index(corpus):
            pass


def test_corpus_index_is_reused_while_corpus_and_settings_are_unchanged(tmp_path):
    from pretrieve.retrieval.bm25 import BM25Params, corpus_index

    data = write_tiny_collection(tmp_path / "toy")
    index_dir = tmp_path / "index"
    with corpus_index(data / "corpus.jsonl", index_dir=index_dir) as index:
        first = index.search({"q": "cat"}, k=2)
    stamp = (index_dir / "data.csc.index.npy").stat().st_mtime_ns
    with corpus_index(data / "corpus.jsonl", index_dir=index_dir) as index:
        assert index.search({"q": "cat"}, k=2) == first
    assert (index_dir / "data.csc.index.npy").stat().st_mtime_ns == stamp  # reused
    with corpus_index(data / "corpus.jsonl", BM25Params(k1=1.2), index_dir=index_dir) as index:
        assert index.params.k1 == 1.2  # other settings: rebuilt
    with open(data / "corpus.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"_id": "d6", "title": "", "text": "a cat and a cat"}) + "\n")
    with corpus_index(data / "corpus.jsonl", BM25Params(k1=1.2), index_dir=index_dir) as index:
        assert len(index) == 6  # other corpus content: rebuilt


def test_bm25_negatives_stream_the_groups_groups_from_run_builds(tmp_path):
    from pretrieve import artifacts
    from pretrieve.data.collection import BeirCollection
    from pretrieve.data.groups import groups_from_run, read_groups
    from pretrieve.retrieval.runs import bm25_negatives

    data = write_tiny_collection(tmp_path / "toy")
    (data / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td5\t1\nq2\td3\t1\nq2\td4\t2\n"
                                              "q3\td4\t0\nq4\td5\t1\nqx\td1\t1\n")
    out = bm25_negatives(data, "train", tmp_path / "groups.jsonl", depth=3, run_out=tmp_path / "run.trec",
                         n_threads=2)
    collection = BeirCollection(data)
    run = read_run(tmp_path / "run.trec")
    expected = groups_from_run(run, collection.load_qrels("train"), collection.load_queries(), depth=3)
    groups = read_groups(out)
    assert [g.to_dict() for g in groups] == [g.to_dict() for g in expected]
    assert [g.query_id for g in groups] == ["q1", "q2"]  # q3: no positive, q4: no negative left, qx: no text
    searched = BM25Index.build(collection.load_corpus()).search(
        {q: t for q, t in collection.load_queries().items() if q in ("q1", "q2", "q4")}, k=3)
    assert searched.pop("q4") == {} and run == searched  # q4 was searched: nothing matches it
    assert artifacts.is_current(out, kind="groups", settings=artifacts.read_sidecar(out)["settings"],
                                inputs={"corpus": data / "corpus.jsonl", "queries": data / "queries.jsonl",
                                        "qrels": data / "qrels" / "train.tsv"})
    stamp = out.stat().st_mtime_ns
    bm25_negatives(data, "train", out, depth=3)  # current: not recomputed
    assert out.stat().st_mtime_ns == stamp
    bm25_negatives(data, "train", out, depth=2)  # other settings: recomputed
    assert all(len(g.negatives) <= 2 for g in read_groups(out))


def test_cli_bm25_reuses_its_index(tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    data = write_tiny_collection(tmp_path / "toy")
    args = ["bm25", "--data", str(data), "--out", str(tmp_path / "run.trec"), "--index", str(tmp_path / "index")]
    assert CliRunner().invoke(app, args).exit_code == 0
    stamp = (tmp_path / "index" / "data.csc.index.npy").stat().st_mtime_ns
    first = (tmp_path / "run.trec").read_text()
    assert CliRunner().invoke(app, [*args, "--overwrite"]).exit_code == 0   # the run file is replaced only if asked
    assert (tmp_path / "index" / "data.csc.index.npy").stat().st_mtime_ns == stamp
    assert (tmp_path / "run.trec").read_text() == first
