"""The recipe's stage contract (issue 40): a stage kind is one module — its options, what it needs and gives, how
``--smoke`` shrinks it, what it reads and the rows it adds — and nothing outside it names its kind.

The ``note`` stage below is such a module, written here and nowhere else: it gives a new kind of product
(``note``, a file) and a fusion whose rows the evaluate stage adds, has a size knob that ``--smoke`` shrinks, and
runs in a recipe beside the shipped stages. The other tests read the recipe package's syntax trees: the smoke
transformation and the runner name no stage kind, and no stage imports another.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest

from pretrieve.errors import ConfigError
from pretrieve.recipe import run_recipe, validate_recipe
from pretrieve.recipe.rows import trained_splits
from pretrieve.recipe.runner import RunState
from pretrieve.recipe.schema import STAGES, stage, stage_labels
from pretrieve.retrieval import fusion

RECIPE_PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pretrieve" / "recipe"


# ----------------------------------------------------------------------------------------- the one-file stage
@dataclass
class NoteOptions:
    """Options of the ``note`` stage."""

    lines: int = 1000          # a size knob: --smoke writes at most 2
    name: str = "noted"        # the fusion it defines (a row of every evaluate stage after it)


def needs(options: Mapping[str, Any], recipe: Mapping[str, Any], given: Mapping[str, list[str]], where: str) -> None:
    if "note" in given:   # what the stages before it gave, by the names they declare
        raise ConfigError(f"{where}: one note per recipe (the stage {given['note'][0]} wrote one)")


def smoke(options: dict[str, Any], kit) -> dict[str, Any]:
    options["lines"] = min(int(options.get("lines", 1000)), 2)
    return options


def stage_note(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    out = state.out / label / "note.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"line {i}\n" for i in range(int(options.get("lines", 1000)))), encoding="utf-8")
    state.give("note", label, out)
    state.give("fusion", str(options.get("name", "noted")),
               {"runs": ["bm25", "zero-shot"], "spec": fusion.FusionSpec("rrf", depth=20).check(2)})


@pytest.fixture
def note_stage():
    """Registered with :func:`pretrieve.recipe.schema.stage` as a stage module does, for this test only."""
    stage("note", NoteOptions, needs=needs, gives=("note", "fusion"), smoke=smoke,
          rows=lambda options: [str(options.get("name") or "noted")], name_options=("name",))(stage_note)
    yield
    del STAGES["note"]


def test_a_new_stage_is_one_module(note_stage, tmp_path):
    recipe = {"out": str(tmp_path / "o"), "model": "bert-base-uncased", "data": "msmarco",
              "stages": [{"note": {"lines": 500}},
                         {"evaluate": {"split": "dev", "bm25": True, "zero_shot": True, "final": "noted",
                                       "compare": ["bm25"]}}]}
    results = run_recipe(recipe, out=tmp_path / "s", show_progress=False, smoke=True)
    out = tmp_path / "s"
    resolved = json.loads((out / "recipe.resolved.json").read_text())
    assert resolved["stages"][0] == {"note": {"lines": 2}}   # its own smoke shrinking
    assert (out / "note" / "note.txt").read_text().splitlines() == ["line 0", "line 1"]
    rows = {row["retriever"]: row for row in results["rows"]}
    assert set(rows) == {"bm25", "zero-shot", "noted"}   # its fusion's row, made by the evaluate stage
    assert rows["noted"]["fusion"]["runs"] == ["bm25", "zero-shot"] and rows["noted"]["final"]
    assert list(results["timings_s"]) == ["note", "evaluate"]
    # its declarations take part in validation: its name option is checked, its rows are known to 'expected'
    with pytest.raises(ConfigError, match=r"stages\[0\]\.note\.name: 'a b' is not a name"):
        validate_recipe({**recipe, "stages": [{"note": {"name": "a b"}}, recipe["stages"][1]]})
    expected = [{"table": "T", "collection": "msmarco:dev", "row": "noted", "values": {"nDCG@10": 0.5}}]
    validate_recipe({**recipe, "expected": expected})
    with pytest.raises(ConfigError, match=r"stages\[1\]\.note: one note per recipe \(the stage note wrote one\)"):
        validate_recipe({**recipe, "stages": [{"note": {}}, {"note": {"name": "other"}}, recipe["stages"][1]]})


def test_a_stage_declares_its_labels_its_shared_options_and_the_splits_it_trains_on():
    """``label``, ``shared`` and ``trains`` of a stage are read by the recipe's labels, its validation and the
    fit-split check (:func:`pretrieve.recipe.rows.trained_splits`), never by naming the kind."""
    stage("drill", DrillOptions, label=lambda options, recipe, count: f"drill-r{options.get('round', count)}",
          shared="drill", trains=True)(stage_note)
    try:
        recipe = validate_recipe({"out": "o", "model": "bert-base-uncased", "data": "msmarco",
                                  "drill": {"split": "dev"},
                                  "stages": ["drill", {"drill": {"round": 7, "split": "train"}},
                                             {"evaluate": {"zero_shot": True}}]})
        assert recipe["drill"] == {"split": "dev"}     # the shared options, validated against the stage's schema
        assert [label for _, label, _ in stage_labels(recipe)] == ["drill-r1", "drill-r7", "evaluate"]
        assert trained_splits(recipe) == {"dev", "train"}
        with pytest.raises(ConfigError, match="drill.*rounds"):
            validate_recipe({**recipe, "drill": {"rounds": 2}})
    finally:
        del STAGES["drill"]


@dataclass
class DrillOptions:
    """Options of the ``drill`` stage (a stage with shared options, its own labels and a training split)."""

    round: int = 1
    split: str = "train"


# ------------------------------------------------------------------------------- nothing else names a kind
def _code_strings(path: Path) -> set[str]:
    """The string constants of a module's code (docstrings left out: prose may say 'the evaluate stage')."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


@pytest.mark.parametrize("module", ["smoke.py", "fixtures.py", "runner.py", "schema.py"])
def test_the_smoke_transformation_and_the_runner_name_no_stage_kind(module):
    named = _code_strings(RECIPE_PACKAGE / module) & set(STAGES)
    assert not named, f"recipe/{module} names the stage kinds {sorted(named)}: declare it in the stage's module"


def test_no_stage_imports_another():
    for path in sorted((RECIPE_PACKAGE / "stages").glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("pretrieve.recipe.stages"), (path.name, node.module)
