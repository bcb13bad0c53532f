"""Every Python block of docs/python.md (and docs/dupmae.md's "Reproduce" example) runs as written, on a tiny random
model standing in for the model aliases and generated collections standing in for ``scifact`` and ``cranfield``."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch

from pretrieve import models

from conftest import isolated_data_root, tiny_bert_config
from test_finetune import write_collection

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tiny_mlm_128(tmp_path_factory, tokenizer) -> Path:
    """A random BertForMaskedLM of splade-tiny's hidden size (128: DupMAE's ``cls:128`` needs it), 1 layer."""
    import torch
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_mlm_128")
    BertForMaskedLM(tiny_bert_config(hidden_size=128, num_hidden_layers=1, intermediate_size=256)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def notebook(tmp_path, monkeypatch, tiny_mlm_dir, tiny_mlm_128) -> Path:
    """The docs' world: ``scifact`` and ``cranfield`` under $PRETRIEVE_DATA (no download possible), ``minilm`` a
    tiny model and ``splade-tiny`` one of its hidden size, a fresh working directory."""
    root = isolated_data_root(tmp_path, monkeypatch)
    write_collection(root / "scifact")
    write_collection(root / "cranfield")
    monkeypatch.setitem(models.OFFLINE_MODELS, "minilm", ("a tiny test model", lambda: tiny_mlm_dir))
    monkeypatch.setitem(models.OFFLINE_MODELS, "splade-tiny", ("a tiny test model", lambda: tiny_mlm_128))
    return tmp_path / "work"


def run_blocks(blocks: list[str], page: str, timed: bool = False) -> dict:
    """Execute ``blocks`` in order in one namespace; ``timed``: print each block's wall and CPU time (user + system,
    this process and its children: what the page states)."""
    namespace: dict = {"__name__": "__docs__"}
    for number, block in enumerate(blocks, start=1):
        wall, cpu = time.perf_counter(), cpu_seconds()
        try:
            exec(compile(block, f"{page}, block {number}", "exec"), namespace)
        except Exception as exc:   # name the block that failed
            raise AssertionError(f"{page}, block {number} failed: {exc!r}\n{block}") from exc
        if timed:
            print(f"{page}, block {number}: {time.perf_counter() - wall:.1f} s wall, {cpu_seconds() - cpu:.1f} s CPU")
    return namespace


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def test_every_block_of_the_python_page_runs(notebook, capsys, monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger(), "handlers", [])   # a notebook's logging: nothing configured (pytest's off)
    blocks = python_blocks("python.md")
    assert len(blocks) >= 5
    namespace = run_blocks(blocks, "python.md")
    table = namespace["table"]
    assert list(table.results) == ["zero-shot", "bm25", "fine-tuned", "fine-tuned + bm25"]
    assert 0.0 <= table.value("fine-tuned + bm25", "nDCG@10") <= 1.0
    told = capsys.readouterr().err   # what the command line says, said in the notebook too
    assert "pretrieve: finetune stage 1: " in told and " precision on cpu" in told
    assert "pretrieve: " in told and "pooling" in told
    assert "pretrieve: retriever minilm: kind=dense pooling=" in told and " device=cpu" in told
    assert namespace["passages"].shape[0] == 2 and namespace["query"].shape == (1, namespace["passages"].shape[1])
    assert set(namespace["mine"]) == {"q1"} and len(namespace["mine"]["q1"]) == 10
    rows = {(row["retriever"], row["collection"]) for row in namespace["results"]["rows"]}
    assert rows == {("bm25", "scifact"), ("zero-shot", "scifact")}
    assert (notebook / "runs" / "recipe" / "recipe.yaml").is_file()


def test_the_dupmae_reproduce_example_runs(notebook):
    blocks = [block for block in python_blocks("dupmae.md") if "pretrieve.finetune" in block]
    assert len(blocks) == 1
    fast = blocks[0].replace("max_steps=100", "max_steps=2")   # the page's budget is minutes; the code is the same
    assert fast != blocks[0]
    namespace = run_blocks([fast], "dupmae.md")
    table = namespace["table"]
    assert list(table.results) == ["cls:128", "ot:128", "cls:64,ot:64", "cls:64,ot:43"]
    assert set(table.comparisons) == {"ot:128", "cls:64,ot:64", "cls:64,ot:43"}


REAL_DOCS = "PRETRIEVE_DOCS_REAL"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(REAL_DOCS), reason=f"minutes on real SciFact: set {REAL_DOCS}=1 to run the page "
                    "as written (CI's docs job; not part of the default suite's time budget)")
def test_the_python_page_ends_better_than_it_began_on_real_scifact(scifact, tmp_path, monkeypatch):
    """The page as written on the real SciFact and all-MiniLM-L6-v2: its last table has the fine-tuned model above
    the off-the-shelf model (nDCG@10, the paired 95% interval above zero), and its fusion with BM25 above both; the
    wall and CPU time of every block, from a cold user cache, are printed (the page states them)."""
    monkeypatch.setenv("PRETRIEVE_DATA", str(scifact.parent))
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))   # cold, as for a new user
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))   # every core, as in a user's notebook (the suite runs on 1)
    started, cpu = time.perf_counter(), cpu_seconds()
    try:
        namespace = run_blocks(python_blocks("python.md"), "python.md", timed=True)
    finally:
        torch.set_num_threads(threads)
    print(f"docs/python.md on real SciFact: {time.perf_counter() - started:.0f} s wall, {cpu_seconds() - cpu:.0f} s CPU")
    table = namespace["table"]
    zero_shot = table.value("zero-shot", "nDCG@10")
    assert zero_shot == pytest.approx(0.6466, abs=0.005)
    assert table.value("fine-tuned", "nDCG@10") > zero_shot
    assert namespace["gain"].ci_low > 0   # the paired 95% interval of the gain excludes zero: not noise
    assert table.value("fine-tuned + bm25", "nDCG@10") > table.value("fine-tuned", "nDCG@10")
