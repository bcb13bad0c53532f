"""A training run's space check counts what it really still writes (issue 39, review items #12/#13): the partial
checkpoint save a killed run left (``checkpoints/.step-N.tmp``) is removed before the check and never survives a
run, and the rerun of a finished run, which writes nothing, is not refused on a nearly full disk."""

from __future__ import annotations

from collections import namedtuple

import pytest

from pretrieve import outputs
from pretrieve.errors import InputError
from pretrieve.train.pretrainer import pretrain

from test_pretrain import _config, small_corpus  # noqa: F401 - small_corpus is a fixture

Usage = namedtuple("Usage", "total used free")


def test_a_killed_saves_leftover_is_removed_before_the_space_check(tiny_mlm_dir, small_corpus, tmp_path,
                                                                   monkeypatch):
    out = tmp_path / "pt"
    leftover = out / "checkpoints" / ".step-8.tmp"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"\0" * 1_000_000)   # what a kill -9 during a save leaves
    seen = []
    original = outputs.check_space

    def check_space(path, needed_bytes=0, largest_file=0):
        seen.append((leftover.exists(), needed_bytes))
        return original(path, needed_bytes, largest_file)

    monkeypatch.setattr(outputs, "check_space", check_space)
    pretrain(_config(tiny_mlm_dir, small_corpus, out, max_steps=4, save_every=2, resume=True))
    checks = [exists for exists, needed in seen if needed]    # the training space check (others check nothing)
    assert checks and not any(checks)                       # gone before it, so its space counts as free
    assert not leftover.exists() and (out / "final").is_dir()


def test_a_finished_run_is_reused_on_a_nearly_full_disk(tiny_mlm_dir, small_corpus, tmp_path, monkeypatch):
    out = tmp_path / "pt"
    config = dict(max_steps=2, save_every=0)
    final = pretrain(_config(tiny_mlm_dir, small_corpus, out, **config))
    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda path: Usage(10 ** 9, 10 ** 9 - 1000, 1000))
    assert pretrain(_config(tiny_mlm_dir, small_corpus, out, **config)) == final     # nothing to write: not refused
    with pytest.raises(InputError, match="only 1000 B free|only .* free on this file system"):
        pretrain(_config(tiny_mlm_dir, small_corpus, tmp_path / "other", **config))  # a new run still is
