"""One progress display (:mod:`pretrieve.progress`): away from a terminal it writes clean lines — every tenth of a
known total, the final count of an unknown one — and a whole CLI run with its output in a log file leaves no ``\\r``
frame or ANSI sequence there (training, tokenising, model loading); transformers' spurious "This checkpoint seem
corrupted" notice about a checkpoint without an MLM head is not shown, a real one is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from pretrieve.modeling.encoder import HeldTieNotices
from pretrieve.progress import Progress

from test_finetune import write_collection

REPO = Path(__file__).resolve().parents[1]


def lines_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pretrieve.progress"]


def test_a_known_total_writes_a_line_per_tenth(caplog):
    caplog.set_level(logging.INFO)
    with Progress(total=95, desc="encode", unit="texts") as progress:
        for _ in range(95):
            progress.update(1)
        progress.set_postfix(loss="0.4100")
    lines = lines_of(caplog)
    assert len(lines) == 10 and lines[0].startswith("encode: 10/95 texts (11%)") and "ETA" in lines[0]
    assert lines[-1].startswith("encode: 95/95 texts (100%)")
    assert not any("\r" in line or "\x1b" in line for line in lines)


def test_an_unknown_total_writes_its_count_at_the_end_and_an_iterable_is_counted(caplog):
    caplog.set_level(logging.INFO)
    with Progress(desc="BM25 tokenise", unit="docs") as progress:
        progress.update(40)
        progress.set_postfix(chunks=2)
    assert lines_of(caplog) == [lines_of(caplog)[0]] and lines_of(caplog)[0].startswith("BM25 tokenise: 40 docs, ")
    assert lines_of(caplog)[0].endswith("chunks=2")
    caplog.clear()
    assert list(Progress(["a", "b", "c", "d"], desc="score", unit="chunks")) == ["a", "b", "c", "d"]
    assert lines_of(caplog)[-1].startswith("score: 4/4 chunks (100%)")
    caplog.clear()
    with Progress(total=10, desc="off", disable=True) as progress:
        progress.update(10)
    assert lines_of(caplog) == []


def test_a_resumed_bar_starts_at_its_initial_count(caplog):
    caplog.set_level(logging.INFO)
    with Progress(total=20, initial=10, desc="finetune", unit="step") as progress:
        progress.update(2)
    assert lines_of(caplog)[0].startswith("finetune: 12/20 step (60%)")


def test_held_tie_notices_show_only_those_outside_the_mlm_head():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    target = logging.getLogger("transformers.modeling_utils")
    target.addHandler(handler)
    try:
        with HeldTieNotices() as held:
            for pair in (("cls.predictions.bias", "cls.predictions.decoder.bias"),
                         ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight")):
                target.warning("This checkpoint seem corrupted. The tied weights mapping for this model specifies to "
                               f"tie {pair[0]} to {pair[1]}, but both are absent from the checkpoint")
            target.warning("another notice")
        assert [r.getMessage() for r in records] == ["another notice"]
        held.release(("cls.",))
        assert len(records) == 2 and "bert.embeddings.word_embeddings.weight" in records[1].getMessage()
    finally:
        target.removeHandler(handler)


def test_a_cli_run_into_a_log_file_has_clean_progress_lines_and_no_spurious_notice(tiny_bert_dir, tmp_path):
    data = write_collection(tmp_path / "data" / "tiny")
    log = tmp_path / "run.log"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PRETRIEVE_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "TERM": "xterm-256color", "COLUMNS": "120"}
    with open(log, "w") as handle:   # stdout and stderr into one file: not a terminal
        done = subprocess.run([sys.executable, "-m", "pretrieve", "pretrain", "--model", str(tiny_bert_dir),
                               "--corpus", str(data), "--out", str(tmp_path / "pt"), "--steps", "4",
                               "--batch-size", "4", "--max-len", "32", "--warmup-ratio", "0", "--save-every", "100"],
                              stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "\x1b" not in text, text
    assert "4/4 step (100%)" in text, text                               # the training bar, as lines
    assert "has no MLM head" in text and "seem corrupted" not in text, text
