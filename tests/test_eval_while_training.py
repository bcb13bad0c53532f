"""Evaluation while fine-tuning (``--eval-steps``): dev measures logged every N steps, the best evaluated model as
``final``, training unchanged by evaluating, and the best so far surviving a killed and resumed run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pretrieve.errors import ConfigError
from pretrieve.train import checkpoint as ckpt
from pretrieve.train import loop
from pretrieve.train.finetuner import FinetuningRun, finetune
from pretrieve.train.loop import read_logs

from test_finetune import make_config, write_collection


@pytest.fixture(scope="module")
def dev_collection(tmp_path_factory) -> Path:
    """The tiny collection with a ``dev`` split: its four held-out queries t0–t3."""
    root = write_collection(tmp_path_factory.mktemp("beir") / "tiny")
    shutil.copy(root / "qrels" / "test.tsv", root / "qrels" / "dev.tsv")
    return root


@pytest.fixture(scope="module")
def groups(dev_collection, tmp_path_factory) -> Path:
    from pretrieve.retrieval.runs import bm25_negatives

    path = tmp_path_factory.mktemp("groups") / "groups.jsonl"
    bm25_negatives(dev_collection, "train", path, depth=10)
    return path


def weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(directory.rglob("*.safetensors")):
        tensors.update({f"{path.relative_to(directory)}:{key}": value for key, value in load_file(path).items()})
    assert tensors
    return tensors


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    for key in first:
        assert (first[key] - second[key]).abs().max().item() <= 1e-6, key


def scripted_scores(monkeypatch, by_step: dict[int, float]) -> None:
    """The dev nDCG@10 of each step's export set to ``by_step`` (the other measures real), so that which step is best
    is known in advance."""
    original = FinetuningRun.evaluation

    def evaluation(self):
        made = original(self)
        real = made.score

        def score(directory: Path) -> dict[str, float]:
            step = int(re.search(r"step-(\d+)", directory.name).group(1))
            return {**real(directory), "nDCG@10": by_step[step]}

        made.score = score
        return made

    monkeypatch.setattr(FinetuningRun, "evaluation", evaluation)


def test_cli_eval_steps_logs_dev_ndcg_and_keeps_the_best(tiny_bert_dir, dev_collection, tmp_path):
    from pretrieve.cli import app

    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "finetune", "--model", str(tiny_bert_dir), "--data", str(dev_collection), "--out", str(out), "--steps", "6",
        "--eval-steps", "2", "--batch-size", "4", "--num-negatives", "3", "--lr", "5e-4", "--warmup-ratio", "0",
        "--query-max-len", "16", "--passage-max-len", "32", "--bm25-depth", "20", "--log-every", "3",
        "--pooling", "mean"])
    assert result.exit_code == 0, result.output
    evaluated = [row for row in read_logs(out) if "eval/nDCG@10" in row]
    assert [row["step"] for row in evaluated] == [2, 4, 6]
    assert all(0.0 <= row["eval/nDCG@10"] <= 1.0 and "eval/R@100" in row for row in evaluated)
    record = json.loads((out / "final" / "evaluation.json").read_text())
    values = [row["eval/nDCG@10"] for row in evaluated]
    best = max(range(3), key=lambda i: (values[i], -i))   # the highest, the earliest of ties
    assert record["best_step"] == evaluated[best]["step"] and record["best_value"] == values[best]
    assert f"step {record['best_step']}, nDCG@10 {values[best]:.4f}" in result.output
    assert not (out / "best").exists()
    # the kept model is the one evaluated: pretrieve's own search of final/ on the dev queries gives the logged value
    import pretrieve

    run = pretrieve.search(str(out / "final"), str(dev_collection), split="dev", cache=False, show_progress=False)
    assert pretrieve.evaluate(run, str(dev_collection), split="dev", measures="nDCG@10").value(
        "run1", "nDCG@10") == pytest.approx(values[best], abs=1e-6)


def test_final_is_the_best_step_and_evaluating_does_not_change_training(tiny_bert_dir, dev_collection, groups,
                                                                         tmp_path, monkeypatch):
    settings = dict(groups=str(groups), pooling="mean", precision="fp32", schedule="constant")   # step 4 of 6 = of 4
    finetune(make_config(tiny_bert_dir, dev_collection, tmp_path / "four", max_steps=4, **settings))
    plain = read_logs(tmp_path / "four")
    scripted_scores(monkeypatch, {2: 0.2, 4: 0.5, 6: 0.3})
    finetune(make_config(tiny_bert_dir, dev_collection, tmp_path / "eval", max_steps=6, eval_steps=2, **settings))
    assert_same_weights(tmp_path / "four" / "final", tmp_path / "eval" / "final")   # step 4's model, unperturbed
    losses = [row["loss"] for row in read_logs(tmp_path / "eval") if "loss" in row]
    assert losses[:4] == pytest.approx([row["loss"] for row in plain], rel=1e-6)
    record = json.loads((tmp_path / "eval" / "final" / "evaluation.json").read_text())
    assert (record["best_step"], record["best_value"]) == (4, 0.5)
    assert [row["step"] for row in record["history"]] == [2, 4, 6]


def test_the_best_so_far_survives_a_kill_and_resume(tiny_bert_dir, dev_collection, groups, tmp_path, monkeypatch):
    """Checkpoint at step 3, killed in step 5 after evaluating step 4 (the best): the resumed run drops the step-4
    folder the killed run kept, evaluates step 4 again and ends with the same final model and logs."""
    scripted_scores(monkeypatch, {2: 0.2, 4: 0.5, 6: 0.3})
    settings = dict(groups=str(groups), pooling="mean", precision="fp32", max_steps=6, eval_steps=2, save_every=3)
    finetune(make_config(tiny_bert_dir, dev_collection, tmp_path / "full", **settings))

    original, calls = loop.train_step, {"n": 0}

    def killed_in_step_5(*args, **kwargs):
        if calls["n"] == 4:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", killed_in_step_5)
    config = make_config(tiny_bert_dir, dev_collection, tmp_path / "resumed", **settings)
    with pytest.raises(KeyboardInterrupt):
        finetune(config)
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path / "resumed")] == [3]
    # step 2: the best the checkpoint names; step 4: evaluated past the checkpoint, the best when killed
    assert sorted(p.name for p in (tmp_path / "resumed" / "best").iterdir()) == ["step-2", "step-4"]
    monkeypatch.setattr(loop, "train_step", original)
    config.resume = True
    finetune(config)
    assert_same_weights(tmp_path / "full" / "final", tmp_path / "resumed" / "final")
    full, resumed = read_logs(tmp_path / "full"), read_logs(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == [row["step"] for row in full]
    for a, b in zip(full, resumed):
        for key in a:
            if key != "samples_per_s":
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    assert json.loads((tmp_path / "resumed" / "final" / "evaluation.json").read_text())["best_step"] == 4


def test_evaluating_on_the_training_split_or_an_unknown_measure_is_refused(tiny_bert_dir, dev_collection, tmp_path):
    with pytest.raises(ConfigError, match="eval_split: 'train' is the split this run trains on"):
        make_config(tiny_bert_dir, dev_collection, tmp_path / "a", eval_steps=2, eval_split="train").check()
    with pytest.raises(ConfigError, match="unknown measure 'ndcg'"):
        make_config(tiny_bert_dir, dev_collection, tmp_path / "b", eval_steps=2, metric_for_best="ndcg").check()
    with pytest.raises(ConfigError, match="eval_steps must be an integer >= 0"):
        make_config(tiny_bert_dir, dev_collection, tmp_path / "c", eval_steps=-1).check()
    assert "eval_steps" not in make_config(tiny_bert_dir, dev_collection, tmp_path / "d").settings()


def recipe(tmp_path: Path, model: Path, data: Path, dev) -> dict:
    values = {"name": "eval-while-training", "out": str(tmp_path / "out"), "model": str(model), "data": str(data),
              "finetune": {"max_steps": 4, "batch_size": 4, "num_negatives": 2, "query_max_len": 16,
                           "passage_max_len": 32, "bm25_depth": 20, "lr": 5e-4, "pooling": "mean", "eval_steps": 2},
              "stages": [{"finetune": {"stage": 1}},
                         {"evaluate": {"collections": [str(data)], "split": "test", "depth": 20}}]}
    if dev is not None:
        values["dev"] = dev
    return values


def test_a_recipe_evaluates_on_its_dev_queries_and_refuses_without_them(tiny_bert_dir, tmp_path):
    from pretrieve.recipe import run_recipe

    data = write_collection(tmp_path / "tiny")
    with pytest.raises(ConfigError, match="eval_steps: evaluating while training needs dev queries"):
        run_recipe(recipe(tmp_path, tiny_bert_dir, data, dev=None), show_progress=False)
    run_recipe(recipe(tmp_path, tiny_bert_dir, data, dev={"queries": 4, "seed": 0}), show_progress=False)
    stage = tmp_path / "out" / "finetune-s1"
    assert [row["step"] for row in read_logs(stage) if "eval/nDCG@10" in row] == [2, 4]
    assert json.loads((stage / "final" / "evaluation.json").read_text())["queries"] == "4 dev queries of tiny"


def test_pretraining_the_cls_vector_of_a_mean_pooled_model_is_said_not_to_help(minilm, tiny_bert_dir, caplog):
    """bow with the default [CLS] bottleneck on all-MiniLM-L6-v2 (mean pooling) warns; a mean bottleneck, MLM alone
    (no sentence vector) or a base that declares no pooling do not."""
    from pretrieve.train.method import resolve_method
    from pretrieve.train.pretrainer import warn_if_training_an_unpooled_vector

    assert warn_if_training_an_unpooled_vector(str(minilm), resolve_method("bow"))
    assert "this pre-training will not help its retrieval" in caplog.text and "bottleneck: mean" in caplog.text
    assert not warn_if_training_an_unpooled_vector(str(minilm), resolve_method("bow", bottleneck="mean"))
    assert not warn_if_training_an_unpooled_vector(str(minilm), resolve_method("mlm"))
    assert not warn_if_training_an_unpooled_vector(str(tiny_bert_dir), resolve_method("bow"))
