"""Output locations: checked before the work starts, locked while a command writes them, left clean.

* :func:`check_writable` — the preflight: a directory (or a file's directory) that cannot be created or written,
  a file where a directory should be, a parent that is a file, a file-size limit (``ulimit -f``) or free disk
  space smaller than what the command will write are reported as one-line errors before anything expensive runs.
* :func:`writing` — the context of a command that writes an output directory (``pretrain``, ``finetune``,
  ``reranker train``, ``run``): preflight, then an exclusive lock (``filelock``: an ``flock`` on
  ``<out>/.pretrieve.lock``, released when the process exits, also after a crash or ``kill -9``; its file is removed
  when the command ends) that makes a second writer fail at once with the first one's PID; temporary files that killed atomic writes left behind are
  removed (:func:`pretrieve.artifacts.remove_stale_temporaries`) before the free space is compared with what the
  command still writes (a killed checkpoint save's ``.step-N.tmp/`` counts as free); a command that fails leaves
  no directory it created empty. Under ``torchrun``/``accelerate launch`` only the process of rank 0 takes the lock
  (the others write into the same directory as its helpers).
* :func:`producing` — the context of a command that writes a file or directory without locking it (``bm25``,
  ``dense``, ``search``: a run file; ``encode``: an index directory whose shards several processes may write at
  once): the same preflight, the leftovers of killed writes of that output removed, and a write that fails for
  lack of space or at the file-size limit (``ENOSPC``, ``EFBIG``, numpy's "N requested and M written") reported
  as one line naming the user's path (:func:`write_failures`), not an internal temporary file.
* :func:`claim` — **the ownership rule**, before any work: pretrieve writes over only what carries its own record
  (an artefact sidecar, :mod:`pretrieve.artifacts`, or a record its command writes first in every run of it: a
  training run's config file and checkpoints, a recipe's resolved recipe); anything else at an output path is
  refused in one line naming the path (exit 2) unless ``--overwrite``, and ``--overwrite`` replaces only what
  the command writes, never a stranger file beside it. One-shot files never reused (run files, ``evaluate
  --json/--md``) are refused whenever they exist (:func:`refuse_existing`).
* :func:`check_space` — the space part of the preflight, for a command that knows its sizes only later (``dense``
  once the model's dimension is known, before it encodes).

Leftovers are only those of dead processes: temporaries older than this process and not held by a live writer
(:func:`pretrieve.io_utils.in_use`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import resource
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Collection, Iterable, Iterator

from filelock import FileLock, Timeout

from pretrieve import artifacts
from pretrieve.artifacts import remove_stale_temporaries
from pretrieve.errors import InputError, OutputBusyError, StaleOutputError
from pretrieve.ranks import rank

logger = logging.getLogger(__name__)

LOCK_FILE = ".pretrieve.lock"
#: How deep below an output directory leftovers of killed atomic writes are looked for.
CLEANUP_DEPTH = 3


def process_rank() -> int:
    """This process's global rank under torchrun / accelerate launch (0 otherwise): :func:`pretrieve.ranks.rank`."""
    return rank()


def _first_existing(path: Path) -> Path:
    while not path.exists() and not path.is_symlink() and path != path.parent:
        path = path.parent
    return path


def check_writable(path: str | Path, directory: bool = True, needed_bytes: int = 0,
                   largest_file: int = 0) -> None:
    """Raise a one-line :class:`InputError` unless ``path`` (a directory, or a file when ``directory`` is False)
    can be created and written, and ``needed_bytes`` (in all) and a file of ``largest_file`` bytes fit."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if directory and not path.is_dir():
            raise InputError("exists and is not a directory (an output directory was expected here)", path=path)
        if not directory and path.is_dir():
            raise InputError("is a directory (an output file was expected here)", path=path)
        place = path if directory else path.parent
    else:
        place = _first_existing(path.parent)
        if not place.is_dir():
            raise InputError(f"cannot be created: {place} is a file, not a directory", path=path)
    _probe(place, path)
    check_space(path, needed_bytes, largest_file)


def _probe(place: Path, path: Path) -> None:
    """Create and remove a temporary file in ``place`` (permission bits, read-only mounts and ACLs all answer)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".pretrieve-probe.", suffix=".tmp", dir=place)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        where = "" if place == path else f" ({place} is not writable)"
        raise InputError(f"cannot write here{where}: {exc.strerror or exc}", path=path) from None


