"""`bm25`, `dense`, `encode` and `search` check their outputs before the work (issue 22, items 5 and 6): a directory
where the run file goes, an unwritable place, a file-size limit or a disk too small for the index is one `error:`
line naming the user's path, exit 2, before anything is built or encoded; a write that fails anyway is reported the
same way (not numpy's "N requested and M written"); leftovers of killed runs (a BM25 index beside the run, a
half-written index shard) are removed by the next run, those of running processes never. `fuse --out` and
`evaluate --json/--md` check their files first too, and a full disk while writing them names the file (issue 39)."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest

from pretrieve import outputs

from test_finetune import write_collection
from test_locks import _unwritable_dir

Usage = namedtuple("Usage", "total used free")


def _cli(*args: str, limit_kb: int | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pretrieve", *args]
    if limit_kb is not None:
        command = ["bash", "-c", f"ulimit -f {limit_kb}; exec " + " ".join(f"'{a}'" for a in command)]
    # no .pyc writes: under `ulimit -f` they would raise SIGXFSZ before pretrieve can ignore it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def _error_line(stderr: str, code: int, *needles: str) -> str:
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr and "requested and" not in stderr and ".tmp" not in stderr, stderr[-2000:]
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """A collection whose BM25 index has a score array of ~400 KB (3,000 documents of 60 distinct words)."""
    root = write_collection(tmp_path_factory.mktemp("wide") / "wide")
    rng = random.Random(0)
    vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7)) for _ in range(20000)]
    with open(root / "corpus.jsonl", "a", encoding="utf-8") as handle:
        for i in range(3000):
            handle.write(json.dumps({"_id": f"w{i}", "title": "", "text": " ".join(rng.sample(vocabulary, 60))}) + "\n")
    return root


def _held_old(path: Path) -> None:
    """Make ``path`` look like a leftover: last modified long before any process of the test started."""
    past = time.time() - 3600
    os.utime(path, (past, past))


# ------------------------------------------------------------------------------------------ bm25
def test_bm25_output_problems_are_one_line_naming_the_users_path(tmp_path):
    data = write_collection(tmp_path / "tiny")
    existing = tmp_path / "existing"
    existing.mkdir()
    result = _cli("bm25", "--data", str(data), "--out", str(existing))
    _error_line(result.stderr, result.returncode, f"{existing}: is a directory")
    unwritable = _unwritable_dir()
    result = _cli("bm25", "--data", str(data), "--out", str(unwritable / "run.trec"))
    _error_line(result.stderr, result.returncode, f"{unwritable / 'run.trec'}: cannot write here")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = _cli("bm25", "--data", str(data), "--out", str(tmp_path / "run.trec"), "--index", str(a_file))
    _error_line(result.stderr, result.returncode, f"{a_file}: exists and is not a directory")
    assert not (tmp_path / "run.trec").exists()


def test_bm25_under_a_file_size_limit_fails_early_or_names_the_run(wide, tmp_path):
    out = tmp_path / "runs" / "bm25.trec"
    out.parent.mkdir()
    began = time.perf_counter()
    early = _cli("bm25", "--data", str(wide), "--out", str(out), limit_kb=100)
    _error_line(early.stderr, early.returncode, str(out), "file-size limit (ulimit -f")
    assert "BM25" not in early.stderr      # no progress of an index build
    # a limit above the preflight's (conservative) estimate but below the real index: the write fails, one line
    late = _cli("bm25", "--data", str(wide), "--out", str(out), limit_kb=300)
    _error_line(late.stderr, late.returncode, f"{out}: could not be written", "ulimit -f")
    index = tmp_path / "index"
    late = _cli("bm25", "--data", str(wide), "--out", str(out), "--index", str(index), limit_kb=300)
    _error_line(late.stderr, late.returncode, f"{index}: could not be written", "ulimit -f")
    assert sorted(p.name for p in out.parent.iterdir()) == [] and not index.exists()   # nothing left behind
    assert time.perf_counter() - began < 600


def test_a_killed_bm25_leaves_an_index_the_next_run_removes(wide, tmp_path):
    out = tmp_path / "bm25.trec"
    command = [sys.executable, "-m", "pretrieve", "bm25", "--data", str(wide), "--out", str(out)]
    killed = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob(".pretrieve-bm25*")) and time.monotonic() < deadline:
            assert killed.poll() is None, "bm25 ended before it was killed"
            time.sleep(0.02)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
    leftovers = list(tmp_path.glob(".pretrieve-bm25*"))
    assert leftovers and not out.exists()
    time.sleep(2)   # leftovers are what is older than the next process, whose start time is known to ~1 s
    result = _cli("bm25", "--data", str(write_collection(tmp_path / "tiny")), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ------------------------------------------------------------------------------------------ leftovers
HOLDER = """
import sys, time
from pathlib import Path
from pretrieve.io_utils import atomic_dir
with atomic_dir(Path(sys.argv[1])) as tmp:
    (tmp / "embeddings.npy").write_bytes(b"partial")
    print(tmp, flush=True)
    time.sleep(300)
