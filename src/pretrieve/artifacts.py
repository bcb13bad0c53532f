"""The freshness contract: how every artefact pretrieve writes is recorded, and the one answer to "is it current?".

An *artefact* is a file or a directory that a stage produces and a later stage (or a re-run) may reuse:
a checkpoint or exported model, corpus embeddings or an index, a TREC run, a training-groups file,
teacher scores, a results table. Every artefact is

* written atomically (:func:`write_file` / :func:`write_dir` yield a temporary sibling that replaces
  the target only when the block succeeds), and
* described by a **sidecar** written after the content is in place: ``<file>.artifact.json`` beside a
  file, ``<dir>/artifact.json`` inside a directory. It records the artefact's ``kind``, the
  ``settings`` that produced it, the **fingerprints of its inputs** (model weights, corpus, groups, …,
  by content, never by path, so outputs are relocatable) and its **own content** (size and SHA-1 of
  every file), so a truncated, emptied or replaced file is recognised.

Every consumer asks :func:`check` (or :func:`is_current`) whether an artefact may be reused: it is current
only if its sidecar exists, its content still matches the recorded sizes (and, when a file's size or
modification time changed, its recorded SHA-1), its settings equal the requested ones and its inputs'
fingerprints equal the current inputs' fingerprints. A crash between the content and the sidecar leaves
an artefact without a sidecar: not current, so it is recomputed — never trusted.

:func:`fingerprint` identifies an input by content: an input that is itself a recorded, intact artefact
answers with its recorded digest (cheap: nothing is re-read); any other file or directory is hashed. A
:class:`FileSet` (some files of a directory, by their names in it) is an input too: the passage tower of a
retriever is the files its passage encoder reads, wherever they sit, so two folders holding the same tower files
(a base model and a model whose passage tower was kept frozen, saved byte for byte) are the same input.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

from pretrieve import __version__
from pretrieve.io_utils import atomic_dir, atomic_path, in_use, write_json

FORMAT = "pretrieve-artifact/1"
FILE_SIDECAR_SUFFIX = ".artifact.json"
DIR_SIDECAR = "artifact.json"
_CHUNK = 1 << 20


# ------------------------------------------------------------------------------------------ sidecars
def sidecar_path(path: str | Path) -> Path:
    """Where the sidecar of ``path`` lives (inside a directory, beside a file)."""
    path = Path(path)
    if path.is_dir():
        return path / DIR_SIDECAR
    return path.with_name(path.name + FILE_SIDECAR_SUFFIX)


def read_sidecar(path: str | Path) -> dict[str, Any] | None:
    """The sidecar of ``path`` as a dict, or None when it is missing or unreadable."""
    side = sidecar_path(path)
    try:
        data = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _normalise(value: Any) -> Any:
    """JSON round trip, so tuples/Paths/numpy scalars compare as they will be read back."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


# SHA-1 of files this process already read, keyed by what identifies an unchanged file: a run checks the same
# inputs (a base model, a corpus) several times, and hashes them once.
_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}


def _sha1_file(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    known = _DIGESTS.get(key)
    if known is not None:
        return known
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


#: Folders of caches that pretrieve derives from the files beside them (the Arrow datasets of
#: :mod:`pretrieve.data.arrow`): not content of a directory artefact that holds them (a synthetic collection stays
#: current when a stage caches its corpus as Arrow inside it).
DERIVED_CACHE_DIR = ".pretrieve-cache"


def _content_files(path: Path) -> list[tuple[str, Path]]:
    """``[(relative name, file)]`` of an artefact's content (a file is its own single entry; the sidecar
    of a directory and the derived caches in it are not content)."""
    if path.is_file():
        return [(path.name, path)]
    return sorted((file.relative_to(path).as_posix(), file) for file in path.rglob("*")
                  if file.is_file() and file.relative_to(path).as_posix() != DIR_SIDECAR
                  and DERIVED_CACHE_DIR not in file.relative_to(path).parts[:-1])


def describe_content(path: str | Path) -> dict[str, Any]:
    """``{"files": {name: {size, mtime_ns, sha1}}, "sha1": digest of them all}`` of a file or directory."""
    path = Path(path)
    files = {}
    for name, file in _content_files(path):
        stat = file.stat()
        files[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha1": _sha1_file(file)}
    # a file's digest is that of its bytes (its name is not content); a directory's covers names and bytes
    digest = next(iter(files.values()))["sha1"] if path.is_file() else _combined_digest(files)
    return {"files": files, "sha1": digest}


def _combined_digest(files: Mapping[str, Mapping[str, Any]]) -> str:
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]['size']}\0{files[name]['sha1']}\n".encode())
    return digest.hexdigest()


