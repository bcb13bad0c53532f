"""``scripts/gpu-claims.sh``: claims cells on a lent GPU, run detached so that they outlive one device call.

Checked here on a throw-away repository with a stand-in Python (no GPU, no pip, no comparison: the stand-in
``python -m pretrieve`` writes one record the way the harness would and says so in its log): one start runs each
named tier (``+`` separates them, each with its options) from a clone of HEAD, with the committed records copied in;
the records are packed under ``$OUT`` while it watches; ``--watch`` watches again; a second start is refused while
a run goes on; ``--land`` commits exactly the new records, naming the tiers and the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from test_claims_script import script_repo

FAKE_PYTHON = r'''#!/usr/bin/env bash
case "$1 $2" in
  "-m pip") exit 0 ;;
  "-m pretrieve")
    records="" prev="" cells=""
    for a in "$@"; do
      [ "$prev" = "--records" ] && records=$a; [ "$prev" = "--cells" ] && cells=$a; prev=$a
    done
    printf '%s\n' "$@" > "$records.args"
    sleep "${FAKE_SECONDS:-0}"
    mkdir -p "$records/cells/none"
    echo '{"status": "done", "machine": {"device": {"type": "cuda", "name": "FakeGPU"}}}' > "$records/cells/none/seed3.json"
    echo "[1/1] none/seed3: done in 1 s"
    exit 0 ;;
esac
[ "$1" = "-c" ] && { echo "torch fake"; exit 0; }
exit 1
'''


@pytest.fixture
def repo(tmp_path):
    repo = script_repo(tmp_path, ["scripts/gpu-claims.sh", "scripts/experiments/claims.sh"],
                       {"results/claims/tier1/select/point.json": '{"status": "done"}\n',   # a committed record
                        ".gitignore": ".gpu/\ngpu-claims-out/\n"})
    (repo / ".gpu" / "wheels").mkdir(parents=True)
    (repo / ".gpu" / "wheels" / "stand_in-0.1-py3-none-any.whl").write_bytes(b"")
    (repo / ".gpu" / "data" / "scifact").mkdir(parents=True)
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return repo, python


def _gpu_claims(repo: Path, python: Path, tmp_path: Path, *args: str, seconds: int = 0, watch: int = 30,
                out: str = "out") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": str(python), "OUT": str(tmp_path / out), "STATE": str(tmp_path / "state"),
           "CLAIMS_WATCH_SECONDS": str(watch), "FAKE_SECONDS": str(seconds), "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(repo / "scripts" / "gpu-claims.sh"), *args], cwd=str(repo), env=env,
                          capture_output=True, text=True, timeout=120)


def test_tiers_run_detached_from_a_clone_and_their_new_records_land(repo, tmp_path):
    repo, python = repo
    started = _gpu_claims(repo, python, tmp_path, "tier1", "--cells", "none:3", "+", "tier2d", "--jobs", "4")
    assert started.returncode == 0, started.stdout + started.stderr
    state = tmp_path / "state"
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert f"code: {head}" in started.stdout and "warning" not in started.stdout     # a clone of HEAD runs
    for tier in ("tier1", "tier2d"):
        assert f"{tier} ended: [1/1] none/seed3: done in 1 s" in started.stdout
        assert (tmp_path / "out" / f"claims-{tier}.log").read_text().strip() == "[1/1] none/seed3: done in 1 s"
    tier1_args = (state / "results" / "claims" / "tier1.args").read_text().splitlines()
    tier2d_args = (state / "results" / "claims" / "tier2d.args").read_text().splitlines()
    assert tier1_args[tier1_args.index("--cells") + 1] == "none:3" and "--cells" not in tier2d_args
    assert tier2d_args[len(tier2d_args) - 1 - tier2d_args[::-1].index("--jobs") + 1] == "4"   # its own options win
    assert "--no-commit" in tier1_args and str(state / "runs" / "tier1" / "scratch") in tier1_args
    assert "records: 2 new" in started.stdout
    archive = tmp_path / "out" / "records.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"results/claims/tier1/select/point.json", "results/claims/tier1/cells/none/seed3.json",
            "results/claims/tier2d/cells/none/seed3.json"} <= names

    watched = _gpu_claims(repo, python, tmp_path, "--watch", out="out2")    # a later call on the same machine
    assert watched.returncode == 0 and "tier2d ended" in watched.stdout
    assert (tmp_path / "out2" / "records.tgz").exists()

    landed = subprocess.run(["bash", str(repo / "scripts" / "gpu-claims.sh"), "--land", str(archive)], cwd=str(repo),
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
                                 "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"})
    assert landed.returncode == 0, landed.stderr
    assert landed.stdout.split() == ["landed", "results/claims/tier1/cells/none/seed3.json",
                                     "landed", "results/claims/tier2d/cells/none/seed3.json"]
    message = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s"], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert message == "Claims records (tier1,tier2d): 2 records made on a lent GPU (FakeGPU)"
    record = json.loads((repo / "results" / "claims" / "tier2d" / "cells" / "none" / "seed3.json").read_text())
    assert record["machine"]["device"]["name"] == "FakeGPU"
    again = subprocess.run(["bash", str(repo / "scripts" / "gpu-claims.sh"), "--land", str(archive)], cwd=str(repo),
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == "no new records"


def test_the_working_tree_sent_runs_even_where_it_differs_from_its_head(repo, tmp_path):
    repo, python = repo
    script = repo / "scripts" / "experiments" / "claims.sh"
    script.write_text(script.read_text().replace("# The claims benchmark", "# Edited: the claims benchmark", 1))
    started = _gpu_claims(repo, python, tmp_path, "tier1")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "warning: src/ or scripts/ differ from HEAD" in started.stdout
    ran = tmp_path / "state" / "code" / "scripts" / "experiments" / "claims.sh"
    assert ran.read_text() == script.read_text()


def test_a_call_cut_short_leaves_the_run_going_and_a_second_start_is_refused(repo, tmp_path):
    repo, python = repo
    first = _gpu_claims(repo, python, tmp_path, "tier1", seconds=20, watch=1)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "tier1 goes on" in first.stdout and "records: 0 new" in first.stdout
    pid = int((tmp_path / "state" / "runs" / "tier1" / "run.pid").read_text())
    try:
        second = _gpu_claims(repo, python, tmp_path, "tier1", out="out2")
        assert second.returncode == 2 and "runs are going on this machine (tier1)" in second.stdout
    finally:
        os.killpg(pid, 9)
