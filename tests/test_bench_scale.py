"""``pretrieve bench scale``: synthetic collections, the kernel's measurement of a child, the extrapolation and a
tiny end-to-end run of the BM25 stages (no model, a few seconds)."""

from __future__ import annotations

import json
import resource
import sys

import pytest
from typer.testing import CliRunner

from pretrieve.bench.scale import (MSMARCO, STAGES, ScaleSettings, extrapolate, measure, stage_commands,
                                   synthetic_collection)
from pretrieve.cli import app
from pretrieve.errors import ConfigError

SENTENCES = [
    "Aspirin lowers the risk of heart attack in older adults.",
    "Vitamin D levels were measured in every patient at baseline.",
    "The trial enrolled two hundred children with mild asthma.",
    "Mutations in this gene cause a rare kidney disease.",
    "Sleep loss impairs memory consolidation in young mice.",
    "Statins reduce cholesterol but may raise blood sugar.",
]


@pytest.fixture()
def source(tmp_path):
    corpus = tmp_path / "source" / "corpus.jsonl"
    corpus.parent.mkdir()
    with open(corpus, "w", encoding="utf-8") as handle:
        for i in range(0, len(SENTENCES), 2):
            handle.write(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(SENTENCES[i:i + 2])}) + "\n")
    return corpus


def _read(path):
    return path.read_bytes()


def test_synthetic_collection_is_deterministic_and_queries_come_from_their_passage(tmp_path, source):
    one = synthetic_collection(source, tmp_path / "a", 50, eval_queries=5, train_queries=10, words=20, seed=3)
    two = synthetic_collection(source, tmp_path / "b", 50, eval_queries=5, train_queries=10, words=20, seed=3)
    other = synthetic_collection(source, tmp_path / "c", 50, eval_queries=5, train_queries=10, words=20, seed=4)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv", "qrels/one.tsv"):
        assert _read(one / name) == _read(two / name)
    assert _read(one / "corpus.jsonl") != _read(other / "corpus.jsonl")
    passages = {d["_id"]: d["text"] for d in map(json.loads, (one / "corpus.jsonl").read_text().splitlines())}
    assert len(passages) == 50 and all(len(text.split()) == 20 for text in passages.values())
    queries = {q["_id"]: q["text"] for q in map(json.loads, (one / "queries.jsonl").read_text().splitlines())}
    assert len(queries) == 15
    judged = [line.split("\t") for split in ("test", "train")
              for line in (one / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]]
    assert len(judged) == 15 and len({doc for _, doc, _ in judged}) == 15
    for qid, doc, _ in judged:
        assert queries[qid] in passages[doc] and 4 <= len(queries[qid].split()) <= 8
    mtime = (one / "corpus.jsonl").stat().st_mtime_ns
    synthetic_collection(source, tmp_path / "a", 50, eval_queries=5, train_queries=10, words=20, seed=3)
    assert (one / "corpus.jsonl").stat().st_mtime_ns == mtime      # current: reused, not rewritten
    with pytest.raises(ConfigError, match="need at least as many passages"):
        synthetic_collection(source, tmp_path / "d", 10, eval_queries=5, train_queries=10)


