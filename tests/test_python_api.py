"""The Python API (``import pretrieve``): the verbs are exported, imported lazily, change no global state, take
collection names, and their errors name Python parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pretrieve
from pretrieve.data import registry
from pretrieve.errors import ConfigError, InputError

from test_finetune import write_collection

VERBS = {"pretrain", "finetune", "load_retriever", "encode", "search", "bm25", "fuse", "evaluate", "run_recipe"}
HEAVY = ("torch", "transformers", "sentence_transformers", "faiss")

# Snapshots what a library must leave alone, imports pretrieve and calls the torch-free verbs, then compares. (The
# libraries they import configure their own loggers on import — ir_measures adds a handler to its logger, requests and
# urllib3 NullHandlers and warning filters — which no caller of theirs can avoid; pretrieve's loggers get none.)
STATE_SCRIPT = """
import json, logging, os, sys

def loggers():
    return {name: (lg.level, list(lg.handlers), list(lg.filters))
            for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}

before = (list(logging.root.handlers), logging.root.level, dict(os.environ), list(sys.meta_path))
known = loggers()
import pretrieve
after_import = sorted(m for m in HEAVY if m in sys.modules)
run = pretrieve.bm25(sys.argv[1], k=5)
other = pretrieve.bm25(sys.argv[1], k=5, k1=1.2, b=0.75)
fused = pretrieve.fuse([run, other])
table = pretrieve.evaluate({"bm25": run, "other": other, "fused": fused}, sys.argv[1], measures="nDCG@10")
after = (list(logging.root.handlers), logging.root.level, dict(os.environ), list(sys.meta_path))
now = loggers()
print(json.dumps({
    "heavy_after_import": after_import,
    "heavy_after_calls": sorted(m for m in HEAVY if m in sys.modules),
    "unchanged": [a == b for a, b in zip(before, after)],
    "changed_loggers": sorted(n for n, state in known.items() if now[n] != state),
    "pretrieve_loggers_with_handlers": sorted(n for n, state in now.items()
                                              if n.split(".")[0] == "pretrieve" and state[1]),
    "all": sorted(pretrieve.__all__), "dir": sorted(set(dir(pretrieve)) & VERBS),
    "rows": list(table.results),
}))
"""


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def test_import_exports_the_verbs_lazily_and_changes_no_global_state(tmp_path):
    data = write_collection(tmp_path / "toy")
    script = f"HEAVY = {HEAVY!r}\nVERBS = {VERBS!r}\n" + STATE_SCRIPT
    result = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True, text=True, env=_env(),
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["heavy_after_import"] == [] and report["heavy_after_calls"] == []
    assert report["unchanged"] == [True] * 4        # root handlers and level, environment, import hooks
    assert report["changed_loggers"] == [] and report["pretrieve_loggers_with_handlers"] == []
    assert VERBS <= set(report["all"]) and set(report["dir"]) == VERBS
    assert report["rows"] == ["bm25", "other", "fused"]


def test_plots_leave_the_callers_matplotlib_backend_alone(tmp_path):
    cell = "{'mean': 0.5, 'std': 0.0, 'n': 1}"
    summary = (f"{{'collections': ['c'], 'settings': {{'seeds': [0], 'base': 'minilm'}}, 'methods': {{'mlm': "
               f"{{'seeds': [0], 'scores': {{'nDCG@10': {{'c': {cell}, 'avg': {cell}}}}}}}}}}}")
    code = ("import matplotlib, numpy as np\nmatplotlib.use('svg')\n"
            "from pretrieve.analysis.coverage import CoverageReport, plot_coverage\n"
            "from pretrieve.analysis.divergence import DivergenceResult, plot_tsne\n"
            "from pretrieve.bench.quality.report import plot_results\n"
            "report = CoverageReport('m', (1, 2), {1: 0.5, 2: 0.25}, 3)\n"
            f"plot_coverage({{'m': report}}, {str(tmp_path / 'coverage.png')!r})\n"
            "points = np.zeros((4, 2))\n"
            f"plot_tsne({{'m': DivergenceResult(0.1, 0.2, points, points + 1)}}, {str(tmp_path / 'tsne.png')!r})\n"
            f"plot_results({summary}, {str(tmp_path / 'results.png')!r})\n"
            "print(matplotlib.get_backend())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "svg"
    for name in ("coverage.png", "tsne.png", "results.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Imports the libraries pretrieve builds on first (their own import-time set-up is theirs), snapshots the global state,
# then imports every module of the library (the command line, which configures its process, aside) and compares.
IMPORT_ALL_SCRIPT = """
import importlib, json, logging, os, pkgutil, sys
import accelerate, accelerate.utils.other, matplotlib, sentence_transformers, torch, transformers
import pretrieve

def loggers():
    return {name: (lg.level, list(lg.handlers), list(lg.filters))
            for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}

def state():
    return (list(logging.root.handlers), logging.root.level, list(logging.root.filters), dict(os.environ),
            list(sys.meta_path), matplotlib.get_backend())

