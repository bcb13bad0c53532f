"""Collections by name from the Hugging Face Hub and ir_datasets (:mod:`pretrieve.data.hub`), with no network: the
Hub repositories are local folders in the layouts BEIR and MTEB publish (parquet configs ``corpus`` / ``queries``,
the judgments as ``<repo>-qrels`` TSV files or a ``default`` config), read by the real ``datasets.load_dataset``;
the ir_datasets collection is a local dataset registered in ``ir_datasets.registry``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pretrieve
from pretrieve.cli import app
from pretrieve.data import hub
from pretrieve.data.collection import BeirCollection
from pretrieve.data.registry import resolve_collection
from pretrieve.data.trec import read_run
from pretrieve.errors import InputError

from conftest import isolated_data_root
from test_finetune import write_collection

README = """---
configs:
{configs}
---
"""


def _config(name: str, split: str, path: str) -> str:
    return f"- config_name: {name}\n  data_files:\n  - split: {split}\n    path: {path}\n"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_hub_repos(source: Path, root: Path) -> None:
    """``root/BeIR/toy`` (+ ``BeIR/toy-qrels``) and ``root/mteb/toy`` in the layouts of the Hub, from ``source``."""
    import datasets

    corpus, queries = _rows(source / "corpus.jsonl"), _rows(source / "queries.jsonl")
    beir = root / "BeIR" / "toy"
    datasets.Dataset.from_list(corpus).to_parquet(beir / "corpus" / "corpus-00000-of-00001.parquet")
    datasets.Dataset.from_list(queries).to_parquet(beir / "queries" / "queries-00000-of-00001.parquet")
    (beir / "README.md").write_text(README.format(configs=_config("corpus", "corpus", "corpus/*.parquet")
                                                  + _config("queries", "queries", "queries/*.parquet")))
    (root / "BeIR" / "toy-qrels").mkdir()
    for split in ("train", "test"):
        (root / "BeIR" / "toy-qrels" / f"{split}.tsv").write_text((source / "qrels" / f"{split}.tsv").read_text())
    mteb = root / "mteb" / "toy"   # MTEB: `id` columns, judgments in the default config (one split each)
    datasets.Dataset.from_list([{"id": d["_id"], "title": d["title"], "text": d["text"]} for d in corpus]).to_parquet(
        mteb / "corpus.parquet")
    datasets.Dataset.from_list([{"id": q["_id"], "text": q["text"]} for q in queries]).to_parquet(
        mteb / "queries.parquet")
    for split in ("train", "test"):
        lines = (source / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
        datasets.Dataset.from_list([dict(zip(("query-id", "corpus-id", "score"), (a, b, int(c))))
                                    for a, b, c in (line.split("\t") for line in lines)]).to_parquet(
            mteb / "qrels" / f"{split}.parquet")
    (mteb / "README.md").write_text(README.format(
        configs=_config("corpus", "corpus", "corpus.parquet") + _config("queries", "queries", "queries.parquet")
        + "- config_name: default\n  data_files:\n  - split: train\n    path: qrels/train.parquet\n"
          "  - split: test\n    path: qrels/test.parquet\n"))


@pytest.fixture
def hub_repos(tmp_path, monkeypatch) -> Path:
    """The tiny collection at ``$PRETRIEVE_DATA/toy`` and the same as Hub repositories (local folders)."""
    source = write_collection(isolated_data_root(tmp_path, monkeypatch) / "toy")
    root = tmp_path / "hub"
    write_hub_repos(source, root)
    monkeypatch.setattr(hub, "dataset_location", lambda repo: str(root / repo))
    for env in hub.OFFLINE_ENVS:
        monkeypatch.delenv(env, raising=False)
    return source


def same_collection(a: Path, b: Path) -> None:
    one, two = BeirCollection(a), BeirCollection(b)
    assert one.splits() == two.splits() == ["test", "train"]
    assert one.load_corpus().ids == two.load_corpus().ids
    assert one.load_queries() == two.load_queries()
    for split in one.splits():
        assert one.load_qrels(split) == two.load_qrels(split)


@pytest.mark.parametrize("name", ["BeIR/toy", "mteb/toy", "hf:BeIR/toy"])
def test_a_hub_collection_is_fetched_once_into_the_cache_in_beir_layout(hub_repos, tmp_path, name):
    path = resolve_collection(name)
    assert path.is_relative_to(tmp_path / "cache") and (path / hub.SOURCE_FILE).is_file()
    same_collection(path, hub_repos)
    assert (path / "corpus.jsonl").read_text() == (hub_repos / "corpus.jsonl").read_text()   # titles, texts, order
    # BM25 through the Python API reads it as the local collection: the same run
    assert pretrieve.bm25(name, k=5) == pretrieve.bm25("toy", k=5)


def test_a_fetched_collection_is_read_offline_and_a_missing_one_names_what_to_fetch(hub_repos, monkeypatch):
    fetched = resolve_collection("BeIR/toy")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "_load", lambda *a: pytest.fail("the Hub was asked for a cached collection"))
    assert resolve_collection("BeIR/toy") == fetched
    with pytest.raises(InputError) as caught:
        resolve_collection("mteb/toy")
    message = str(caught.value)
    assert "\n" not in message and "HF_HUB_OFFLINE" in message and "'mteb/toy' (configs corpus, queries)" in message
    assert "pretrieve data download hf:mteb/toy" in message


def test_the_cli_resolves_hub_names_as_the_api_does(hub_repos, tmp_path):
    out = tmp_path / "bm25.trec"
    result = CliRunner().invoke(app, ["bm25", "--data", "mteb/toy", "--out", str(out), "--k", "5"])
    assert result.exit_code == 0, result.output
    assert read_run(out) == pretrieve.bm25("toy", k=5)
    result = CliRunner().invoke(app, ["data", "download", "BeIR/toy"])
    assert result.exit_code == 0 and "hf--BeIR--toy" in result.output


def test_a_hub_repository_without_a_corpus_config_is_one_line(hub_repos, tmp_path):
    (tmp_path / "hub" / "BeIR" / "toy" / "README.md").write_text(
        README.format(configs=_config("queries", "queries", "queries/*.parquet")))
    with pytest.raises(InputError, match="has no corpus config") as caught:
        resolve_collection("BeIR/toy")
    assert not hub.HubSource("hf", "BeIR/toy").cache_dir().exists()   # nothing half-written is left
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------------------------------- ir_datasets
@pytest.fixture
def irds_toy(tmp_path, monkeypatch) -> Path:
    """``pretrieve-toy`` (documents and queries) with ``pretrieve-toy/train`` and ``pretrieve-toy/test`` (judgments)
    registered in ir_datasets from local files — what ``beir/scifact`` and ``beir/scifact/test`` are."""
    import ir_datasets
    from ir_datasets.datasets.base import Dataset
    from ir_datasets.formats import TrecQrels, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    source = write_collection(isolated_data_root(tmp_path, monkeypatch) / "toy")
    files = tmp_path / "irds"
    files.mkdir()
    (files / "docs.tsv").write_text("".join(f"{d['_id']}\t{d['text']}\n" for d in _rows(source / "corpus.jsonl")))
    (files / "queries.tsv").write_text("".join(f"{q['_id']}\t{q['text']}\n" for q in _rows(source / "queries.jsonl")))
    docs, queries = TsvDocs(LocalDownload(files / "docs.tsv")), TsvQueries(LocalDownload(files / "queries.tsv"))
    registered = {"pretrieve-toy": Dataset(docs, queries)}
    for split in ("train", "test"):
        lines = (source / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
        (files / f"{split}.qrels").write_text("".join(f"{a} 0 {b} {c}\n" for a, b, c in (x.split("\t") for x in lines)))
        registered[f"pretrieve-toy/{split}"] = Dataset(docs, queries, TrecQrels(LocalDownload(files / f"{split}.qrels"),
                                                                                 {1: "relevant"}))
    for name, dataset in registered.items():
        ir_datasets.registry.register(name, dataset)
    yield source
    for name in registered:
        ir_datasets.registry._registered.pop(name, None)


def test_an_ir_datasets_collection_and_one_of_its_splits(irds_toy):
    whole = resolve_collection("pretrieve-toy")
    assert whole.name == "irds--pretrieve-toy"
    same = BeirCollection(whole)
    assert same.splits() == ["test", "train"]
    assert same.load_corpus().ids == BeirCollection(irds_toy).load_corpus().ids
    assert same.load_queries() == BeirCollection(irds_toy).load_queries()
    for split in ("train", "test"):
        assert same.load_qrels(split) == BeirCollection(irds_toy).load_qrels(split)
    test = BeirCollection(resolve_collection("pretrieve-toy/test"))
    assert test.splits() == ["test"] and test.load_qrels("test") == same.load_qrels("test")
    assert BeirCollection(resolve_collection("irds:pretrieve-toy/test")).root == test.root


def test_ir_datasets_bars_and_info_lines_are_quiet_while_fetching_into_a_log(capfd):
    from ir_datasets.log import easy

    def chatty() -> str:
        log = easy("pretrieve-test")
        log.info("[starting] something")
        assert sum(log.pbar(range(200), desc="docs_iter")) == 199 * 100
        log.warn("download failed")
        return capfd.readouterr().err

    loud = chatty()                                      # ir_datasets as it is: its own handler, tqdm frames
    assert "\r" in loud and "[INFO]" in loud
    with hub._quiet_irds():
        quiet = chatty()
    assert "\r" not in quiet and "[INFO]" not in quiet and "[WARNING] download failed" in quiet
    assert "\r" in chatty()                               # put back afterwards


def test_ir_datasets_split_names():
    registered = ["beir/scifact", "beir/scifact/train", "beir/scifact/test", "msmarco-passage",
                  "msmarco-passage/dev", "msmarco-passage/dev/small", "cranfield"]
    judged = {"beir/scifact/train", "beir/scifact/test", "msmarco-passage/dev", "msmarco-passage/dev/small",
              "cranfield"}
    splits = lambda name: hub.irds_splits(name, registered, judged.__contains__)  # noqa: E731
    assert splits("beir/scifact/test") == {"test": "beir/scifact/test"}
    assert splits("beir/scifact") == {"test": "beir/scifact/test", "train": "beir/scifact/train"}
    assert splits("msmarco-passage/dev/small") == {"dev-small": "msmarco-passage/dev/small"}
    assert splits("cranfield") == {"test": "cranfield"}


def test_names_that_are_not_hub_collections():
    assert hub.hub_source("./BeIR/scifact") is None
    assert hub.hub_source("runs/out") is None
    assert hub.hub_source("someone/corpus") is None          # an owner not known bare: hf:someone/corpus
    assert hub.hub_source("hf:someone/corpus") == hub.HubSource("hf", "someone/corpus")
    assert hub.hub_source("BeIR/scifact") == hub.HubSource("hf", "BeIR/scifact")


# ------------------------------------------------------------------------------------------- did you mean
def test_a_mistyped_collection_gets_did_you_mean(tmp_path, monkeypatch):
    write_collection(isolated_data_root(tmp_path, monkeypatch) / "toy-collection")
    with pytest.raises(InputError, match="did you mean 'scifact'"):
        resolve_collection("scifactt")
    with pytest.raises(InputError, match="did you mean 'toy-collection'"):
        resolve_collection("toy-colection")
    result = CliRunner().invoke(app, ["bm25", "--data", "scifcat", "--out", str(tmp_path / "x.trec")])
    assert isinstance(result.exception, InputError) and "did you mean 'scifact'?" in str(result.exception)
    with pytest.raises(InputError) as caught:
        resolve_collection("zzzzqqq")
    assert "did you mean" not in str(caught.value)
