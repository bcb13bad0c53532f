"""Streaming JSONL reading and writing with file:line errors.

Every reader in ``pretrieve.data`` goes through :func:`iter_jsonl`, so a truncated line, a line that is
not a JSON object or a missing field is reported the same way everywhere: file, line number, field.
Gzipped files (``.gz``) are read transparently.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open


def open_text(path: str | Path) -> io.TextIOBase:
    """Open a (possibly gzipped) UTF-8 text file for reading, with a clear error if it is missing."""
    path = Path(path)
    if not path.exists():
        raise InputError("file not found", path=path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; bad JSON raises :class:`InputError`."""
    with open_text(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"invalid JSON ({exc.msg} at column {exc.colno})", path=path,
                                 line=line_no) from None
            if not isinstance(obj, dict):
                raise InputError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line_no)
            yield line_no, obj


def require_str(obj: dict[str, Any], field: str, path: str | Path, line: int, *, allow_empty: bool = True,
                default: str | None = None) -> str:
    """Read a string field (ints are accepted for ids and converted); raise a located error otherwise."""
    if field not in obj or obj[field] is None:
        if default is not None:
            return default
        raise InputError("missing required field", path=path, line=line, field=field)
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"expected a string, got {type(value).__name__}", path=path, line=line, field=field)
    value = str(value)
    if not allow_empty and not value.strip():
        raise InputError("must not be empty", path=path, line=line, field=field)
    return value


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write rows as JSONL atomically; returns the number of rows."""
    count = 0
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count
