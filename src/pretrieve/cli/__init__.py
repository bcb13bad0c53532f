"""The ``pretrieve`` command line: one typer app, one sub-module per command group.

The app lives in :mod:`pretrieve.cli.root`; this package imports every command module (each registers its commands
on the app) and runs it (:func:`main`). The CLI is thin: it parses arguments, loads configs and calls one library
function. Every error a user can fix — a ``PretrieveError`` (bad input, bad option, a busy or stale output), an
``OSError`` (a directory that cannot be written, a full disk, a file-size limit: ``SIGXFSZ`` is ignored so that
``ulimit -f`` surfaces as the error ``EFBIG`` instead of killing the process) or a usage error — becomes one line
beginning ``error:`` on stderr and exit code 2, never a traceback.

Help: boolean flags show no ``<bool>`` value, and when the output is not a terminal (a pipe, a file) the help is
laid out 120 columns wide instead of being cut at 80 (``TERMINAL_WIDTH`` / ``COLUMNS`` still decide when set).
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.util
import logging
import os
import re
import signal
import sys
from types import ModuleType
from typing import Callable

import typer
import typer.rich_utils
from rich.text import Text
from typer.core import TyperOption

from pretrieve import __version__
from pretrieve.cli.root import app, console
from pretrieve.errors import PretrieveError
from pretrieve.models import model_label

try:   # typer ≥ 0.26 ships its own copy of click
    from typer._click import exceptions as click
except ImportError:
    from click import exceptions as click

#: Help width when stdout is not a terminal (rich would assume 80 columns and cut option names and defaults).
HELP_WIDTH = 120
if getattr(typer.rich_utils, "MAX_WIDTH", 0) is None and not os.environ.get("COLUMNS") and not sys.stdout.isatty():
    typer.rich_utils.MAX_WIDTH = HELP_WIDTH

#: The typers that print a flag's type as ``<bool>`` (through ``TyperOption.display_type_rich``, new in 0.29); older
#: ones (the GPU image's) have no such method and print no type for a flag. Only these get the wrapper below, and only
#: when the method is there, so that the CLI starts on every typer that pyproject allows (tests/test_cli_typer.py).
FLAG_TYPE_TYPERS = ((0, 29), (0, 30))


def needs_flag_type_wrapper(version: str) -> bool:
    """Whether typer ``version`` (``"0.29.3"``) prints ``<bool>`` after a flag: within :data:`FLAG_TYPE_TYPERS`."""
    major_minor = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    return FLAG_TYPE_TYPERS[0] <= major_minor < FLAG_TYPE_TYPERS[1]


_display_type_rich = getattr(TyperOption, "display_type_rich", None)


def _flag_type(self, ctx):
    """A boolean flag takes no value: show none (typer would print ``<bool>``)."""
    return None if self.is_flag else _display_type_rich(self, ctx)


if _display_type_rich is not None and needs_flag_type_wrapper(getattr(typer, "__version__", "0")):
    TyperOption.display_type_rich = _flag_type



NOISY_LOGGERS = ("bm25s", "httpx", "httpcore", "urllib3", "filelock", "huggingface_hub", "datasets", "fsspec",
                 "transformers", "sentence_transformers", "faiss", "accelerate")


def configure_logging(verbose: bool = False) -> None:
    """INFO (or DEBUG) lines of pretrieve on stderr; chatty third-party libraries only from WARNING."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # "Loading weights" bars; ours show the work's progress. Applied when transformers is imported, so that
    # commands that never load a model (bm25, evaluate, data, --help) never pay for importing it.
    when_imported("transformers.utils.logging", lambda hf_logging: hf_logging.disable_progress_bar())
    if not sys.stderr.isatty():   # a log file gets pretrieve's progress lines (pretrieve.progress), no tqdm frames
        when_imported("datasets.utils.logging", lambda ds_logging: ds_logging.disable_progress_bar())
        when_imported("huggingface_hub.utils", lambda hub_utils: hub_utils.disable_progress_bars())
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
        source = model_label(first.split("from:", 1)[-1].strip())
        model = first.split(" LOAD REPORT", 1)[0].strip()
        parts = [f"{self.LABELS.get(status, status)}: {', '.join(modules)}" for status, modules in by_status.items()]
        record.msg = f"{model} from {source}: " + ("; ".join(parts) if parts else "see --verbose")
        record.args = ()
        return True


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pretrieve {__version__}")
        raise typer.Exit()


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Show the version and exit.")) -> None:
    """Pre-train, fine-tune, index and evaluate dense passage retrievers."""
    configure_logging(verbose)


# The command modules register their commands on `app` (pretrieve.cli.root) when imported, in this order: the
# order of `--help`.
from pretrieve.cli import (data, retrieval, evaluate, fuse, pretrain, finetune, mine, rerank,  # noqa: E402,F401
                           analyze, stats, bench, bench_quality, recipe, init_model, export, cache)


def print_error(message: str) -> None:
    """One line on stderr: ``error: <message>``."""
    console.print(Text("error: ", style="bold red") + Text(message), highlight=False)


_OS_HINTS = {errno.EFBIG: "a file-size limit (ulimit -f) was reached", errno.ENOSPC: "the disk is full",
             errno.EDQUOT: "the disk quota is exhausted", errno.EROFS: "the file system is read-only",
             errno.EACCES: "no permission", errno.EPERM: "no permission"}


def describe_os_error(exc: OSError) -> str:
    """``<file>: <reason> (<hint>)`` for an ``OSError``."""
    where = f"{exc.filename}: " if exc.filename else ""
    reason = exc.strerror or str(exc)
    hint = _OS_HINTS.get(exc.errno or 0)
    return f"{where}{reason}" + (f" ({hint})" if hint and hint.lower() != reason.lower() else "")


def main() -> None:
    """Console entry point: errors are one ``error:`` line and exit code 2 (see the module docstring)."""
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        code = app(standalone_mode=False)
    except click.NoArgsIsHelpError as exc:   # the help was printed
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "pretrieve"
        print_error(f"{exc.format_message().rstrip('.')} (see '{command} --help')")
        sys.exit(2)
    except typer.Abort:
        print_error("aborted")
        sys.exit(1)
    except click.ClickException as exc:
        print_error(exc.format_message())
        sys.exit(2)
    except PretrieveError as exc:
        print_error(str(exc))
        sys.exit(2)
    except OSError as exc:
        if exc.errno == errno.EPIPE:   # output piped into a pager that quit
            sys.exit(1)
        print_error(describe_os_error(exc))
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
