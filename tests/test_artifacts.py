"""The freshness contract (pretrieve.artifacts): atomic artefacts with sidecars, and the one currency check."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from pretrieve import artifacts


def _write_run(path, text="q1 Q0 d1 1 2.0 x\nq1 Q0 d2 2 1.0 x\n", settings=None, inputs=None):
    with artifacts.write_file(path, "run", settings or {"k": 10}, inputs) as tmp:
        tmp.write_text(text)
    return path


def test_written_file_is_current_with_same_settings_and_inputs(tmp_path):
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights-1")
    run = _write_run(tmp_path / "run.trec", inputs={"model": model})
    assert run.read_text().startswith("q1")
    assert artifacts.sidecar_path(run).name == "run.trec.artifact.json"
    status = artifacts.check(run, {"k": 10}, {"model": model}, kind="run")
    assert status.current and bool(status)


def test_changed_settings_are_named(tmp_path):
    run = _write_run(tmp_path / "run.trec", settings={"k": 10, "lr": 5e-4})
    status = artifacts.check(run, {"k": 10, "lr": 1e-3})
    assert not status.current
    assert status.differing == ["lr"]
    assert "lr: 0.0005 -> 0.001" in status.reason


def test_changed_input_content_makes_it_stale_but_a_moved_input_does_not(tmp_path):
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights-1")
    run = _write_run(tmp_path / "run.trec", inputs={"model": model})
    moved = tmp_path / "elsewhere.bin"
    shutil.copy(model, moved)
    assert artifacts.is_current(run, {"k": 10}, {"model": moved})   # content, not path
    model.write_bytes(b"weights-2")
    status = artifacts.check(run, {"k": 10}, {"model": model})
    assert not status.current and status.differing == ["model"]


def test_truncated_or_emptied_file_is_not_current(tmp_path):
    run = _write_run(tmp_path / "run.trec")
    with open(run, "r+") as handle:
        handle.truncate(10)
    status = artifacts.check(run, {"k": 10})
    assert not status.current and "truncated" in status.reason
    run = _write_run(tmp_path / "run2.trec")
    run.write_text("")
    assert not artifacts.is_current(run, {"k": 10})


def test_same_size_edit_is_detected_by_checksum(tmp_path):
    run = _write_run(tmp_path / "run.trec", text="abc\n")
    time.sleep(0.01)
    run.write_text("abd\n")
    assert not artifacts.is_current(run, {"k": 10})


def test_file_without_sidecar_or_failed_write_is_not_current(tmp_path):
    plain = tmp_path / "run.trec"
    plain.write_text("q1 Q0 d1 1 1.0 x\n")
    status = artifacts.check(plain, {})
    assert not status.current and status.exists
    target = tmp_path / "failed.trec"
    with pytest.raises(RuntimeError):
        with artifacts.write_file(target, "run", {}) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("killed")
    assert not target.exists() and not artifacts.sidecar_path(target).exists()
    assert list(tmp_path.glob(".failed.trec*")) == []


def test_rewrite_replaces_sidecar(tmp_path):
    run = _write_run(tmp_path / "run.trec", settings={"k": 10})
    _write_run(run, text="q2 Q0 d3 1 1.0 x\n", settings={"k": 20})
    assert artifacts.is_current(run, {"k": 20}) and not artifacts.is_current(run, {"k": 10})


def test_directory_artefact_sidecar_inside_and_file_changes_detected(tmp_path):
    target = tmp_path / "index"
    with artifacts.write_dir(target, "index", {"dim": 4}) as tmp:
        (tmp / "ids.json").write_text('["a", "b"]')
        (tmp / "vectors.bin").write_bytes(b"\0" * 32)
    assert (target / "artifact.json").exists()
    assert artifacts.is_current(target, {"dim": 4}, kind="index")
    assert not artifacts.is_current(target, {"dim": 4}, kind="run")
    (target / "vectors.bin").write_bytes(b"\0" * 16)
    assert "truncated" in artifacts.check(target, {"dim": 4}).reason
    (target / "vectors.bin").write_bytes(b"\0" * 32)
    (target / "extra").write_text("x")
    assert "added" in artifacts.check(target, {"dim": 4}).reason


def test_fingerprint_uses_recorded_digest_and_equals_hash_of_bytes(tmp_path):
    run = _write_run(tmp_path / "run.trec")
    copy = tmp_path / "copy" / "run.trec"
    copy.parent.mkdir()
    shutil.copy(run, copy)   # no sidecar: hashed
    assert artifacts.fingerprint(run) == artifacts.fingerprint(copy)
    with pytest.raises(FileNotFoundError):
        artifacts.fingerprint(tmp_path / "missing")


def test_remove_stale_temporaries_keeps_young_and_ordinary_files(tmp_path):
    old_file = tmp_path / ".run.trec.abc.tmp"
    old_file.write_text("x")
    old_dir = tmp_path / ".shard-0.xyz.tmp"
    old_dir.mkdir()
    (old_dir / "embeddings.npy").write_text("x")
    keep = tmp_path / "run.trec"
    keep.write_text("x")
    past = time.time() - 3600
    for path in (old_file, old_dir):
        os.utime(path, (past, past))
    young = tmp_path / ".young.tmp"
    young.write_text("x")
    removed = artifacts.remove_stale_temporaries(tmp_path, older_than=time.time() - 60)
    assert sorted(p.name for p in removed) == sorted([old_file.name, old_dir.name])
    assert keep.exists() and young.exists()


def test_a_derived_cache_inside_a_directory_artefact_is_not_its_content(tmp_path):
    target = tmp_path / "collection"
    with artifacts.write_dir(target, "synthetic-collection", {"n": 2}) as tmp:
        (tmp / "corpus.jsonl").write_text('{"_id": "d0", "text": "x"}\n')
    before = artifacts.fingerprint(target)
    cache = target / artifacts.DERIVED_CACHE_DIR / "corpus.arrow"
    cache.mkdir(parents=True)
    (cache / "data-00000-of-00001.arrow").write_bytes(b"arrow")
    assert artifacts.is_current(target, {"n": 2}, kind="synthetic-collection")
    assert artifacts.fingerprint(target) == before
    (target / "queries.jsonl").write_text("{}")                # a real addition still counts
    assert "added" in artifacts.check(target, {"n": 2}).reason
