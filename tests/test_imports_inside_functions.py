"""An import inside a function says why it is there (sentence-transformers' rule, DESIGN.md).

Internal modules (``pretrieve.*``) are imported at the top of a module; only optional or heavy third-party packages
(torch, transformers, faiss, datasets, matplotlib, …) are imported inside functions. Every import inside a function
or method carries a short reason as a comment on its own line (``import torch  # heavy: keeps pretrieve --help
torch-free``, ``import faiss  # optional: the faiss extra``); an internal module stays inside a function only with
such a reason too (it pulls torch into a torch-free command, or it would make an import circle). A comment that is
only a linter's pragma (``# noqa: F401``, ``# type: ignore``) is not a reason.

Read from the syntax tree of every module under ``src/pretrieve``; imports under ``if TYPE_CHECKING:`` are not
run and do not count. ``tests/test_cli_imports.py`` checks that the commands stay torch-free.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "pretrieve"

# Modules not converted yet: other work was editing them when the rule was adopted. Each is converted (and removed
# from this list) by its next change; every other module must follow the rule.
NOT_YET_CONVERTED = {
}

PRAGMA = re.compile(r"^\s*(noqa\b(:\s*[A-Z]+\d*(\s*,\s*[A-Z]+\d*)*)?|type:\s*ignore(\[[^\]]*\])?|pragma:[^-–—]*)",
                    re.IGNORECASE)


def reason(comment: str) -> str:
    """What a ``#`` comment says beyond linter pragmas (``noqa: F401 - the one reader`` → ``the one reader``)."""
    text = comment.strip()
    while True:
        match = PRAGMA.match(text)
        if not match:
            break
        text = text[match.end():].lstrip(" -–—:;,")
    return text.strip()


def _comments(source: str) -> dict[int, str]:
    """Line number → the text of the comment on that line (comments found by the tokenizer, never in strings)."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string[1:]
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_internal(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] == "pretrieve"
    return any(alias.name.split(".")[0] == "pretrieve" for alias in node.names)


def function_imports(source: str) -> list[tuple[int, bool, str]]:
    """``(line, internal, reason)`` for every import statement inside a function (or method, or lambda) of
    ``source``; ``reason`` is the comment on any of the statement's lines, pragmas left out ("" when none)."""
    comments = _comments(source)
    found: list[tuple[int, bool, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_one(other, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(child: ast.AST, in_function: bool) -> None:
        if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
            lines = range(child.lineno, (child.end_lineno or child.lineno) + 1)
            said = next((text for line in lines if (text := reason(comments.get(line, "")))), "")
            found.append((child.lineno, _is_internal(child), said))
        visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def _not_yet_converted(relative: str) -> bool:
    return any(relative == entry or (entry.endswith("/") and relative.startswith(entry)) for entry in NOT_YET_CONVERTED)


def _modules() -> list[tuple[str, Path]]:
    return [(path.relative_to(PACKAGE).as_posix(), path) for path in sorted(PACKAGE.rglob("*.py"))]


def test_the_reader_sees_imports_in_functions_and_their_reasons():
    code = ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pretrieve.b import X\n"
            "def f():\n    import torch  # heavy: keeps --help torch-free\n    from pretrieve import c\n"
            "    from pretrieve.d import (e,\n                             f)  # would make an import circle\n"
            "class K:\n    def m(self):\n        import faiss  # noqa: F401\n"
            "        from . import g  # noqa: F401 - pulls torch\n        s = '# not a comment'; import re\n")
    assert function_imports(code) == [(6, False, "heavy: keeps --help torch-free"), (7, True, ""),
                                      (8, True, "would make an import circle"), (12, False, ""),
                                      (13, True, "pulls torch"), (14, False, "")]
    assert reason("type: ignore[attr-defined] - optional: the faiss extra") == "optional: the faiss extra"


def test_the_list_of_modules_not_yet_converted_names_only_modules_that_exist():
    for entry in NOT_YET_CONVERTED:
        assert (PACKAGE / entry).exists(), f"{entry} is listed as not yet converted but does not exist"


@pytest.mark.parametrize("relative, path", [m for m in _modules() if not _not_yet_converted(m[0])],
                         ids=[m[0] for m in _modules() if not _not_yet_converted(m[0])])
def test_every_import_inside_a_function_says_why(relative, path):
    found = function_imports(path.read_text(encoding="utf-8"))
    silent = [f"src/pretrieve/{relative}:{line}" + (" (a pretrieve module)" if internal else "")
              for line, internal, said in found if not said]
    if silent:
        pytest.fail("imports inside functions with no reason on their line (move a pretrieve module or a light "
                    "package to the top of the module; else say why, e.g. '# heavy: keeps pretrieve --help "
                    "torch-free', '# optional: the faiss extra'):\n" + "\n".join(silent))
