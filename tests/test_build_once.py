"""Concurrent commands share work instead of racing (issue 22, item 9): on a fresh collection the Arrow cache is
built once while the others wait for it; a training command on a busy output is refused before it loads its model
or data."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pretrieve.data import arrow
from pretrieve.errors import OutputBusyError
from pretrieve.outputs import DirectoryLock


def _corpus(root: Path, n: int = 50) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"passage {i}"}) + "\n"
                            for i in range(n)))
    return path


def test_concurrent_builds_of_a_fresh_corpus_convert_it_once(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path / "c")
    started, release = threading.Event(), threading.Event()
    calls = []
    original = arrow.run_parts

    def slow_run_parts(*args, **kwargs):
        calls.append(threading.current_thread().name)
        started.set()
        assert release.wait(timeout=120)
        return original(*args, **kwargs)

    monkeypatch.setattr(arrow, "run_parts", slow_run_parts)
    results, errors = {}, []

    def build(name: str) -> None:
        try:
            results[name] = arrow.build("corpus", corpus, num_proc=1)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    first = threading.Thread(target=build, args=("first",), name="first")
    first.start()
    assert started.wait(timeout=120)                  # the first is converting
    second = threading.Thread(target=build, args=("second",), name="second")
    second.start()
    second.join(timeout=2)
    assert second.is_alive(), "the second command did not wait for the first's build"
    release.set()
    first.join(timeout=120)
    second.join(timeout=120)
    assert not errors, errors
    assert calls == ["first"]                         # converted once; the second found it current
    assert results["first"] == results["second"]
    assert len(arrow.load(results["second"])) == 50


def test_a_busy_output_is_refused_before_the_model_is_read(tmp_path):
    """The lock comes first in the training-run template: a second run on a busy --out is refused at once, even
    with a model that cannot be loaded (nothing else is read before the lock)."""
    from pretrieve.train.pretrainer import PretrainConfig, pretrain

    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one passage\n")
    out = tmp_path / "out"
    with DirectoryLock(out):
        with pytest.raises(OutputBusyError, match="being written by another pretrieve process"):
            pretrain(PretrainConfig(model=str(model), corpus=str(corpus), out=str(out), max_steps=1))
