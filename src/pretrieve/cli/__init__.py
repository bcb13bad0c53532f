"""The ``pretrieve`` command line: one typer app, one sub-module per command group.

The CLI is thin: it parses arguments, loads configs and calls one library function. Every
``PretrieveError`` becomes a one-line red message and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import re
import sys
from types import ModuleType
from typing import Callable

import typer
from rich.console import Console
from rich.text import Text

from pretrieve.errors import PretrieveError

app = typer.Typer(
    name="pretrieve",
    help="Pre-train, fine-tune, index and evaluate dense passage retrievers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
console = Console(stderr=True, soft_wrap=True)


NOISY_LOGGERS = ("bm25s", "httpx", "httpcore", "urllib3", "filelock", "huggingface_hub", "datasets", "fsspec",
                 "transformers", "sentence_transformers", "faiss", "accelerate")


def configure_logging(verbose: bool = False) -> None:
    """INFO (or DEBUG) lines of pretrieve on stderr; chatty third-party libraries only from WARNING."""
    import logging

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # "Loading weights" bars; ours show the work's progress. Applied when transformers is imported, so that
    # commands that never load a model (bm25, evaluate, data, --help) never pay for importing it.
    when_imported("transformers.utils.logging", lambda hf_logging: hf_logging.disable_progress_bar())
    if not verbose:
        loader = logging.getLogger("transformers.modeling_utils")
        if not any(isinstance(f, CompactLoadReport) for f in loader.filters):
            loader.addFilter(CompactLoadReport())


def when_imported(name: str, action: Callable[[ModuleType], object]) -> None:
    """Call ``action(module)`` once the module ``name`` is imported: now if it already is, else right after
    its import completes (nothing is imported here)."""
    if name in sys.modules:
        action(sys.modules[name])
        return
    _AFTER_IMPORT.setdefault(name, []).append(action)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


_AFTER_IMPORT: dict[str, list[Callable[[ModuleType], object]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Import hook of :func:`when_imported`: finds the module as the other finders would, then runs the actions
    after the module's code."""

    def find_spec(self, fullname, path, target=None):
        actions = _AFTER_IMPORT.pop(fullname, None)
        if actions is None:
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_act(module: ModuleType) -> None:
            exec_module(module)
            for action in actions:
                action(module)

        spec.loader.exec_module = exec_then_act
        return spec


class CompactLoadReport:
    """Rewrites transformers' multi-line checkpoint "LOAD REPORT" table as one line per status.

    pretrieve loads checkpoints into other architectures on purpose (an MLM checkpoint into a dual encoder
    drops ``cls.predictions.*``; a reranker creates ``classifier.*``), so the full table with its notes
    would follow every command; the one-line form keeps what matters: which modules were left out and which
    were newly initialised (``--verbose`` shows transformers' table).
    """

    ANSI = re.compile(r"\x1b\[[0-9;]*m")
    LABELS = {"unexpected": "unused checkpoint weights", "missing": "newly initialised",
              "mismatch": "re-initialised (shape mismatch)"}

    def filter(self, record) -> bool:
        message = self.ANSI.sub("", record.getMessage())
        if "LOAD REPORT" not in message:
            return True
        first, *lines = message.splitlines()
        by_status: dict[str, list[str]] = {}
        for line in lines:
            cells = [cell.strip() for cell in line.split("|")]
            if len(cells) >= 2 and cells[1].isupper() and cells[0] and cells[0] != "Key":
                module = cells[0].rsplit(".", 1)[0] if cells[0].endswith((".weight", ".bias")) else cells[0]
                modules = by_status.setdefault(cells[1].lower(), [])
                if module not in modules:
                    modules.append(module)
        source = first.split("from:", 1)[-1].strip()
        model = first.split(" LOAD REPORT", 1)[0].strip()
        parts = [f"{self.LABELS.get(status, status)}: {', '.join(modules)}" for status, modules in by_status.items()]
        record.msg = f"{model} from {source}: " + ("; ".join(parts) if parts else "see --verbose")
        record.args = ()
        return True


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    """Pre-train, fine-tune, index and evaluate dense passage retrievers."""
    configure_logging(verbose)

# Command groups register themselves on `app` when imported. A missing optional module must not
# break the other commands, so each is imported by name.
_COMMAND_MODULES = ["data", "retrieval", "evaluate", "fuse", "pretrain", "finetune", "analyze", "stats", "bench", "recipe"]
for _name in _COMMAND_MODULES:
    try:
        importlib.import_module(f"pretrieve.cli.{_name}")
    except ModuleNotFoundError as exc:  # the module itself not written yet
        if exc.name != f"pretrieve.cli.{_name}":
            raise


def main() -> None:
    """Console entry point."""
    try:
        app()
    except PretrieveError as exc:
        console.print(Text("error: ", style="bold red") + Text(str(exc)), highlight=False)
        sys.exit(2)
