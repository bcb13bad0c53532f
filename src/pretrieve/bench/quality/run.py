"""Running (and resuming) a comparison as cells: which cells run, where, and how their records land.

A comparison is a set of **cells** — a point of the dev grid (the selection arm's first seed fine-tuned on the
first fold with that point, scored on dev) and an arm × seed (its pre-training, every fold's fine-tuning and
evaluation, its coverage and, for the first seed, its probes: :mod:`pretrieve.bench.quality.cell`) — each ending
in a small record (:mod:`pretrieve.bench.quality.records`, :mod:`pretrieve.bench.quality.cell_records`) in the
records directory. The records are the comparison's state: a cell whose current record exists is done, on any
machine and in any checkout (a fresh clone with committed records runs only the rest); everything reported is
recomputed from the records (:mod:`pretrieve.bench.quality.summary`). ``<out>`` is scratch.

:func:`run_quality_bench` runs the jobs a :class:`~pretrieve.bench.quality.plan.Plan` hands out — the grid's
points without a record (and, once, its growth); once the protocol is chosen, the arm × seed cells without a current
record (``cells``: only those), first seeds first, each in parts (its pre-training and probes, its folds side by
side, then the cell, which writes the record); while the grid's last points run, the protocol-free part of
cells ahead of time — ``jobs`` at a time as separate processes (:mod:`concurrent.futures` with the ``spawn`` start
method; each process runs one job with ``threads`` torch threads; ``jobs = 1`` runs them in this process). A cell
that fails (an exception; a non-finite loss or score) records its error and the others go on; it is not retried
unless ``retry_failed``. With ``commit`` every record is committed with git as it lands.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from transformers.utils import logging as hf_logging

from pretrieve.bench.quality.cell import (Bench, checkpoint_digest, derived_collection,  # noqa: F401 (API)
                                          prepare_cell, prepare_pairs)
from pretrieve.bench.quality.cell_records import cell_record, failed_record, fold_record, select_record
from pretrieve.bench.quality.plan import Job, Plan
from pretrieve.bench.quality.records import DONE, FAILED, Records, commit, uncommitted, write_record
from pretrieve.bench.quality.report import write_report
from pretrieve.bench.quality.settings import PRIMARY, QualityBenchSettings, grid_points, point_name, seed_dir
from pretrieve.bench.quality.summary import summarize
from pretrieve.errors import ConfigError
from pretrieve.outputs import DirectoryLock

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------- the jobs
def run_job(settings: QualityBenchSettings, tier: Mapping[str, Any], kind: str, payload: Mapping[str, Any]) -> dict:
    """One job (:mod:`pretrieve.bench.quality.plan` says what each kind is), in whatever process runs it:
    ``"select"`` (``payload``: the grid point) and ``"cell"`` (``arm``, ``seed``, ``protocol``; ``parts_s``, the
    seconds its earlier parts took) each write their record (a failed one on any exception); ``"prepare"``
    (``arm``, ``seed``, and ``protocol`` once it is chosen) and ``"fold"`` (``arm``, ``seed``, ``fold``,
    ``protocol``) write one only when they fail with a protocol: their cell's failed record. Returns ``{"path",
    "status", "line", "wall_s"}`` (``path`` None without a record)."""
    if settings.threads:
        return _with_threads(settings.threads, lambda: _run_job(settings, tier, kind, payload))
    return _run_job(settings, tier, kind, payload)


def _run_job(settings: QualityBenchSettings, tier: Mapping[str, Any], kind: str, payload: Mapping[str, Any]) -> dict:
    records = Records(settings.records)
    started = time.perf_counter()
    bench = Bench(settings)
    label = _job_label(kind, payload)

    def seconds() -> float:
        return round(time.perf_counter() - started, 1)

    made: list[Path] = []       # fold records this job wrote (committed with its own record)
    if kind == "prepare":
        arm, seed = payload["arm"], int(payload["seed"])
        try:
            prepare_cell(bench, arm, seed)
            wall = seconds()
            return {"path": None, "status": DONE, "line": f"{label}: pre-trained (and probed) in {wall:.0f} s",
                    "wall_s": wall}
        except Exception as exc:  # noqa: BLE001 - a failed part fails its cell; the other cells go on
            if "protocol" not in payload:   # ahead of the choice: the cell runs it again and records the failure
                return {"path": None, "status": FAILED, "line": f"{label}: FAILED — {exc}"[:240], "wall_s": seconds()}
            key = {"arm": arm, "seed": seed, "protocol": dict(payload["protocol"])}
            path, record = records.cell_path(arm, seed), failed_record("cell", key, exc, tier, settings.threads,
                                                                       seconds())
    elif kind == "fold":
        arm, seed, fold, protocol = payload["arm"], int(payload["seed"]), payload["fold"], dict(payload["protocol"])
        try:
            record, ran = fold_part(bench, records, tier, arm, seed, fold, protocol)
            path = records.fold_path(arm, seed, fold)
            wall = record["timings"]["wall_s"]
            done = "fine-tuned and evaluated" if ran else "recorded earlier, reused"
            return {"path": str(path), "status": DONE, "line": f"{label}: {done} in {wall:.0f} s", "wall_s": seconds()}
        except Exception as exc:  # noqa: BLE001 - a failed part fails its cell; the other cells go on
            key = {"arm": arm, "seed": seed, "protocol": protocol}
            path, record = records.cell_path(arm, seed), failed_record("cell", key, exc, tier, settings.threads,
                                                                       seconds())
    elif kind == "select":
        point = dict(payload["point"])
        key, path = {"point": point, "name": point_name(point)}, records.select_path(point_name(point))
        try:
            record = select_record(bench, point, bench.select_point(point), tier, seconds())
        except Exception as exc:  # noqa: BLE001 - a point that fails (diverges) is recorded and cannot be chosen
            record = failed_record(kind, key, exc, tier, settings.threads, seconds())
    else:
        arm, seed, protocol = payload["arm"], int(payload["seed"]), dict(payload["protocol"])
        key, path = {"arm": arm, "seed": seed, "protocol": protocol}, records.cell_path(arm, seed)
        parts = float(payload.get("parts_s") or 0.0)
        try:
            prepare_cell(bench, arm, seed)
            folds, earlier = {}, 0.0
            for fold in settings.folds:
                folds[fold], ran = fold_part(bench, records, tier, arm, seed, fold, protocol)
                if ran:
                    made.append(records.fold_path(arm, seed, fold))
                else:           # a fold job of this run, or of an earlier one on any machine
                    earlier += float(folds[fold]["timings"]["wall_s"] or 0.0)
            record = cell_record(bench, arm, seed, protocol, tier, parts + earlier + seconds(), folds)
        except Exception as exc:  # noqa: BLE001 - any failure of one cell must not stop the others
            record = failed_record(kind, key, exc, tier, settings.threads, parts + seconds())
        if record["status"] == DONE and not settings.keep_checkpoints:
            for checkpoints in seed_dir(bench.out, arm, seed).glob("**/checkpoints"):
                shutil.rmtree(checkpoints, ignore_errors=True)
    write_record(path, record)
    wall = record["timings"]["wall_s"]
    line = f"{label}: done in {wall:.0f} s" if record["status"] == DONE else \
        f"{label}: FAILED — {record['error'].splitlines()[0][:200]}"
    return {"path": str(path), "paths": [*map(str, made), str(path)], "status": record["status"], "line": line,
            "wall_s": seconds()}


def fold_part(bench: Bench, records: Records, tier: Mapping[str, Any], arm: str, seed: int, fold: str,
              protocol: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """A fold of an arm × seed, recorded: its current record (:meth:`Records.fold`: made from the checkpoint this
    scratch ``<out>`` has, pre-trained here first if need be) or, failing that, the fold fine-tuned and evaluated
    (:meth:`Bench.fold`, reusing a current scratch fold) and its record written. Returns ``(record, ran here)``."""
    started = time.perf_counter()
    bench.pretrained(arm, seed)
    checkpoint = checkpoint_digest(bench.settings, arm, seed)
    record = records.fold(arm, seed, fold, tier, protocol, checkpoint)
    if record is not None:
        return record, False
    bench.fold(arm, seed, fold, protocol)
    record = fold_record(bench, arm, seed, fold, protocol, tier, time.perf_counter() - started)
    write_record(records.fold_path(arm, seed, fold), record)
    return record, True


def run_jobs(settings: QualityBenchSettings, plan: Plan, parallel: int, say: Callable[[str], None],
             landed: Callable[[dict], None]) -> list[dict]:
    """Run the jobs ``plan`` hands out, ``parallel`` at a time, each in its own process (``spawn``; one job per
    process, so its memory is returned), or in this process when ``parallel`` is 1; a free process asks the plan
    again whenever a job ends. ``landed`` is called with each result as it comes in."""
    results: list[dict] = []
    count = 0

    def started(kind: str, payload: Mapping[str, Any]) -> None:
        nonlocal count
        count += 1
        say(f"[{count}] {kind} {_job_label(kind, payload)}: running")

    def ended(kind: str, payload: Mapping[str, Any], result: dict) -> None:
        plan.finished(kind, payload, result)
        say(f"[{len(results) + 1}/{count}] {result['line']}")
        landed(result)
        results.append(result)

    if parallel <= 1:
        while (job := plan.next()) is not None:
            started(*job)
            ended(*job, run_job(settings, plan.tier, *job))
        return results
    options: dict[str, Any] = {"max_workers": parallel, "mp_context": multiprocessing.get_context("spawn"),
                               "initializer": quiet_library_bars}
    if "max_tasks_per_child" in ProcessPoolExecutor.__init__.__code__.co_varnames:
        options["max_tasks_per_child"] = 1
    with ProcessPoolExecutor(**options) as pool:
        pending: dict[Future, Job] = {}
        while True:
            while len(pending) < parallel and (job := plan.next()) is not None:
                started(*job)
                pending[pool.submit(run_job, settings, plan.tier, *job)] = job
            if not pending:
                return results
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                ended(*pending.pop(future), future.result())


def quiet_library_bars() -> None:
    """A cell's process (spawned: the CLI's logging set-up is not inherited) draws no library tqdm bars ("Loading
    weights" frames in the harness's log file); its own work is reported by the harness's lines."""
    hf_logging.disable_progress_bar()


def _job_label(kind: str, payload: Mapping[str, Any]) -> str:
    if kind == "select":
        return point_name(payload["point"])
    return f"{payload['arm']}/seed{payload['seed']}" + (f" fold {payload['fold']}" if kind == "fold" else "")


def every_cell(settings: QualityBenchSettings) -> list[tuple[str, int]]:
    """Every arm × seed, first seeds first (every arm's first seed, then every arm's second, …), so that the first
    seeds' gates and probes land before the later seeds run."""
    seeds = {arm: settings.arm_seeds(arm) for arm in settings.methods}
    return [(arm, seeds[arm][index]) for index in range(max(map(len, seeds.values()), default=0))
            for arm in settings.methods if index < len(seeds[arm])]


def parse_cells(items: Sequence[str], settings: QualityBenchSettings) -> list[tuple[str, int]]:
    """``--cells ARM:SEED,ARM`` → the arm × seed cells to run (``ARM`` alone: every seed of the arm); each must
    be an arm and seed of the comparison (an A/A arm's seeds are its shifted ones)."""
    cells: list[tuple[str, int]] = []
    for item in items:
        arm, _, seed = str(item).strip().partition(":")
        if arm not in settings.methods:
            raise ConfigError(f"cell '{item}': '{arm}' is not an arm of the comparison ({', '.join(settings.methods)})")
        seeds = settings.arm_seeds(arm)
        if seed:
            try:
                chosen = [int(seed)]
            except ValueError:
                raise ConfigError(f"cell '{item}': the seed must be a number, e.g. {arm}:{seeds[0]}") from None
            if chosen[0] not in seeds:
                raise ConfigError(f"cell '{item}': seed {chosen[0]} is not one of {arm}'s seeds {seeds}")
        else:
            chosen = seeds
        cells += [(arm, s) for s in chosen if (arm, s) not in cells]
    return cells


# ---------------------------------------------------------------------------------------------- running
def run_quality_bench(settings: QualityBenchSettings, progress: Callable[[str], None] | None = None,
                      cells: Sequence[str] | None = None, select_only: bool = False, jobs: int = 1,
                      commit_records: bool = False) -> dict[str, Any]:
    """Run (or resume) the comparison's cells that have no current record and write the report; returns
    :func:`~pretrieve.bench.quality.summary.summarize`'s dict. ``cells``: only these arm × seeds (``ARM:SEED`` or
    ``ARM``); ``select_only``: only the dev grid; ``jobs``: cells at once, each in its own process;
    ``commit_records``: commit each record with git as it lands."""
    settings = settings.resolved()
    if jobs < 1:
        raise ConfigError(f"jobs must be ≥ 1, got {jobs}")
    if settings.threads is None:
        settings = replace(settings, threads=max(1, (os.cpu_count() or 1) // jobs))
    wanted = parse_cells(cells, settings) if cells else every_cell(settings)
    say = progress or (lambda line: logger.info("%s", line))
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    with DirectoryLock(out):   # one run per --out, a second refused before any work (its cells would race)
        records = Records(settings.records)
        tier = records.open(settings.fingerprint(), settings.precision, settings.growing())
        if commit_records:
            commit([records.tier_path], f"Claims records ({records.root.name}): tier.json")
            left = uncommitted(records.root)
            if left:        # written by a run killed before it could commit them (a session's end)
                commit(left, f"Claims records ({records.root.name}): {len(left)} record(s) an interrupted run had "
                             "not committed")
        bench = Bench(settings)     # the derived collection and the pre-training union, made once here

        def landed(result: Mapping[str, Any]) -> None:
            if commit_records and result.get("path"):
                commit([Path(p) for p in result.get("paths") or [result["path"]]],
                       f"Claims records ({records.root.name}): {result['line']}")

        select_arm = settings.select_arm

        def prepare_select_arm() -> None:
            say(f"[select] pre-training {select_arm}/seed{settings.arm_seeds(select_arm)[0]} for the dev grid")
            # at the cells' own thread count, not threads × jobs: the checkpoint is also that arm × seed's cell, and
            # torch's CPU kernels round differently with another thread count (--jobs 2 must give --jobs 1's records)
            _with_threads(settings.threads, lambda: bench.pretrained(select_arm, settings.arm_seeds(select_arm)[0]))

        def shared_inputs() -> None:      # made here once, before jobs run side by side
            bench.prepare(list(dict.fromkeys([select_arm, *(arm for arm, _ in wanted)])))

        plan = Plan(settings, records, tier, wanted, select_only, say, shared_inputs, prepare_select_arm,
                    commit_records)
        state = plan.selection()
        if state is not None and state["todo"]:
            say(f"[select] {len(state['todo'])} of {len(grid_points(plan.tier['grid']))} dev-grid points to run")
        run_jobs(settings, plan, jobs, say, landed)
        state = plan.selection()
        if state is not None:
            scores = ", ".join(f"{name} {value:.4f}" for name, value in state["scores"].items())
            say(f"[select] dev {PRIMARY}: {scores}")
            if state["chosen"] is None:
                say("[select] no protocol chosen yet (points missing or all failed): no arm × seed cell runs")
            elif state["edge"]:
                say(f"[select] the chosen point {point_name(state['chosen'])} lies on the"
                    f"{' grown' if state['grown'] else ''} grid's upper edge ({', '.join(state['edge'])}): the "
                    "protocol may not have converged")
        summary = summarize(records.root)
        write_report(out, summary, records.root, plot=True)
        return summary


def _with_threads(threads: int, work: Callable[[], Any]) -> Any:
    """``work()`` with ``threads`` torch threads, the caller's count restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        return work()
    finally:
        torch.set_num_threads(before)
