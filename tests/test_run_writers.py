"""One writer of run files: only ``retrieval/runs.py`` writes TREC runs (``data/trec.py`` owns the line format).

The rule, read from the syntax tree of every module of ``src/pretrieve`` except those two:

* no module takes a run writer of :mod:`pretrieve.data.trec` (``write_run``, ``RunWriter``, ``open_run_writer``,
  ``run_lines``, ``query_lines``), whether imported by name (``from pretrieve.data.trec import write_run``,
  ``from pretrieve.data import write_run``, ``from .trec import …``) or reached as an attribute (``trec.write_run``,
  ``pretrieve.data.write_run``) — the one exception is the data package re-exporting ``write_run`` for users
  (``data/__init__.py``, which never calls it);
* no string outside a docstring holds the line format's fixed column ``Q0``: a run line written by hand (an
  f-string ``f"{qid} Q0 {doc} …"``, a ``"%s Q0 %s"`` template, a ``" ".join([qid, "Q0", …])``).

Every run — the retriever's, a lexical engine's, the probe's, mined, re-ranked, fused — goes through
:func:`pretrieve.retrieval.runs.write_run_file` or :func:`pretrieve.retrieval.runs.run_part`. The checker is
tested on planted violations; the probe, which used to search and write outside ``runs.py``, on its freshness.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "pretrieve"
WRITERS = {"write_run", "RunWriter", "open_run_writer", "run_lines", "query_lines"}
HOMES = {"retrieval/runs.py", "data/trec.py"}
RE_EXPORTS = {"data/__init__.py": {"write_run"}}     # the public name, re-exported and never called there
COLUMN = "Q0"


def run_writing(source: str, module: str = "x.py") -> list[str]:
    """Where ``source`` (the module ``module``, relative to ``src/pretrieve``) writes run lines itself:
    ``"line N: what"`` for each place."""
    tree = ast.parse(source)
    allowed = RE_EXPORTS.get(module, set())
    prose = {id(node.body[0].value) for node in ast.walk(tree)
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
             and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "pretrieve"):
            found += [f"line {node.lineno}: imports {alias.name}" for alias in node.names
                      if alias.name in WRITERS and alias.name not in allowed]
        elif isinstance(node, ast.Attribute) and node.attr in WRITERS:
            found.append(f"line {node.lineno}: uses .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in allowed and not isinstance(node.ctx, ast.Store):
            found.append(f"line {node.lineno}: calls the re-exported {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose \
                and COLUMN in node.value.replace("%s", " ").split():
            found.append(f"line {node.lineno}: writes the {COLUMN} column of a run line")
    return found


def test_only_runs_py_and_the_line_format_write_run_files():
    modules = sorted(path for path in SRC.rglob("*.py") if path.relative_to(SRC).as_posix() not in HOMES)
    assert len(modules) > 100
    found = {path.relative_to(SRC).as_posix(): where for path in modules
             if (where := run_writing(path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix()))}
    assert found == {}, "write runs through pretrieve.retrieval.runs (write_run_file / run_part)"


@pytest.mark.parametrize("planted", [
    "from pretrieve.data.trec import Run, write_run\n",
    "from pretrieve.data import write_run\n",
    "from .trec import RunWriter\n",
    "from pretrieve.data import trec\ntrec.query_lines('q', {}, 'p')\n",
    "import pretrieve.data.trec\npretrieve.data.trec.run_lines({}, 'p')\n",
    "def f(handle, qid, doc, rank, score):\n    handle.write(f'{qid} Q0 {doc} {rank} {score} tag\\n')\n",
    "def f(handle, row):\n    handle.write('%s Q0 %s %d %r %s\\n' % row)\n",
    "def f(qid, doc):\n    return ' '.join([qid, 'Q0', doc, '1', '1.0', 'x'])\n",
])
def test_the_check_finds_a_planted_run_writer(planted):
    assert run_writing(planted)


def test_the_check_lets_reading_prose_and_the_re_export_pass():
    assert run_writing('"""Runs: ``qid Q0 docid rank score tag``."""\nfrom pretrieve.data.trec import read_run\n'
                       "def f():\n    '''A Q0 line.'''\n    return read_run('x')\n") == []
    assert run_writing("from pretrieve.data.trec import write_run\n__all__ = ['write_run']\n",
                       "data/__init__.py") == []
    assert run_writing("from pretrieve.data.trec import write_run\nwrite_run({}, 'x')\n", "data/__init__.py")


def test_the_probe_searches_through_runs_py_unless_its_runs_are_current(tiny_mlm_dir, tmp_path, monkeypatch):
    """The probe's runs carry the recipe's names and freshness records: a second probe reads them back, loads no
    model and gives the same scores."""
    from test_finetune import write_collection

    from pretrieve import artifacts
    from pretrieve.analysis.probe import cls_probe
    from pretrieve.data.trec import read_run
    from pretrieve.retrieval import load

    data = write_collection(tmp_path / "toy")
    first = cls_probe(tiny_mlm_dir, [data], tmp_path / "probe", depth=5, precision="fp32")
    runs = sorted(path.name for path in (tmp_path / "probe" / "runs").glob("*.trec"))
    assert runs == ["cos__toy.trec", "cos__toy:train.trec", "dot__toy.trec", "dot__toy:train.trec"]
    settings = json.loads(artifacts.sidecar_path(tmp_path / "probe" / "runs" / "cos__toy.trec").read_text())["settings"]
    assert (settings["pooling"], settings["normalize"], settings["depth"]) == ("cls", True, 5)
    assert len(read_run(tmp_path / "probe" / "runs" / "dot__toy.trec")) == 4

    monkeypatch.setattr(load, "load_retriever", lambda *a, **k: pytest.fail("a current probe loaded a model"))
    assert cls_probe(tiny_mlm_dir, [data], tmp_path / "probe", depth=5, precision="fp32") == first