def content_problem(path: str | Path, recorded: Mapping[str, Any]) -> str | None:
    """Why ``path``'s content no longer matches its recorded description (None when it matches).

    Sizes are always compared; a file whose size and modification time both match is trusted without
    re-reading; one whose modification time changed (a copy, a touch, an in-place edit) is re-hashed.
    """
    path = Path(path)
    files = recorded.get("files")
    if not isinstance(files, Mapping):
        return "its sidecar records no content"
    present = dict(_content_files(path)) if path.exists() else {}
    for name, entry in files.items():
        file = present.get(name)
        if file is None:
            return f"{name} is missing"
        stat = file.stat()
        if stat.st_size != entry.get("size"):
            return f"{name} has {stat.st_size} bytes, {entry.get('size')} were written (truncated or replaced)"
        if stat.st_mtime_ns != entry.get("mtime_ns") and _sha1_file(file) != entry.get("sha1"):
            return f"{name} was modified after it was written"
    extra = sorted(set(present) - set(files))
    if extra:
        return f"{extra[0]} was added after it was written"
    return None


def record(path: str | Path, kind: str, settings: Mapping[str, Any] | None = None,
           inputs: Mapping[str, str | Path] | None = None) -> dict[str, Any]:
    """Write the sidecar of an artefact that is already complete at ``path`` (e.g. a directory a library
    saved); prefer :func:`write_file` / :func:`write_dir`, which call this after their atomic rename."""
    path = Path(path)
    data = {"format": FORMAT, "kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "producer": {"pretrieve": __version__},
            "settings": _normalise(dict(settings or {})),
            "inputs": {name: fingerprint(value) for name, value in (inputs or {}).items()},
            "content": describe_content(path)}
    write_json(sidecar_path(path), data)
    return data


@contextlib.contextmanager
def write_file(path: str | Path, kind: str, settings: Mapping[str, Any] | None = None,
               inputs: Mapping[str, str | Path] | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it replaces ``path`` and the sidecar is
    written. Streams may write the temporary file bit by bit (a run written as queries are searched)."""
    path = Path(path)
    discard_sidecar(path)  # the old sidecar must never describe the new content, even for an instant
    with atomic_path(path) as tmp:
        yield tmp
    record(path, kind, settings, inputs)


@contextlib.contextmanager
def write_dir(path: str | Path, kind: str, settings: Mapping[str, Any] | None = None,
              inputs: Mapping[str, str | Path] | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; when the block succeeds it replaces ``path`` as a whole and
    the sidecar (``artifact.json`` inside) is written."""
    path = Path(path)
    with atomic_dir(path) as tmp:
        yield tmp
    record(path, kind, settings, inputs)


def discard_sidecar(path: str | Path) -> None:
    """Remove the sidecar of ``path`` (the artefact becomes not-current)."""
    with contextlib.suppress(FileNotFoundError):
        sidecar_path(path).unlink()


# ------------------------------------------------------------------------------------------ checking
@dataclass
class Freshness:
    """The answer of :func:`check`: ``current`` and, when not, why (``reason``; ``differing`` names the
    settings or inputs that changed)."""

    current: bool
    reason: str = ""
    differing: list[str] = field(default_factory=list)
    exists: bool = False

    def __bool__(self) -> bool:
        return self.current


def differing_values(recorded: Mapping[str, Any], current: Mapping[str, Any],
                     ignore: Collection[str] = ()) -> list[str]:
    """Keys (outside ``ignore``) whose values differ once ``current`` is JSON-normalised as ``recorded`` was."""
    current = _normalise(dict(current))
    return sorted(name for name in set(recorded) | set(current)
                  if name not in ignore and recorded.get(name) != current.get(name))


def describe_changes(recorded: Mapping[str, Any], current: Mapping[str, Any], keys: Collection[str]) -> str:
    """``"lr: 0.0005 -> 0.001; seed: 3 -> 4"`` for the given keys (long values shortened)."""
    current = _normalise(dict(current))

    def shown(value: Any) -> str:
        text = json.dumps(value, default=str)
        return text if len(text) <= 60 else text[:57] + "..."

    return "; ".join(f"{key}: {shown(recorded.get(key))} -> {shown(current.get(key))}" for key in keys)


def check(path: str | Path, settings: Mapping[str, Any] | None = None,
          inputs: Mapping[str, str | Path] | None = None, kind: str | None = None,
          ignore: Collection[str] = ()) -> Freshness:
    """Is the artefact at ``path`` complete and made with these settings from these inputs?

    ``settings`` keys in ``ignore`` are not compared (bookkeeping such as log frequency). ``inputs`` maps
    an input's name to its path; each is fingerprinted by content (see :func:`fingerprint`).
    """
    path = Path(path)
    if not path.exists():
        return Freshness(False, f"{path} does not exist")
    sidecar = read_sidecar(path)
    if sidecar is None:
        return Freshness(False, f"{path} has no record of how it was made (interrupted, or written by an older "
                                "version)", exists=True)
    if kind is not None and sidecar.get("kind") != kind:
        return Freshness(False, f"{path} is a {sidecar.get('kind')!r}, not a {kind!r}", exists=True)
    problem = content_problem(path, sidecar.get("content", {}))
    if problem:
        return Freshness(False, f"{path}: {problem}", exists=True)
    recorded_settings = sidecar.get("settings", {})
    differing = differing_values(recorded_settings, settings or {}, ignore)
    if differing:
        return Freshness(False, f"{path} was made with other settings "
                                f"({describe_changes(recorded_settings, settings or {}, differing)})",
                         differing, exists=True)
    recorded_inputs = sidecar.get("inputs", {})
    current_inputs = {name: _fingerprint_or_none(value) for name, value in (inputs or {}).items()}
    changed = sorted(name for name in set(recorded_inputs) | set(current_inputs)
                     if recorded_inputs.get(name) != current_inputs.get(name))
    if changed:
        return Freshness(False, f"{path} was made from other inputs ({', '.join(changed)} changed)", changed,
                         exists=True)
    return Freshness(True, exists=True)


def is_current(path: str | Path, settings: Mapping[str, Any] | None = None,
               inputs: Mapping[str, str | Path] | None = None, kind: str | None = None,
               ignore: Collection[str] = ()) -> bool:
    """``check(...).current``."""
    return check(path, settings, inputs, kind, ignore).current


# ------------------------------------------------------------------------------------------ fingerprints
@dataclass(frozen=True)
class FileSet:
    """Some files of the directory ``root``, by their names in it: an input identified by those files' names, sizes
    and bytes (not by ``root`` or the directory's other files)."""

    root: Path
    names: tuple[str, ...]

    def digest(self) -> str:
        files = {}
        for name in self.names:
            file = self.root / name
            files[name] = {"size": file.stat().st_size, "sha1": _sha1_file(file)}
        return _combined_digest(files)

    def __str__(self) -> str:
        return f"{self.root} ({', '.join(self.names)})"


def fingerprint(path: "str | Path | FileSet") -> str:
    """A content fingerprint of a file, a directory or a :class:`FileSet` (``sha1:<hex>``), independent of its path
    and mtime.

    An intact recorded artefact answers with its recorded digest without re-reading its bytes; anything else
    is hashed (a directory: every file's relative name, size and SHA-1; a file set: those of its files).
    """
    if isinstance(path, FileSet):
        if not all((path.root / name).is_file() for name in path.names):
            raise FileNotFoundError(f"cannot fingerprint {path}: a file is missing")
        return "sha1:" + path.digest()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"cannot fingerprint {path}: it does not exist")
    sidecar = read_sidecar(path)
    if sidecar is not None and content_problem(path, sidecar.get("content", {})) is None:
        return "sha1:" + str(sidecar["content"]["sha1"])
    return "sha1:" + describe_content(path)["sha1"]


