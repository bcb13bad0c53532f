"""The CLI starts on every typer that pyproject allows.

Typers before 0.29 have no ``TyperOption.display_type_rich`` (the method the CLI wraps to hide ``<bool>`` after a
flag), and a GPU image with such a typer saw every command die at import. Installing the range's two ends into
throwaway environments is too slow for the suite, so this file simulates an old typer (the method removed before
``pretrieve.cli`` is imported) and checks that the typer installed here lies inside pyproject's range, whose ends
(0.18.0 and 0.29.2) were checked by hand with ``pip install --target`` (docs/benchmarks.md, "On a GPU").
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]

#: Python that removes ``display_type_rich`` from TyperOption and its bases, as typers before 0.29 lack it, then
#: imports the CLI and runs one command that fails on a bad flag (a path that renders no help).
_OLD_TYPER = textwrap.dedent("""
    import sys
    from typer.core import TyperOption
    for cls in TyperOption.__mro__:
        if "display_type_rich" in vars(cls):
            delattr(cls, "display_type_rich")
    import pretrieve.cli as cli
    assert not hasattr(TyperOption, "display_type_rich"), "the CLI added the method back"
    sys.argv = ["pretrieve", "evaluate", "--no-such-flag"]
    cli.main()
""")


def test_cli_starts_on_a_typer_without_display_type_rich():
    result = subprocess.run([sys.executable, "-c", _OLD_TYPER], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert "AttributeError" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: No such option"), result.stderr


def test_installed_typer_lies_in_the_tested_range():
    text = (REPO / "pyproject.toml").read_text()
    spec = re.search(r'"typer([^"]*)"', text).group(1)
    assert "<" in spec and ">=" in spec, f"typer's range {spec!r} needs both tested ends"
    assert version("typer") in SpecifierSet(spec), f"typer {version('typer')} is outside pyproject's {spec}"


def test_the_flag_type_wrapper_applies_only_to_the_typers_that_print_bool():
    from typer.core import TyperOption

    import pretrieve.cli as cli

    assert [cli.needs_flag_type_wrapper(v) for v in ("0.18.0", "0.28.1", "0.29.0", "0.29.3", "0.30.0", "1.0")] == \
        [False, False, True, True, False, False]
    wrapped = TyperOption.display_type_rich is cli._flag_type if cli._display_type_rich is not None else False
    assert wrapped == (cli._display_type_rich is not None and cli.needs_flag_type_wrapper(version("typer")))
