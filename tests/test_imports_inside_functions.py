"""An import inside a function says why it is there, with a fixed tag the suite checks (DESIGN.md).

Internal modules (``pretrieve.*``) and light packages are imported at the top of a module. An import inside a
function or method carries, on one of its lines, one of two tags (a free note may follow after `` — ``)::

    import torch  # lazy: torch
    from pretrieve.retrieval.search import search  # lazy: torch
    from matplotlib.figure import Figure  # lazy: matplotlib
    import bm25s  # lazy: bm25s — the first import, with JAX hidden
    import faiss  # optional: faiss

* ``# lazy: PKG[, PKG …]`` — importing here rather than at the top keeps the third-party package ``PKG`` (a
  dotted module name is allowed: ``torch.ao.quantization``) out of whatever imports this module. The tag holds when

  1. the statement brings ``PKG``: it imports ``PKG`` (or a module inside it) itself, or it imports a pretrieve
     module that imports ``PKG`` at its top, directly or through other pretrieve modules' top-level imports (read
     from the syntax tree; a package's ``__init__`` counts for its modules);
  2. this module does not bring ``PKG`` anyway through its own top-level imports (else the laziness buys nothing);
  3. where ``pretrieve --help`` loads this module, ``pretrieve --help`` does not load ``PKG`` (measured:
     ``python -X importtime -m pretrieve --help``).

* ``# optional: PKG`` — ``PKG`` is an optional dependency (an extra of ``pyproject.toml``, not one of
  ``[project].dependencies``), imported by the statement itself; the code around it copes when it is missing.

A comment that is only a linter's pragma (``# noqa: F401``, ``# type: ignore``) is not a tag and is skipped before
one. Imports under ``if TYPE_CHECKING:`` are not run and do not count. ``tests/test_cli_imports.py`` checks that the
torch-free commands stay torch- and scipy-free.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path

import pytest

from test_cli_imports import help_imports

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "pretrieve"
ROOT = "pretrieve"

PRAGMA = re.compile(r"^\s*(noqa\b(:\s*[A-Z]+\d*(\s*,\s*[A-Z]+\d*)*)?|type:\s*ignore(\[[^\]]*\])?|pragma:[^-–—]*)",
                    re.IGNORECASE)
NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
TAG = re.compile(rf"^(?P<kind>lazy|optional): (?P<names>{NAME}(?:, {NAME})*)(?: — \S.*)?$")


def reason(comment: str) -> str:
    """What a ``#`` comment says beyond linter pragmas (``noqa: F401 - lazy: bm25s`` → ``lazy: bm25s``)."""
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
        return bool(node.level) or (node.module or "").split(".")[0] == ROOT
    return any(alias.name.split(".")[0] == ROOT for alias in node.names)


def _walk_imports(tree: ast.AST):
    """``(node, in_function)`` for every import statement that runs (``if TYPE_CHECKING:`` left out)."""
    def visit(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    yield from visit_one(other, in_function)
                continue
            yield from visit_one(child, in_function)

    def visit_one(child: ast.AST, in_function: bool):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                   ast.Lambda)))

    yield from visit(tree, False)


def function_imports(source: str) -> list[tuple[int, bool, str]]:
    """``(line, internal, reason)`` for every import statement inside a function (or method, or lambda) of
    ``source``; ``reason`` is the comment on any of the statement's lines, pragmas left out ("" when none)."""
    comments = _comments(source)
    found = []
    for node, in_function in _walk_imports(ast.parse(source)):
        if in_function:
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            said = next((text for line in lines if (text := reason(comments.get(line, "")))), "")
            found.append((node.lineno, _is_internal(node), said))
    return found