def check_space(path: str | Path, needed_bytes: int = 0, largest_file: int = 0) -> None:
    """Raise a one-line :class:`InputError` naming ``path`` unless a file of ``largest_file`` bytes is within the
    file-size limit (``ulimit -f``) and ``needed_bytes`` are free on the file system that holds (or will hold) it."""
    path = Path(path)
    if largest_file:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY and soft < largest_file:
            raise InputError(f"the file-size limit (ulimit -f: {human_size(soft)}) is below the {human_size(largest_file)} "
                             "of the largest file this command writes; raise it", path=path)
    if needed_bytes:
        free = shutil.disk_usage(_first_existing(path)).free
        if free < needed_bytes:
            raise InputError(f"only {human_size(free)} free on this file system; this command writes about "
                             f"{human_size(needed_bytes)}", path=path)


#: The errors of a write that ran out of room (no space, no quota, a file-size limit) and how they are said.
SPACE_ERRORS = {errno.ENOSPC: "no space left on the disk", errno.EDQUOT: "the disk quota is exhausted",
                errno.EFBIG: "a file-size limit (ulimit -f) was reached"}


@contextlib.contextmanager
def write_failures(path: str | Path) -> Iterator[None]:
    """Report a write that fails for lack of space or at the file-size limit as a one-line :class:`InputError`
    naming ``path`` (the user's output), whichever internal file it was writing."""
    try:
        yield
    except OSError as exc:
        reason = SPACE_ERRORS.get(exc.errno or 0)
        if reason is None and exc.errno is None and " requested and " in str(exc):   # numpy's short write
            reason = _short_write_reason(Path(path))
        if reason is None:
            raise
        raise InputError(f"could not be written: {reason}", path=path) from None


def _short_write_reason(path: Path) -> str:
    if shutil.disk_usage(_first_existing(path)).free < (1 << 20):
        return SPACE_ERRORS[errno.ENOSPC]
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return SPACE_ERRORS[errno.EFBIG]
    return "a write stopped short (the disk is full or a file-size limit was reached)"


def human_size(n: int) -> str:
    """A byte count as people read it (powers of 1024): ``1.5 GB``; every message and table of sizes uses it."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def weights_bytes(model: str | Path) -> int:
    """Bytes of a local checkpoint's weight files (0 for a hub name): the size estimates of the preflight."""
    root = Path(str(model))
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())


def training_space(model: str | Path, keep_checkpoints: int, written: int = 0) -> tuple[int, int]:
    """``(needed_bytes, largest_file)`` a training run still writes at its peak: each checkpoint holds the weights and
    AdamW's two moments (3x the weights, the optimizer file 2x), and ``keep + 1`` of them exist at once (the newest
    is written before the oldest is pruned); the export is one more copy of the weights. ``written``: complete
    checkpoints already on disk (a resume), which count as written."""
    weights = weights_bytes(model)
    return weights * (3 * max(0, max(1, keep_checkpoints) + 1 - written) + 1), 2 * weights


class DirectoryLock:
    """An exclusive lock on an output directory (``filelock.FileLock`` on ``<dir>/.pretrieve.lock``).

    The holder writes its PID, host and start time into the lock file, so the process refused can name it.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self._lock = FileLock(str(self.path), timeout=0)

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except Timeout:
            raise OutputBusyError(f"{self.directory} is being written by another pretrieve process "
                                  f"({self.holder()}); wait for it to finish or choose another output "
                                  "directory") from None
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")

    def holder(self) -> str:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        return text.replace("pid", "PID", 1) if text else "PID unknown"

    def release(self) -> None:
        """Release the lock and remove its file, while still holding it (filelock checks that the file it locked
        was not unlinked meanwhile, so a process that opened it just before cannot hold a removed lock)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._lock.release()

    def __enter__(self) -> "DirectoryLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def remove_leftovers(directory: str | Path, depth: int = CLEANUP_DEPTH,
                     names: Collection[str] | None = None) -> list[Path]:
    """Remove temporaries of killed atomic writes in ``directory`` and its sub-directories (``depth`` levels);
    with ``names``, only those of these names in ``directory`` itself (``.<name>.*.tmp``)."""
    removed = _remove_leftovers(Path(directory), depth, names)
    if removed:
        logger.info("removed %d leftover temporary file(s) of interrupted writes in %s", len(removed), directory)
    return removed


def _remove_leftovers(directory: Path, depth: int, names: Collection[str] | None) -> list[Path]:
    removed = remove_stale_temporaries(directory, names=names)
    if depth > 0 and names is None and directory.is_dir():
        for child in sorted(directory.iterdir()):
            if child.is_dir() and not child.is_symlink() and not child.name.startswith("."):
                removed += _remove_leftovers(child, depth - 1, None)
    return removed


