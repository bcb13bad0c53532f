"""Atomic file and directory writes, and the one reader of YAML/JSON config files.

Everything pretrieve writes that a crash could leave half-written (runs, metrics, embeddings,
checkpoints, indexes) goes through these helpers: write to a temporary sibling, fsync, then rename.
A rename within one filesystem is atomic, so readers see either the old file or the complete new one.
The result gets the permissions an ordinary ``open``/``mkdir`` would give (the umask's, or those of the
file it replaces), not the owner-only mode of the temporary files ``tempfile`` creates.

Temporaries are named ``.<name>.<random>.tmp`` and held under an ``flock`` while their writer lives
(:func:`in_use`): a killed writer's leftovers are removed by the next command
(:func:`pretrieve.outputs.remove_leftovers`), a running writer's never. :func:`temporary_dir` is such a temporary
directory for intermediate files (a BM25 index built for one run).

:func:`load_config_file` reads every YAML/JSON config (run configs, method files, recipes); a syntax error is one
line, ``file:line: problem``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from pretrieve.errors import InputError

if TYPE_CHECKING:
    import yaml


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
        with _claimed(tmp_path):
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
        with _claimed(tmp):
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


@contextlib.contextmanager
def temporary_dir(name: str, parent: str | Path | None = None) -> Iterator[Path]:
    """A temporary directory ``.<name>.<random>.tmp`` in ``parent`` (default: the system's), held while the block
    runs and removed after it; a killed process's is a leftover :func:`pretrieve.outputs.remove_leftovers` removes."""
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent))
    try:
        with _claimed(tmp):
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _claimed(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (a temporary file or directory) while the block runs; the kernel
    drops it when the process dies, so :func:`in_use` tells a live writer's temporary from a leftover. Where it
    cannot be taken (an unreadable file, a file system without locks) the write goes on unheld: such a temporary
    is then protected only by being younger than the command that cleans up."""
    try:
        fd: int | None = os.open(path, os.O_RDONLY)
    except OSError:
        fd = None
    try:
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def in_use(path: str | Path) -> bool:
    """Whether a live process holds ``path`` (a temporary of :func:`atomic_path`, :func:`atomic_dir` or
    :func:`temporary_dir` being written)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)   # a FIFO must not block
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


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
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


MAX_CONFIG_DEPTH = 50
"""Nesting levels a config file may have (recipes need fewer than 10): deeper ones are refused in one line before
anything recurses through them."""
MAX_CONFIG_VALUES = 100_000
"""Values (lists, mappings and scalars, each YAML alias counted as often as it is expanded) a config file may hold:
a recipe holds a few hundred; more is an alias bomb (9 aliases of 9 levels expand 334 bytes into 9**9 values),
refused before anything walks it."""


def config_shape(value: Any) -> tuple[int, int]:
    """``(depth, values)`` of ``value``: levels of nested lists and mappings (0 for a scalar) and the number of
    values once every shared node (a YAML alias) is expanded, computed without recursion and without expanding
    anything: each distinct node is visited once (its result remembered), so an alias bomb costs its size on disk.
    A structure that refers to itself (a YAML alias of an enclosing node) counts as deeper than
    :data:`MAX_CONFIG_DEPTH`."""
    shapes: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if not isinstance(node, (dict, list)) or (key in shapes and not children_done):
            continue
        children = [child for child in (node.values() if isinstance(node, dict) else node)
                    if isinstance(child, (dict, list))]
        scalars = (len(node) - len(children))
        if children_done:
            open_nodes.discard(key)
            depth = 1 + max((shapes[id(child)][0] for child in children), default=0)
            size = 1 + scalars + sum(shapes[id(child)][1] for child in children)
            shapes[key] = (min(depth, MAX_CONFIG_DEPTH + 1), min(size, MAX_CONFIG_VALUES + 1))
            continue
        if key in open_nodes or len(open_nodes) >= MAX_CONFIG_DEPTH:
            return MAX_CONFIG_DEPTH + 1, 0   # refers to itself, or deeper than any config
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in shapes)
    return shapes.get(id(value), (0, 1))


def load_config_file(path: str | Path, what: str = "config") -> dict[str, Any]:
    """The mapping of a YAML or JSON ``what`` file ({} for an empty one; JSON by the ``.json`` suffix).

    Every error is one line naming the file (and the line of a syntax error): ``file:line: invalid YAML: ...``; a file
    nested more than :data:`MAX_CONFIG_DEPTH` levels deep too."""
    import yaml  # lazy: yaml

    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} file not found", path=path)
    if path.is_dir():
        raise InputError(f"is a directory, not a {what} file", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} file is not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    too_deep = InputError(f"{what} file is nested more than {MAX_CONFIG_DEPTH} levels deep or refers to itself "
                          "(a YAML alias of an enclosing node); a config is a few levels deep",
                          path=path)
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=path, line=exc.lineno) from None
        except RecursionError:
            raise too_deep from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise _yaml_error(exc, path) from None
        except RecursionError:   # the parser recurses once per level: thousands of nested brackets
            raise too_deep from None
    depth, values = config_shape(data)
    if depth > MAX_CONFIG_DEPTH:
        raise too_deep
    if values > MAX_CONFIG_VALUES:
        raise InputError(f"{what} file expands to more than {MAX_CONFIG_VALUES:,} values (its YAML aliases repeat "
                         "nodes that repeat nodes: an alias bomb); a config holds a few hundred", path=path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{what} file must be a mapping of names to values, not a {type(data).__name__}",
                         path=path)
    return data


def _yaml_error(exc: "yaml.YAMLError", path: Path) -> InputError:
    """``file:line: invalid YAML: <problem> (column c[; <context> on line l])`` on one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    details = [] if mark is None else [f"column {mark.column + 1}"]
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and (mark is None or context_mark.line != mark.line):
        details.append(f"{context} on line {context_mark.line + 1}")
    message = f"invalid YAML: {problem}" + (f" ({'; '.join(details)})" if details else "")
    return InputError(" ".join(message.split()), path=path, line=None if mark is None else mark.line + 1)
