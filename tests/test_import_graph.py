"""The import graph of ``src/pretrieve`` has no circle.

Built from the syntax tree of every module: every ``import`` / ``from … import`` statement counts, also those
inside functions (a lazy import is still an arrow a reader has to follow); only imports under
``if TYPE_CHECKING:`` are left out. ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
module, else of ``pkg``. A package's ``__init__`` is the node ``pkg``; an arrow from a package's ``__init__``
to its own members (re-exports) is part of the graph like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "pretrieve"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((SRC / ROOT).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()

    def resolve(base: str) -> str | None:
        while base and base not in known:
            base = base.rpartition(".")[0]
        return base or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == ROOT and (target := resolve(alias.name)):
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            if base.split(".")[0] == ROOT:
                for alias in node.names:
                    target = resolve(f"{base}.{alias.name}")
                    if target and target != module:
                        found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", known)
            for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def connect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_the_graph_builder_sees_lazy_imports_and_skips_type_checking_blocks():
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pretrieve.b import X\n"
            "def f():\n    from pretrieve import c\n    import pretrieve.d.e\n")
    known = {"pretrieve", "pretrieve.a", "pretrieve.b", "pretrieve.c", "pretrieve.d", "pretrieve.d.e"}
    assert _imports(ast.parse(code), "pretrieve.a", False, known) == {"pretrieve.c", "pretrieve.d.e"}
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    graph = import_graph()
    assert len(graph) > 50, "the graph builder found too few modules"
    cycles = find_cycles(graph)
    if cycles:
        pytest.fail("import circles in src/pretrieve:\n" + "\n".join(" <-> ".join(c) for c in cycles))