"""


def test_only_the_leftovers_of_dead_writers_are_removed(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(index / "shard-1-of-2")], stdout=subprocess.PIPE,
                              text=True)
    try:
        live = Path(holder.stdout.readline().strip())
        assert live.name.startswith(".shard-1-of-2.") and live.is_dir()
        _held_old(live)
        cleaner = [sys.executable, "-c",
                   f"from pretrieve.outputs import remove_leftovers; remove_leftovers({str(index)!r})"]
        subprocess.run(cleaner, check=True, timeout=120)
        assert live.is_dir(), "the temporary of a running writer (another shard) was removed"
        holder.kill()                          # kill -9: its temporary is now a leftover
        holder.wait(timeout=60)
        subprocess.run(cleaner, check=True, timeout=120)
        assert not live.exists()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_encode_removes_a_killed_encodes_shard_and_dense_a_killed_runs_temporary(minilm, tmp_path, capsys,
                                                                                  monkeypatch):
    data = write_collection(tmp_path / "tiny")
    index = tmp_path / "index"
    leftover = index / ".shard-0-of-1.x7k2q9.tmp"             # what a killed encode leaves (atomic_dir's name)
    leftover.mkdir(parents=True)
    (leftover / "embeddings.npy").write_bytes(b"partial")
    run_leftover = tmp_path / ".dense.trec.abc123.tmp"
    run_leftover.write_text("q1 Q0 d1 1 1.0 x\n")
    for path in (leftover, run_leftover):
        _held_old(path)
    code, err = _main(capsys, monkeypatch, "encode", "--model", str(minilm), "--data", str(data), "--out", str(index))
    assert code == 0, err
    assert sorted(p.name for p in index.iterdir()) == ["shard-0-of-1"]
    code, err = _main(capsys, monkeypatch, "dense", "--model", str(minilm), "--data", str(data), "--out",
                      str(tmp_path / "dense.trec"), "--cache", str(index))
    assert code == 0, err
    assert not run_leftover.exists()


# ------------------------------------------------------------------------------------------ dense / encode
def _small_disk(monkeypatch, free: int) -> None:
    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda path: Usage(1 << 40, (1 << 40) - free, free))


def test_dense_and_encode_into_a_full_disk_fail_before_encoding(minilm, tmp_path, capsys, monkeypatch):
    import pretrieve.retrieval.search as search

    data = write_collection(tmp_path / "tiny")
    existing = tmp_path / "existing"
    existing.mkdir()
    code, err = _main(capsys, monkeypatch, "dense", "--model", str(minilm), "--data", str(data), "--out", str(existing))
    _error_line(err, code, f"{existing}: is a directory")
    assert "retriever" not in err                          # refused before the model was loaded

    def never(*args, **kwargs):
        raise AssertionError("encoding started")

    monkeypatch.setattr(search, "build_index", never)
    monkeypatch.setattr(search, "encode_corpus", never)
    _small_disk(monkeypatch, 10_000)   # room for the run (4 queries × 40 lines), not for 40 × 384 float32 vectors
    cache = tmp_path / "cache"
    code, err = _main(capsys, monkeypatch, "dense", "--model", str(minilm), "--data", str(data), "--out",
                      str(tmp_path / "run.trec"), "--cache", str(cache))
    _error_line(err, code, f"{cache}: only 9.8 KB free", "writes about 60.0 KB")
    code, err = _main(capsys, monkeypatch, "dense", "--model", str(minilm), "--data", str(data), "--out",
                      str(tmp_path / "run.trec"))
    _error_line(err, code, "only 9.8 KB free")
    code, err = _main(capsys, monkeypatch, "encode", "--model", str(minilm), "--data", str(data), "--out",
                      str(tmp_path / "index"))
    _error_line(err, code, f"{tmp_path / 'index'}: only 9.8 KB free")
    assert not (tmp_path / "run.trec").exists() and not cache.exists() and not (tmp_path / "index").exists()


def test_a_short_write_names_the_users_path(tmp_path):
    from pretrieve.errors import InputError

    with pytest.raises(InputError) as caught:
        with outputs.write_failures(tmp_path / "run.trec"):
            raise OSError("149400 requested and 12768 written")
    assert str(caught.value).startswith(f"{tmp_path / 'run.trec'}: could not be written: ")
    with pytest.raises(InputError, match="no space left"):
        with outputs.write_failures(tmp_path / "run.trec"):
            raise OSError(28, "No space left on device", str(tmp_path / ".run.trec.x.tmp"))
    with pytest.raises(PermissionError):                  # other errors are not disguised
        with outputs.write_failures(tmp_path / "run.trec"):
            raise PermissionError(13, "Permission denied")


def test_a_run_killed_while_encoding_leaves_embeddings_the_next_run_removes(tmp_path):
    """`run` writes under :func:`outputs.writing`, which removes leftovers three levels down: a half-written shard
    of ``OUT/embeddings/<retriever>__<collection>/`` included."""
    embeddings = tmp_path / "out" / "embeddings" / "final__tiny"
    leftover = embeddings / ".shard-0-of-1.ab12cd.tmp"
    leftover.mkdir(parents=True)
    (leftover / "embeddings.npy").write_bytes(b"partial")
    _held_old(leftover)
    with outputs.writing(tmp_path / "out"):
        assert not leftover.exists() and embeddings.is_dir()


# ------------------------------------------------------------------------------- fuse --out, evaluate --json
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")   # a write's error: it names no file


def test_fuse_into_a_full_disk_names_its_out(tmp_path, capsys, monkeypatch):
    from pretrieve.retrieval import fusion

    from test_fusion import tiny_collection

    root = tiny_collection(tmp_path / "c")
    out = tmp_path / "fused.trec"
    monkeypatch.setattr(fusion, "write_fused_run", _no_space)
    code, err = _main(capsys, monkeypatch, "fuse", str(root / "bad-test.trec"), str(root / "good-test.trec"),
                      "--out", str(out))
    _error_line(err, code, str(out), "could not be written", "no space left")
    assert not out.exists()


@pytest.mark.parametrize("option, suffix", [("--json", "e.json"), ("--md", "e.md")])
def test_evaluate_into_a_full_disk_names_the_file(tmp_path, capsys, monkeypatch, option, suffix):
    from pretrieve.evaluation import report

    from test_fusion import tiny_collection

    root = tiny_collection(tmp_path / "c")
    target = tmp_path / suffix
    monkeypatch.setattr(report, "write_json" if option == "--json" else "atomic_open", _no_space)
    code, err = _main(capsys, monkeypatch, "evaluate", "--data", str(root), str(root / "bad-test.trec"),
                      str(root / "good-test.trec"), option, str(target))
    _error_line(err, code, str(target), "could not be written", "no space left")
    assert not target.exists()


def test_fuse_and_evaluate_check_their_outputs_first(tmp_path, capsys, monkeypatch):
    from test_fusion import tiny_collection

    root = tiny_collection(tmp_path / "c")
    runs = [str(root / "bad-test.trec"), str(root / "good-test.trec")]
    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda path: Usage(10**6, 10**6, 0))   # no byte free
    code, err = _main(capsys, monkeypatch, "fuse", *runs, "--out", str(tmp_path / "f.trec"))
    _error_line(err, code, str(tmp_path / "f.trec"), "free")
    directory = tmp_path / "a-directory"
    directory.mkdir()
    code, err = _main(capsys, monkeypatch, "evaluate", "--data", str(root), *runs, "--json", str(directory))
    _error_line(err, code, str(directory), "is a directory")
