"""Atomic file and directory writes.

Everything pretrieve writes that a crash could leave half-written (runs, metrics, embeddings,
checkpoints, indexes) goes through these helpers: write to a temporary sibling, fsync, then rename.
A rename within one filesystem is atomic, so readers see either the old file or the complete new one.
The result gets the permissions an ordinary ``open``/``mkdir`` would give (the umask's, or those of the
file it replaces), not the owner-only mode of the temporary files ``tempfile`` creates.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        os.chmod(tmp_path, _final_mode(path, directory=False))
        yield tmp_path
        _fsync_file(tmp_path)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file for writing; it replaces ``path`` only if the block succeeds."""
    if "b" in mode:
        encoding = None
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=encoding) as handle:
            yield handle


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path`` as a whole.

    An existing ``path`` is first renamed aside and removed only after the new one is in place,
    so at every instant either the old or the new complete directory exists.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, _final_mode(path, directory=True))
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                _fsync_file(file)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # put the old directory back rather than leave nothing at `path`
                os.replace(old, path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_open(path) as handle:
        json.dump(obj, handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")


def _final_mode(path: Path, directory: bool) -> int:
    """Permission bits for the result: those of the file being replaced, else what the umask allows."""
    if path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    return (0o777 if directory else 0o666) & ~_current_umask()


def _current_umask() -> int:
    """The process umask, read from /proc where possible (setting it to read it races with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def file_digest(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """SHA-1 of a file's bytes, read in chunks (identifies an input file independently of its mtime)."""
    import hashlib

    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()
