"""What pretrieve's user cache holds, and pruning it (``pretrieve cache list | size | prune``).

The cache (:func:`pretrieve.data.records.user_cache_dir`: ``$PRETRIEVE_CACHE``, else ``$XDG_CACHE_HOME/pretrieve``
or ``~/.cache/pretrieve``) has one folder per kind of entry; an **entry** is what is built, reused and removed as a
whole:

* ``collections/<name>`` — a downloaded collection, ``collections/hub/<source>`` one from the Hugging Face Hub or
  ir_datasets (:mod:`pretrieve.data.hub`);
* ``arrow/<folder>-<hash>`` — the Arrow datasets of one collection folder (:mod:`pretrieve.data.arrow`);
* ``embeddings/<model>-<key>`` — a corpus encoded by one model (:mod:`pretrieve.retrieval.cache`; the model is read
  from the index's ``meta.json``), ``embeddings/texts/<model>-<side>-<key>.npy`` — a list of texts encoded by one
  model (with its sidecar);
* ``pretrain/<…>`` — tokenised pre-training corpora (:mod:`pretrieve.masking.pmi`);
* anything else at the top of the cache is one entry of kind ``other``.

An entry's **age** is the time since it was last written (the newest modification time of its files): every entry is
written once and read many times, so an old entry is one no run has rebuilt since. Removing an entry is always safe —
the next run that needs it builds it again — but not while a run is using it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pretrieve.artifacts import FILE_SIDECAR_SUFFIX
from pretrieve.data.hub import HUB_DIR, SOURCE_FILE
from pretrieve.data.records import user_cache_dir
from pretrieve.errors import ConfigError
from pretrieve.outputs import human_size
from pretrieve.retrieval.cache import EMBEDDINGS

KINDS = ("collection", "arrow", "embeddings", "texts", "pretrain", "other")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class CacheEntry:
    """One entry of the user cache: its kind, what it is, the model it belongs to ('' when none), its paths
    (a folder, or a file and its sidecar), size in bytes and last write (seconds since the epoch)."""

    kind: str
    what: str
    model: str
    paths: tuple[Path, ...]
    size: int
    modified: float

    def age(self, now: float | None = None) -> float:
        """Seconds since the entry was last written."""
        return (time.time() if now is None else now) - self.modified


def cache_entries(root: Path | None = None) -> list[CacheEntry]:
    """Every entry of the cache at ``root`` (default: the user cache), oldest first."""
    root = user_cache_dir() if root is None else Path(root)
    return sorted(_entries(root), key=lambda entry: entry.modified)


def _entries(root: Path) -> Iterator[CacheEntry]:
    for top in _children(root):
        if top.name == "collections":
            for child in _children(top):
                if child.name == HUB_DIR:
                    for source in _children(child):
                        yield _entry("collection", _hub_label(source), "", source)
                else:
                    yield _entry("collection", child.name, "", child)
        elif top.name == "arrow":
            for child in _children(top):
                yield _entry("arrow", f"Arrow datasets of {child.name.rsplit('-', 1)[0]}/", "", child)
        elif top.name == EMBEDDINGS:
            for child in _children(top):
                if child.name == "texts" and child.is_dir():
                    for file in sorted(child.glob("*.npy")):
                        sidecar = file.with_name(file.name + FILE_SIDECAR_SUFFIX)
                        yield _entry("texts", "encoded texts", file.name.rsplit("-", 2)[0], file, sidecar)
                else:
                    yield _entry("embeddings", "encoded corpus", _index_model(child), child)
        elif top.name == "pretrain":
            for child in _children(top):
                yield _entry("pretrain", "tokenised pre-training corpus", "", child)
        else:
            yield _entry("other", top.name, "", top)


def _children(folder: Path) -> list[Path]:
    """The entries of a folder, leaving out hidden ones (locks, a build in progress)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def _entry(kind: str, what: str, model: str, *paths: Path) -> CacheEntry:
    files = [f for p in paths if p.exists() for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    stats = [f.stat() for f in files]
    modified = max((s.st_mtime for s in stats), default=max((p.stat().st_mtime for p in paths if p.exists()),
                                                            default=0.0))
    return CacheEntry(kind, what, model, tuple(p for p in paths if p.exists()), sum(s.st_size for s in stats),
                      modified)


def _hub_label(folder: Path) -> str:
    try:
        source = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
        return f"{source['kind']}:{source['id']}"
    except (OSError, ValueError, KeyError, TypeError):
        return folder.name


def _index_model(folder: Path) -> str:
    """The model a cached corpus index was encoded with (its shards' ``meta.json``), else the folder's label."""
    for meta in sorted(folder.glob("*/meta.json")):
        try:
            return str(json.loads(meta.read_text(encoding="utf-8"))["model"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return folder.name.rsplit("-", 1)[0]


def parse_age(text: str, option: str = "--older-than") -> float:
    """``30d`` / ``12h`` / ``2w`` / ``90m`` → seconds; anything else is a one-line :class:`ConfigError`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*", str(text))
    if not match:
        raise ConfigError(f"{option}: '{text}' is not an age; write a number and a unit: 90m, 12h, 30d or 2w")
    return float(match.group(1)) * _UNITS[match.group(2)]


def matches_model(entry: CacheEntry, model: str) -> bool:
    """Whether ``entry`` belongs to ``model``: its recorded model equals it, or ends with it as a path or hub name
    (``all-MiniLM-L6-v2`` matches ``sentence-transformers/all-MiniLM-L6-v2``), or its label does."""
    if not entry.model:
        return False
    wanted = model.rstrip("/")
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(wanted).name)
    return entry.model == wanted or entry.model.rstrip("/").endswith("/" + wanted) or entry.model == label \
        or Path(entry.model.rstrip("/")).name == Path(wanted).name


def select(entries: list[CacheEntry], older_than: float | None = None, model: str | None = None,
           kind: str | None = None, now: float | None = None) -> list[CacheEntry]:
    """The entries older than ``older_than`` seconds, of ``model`` and of ``kind`` (each filter when given)."""
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"--kind: unknown kind '{kind}'; choose from {', '.join(KINDS)}")
    now = time.time() if now is None else now
    return [e for e in entries if (older_than is None or e.age(now) > older_than)
            and (model is None or matches_model(e, model)) and (kind is None or e.kind == kind)]


def remove(entry: CacheEntry) -> None:
    """Delete an entry's folder or files (a folder is first renamed aside, so a half-deleted entry is never read)."""
    for path in entry.paths:
        if path.is_dir():
            aside = path.with_name(f".{path.name}.removing-{os.getpid()}")
            os.replace(path, aside)
            shutil.rmtree(aside)
        else:
            path.unlink(missing_ok=True)


def human_age(seconds: float) -> str:
    """``3d``, ``5h``, ``12m`` or ``now``."""
    for unit, length in (("d", _UNITS["d"]), ("h", _UNITS["h"]), ("m", _UNITS["m"])):
        if seconds >= length:
            return f"{int(seconds // length)}{unit}"
    return "now"
