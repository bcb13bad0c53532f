"""Which job of a comparison runs next, asked each time a process is free.

A comparison's jobs (:mod:`pretrieve.bench.quality.run` runs them, ``jobs`` at a time) are of four kinds:

* ``select``: one point of the dev grid (its record says its dev score), the fewest epochs first;
* ``prepare``: the part of an arm × seed's cell that does not depend on the protocol — its pre-training, the
  coverage of its checkpoint and, for a first seed, its probes (:func:`pretrieve.bench.quality.cell.prepare_cell`).
  It writes no record, only the scratch ``<out>`` that the cell's later parts then find current;
* ``fold``: one fold of an arm × seed with the chosen protocol — fine-tuning on the fold's training split and
  evaluation (:meth:`pretrieve.bench.quality.cell.Bench.fold`), once the cell is prepared — ending in the fold's
  record (``folds/``: :func:`pretrieve.bench.quality.run.fold_part`). ``prepare`` writes no record unless it fails
  once the protocol is chosen: then the cell's record says so and the cell is over (so does a failed ``fold``);
* ``cell``: the arm × seed itself, which finds its prepared part current and its folds recorded, runs whatever is
  not, and writes the record that holds everything the claims use.

:class:`Plan` hands them out in this order of priority, re-reading the records each time (so a job that lands
may unlock others): the grid's points without a record; once every point has one, the grid's growth if the
convergence rule calls for it (pre-registration amendment 9: :func:`pretrieve.bench.quality.summary.selection`;
``tier.json``'s grid grows and the new points are handed out); once a protocol is chosen, the cells without a
current record, first seeds first, each in its parts: ``prepare`` (unless current), then its folds without a
current record side by side, then ``cell``. A cell's parts are each about half a cell long, so two processes work on
one cell at once, no process idles while the last cell runs, and a job interrupted with its machine loses at most
one fold's work: a fold whose record landed is not run again on the next machine when its checkpoint, pre-trained
there again, has the same bytes (:meth:`pretrieve.bench.quality.records.Records.fold`).
While grid points are still running and nothing else can start, a free process takes a ``prepare`` job (first
seeds first) instead of idling: work the cells need anyway, done ahead, so that two or more processes stay busy
through the grid's long last points. Nothing is prepared ahead with ``select_only``, for a cell that already has
a record, or for an arm × seed whose pre-training is current. Two processes never write the same scratch: a fold
starts only once its cell's pre-training is current and no ``prepare`` of that cell runs, and the ``cell`` job
only once none of its parts runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pretrieve.bench.quality import recipes
from pretrieve.bench.quality.arms import NO_PRETRAIN, arm_method
from pretrieve.bench.quality.cell import checkpoint_digest
from pretrieve.bench.quality.records import DONE, FAILED, Records, commit
from pretrieve.bench.quality.settings import QualityBenchSettings, grid_points, point_name, seed_dir
from pretrieve.bench.quality.summary import selection

Job = tuple[str, dict[str, Any]]


class Plan:
    """The jobs of one run of a comparison, handed out one at a time (:meth:`next`) and given back when they end
    (:meth:`finished`). Called in this process before a job is handed out: ``shared_inputs`` once, before the
    first (the inputs every job reads: BM25 groups, pairs), and ``prepare_select_arm`` before the first grid point
    (the selection arm's first-seed pre-training, which every grid point fine-tunes)."""

    def __init__(self, settings: QualityBenchSettings, records: Records, tier: Mapping[str, Any],
                 wanted: Sequence[tuple[str, int]], select_only: bool, say: Callable[[str], None],
                 shared_inputs: Callable[[], Any], prepare_select_arm: Callable[[], Any],
                 commit_records: bool = False):
        self.settings, self.records, self.tier = settings, records, dict(tier)
        self.wanted, self.select_only, self.say = list(wanted), select_only, say
        self.shared_inputs, self.prepare_select_arm = shared_inputs, prepare_select_arm
        self.commit_records = commit_records
        self.started: set[tuple[str, Any]] = set()
        self.running: set[tuple[str, Any]] = set()
        self.failed: set[tuple[str, int]] = set()               # cells a failed fold ended in this run
        self.part_seconds: dict[tuple[str, int], float] = {}    # seconds of a cell's prepare and fold jobs
        self._inputs_ready = self._select_arm_ready = False
        self._cells: tuple[Mapping[str, Any], list[tuple[str, int]]] | None = None

    # -- the state, from the records
    def selection(self) -> dict[str, Any] | None:
        """The dev grid's state; grows the grid (once) when the rule says so and every point has a record."""
        state = selection(self.records, self.tier)
        if state is not None and not state["todo"] and state["grow"]:
            growth = ", ".join(f"{key} {', '.join(f'{v:g}' for v in values)}" for key, values in state["grow"].items())
            self.say(f"[select] the best point {point_name(state['best'])} lies on the grid's upper edge "
                     f"({', '.join(state['edge'])}): the grid grows once (pre-registration amendment 9) by {growth}")
            grid = {key: tuple(values) + tuple(state["grow"].get(key, ())) for key, values in self.tier["grid"].items()}
            grown = replace(self.settings, grid=grid)
            self.tier = self.records.open(grown.fingerprint(), grown.precision, grown.growing())
            if self.commit_records:
                commit([self.records.tier_path],
                       f"Claims records ({self.records.root.name}): tier.json (the grid grows: {growth})")
            state = selection(self.records, self.tier)
        return state

    def cells(self, protocol: Mapping[str, Any]) -> list[tuple[str, int]]:
        """The wanted arm × seeds without a current record for ``protocol`` (said once, when first known)."""
        if self._cells is None or self._cells[0] != protocol:
            todo = []
            for arm, seed in self.wanted:
                record = self.records.cell(arm, seed, self.tier, protocol, status=None)
                if record is not None and record["status"] == DONE:
                    self.say(f"{arm}/seed{seed}: recorded, skipped")
                elif record is not None and not self.settings.retry_failed:
                    self.say(f"{arm}/seed{seed}: failed earlier ({record.get('error', '?').splitlines()[0][:160]}), "
                             "skipped (--retry-failed runs it again)")
                else:
                    todo.append((arm, seed))
            self._cells = (dict(protocol), todo)
        return self._cells[1]

    # -- handing out
    def next(self) -> Job | None:
        """The next job to start, or None when nothing can start now (everything is done, running, or waits for a
        running job)."""
        state = self.selection()
        if state is not None and state["todo"]:
            points = {point_name(p): p for p in grid_points(self.tier["grid"])}
            waiting = [name for name in state["todo"] if ("select", name) not in self.started]
            if not waiting:
                return self._ahead()      # every missing point runs: no protocol yet, so no cell can start
            if not self._select_arm_ready:
                self._ready()
                self.prepare_select_arm()
                self._select_arm_ready = True
            # the shortest first (a point's cost is its epochs): more records land before a session ends
            name = min(waiting, key=lambda n: (points[n].get("epochs") or 0, waiting.index(n)))
            return self._start("select", name, {"point": points[name]})
        if self.select_only or (state is not None and state["chosen"] is None):
            return None
        protocol = {} if state is None else state["chosen"]
        for arm, seed in self.cells(protocol):
            if ("cell", (arm, seed)) not in self.started and (arm, seed) not in self.failed:
                job = self._cell_part(arm, seed, dict(protocol))
                if job is not None:
                    return job
        return None

    def finished(self, kind: str, payload: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> None:
        """A job ended (``result``: what :func:`pretrieve.bench.quality.run.run_job` returned); a part that failed
        with the protocol chosen ends its cell (its record says the failure), and a part's seconds count in its
        cell's record."""
        key = _key(kind, payload)
        self.running.discard((kind, key))
        if kind in ("prepare", "fold") and result is not None:
            if kind == "prepare":       # a fold's seconds are in its record, which the cell reads
                self.part_seconds[key] = self.part_seconds.get(key, 0.0) + float(result.get("wall_s") or 0.0)
            if result.get("status") == FAILED and "protocol" in payload:
                self.failed.add(key[:2])

    def _cell_part(self, arm: str, seed: int, protocol: dict[str, Any]) -> Job | None:
        """The next part of an arm × seed's cell that can start now: its ``prepare`` (unless its pre-training is
        current), then each fold not yet current, then the cell; None while a part of it runs."""
        key = (arm, seed)
        if ("prepare", key) in self.running:
            return None
        prepared = self._pretrained(arm, seed)
        if not prepared and ("prepare", key) not in self.started:
            return self._start("prepare", key, {"arm": arm, "seed": seed, "protocol": protocol})
        if prepared:     # (one prepared ahead that failed leaves it unprepared: the cell runs it again, records why)
            checkpoint = checkpoint_digest(self.settings, arm, seed)
            folds = [fold for fold in self.settings.folds if ("fold", (*key, fold)) not in self.started and
                     self.records.fold(arm, seed, fold, self.tier, protocol, checkpoint) is None]
            if folds:
                return self._start("fold", (*key, folds[0]),
                                   {"arm": arm, "seed": seed, "fold": folds[0], "protocol": protocol})
            if any(("fold", (*key, fold)) in self.running for fold in self.settings.folds):
                return None
        return self._start("cell", key, {"arm": arm, "seed": seed, "protocol": protocol,
                                         "parts_s": round(self.part_seconds.get(key, 0.0), 1)})

    def _pretrained(self, arm: str, seed: int) -> bool:
        return arm_method(arm)[0] == NO_PRETRAIN or \
            recipes.results_are_current(seed_dir(Path(self.settings.out), arm, seed))

    def _ahead(self) -> Job | None:
        if self.select_only:
            return None
        select = (self.settings.select_arm, self.settings.arm_seeds(self.settings.select_arm)[0])
        for arm, seed in self.wanted:
            key = (arm, seed)
            if ("prepare", key) in self.started or arm_method(arm)[0] == NO_PRETRAIN or key == select:
                continue        # the selection arm's first seed is pre-trained before the grid, here
            if self.records.recorded(arm, seed, self.tier) or self._pretrained(arm, seed):
                continue
            return self._start("prepare", key, {"arm": arm, "seed": seed})
        return None

    def _ready(self) -> None:
        if not self._inputs_ready:
            self.shared_inputs()
            self._inputs_ready = True

    def _start(self, kind: str, key: Any, payload: dict[str, Any]) -> Job:
        self._ready()
        self.started.add((kind, key))
        self.running.add((kind, key))
        return kind, payload


def _key(kind: str, payload: Mapping[str, Any]) -> Any:
    if kind == "select":
        return point_name(payload["point"])
    key = (payload["arm"], int(payload["seed"]))
    return (*key, payload["fold"]) if kind == "fold" else key
