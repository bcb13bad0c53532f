"""A command costs what its work costs: commands that need no model never import torch, transformers or scipy.

:func:`help_imports` is every module ``python -m pretrieve --help`` loads; ``tests/test_imports_inside_functions.py``
checks the ``# lazy:`` tags of imports inside functions against it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from test_bm25 import write_tiny_collection

HEAVY = ("torch", "transformers", "sentence_transformers", "faiss", "scipy")

# Runs one CLI command in a fresh interpreter and prints which heavy modules it imported.
RUN_AND_LIST_MODULES = """
import sys
from pretrieve.cli import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
print("HEAVY=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def heavy_modules_after(*args: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", RUN_AND_LIST_MODULES.format(heavy=HEAVY), *args],
                            capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    line = [line for line in result.stdout.splitlines() if line.startswith("HEAVY=")][-1]
    return [name for name in line[len("HEAVY="):].split(",") if name]


# `python -m pretrieve --help`, then every module loaded (importlib.import_module's loads included, which
# `-X importtime` does not list).
RUN_HELP_AND_LIST_MODULES = """
import runpy, sys
sys.argv = ["pretrieve", "--help"]
try:
    runpy.run_module("pretrieve", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("MODULES=" + " ".join(sorted(sys.modules)))
"""


def help_imports() -> set[str]:
    """Every module that ``python -m pretrieve --help`` loads."""
    result = subprocess.run([sys.executable, "-c", RUN_HELP_AND_LIST_MODULES], capture_output=True, text=True,
                            env=_env(), timeout=300)
    assert result.returncode == 0 and "bm25" in result.stdout, result.stderr[-2000:]
    line = [line for line in result.stdout.splitlines() if line.startswith("MODULES=")][-1]
    return set(line[len("MODULES="):].split())


def test_help_loads_neither_torch_nor_scipy():
    """The bar, as its command: ``python -X importtime -m pretrieve --help`` imports no torch and no scipy (scipy
    used to come in through the index format module), nor transformers or faiss; and neither does any module
    loaded another way (:func:`help_imports`)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "pretrieve", "--help"], capture_output=True,
                            text=True, env=_env(), timeout=300)
    assert result.returncode == 0 and "bm25" in result.stdout, result.stderr[-2000:]
    timed = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    loaded = help_imports()
    for modules in (timed, loaded):
        assert {"pretrieve.cli.retrieval", "pretrieve.retrieval.index", "numpy"} <= modules   # it sees imports
        assert sorted(name for name in modules if name.split(".")[0] in HEAVY) == []


def test_bm25_evaluate_and_data_check_import_neither_torch_nor_transformers(tmp_path):
    data = write_tiny_collection(tmp_path / "toy")
    run = tmp_path / "bm25.trec"
    # scipy, and only it, where the work needs it: bm25s's sparse scores, ir_measures' measures
    assert heavy_modules_after("bm25", "--data", str(data), "--out", str(run), "--k", "3") == ["scipy"]
    assert run.exists()
    assert heavy_modules_after("evaluate", "--data", str(data), str(run)) == ["scipy"]
    assert heavy_modules_after("data", "check", str(data)) == []
    assert heavy_modules_after("--help") == []


def test_a_model_command_still_gets_transformers_quiet_progress_bars():
    """The transformers progress-bar setting is applied when transformers is imported, after the CLI started."""
    code = ("import sys\nfrom pretrieve.cli import configure_logging\nconfigure_logging()\n"
            "assert 'transformers' not in sys.modules\n"
            "from transformers.utils import logging\nprint(logging.is_progress_bar_enabled())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"


def test_help_is_fast():
    """`pretrieve --help` takes ~0.3 s on an idle 2-core machine (bar: 0.5 s). Measured as the child's CPU time
    (user + system), which a loaded machine does not inflate the way it inflates wall time; the bound is generous
    all the same: importing torch alone takes ~2 s of CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-m", "pretrieve", "--help"], capture_output=True, text=True,
                            env=_env(), timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert result.returncode == 0 and "bm25" in result.stdout
    if cpu > 1.5:
        pytest.fail(f"`pretrieve --help` took {cpu:.2f} s of CPU")
