"""Several pre-training sources (``--corpus A --corpus B``, ``--corpus A,B``, ``corpus: [A, B]``): concatenated in the
order given (RetroMAE's ``concatenate_datasets``; the loop then shuffles the whole), each source's counts recorded,
and every source an input of the run. Two local sources: a dataset in the hub's layout read as ``hf:DIR`` and a
JSONL file. And the MS MARCO corpus with titles (``msmarco-titled``) the BoW, DupMAE, CoT-MAE and CoT-MoTE recipes
fine-tune and evaluate on, made by the registry from RocketQA's archive on a small sample."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import shutil
import tarfile
import numpy as np
import pytest

from conftest import isolated_data_root
from pretrieve import artifacts
from pretrieve.data import registry
from pretrieve.data.pretrain_text import TokenizedCorpus, resolve_text_sources, split_corpus
from pretrieve.data.registry import resolve_collection, resolve_corpus
from pretrieve.data.spans import SpanCorpus
from pretrieve.errors import ConfigError, InputError
from pretrieve.train.pretrainer import pretrain
from pretrieve.train.run_config import build_pretrain_config

WIKI = ["Anarchism is a political philosophy and movement that is sceptical of all justifications for authority.",
        "Albedo is the fraction of sunlight that is diffusely reflected by a body.",
        "A is the first letter and the first vowel letter of the Latin alphabet."]
BOOKS = ["the boy walked down the road and sang a song about the river .",
         "she said nothing , but smiled at the old man by the fire .",
         "it was late when they finally reached the village ."]


@pytest.fixture
def two_sources(tmp_path, monkeypatch) -> tuple[str, str]:
    """``hf:<dir>`` (parquet under data/, as wikimedia/wikipedia ships) and a JSONL file with 'text'."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")   # not the user's cache
    repo = tmp_path / "wikipedia"
    (repo / "data").mkdir(parents=True)
    datasets.Dataset.from_dict({"id": ["1", "2", "3"], "title": ["Anarchism", "Albedo", "A"], "text": WIKI}) \
        .to_parquet(str(repo / "data" / "train-00000-of-00001.parquet"))
    books = tmp_path / "books.jsonl"
    books.write_text("".join(json.dumps({"text": text}) + "\n" for text in BOOKS), encoding="utf-8")
    return f"hf:{repo}", str(books)


def chunks_of(corpus: TokenizedCorpus) -> list[list[int]]:
    return [corpus.tokens[corpus.offsets[i]:corpus.offsets[i + 1]].tolist() for i in range(len(corpus))]


def test_the_stream_holds_both_sources_in_the_given_order(two_sources, tokenizer, tmp_path):
    wiki, books = two_sources
    titled = [f"{title} {text}" for title, text in zip(["Anarchism", "Albedo", "A"], WIKI)]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in titled + BOOKS]
    corpus = TokenizedCorpus.build([wiki, books], tokenizer, 64, tmp_path / "cache", show_progress=False, num_proc=1)
    assert chunks_of(corpus) == ids                                  # every passage one chunk: wiki, then books
    assert [s["source"] for s in corpus.meta["sources"]] == [wiki, books]
    assert [(s["passages"], s["chunks"], s["first_chunk"]) for s in corpus.meta["sources"]] == [(3, 3, 0), (3, 3, 3)]
    assert [s["tokens"] for s in corpus.meta["sources"]] == [sum(map(len, ids[:3])), sum(map(len, ids[3:]))]
    # the comma-separated spelling is the same corpus (the same cache); the other order is another corpus
    again = TokenizedCorpus.build(f"{wiki},{books}", tokenizer, 64, tmp_path / "cache", show_progress=False,
                                  num_proc=2)
    assert np.array_equal(again.tokens, corpus.tokens) and np.array_equal(again.offsets, corpus.offsets)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    swapped = TokenizedCorpus.build([books, wiki], tokenizer, 64, tmp_path / "cache", show_progress=False)
    assert chunks_of(swapped) == ids[3:] + ids[:3]


def test_a_source_without_text_is_named(two_sources, tokenizer, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="no text") as error:
        TokenizedCorpus.build([two_sources[1], str(empty)], tokenizer, 64, tmp_path / "cache", show_progress=False)
    assert "empty.txt" in str(error.value)


