"""Experiment trackers through accelerate (issue 25, item 4): ``--report-to`` on every training command, the recipe's
``report_to``, and what TensorBoard's own reader finds in the events a run writes — the logged scalars at their
steps and the run's resolved config — also across an interrupted and resumed run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from accelerate.tracking import get_available_trackers
from accelerate.utils import LoggerType
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from typer.testing import CliRunner

import pretrieve
from pretrieve.cli import app, main
from pretrieve.errors import ConfigError
from pretrieve.recipe.schema import validate_recipe
from pretrieve.train import loop
from pretrieve.train.settings import check_trackers
from pretrieve.train.loop import read_logs

from test_finetune import write_collection
from test_pretrain import small_corpus  # noqa: F401 - a fixture

SRC = Path(__file__).resolve().parents[1] / "src"
TRAINING_COMMANDS = (("pretrain",), ("finetune",), ("reranker", "train"))


def tensorboard_runs(out: Path) -> dict[str, EventAccumulator]:
    """Every TensorBoard run (a folder holding event files) under ``out``, loaded by TensorBoard's reader."""
    folders = sorted({path.parent for path in out.rglob("events.out.tfevents.*")})
    runs = {}
    for folder in folders:
        accumulator = EventAccumulator(str(folder))
        accumulator.Reload()
        runs[str(folder.relative_to(out))] = accumulator
    return runs


def scalar_steps(runs: dict[str, EventAccumulator], tag: str) -> dict[int, float]:
    """``{step: value}`` of a scalar tag, over the runs that hold it; a step logged twice fails."""
    found: dict[int, float] = {}
    for accumulator in runs.values():
        if tag in accumulator.Tags()["scalars"]:
            for event in accumulator.Scalars(tag):
                assert event.step not in found, f"step {event.step} of {tag} is shown twice"
                found[event.step] = event.value
    return found


def logged_hparams(runs: dict[str, EventAccumulator]) -> dict[str, object]:
    """The hyper-parameters (TensorBoard's HParams plugin) the runs recorded, by name."""
    values: dict[str, object] = {}
    for accumulator in runs.values():
        try:
            contents = accumulator.PluginTagToContent("hparams").values()
        except KeyError:   # a run without hyper-parameters (the scalars')
            continue
        for content in contents:
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            for name, value in data.session_start_info.hparams.items():
                values[name] = getattr(value, value.WhichOneof("kind"))
    return values


def assert_tracked_like_logs(out: Path, tags: tuple[str, ...] = ("loss", "lr")) -> dict[str, EventAccumulator]:
    """TensorBoard holds each of ``tags`` at exactly the steps of ``logs.jsonl``, with its values."""
    runs = tensorboard_runs(out)
    assert runs, f"no TensorBoard events under {out}"
    assert all(name.startswith("trackers") for name in runs), list(runs)
    logs = read_logs(out)
    assert logs
    for tag in tags:
        tracked = scalar_steps(runs, tag)
        assert sorted(tracked) == [row["step"] for row in logs], tag
        for row in logs:
            assert tracked[row["step"]] == pytest.approx(row[tag], rel=1e-6), (tag, row["step"])
    return runs


# ----------------------------------------------------------------------------------------- the commands
def test_pretrain_reports_scalars_and_its_config_to_tensorboard(tiny_mlm_dir, small_corpus, tmp_path):  # noqa: F811
    out = tmp_path / "pt"
    result = CliRunner().invoke(app, ["pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(small_corpus),
                                      "--out", str(out), "--method", "bow", "--max-len", "32", "--batch-size", "4",
                                      "--steps", "4", "--log-every", "2", "--save-every", "0", "--lr", "5e-4",
                                      "--report-to", "tensorboard"])
    assert result.exit_code == 0, result.output
    runs = assert_tracked_like_logs(out, ("loss", "lr", "samples_per_s"))
    assert sorted(scalar_steps(runs, "loss")) == [2, 4]
    objectives = [key for key in read_logs(out)[0] if key.startswith("loss/")]
    assert objectives and all(scalar_steps(runs, key) for key in objectives)
    hparams = logged_hparams(runs)
    recorded = json.loads((out / "pretrain_config.json").read_text())
    assert hparams["method.name"] == recorded["method"]["name"] == "bow"
    assert hparams["max_len"] == 32 and hparams["batch_size"] == 4 and hparams["lr"] == pytest.approx(5e-4)
    assert hparams["report_to"] == "tensorboard" and hparams["out"] == str(out)


