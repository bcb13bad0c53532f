"""`pretrieve data convert` (pretrieve.data.convert): MS MARCO's native TSV files, TREC DL topics and qrels,
Tevatron training groups and ir_datasets names into a BEIR directory + groups JSONL, on tiny fixtures written in
those formats; malformed inputs give one located error."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections import namedtuple
from pathlib import Path

import pytest

from pretrieve.data.beir import Corpus, load_qrels, load_queries
from pretrieve.data.collection import BeirCollection
from pretrieve.data.convert import convert
from pretrieve.data.groups import read_groups
from pretrieve.errors import ConfigError, InputError

PRETRIEVE = Path(sys.executable).with_name("pretrieve")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def msmarco(tmp_path) -> dict[str, Path]:
    """MS MARCO passage files as distributed: no header, tab-separated, no quoting."""
    raw = tmp_path / "raw"
    return {
        "collection": write(raw / "collection.tsv",
                            '0\tThe "Manhattan Project" was, in short, a research effort.\n'
                            "1\tIts success had an immense impact.\n"
                            "2\t'quoted' text, with commas, and a trailing space \n"),
        "train": write(raw / "queries.train.tsv", "121352\tdefine extreme\n634306\twhat does chattel mean\n"),
        "dev": write(raw / "queries.dev.small.tsv", "1048585\twhat is paula deen's brother\n"),
        "dl19": write(raw / "msmarco-test2019-queries.tsv", "19335\tanthropological definition of environment\n"),
        "qrels_train": write(raw / "qrels.train.tsv", "121352\t0\t2\t1\n634306\t0\t0\t1\n"),
        "qrels_dev": write(raw / "qrels.dev.small.tsv", "1048585\t0\t1\t1\n"),
        "qrels_dl19": write(raw / "2019qrels-pass.txt", "19335 Q0 0 3\n19335 Q0 1 0\n19335 Q0 2 2\n"),
    }


def test_msmarco_files_become_a_beir_collection(msmarco, tmp_path):
    out = tmp_path / "msmarco"
    report = convert(out, corpus=msmarco["collection"], queries=[msmarco["train"], msmarco["dev"], msmarco["dl19"]],
                     qrels=[("train", msmarco["qrels_train"]), ("dev", msmarco["qrels_dev"]),
                            ("dl19", msmarco["qrels_dl19"])])
    assert (report.documents, report.queries, report.judgments) == (3, 4, {"train": 2, "dev": 1, "dl19": 3})
    corpus = Corpus.load(out / "corpus.jsonl")
    assert corpus.ids == ["0", "1", "2"] and corpus.titles == ["", "", ""]
    assert corpus.texts[0] == 'The "Manhattan Project" was, in short, a research effort.'  # quotes are text
    assert corpus.texts[2] == "'quoted' text, with commas, and a trailing space "
    assert load_queries(out / "queries.jsonl") == {"121352": "define extreme", "634306": "what does chattel mean",
                                                   "1048585": "what is paula deen's brother",
                                                   "19335": "anthropological definition of environment"}
    assert load_qrels(out / "qrels" / "dl19.tsv") == {"19335": {"0": 3, "1": 0, "2": 2}}
    collection = BeirCollection(out)
    assert collection.splits() == ["dev", "dl19", "train"]
    assert collection.load_queries("train") == {"121352": "define extreme", "634306": "what does chattel mean"}
    assert collection.corpus_dataset()["_id"] == ["0", "1", "2"]


def test_three_column_and_jsonl_corpora(tmp_path):
    tsv = write(tmp_path / "para.title.tsv", "7\tA title\tthe text\n8\t\tno title\n")
    convert(tmp_path / "a", corpus=tsv)
    assert Corpus.load(tmp_path / "a" / "corpus.jsonl").titles == ["A title", ""]
    tevatron_corpus = write(tmp_path / "corpus.jsonl", json.dumps({"docid": 5, "title": "T", "text": "x"}) + "\n")
    convert(tmp_path / "b", corpus=tevatron_corpus)
    assert Corpus.load(tmp_path / "b" / "corpus.jsonl").ids == ["5"]


@pytest.mark.parametrize("text, line, field, match", [
    ("0\tok\n1\tone\ttab too many\n", 2, None, "expected 2 tab-separated columns (as on the first line), got 3"),
    ("just one column\n", 1, None, "expected 2 (id, text) or 3 (id, title, text) tab-separated columns, got 1"),
    ("0\tok\n\tno id\n", 2, "id", "empty id"),
    ("0\tok\n\n5\ta\n0\tagain\n", 4, "id", "duplicate document id '0' (first seen on line 1)"),
    ("0\tok\n\xff\n", None, None, "not valid UTF-8"),
])
def test_bad_collection_lines_are_located(tmp_path, text, line, field, match):
    path = tmp_path / "collection.tsv"
    path.write_bytes(text.encode("utf-8").replace(b"\xc3\xbf", b"\xff"))
    with pytest.raises(InputError) as info:
        convert(tmp_path / "out", corpus=path)
    err = info.value
    assert err.path == str(path) and match in str(err)
    if line is not None:
        assert err.line == line and err.field == field
    assert not (tmp_path / "out" / "corpus.jsonl").exists()


def test_bad_queries_and_qrels(msmarco, tmp_path):
    again = write(tmp_path / "queries.more.tsv", "5\tfive\n634306\tagain\n")
    with pytest.raises(InputError) as info:
        convert(tmp_path / "out", queries=[msmarco["train"], again])
    assert info.value.line == 2 and str(info.value).endswith(
        f"duplicate query id '634306' (first seen at {msmarco['train']}:2)")
    empty = write(tmp_path / "q.tsv", "1\t \n")
    with pytest.raises(InputError, match="q.tsv:1: field 'text': must not be empty"):
        convert(tmp_path / "out", queries=[empty])
    bad = write(tmp_path / "qrels.tsv", "1 0 7 1\n2 0 8 high\n")
    with pytest.raises(InputError, match=r"qrels.tsv:2: field 'score': relevance grade 'high' is not an integer"):
        convert(tmp_path / "out", qrels=[("dev", bad)])
    with pytest.raises(ConfigError, match="nothing to convert"):
        convert(tmp_path / "out")
    with pytest.raises(InputError, match="file not found"):
        convert(tmp_path / "out", corpus=tmp_path / "missing.tsv")


def tevatron(qid, positives, negatives) -> dict:
    def passages(ids):
        return [{"docid": d, "title": "", "text": f"text of {d}"} for d in ids]

    return {"query_id": qid, "query": f"query {qid}", "positive_passages": passages(positives),
            "negative_passages": passages(negatives)}


def test_tevatron_groups(tmp_path):
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(row) + "\n" for row in (
        tevatron("3", ["10"], ["11", "12", "11"]), tevatron(4, [20, "21"], []))))
    report = convert(tmp_path / "out", groups=[path])
    groups = read_groups(tmp_path / "out" / "groups" / "train.jsonl")
    assert [(g.query_id, g.query, g.positives, g.negatives) for g in groups] == [
        ("3", "query 3", ["10"], ["11", "12"]), ("4", "query 4", ["20", "21"], [])]
    assert report.groups == {str(tmp_path / "out" / "groups" / "train.jsonl"): 2}
    assert "1 document ids listed twice" in report.notes[0]
    for row, field in ((tevatron("5", [], []) | {"positive_passages": None}, "positive_passages"),
                       ({"query_id": "5", "query": "q", "positive_passages": [{"title": "x"}]},
                        "positive_passages[0].docid"),
                       ({"query_id": "5", "query": "q", "positive_passages": ["10"]}, "positive_passages[0]"),
                       ({"query_id": "5", "positive_passages": []}, "query")):
        bad = write(tmp_path / "bad.jsonl", json.dumps(tevatron("1", ["1"], [])) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(InputError) as info:
            convert(tmp_path / "out", groups=[bad])
        assert (info.value.line, info.value.field) == (2, field)


# ------------------------------------------------------------------------------------------- ir_datasets
Doc = namedtuple("GenericDoc", "doc_id text")
Query = namedtuple("GenericQuery", "query_id text")
Qrel = namedtuple("TrecQrel", "query_id doc_id relevance iteration")


class FakeDataset:
    def __init__(self, docs=None, queries=None, qrels=None):
        self.docs, self.queries, self.qrels = docs, queries, qrels

    def has_docs(self):
        return self.docs is not None

    def has_queries(self):
        return self.queries is not None

    def has_qrels(self):
        return self.qrels is not None

    def docs_iter(self):
        return iter(self.docs)

    def queries_iter(self):
        return iter(self.queries)

    def qrels_iter(self):
        return iter(self.qrels)


def test_ir_datasets_names(tmp_path, monkeypatch):
    docs = [Doc("0", "zero"), Doc("1", "one")]
    registry = {
        "msmarco-passage/dev/small": FakeDataset(docs, [Query("7", "seven?")], [Qrel("7", "1", 1, "0")]),
        "msmarco-passage/trec-dl-2019/judged": FakeDataset(docs, [Query("9", "nine?")], [Qrel("9", "0", 2, "Q0")]),
    }

    def load(name):
        return registry[name]

    monkeypatch.setitem(sys.modules, "ir_datasets", types.SimpleNamespace(load=load))
    report = convert(tmp_path / "out", ir_datasets=["msmarco-passage/dev/small=dev",
                                                   "msmarco-passage/trec-dl-2019/judged"])
    assert (report.documents, report.queries) == (2, 2)
    collection = BeirCollection(tmp_path / "out")
    assert collection.splits() == ["dev", "trec-dl-2019-judged"]
    assert collection.load_queries("trec-dl-2019-judged") == {"9": "nine?"}
    assert collection.load_qrels("dev") == {"7": {"1": 1}}
    with pytest.raises(InputError, match="unknown ir_datasets name"):
        convert(tmp_path / "out", ir_datasets=["nope"])


def test_ir_datasets_missing_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ir_datasets", None)  # import fails
    with pytest.raises(ConfigError, match=r"needs the ir_datasets package.*pip install 'pretrieve\[irds\]'"):
        convert(tmp_path / "out", ir_datasets=["msmarco-passage/dev/small"])


def test_cli_convert_and_a_located_error(msmarco, tmp_path):
    ok = subprocess.run([str(PRETRIEVE), "data", "convert", str(tmp_path / "out"), "--corpus",
                         str(msmarco["collection"]), "--queries", str(msmarco["dev"]), "--qrels",
                         f"dev={msmarco['qrels_dev']}"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "documents  3" in ok.stdout and "qrels      dev: 1 judgments" in ok.stdout
    bad = write(tmp_path / "broken.tsv", "0\ta\n0\tb\n")
    failed = subprocess.run([str(PRETRIEVE), "data", "convert", str(tmp_path / "out2"), "--corpus", str(bad)],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert f"{bad}:2: field 'id': duplicate document id '0' (first seen on line 1)" in " ".join(failed.stderr.split())
