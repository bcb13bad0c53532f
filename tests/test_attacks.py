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
import sys
from pathlib import Path

import pytest
import yaml

from test_finetune import write_collection


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


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
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = "retrieval dense passage encoder query document ranking vector index token model training".split()
    lines = [" ".join(words[(i * 5 + j) % len(words)] for j in range(10 + i % 7)) + "." for i in range(32)]
    path = tmp_path_factory.mktemp("corpus") / "passages.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _pretrain(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--model", str(model), "--corpus", str(corpus), "--out", str(out), "--method", "mlm",
            "--max-len", "32", "--batch-size", "4", "--steps", "2", "--save-every", "1", "--log-every", "1", *extra]


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
