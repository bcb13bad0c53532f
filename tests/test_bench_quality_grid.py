"""The dev grid's convergence rule (pre-registration amendment 9(a)) and the order cells run in.

When the best dev point lies on the grid's upper edge (its largest lr and/or epochs), the grid grows once in those
directions — the growth values crossed with the other axis' values — and the choice is made again; a point chosen
on the grown grid's edge is used and said to maybe not have converged. No training here: the dev-grid points'
records are written with chosen dev scores, through the same :func:`run_job` hook the harness calls.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pretrieve.bench.quality import report, run as quality, settings as qsettings
from pretrieve.bench.quality.cell_records import SELECT_FORMAT, finetune_train_s
from pretrieve.bench.quality.records import DONE, Records, stamp, write_record
from pretrieve.bench.quality.settings import PRIMARY, point_name
from pretrieve.bench.quality.summary import selection, upper_edge
from pretrieve.errors import ConfigError

from test_bench_quality import collections, settings_for  # noqa: F401 (the module's fixture)

GRID = {"lr": (1e-4, 3e-4), "epochs": (1, 2)}
GROW = {"lr": (1e-3,), "epochs": (4,)}


def _settings(tiny_mlm_dir, collections, tmp_path, **overrides):  # noqa: F811
    values = dict(dev_queries=3, grid=GRID, grid_grow=GROW, methods=("none", "mlm", "bow", "mlm-aa"), seeds=(1, 2))
    values.update(overrides)
    return settings_for(tiny_mlm_dir, collections, tmp_path / "out", **values).resolved()


def _point_record(tier, point, score: float) -> dict:
    return {"format": SELECT_FORMAT, "status": DONE, "point": dict(point), "name": point_name(point), "arm": "mlm",
            "seed": 1, "fold": "train:test", "dev": {"measure": PRIMARY, "per_query": {"q1": score, "q2": score}},
            "timings": {"wall_s": 0.0}, **stamp(tier, 1)}


class _NoBench:
    """Stands in for :class:`pretrieve.bench.quality.cell.Bench`: nothing is derived, pre-trained or trained."""

    def __init__(self, settings):
        self.settings = settings

    def prepare(self, arms):
        pass

    def pretrained(self, arm, seed):
        return ""


def _run(settings, dev_score, monkeypatch):
    """run_quality_bench with every dev-grid point scored ``dev_score(point)`` and no cell run; returns the jobs
    in the order the harness asked for them and the progress lines."""
    jobs, lines = [], []

    def run_job(settings_, tier, kind, payload):
        jobs.append((kind, dict(payload)))
        if kind == "select":
            path = Records(settings_.records).select_path(point_name(payload["point"]))
            write_record(path, _point_record(tier, payload["point"], dev_score(payload["point"])))
            return {"path": str(path), "status": DONE, "line": f"{point_name(payload['point'])}: done"}
        return {"path": None, "status": DONE, "line": "not run"}

    monkeypatch.setattr(quality, "run_job", run_job)
    monkeypatch.setattr(quality, "Bench", _NoBench)
    summary = quality.run_quality_bench(settings, progress=lines.append)
    return jobs, lines, summary


def test_the_upper_edge_is_the_largest_value_of_a_searched_axis():
    assert upper_edge(GRID, {"lr": 3e-4, "epochs": 2}) == ["lr", "epochs"]
    assert upper_edge(GRID, {"lr": 1e-4, "epochs": 2}) == ["epochs"]
    assert upper_edge(GRID, {"lr": 1e-4, "epochs": 1}) == []
    assert upper_edge({"lr": (1e-4,), "epochs": (1, 2)}, {"lr": 1e-4, "epochs": 1}) == []      # one lr: not searched
    assert upper_edge({"lr": (1e-4,), "epochs": (1, 2)}, {"lr": 1e-4, "epochs": 1}, {"lr": [1e-3]}) == ["lr"]
    assert upper_edge(GRID, None) == []


def test_a_best_point_on_the_edge_grows_the_grid_once_then_is_chosen_and_flagged(tiny_mlm_dir, collections,  # noqa: F811
                                                                                   tmp_path, monkeypatch):
    """Dev rises with both lr and epochs: the best of the 2 × 2 grid is its corner (3e-4, 2), so the grid grows by
    lr 1e-3 and epochs 4 (crossed: 5 new points), the grown grid's corner (1e-3, 4) is chosen, on its edge, and
    flagged; no second growth; then the cells run with it, first seeds first."""
    settings = _settings(tiny_mlm_dir, collections, tmp_path)
    jobs, lines, summary = _run(settings, lambda p: p["lr"] * 1000 + p["epochs"] / 10, monkeypatch)
    points = [point_name(p) for kind, p in ((k, v["point"]) for k, v in jobs if k == "select")]
    assert points == ["lr0.0001-epochs1", "lr0.0003-epochs1", "lr0.0001-epochs2", "lr0.0003-epochs2",   # shortest
                      "lr0.001-epochs1", "lr0.001-epochs2", "lr0.0001-epochs4", "lr0.0003-epochs4",    # first
                      "lr0.001-epochs4"]
    grow_line = next(line for line in lines if "grows once" in line)
    assert "lr0.0003-epochs2" in grow_line and "(lr, epochs)" in grow_line and "lr 0.001, epochs 4" in grow_line
    chosen = {"lr": 1e-3, "epochs": 4, "max_steps": 0}
    state = summary["selection"]
    assert state["chosen"] == chosen and state["grown"] and state["grow"] == {} and state["edge"] == ["lr", "epochs"]
    assert any("lies on the grown grid's upper edge (lr, epochs)" in line for line in lines)
    tier = json.loads((tmp_path / "out" / "records" / "tier.json").read_text())
    assert tier["grid"] == {"lr": [1e-4, 3e-4, 1e-3], "epochs": [1, 2, 4]} and tier["grid_grow"] == {
        "lr": [1e-3], "epochs": [4]}
    cells = [(p["arm"], p["seed"], p["protocol"]) for kind, p in jobs if kind == "cell"]
    assert cells == [("none", 1, chosen), ("mlm", 1, chosen), ("bow", 1, chosen), ("mlm-aa", 1001, chosen),
                     ("none", 2, chosen), ("mlm", 2, chosen), ("bow", 2, chosen), ("mlm-aa", 1002, chosen)]
    text = "\n".join(report._selection_section(state))
    assert "may not have converged" in text and "| 0.001 |" in text and "| lr \\ epochs | 1 | 2 | 4 |" in text
    assert 'grown once by the convergence rule, pre-registration amendment 9, by {"lr": [0.001], "epochs": [4]}' in text

    # a rerun (a fresh clone with these records) grows nothing more and runs no grid point
    again, _, _ = _run(replace(settings, out=str(tmp_path / "fresh")), lambda p: 0.0, monkeypatch)
    assert "select" not in {kind for kind, _ in again} and [kind for kind, _ in again].count("cell") == 8


def test_an_inner_best_point_is_chosen_without_growth_and_growth_counts_once(tiny_mlm_dir, collections,  # noqa: F811
                                                                             tmp_path, monkeypatch):
    settings = _settings(tiny_mlm_dir, collections, tmp_path, grid={"lr": (1e-4, 3e-4), "epochs": (1, 2, 3)})
    jobs, _, summary = _run(settings, lambda p: -abs(p["epochs"] - 2) - p["lr"], monkeypatch)
    assert sum(kind == "select" for kind, _ in jobs) == 6
    state = summary["selection"]
    assert state["chosen"] == {"lr": 1e-4, "epochs": 2, "max_steps": 0} and state["edge"] == [] and not state["grown"]

    # growth only in the direction of the edge: best at lr 3e-4 (the edge), epochs inside
    records = Records(tmp_path / "lr-edge")
    tier = records.open(settings.fingerprint(), settings.precision, settings.growing())
    for point in qsettings.grid_points(tier["grid"]):
        write_record(records.select_path(point_name(point)),
                     _point_record(tier, point, point["lr"] * 1000 - abs(point["epochs"] - 2)))
    state = selection(records, tier)
    assert state["chosen"] is None and state["grow"] == {"lr": [1e-3]} and state["best"]["lr"] == 3e-4
    assert "so the grid grows once" in "\n".join(report._selection_section(state))
    # once grown (a growth value is in the grid), a best point on the new edge is chosen: no second growth
    grown = replace(settings, grid={"lr": (1e-4, 3e-4, 1e-3), "epochs": (1, 2, 3)})
    tier = records.open(grown.fingerprint(), grown.precision, grown.growing())
    for point in qsettings.grid_points(tier["grid"]):
        write_record(records.select_path(point_name(point)), _point_record(tier, point, point["epochs"]))
    state = selection(records, tier)
    assert state["chosen"] == {"lr": 1e-4, "epochs": 3, "max_steps": 0}       # ties go to the first lr
    assert state["grown"] and state["grow"] == {} and state["edge"] == ["epochs"]


def test_growth_values_must_lie_past_the_grid(tiny_mlm_dir, collections, tmp_path):  # noqa: F811
    for grow, message in (({"epochs": (2,)}, "epochs values must lie above the grid's own"),
                          ({"lr": (1e-5,)}, "lr values must lie above the grid's own"),
                          ({"warmup": (1,)}, "grid growth: unknown key(s) warmup"),
                          ({"epochs": (-4,)}, "grid growth: epochs values must be positive")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _settings(tiny_mlm_dir, collections, tmp_path, grid_grow=grow)
    with pytest.raises(ConfigError, match="epochs values must lie above"):            # an axis the grid lacks
        _settings(tiny_mlm_dir, collections, tmp_path, grid={"lr": (1e-4,)}, grid_grow={"epochs": (4,)})


def test_the_cli_passes_the_growth_and_refuses_a_bad_one_before_any_work(tiny_mlm_dir, collections,  # noqa: F811
                                                                         tmp_path):
    from test_input_guards import assert_one_line_error, run_cli

    train, _ = collections
    args = ["bench", "quality", "--base", str(tiny_mlm_dir), "--train", str(train), "--methods", "mlm",
            "--dev-queries", "3", "--grid-lr", "1e-4,3e-4", "--grid-epochs", "1,2", "--out", str(tmp_path / "out")]
    assert_one_line_error(run_cli(*args, "--grid-grow-epochs", "2"),
                          "grid growth: epochs values must lie above the grid's own (epochs: [1, 2]), got [2]")
    assert_one_line_error(run_cli(*args, "--grid-grow-lr", "3e-3,x"), "grid-grow-lr")
    assert not (tmp_path / "out").exists()


def test_a_free_process_prepares_cells_ahead_while_the_grids_last_points_run(tiny_mlm_dir, collections,  # noqa: F811
                                                                             tmp_path):
    """Two processes, the plan asked as the harness asks it: both take grid points; when one ends while the other
    still runs (no protocol yet), the free process pre-trains a cell ahead (first seeds first, never `none`, never
    the selection arm's first seed, never a cell with a record); once the protocol is chosen, cells are handed out,
    in parts (prepare unless pre-trained, the folds, then the cell itself), except one whose ahead job still runs,
    which waits for it; a failed fold ends its cell. With `select_only` nothing is prepared ahead."""
    from pretrieve.bench.quality.plan import Plan

    settings = _settings(tiny_mlm_dir, collections, tmp_path, grid={"lr": (1e-4, 3e-4), "epochs": (1,)}, grid_grow={})
    records = Records(settings.records)
    tier = records.open(settings.fingerprint(), settings.precision, settings.growing())
    done = records.cell_path("bow", 2)      # a cell recorded earlier is not prepared again
    write_record(done, {"status": DONE, "arm": "bow", "seed": 2, "protocol": {"lr": 1e-4, "epochs": 1, "max_steps": 0},
                        **stamp(tier, 1)})
    calls = []
    plan = Plan(settings, records, tier, quality.every_cell(settings), False, lambda line: None,
                lambda: calls.append("inputs"), lambda: calls.append("select-arm"))
    first, second = plan.next(), plan.next()
    assert [first[0], second[0]] == ["select", "select"] and calls == ["inputs", "select-arm"]
    write_record(records.select_path("lr0.0001-epochs1"),
                 _point_record(tier, first[1]["point"], 0.5))
    plan.finished(*first)
    ahead = [plan.next(), plan.next()]
    assert ahead == [("prepare", {"arm": "bow", "seed": 1}), ("prepare", {"arm": "mlm-aa", "seed": 1001})]
    plan.finished(*ahead[1])
    assert plan.next() == ("prepare", {"arm": "mlm", "seed": 2})
    write_record(records.select_path("lr0.0003-epochs1"), _point_record(tier, second[1]["point"], 0.4))
    plan.finished(*second)
    chosen = {"lr": 1e-4, "epochs": 1, "max_steps": 0}
    fold = settings.folds[0]

    def part(kind, arm, seed, **extra):
        payload = {"arm": arm, "seed": seed, **extra}
        return (kind, {**payload, "fold": fold, "protocol": chosen} if kind == "fold" else
                {**payload, "protocol": chosen, "parts_s": extra.get("parts_s", 0.0)} if kind == "cell" else
                {**payload, "protocol": chosen})

    handed = []
    while (job := plan.next()) is not None:
        handed.append(job)
    # a cell in parts: `none` needs no pre-training, so its folds go at once; mlm 1 is prepared first; bow 1 and
    # mlm 2 wait for their ahead jobs; mlm-aa 1001's ahead job ended without pre-training it (it failed): its cell
    # runs everything again and records the failure
    assert handed == [part("fold", "none", 1), part("prepare", "mlm", 1), part("cell", "mlm-aa", 1001),
                      part("fold", "none", 2), part("prepare", "mlm-aa", 1002)]
    plan.finished(*handed[0], {"status": DONE, "wall_s": 7.0})
    # its folds ended: the cell writes the record (a fold's seconds are in the fold's record, not in parts_s)
    assert plan.next() == part("cell", "none", 1, parts_s=0.0)
    plan.finished(*handed[3], {"status": "failed", "wall_s": 3.0})   # a failed fold ends its cell (recorded there)
    plan.finished(*ahead[0], {"status": DONE, "wall_s": 5.0})
    plan._pretrained = lambda arm, seed: arm in ("none", "bow")        # bow 1's pre-training is current now
    assert plan.next() == part("fold", "bow", 1)                     # its fold, then nothing more now
    assert plan.next() is None and ("prepare", ("mlm", 2)) in plan.running    # mlm/seed2's ahead job still runs
    assert ("cell", ("none", 2)) not in plan.started

    only = Plan(settings, Records(tmp_path / "other"), Records(tmp_path / "other").open(
        settings.fingerprint(), settings.precision, settings.growing()), quality.every_cell(settings), True,
        lambda line: None, lambda: None, lambda: None)
    assert [only.next()[0], only.next()[0], only.next()] == ["select", "select", None]


def test_fine_tuning_seconds_come_from_the_logs_that_made_the_model_across_a_resume(tmp_path):
    stage = tmp_path / qsettings.RETRIEVER
    stage.mkdir()
    assert finetune_train_s(tmp_path) is None                     # no stage (a fold that reused the grid's model)
    (stage / "finetune_config.json").write_text(json.dumps({"settings": {"batch_size": 4}}))
    # steps 10 and 20 from a first process, steps 30 after it was resumed from step 20: windows of 10 steps × 4
    # samples at 4, 8 and 2 samples/s -> 10 + 5 + 20 s
    lines = [{"step": 10, "samples_per_s": 4.0}, {"step": 20, "samples_per_s": 8.0}, {"step": 30, "samples_per_s": 2.0}]
    (stage / "logs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert finetune_train_s(tmp_path) == 35.0
