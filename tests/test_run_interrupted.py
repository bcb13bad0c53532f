"""``pretrieve run`` stopped by SIGTERM or Ctrl-C outside a training stage (select, fuse, evaluate) says which stage
stopped and how to continue, as training stages do, and exits 143 / 130 (issue 39, review item #33)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal

import pytest
import yaml

from pretrieve.recipe.schema import STAGES

from test_finetune import tiny_collection  # noqa: F401 - a fixture


@pytest.mark.parametrize("how, code, said", [("sigterm", 143, "SIGTERM"), ("ctrl-c", 130, "Ctrl-C")])
def test_a_run_stopped_in_evaluate_says_what_happened(how, code, said, tiny_mlm_dir, tiny_collection, tmp_path,
                                                     monkeypatch, caplog):
    from pretrieve.recipe import run_recipe

    def stopped(state, options, label, show_progress):
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)   # as `kill -TERM` of the process while it evaluates
        raise KeyboardInterrupt

    monkeypatch.setitem(STAGES, "evaluate", dataclasses.replace(STAGES["evaluate"], run=stopped))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "model": str(tiny_mlm_dir),
                                      "data": str(tiny_collection),
                                      "stages": [{"evaluate": {"bm25": True, "zero_shot": True}}]}))
    def unhandled(signum, frame):   # the caller's handler: what the old code left SIGTERM to (the default kills)
        raise RuntimeError("SIGTERM reached the caller's handler")

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises((SystemExit, KeyboardInterrupt)) as caught:
            run_recipe(recipe, show_progress=False)
        assert signal.getsignal(signal.SIGTERM) is unhandled          # the handler is the caller's again
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (caught.value.code if isinstance(caught.value, SystemExit) else 130) == code
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(f"interrupted ({said}) during the stage evaluate (1 of 1)" in m and "run the same command again" in m
               for m in messages), messages