def test_spellings_of_several_sources(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b,c.txt"
    a.write_text("x\n")
    b.write_text("y\n")
    assert split_corpus(f"{a},hf:bookcorpus/bookcorpus") == [str(a), "hf:bookcorpus/bookcorpus"]
    assert split_corpus([str(a), f"{a},{a}"]) == [str(a)] * 3
    assert split_corpus(str(b)) == [str(b)]                          # an existing path keeps its comma
    assert [s.kind for s in resolve_text_sources([str(a), "hf:wikimedia/wikipedia:20231101.en"])] == ["text",
                                                                                                      "datasets"]
    assert resolve_corpus(f"{a},hf:x") == [str(a), "hf:x"] and resolve_corpus(str(a)) == str(a)
    with pytest.raises(InputError, match="empty pre-training corpus"):
        split_corpus(f"{a},")


def test_pretraining_on_two_sources_records_each_as_an_input(two_sources, tiny_mlm_dir, tmp_path):
    wiki, books = two_sources
    flags = dict(model=str(tiny_mlm_dir), corpus=[wiki, books], out=str(tmp_path / "run"), max_len=48, batch_size=2,
                 max_steps=1, save_every=0, show_progress=False)
    final = pretrain(build_pretrain_config({}, flags, {"method": "mlm"}))
    assert json.loads((final / "pretrain_config.json").read_text(encoding="utf-8"))["corpus"] == [wiki, books]
    sidecar = artifacts.read_sidecar(final)   # the hub-layout dataset by its name, the JSONL file by its content
    assert sidecar["settings"]["corpus0"] == wiki and "corpus1" in sidecar["inputs"]
    cache = next((tmp_path / "run" / "cache").iterdir())
    meta = json.loads((cache / "meta.json").read_text(encoding="utf-8"))
    assert [s["source"] for s in meta["sources"]] == [wiki, books]


def test_document_spans_read_one_source(two_sources, tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="one corpus source"):
        SpanCorpus.build(list(two_sources), tokenizer, 48, tmp_path / "spans")


def test_msmarco_titled_is_rocketqas_passages_with_titles_and_beirs_judgments(tmp_path, monkeypatch):
    """The registry's ``msmarco-titled`` on a small sample: RocketQA's archive (downloaded: faked here) joined as
    bowdpr's get_data.sh joins it, with the queries and qrels of the BEIR msmarco found under the data root."""
    root = isolated_data_root(tmp_path, monkeypatch)
    beir = root / "msmarco"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": str(i), "title": "", "text": t}) + "\n"
                                               for i, t in enumerate(["a", "b", "c"])), encoding="utf-8")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "7", "text": "manhattan project"}) + "\n", encoding="utf-8")
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n7\t0\t1\n", encoding="utf-8")
    para = ("0\tThe presence of communication amid scientific minds was equally important.\n"
            "1\tThe Manhattan Project and its atomic bomb helped bring an end to World War II.\n"
            "2\tEssay on the Manhattan Project.\n")
    titles = "0\tThe Manhattan Project\n1\t-\n2\t\n"
    archive = tmp_path / "marco.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in (("marco/para.txt", para), ("marco/para.title.txt", titles),
                           ("marco/dev.query.txt", "7\tmanhattan project\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dl20_queries = tmp_path / "msmarco-test2020-queries.tsv.gz"
    dl20_queries.write_bytes(gzip.compress(b"1030303\twho is aziz hashim\n"))
    dl20_qrels = tmp_path / "2020qrels-pass.txt"
    dl20_qrels.write_text("1030303 0 1 3\n1030303 0 2 0\n", encoding="utf-8")
    served = {registry.ROCKETQA_MARCO_URL: archive, registry.DL20_FILES[0].url: dl20_queries,
              registry.DL20_FILES[1].url: dl20_qrels}
    info = registry.KNOWN_COLLECTIONS["msmarco-titled"]   # the DL20 files' published md5s, of this sample
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "msmarco-titled", dataclasses.replace(info, extra=tuple(
        registry.Source(s.url, registry.file_md5(served[s.url])) for s in info.extra)))
    fetched = []
    monkeypatch.setattr(registry, "download_file", lambda url, dest: fetched.append(url) or shutil.copy(served[url],
                                                                                                          dest))
    path = resolve_collection("msmarco-titled")
    assert fetched == list(served) and path.name == "msmarco-titled"
    corpus = [json.loads(line) for line in (path / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    assert corpus == [
        {"_id": "0", "title": "The Manhattan Project",
         "text": "The presence of communication amid scientific minds was equally important."},
        {"_id": "1", "title": "-",
         "text": "The Manhattan Project and its atomic bomb helped bring an end to World War II."},
        {"_id": "2", "title": "", "text": "Essay on the Manhattan Project."}]
    assert [json.loads(line) for line in (path / "queries.jsonl").read_text().splitlines()] == [
        {"_id": "7", "text": "manhattan project"}, {"_id": "1030303", "text": "who is aziz hashim"}]
    assert (path / "qrels" / "dev.tsv").read_bytes() == (beir / "qrels" / "dev.tsv").read_bytes()
    assert (path / "qrels" / "dl20.tsv").read_text() == "query-id\tcorpus-id\tscore\n1030303\t1\t3\n1030303\t2\t0\n"
    assert not (tmp_path / "cache" / "collections" / registry.DOWNLOADS_DIR).exists()   # the archives went
    lock = json.loads((tmp_path / "cache" / "collections" / registry.CHECKSUM_LOCK).read_text())
    assert lock == {registry.ROCKETQA_MARCO_URL: {"md5": registry.file_md5(archive), "bytes": archive.stat().st_size}}
    assert not (path / ".rocketqa").exists()
    assert resolve_collection("msmarco-titled") == path and len(fetched) == 3   # found, not fetched again


def test_msmarco_titled_needs_beirs_msmarco_first(tmp_path, monkeypatch):
    isolated_data_root(tmp_path, monkeypatch)
    monkeypatch.setenv("PRETRIEVE_OFFLINE", "1")
    with pytest.raises(InputError, match="'msmarco'"):
        resolve_collection("msmarco-titled")


@pytest.mark.parametrize("flags", [["--corpus", "A", "--corpus", "B"], ["--corpus", "A,B"]])
def test_the_cli_takes_several_sources(flags, tiny_mlm_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pretrieve.cli import app
    from pretrieve.train import pretrainer

    (tmp_path / "A").write_text("first source\n", encoding="utf-8")
    (tmp_path / "B").write_text("second source\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    seen = []
    monkeypatch.setattr(pretrainer, "pretrain", lambda config: seen.append(config.corpus) or tmp_path / "final")
    result = CliRunner().invoke(app, ["pretrain", "--model", str(tiny_mlm_dir), "--out", "out", *flags])
    assert result.exit_code == 0, result.output
    assert seen == [["A", "B"]]
