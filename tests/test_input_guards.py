"""Inputs that used to pass silently get their one-line error (exit 2): runs that share no query given to
``fuse``, a non-finite score in a run, a BM25 run that would be empty because no judged query is in the
queries file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrieve.data.trec import read_run, write_run
from pretrieve.errors import InputError

PRETRIEVE = Path(sys.executable).with_name("pretrieve")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "500"}
    return subprocess.run([str(PRETRIEVE), *args], capture_output=True, text=True, env=env, timeout=300)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def _run_file(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_fuse_refuses_runs_that_share_no_query_unless_allowed(tmp_path):
    first = _run_file(tmp_path / "a.trec", ["q1 Q0 d1 1 2.0 a", "q1 Q0 d2 2 1.0 a"])
    second = _run_file(tmp_path / "b.trec", ["q9 Q0 d1 1 3.0 b"])
    refused = run_cli("fuse", str(first), str(second), "--out", str(tmp_path / "fused.trec"))
    assert_one_line_error(refused, "share no query", "--allow-disjoint")
    assert not (tmp_path / "fused.trec").exists()
    allowed = run_cli("fuse", str(first), str(second), "--out", str(tmp_path / "fused.trec"), "--allow-disjoint")
    assert allowed.returncode == 0, allowed.stderr
    assert set(read_run(tmp_path / "fused.trec")) == {"q1", "q9"}


def test_fuse_notes_queries_a_run_lacks(tmp_path):
    first = _run_file(tmp_path / "a.trec", ["q1 Q0 d1 1 2.0 a", "q2 Q0 d2 1 1.0 a"])
    second = _run_file(tmp_path / "b.trec", ["q1 Q0 d1 1 3.0 b"])
    result = run_cli("fuse", str(first), str(second), "--out", str(tmp_path / "fused.trec"))
    assert result.returncode == 0, result.stderr
    assert "no result for 1 of the 2 queries" in " ".join(result.stderr.split())


@pytest.mark.parametrize("score", ["inf", "-inf", "nan"])
def test_a_run_with_a_non_finite_score_is_refused_with_its_line(tmp_path, score):
    path = _run_file(tmp_path / "run.trec", ["q1 Q0 d1 1 2.0 x", f"q1 Q0 d2 2 {score} x"])
    with pytest.raises(InputError) as caught:
        read_run(path)
    message = str(caught.value)
    assert ":2:" in message and "score" in message
    with pytest.raises(InputError, match="finite"):
        write_run({"q1": {"d1": float(score)}}, tmp_path / "out.trec")


def test_bm25_refuses_a_split_whose_judged_queries_are_not_in_the_queries_file(tmp_path):
    root = tmp_path / "c"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"word{i} text"})
                                               + "\n" for i in range(5)))
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "word1"}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq7\td1\t1\n")
    result = run_cli("bm25", "--data", str(root), "--split", "test", "--out", str(tmp_path / "bm25.trec"))
    assert_one_line_error(result, "queries.jsonl", "split 'test'", "empty")
    assert not (tmp_path / "bm25.trec").exists()