before, known = state(), loggers()
names = [m.name for m in pkgutil.walk_packages(pretrieve.__path__, "pretrieve.")
         if not m.name.startswith(("pretrieve.cli", "pretrieve.__main__"))]
for name in names:
    importlib.import_module(name)
now = loggers()
print(json.dumps({"modules": names, "unchanged": [a == b for a, b in zip(before, state())],
                  "changed_loggers": sorted(n for n, s in known.items() if now[n] != s)}))
"""


def test_importing_any_module_changes_no_global_state():
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL_SCRIPT], capture_output=True, text=True, env=_env(),
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "pretrieve.train.checkpoint" in report["modules"] and "pretrieve.bench.quality.report" in report["modules"]
    assert report["unchanged"] == [True] * 6        # root handlers, level, filters; environment; import hooks; backend
    assert report["changed_loggers"] == []          # e.g. no filter on accelerate's logger


@pytest.fixture
def named(tmp_path, monkeypatch) -> Path:
    root = write_collection(tmp_path / "data" / "scifact")
    monkeypatch.setenv("PRETRIEVE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRETRIEVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(registry.OFFLINE_ENV, "1")
    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)
    monkeypatch.chdir(tmp_path)
    return root


def test_collection_names_resolve_as_on_the_command_line(named, tmp_path):
    from pretrieve.data.trec import write_run

    run = pretrieve.bm25("scifact", k=10)
    assert set(run) == {f"t{i}" for i in range(4)}
    assert pretrieve.bm25(named, k=10) == run                                    # a path: the same collection
    mine = write_collection(tmp_path / "mine" / "scifact")
    assert pretrieve.bm25("scifact", k=10, data_root=tmp_path / "mine") == run   # data_root= is looked at first
    (mine / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nt0\td0\t1\n")
    assert set(pretrieve.bm25("scifact", k=10, data_root=tmp_path / "mine")) == {"t0"}
    custom = pretrieve.bm25("scifact", queries={"x": "report on " + "anything"}, k=3)
    assert set(custom) == {"x"} and len(custom["x"]) == 3
    write_run(run, tmp_path / "bm25.trec")
    from_file = pretrieve.evaluate(tmp_path / "bm25.trec", "scifact", measures="nDCG@10", test=None)
    in_memory = pretrieve.evaluate(run, qrels=named / "qrels" / "test.tsv", measures="nDCG@10")
    assert list(from_file.results) == ["bm25"] and list(in_memory.results) == ["run1"]
    assert from_file.value("bm25", "nDCG@10") == pytest.approx(in_memory.value("run1", "nDCG@10"), abs=1e-4)


def test_errors_name_python_parameters(named, tmp_path):
    run = pretrieve.bm25("scifact", k=10)
    messages = []

    def raises(error: type, match: str, call, *args, **kwargs) -> None:
        with pytest.raises(error, match=match) as caught:
            call(*args, **kwargs)
        messages.append(str(caught.value))

    raises(InputError, r"unknown collection 'scifactt'.*data_root", pretrieve.bm25, "scifactt")
    raises(ConfigError, "give exactly one of data .* or qrels", pretrieve.evaluate, run)
    raises(ConfigError, "runs: give at least two runs", pretrieve.fuse, [run])
    raises(ConfigError, "norm and weights belong to method='wsum'", pretrieve.fuse, [run, run], weights=[0.5, 0.5])
    raises(ConfigError, "fitting needs both fit_data .* and fit_runs", pretrieve.fuse, [run, run], method="wsum",
           fit_data="scifact")
    raises(ConfigError, "missing required argument.*: out", pretrieve.finetune, "minilm", "scifact", "")
    raises(ConfigError, r"finetune\(\)\.num_negative: unknown option; did you mean num_negatives", pretrieve.finetune,
           "minilm", "scifact", tmp_path / "ft", num_negative=3)
    raises(ConfigError, r"pretrain\(\)\.max_step: unknown option; did you mean max_steps", pretrieve.pretrain,
           "minilm", "scifact", tmp_path / "pt", max_step=3)
    raises(ConfigError, "side must be one of query, passage", pretrieve.encode, "minilm", ["text"], side="document")
    assert [m for m in messages if "--" in m.replace("`pretrieve run --data-root`", "")] == []   # no CLI flag
    assert not (tmp_path / "ft").exists() and not (tmp_path / "pt").exists()


def test_a_recipe_dict_is_validated_before_anything_is_written(named, tmp_path):
    recipe = {"name": "dict", "out": str(tmp_path / "out"), "model": "minilm", "data": "scifact",
              "stages": [{"evaluate": {"zero_shot": True, "depht": 20}}]}
    with pytest.raises((ConfigError, InputError), match=r"stages\[0\]\.evaluate.*depht.*did you mean depth"):
        pretrieve.run_recipe(recipe)
    assert not (tmp_path / "out").exists()