def preflight(path: str | Path, directory: bool = False, needed_bytes: int = 0, largest_file: int = 0,
              scratch: Collection[str] = ()) -> Path:
    """:func:`check_writable`, then remove the leftovers of killed writes of ``path``: its temporaries beside it,
    inside it (a directory), and those of the :func:`pretrieve.io_utils.temporary_dir` names in ``scratch`` that
    the command keeps beside it."""
    path = Path(path)
    check_writable(path, directory=directory, needed_bytes=needed_bytes, largest_file=largest_file)
    remove_leftovers(path.parent, depth=0, names=(path.name, *scratch))
    if directory:
        remove_leftovers(path, depth=1)
    return path


def refuse_existing(path: str | Path | None, overwrite: bool = False) -> None:
    """Before any work: refuse to replace the existing file ``path`` (a run file, a table: outputs that are never
    reused) unless ``overwrite`` (None: no such output)."""
    if path is None:
        return
    path = Path(path)
    if (path.is_file() or path.is_symlink()) and not overwrite:   # a directory: the preflight's error
        raise StaleOutputError(f"{path} exists; choose another --out, or rerun with --overwrite to replace it",
                               path.parent)


def claim(paths: Iterable[str | Path | None], overwrite: bool = False, records: Iterable[str | Path] = (),
          remedy: str = "choose another output, or rerun with --overwrite to replace it") -> None:
    """The ownership rule (module docstring), before any work: every existing entry of ``paths`` (what the command
    writes) must be pretrieve's, unless ``overwrite``; else a one-line :class:`InputError` naming it (exit 2).

    An entry is pretrieve's when it carries its artefact sidecar, or when one of ``records`` is there: what the
    command writes first in every run (a training run's config file, a checkpoint's state, a finished model), whose
    presence says that the rest is its own, an interrupted run's included. A record is an artefact with its sidecar
    or a file holding a JSON object. None entries are skipped; ``remedy`` ends the message.
    """
    if overwrite:
        return
    existing = [Path(path) for path in paths if path is not None and (Path(path).exists() or Path(path).is_symlink())]
    strangers = [path for path in existing if artifacts.read_sidecar(path) is None]
    if strangers and not any(_is_record(Path(record)) for record in records):
        raise InputError(f"exists and was not written by pretrieve (it carries no pretrieve record), so it is not "
                         f"replaced: {remedy}", path=strangers[0])


def _is_record(path: Path) -> bool:
    """A record of :func:`claim`: an artefact with its sidecar, or a file holding a JSON object."""
    if artifacts.read_sidecar(path) is not None:
        return True
    try:
        return path.is_file() and isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def sidecar_records(directory: str | Path) -> list[Path]:
    """A sidecar of an artefact directly in ``directory`` or one level below (a run folder's runs), if any: the
    record (:func:`claim`) of the files written beside them."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return [*directory.glob("*" + artifacts.FILE_SIDECAR_SUFFIX),
            *directory.glob("*/*" + artifacts.FILE_SIDECAR_SUFFIX)][:1]


@contextlib.contextmanager
def producing(path: str | Path, directory: bool = False, needed_bytes: int = 0, largest_file: int = 0,
              scratch: Collection[str] = ()) -> Iterator[Path]:
    """The context of a command writing the file (or, with ``directory``, the directory) ``path`` without a lock:
    :func:`preflight`, then :func:`write_failures` naming ``path``."""
    path = preflight(path, directory, needed_bytes, largest_file, scratch)
    with write_failures(path):
        yield path


@contextlib.contextmanager
def writing(out: str | Path, lock: bool = True, needed_bytes: int = 0, largest_file: int = 0) -> Iterator[Path]:
    """The context of a command writing the directory ``out`` (see the module docstring)."""
    out = Path(out)
    check_writable(out, directory=True)
    created = _missing_parents(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output directory: {exc.strerror or exc}", path=out) from None
    holder = DirectoryLock(out) if lock and process_rank() == 0 else contextlib.nullcontext()
    try:
        with holder:
            if process_rank() == 0:
                remove_leftovers(out)
            check_space(out, needed_bytes, largest_file)   # after the leftovers are gone (a killed save's)
            yield out
    except BaseException:
        _remove_empty(out, created)
        raise


def _missing_parents(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet (deepest first)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_empty(out: Path, created: list[Path]) -> None:
    """After a failure: remove empty sub-directories of ``out`` and the directories this command created, if they
    hold nothing but the lock file (a failed run must not leave an empty ``cache/`` or output directory)."""
    if not out.is_dir():
        return
    for child in sorted(out.rglob("*"), key=lambda p: -len(p.parts)):
        if child.is_dir() and not child.is_symlink():
            with contextlib.suppress(OSError):
                child.rmdir()   # only succeeds when empty
    for directory in created:
        entries = list(directory.iterdir()) if directory.is_dir() else []
        if all(entry.name == LOCK_FILE for entry in entries):
            with contextlib.suppress(OSError):
                for entry in entries:
                    entry.unlink()
                directory.rmdir()
        else:
            break

