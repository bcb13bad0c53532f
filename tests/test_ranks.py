"""Several ranks (:mod:`pretrieve.ranks`): slices, split-and-merge through the freshness contract, a failed or killed
rank named in one line instead of a hang, and a recipe under ``torchrun --nproc_per_node 2`` (gloo, CPU) writing the
very files of one process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_utils import free_port, run_distributed
from pretrieve import artifacts, ranks

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------------ slices
def test_slices_are_contiguous_cover_everything_and_may_be_empty():
    for count, world in ((10, 3), (7, 2), (1, 4), (0, 2), (100, 8)):
        slices = [ranks.bounds(count, r, world) for r in range(world)]
        assert slices[0][0] == 0 and slices[-1][1] == count
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
        assert max(b - a for a, b in slices) - min(b - a for a, b in slices) <= 1
    assert [ranks.bounds(1, r, 3) for r in range(3)] == [(0, 0), (0, 0), (0, 1)]   # more ranks than items


def test_slices_in_units_keep_whole_blocks():
    # 25 items in blocks of 8 (a single process works block by block): ranks get whole blocks, the last one short
    assert [ranks.bounds(25, r, 2, unit=8) for r in range(2)] == [(0, 16), (16, 25)]
    assert [ranks.bounds(5, r, 2, unit=8) for r in range(2)] == [(0, 0), (0, 5)]
    assert ranks.bounds(5, unit=8) == (0, 5)   # one process


def test_a_single_process_writes_directly_and_records(tmp_path):
    out = tmp_path / "lines.txt"

    def write(start, end, paths):
        paths[0].write_text("".join(f"{i}\n" for i in range(start, end)))
        return end - start

    assert ranks.split_files([(out, "run", {"n": 5}, {})], 5, write, "write") == [5]
    assert out.read_text() == "0\n1\n2\n3\n4\n" and artifacts.is_current(out, {"n": 5}, {}, kind="run")


def _split_worker(rank: int, world: int, out: str, count: int) -> dict:
    ranks.init(1)

    def write(start, end, paths):
        paths[0].write_text("".join(f"line {i}\n" for i in range(start, end)))
        return (rank, start, end)

    parts = ranks.split_files([(Path(out), "run", {"count": count}, {})], count, write, "write lines")
    return {"parts": parts, "text": Path(out).read_text(), "current": artifacts.is_current(out, {"count": count}, {},
                                                                                            kind="run")}


@pytest.mark.parametrize("count", [7, 1])
def test_two_ranks_write_parts_and_rank0_merges_them_in_order(tmp_path, count):
    results = run_distributed(_split_worker, world_size=2, args=(str(tmp_path / "out.trec"), count))
    expected = "".join(f"line {i}\n" for i in range(count))
    for result in results:   # every rank sees the merged, recorded file after the call
        assert result["text"] == expected and result["current"]
        assert [part[0] for part in result["parts"]] == [0, 1]
    assert not list(tmp_path.glob(".*.tmp"))   # parts removed


def _bm25_worker(rank: int, world: int, data: str, out: str) -> str:
    from pretrieve.retrieval.runs import bm25_negatives

    ranks.init(1)
    bm25_negatives(data, "train", Path(out) / "groups.jsonl", depth=20, run_out=Path(out) / "bm25.trec")
    return "done"


def test_bm25_negatives_split_by_query_equal_one_process(tmp_path):
    from pretrieve.retrieval.runs import bm25_negatives
    from pretrieve.recipe.fixtures import write_fixture_collection

    write_fixture_collection(tmp_path / "data", ["train"])
    one = tmp_path / "one"
    bm25_negatives(tmp_path / "data", "train", one / "groups.jsonl", depth=20, run_out=one / "bm25.trec")
    run_distributed(_bm25_worker, world_size=2, args=(str(tmp_path / "data"), str(tmp_path / "two")))
    for name in ("groups.jsonl", "bm25.trec"):
        assert (tmp_path / "two" / name).read_bytes() == (one / name).read_bytes(), name


# ------------------------------------------------------------------------------------------------ failures
FAILING_WORKER = """
import sys
from pretrieve import ranks
from pretrieve.errors import InputError, PretrieveError
try:
    ranks.init(float(sys.argv[2]))
    def write(start, end, paths):
        if ranks.rank() == 1:
            raise InputError("corpus.jsonl:3: bad line")
        paths[0].write_text("x\\n")
    ranks.split_files([(sys.argv[1], "run", {}, {})], 4, write, "mine")
