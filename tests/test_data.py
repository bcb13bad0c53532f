"""Data layer: BEIR corpus/queries/qrels, TREC runs, atomic writes, the collection registry and
``pretrieve data``. Mostly bad input: every malformed file must give an InputError naming the file,
the line and (where there is one) the field — and through the CLI exit code 2 without a traceback."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import urllib.error
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pretrieve.data import registry
from pretrieve.data.beir import Corpus, check_qrels, iter_corpus, load_qrels, load_queries, save_qrels, save_queries
from pretrieve.data.collection import BeirCollection
from pretrieve.data.jsonl import iter_jsonl, iter_lines
from pretrieve.data.registry import CollectionInfo, check_collection, fetch_collection, resolve_collection
from pretrieve.data.trec import merge_runs, read_run, run_from_arrays, top_k, write_run
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_dir, atomic_open

PRETRIEVE = Path(sys.executable).with_name("pretrieve")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(*rows) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def make_collection(root: Path, corpus: str | None = None, queries: str | None = None,
                    qrels: dict[str, str] | None = None) -> Path:
    """A tiny valid BEIR directory; any file can be replaced by a malformed one."""
    write(root / "corpus.jsonl", corpus if corpus is not None else jsonl(
        {"_id": "d1", "title": "Alpha", "text": "first doc"},
        {"_id": "d2", "title": "", "text": "second doc"},
        {"_id": "d3", "title": "Gamma", "text": "third doc"}))
    write(root / "queries.jsonl", queries if queries is not None else jsonl(
        {"_id": "q1", "text": "what is alpha"}, {"_id": "q2", "text": "second?"}))
    for split, text in (qrels or {"test": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t2\n"}).items():
        write(root / "qrels" / f"{split}.tsv", text)
    return root


def raises_located(fn, path: Path, line: int | None = None, field: str | None = None, match: str = "") -> InputError:
    """Call ``fn`` and check the InputError names the file, line and field in both attributes and text."""
    with pytest.raises(InputError) as info:
        fn()
    err = info.value
    text = str(err)
    assert path.name in text and err.path == str(path)
    if line is not None:
        assert err.line == line and f"{path.name}:{line}:" in text
    if field is not None:
        assert err.field == field and f"field '{field}'" in text
    assert match in text
    return err


# ------------------------------------------------------------------------------------------- corpus

def test_corpus_truncated_json_line(tmp_path):
    path = write(tmp_path / "corpus.jsonl", jsonl({"_id": "d1", "text": "a"}, '{"_id": "d2", "text": "tru'))
    raises_located(lambda: Corpus.load(path), path, line=2, match="invalid JSON")


def test_corpus_line_that_is_a_json_list(tmp_path):
    path = write(tmp_path / "corpus.jsonl", jsonl({"_id": "d1", "text": "a"}, ["d2", "b"]))
    raises_located(lambda: Corpus.load(path), path, line=2, match="expected a JSON object, got list")


def test_corpus_missing_id(tmp_path):
    path = write(tmp_path / "corpus.jsonl", jsonl({"_id": "d1", "text": "a"}, {"text": "no id"}))
    raises_located(lambda: Corpus.load(path), path, line=2, field="_id", match="missing required field")


@pytest.mark.parametrize("row, field, match", [
    ({"_id": ["d1"], "text": "a"}, "_id", "expected a string, got list"),
    ({"_id": "", "text": "a"}, "_id", "must not be empty"),
    ({"_id": "d1", "text": 3.5}, "text", "expected a string, got float"),
    ({"_id": "d1", "title": {"x": 1}, "text": "a"}, "title", "expected a string, got dict"),
    ({"_id": "d1"}, "text", "missing required field"),
])
def test_corpus_wrong_field_types(tmp_path, row, field, match):
    path = write(tmp_path / "corpus.jsonl", jsonl({"_id": "d0", "text": "ok"}, row))
    raises_located(lambda: Corpus.load(path), path, line=2, field=field, match=match)


def test_corpus_duplicate_id_names_both_lines(tmp_path):
    path = write(tmp_path / "corpus.jsonl",
                 jsonl({"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"}, {"_id": "d1", "text": "c"}))
    err = raises_located(lambda: Corpus.load(path), path, line=3, field="_id", match="duplicate document id 'd1'")
    assert "first seen on line 1" in str(err)


def test_corpus_empty(tmp_path):
    path = write(tmp_path / "corpus.jsonl", "\n  \n")
    raises_located(lambda: Corpus.load(path), path, match="corpus is empty")


def test_corpus_integer_ids_are_strings_and_title_optional(tmp_path):
    path = write(tmp_path / "corpus.jsonl", jsonl({"_id": 7, "text": "seven"}))
    corpus = Corpus.load(path)
    assert corpus.ids == ["7"] and corpus.titles == [""] and "7" in corpus
    assert corpus["7"].full_text() == "seven"


def test_missing_file_and_directory(tmp_path):
    missing = tmp_path / "nope.jsonl"
    raises_located(lambda: Corpus.load(missing), missing, match="file not found")
    raises_located(lambda: list(iter_lines(tmp_path)), tmp_path, match="is a directory")


def test_invalid_utf8_is_located(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "caf\xe9"}\n')
    raises_located(lambda: Corpus.load(path), path, line=2, match="not valid UTF-8")


def test_corrupt_gzip_is_an_input_error(tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(b"this is not gzip data at all")
    raises_located(lambda: Corpus.load(path), path, match="cannot read file")
    truncated = tmp_path / "trunc.jsonl.gz"
    truncated.write_bytes(gzip.compress(jsonl(*[{"_id": f"d{i}", "text": "x" * 50} for i in range(200)]).encode())[:300])
    raises_located(lambda: Corpus.load(truncated), truncated, match="cannot read file")


def test_utf8_bom_and_crlf_are_accepted(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_bytes("\ufeff".encode() + b'{"_id": "q1", "text": "a"}\r\n{"_id": "q2", "text": "b"}\r\n')
    assert load_queries(path) == {"q1": "a", "q2": "b"}


def test_iter_corpus_streams(tmp_path):
    """Documents come out before the reader reaches a broken line further down the file."""
    path = write(tmp_path / "corpus.jsonl", jsonl({"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"},
                                                  '{"broken'))
    stream = iter_corpus(path)
    assert next(stream)[1].id == "d1"
    assert next(stream)[0] == 2
    with pytest.raises(InputError, match=r"corpus.jsonl:3:"):
        next(stream)


# ------------------------------------------------------------------------------------------ queries

def test_queries_duplicate_id(tmp_path):
    path = write(tmp_path / "queries.jsonl", jsonl({"_id": "q1", "text": "a"}, {"_id": "q2", "text": "b"},
                                                   {"_id": "q1", "text": "c"}))
    err = raises_located(lambda: load_queries(path), path, line=3, field="_id", match="duplicate query id 'q1'")
    assert "first seen on line 1" in str(err)


def test_queries_empty_text_and_empty_file(tmp_path):
    path = write(tmp_path / "queries.jsonl", jsonl({"_id": "q1", "text": "  "}))
    raises_located(lambda: load_queries(path), path, line=1, field="text", match="must not be empty")
    empty = write(tmp_path / "empty.jsonl", "")
    raises_located(lambda: load_queries(empty), empty, match="no queries")


# -------------------------------------------------------------------------------------------- qrels

def test_qrels_two_columns(tmp_path):
    path = write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\n")
    raises_located(lambda: load_qrels(path), path, line=3, match="got 2")


def test_qrels_non_integer_grade(tmp_path):
    path = write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\thigh\n")
    raises_located(lambda: load_qrels(path), path, line=3, field="score", match="'high' is not an integer")
    floats = write(tmp_path / "floats.tsv", "q1 0 d1 0.5\n")
    raises_located(lambda: load_qrels(floats), floats, line=1, field="score")


def test_qrels_bad_first_line_is_not_mistaken_for_a_header(tmp_path):
    path = write(tmp_path / "test.tsv", "q1\td1\tx\nq2\td2\t1\n")
    raises_located(lambda: load_qrels(path), path, line=1, field="score")


def test_qrels_empty_id_and_empty_file(tmp_path):
    path = write(tmp_path / "test.tsv", "q1\t\t1\n")
    raises_located(lambda: load_qrels(path), path, line=1, field="corpus-id", match="empty id")
    header_only = write(tmp_path / "h.tsv", "query-id\tcorpus-id\tscore\n")
    raises_located(lambda: load_qrels(header_only), header_only, match="no judgments")


def test_qrels_ids_with_spaces_are_refused_on_their_line(tmp_path):
    """Tab-separated columns keep an id with a space whole, but no TREC run (split on whitespace) can hold it:
    refused on reading (issue 52, m7)."""
    path = write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\nq 1\tdoc one\t1\n")
    with pytest.raises(InputError, match=r"test.tsv:2: field 'query-id': id 'q 1' contains whitespace"):
        load_qrels(path)


def test_qrels_unknown_ids_are_counted_warning(tmp_path, caplog):
    root = make_collection(tmp_path / "c", qrels={"test": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\tdX\t1\n"
                                                           "q9\td2\t1\nq9\tdY\t0\n"})
    collection = BeirCollection(root)
    qrels = collection.load_qrels("test")
    with caplog.at_level(logging.WARNING, logger="pretrieve.data.beir"):
        check = check_qrels(qrels, collection.load_queries(), Corpus.load(collection.corpus_path),
                            path=collection.qrels_path("test"))
    assert (check.unknown_queries, check.unknown_docs) == (1, 2)
    assert not check.ok and qrels["q9"] == {"d2": 1, "dY": 0}  # kept, not dropped
    records = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "test.tsv" in message and "1 judged queries" in message and "2 judgments" in message
    report = check_collection(root)
    assert (report.splits[0].unknown_queries, report.splits[0].unknown_docs) == (1, 2)
    assert len(report.warnings) == 1


def test_qrels_round_trip_beir_and_trec(tmp_path):
    qrels = {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}, "7": {"d-1": -1}}
    for trec in (False, True):
        path = tmp_path / f"qrels_{trec}.tsv"
        save_qrels(qrels, path, trec=trec)
        assert load_qrels(path) == qrels
    assert (tmp_path / "qrels_True.tsv").read_text().splitlines()[0] == "q1 0 d1 1"


# --------------------------------------------------------------------------------------------- runs

@pytest.mark.parametrize("line, field, match", [
    ("q1 Q0 d2 2 1.5", None, "expected 6 columns"),
    ("q1 Q0 d2 2 1.5 tag extra", None, "got 7"),
    ("q1 Q0 d2 2 high tag", "score", "'high' is not a number"),
    ("q1 Q0 d2 two 1.5 tag", "rank", "'two' is not an integer"),
    ("q1 Q0 d2 2 nan tag", "score", "NaN"),
    ("q1 Q0 d1 2 1.5 tag", "doc_id", "retrieved twice"),
])
def test_run_malformed_line(tmp_path, line, field, match):
    path = write(tmp_path / "bm25.run", f"q1 Q0 d1 1 2.0 tag\n{line}\n")
    raises_located(lambda: read_run(path), path, line=2, field=field, match=match)


def test_run_empty(tmp_path):
    path = write(tmp_path / "empty.run", "\n")
    raises_located(lambda: read_run(path), path, match="run file is empty")


def test_run_round_trip_is_exact(tmp_path):
    scores32 = np.array([[0.123456789, 0.1234567], [3.0, -1e-9]], dtype=np.float32)
    run = run_from_arrays(["q1", "q2"], ["d0", "d1", "d2"], np.array([[2, 0], [1, -1]]), scores32)
    run["q3"] = {"a": 1e-12, "b": 1e-12 + 1e-20, "c": 123456.789012345}
    path = tmp_path / "out" / "dense.run"
    write_run(run, path)
    back = read_run(path)
    assert back == run
    assert list(back["q1"]) == ["d2", "d0"]  # descending score
    assert "q2" in back and back["q2"] == {"d1": 3.0}  # -1 index dropped


def test_write_run_sorts_cuts_and_keeps_tie_order(tmp_path):
    path = tmp_path / "r.run"
    write_run({"q": {"a": 1.0, "b": 2.0, "c": 1.0, "d": 0.5}}, path, tag="mine", depth=3)
    lines = [line.split() for line in path.read_text().splitlines()]
    assert [(p[2], p[3], p[5]) for p in lines] == [("b", "1", "mine"), ("a", "2", "mine"), ("c", "3", "mine")]


@pytest.mark.parametrize("run, field", [
    ({"q 1": {"d1": 1.0}}, "query_id"),
    ({"q1": {"doc one": 1.0}}, "doc_id"),
    ({"q1": {"": 1.0}}, "doc_id"),
    ({"q1": {"d1": float("nan")}}, "score"),
])
def test_write_run_refuses_unreadable_output(tmp_path, run, field):
    path = write(tmp_path / "r.run", "old\n")
    raises_located(lambda: write_run(run, path), path, field=field)
    assert path.read_text() == "old\n"  # atomic: the old file survives


def test_streamed_run_equals_the_run_written_at_once_and_reads_back_query_by_query(tmp_path):
    from pretrieve.data.trec import iter_run, open_run_writer

    run = {"q1": {"a": 1.0, "b": 2.0}, "q2": {}, "q3": {"c": 0.25, "a": 0.5, "d": 0.5}}
    write_run(run, tmp_path / "whole.run", tag="t", depth=2)
    with open_run_writer(tmp_path / "stream.run", tag="t", depth=2) as writer:
        for qid, docs in run.items():
            writer.write(qid, list(docs.items()))  # (doc, score) pairs as a search yields them
    assert (tmp_path / "stream.run").read_bytes() == (tmp_path / "whole.run").read_bytes()
    assert (writer.queries, writer.lines) == (3, 4)
    assert list(iter_run(tmp_path / "stream.run")) == [("q1", {"b": 2.0, "a": 1.0}), ("q3", {"a": 0.5, "d": 0.5})]


def test_run_writer_refuses_a_query_twice_and_iter_run_needs_contiguous_queries(tmp_path):
    from pretrieve.data.trec import iter_run, open_run_writer

    with pytest.raises(InputError, match="query 'q1' written twice"):
        with open_run_writer(tmp_path / "r.run") as writer:
            writer.write("q1", {"a": 1.0})
            writer.write("q1", {"b": 1.0})
    assert not (tmp_path / "r.run").exists()  # atomic: nothing left behind
    path = write(tmp_path / "split.run", "q1 Q0 a 1 2.0 t\nq2 Q0 b 1 1.0 t\nq1 Q0 c 2 0.5 t\n")
    assert read_run(path)["q1"] == {"a": 2.0, "c": 0.5}  # read whole, any order is fine
    raises_located(lambda: list(iter_run(path)), path, line=3, field="query_id", match="not contiguous")


def test_top_k_and_merge_runs():
    a = {"q": {"d1": 0.9, "d2": 0.1}}
    b = {"q": {"d3": 0.5}, "r": {"d4": 1.0}}
    assert merge_runs([a, b], depth=2) == {"q": {"d1": 0.9, "d3": 0.5}, "r": {"d4": 1.0}}
    assert top_k(a, 1) == {"q": {"d1": 0.9}}


# -------------------------------------------------------------------------------------- round trips

def test_corpus_and_queries_round_trip(tmp_path):
    corpus = Corpus(["d1", "d2", "3"], ["Tïtle", "", "x"], ["text with \"quotes\"\nand newline", "β", ""])
    corpus.save(tmp_path / "corpus.jsonl")
    back = Corpus.load(tmp_path / "corpus.jsonl")
    assert (back.ids, back.titles, back.texts) == (corpus.ids, corpus.titles, corpus.texts)
    assert back.row("d2") == 1
    queries = {"q1": "naïve?", "2": "tab\there"}
    save_queries(queries, tmp_path / "queries.jsonl")
    assert load_queries(tmp_path / "queries.jsonl") == queries


def test_gzip_files_are_read(tmp_path):
    rows = jsonl({"_id": "d1", "title": "T", "text": "a"}, {"_id": "d2", "text": "b"})
    with gzip.open(tmp_path / "corpus.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(rows)
    assert Corpus.load(tmp_path / "corpus.jsonl.gz").ids == ["d1", "d2"]
    (tmp_path / "q.tsv.gz").write_bytes(gzip.compress(b"query-id\tcorpus-id\tscore\nq1\td1\t1\n"))
    assert load_qrels(tmp_path / "q.tsv.gz") == {"q1": {"d1": 1}}
    (tmp_path / "r.run.gz").write_bytes(gzip.compress(b"q1 Q0 d1 1 0.5 t\n"))
    assert read_run(tmp_path / "r.run.gz") == {"q1": {"d1": 0.5}}
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"_id": "d1", "text": "a"}\n[1, 2]\n'))
    raises_located(lambda: list(iter_jsonl(bad)), bad, line=2, match="got list")
    collection_dir = tmp_path / "coll"
    collection_dir.mkdir()
    os.replace(tmp_path / "corpus.jsonl.gz", collection_dir / "corpus.jsonl.gz")
    assert BeirCollection(collection_dir).load_corpus().ids == ["d1", "d2"]


# -------------------------------------------------------------------------------------- atomic writes

def test_atomic_open_keeps_old_file_when_block_raises(tmp_path):
    path = write(tmp_path / "metrics.json", "old")
    with pytest.raises(RuntimeError):
        with atomic_open(path) as handle:
            handle.write("half-written")
            raise RuntimeError("crash")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temp file left
    with atomic_open(path) as handle:
        handle.write("new")
    assert path.read_text() == "new"


def test_atomic_dir_replaces_directory(tmp_path):
    target = tmp_path / "index"
    write(target / "old.bin", "old")
    with atomic_dir(target) as tmp:
        assert not (tmp / "old.bin").exists()
        write(tmp / "new.bin", "new")
        assert (target / "old.bin").exists()  # the old one is untouched until the block succeeds
    assert sorted(p.name for p in target.iterdir()) == ["new.bin"]
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            write(tmp / "partial.bin", "x")
            raise RuntimeError("crash")
    assert sorted(p.name for p in target.iterdir()) == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def test_atomic_outputs_get_ordinary_permissions(tmp_path):
    old_mask = os.umask(0o022)
    try:
        with atomic_open(tmp_path / "f.txt") as handle:
            handle.write("x")
        with atomic_dir(tmp_path / "d") as tmp:
            write(tmp / "a", "y")
    finally:
        os.umask(old_mask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0o600
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0o700


# ------------------------------------------------------------------------------------------ registry

def test_registry_lists_beir_collections():
    assert {"scifact", "nfcorpus", "fiqa", "arguana", "trec-covid", "scidocs", "quora", "nq", "hotpotqa",
            "msmarco"} <= set(registry.KNOWN_COLLECTIONS)
    scifact = registry.KNOWN_COLLECTIONS["scifact"]
    assert scifact.url == "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip"
    assert scifact.md5 == "5f7d1de60b170fc8027bb7898e2efca1" and scifact.splits == ("train", "test")
    for info in registry.KNOWN_COLLECTIONS.values():
        if info.archive == "beir-zip":
            assert info.url.endswith(f"/{info.name}.zip")
        assert info.url.startswith(("https://", "http://")) and info.description
        assert info.archive in registry._BUILDERS and (info.base is None or info.base in registry.KNOWN_COLLECTIONS)
        assert all(s.md5 is None or len(s.md5) == 32 for s in info.sources)
    assert registry.KNOWN_COLLECTIONS["msmarco-titled"].splits[-1] == "dl20"   # the papers' sets by name
    assert {"cqadupstack", "msmarco-passage", "msmarco-bm25-negatives", "dpr-wiki", "dpr-nq", "dpr-trivia",
            "dpr-curatedtrec"} <= set(registry.KNOWN_COLLECTIONS)


def test_resolve_local_directory_and_bad_names(tmp_path):
    root = make_collection(tmp_path / "mine")
    assert resolve_collection(root) == root
    with pytest.raises(InputError, match="unknown collection 'scifactt'.*scifact.*local path"):
        resolve_collection("scifactt", cache_dir=tmp_path)
    with pytest.raises(InputError, match="collection directory not found"):
        resolve_collection(str(tmp_path / "absent"))
    with pytest.raises(InputError, match="got a file"):
        resolve_collection(root / "corpus.jsonl")


def _fake_beir_zip(tmp_path: Path, name: str) -> bytes:
    source = make_collection(tmp_path / "src" / name)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for file in source.rglob("*"):
            if file.is_file():
                zf.write(file, f"{name}/{file.relative_to(source)}")
    return buffer.getvalue()


@pytest.fixture
def fake_download(tmp_path, monkeypatch):
    """Replace the network: a registry entry 'toy' whose 'download' copies a local zip."""
    payload = _fake_beir_zip(tmp_path, "toy")
    info = CollectionInfo("toy", "https://example.invalid/toy.zip", hashlib.md5(payload).hexdigest(), ("test",),
                          "toy collection")
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "toy", info)
    monkeypatch.delenv(registry.OFFLINE_ENV, raising=False)
    calls = []

    def download(url, dest):
        calls.append(url)
        Path(dest).write_bytes(payload)

    monkeypatch.setattr(registry, "download_file", download)
    return calls


def test_download_verifies_unpacks_and_caches(tmp_path, fake_download):
    cache = tmp_path / "cache"
    path = resolve_collection("toy", cache_dir=cache)
    assert path == cache / "toy" and fake_download == ["https://example.invalid/toy.zip"]
    assert sorted(p.name for p in path.iterdir()) == ["corpus.jsonl", "qrels", "queries.jsonl"]
    assert check_collection(path).documents == 3
    assert sorted(p.name for p in cache.iterdir()) == ["toy"]  # archive and staging removed
    assert resolve_collection("toy", cache_dir=cache) == path and len(fake_download) == 1  # cached


def test_download_checksum_mismatch(tmp_path, fake_download, monkeypatch):
    info = registry.KNOWN_COLLECTIONS["toy"]
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "toy", CollectionInfo(
        info.name, info.url, "0" * 32, info.splits, info.description))
    with pytest.raises(InputError, match="checksum mismatch for 'toy'"):
        fetch_collection("toy", tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_download_offline_says_pass_a_local_path(tmp_path, fake_download, monkeypatch):
    def offline(url, dest):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(registry, "download_file", offline)
    with pytest.raises(InputError, match=r"could not download 'toy' from https://example.invalid/toy.zip "
                                         r"\(\[Errno -2\] Name or service not known\); run again to resume, or "
                                         r"fetch it by hand into .*toy.zip; or pass a local path"):
        resolve_collection("toy", cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_offline_env_skips_the_network(tmp_path, fake_download, monkeypatch):
    monkeypatch.setenv(registry.OFFLINE_ENV, "1")
    with pytest.raises(InputError, match="offline mode.*pass a local path"):
        fetch_collection("toy", tmp_path / "cache")
    assert fake_download == []


def test_download_that_is_not_a_collection(tmp_path, fake_download, monkeypatch):
    monkeypatch.setattr(registry, "download_file", lambda url, dest: Path(dest).write_bytes(b"<html>"))
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "toy", CollectionInfo(
        "toy", "https://example.invalid/toy.zip", None, ("test",), "no checksum"))
    with pytest.raises(InputError, match="not a valid zip"):
        fetch_collection("toy", tmp_path / "cache")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("toy/readme.txt", "no corpus here")
    monkeypatch.setattr(registry, "download_file", lambda url, dest: Path(dest).write_bytes(buffer.getvalue()))
    with pytest.raises(InputError, match="holds no corpus.jsonl"):
        fetch_collection("toy", tmp_path / "cache")
    assert not (tmp_path / "cache" / "toy").exists()


# ------------------------------------------------------------------------------------- check + real data

def test_check_collection_counts_and_errors(tmp_path):
    root = make_collection(tmp_path / "c", qrels={"test": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t0\n",
                                                  "train": "q2 0 d2 1\n"})
    report = check_collection(root)
    assert (report.documents, report.queries) == (3, 2)
    assert [(s.split, s.queries, s.judgments, s.relevant) for s in report.splits] == [
        ("test", 2, 2, 1), ("train", 1, 1, 1)]
    assert report.warnings == []
    assert [s.split for s in check_collection(root, ["train"]).splits] == ["train"]
    with pytest.raises(InputError, match="no qrels for split 'dev' \\(available: test, train\\)"):
        check_collection(root, ["dev"])
    dup = make_collection(tmp_path / "dup", corpus=jsonl({"_id": "a", "text": "x"}, {"_id": "a", "text": "y"}))
    raises_located(lambda: check_collection(dup), dup / "corpus.jsonl", line=2, field="_id", match="line 1")


def test_check_real_scifact(scifact):
    report = check_collection(scifact)
    assert (report.documents, report.queries) == (5183, 1109)
    counts = {s.split: (s.queries, s.judgments, s.unknown_queries, s.unknown_docs) for s in report.splits}
    assert counts == {"test": (300, 339, 0, 0), "train": (809, 919, 0, 0)}


# ------------------------------------------------------------------------------------------------ CLI

def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "500", **(env or {})}  # no line wrapping in rich output
    return subprocess.run([str(PRETRIEVE), *args], capture_output=True, text=True, env=full_env, timeout=120)


def assert_clean_failure(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr


def test_cli_check_scifact(scifact):
    result = run_cli("data", "check", str(scifact), "--split", "test")
    assert result.returncode == 0, result.stderr
    assert "5183" in result.stdout and "1109" in result.stdout
    assert "test" in result.stdout and "339" in result.stdout and "train" not in result.stdout


def test_cli_check_malformed_inputs(tmp_path):
    broken_corpus = make_collection(tmp_path / "a", corpus=jsonl({"_id": "d1", "text": "a"}, '{"_id": "d2", "te'))
    assert_clean_failure(run_cli("data", "check", str(broken_corpus)), "error:", "corpus.jsonl:2:", "invalid JSON")
    broken_qrels = make_collection(tmp_path / "b", qrels={"test": "query-id\tcorpus-id\tscore\nq1\td1\tyes\n"})
    assert_clean_failure(run_cli("data", "check", str(broken_qrels)), "test.tsv:2:", "field 'score'")
    assert_clean_failure(run_cli("data", "check", str(tmp_path / "missing")), "collection directory not found")


def test_cli_check_unknown_ids_warns_and_strict_fails(tmp_path):
    root = make_collection(tmp_path / "c", qrels={"test": "q1\td1\t1\nq1\tdX\t1\n"})
    result = run_cli("data", "check", str(root))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "1 judgments of documents missing from the corpus" in result.stderr
    assert run_cli("data", "check", str(root), "--strict").returncode == 1


def test_cli_list_and_offline_download(tmp_path):
    listing = run_cli("data", "list", "--cache-dir", str(tmp_path))
    assert listing.returncode == 0 and "scifact" in listing.stdout and "5f7d1de60b170fc8027bb7898e2efca1" in listing.stdout
    result = run_cli("data", "download", "scifact", "--out", str(tmp_path / "dl"), env={"PRETRIEVE_OFFLINE": "1"})
    assert_clean_failure(result, "could not download 'scifact'", "pass a local path")
    assert_clean_failure(run_cli("data", "download", "nosuch", "--out", str(tmp_path)), "unknown collection 'nosuch'")


def test_download_never_overwrites_a_foreign_directory(tmp_path, fake_download):
    write(tmp_path / "cache" / "toy" / "notes.txt", "mine")
    with pytest.raises(InputError, match="holds no corpus.jsonl; remove it"):
        fetch_collection("toy", tmp_path / "cache")
    assert (tmp_path / "cache" / "toy" / "notes.txt").read_text() == "mine" and fake_download == []
