"""`pretrieve dense --no-cache` leaves no corpus index behind (issue 22, item 6): the scratch index it builds
is removed after a success, an error and Ctrl-C, and the one a killed `dense` (kill -9) left is removed by the next
`dense` writing beside it — nothing accumulates in the system's temporary directory or beside the run file. (Without
`--no-cache` the corpus index is kept in the user cache, as `pretrieve.search` keeps it: test_attacks.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pretrieve.cli import app
from pretrieve.data.trec import read_run
from pretrieve.retrieval import search

from test_dense import LEGACY_MEAN, make_st_checkpoint
from test_finetune import write_collection


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("scratch")
    return write_collection(root / "tiny"), make_st_checkpoint(root / "model", tiny_bert_dir, pooling=LEGACY_MEAN)


@pytest.fixture()
def system_tmp(tmp_path, monkeypatch) -> Path:
    """The system's temporary directory, for this test (and the commands it starts) alone."""
    path = tmp_path / "system-tmp"
    path.mkdir()
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def _dense(setup, out: Path) -> list[str]:
    data, model = setup
    return ["dense", "--model", str(model), "--data", str(data), "--out", str(out), "--k", "5", "--device", "cpu",
            "--no-cache"]


def _scratch(*directories: Path) -> list[str]:
    """Index scratch directories (whatever their name) and index shards left in ``directories``."""
    return [str(p) for d in directories for p in d.rglob("*") if "index" in p.name or p.name.startswith("shard-")]


def test_the_scratch_index_is_removed_after_success_error_and_ctrl_c(setup, system_tmp, tmp_path, monkeypatch):
    out = tmp_path / "runs" / "dense.trec"
    result = CliRunner().invoke(app, _dense(setup, out))
    assert result.exit_code == 0, result.output
    assert len(read_run(out)) == 4
    assert _scratch(system_tmp, out.parent) == []
    built = []
    original = search.build_index

    def build_then_fail(exc):
        def build(*args, **kwargs):
            built.append(original(*args, **kwargs))
            raise exc
        return build

    for exc in (RuntimeError("the search failed"), KeyboardInterrupt()):
        monkeypatch.setattr(search, "build_index", build_then_fail(exc))
        result = CliRunner().invoke(app, _dense(setup, tmp_path / "runs" / "again.trec"))
        assert result.exit_code == (130 if isinstance(exc, KeyboardInterrupt) else 1), result.output
        assert _scratch(system_tmp, out.parent) == []
    assert len(built) == 2   # the index was written each time, then removed


def test_a_killed_dense_leaves_nothing_the_next_one_does_not_remove(setup, system_tmp, tmp_path):
    out = tmp_path / "runs" / "dense.trec"
    killed = ("import os, signal, sys; from pretrieve.retrieval import search; original = search.build_index\n"
              "def build(*args, **kwargs):\n"
              "    original(*args, **kwargs); os.kill(os.getpid(), signal.SIGKILL)\n"
              "search.build_index = build; from pretrieve.cli import main; sys.argv[1:] = sys.argv[2:]; main()\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(system_tmp)}
    result = subprocess.run([sys.executable, "-c", killed, "pretrieve", *_dense(setup, out)], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    left = [Path(p) for p in _scratch(system_tmp, out.parent)]
    assert left, "the killed command wrote its index somewhere else"
    for path in left:   # older than the next command (run here, in this older process)
        os.utime(path, (path.stat().st_atime - 3600, path.stat().st_mtime - 3600), follow_symlinks=False)
    result = CliRunner().invoke(app, _dense(setup, out))
    assert result.exit_code == 0, result.output
    assert _scratch(system_tmp, out.parent) == []
    assert len(read_run(out)) == 4


def test_dense_keeps_the_corpus_index_in_the_user_cache_as_search_does(setup, tmp_path, monkeypatch):
    """Without --cache, `dense` encodes the corpus into the user cache, where `pretrieve.search` finds it: a second
    `dense` and a `search` of the same model and corpus encode no passage (issue 53)."""
    import pretrieve

    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "user-cache"))
    args = [arg for arg in _dense(setup, tmp_path / "first.trec") if arg != "--no-cache"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "user-cache").rglob("shard-0-of-1"))

    def no_encoding(*args, **kwargs):
        raise AssertionError("the corpus was encoded again")

    monkeypatch.setattr(search, "encode_windows", no_encoding)
    result = CliRunner().invoke(app, [arg if arg != str(tmp_path / "first.trec") else str(tmp_path / "second.trec")
                                      for arg in args])
    assert result.exit_code == 0, result.output
    assert read_run(tmp_path / "second.trec") == read_run(tmp_path / "first.trec")
    data, model = setup
    assert pretrieve.search(str(model), data, k=5, show_progress=False) == read_run(tmp_path / "first.trec")