except PretrieveError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def _launch(args: list[str], world: int, port: int, **env: str) -> list[subprocess.Popen]:
    """``world`` processes as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), but without an
    agent that would stop the survivors itself: a rank on another node sees its peer vanish exactly like this."""
    return [subprocess.Popen(args, env=_env(RANK=str(r), LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE="1",
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]


def _finish(processes: list[subprocess.Popen], seconds: float) -> list[tuple[int, str]]:
    results = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise AssertionError("a rank hung instead of failing") from None
        results.append((process.returncode, err))
    return results


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_rank_that_raises_stops_the_other_with_one_line_naming_it(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(FAILING_WORKER)
    started = time.monotonic()
    (code0, err0), (code1, err1) = _finish(_launch([PYTHON, str(script), str(tmp_path / "out.trec"), "0.5"], 2,
                                                   free_port()), 60)
    assert time.monotonic() - started < 60
    assert code1 == 2 and code0 == 2
    assert _error_lines(err1) == ["error: corpus.jsonl:3: bad line"]
    assert _error_lines(err0) == ["error: rank 1 of 2 failed in 'mine': InputError: corpus.jsonl:3: bad line "
                                  "(rank 0 stopped at 'mine')"]


def test_a_killed_rank_is_named_by_the_survivor_of_a_recipe_run(tmp_path):
    """``kill -9`` of rank 1 in the middle of a recipe: rank 0 exits 2 with one line naming rank 1, well within the
    timeout (the dead peer's closed connections are seen at once)."""
    args = [PYTHON, "-m", "pretrieve", "run", str(REPO / "configs" / "scifact-cpu.yaml"), "--smoke", "--out",
            str(tmp_path / "out"), "--no-progress", "--dist-timeout-minutes", "1"]
    processes = _launch(args, 2, free_port())
    deadline = time.monotonic() + 120
    seen = ""
    while "stage 2/" not in seen:   # rank 1 is inside a stage (stage 2 trains: its collectives need rank 1)
        assert time.monotonic() < deadline and processes[1].poll() is None, seen[-2000:]
        seen += processes[1].stderr.readline()
    processes[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    (code0, err0), _ = _finish(processes, 90)
    assert code0 == 2, err0[-3000:]
    lines = _error_lines(err0)
    assert len(lines) == 1 and "rank 1 of 2" in lines[0], err0[-3000:]
    assert "Traceback" not in err0
    assert time.monotonic() - killed < 60


# ------------------------------------------------------------------------------------------------ a whole recipe
TRAINING = ("pretrain", "finetune-s1", "finetune-s2", "reranker", "finetune-s3", "smoke-models", "smoke-data")


def test_a_recipe_under_torchrun_writes_the_files_of_one_process(tmp_path, scifact, cranfield, tokenizer):
    """The smoke recipe once in one process; then its non-training outputs (every run, the mined and teacher groups,
    the corpus indexes, the results) are removed and the recipe is run again by ``torchrun --nproc_per_node 2``
    (gloo): the training stages are found current — their inputs (the mined / teacher groups, by content) came back
    identical — and every run file and groups file is byte for byte the one process's."""
    recipe = REPO / "configs" / "scifact-cpu.yaml"
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([PYTHON, "-m", "pretrieve", "run", str(recipe), "--smoke", "--out", str(one), "--no-progress"],
                   env=_env(), check=True, capture_output=True, timeout=300)
    shutil.copytree(one, two, symlinks=True)
    for name in ("runs", "embeddings", "bm25-index"):
        shutil.rmtree(two / name, ignore_errors=True)
    for pattern in ("mine/groups.jsonl*", "teacher/groups.jsonl*", "results.*"):
        for path in two.glob(pattern):
            path.unlink()
    finished = {label: artifacts.read_sidecar(two / label / "final")["content"]["sha1"] for label in TRAINING[:5]}
    torchrun = Path(PYTHON).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()), "-m",
                           "pretrieve", "run", str(recipe), "--smoke", "--out", str(two), "--no-progress"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for label, digest in finished.items():   # not trained again: the regenerated groups are the same bytes
        assert artifacts.read_sidecar(two / label / "final")["content"]["sha1"] == digest, label
    files = sorted(p.relative_to(one) for p in (one / "runs").glob("*.trec")) + [Path("mine/groups.jsonl"),
                                                                                  Path("teacher/groups.jsonl")]
    assert len(files) > 10
    for name in files:
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
        assert artifacts.content_problem(two / name, artifacts.read_sidecar(two / name)["content"]) is None   # recorded
    rows_one = json.loads((one / "results.json").read_text())["rows"]
    rows_two = json.loads((two / "results.json").read_text())["rows"]
    assert [{k: v for k, v in row.items() if k != "run"} for row in rows_two] == \
        [{k: v for k, v in row.items() if k != "run"} for row in rows_one]
    # per-rank stage times (seconds, of which waiting for the other rank) in results.json and results.md
    timings = json.loads((two / "results.json").read_text())["rank_timings_s"]
    assert set(timings) == set(json.loads((one / "results.json").read_text())["timings_s"])
    assert all(len(per_rank) == 2 and {"s", "waiting_s"} <= set(per_rank[0]) for per_rank in timings.values())
    assert "| stage | rank 0: s (waiting) | rank 1: s (waiting) |" in (two / "results.md").read_text()
    assert not list(two.rglob(".*.part-*.tmp")) and not list(two.rglob(".rank-parts"))