def test_finetune_reports_scalars_and_its_config_to_tensorboard(tiny_bert_dir, tmp_path):
    data = write_collection(tmp_path / "tiny")
    out = tmp_path / "ft"
    result = CliRunner().invoke(app, ["finetune", "--model", str(tiny_bert_dir), "--data", str(data), "--out",
                                      str(out), "--steps", "3", "--batch-size", "4", "--num-negatives", "2",
                                      "--log-every", "1", "--save-every", "0", "--query-max-len", "16",
                                      "--passage-max-len", "32", "--bm25-depth", "20", "--pooling", "mean",
                                      "--report-to", "tensorboard"])
    assert result.exit_code == 0, result.output
    runs = assert_tracked_like_logs(out)
    assert sorted(scalar_steps(runs, "loss")) == [1, 2, 3]
    hparams = logged_hparams(runs)
    assert hparams["config.stage"] == 1 and hparams["config.num_negatives"] == 2
    assert hparams["config.pooling"] == "mean" and hparams["config.data"] == str(data)


def test_a_resumed_run_continues_tensorboards_run_and_shows_each_step_once(tiny_mlm_dir, small_corpus,  # noqa: F811
                                                                             tmp_path, monkeypatch):
    """Killed after step 5 (checkpoint at 3), resumed: steps 4 and 5 are logged again, and TensorBoard's reader shows
    each step once, with the resumed run's values (the Python API's ``report_to=``)."""
    settings = dict(method="bow", max_len=32, batch_size=4, max_steps=6, save_every=3, log_every=1, lr=5e-4,
                    warmup_ratio=0.0, show_progress=False, report_to="tensorboard")
    out = tmp_path / "resumed"
    original = loop.train_step
    calls = {"n": 0}

    def killed_after_5(*args, **kwargs):
        if calls["n"] == 5:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", killed_after_5)
    with pytest.raises(KeyboardInterrupt):
        pretrieve.pretrain(tiny_mlm_dir, small_corpus, out, **settings)
    assert sorted(scalar_steps(tensorboard_runs(out), "loss")) == [1, 2, 3, 4, 5]
    monkeypatch.setattr(loop, "train_step", original)

    pretrieve.pretrain(tiny_mlm_dir, small_corpus, out, resume=True, **settings)
    assert [row["step"] for row in read_logs(out)] == [1, 2, 3, 4, 5, 6]
    assert_tracked_like_logs(out)   # steps 4 and 5 with the resumed run's values
    # the same TensorBoard run: the resumed process's event file beside the interrupted one's
    assert len(list((out / "trackers" / "pretrieve").glob("events.out.tfevents.*"))) == 2


def test_every_training_command_has_the_one_report_to_option():
    command = typer.main.get_command(app)
    helps = set()
    for path in TRAINING_COMMANDS:
        target = command
        for name in path:
            target = target.commands[name]
        option = next(param for param in target.params if "--report-to" in param.opts)
        helps.add(option.help)
    assert len(helps) == 1
    named = set(LoggerType.list())
    assert all(name in next(iter(helps)) for name in named)   # the help names every tracker accelerate knows


def test_without_report_to_no_tracker_writes_anything(tiny_mlm_dir, small_corpus, tmp_path):  # noqa: F811
    """The default is no tracker: logs.jsonl only, no event file anywhere (the old hand-written TensorBoard writer,
    which always wrote OUT/tb/, is gone)."""
    out = tmp_path / "plain"
    pretrieve.pretrain(tiny_mlm_dir, small_corpus, out, method="bow", max_len=32, batch_size=4, max_steps=2,
                       log_every=1, save_every=0, show_progress=False)
    assert [row["step"] for row in read_logs(out)] == [1, 2]
    assert not list(out.rglob("events.out.tfevents.*"))
    assert not (out / "tb").exists() and not (out / "trackers").exists()
    source = "\n".join(path.read_text() for path in (SRC / "pretrieve").rglob("*.py"))
    assert "SummaryWriter" not in source and "torch.utils.tensorboard" not in source


