"""Memory-mapped Arrow datasets of corpus, queries and groups (pretrieve.data.arrow): the same rows and the same
located errors as the streaming readers, in one part or many, one process or two; the id index; reuse through
the freshness contract; where the cache goes."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pretrieve import artifacts
from pretrieve.data import arrow, parallel
from pretrieve.data.beir import Corpus, load_queries
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import read_groups
from pretrieve.errors import InputError


def jsonl(*rows) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def docs(n: int, start: int = 0) -> list[dict]:
    return [{"_id": f"d{i}", "title": f"T{i}" if i % 3 else "", "text": f"passage number {i} " * (1 + i % 4)}
            for i in range(start, start + n)]


@pytest.fixture
def many_parts(monkeypatch):
    """Cut every file into parts of ~200 bytes (read in this process): the multi-part logic without processes."""
    monkeypatch.setattr(parallel, "PART_BYTES", 200)


def error_of(fn) -> InputError:
    with pytest.raises(InputError) as info:
        fn()
    return info.value


def same_error(a: InputError, b: InputError) -> None:
    assert (a.path, a.line, a.field, str(a)) == (b.path, b.line, b.field, str(b))


# ------------------------------------------------------------------------------------------------ corpus
def test_corpus_rows_equal_the_jsonl_reader_in_many_parts(tmp_path, many_parts):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(40)[:20], "", "   ", *docs(20, 20)), encoding="utf-8")  # blank lines in between
    ds = arrow.corpus_dataset(path, num_proc=1)
    assert json.loads((arrow.dataset_path(tmp_path / "corpus.jsonl") / "meta.json").read_text())["parts"].__len__() > 5
    reference = Corpus.load(path)
    assert ds.column_names == ["_id", "title", "text"]
    assert (ds["_id"], ds["title"], ds["text"]) == (reference.ids, reference.titles, reference.texts)


@pytest.mark.parametrize("bad, field, match", [
    ('{"_id": "x", "text": "trunc', None, "invalid JSON"),
    ('["a list"]', None, "expected a JSON object, got list"),
    ('{"title": "no id", "text": "t"}', "_id", "missing required field"),
    ('{"_id": "x", "text": 3.5}', "text", "expected a string, got float"),
    ('{"_id": "  ", "text": "t"}', "_id", "must not be empty"),
])
def test_corpus_errors_name_the_real_line_in_a_later_part(tmp_path, many_parts, bad, field, match):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(30), "", bad, *docs(5, 30)), encoding="utf-8")
    err = error_of(lambda: arrow.corpus_dataset(path, num_proc=1))
    same_error(err, error_of(lambda: Corpus.load(path)))
    assert err.line == 32 and err.field == field and match in str(err)
    assert not (arrow.dataset_path(tmp_path / "corpus.jsonl")).exists()  # nothing half-written is left


def test_corpus_duplicate_ids_across_parts_and_empty_corpus(tmp_path, many_parts):
    path = tmp_path / "corpus.jsonl"
    rows = docs(30)
    path.write_text(jsonl(*rows, "", rows[3], rows[25]), encoding="utf-8")
    err = error_of(lambda: arrow.corpus_dataset(path, num_proc=1))
    same_error(err, error_of(lambda: Corpus.load(path)))
    assert err.line == 32 and "duplicate document id 'd3' (first seen on line 4)" in str(err)
    path.write_text("\n \n", encoding="utf-8")
    same_error(error_of(lambda: arrow.corpus_dataset(path)), error_of(lambda: Corpus.load(path)))
    missing = tmp_path / "none.jsonl"
    same_error(error_of(lambda: arrow.corpus_dataset(missing)), error_of(lambda: Corpus.load(missing)))


def test_two_processes_equal_one_and_report_a_worker_error(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(300)), encoding="utf-8")
    one = arrow.corpus_dataset(path, num_proc=1, cache_dir=tmp_path / "one")
    two = arrow.corpus_dataset(path, num_proc=2, cache_dir=tmp_path / "two")
    assert len(list((tmp_path / "two" / "corpus.arrow").glob("data-*.arrow"))) == 2
    assert one.to_dict() == two.to_dict()
    assert np.array_equal(np.load(tmp_path / "one/corpus.arrow/ids.row.npy"),
                          np.load(tmp_path / "two/corpus.arrow/ids.row.npy"))
    lines = path.read_text().splitlines(True)
    lines[280] = '{"_id": "d280", "text": null}\n'  # second half: read by the second process
    path.write_text("".join(lines))
    err = error_of(lambda: arrow.corpus_dataset(path, num_proc=2, cache_dir=tmp_path / "bad"))
    same_error(err, error_of(lambda: Corpus.load(path)))
    assert err.line == 281 and err.field == "text"


def test_gzip_bom_and_integer_ids(tmp_path):
    gz = tmp_path / "corpus.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as handle:
        handle.write("\ufeff" + jsonl({"_id": 7, "text": "seven"}, {"_id": "8", "title": "t", "text": "eight"}))
    ds = arrow.corpus_dataset(gz, num_proc=2)  # a gzipped file is one part
    assert ds.to_dict() == {"_id": ["7", "8"], "title": ["", "t"], "text": ["seven", "eight"]}
    assert (arrow.dataset_path(tmp_path / "corpus.jsonl")).is_dir()


# ------------------------------------------------------------------------------------------------ id index
def test_id_index_lookup_unknown_and_views(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(50)), encoding="utf-8")
    ds = arrow.corpus_dataset(path)
    index = arrow.id_index(ds)
    assert index.lookup(["d49", "nope", "d0", "d7"]).tolist() == [49, -1, 0, 7]
    assert index.row("d12") == 12 and "d12" in index and "d50" not in index and 12 not in index
    with pytest.raises(KeyError):
        index.row("d50")
    assert index.missing(["d1", "x", "y"]) == {"x", "y"}
    with pytest.raises(Exception, match="whole dataset"):
        arrow.id_index(ds.select(range(3, 9)))


def test_id_index_is_exact_when_every_hash_collides(tmp_path, monkeypatch):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(20)), encoding="utf-8")
    monkeypatch.setattr(arrow, "hash_ids", lambda ids: np.zeros(len(list(ids)), dtype=np.uint64))
    ds = arrow.corpus_dataset(path)  # all hashes equal: no id is a duplicate all the same
    index = arrow.id_index(ds)
    assert index.lookup([f"d{i}" for i in (19, 0, 5)] + ["zz"]).tolist() == [19, 0, 5, -1]


def test_contiguous_rank_slices_write_nothing(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(10)), encoding="utf-8")
    ds = arrow.corpus_dataset(path)
    directory = arrow.dataset_path(tmp_path / "corpus.jsonl")
    before = sorted(p.name for p in directory.iterdir())
    assert ds.shard(3, 1, contiguous=True)["_id"] == ["d4", "d5", "d6"]
    assert ds.select(range(7, 10))["_id"] == ["d7", "d8", "d9"]
    assert sorted(p.name for p in directory.iterdir()) == before
    assert artifacts.is_current(directory, kind=arrow.KIND, settings={"format": arrow.FORMAT, "table": "corpus"},
                                inputs={"source": path})


# ------------------------------------------------------------------------------------------------ freshness
def test_reused_while_current_rebuilt_when_the_source_changes(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(*docs(5)), encoding="utf-8")
    arrow.corpus_dataset(path)
    data = next((arrow.dataset_path(tmp_path / "corpus.jsonl")).glob("data-*.arrow"))
    stamp = data.stat().st_mtime_ns
    assert arrow.corpus_dataset(path)["_id"] == [f"d{i}" for i in range(5)]
    assert data.stat().st_mtime_ns == stamp  # reused, not rebuilt
    path.write_text(jsonl(*docs(6)), encoding="utf-8")
    assert len(arrow.corpus_dataset(path)) == 6
    (arrow.dataset_path(tmp_path / "corpus.jsonl") / "cache-stray.arrow").write_bytes(b"x")
    assert len(arrow.corpus_dataset(path)) == 6  # an added file makes it not current: rebuilt, stray file gone
    assert not (arrow.dataset_path(tmp_path / "corpus.jsonl") / "cache-stray.arrow").exists()


def test_the_arrow_cache_is_in_the_user_cache_never_beside_the_data(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    path = shared / "corpus.jsonl"
    path.write_text(jsonl(*docs(3)), encoding="utf-8")
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    ds = arrow.corpus_dataset(path)
    assert sorted(p.name for p in shared.iterdir()) == ["corpus.jsonl"]   # a writable data folder stays as it was
    assert arrow.dataset_directory(ds).parent.parent == tmp_path / "cache" / "arrow"
    assert ds["_id"] == ["d0", "d1", "d2"]


# ------------------------------------------------------------------------------------------------ queries
def test_queries_dataset_and_split(tmp_path, many_parts):
    root = tmp_path / "c"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(jsonl(*docs(3)), encoding="utf-8")
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(20)]
    (root / "queries.jsonl").write_text(jsonl(*queries), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq12\td1\t1\nq3\td2\t1\nq99\td0\t1\n")
    collection = BeirCollection(root)
    ds = collection.queries_dataset()
    assert ds.column_names == ["_id", "text"] and ds["_id"] == list(load_queries(root / "queries.jsonl"))
    split = collection.queries_dataset("test")
    assert dict(zip(split["_id"], split["text"])) == collection.load_queries("test")
    assert split["_id"] == ["q3", "q12"]  # file order
    (root / "queries.jsonl").write_text(jsonl(*queries, {"_id": "q4", "text": "again"}), encoding="utf-8")
    err = error_of(collection.queries_dataset)
    same_error(err, error_of(lambda: load_queries(root / "queries.jsonl")))
    assert "duplicate query id 'q4' (first seen on line 5)" in str(err)


# ------------------------------------------------------------------------------------------------ groups
def group(qid: str, positives, negatives, scores=False) -> dict:
    row = {"query_id": qid, "query": f"text of {qid}", "positives": positives, "negatives": negatives}
    if scores:
        row["positive_scores"] = [1.0] * len(positives)
        row["negative_scores"] = [0.5] * len(negatives)
    return row


def test_groups_equal_read_groups_with_stats(tmp_path, many_parts):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(jsonl(*docs(30)), encoding="utf-8")
    path = tmp_path / "groups.jsonl"
    rows = [group(f"q{i}", [f"d{i}"], [f"d{(i + k) % 30}" for k in range(1, 5)], scores=i % 2 == 0)
            for i in range(25)]
    rows[3]["negatives"].append("d3")          # a positive listed as negative: dropped
    rows[4] = group("q4", [], ["d1"])          # no positives: skipped
    rows[5]["negatives"].append("unknown-doc")  # unknown: error, or dropped with skip
    path.write_text(jsonl(*rows), encoding="utf-8")
    err = error_of(lambda: arrow.groups_dataset(path, corpus=corpus))
    same_error(err, error_of(lambda: read_groups(path, corpus=Corpus.load(corpus))))
    assert err.line == 6 and err.field == "negatives[4]"
    got = arrow.groups_dataset(path, corpus=corpus, on_unknown="skip")
    want = read_groups(path, corpus=Corpus.load(corpus), on_unknown="skip")
    assert [got[i] for i in range(len(got))] == list(want) and list(got) == list(want)
    assert got.stats == want.stats and got.stats.unknown_ids_dropped == 1
    unchecked = arrow.groups_dataset(path)
    assert list(unchecked) == list(read_groups(path))
    assert list(got.select(range(2, 5))) == list(want)[2:5]


def test_groups_parse_error_after_an_unknown_id_reports_the_earlier_line(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(jsonl(*docs(5)), encoding="utf-8")
    path = tmp_path / "groups.jsonl"
    path.write_text(jsonl(group("q1", ["d1"], ["d2"]), group("q2", ["d1"], ["nope"]), '{"query_id": 1'),
                    encoding="utf-8")
    err = error_of(lambda: arrow.groups_dataset(path, corpus=corpus))
    same_error(err, error_of(lambda: read_groups(path, corpus=Corpus.load(corpus))))
    assert err.line == 2


# ------------------------------------------------------------------------------------------------ SciFact
def test_scifact_arrow_corpus_equals_the_jsonl_reader(scifact, tmp_path):
    collection = BeirCollection(scifact)
    ds = collection.corpus_dataset(cache_dir=tmp_path)
    reference = collection.load_corpus()
    assert len(ds) == len(reference) == 5183
    assert ds["_id"] == reference.ids and ds["title"] == reference.titles and ds["text"] == reference.texts
    index = collection.corpus_index(cache_dir=tmp_path)
    assert index.lookup(reference.ids).tolist() == list(range(len(reference)))


# ------------------------------------------------------------------------------------------- reading
def _mapped_kb(directory: Path) -> int:
    """Resident kB of this process's maps of files under ``directory`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):        # a mapping's header line
                inside = str(directory) in line
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc/self/smaps (Linux)")
def test_corpus_texts_read_rows_and_give_their_pages_back(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rows = [{"_id": f"d{i}", "title": f"T{i}" if i % 3 else "", "text": f"passage {i} " + "word " * 200}
            for i in range(8000)]
    path.write_text(jsonl(*rows), encoding="utf-8")
    ds = arrow.corpus_dataset(path, num_proc=1)
    directory = arrow.dataset_directory(ds)
    reference = Corpus.load(path)
    texts = arrow.CorpusTexts.of(ds)
    assert texts is not None and len(texts) == 8000
    assert arrow.CorpusTexts.of(ds.select(range(10, 20))) is None      # a view: rows would not match
    passages = [p for start in range(0, 8000, 1000) for p in texts[start:start + 1000]]
    assert passages == [reference.full_text(i) for i in range(8000)]
    assert texts[7990:9000] == passages[7990:] and texts[5:5] == []
    assert texts.texts_of(["d7", "d0"]) == [reference.full_text(7), reference.full_text(0)]
    from pretrieve.retrieval.search import corpus_ids
    import datasets

    assert texts.ids_of(3, 7) == corpus_ids(ds, 3, 7) == ["d3", "d4", "d5", "d6"]
    assert corpus_ids(ds, 0, 8000) == reference.ids
    plain = datasets.Dataset.from_dict({"id": ["a", "b", "c"], "text": ["x", "y", "z"]})
    assert corpus_ids(plain, 1, 3) == ["b", "c"]
    size_kb = sum(f.stat().st_size for f in directory.glob("*.arrow")) // 1024
    assert size_kb > 8000                                  # the texts are ~13 MB: a full pass would show
    assert _mapped_kb(directory) < size_kb / 10           # only the last read's pages (if any) are resident
    for start in range(0, 8000, 1000):                    # the same pass through datasets keeps them all
        ds[start:start + 1000]
    assert _mapped_kb(directory) > size_kb / 2


def test_trainable_groups_keep_those_with_negatives_then_the_first_n(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(jsonl(*docs(10)), encoding="utf-8")
    path = tmp_path / "groups.jsonl"
    rows = [group(f"q{i}", [f"d{i}"], [] if i in (2, 3) else [f"d{(i + 1) % 10}"]) for i in range(8)]
    path.write_text(jsonl(*rows), encoding="utf-8")
    groups = arrow.groups_dataset(path, corpus=corpus)
    kept = groups.trainable(need_negatives=True)
    assert [g.query_id for g in kept] == ["q0", "q1", "q4", "q5", "q6", "q7"]
    assert kept.stats.skipped_no_negatives == 2
    assert [g.query_id for g in groups.trainable(need_negatives=False, max_groups=3)] == ["q0", "q1", "q2"]
    assert [g.query_id for g in arrow.groups_dataset(path, corpus=corpus).trainable(True, max_groups=3)] == \
        ["q0", "q1", "q4"]
    path.write_text(jsonl(group("q0", ["d0"], [])), encoding="utf-8")
    with pytest.raises(InputError, match="no usable training group with negatives"):
        arrow.groups_dataset(path, corpus=corpus).trainable(need_negatives=True)


def test_take_rows_reads_rows_of_any_chunk_in_the_order_asked():
    column = pa.chunked_array([pa.array(["a", "b", "c"]), pa.array([], pa.string()), pa.array(["d"]),
                               pa.array(["e", "f"])])
    rows = [5, 0, 3, 3, 2, 4, 1]
    assert arrow.take_rows(column, rows) == [column[r].as_py() for r in rows] == ["f", "a", "d", "d", "c", "e", "b"]
    assert arrow.take_rows(column, []) == []
    with pytest.raises(IndexError):
        arrow.take_rows(column, [6])
    with pytest.raises(IndexError):
        arrow.take_rows(column, [-1])