def _fingerprint_or_none(path: str | Path) -> str | None:
    """The fingerprint of an input, None when it does not exist (then nothing made from it is current)."""
    try:
        return fingerprint(path)
    except FileNotFoundError:
        return None


def remove_stale_temporaries(directory: str | Path, older_than: float | None = None,
                             names: Collection[str] | None = None) -> list[Path]:
    """Remove temporary siblings (``.<name>.*.tmp`` files and directories) that a killed atomic write left in
    ``directory``, if last modified before ``older_than`` (a UNIX time; default: this process's start) and not held
    by a live writer (:func:`pretrieve.io_utils.in_use`); with ``names``, only the temporaries of those names."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    if older_than is None:
        older_than = _process_start_time()
    removed = []
    for entry in directory.iterdir():
        if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        if names is not None and not any(entry.name.startswith(f".{name}.") for name in names):
            continue
        try:
            if entry.lstat().st_mtime >= older_than or in_use(entry):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except FileNotFoundError:
            continue
    return removed


def _process_start_time() -> float:
    """When this process started (UNIX time); falls back to now."""
    try:
        import psutil  # lazy: psutil — where it fails, the fallback below

        return psutil.Process(os.getpid()).create_time()
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: only younger files are kept
        return time.time()


def run_inputs(**paths: str | Path | None) -> tuple[dict[str, Path], dict[str, str]]:
    """Split a run's inputs into local files/directories (fingerprinted by content) and names (a hub model):
    ``({"model": Path(...)}, {})`` or ``({}, {"model": "bert-base-uncased"})``; None values are left out."""
    local, named = {}, {}
    for name, value in paths.items():
        if value is None:
            continue
        if Path(str(value)).exists():
            local[name] = Path(str(value))
        else:
            named[name] = str(value)
    return local, named
