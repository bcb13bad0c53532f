"""Error types shared by the whole package.

``InputError`` is what every reader raises for malformed user input. It always names the file and,
when known, the line number and the field, so the CLI can print one clear message (and exit non-zero)
instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path


class PretrieveError(Exception):
    """Base class of errors the CLI reports as a message, without a traceback."""


class InputError(PretrieveError):
    """Malformed or inconsistent user input (a file, a config, a command-line value)."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.message = message
        where = ""
        if self.path is not None:
            where = self.path
            if line is not None:
                where += f":{line}"
            where += ": "
        if field is not None:
            where += f"field '{field}': "
        super().__init__(where + message)


class ConfigError(PretrieveError):
    """An invalid configuration (unknown method, mismatched weights, ...), raised before work starts."""


class StaleOutputError(ConfigError):
    """A run directory holds a finished or interrupted run made with other settings than the requested ones.

    ``directory`` is that run's output directory: ``pretrieve run --redo-changed`` sets it aside and runs the
    stage again; elsewhere the error asks for another output directory.
    """

    def __init__(self, message: str, directory: str | Path):
        self.directory = Path(directory)
        super().__init__(message)


class OutputBusyError(PretrieveError):
    """Another pretrieve process holds the lock of an output directory."""


class TrainingDiverged(PretrieveError):
    """The training loss became non-finite or exploded; the run was stopped (checkpoints after it removed)."""


class InexactResumeError(PretrieveError):
    """A checkpoint's state (RNG, optimizer, scheduler) could not be fully restored: resuming would not continue
    the interrupted run exactly."""