# ----------------------------------------------------------------------------------------- bad names
def _missing_tracker() -> str:
    available = {str(tracker.value) for tracker in get_available_trackers()}
    missing = [name for name in LoggerType.list() if name != "all" and name not in available]
    if not missing:
        pytest.skip("every tracker accelerate knows is installed here")
    return missing[0]


def _main(capsys, monkeypatch, *args: str) -> tuple[int, list[str]]:
    """``pretrieve ARGS`` through the console entry point, in this process: (exit code, stderr lines)."""
    monkeypatch.setattr(sys, "argv", ["pretrieve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("command", TRAINING_COMMANDS, ids=" ".join)
def test_an_unknown_or_missing_tracker_is_one_error_line_before_any_training(command, tiny_mlm_dir, tmp_path,
                                                                           capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    groups = tmp_path / "groups.jsonl"
    groups.write_text("")
    inputs = {"pretrain": ["--corpus", str(data)], "finetune": ["--data", str(data)],
              "reranker": ["--data", str(data), "--groups", str(groups)]}[command[0]]
    out = tmp_path / "out"
    missing = _missing_tracker()
    for report_to, expected in (
            ("tensorboard,tensorbord", "report_to: unknown tracker 'tensorbord'; did you mean tensorboard?"),
            (missing, f"report_to: the tracker '{missing}' needs its package, which is not installed")):
        code, lines = _main(capsys, monkeypatch, *command, "--model", str(tiny_mlm_dir), *inputs, "--out", str(out),
                            "--steps", "2", "--report-to", report_to)
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith("error: ") and expected in lines[0], lines
        assert not out.exists()   # refused before the output directory was touched


def test_tracker_names_are_accelerates():
    assert check_trackers("tensorboard, TensorBoard,none") == ["tensorboard"]
    assert check_trackers(["tensorboard"]) == check_trackers("tensorboard") == ["tensorboard"]
    assert check_trackers(None) == check_trackers("none") == check_trackers("") == []
    with pytest.raises(ConfigError, match=r"^x\.report_to: unknown tracker 'nope'; choose from none, all, "):
        check_trackers("nope", "x.report_to")


# ----------------------------------------------------------------------------------------- recipes
RECIPE = {"out": "out", "model": "minilm", "data": "scifact",
          "stages": [{"pretrain": {"max_steps": 2}}, {"finetune": {"stage": 1}}]}


def test_a_recipe_names_its_trackers_once_at_the_top():
    assert validate_recipe({**RECIPE, "report_to": "tensorboard"}, "r.yaml")["report_to"] == ["tensorboard"]
    assert validate_recipe({**RECIPE, "report_to": ["tensorboard", "none"]}, "r.yaml")["report_to"] == ["tensorboard"]
    with pytest.raises(ConfigError, match=r"^r\.yaml: report_to: unknown tracker 'tensorbord'; did you mean "):
        validate_recipe({**RECIPE, "report_to": "tensorbord"}, "r.yaml")
    with pytest.raises(ConfigError, match=rf"^r\.yaml: report_to: the tracker '{_missing_tracker()}' needs"):
        validate_recipe({**RECIPE, "report_to": _missing_tracker()}, "r.yaml")
    with pytest.raises(ConfigError, match=r"stages\[1\]\.finetune\.report_to: .*top-level 'report_to'"):
        validate_recipe({**RECIPE, "stages": [RECIPE["stages"][0], {"finetune": {"report_to": "tensorboard"}}]},
                        "r.yaml")


def test_a_recipe_with_an_unknown_tracker_exits_2_before_any_stage(tmp_path, capsys, monkeypatch):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({**RECIPE, "out": str(tmp_path / "out"), "report_to": "tensorbord"}))
    code, lines = _main(capsys, monkeypatch, "run", str(recipe))
    assert code == 2
    assert lines == [f"error: {recipe}: report_to: unknown tracker 'tensorbord'; did you mean tensorboard?"]
    assert not (tmp_path / "out").exists()
