"""One writer per output directory, and output locations checked before the work: a second `pretrain`/`run` on
the same --out exits 2 naming the first's PID while the first finishes untouched; a non-writable output, a file
in place of the directory, a parent that is a file and a file-size limit are one-line errors, exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from pretrieve.errors import InputError, OutputBusyError
from pretrieve.outputs import LOCK_FILE, DirectoryLock, check_writable, writing
from pretrieve.train.loop import read_logs

from test_finetune import write_collection


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pretrieve", *args]


def _env() -> dict[str, str]:
    # no .pyc writes: under `ulimit -f` they would raise SIGXFSZ before pretrieve can ignore it
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300", "PYTHONDONTWRITEBYTECODE": "1"}


def _cli(*args: str, prefix: str = "") -> subprocess.CompletedProcess:
    if prefix:
        command = ["bash", "-c", prefix + " exec " + " ".join(f"'{a}'" for a in _command(*args))]
    else:
        command = _command(*args)
    return subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)


def _one_error_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = "retrieval dense passage encoder query document ranking vector index token model training".split()
    lines = [" ".join(words[(i * 5 + j) % len(words)] for j in range(10 + i % 7)) + "." for i in range(64)]
    path = tmp_path_factory.mktemp("corpus") / "passages.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _pretrain_args(model: Path, corpus: Path, out: Path, steps: int = 8) -> list[str]:
    return ["pretrain", "--model", str(model), "--corpus", str(corpus), "--out", str(out), "--method", "mlm",
            "--max-len", "32", "--batch-size", "4", "--steps", str(steps), "--lr", "5e-4", "--warmup-ratio", "0",
            "--save-every", "4", "--log-every", "1"]


def _wait_for_lock(out: Path, process: subprocess.Popen, timeout: float = 240) -> None:
    """Until ``process`` holds the lock of ``out`` (its PID is in the lock file)."""
    deadline = time.monotonic() + timeout
    lock = out / LOCK_FILE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the first writer ended early: {process.stderr.read()[-2000:]}")
        if lock.exists() and f"pid {process.pid} " in lock.read_text():
            return
        time.sleep(0.05)
    raise AssertionError("the first writer never took the lock")


def test_a_second_pretrain_on_the_same_out_exits_2_naming_the_first_pid(tiny_mlm_dir, corpus, tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(_command(*_pretrain_args(tiny_mlm_dir, corpus, out)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for_lock(out, first)
        os.kill(first.pid, signal.SIGSTOP)        # the first writer holds the lock, frozen mid-run
        second = _cli(*_pretrain_args(tiny_mlm_dir, corpus, out))
        os.kill(first.pid, signal.SIGCONT)
        _one_error_line(second, f"PID {first.pid}", str(out), "another pretrieve process")
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert [row["step"] for row in read_logs(out)] == list(range(1, 9))      # one writer: no interleaved log
    assert (out / "final" / "model.safetensors").exists()


def test_a_second_recipe_run_on_the_same_out_exits_2(tiny_mlm_dir, tmp_path):
    data = write_collection(tmp_path / "tiny")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "out": str(tmp_path / "out"), "model": str(tiny_mlm_dir), "data": str(data),
        "stages": [{"finetune": {"stage": 1, "max_steps": 3, "batch_size": 4, "num_negatives": 2,
                                 "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20}},
                   {"evaluate": {"split": "test", "depth": 20}}]}))
    with DirectoryLock(tmp_path / "out"):                   # held by this process, as a running `run` would
        second = _cli("run", str(recipe), "--no-progress")
    _one_error_line(second, f"PID {os.getpid()}", "being written by another pretrieve process")
    assert not (tmp_path / "out" / "finetune-s1").exists()


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pretrieve.outputs import DirectoryLock; "
                               f"lock = DirectoryLock({str(tmp_path)!r}); lock.acquire(); print('locked', flush=True); "
                               "time.sleep(300)"], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputBusyError, match=f"PID {holder.pid} "):
            DirectoryLock(tmp_path).acquire()
        holder.kill()                               # kill -9: no clean-up code runs
        holder.wait(timeout=60)
        with DirectoryLock(tmp_path):
            assert f"pid {os.getpid()} " in (tmp_path / LOCK_FILE).read_text()
    finally:
        if holder.poll() is None:
            holder.kill()


# ------------------------------------------------------------------------------------------ preflight
def _unwritable_dir() -> Path:
    """A directory this process cannot create files in (root ignores permission bits: use /sys/kernel there)."""
    if os.geteuid() != 0:
        path = Path(tempfile.mkdtemp(prefix="pretrieve-ro-"))
        path.chmod(0o555)
        return path
    candidate = Path("/sys/kernel")
    try:
        fd, name = tempfile.mkstemp(dir=candidate)
    except OSError:
        return candidate
    os.close(fd)
    os.unlink(name)
    pytest.skip("no unwritable directory available to root here")


def test_unusable_output_locations_are_one_line_errors_before_any_work(tiny_mlm_dir, corpus, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    unwritable = _unwritable_dir()
    cases = [(a_file, "exists and is not a directory"),
             (a_file / "out", f"{a_file} is a file, not a directory"),
             (unwritable / "pretrieve-out", "cannot write here")]
    for out, needle in cases:
        with pytest.raises(InputError) as error:
            check_writable(out)
        assert needle in str(error.value)
    # end to end: exit 2 and one line, and nothing tokenized or trained (the cache would sit beside --out)
    result = _cli(*_pretrain_args(tiny_mlm_dir, corpus, a_file))
    _one_error_line(result, "exists and is not a directory")
    result = _cli(*_pretrain_args(tiny_mlm_dir, corpus, unwritable / "pretrieve-out"))
    _one_error_line(result, "cannot write here")
    assert "tokenizing" not in result.stderr and "pretrain mlm" not in result.stderr


def test_a_file_size_limit_is_caught_before_training_and_while_writing(tiny_mlm_dir, corpus, tmp_path):
    out = tmp_path / "run"
    result = _cli(*_pretrain_args(tiny_mlm_dir, corpus, out), prefix="ulimit -f 2048;")   # 2 MB: the weights are 4
    _one_error_line(result, "file-size limit (ulimit -f")
    assert "pretrain mlm" not in result.stderr and not (out / "cache").exists()
    # a limit no estimate foresees (a groups file beyond 1 KB): SIGXFSZ is ignored, EFBIG is the one-line error
    data = write_collection(tmp_path / "tiny")
    result = _cli("mine", "--bm25", "--data", str(data), "--depth", "20", "--out", str(tmp_path / "groups.jsonl"),
                  prefix="ulimit -f 1;")
    _one_error_line(result, "File too large", "ulimit -f")


def test_a_failed_command_leaves_no_empty_output_directory(tmp_path):
    out = tmp_path / "new" / "deeper"
    with pytest.raises(RuntimeError):
        with writing(out):
            (out / "cache").mkdir()
            raise RuntimeError("failed before writing anything")
    assert not (tmp_path / "new").exists()