# ---------------------------------------------------------------------------- what a statement brings
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=1)
def _sources() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The dotted modules a statement of ``module`` imports (``from a import b``: ``a``, and ``a.b`` when that is a
    module of ours or could be a submodule of a third-party package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module if (_sources().get(module) or Path()).name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@lru_cache(maxsize=None)
def _top_imports(module: str) -> tuple[str, ...]:
    """Every dotted module named by ``module``'s top-level imports (those that run when it is imported)."""
    tree = ast.parse(_sources()[module].read_text(encoding="utf-8"))
    return tuple(target for node, in_function in _walk_imports(tree) if not in_function
                 for target in _targets(node, module))


def brings(modules: list[str]) -> set[str]:
    """The third-party modules that importing ``modules`` imports at module level, followed through pretrieve's
    own modules (and their parent packages) by their top-level imports."""
    known = _sources()
    seen: set[str] = set()
    third_party: set[str] = set()
    todo = [parent for module in modules for parent in _parents(module)]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module.split(".")[0] != ROOT:
            third_party.add(module)
        elif module in known:
            todo.extend(parent for target in _top_imports(module) for parent in _parents(target))
    return third_party


def _has(modules: set[str], package: str) -> bool:
    return any(name == package or name.startswith(package + ".") for name in modules)


@lru_cache(maxsize=1)
def _required_dependencies() -> set[str]:
    """``[project].dependencies`` of pyproject.toml, as import names (lower case, ``-`` → ``_``)."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].strip().lower().replace("-", "_")
            for spec in project["dependencies"]}


def tag_problems(module: str, source: str, help_modules: set[str]) -> list[str]:
    """What is wrong with the tags of ``source``'s imports inside functions (``module``: its dotted name;
    ``help_modules``: every module ``pretrieve --help`` loads)."""
    comments = _comments(source)
    own = brings([module])
    problems = []
    for node, in_function in _walk_imports(ast.parse(source)):
        if not in_function:
            continue
        lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        said = next((text for line in lines if (text := reason(comments.get(line, "")))), "")
        where = f"line {node.lineno}"
        match = TAG.match(said)
        if not match:
            problems.append(f"{where}: {said!r} is not '# lazy: PKG' or '# optional: PKG' (a note after ' — ')")
            continue
        targets = _targets(node, module)
        imported = {target for target in targets if target.split(".")[0] != ROOT}
        fetched = brings([target for target in targets if target in _sources() or target.split(".")[0] != ROOT])
        for package in match["names"].split(", "):
            if match["kind"] == "optional":
                if not _has(imported, package):
                    problems.append(f"{where}: optional {package} is not what the statement imports")
                elif package.split(".")[0].lower() in _required_dependencies():
                    problems.append(f"{where}: {package} is a required dependency, not an optional one")
                continue
            if not _has(fetched, package):
                problems.append(f"{where}: the statement does not bring {package} (nothing it imports does at "
                                "its top): import it at the top of the module")
            elif _has(own, package):
                problems.append(f"{where}: this module imports {package} at its top anyway")
            elif module in help_modules and _has(help_modules, package):
                problems.append(f"{where}: `pretrieve --help` loads this module and {package} anyway")
    return problems


@pytest.fixture(scope="module")
def help_modules() -> set[str]:
    return help_imports()


def _modules() -> list[tuple[str, Path]]:
    return [(path.relative_to(PACKAGE).as_posix(), path) for path in sorted(PACKAGE.rglob("*.py"))]


def test_the_reader_sees_imports_in_functions_and_their_reasons():
    code = ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pretrieve.b import X\n"
            "def f():\n    import torch  # lazy: torch\n    from pretrieve import c\n"
            "    from pretrieve.d import (e,\n                             f)  # would make an import circle\n"
            "class K:\n    def m(self):\n        import faiss  # noqa: F401\n"
            "        from . import g  # noqa: F401 - pulls torch\n        s = '# not a comment'; import re\n")
    assert function_imports(code) == [(6, False, "lazy: torch"), (7, True, ""),
                                      (8, True, "would make an import circle"), (12, False, ""),
                                      (13, True, "pulls torch"), (14, False, "")]
    assert reason("type: ignore[attr-defined] - optional: faiss") == "optional: faiss"


def test_the_tags_are_checked_against_what_the_imports_bring(help_modules):
    def problems(body: str, module: str = "pretrieve.cli.export") -> list[str]:
        return tag_problems(module, f"def f():\n    {body}\n", help_modules)

    assert problems("from pretrieve.retrieval.search import search  # lazy: torch") == []
    assert problems("from matplotlib.figure import Figure  # lazy: matplotlib — only for the plot") == []
    assert problems("import faiss  # optional: faiss") == []
    assert problems("import bm25s  # noqa: F401 - lazy: bm25s — the first import, with JAX hidden") == []
    assert "is not '# lazy" in problems("import torch  # heavy: keeps pretrieve --help torch-free")[0]
    assert "is not '# lazy" in problems("import torch")[0]
    assert "does not bring torch" in problems("from pretrieve.errors import InputError  # lazy: torch")[0]
    assert "does not bring scipy" in problems("import torch  # lazy: scipy")[0]
    assert "required dependency" in problems("import torch  # optional: torch")[0]
    assert "not what the statement imports" in problems("from pretrieve import search  # optional: faiss")[0]
    # retrieval/rerank.py imports torch at its top: a lazy torch there buys nothing
    assert "at its top anyway" in problems("import torch  # lazy: torch", "pretrieve.retrieval.rerank")[0]
    # --help loads pretrieve.errors, and rich (typer's) anyway
    assert "--help` loads this module and rich" in problems("import rich  # lazy: rich", "pretrieve.errors")[0]


@pytest.mark.parametrize("relative, path", _modules(), ids=[m[0] for m in _modules()])
def test_every_import_inside_a_function_has_a_tag_that_holds(relative, path, help_modules):
    problems = tag_problems(_module_name(path), path.read_text(encoding="utf-8"), help_modules)
    if problems:
        pytest.fail(f"src/pretrieve/{relative}: imports inside functions whose tag is missing or does not hold "
                    "(see this test's docstring):\n" + "\n".join(problems))
