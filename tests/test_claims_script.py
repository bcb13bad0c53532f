"""``scripts/experiments/claims.sh TIER --background`` / ``--stop``: a long tier runs in the background from a git
worktree pinned at the checkout's HEAD, in its own process group that outlives the shell, writing records and
scratch into the checkout; a second start is refused while it runs; ``--stop`` ends the whole group.

Run on a throw-away repository holding the script alone, with a stand-in ``pretrieve`` that writes what it was
given and sleeps (no comparison runs here: ``tests/test_bench_quality.py`` runs the harness itself)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "experiments" / "claims.sh"
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org"]


def _wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by whoever adopted it, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):        # gone meanwhile; or no /proc (then os.kill's answer stands)
        return not Path("/proc").is_dir()


def script_repo(tmp_path: Path, scripts: list[str], files: dict[str, str] | None = None) -> Path:
    """A throw-away git repository at ``tmp_path/repo`` holding ``scripts`` (paths relative to the checkout, copied
    from it) and ``files`` (path → text), all committed; skips without git or setsid."""
    if shutil.which("git") is None or shutil.which("setsid") is None:
        pytest.skip("needs git and setsid (util-linux)")
    repo = tmp_path / "repo"
    for name in scripts:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    for name, text in (files or {}).items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-m", "script"], check=True)
    return repo


@pytest.fixture
def repo(tmp_path):
    repo = script_repo(tmp_path, ["scripts/experiments/claims.sh"])
    fake = tmp_path / "fake-pretrieve"
    (tmp_path / "shared" / "data").mkdir(parents=True)          # the collections beside the checkout
    fake.write_text('#!/usr/bin/env bash\n{ pwd; echo "$PYTHONPATH"; echo "$PRETRIEVE_DATA"; printf "%s\\n" "$@"; } '
                    '> "$ARGS_FILE.tmp"\n'
                    'mv "$ARGS_FILE.tmp" "$ARGS_FILE"\nexec sleep 120\n')
    fake.chmod(0o755)
    return repo, fake


def _claims(repo: Path, fake: Path, args_file: Path, *args: str, tier: str = "tier1") -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "PRETRIEVE_DATA"}, "PRETRIEVE": str(fake), "ARGS_FILE": str(args_file), **{
        "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "t@example.org"}}
    return subprocess.run(["bash", str(repo / "scripts" / "experiments" / "claims.sh"), tier, *args],
                          cwd=str(repo), env=env, capture_output=True, text=True, timeout=120)


def test_background_pins_the_code_refuses_a_second_start_and_stops(repo, tmp_path):
    repo, fake = repo
    args_file = tmp_path / "args"
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    started = _claims(repo, fake, args_file, "--background", "--jobs", "1")
    assert started.returncode == 0, started.stderr
    assert f"running tier1 in the background at {head[:7]}" in started.stdout
    pid = int((repo / "outputs" / "claims-tier1.pid").read_text())
    try:
        assert _wait_for(args_file.exists), (repo / "outputs" / "claims-tier1.log").read_text()
        cwd, pythonpath, data, *args = args_file.read_text().splitlines()
        code = repo / "outputs" / "claims-tier1-code"
        assert cwd == str(code) and pythonpath.split(":")[0] == str(code / "src")     # runs the pinned code
        assert data == str(tmp_path / "shared" / "data")        # the worktree is not beside them: named for it
        assert subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() == head
        assert args[:2] == ["bench", "quality"] and args[-2:] == ["--jobs", "1"]      # the caller's options last
        last = {option: args[len(args) - 1 - args[::-1].index(option) + 1] for option in ("--out", "--records")}
        assert last == {"--out": str(repo / "outputs" / "claims-tier1"),                 # records and scratch:
                        "--records": str(repo / "results" / "claims" / "tier1")}         # in the checkout
        assert os.getpgid(pid) == pid != os.getpgid(0)                                # its own process group

        again = _claims(repo, fake, args_file, "--background")
        assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
        assert again.stderr.startswith(f"error: a tier1 run is already running (process group {pid};")
        every = _claims(repo, fake, args_file, "--background", tier="all")          # `all` would run tier1 too
        assert every.returncode == 2 and every.stderr.startswith(f"error: a tier1 run is already running (process "
                                                                 f"group {pid};")
        assert not (repo / "outputs" / "claims-all.pid").exists()
    finally:
        stopped = _claims(repo, fake, args_file, "--stop")
    assert stopped.returncode == 0 and f"stopped the tier1 run (process group {pid})" in stopped.stdout
    assert _wait_for(lambda: not _alive(pid))
    assert _claims(repo, fake, args_file, "--stop").stdout.strip() == "no tier1 run is running"
    if Path("/proc/self/environ").exists():     # a pid file naming another process (a pid reused) is not the run
        other = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            (repo / "outputs" / "claims-tier1.pid").write_text(f"{other.pid}\n")
            assert _claims(repo, fake, args_file, "--stop").stdout.strip() == "no tier1 run is running"
            assert other.poll() is None                                            # left alone
        finally:
            other.kill()
            other.wait()

    # a later start checks out the checkout's new HEAD in the same worktree
    (repo / "scripts" / "note.txt").write_text("later\n")
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-m", "later"], check=True)
    args_file.unlink()
    assert _claims(repo, fake, args_file, "--background").returncode == 0
    try:
        assert _wait_for(args_file.exists)
        assert (repo / "outputs" / "claims-tier1-code" / "scripts" / "note.txt").exists()
    finally:
        _claims(repo, fake, args_file, "--stop")


@pytest.mark.parametrize("tier,expected", [
    ("tier2a", ["--methods", "mlm,bow", "--budget", "6000", "--finetune", "num_negatives=3,lr=0.001,epochs=80"]),
    ("tier2c", ["--methods", "retromae,dupmae", "--finetune",
                "num_negatives=3,representation=dupmae,lr=0.001,epochs=80"]),
    ("tier2d", ["--methods", "cdmae,cdmae-random", "--finetune", "num_negatives=3,lr=0.001,epochs=80"]),
    ("tier3", ["--base", "minilm", "--grid-lr", "1e-5,2e-5,5e-5", "--select-arm", "mlm"]),
])
def test_each_later_tier_runs_its_registered_settings_into_its_own_records(tmp_path, tier, expected):
    """Tiers 2a, 2c and 2d fine-tune with Tier 1's chosen protocol; every tier writes results/claims/<tier>; a
    later option given on the command line wins over the script's."""
    fake = tmp_path / "fake-pretrieve"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_FILE"\n')
    fake.chmod(0o755)
    args_file = tmp_path / "args"
    result = subprocess.run(["bash", str(SCRIPT), tier, "--jobs", "1"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PRETRIEVE": str(fake), "ARGS_FILE": str(args_file)})
    assert result.returncode == 0, result.stderr
    args = args_file.read_text().splitlines()
    for option, value in zip(expected[::2], expected[1::2]):
        assert args[args.index(option) + 1] == value, option
    assert args[args.index("--records") + 1] == f"results/claims/{tier}"
    assert args[args.index("--out") + 1] == f"outputs/claims-{tier}"
    assert args[len(args) - 1 - args[::-1].index("--jobs") + 1] == "1"      # the last --jobs is the caller's


def test_an_unknown_tier_is_refused_in_one_line(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "tier9"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PRETRIEVE": "/bin/false"})
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown tier 'tier9'") and len(result.stderr.strip().splitlines()) == 1


FAKE_BASE_TOOLS = r'''#!/usr/bin/env bash
echo "${OMP_NUM_THREADS:--} $*" >> "$CALLS"
out="" prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out=$a; prev=$a; done
case "$1 $2" in
  "init-model "*) mkdir -p "$out" && touch "$out/config.json" ;;
  "pretrain "*) mkdir -p "$out/final" ;;
  "analyze mlm-accuracy") mkdir -p "$out"
    python3 -c "import json,sys; a=float(sys.argv[1]); print(json.dumps({'accuracy': a, 'gate': {'passed': a >= 0.25}}))" \
      "$FAKE_ACCURACY" > "$out/mlm_accuracy.json" ;;
esac
exit 0
'''


def base_tools_repo(tmp_path: Path, accuracy: float) -> tuple[Path, dict[str, str], Path]:
    """``(repo, env, calls)``: a script repository with Tier 1's pre-training union, run with the stand-in tools of
    :data:`FAKE_BASE_TOOLS` (the base's held-out accuracy: ``accuracy``), which log each call to ``calls``."""
    repo = script_repo(tmp_path, ["scripts/experiments/claims.sh"],
                       {"outputs/claims-tier1/pretrain-data/scifact+cranfield.jsonl":
                        "".join(f'{{"text": "passage {i}"}}\n' for i in range(1, 41))})
    fake = tmp_path / "fake-pretrieve"
    fake.write_text(FAKE_BASE_TOOLS)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PRETRIEVE": str(fake), "CALLS": str(calls), "FAKE_ACCURACY": str(accuracy),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org"}
    env.pop("OMP_NUM_THREADS", None)
    return repo, env, calls


@pytest.mark.parametrize("accuracy,runs", [(0.31, True), (0.2, False)])
def test_tier2b_builds_its_base_once_at_one_thread_and_runs_only_past_the_gate(tmp_path, accuracy, runs):
    repo, env, calls = base_tools_repo(tmp_path, accuracy)
    result = subprocess.run(["bash", "scripts/experiments/claims.sh", "tier2b", "--jobs", "1"], cwd=str(repo), env=env,
                            capture_output=True, text=True, timeout=60)
    lines = calls.read_text().splitlines()
    assert [line.split()[:3] for line in lines[:3]] == [["1", "init-model", "--shape"], ["1", "pretrain", "--method"],
                                                        ["1", "analyze", "mlm-accuracy"]]
    assert "--resume" in lines[1].split() and "--steps 3000 --lr 5e-4" in lines[1]
    heldout = (repo / "outputs" / "scratch-mlm-heldout.jsonl").read_text().splitlines()
    assert heldout == ['{"text": "passage 20"}', '{"text": "passage 40"}']          # every 20th passage held out
    assert len((repo / "outputs" / "scratch-mlm-train.jsonl").read_text().splitlines()) == 38
    if runs:
        assert result.returncode == 0, result.stderr
        quality = lines[3].split()
        assert quality[:3] == ["-", "bench", "quality"]          # the harness sets its own threads
        assert quality[quality.index("--base") + 1] == str(repo / "outputs" / "scratch-bert" / "final")
        assert quality[quality.index("--records") + 1] == "results/claims/tier2b"
        gate = repo / "results" / "claims" / "tier2b" / "gate.json"          # the gate's report, with the records
        assert json.loads(gate.read_text())["accuracy"] == 0.31
        assert subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s"], capture_output=True, text=True,
                              check=True).stdout.startswith("Claims records (tier2b): gate.json")
        again = subprocess.run(["bash", "scripts/experiments/claims.sh", "tier2b"], cwd=str(repo), env=env,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 0
        more = calls.read_text().splitlines()[4:]          # a second run: the base is kept (pretrain finds it current)
        assert [line.split()[1] for line in more] == ["pretrain", "bench"]
        # records elsewhere (a lent GPU's), not committed: the gate's report goes with them
        elsewhere = tmp_path / "gpu-records"
        third = subprocess.run(["bash", "scripts/experiments/claims.sh", "tier2b", "--records", str(elsewhere),
                                "--no-commit"], cwd=str(repo), env=env, capture_output=True, text=True, timeout=60)
        assert third.returncode == 0 and json.loads((elsewhere / "gate.json").read_text())["accuracy"] == 0.31
    else:
        assert result.returncode == 2 and len(lines) == 3                            # no cell runs
        gate = repo / "results" / "claims" / "tier2b" / "gate.json"     # kept: bench claims decides on it alone
        assert json.loads(gate.read_text())["gate"]["passed"] is False
        assert result.stderr.startswith("error: the from-scratch base's held-out MLM accuracy is 0.2 (< 0.25")
        assert len(result.stderr.strip().splitlines()) == 1
        # a failed gate is final (amendment 11): on a new machine (scratch gone) the base is not built again
        shutil.rmtree(repo / "outputs" / "scratch-bert", ignore_errors=True)
        shutil.rmtree(repo / "outputs" / "scratch-init")
        again = subprocess.run(["bash", "scripts/experiments/claims.sh", "tier2b"], cwd=str(repo), env=env,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and len(calls.read_text().splitlines()) == 3       # nothing more was called
        assert again.stderr.startswith("error: the from-scratch base failed its gate")


def test_all_runs_the_tiers_in_the_registered_order_and_goes_on_past_a_failed_one(tmp_path):
    """``claims.sh all``: Tier 1, then 2b, 2c, 2d, 3 and 2a, each into its own records and scratch of the checkout
    (run from elsewhere, by a relative path); Tier 2b's base failing its gate is reported and the sequence goes
    on; the exit code is the failed tier's."""
    repo, env, calls = base_tools_repo(tmp_path, 0.2)
    (tmp_path / "elsewhere").mkdir()
    result = subprocess.run(["bash", "../repo/scripts/experiments/claims.sh", "all", "--jobs", "1"],
                            cwd=str(tmp_path / "elsewhere"), env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "claims.sh tier2b ended with exit code 2; going on with the next tier" in result.stderr
    quality = [line.split()[1:] for line in calls.read_text().splitlines() if line.split()[1:3] == ["bench", "quality"]]

    def last(args, option):
        return args[len(args) - 1 - args[::-1].index(option) + 1]

    assert [Path(last(args, "--records")).name for args in quality] == ["tier1", "tier2c", "tier2d", "tier3", "tier2a"]
    for args in quality:
        tier = Path(last(args, "--records")).name
        assert last(args, "--records") == str(repo / "results" / "claims" / tier)
        assert last(args, "--out") == str(repo / "outputs" / f"claims-{tier}") and last(args, "--jobs") == "1"
    assert [line.split()[1] for line in calls.read_text().splitlines()][1:4] == ["init-model", "pretrain", "analyze"]
    (repo / "results" / "claims" / "tier2d").mkdir(parents=True)
    (repo / "results" / "claims" / "tier2d" / "tier.json").write_text("{}")
    calls.unlink()
    report = subprocess.run(["bash", "scripts/experiments/claims.sh", "all", "--report-only"], cwd=str(repo), env=env,
                            capture_output=True, text=True, timeout=60)          # progress: only begun tiers report
    assert report.returncode == 0 and "== tier1: not started" in report.stdout
    assert "== claims.sh tier2d" in report.stdout and "== tier2d: not started" not in report.stdout
    assert [line.split()[1:3] for line in calls.read_text().splitlines()] == [["bench", "quality"]]
    assert "--report-only" in calls.read_text() and "results/claims/tier2d" in calls.read_text()


def test_decide_gives_bench_claims_every_tier_with_records_and_refuses_none(tmp_path):
    """``claims.sh decide``: ``bench claims`` over the tiers that have a ``tier.json`` (Tier 2b also with its
    base's gate report alone), each under its option, the table to results/claims/claims; the caller's options
    last; with no tier begun, a one-line error and exit code 2."""
    repo = script_repo(tmp_path, ["scripts/experiments/claims.sh"])
    fake = tmp_path / "fake-pretrieve"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_FILE"\n')
    fake.chmod(0o755)
    args_file = tmp_path / "args"
    env = {**os.environ, "PRETRIEVE": str(fake), "ARGS_FILE": str(args_file)}

    def decide(*args):
        return subprocess.run(["bash", "scripts/experiments/claims.sh", "decide", *args], cwd=str(repo), env=env,
                              capture_output=True, text=True, timeout=60)

    none = decide()
    assert none.returncode == 2 and not args_file.exists()
    assert none.stderr.startswith("error: no tier has records yet") and len(none.stderr.strip().splitlines()) == 1
    claims = repo / "results" / "claims"
    for tier, name in (("tier1", "tier.json"), ("tier2b", "gate.json"), ("tier2d", "tier.json"), ("tier3", "x")):
        (claims / tier).mkdir(parents=True)
        (claims / tier / name).write_text("{}")
    result = decide("--any-seeds")
    assert result.returncode == 0, result.stderr
    assert args_file.read_text().splitlines() == [
        "bench", "claims", "--tier1", "results/claims/tier1", "--scratch", "results/claims/tier2b",
        "--cdmae", "results/claims/tier2d", "--out", "results/claims/claims", "--any-seeds"]
