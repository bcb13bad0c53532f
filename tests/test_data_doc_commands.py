"""Every ``pretrieve data …`` command that docs/data.md shows is run here, on small stand-ins of the files it names
(MS MARCO's TSVs, RocketQA's para files, the TREC DL files, Tevatron's JSONL), in a fresh directory without network:
``convert`` and ``check`` on the stand-ins, ``list`` on the cache, ``download`` offline (its one line naming the files
to fetch by hand). The commands are read from the page, so an edited command is run as edited. Left out, and said
here: ``--ir-datasets`` (ir_datasets downloads its files) — tests/test_convert.py runs that converter on a stub."""

from __future__ import annotations

import gzip
import json
import os
import shlex

import pytest
from typer.testing import CliRunner

from conftest import isolated_data_root
from pretrieve.cli import app
from pretrieve.errors import InputError
from test_doc_commands import ROOT, pretrieve_words, quoted_commands

DOC = ROOT / "docs" / "data.md"

GROUP = {"query_id": "3", "query": "what is a", "positive_passages": [{"docid": "0", "title": "A", "text": "a"}],
         "negative_passages": [{"docid": "1", "title": "-", "text": "b"}]}
CORPUS = "0\tThe Manhattan Project was a research project.\n1\tAn essay about it.\n"
STAND_INS = {   # file name → content (a .gz name is written gzipped)
    "collection.tsv": CORPUS,
    "para.txt": CORPUS,
    "para.title.txt": "0\tManhattan Project\n1\t-\n",
    "queries.train.tsv": "3\twhat is a\n",
    "queries.dev.small.tsv": "7\tmanhattan project\n",
    "msmarco-test2019-queries.tsv": "19\twho made the bomb\n",
    "msmarco-test2019-queries.tsv.gz": "19\twho made the bomb\n",
    "msmarco-test2020-queries.tsv.gz": "20\twhat is an essay\n",
    "qrels.train.tsv": "3\t0\t0\t1\n",
    "qrels.dev.small.tsv": "7\t0\t0\t1\n",
    "2019qrels-pass.txt": "19 0 0 3\n19 0 1 0\n",
    "2020qrels-pass.txt": "20 0 1 2\n",
    "train.jsonl": json.dumps(GROUP) + "\n",
    "train.jsonl.gz": json.dumps(GROUP) + "\n",
    "corpus.jsonl.gz": "".join(json.dumps({"docid": str(i), "title": "-", "text": t}) + "\n"
                               for i, t in enumerate(["a", "b"])),
}


def data_commands() -> list[tuple[int, list[str]]]:
    """``(line, words after pretrieve)`` of every ``pretrieve data`` command in the shell blocks of docs/data.md (the
    commands a reader copies; the prose's code spans name commands, e.g. ``pretrieve data download NAME``)."""
    found = []
    in_block = {line for line, _ in quoted_commands(DOC)} - _prose_lines()
    for line, text in quoted_commands(DOC):
        words = pretrieve_words(text)
        if line in in_block and words and words[0] == "data":
            found.append((line, words))
    return found


def _prose_lines() -> set[int]:
    lines, inside = set(), False
    for number, text in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        if text.lstrip().startswith("```"):
            inside = not inside
        elif not inside:
            lines.add(number)
    return lines


def _refused(result, *needles: str) -> bool:
    """A command refused with a one-line InputError (the CLI prints it and exits 2) naming ``needles``."""
    message = str(result.exception or "")
    return isinstance(result.exception, InputError) and "\n" not in message and all(n in message for n in needles)


def test_the_page_shows_the_commands_this_test_runs():
    kinds = {words[1] for _, words in data_commands()}
    assert {"convert", "check", "list", "download"} <= kinds


@pytest.mark.parametrize("line,words", data_commands(), ids=lambda value: str(value))
def test_every_data_command_of_the_page_runs(line, words, tmp_path, monkeypatch):
    isolated_data_root(tmp_path, monkeypatch)
    monkeypatch.setenv("PRETRIEVE_OFFLINE", "1")
    work = tmp_path / "work"
    for name, text in STAND_INS.items():
        (work / name).write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    if "--ir-datasets" in words:
        pytest.skip("ir_datasets downloads its files (tests/test_convert.py runs the converter on a stub)")
    runner = CliRunner()
    env = {**os.environ, "COLUMNS": "300"}
    if words[1] == "check":   # the page checks what an earlier command converted: convert the stand-ins first
        target = words[2]
        if "/" in target:
            setup = ["data", "convert", target, "--corpus", "para.txt", "--titles", "para.title.txt",
                     "--queries", "queries.dev.small.tsv", "--qrels", "dev=qrels.dev.small.tsv"]
            assert runner.invoke(app, setup, env=env).exit_code == 0
        else:   # a name: the registry's collection, offline here — one line naming the files to fetch by hand
            assert _refused(runner.invoke(app, words, env=env), "fetch by hand into")
            return
    result = runner.invoke(app, words, env=env)
    command = f"docs/data.md:{line}: pretrieve {shlex.join(words)}"
    if words[1] == "download":
        from pretrieve.data.hub import hub_source

        # offline: a registry name names the files to fetch by hand; a Hub or ir_datasets name, the fetch to run once
        needles = ("with network",) if hub_source(words[2]) is not None else ("offline mode", "fetch by hand into")
        assert _refused(result, *needles), command
        return
    assert result.exit_code == 0, f"{command}\n{result.output}"
    if words[1] == "convert":
        out = work / words[2]
        assert (out / "corpus.jsonl").is_file() or (out / "groups").is_dir() or (out / "queries.jsonl").is_file()
        if "--titles" in words:
            first = json.loads((out / "corpus.jsonl").read_text().splitlines()[0])
            assert first["title"] == "Manhattan Project"
        for spec in (w for i, w in enumerate(words) if i and words[i - 1] == "--qrels"):
            assert (out / "qrels" / f"{spec.split('=')[0]}.tsv").is_file(), command
