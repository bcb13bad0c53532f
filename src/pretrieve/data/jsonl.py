"""Streaming JSONL reading and writing with file:line errors.

Every reader in ``pretrieve.data`` goes through :func:`iter_lines` / :func:`iter_jsonl`, so a truncated
line, a line that is not a JSON object, a missing field, bytes that are not UTF-8 or a corrupt gzip stream
are reported the same way everywhere: file, line number, field. Gzipped files (``.gz``) are read
transparently and a UTF-8 byte-order mark at the start of a file is ignored.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open


def open_text(path: str | Path) -> io.TextIOBase:
    """Open a (possibly gzipped) UTF-8 text file for reading, with a clear error if it is missing.

    Prefer :func:`iter_lines`, which also turns undecodable bytes and corrupt gzip data into a located
    :class:`InputError`; a handle from here raises the raw exceptions while it is read.
    """
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8-sig")


def _open_binary(path: str | Path) -> IO[bytes]:
    """Open a (possibly gzipped) file as bytes; a missing file, a directory or no permission is an InputError."""
    path = Path(path)
    if not path.exists():
        raise InputError("file not found", path=path)
    if path.is_dir():
        raise InputError("is a directory, expected a file", path=path)
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot open file ({exc.strerror or exc})", path=path) from None


def iter_lines(path: str | Path, start: int = 0, end: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` for every line of a (possibly gzipped) UTF-8 file.

    Lines end at ``\\n`` only (a stray ``\\r`` inside a line does not shift the numbering); the line
    ending is kept. Bytes that are not UTF-8, a corrupt or truncated gzip stream and read errors raise
    :class:`InputError` with the line number where they occur.

    ``start``/``end`` read only the lines that begin in the byte range ``[start, end)`` of an uncompressed
    file (``start`` must be a line start: see :func:`pretrieve.data.parallel.byte_ranges`); line numbers are
    then counted from 1 at ``start`` (:func:`pretrieve.data.parallel.located_in_part` turns them into the
    file's line numbers).
    """
    line_no = 0
    with _open_binary(path) as handle:
        if start or end is not None:
            if Path(path).suffix == ".gz":
                raise ValueError("byte ranges of a gzipped file cannot be read")
            handle.seek(start)
        position = start
        try:
            for line_no, raw in enumerate(handle, start=1):
                if end is not None and position >= end:
                    break
                position += len(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(f"not valid UTF-8 (bad byte at offset {exc.start} of the line)", path=path,
                                     line=line_no) from None
                if line_no == 1 and start == 0 and line.startswith("\ufeff"):
                    line = line[1:]
                yield line_no, line
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise InputError(f"cannot read file after line {line_no} ({exc})", path=path) from None


def iter_jsonl(path: str | Path, start: int = 0, end: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; bad JSON raises :class:`InputError`.

    ``start``/``end``: a byte range, as in :func:`iter_lines`."""
    for line_no, line in iter_lines(path, start, end):
        if not line.strip():
            continue
        yield line_no, parse_json_object(line, path, line_no)


def parse_json_object(line: str, path: str | Path, line_no: int) -> dict[str, Any]:
    """One JSONL line as a dict; invalid JSON or another JSON type is a located :class:`InputError`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        # some messages end in "at" ("Unterminated string starting at"): the column completes them
        message = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
        raise InputError(f"invalid JSON ({message} at column {exc.colno})", path=path, line=line_no) from None
    except RecursionError:   # the decoder recurses once per level: thousands of nested brackets
        raise InputError("JSON nested too deeply to read (thousands of levels); a record is a flat object",
                         path=path, line=line_no) from None
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line_no)
    return obj


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