def test_measure_reads_the_childs_peak_memory_cpu_time_and_exit_code(tmp_path):
    # A child starts as a copy of this process (fork / vfork), so the kernel's peak for it is at least this
    # process's own peak: the child allocates that much and 300 MiB more.
    parent_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = int((parent_mb + 300) * 2**20)
    code = (f"import sys, time\nblock = bytearray({size})\nblock[::4096] = b'x' * len(block[::4096])\n"
            "end = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nsys.exit(3)")
    result = measure([sys.executable, "-c", code], tmp_path / "logs" / "child.log")
    assert result["returncode"] == 3
    assert result["peak_rss_mb"] >= parent_mb + 300
    assert parent_mb + 250 <= result["peak_anon_mb"] <= result["peak_rss_mb"]   # sampled while it ran
    assert result["cpu_s"] >= 0.3 and result["wall_s"] >= result["cpu_s"] * 0.5
    small = measure([sys.executable, "-c", "pass"], tmp_path / "logs" / "small.log")
    assert small["returncode"] == 0 and small["peak_rss_mb"] < parent_mb + 50
    stopped = measure([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "logs" / "slow.log",
                      timeout=1)
    assert stopped["returncode"] != 0 and stopped["wall_s"] < 10
    assert (tmp_path / "logs" / "child.log").read_text().startswith("$ ")


def _run(stage, n, cpu_s, rss, units, fixed_from=None):
    return {"cpu_s": cpu_s, "peak_rss_mb": rss, "returncode": 0, "scales_with": stage, "units": units,
            "fixed_from": fixed_from}


def test_extrapolation_by_hand():
    units_small = {"passages": 1000, "eval_queries": 11, "train_queries": 101, "pairs": 500}
    units_large = {**units_small, "passages": 2000}
    sizes = {
        "1000": {"bm25": _run("passages", 1000, 10.0, 100.0, units_small),
                 "dense-load": _run("passages", 1000, 2.0, 50.0, units_small),
                 "dense-exact": _run("passages*eval_queries", 1000, 12.0, 60.0, units_small, "dense-load"),
                 "teacher": _run("pairs", 1000, 5.0, 80.0, units_small)},
        "2000": {"bm25": _run("passages", 2000, 18.0, 150.0, units_large),
                 "dense-load": _run("passages", 2000, 3.0, 50.0, units_large),
                 "dense-exact": _run("passages*eval_queries", 2000, 23.0, 70.0, units_large, "dense-load"),
                 "teacher": _run("pairs", 2000, 5.0, 80.0, units_large)},
    }
    estimates = extrapolate(sizes)
    n = MSMARCO["passages"]
    # a line through the two sizes: 18 + 0.008 (n - 2000) CPU s; RSS 150 + 0.05 (n - 2000) MB
    assert estimates["bm25"]["cpu_hours"] == pytest.approx(round((18 + 0.008 * (n - 2000)) / 3600, 2))
    assert estimates["bm25"]["peak_rss_gb"] == pytest.approx(round((150 + 0.05 * (n - 2000)) / 1024, 2))
    # fixed part (the one-query stage): 3 + 0.001 (n - 2000); per query: (23 - 3) / 10 = 2 s at 2000,
    # (12 - 2) / 10 = 1 s at 1000 → 2 + 0.001 (n - 2000) per query, times MS MARCO's dev queries
    fixed = 3 + 0.001 * (n - 2000)
    per_query = 2 + 0.001 * (n - 2000)
    expected = (fixed + per_query * MSMARCO["eval_queries"]) / 3600
    assert estimates["dense-exact"]["cpu_hours"] == pytest.approx(round(expected, 2))
    assert estimates["teacher"]["cpu_hours"] == pytest.approx(round(5.0 * MSMARCO["pairs"] / 500 / 3600, 2))
    assert estimates["teacher"]["peak_rss_gb"] == pytest.approx(round(80 / 1024, 2))


def test_every_stage_has_a_command_and_unknown_stages_are_refused(tmp_path):
    settings = ScaleSettings(source="x", out=str(tmp_path))
    stages = stage_commands(tmp_path / "collection", tmp_path / "work", settings, 1000)
    assert [stage.name for stage in stages] == list(STAGES)
    assert all(stage.argv[1:3] == ["-m", "pretrieve"] for stage in stages)
    with pytest.raises(ConfigError, match="unknown stage"):
        ScaleSettings(source="x", out=str(tmp_path), stages=["bm25", "nope"]).check()


def test_cli_bench_scale_bm25_stages_end_to_end(tmp_path, source):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "scale", "--sizes", "60,120", "--source", str(source.parent),
                                      "--out", str(out), "--eval-queries", "5", "--train-queries", "10",
                                      "--stages", "bm25,bm25-load,bm25-search,bm25-negatives"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "scale.json").read_text())
    assert set(data["sizes"]) == {"60", "120"}
    for measured in data["sizes"].values():
        assert list(measured) == ["bm25", "bm25-load", "bm25-search", "bm25-negatives"]
        assert all(m["returncode"] == 0 and m["peak_rss_mb"] > 0 for m in measured.values())
    assert (out / "work-120" / "bm25.trec").exists() and (out / "work-120" / "bm25-groups.jsonl").exists()
    assert set(data["extrapolation"]) == {"bm25", "bm25-load", "bm25-search", "bm25-negatives"}
    assert "Extrapolated to MS MARCO" in (out / "scale.md").read_text()
