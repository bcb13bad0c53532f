"""Every dotted ``pretrieve.x.y`` name a docstring under ``src/pretrieve`` points at still resolves: a module, or an
attribute of one (a move that relocates a function leaves no dead pointer behind, issue 40)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pretrieve"
DOTTED = re.compile(r"(?<![\w.])(pretrieve(?:\.\w+)+)")


def resolves(name: str) -> bool:
    """The longest importable module prefix of ``name``, then its attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def docstring_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.update(DOTTED.findall(ast.get_docstring(node, clean=False) or ""))
    return names


def test_every_dotted_name_in_a_docstring_resolves():
    dead = sorted(f"{path.relative_to(PACKAGE.parent)}: {name}" for path in PACKAGE.rglob("*.py")
                  for name in docstring_names(path) if not resolves(name))
    assert not dead, "docstrings point at names that are not there:\n" + "\n".join(dead)
