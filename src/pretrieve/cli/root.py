"""The root of the ``pretrieve`` command line: the typer :data:`app` every command module registers on, and the
:data:`console` of error lines.

Kept apart from :mod:`pretrieve.cli` (which imports every command module, in the order ``--help`` lists them) so
that a command module imports the app without importing the package that imports it: no import circle.
"""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="pretrieve",
    help="Pre-train, fine-tune, index and evaluate dense passage retrievers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
console = Console(stderr=True, soft_wrap=True, emoji=False)
