"""What pretrieve promises under bad input: the families of the reliability reviews, one section each.

Read it as a list of promises; each is a test (several live in the module named beside the section, and are not
repeated here). Every refusal is one ``error:`` line naming the file, line and field (or the output path), exit
code 2, before any expensive work, and leaves every byte of the user's files.

1. **Outputs are the user's unless pretrieve wrote them** (the ownership rule, :func:`pretrieve.outputs.claim`):
   ``pretrain``, ``finetune``, ``run``, ``mine`` and ``evaluate`` on a folder or file the user made exit 2;
   ``--overwrite`` replaces only what the command writes, never a stranger file beside it; a genuinely
   interrupted run still resumes (tests/test_interruptions.py, tests/test_run_interrupted.py); two writers of one
   output: tests/test_locks.py; space, limits and unwritable places: tests/test_output_preflight.py.
2. **Numbers are numbers** (:mod:`pretrieve.options`): every numeric option finite and typed (a boolean is not an
   integer), in flags and recipes alike, at parse time.
3. **Collections that cannot be evaluated or written are refused on reading** (:mod:`pretrieve.data`): duplicate
   judgments, ids a TREC run cannot hold, JSON nested beyond any use.
4. **Config files that would hang or crash the reader are refused** (:mod:`pretrieve.io_utils`): YAML alias bombs.
5. **Model files**: a weight of the wrong shape is one line (the rest: tests/test_model_files.py).
6. **Training that explodes is never called healthy** (:mod:`pretrieve.train.guard`).
7. **Size estimates count what is written** (the preflight's free-space and ``ulimit -f`` checks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_finetune import write_collection
from test_locks import _pretrain_args, corpus  # noqa: F401 - corpus is a fixture
from test_output_preflight import _main


def _one_error(code: int, stderr: str, *needles: str) -> str:
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ 1. outputs
def _pretrain(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [*_pretrain_args(model, corpus, out, steps=2), *extra]


def _users_folder(out: Path) -> dict[str, bytes]:
    """The review's B1 folder: a thesis where the model goes, the user's log, notes among the checkpoints."""
    (out / "final").mkdir(parents=True)
    (out / "final" / "thesis.tex").write_text("thesis\n")
    (out / "logs.jsonl").write_text('{"mine": 1}\n')
    (out / "precious.txt").write_text("keep me\n")
    return _snapshot(out)


def test_pretrain_into_a_folder_the_user_made_exits_2_and_keeps_every_byte(tiny_mlm_dir, corpus, tmp_path, capsys,
                                                                           monkeypatch):
    out = tmp_path / "V"
    before = _users_folder(out)
    code, err = _main(capsys, monkeypatch, *_pretrain(tiny_mlm_dir, corpus, out))
    _one_error(code, err, str(out / "final"), "not written by pretrieve", "--overwrite")
    assert _snapshot(out) == before


def test_pretrain_overwrite_replaces_only_what_it_writes(tiny_mlm_dir, corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "V"
    _users_folder(out)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "notes.txt").write_text("my notes\n")
    code, err = _main(capsys, monkeypatch, *_pretrain(tiny_mlm_dir, corpus, out, "--overwrite"))
    assert code == 0, err[-2000:]
    assert (out / "final" / "model.safetensors").is_file() and not (out / "final" / "thesis.tex").exists()
    assert (out / "precious.txt").read_text() == "keep me\n"                  # beside the outputs: kept
    assert (out / "checkpoints" / "notes.txt").read_text() == "my notes\n"   # beside the checkpoints: kept
    # its own run is pretrieve's: a second --overwrite replaces it and still keeps the stranger files
    code, err = _main(capsys, monkeypatch, *_pretrain(tiny_mlm_dir, corpus, out, "--overwrite"))
    assert code == 0, err[-2000:]
    assert (out / "checkpoints" / "notes.txt").exists() and (out / "precious.txt").exists()


def test_an_interrupted_pretrain_is_pretrieves_own_and_resumes(tiny_mlm_dir, corpus, tmp_path, capsys, monkeypatch):
    """A run whose final/ never got its record (killed between the two) is its own: trained again, not refused."""
    out = tmp_path / "run"
    code, err = _main(capsys, monkeypatch, *_pretrain(tiny_mlm_dir, corpus, out))
    assert code == 0, err[-2000:]
    (out / "final" / "artifact.json").unlink()
    code, err = _main(capsys, monkeypatch, *_pretrain(tiny_mlm_dir, corpus, out, "--resume"))
    assert code == 0, err[-2000:]
    assert (out / "final" / "artifact.json").is_file()


def test_finetune_into_a_folder_the_user_made_exits_2(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    out = tmp_path / "V"
    before = _users_folder(out)
    code, err = _main(capsys, monkeypatch, "finetune", "--model", str(tiny_bert_dir), "--data", str(data),
                      "--out", str(out), "--steps", "1", "--batch-size", "2", "--num-negatives", "1")
    _one_error(code, err, str(out / "final"), "not written by pretrieve")
    assert _snapshot(out) == before


def test_run_into_a_folder_holding_the_users_results_exits_2(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    out = tmp_path / "V"
    (out / "runs").mkdir(parents=True)
    (out / "results.md").write_text("# my results\n")
    (out / "results.json").write_text('{"mine": true}\n')
    (out / "runs" / "bm25__tiny.trec").write_text("q0 Q0 d0 1 1.0 mine\n")
    before = _snapshot(out)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"out": str(out), "model": str(tiny_bert_dir), "data": str(data),
                                      "stages": [{"evaluate": {"bm25": True, "zero_shot": True, "depth": 10}}]}))
    code, err = _main(capsys, monkeypatch, "run", str(recipe), "--no-progress")
    _one_error(code, err, "not written by pretrieve")
    assert _snapshot(out) == before
    for name in ("results.md", "results.json"):     # one at a time: each is refused while it is the user's
        (out / name).unlink()
    code, err = _main(capsys, monkeypatch, "run", str(recipe), "--no-progress")
    _one_error(code, err, str(out / "runs" / "bm25__tiny.trec"), "not written by pretrieve")


def test_mine_and_evaluate_refuse_a_file_the_user_made(tmp_path, capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    mine = tmp_path / "groups.jsonl"
    mine.write_text("my groups\n")
    code, err = _main(capsys, monkeypatch, "mine", "--bm25", "--data", str(data), "--out", str(mine))
    _one_error(code, err, str(mine), "not written by pretrieve")
    assert mine.read_text() == "my groups\n"
    run = tmp_path / "bm25.trec"
    code, err = _main(capsys, monkeypatch, "bm25", "--data", str(data), "--out", str(run), "--k", "5")
    assert code == 0, err
    for option in ("--json", "--md"):
        table = tmp_path / f"e{option[2:]}"
        table.write_text("mine\n")
        code, err = _main(capsys, monkeypatch, "evaluate", str(run), "--data", str(data), option, str(table))
        _one_error(code, err, str(table), "exists", "--overwrite")
        assert table.read_text() == "mine\n"
        code, err = _main(capsys, monkeypatch, "evaluate", str(run), "--data", str(data), option, str(table),
                          "--overwrite")
        assert code == 0 and table.read_text() != "mine\n", err
    # mine's own output is pretrieve's: rerun (reused while current) without --overwrite
    mine.unlink()
    for _ in range(2):
        code, err = _main(capsys, monkeypatch, "mine", "--bm25", "--data", str(data), "--out", str(mine),
                          "--depth", "10")
        assert code == 0, err


def test_an_index_folder_the_user_made_is_not_replaced(tmp_path, capsys, monkeypatch):
    """`bm25 --index` replaces its index folder as a whole: a folder the user made there is refused."""
    data = write_collection(tmp_path / "tiny")
    index = tmp_path / "idx"
    index.mkdir()
    (index / "notes.txt").write_text("mine\n")
    code, err = _main(capsys, monkeypatch, "bm25", "--data", str(data), "--out", str(tmp_path / "r.trec"),
                      "--index", str(index))
    _one_error(code, err, str(index), "not written by pretrieve")
    assert (index / "notes.txt").read_text() == "mine\n" and not (tmp_path / "r.trec").exists()
    own = tmp_path / "own"      # pretrieve's own index is reused (or rebuilt) without --overwrite
    for run in ("a.trec", "b.trec"):
        code, err = _main(capsys, monkeypatch, "bm25", "--data", str(data), "--out", str(tmp_path / run),
                          "--index", str(own), "--k", "5")
        assert code == 0, err

# ------------------------------------------------------------------------------------------ 2. numbers
@pytest.mark.parametrize("flag, value, needle", [
    ("--lr", "nan", "lr: expected a finite number"),
    ("--lr", "inf", "lr: expected a finite number"),
    ("--seed", "99999999999999999999999", "seed: expected an integer from 0 to 4294967295"),
])
def test_numeric_flags_are_finite_and_in_range_before_any_work(flag, value, needle, tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    code, err = _main(capsys, monkeypatch, "pretrain", "--model", str(tmp_path / "no-model"), "--corpus", str(corpus),
                      "--out", str(tmp_path / "out"), flag, value)
    _one_error(code, err, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stage, top, needle", [
    ({"batch_size": True}, {}, "stages[0].finetune.batch_size: expected a number, got True"),
    ({"lr": ".nan"}, {}, "stages[0].finetune.lr: expected a finite number"),   # YAML's NaN
    ({"lr": float("inf")}, {}, "stages[0].finetune.lr: expected a finite number"),
    ({}, {"seed": 99999999999999999999999}, "seed: expected an integer from 0 to 4294967295"),
])
def test_recipe_numbers_are_checked_like_flags(stage, top, needle, tmp_path, capsys, monkeypatch):
    recipe = tmp_path / "r.yaml"
    text = yaml.safe_dump({"out": str(tmp_path / "out"), "model": "bm25", "data": "adi", **top,
                           "stages": [{"finetune": stage}]})
    recipe.write_text(text.replace("'.nan'", ".nan"))
    code, err = _main(capsys, monkeypatch, "run", str(recipe))
    _one_error(code, err, str(recipe), needle)
    assert not (tmp_path / "out").exists()


def test_the_one_validator_refuses_booleans_for_numbers_but_keeps_switches():
    from pretrieve.errors import ConfigError
    from pretrieve.options import validate
    from pretrieve.train.finetuner import FinetuneConfig

    assert validate(FinetuneConfig, {"bf16": True, "lr": "1e-4"}) == {"bf16": True, "lr": 1e-4}
    for values in ({"max_steps": False}, {"lr": True}, {"lr": "-inf"}):
        with pytest.raises(ConfigError):
            validate(FinetuneConfig, values)


# ------------------------------------------------------------------------------------------ 3. collections
def test_duplicate_judgments_are_warned_with_their_lines_and_the_last_counts(tmp_path, caplog):
    """Warned, not refused: trec_eval and pytrec_eval read such qrels and keep the last line; pretrieve scores the
    same, and names the lines so that they can be fixed."""
    from pretrieve.data.beir import load_qrels

    qrels = tmp_path / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n1\t17\t1\n1\t46\t1\n1\t17\t0\n")
    with caplog.at_level("WARNING"):
        judged = load_qrels(qrels)
    assert judged == {"1": {"17": 0, "46": 1}}
    assert "lines 2 and 4 judge ('1', '17') 1 then 0" in caplog.text and "1 with another grade" in caplog.text


@pytest.mark.parametrize("where, record, field", [
    ("corpus.jsonl", {"_id": "doc\twith tab", "title": "", "text": "x"}, "_id"),
    ("corpus.jsonl", {"_id": "doc\nnewline", "title": "", "text": "x"}, "_id"),
    ("corpus.jsonl", {"_id": "doc space", "title": "", "text": "x"}, "_id"),
    ("queries.jsonl", {"_id": "q space", "text": "x"}, "_id"),
])
def test_ids_a_run_cannot_hold_are_refused_by_data_check(where, record, field, tmp_path, capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    with open(data / where, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    code, err = _main(capsys, monkeypatch, "data", "check", str(data))
    _one_error(code, err, str(data / where), f"field '{field}'", "contains whitespace")
    # at load, before anything is encoded: bm25 (and dense) read the collection through the same parser
    code, err = _main(capsys, monkeypatch, "bm25", "--data", str(data), "--out", str(tmp_path / "r.trec"))
    _one_error(code, err, "contains whitespace")
    assert not (tmp_path / "r.trec").exists()


def test_a_judged_id_with_whitespace_is_refused_on_its_line(tmp_path, capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    with open(data / "qrels" / "test.tsv", "a", encoding="utf-8") as handle:
        handle.write("q space\td0\t1\n")
    code, err = _main(capsys, monkeypatch, "data", "check", str(data))
    _one_error(code, err, "qrels", "field 'query-id'", "contains whitespace")


def test_a_json_line_nested_100000_deep_is_one_line(tmp_path, capsys, monkeypatch):
    data = write_collection(tmp_path / "tiny")
    with open(data / "corpus.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"_id": "deep", "text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    for command in (["data", "check", str(data)], ["bm25", "--data", str(data), "--out", str(tmp_path / "r.trec")]):
        code, err = _main(capsys, monkeypatch, *command)
        _one_error(code, err, str(data / "corpus.jsonl"), "nested too deeply")


# ------------------------------------------------------------------------------------------ 4. config files
def _alias_bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefghijklmnop", "bcdefghijklmnopq"[:levels - 1]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [9, 12])
def test_a_yaml_alias_bomb_is_refused_in_under_a_second(levels, tmp_path):
    import time

    from pretrieve.errors import InputError
    from pretrieve.io_utils import load_config_file

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(levels))
    assert len(bomb.read_bytes()) < 500
    started = time.perf_counter()
    with pytest.raises(InputError, match="alias bomb"):
        load_config_file(bomb)
    assert time.perf_counter() - started < 1.0


def test_shared_but_small_yaml_aliases_are_kept(tmp_path):
    from pretrieve.io_utils import load_config_file

    config = tmp_path / "ok.yaml"
    config.write_text("common: &c {lr: 1.0e-4, batch_size: 8}\nfirst: *c\nsecond: *c\n")
    assert load_config_file(config)["second"] == {"lr": 1e-4, "batch_size": 8}


def test_run_answers_the_alias_bomb_in_one_line(tmp_path, capsys, monkeypatch):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(9))
    code, err = _main(capsys, monkeypatch, "run", str(bomb))
    _one_error(code, err, str(bomb), "alias bomb")


# ------------------------------------------------------------------------------------------ 5. model files
def test_a_weight_of_the_wrong_shape_is_one_line(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "m_st_shape"
    shutil.copytree(tiny_bert_dir, model)
    weights = model / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(key for key in tensors if "word_embeddings" in key)
    tensors[name] = torch.zeros(7, 7)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    data = write_collection(tmp_path / "tiny")
    code, err = _main(capsys, monkeypatch, "dense", "--model", str(model), "--data", str(data),
                      "--out", str(tmp_path / "r.trec"), "--no-cache")
    _one_error(code, err, str(weights), "do not fit the model's config.json")


# ------------------------------------------------------------------------------------------ 6. divergence
class _OneProcess:
    is_main_process = True

    def wait_for_everyone(self) -> None:
        pass


def _checkpoint(out: Path, step: int, scale: float, start: float) -> Path:
    import torch
    from safetensors.torch import save_file

    from pretrieve.train import checkpoint as ckpt
    from pretrieve.train.guard import WEIGHT_NORM_KEY

    path = ckpt.checkpoint_root(out) / f"step-{step}"
    path.mkdir(parents=True)
    save_file({"w": torch.full((4,), scale)}, str(path / "model.safetensors"))
    (path / ckpt.STATE_FILE).write_text(json.dumps({"step": step, WEIGHT_NORM_KEY: start}))
    return path


def test_a_diverged_checkpoint_left_by_factor_0_is_never_called_healthy(tmp_path):
    """--divergence-factor 0 turns the checks off, so exploded checkpoints are written; the stop names the newest
    one left by what its weights are (read back), and the advice fits the problem."""
    from pretrieve.errors import TrainingDiverged
    from pretrieve.train.guard import stop_diverged

    out = tmp_path / "run"
    _checkpoint(out, 2, 1.0, start=2.0)                      # norm 2.0: the start's
    exploded = _checkpoint(out, 6, 1e6, start=2.0)           # norm 2e6: a million times the start's
    with pytest.raises(TrainingDiverged) as caught:
        stop_diverged(_OneProcess(), out, 8, 8, "the loss is nan")
    message = str(caught.value)
    assert f"the newest checkpoint left, {exploded}, is not healthy either" in message
    assert "last healthy" not in message and "raise --divergence-factor" not in message and "--lr" in message
    healthy = tmp_path / "healthy"
    kept = _checkpoint(healthy, 2, 1.0, start=2.0)
    with pytest.raises(TrainingDiverged) as caught:
        stop_diverged(_OneProcess(), healthy, 8, 8, "the loss stayed above 10 times the level 3 (…)")
    assert f"the last healthy checkpoint is kept: {kept}" in str(caught.value)
    assert "raise --divergence-factor" in str(caught.value)


# ------------------------------------------------------------------------------------------ 7. estimates
def test_the_run_size_estimate_counts_what_bm25_writes(tmp_path, capsys, monkeypatch):
    """The estimate counts ids, ranks and tag as written (a 1-character document id and an 8-character score at
    least): within a factor 2 of the run, never above it (the review's was 13 times too low)."""
    from pretrieve.cli.retrieval import _documents_up_to
    from pretrieve.data.trec import run_bytes
    from pretrieve.data.collection import BeirCollection

    data = write_collection(tmp_path / "tiny")
    run = tmp_path / "r.trec"
    code, err = _main(capsys, monkeypatch, "bm25", "--data", str(data), "--out", str(run), "--k", "30")
    assert code == 0, err
    collection = BeirCollection(data)
    estimate = run_bytes(collection.load_queries("test"), 30, _documents_up_to(collection.corpus_path, 30), "bm25")
    assert run.stat().st_size / 2 < estimate <= run.stat().st_size
    assert _documents_up_to(collection.corpus_path, 1000) == 40


# ------------------------------------------------------------------------------------------ 1. (bench) one writer
def test_bench_quality_refuses_a_busy_out_before_any_work(tmp_path, capsys, monkeypatch):
    """Two `bench quality --commit` on one --out: the second is refused in one line at once (the review saw it
    commit FAILED records of cells the first was writing)."""
    import os

    from pretrieve.outputs import DirectoryLock

    out = tmp_path / "bench"
    with DirectoryLock(out if out.mkdir() is None else out):   # held as the first run would
        code, err = _main(capsys, monkeypatch, "bench", "quality", "--smoke", "--out", str(out),
                          "--records", str(tmp_path / "records"))
    _one_error(code, err, f"PID {os.getpid()}", "being written by another pretrieve process")
    assert not (tmp_path / "records").exists()
