"""The records of a comparison: small files, one per finished cell, meant to live in git.

An experiment that outlives one machine is a set of **cells**, each ending in a small record that is committed as
it lands; everything the comparison reports — summaries, gates, contrasts, ``pretrieve bench claims`` — is
recomputed from the records alone, never from checkpoints or run files. A records directory (``--records``, e.g.
``results/claims/tier1`` in the repository) holds:

* ``tier.json`` — the comparison's **portable fingerprint**: every result-determining setting, with collections and
  models named and identified by content digests instead of paths (a checkout at another path, on another machine,
  continues the same comparison), the precision the whole comparison runs at, plus what may grow between runs (arms,
  seeds, declared contrasts, the dev grid);
* ``select/<point>.json`` — one per point of the dev grid: the selection arm's first seed fine-tuned on the first
  fold with that point, its per-query dev nDCG@10 (:func:`selection`: the chosen point is the best once every point
  of the grid has a record);
* ``folds/<arm>/seed<k>/<train>-<test>.json`` — one per fold of an arm × seed, written as the fold's fine-tuning
  and evaluation end (a cell's longest parts, each within a session): the per-query scores of that fold's model,
  its timings, and the SHA-1 of the checkpoint it fine-tuned (``checkpoint_sha256``, the key's historical name).
  A later run, on any machine, reuses a fold record only when that checkpoint is the one it has pre-trained again
  (same bytes; :meth:`Records.fold`), so a cell whose machine was replaced between its folds resumes without
  mixing two checkpoints;
* ``cells/<arm>/seed<k>.json`` — one per arm × seed: the protocol it was fine-tuned with, the per-query scores of
  every fold model on every collection (``nDCG@10``, ``MRR@10``, ``R@100``), the coverage of its checkpoint (the
  per-passage values the claims use), its probes (first seed), pre-training speed, timings, the checkpoint's
  SHA-1 (``checkpoint_sha256``), and where it ran (commit, machine, device, threads, precision). A failed cell
  is recorded too, with its error (rerun with ``--retry-failed``).

A cell record is **current** when its fingerprint digest and precision equal the tier's and its protocol equals
the chosen one; only current records count as done (:meth:`Records.cell`). Records are written atomically
(:func:`pretrieve.io_utils.write_json`) by the process that ran the cell; :func:`commit` adds and commits one record
with git (``bench quality --commit``), so a session that ends without warning loses at most the cells in flight;
a record written by a run killed before it committed it is committed by the next such run (:func:`uncommitted`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch
import transformers

from pretrieve import __version__
from pretrieve.bench.quality.settings import fold_dir
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import file_digest, write_json
from pretrieve.models import resolve_model

logger = logging.getLogger(__name__)

TIER_FORMAT = "pretrieve-claims-tier/1"
CELL_FORMAT = "pretrieve-claims-cell/1"
SELECT_FORMAT = "pretrieve-claims-select/1"
FOLD_FORMAT = "pretrieve-claims-fold/1"
TIER_FILE = "tier.json"
#: The coverage k whose per-passage values a record keeps (the claims' stopword-excluded coverage@10).
KEPT_K = "10"
DONE, FAILED = "done", "failed"
#: Settings that may grow from one run of a comparison to the next without changing any finished cell.
GROWING = ("methods", "seeds", "contrasts", "grid")


# ------------------------------------------------------------------------------------------------ identities
def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest(value: Any) -> str:
    """SHA-256 of a JSON value's canonical form (``sha256:<hex>``)."""
    return "sha256:" + hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=64)
def _files_digest(paths: tuple[str, ...], stamp: tuple) -> str:
    del stamp   # part of the cache key only: a changed file is hashed again
    combined = hashlib.sha256()
    for path in paths:
        combined.update(Path(path).name.encode("utf-8") + b"\0" + file_digest(path).encode("ascii") + b"\0")
    return "sha256:" + combined.hexdigest()


def content_digest(paths: Iterable[Path]) -> str:
    """One digest of several files' contents (their names and SHA-256), independent of where they are."""
    files = tuple(sorted(str(p) for p in paths))
    stamp = tuple((os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in files)
    return _files_digest(files, stamp)


def collection_identity(path: str | Path) -> dict[str, str]:
    """``{"name", "digest"}`` of a BEIR collection (corpus, queries and every qrels file) or a text file."""
    path = Path(path)
    if path.is_file():
        return {"name": path.name, "digest": content_digest([path])}
    files = [f for f in (path / "corpus.jsonl", path / "queries.jsonl") if f.exists()]
    files += sorted((path / "qrels").glob("*.tsv"))
    if not files:
        raise InputError("not a BEIR collection (no corpus.jsonl, queries.jsonl or qrels/*.tsv)", path=path)
    return {"name": path.name, "digest": content_digest(files)}


MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "vocab.txt", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "modules.json", "1_Pooling/config.json")


def model_identity(name_or_path: str) -> dict[str, str]:
    """``{"name", "digest"}`` of a model: an offline alias keeps its name, a folder its last two path parts; the
    digest covers its weights, configuration and vocabulary."""
    resolved = Path(resolve_model(name_or_path))
    files = [resolved / name for name in MODEL_FILES if (resolved / name).exists()]
    if not files:
        raise InputError("no model files (config.json, weights, vocabulary) here", path=resolved)
    text = str(name_or_path)
    name = text if not Path(text).expanduser().exists() else "/".join(Path(text).expanduser().absolute().parts[-2:])
    return {"name": name, "digest": content_digest(files)}


def portable_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """A comparison's fingerprint with every path replaced by a name and a content digest."""
    out = dict(fingerprint)
    out["base"] = model_identity(str(fingerprint["base"]))
    out["train"] = collection_identity(fingerprint["train"])
    out["eval"] = [collection_identity(path) for path in fingerprint["eval"]]
    out["pretrain_data"] = [collection_identity(path) for path in fingerprint["pretrain_data"]]
    return out


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """The commit of the checkout the package runs from (and whether it had uncommitted changes), else the
    installed version."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/src"],
                                    cwd=here, capture_output=True, text=True, timeout=10, check=True).stdout.strip())
        return {"commit": commit, "dirty": dirty, "version": __version__}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "version": __version__}


def machine(threads: int | None = None) -> dict[str, Any]:
    """Where a cell ran: CPU model and the instruction sets that change its speed and bf16 numerics, cores, the
    torch intra-op threads, the accelerator (if any) and the library versions."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu in ("", platform.machine(), platform.processor()):
                cpu = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    device = {"type": "cuda", "name": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else \
        {"type": "cpu"}
    return {"cpu": cpu, "cpu_flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
            "cores": os.cpu_count(), "threads": threads or torch.get_num_threads(), "device": device,
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


# ---------------------------------------------------------------------------------------------------- records
class Records:
    """A records directory (module docstring): the tier file, selection points and cells."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- the tier
    @property
    def tier_path(self) -> Path:
        return self.root / TIER_FILE

    def tier(self) -> dict[str, Any]:
        if not self.tier_path.exists():
            raise InputError(f"no records of a comparison here ({TIER_FILE} missing)", path=self.root)
        return _read(self.tier_path)

    def open(self, fingerprint: Mapping[str, Any], precision: str, growing: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``tier.json``, or check that the recorded comparison is this one (refused, naming the settings
        that differ, otherwise) and add what grows (:data:`GROWING`); returns the tier record."""
        portable = portable_fingerprint(fingerprint)
        tier = {"format": TIER_FORMAT, "fingerprint": portable, "digest": digest(portable), "precision": precision}
        if self.tier_path.exists():
            recorded = _read(self.tier_path)
            differing = sorted(k for k in set(recorded.get("fingerprint", {})) | set(portable)
                               if _canonical(recorded.get("fingerprint", {}).get(k)) != _canonical(portable.get(k)))
            if recorded.get("precision") != precision:
                differing.append("precision")
            if differing:
                raise ConfigError(f"{self.tier_path} records a comparison with other settings "
                                  f"({', '.join(differing)}: recorded {_show(recorded, differing)}); use other "
                                  "--records, or the same settings to continue it")
            for key in GROWING:
                tier[key] = _union(recorded.get(key), growing.get(key))
        else:
            tier.update({key: growing.get(key) for key in GROWING})
        for key, value in growing.items():
            if key not in GROWING:
                tier[key] = value
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.tier_path.exists() or _read(self.tier_path) != json.loads(_canonical(tier)):
            write_json(self.tier_path, tier)
        return tier

    # -- selection
    def select_path(self, name: str) -> Path:
        return self.root / "select" / f"{name}.json"

    def select_point(self, name: str, tier: Mapping[str, Any]) -> dict[str, Any] | None:
        """A grid point's record if it is current (same fingerprint and precision)."""
        record = _read_if(self.select_path(name))
        return record if _current(record, tier, status=None) else None

    # -- cells
    def cell_path(self, arm: str, seed: int) -> Path:
        return self.root / "cells" / arm / f"seed{seed}.json"

    def recorded(self, arm: str, seed: int, tier: Mapping[str, Any]) -> bool:
        """Whether an arm × seed has a current, finished record, whatever protocol it was fine-tuned with."""
        return _current(_read_if(self.cell_path(arm, seed)), tier)

    def cell(self, arm: str, seed: int, tier: Mapping[str, Any], protocol: Mapping[str, Any] | None,
             status: str | None = DONE) -> dict[str, Any] | None:
        """An arm × seed's record if it is current: same fingerprint, precision and protocol (and ``status``,
        unless None)."""
        record = _read_if(self.cell_path(arm, seed))
        return record if _current(record, tier, protocol, status) else None

    # -- folds
    def fold_path(self, arm: str, seed: int, fold: str) -> Path:
        return self.root / "folds" / arm / f"seed{seed}" / f"{fold_dir(fold)}.json"

    def fold(self, arm: str, seed: int, fold: str, tier: Mapping[str, Any], protocol: Mapping[str, Any],
             checkpoint: str | None) -> dict[str, Any] | None:
        """A fold's finished record if it is current: same fingerprint, precision and protocol, and made from the
        checkpoint whose digest is ``checkpoint`` (the one this run has: a checkpoint pre-trained again elsewhere
        with other bytes makes the fold run again)."""
        record = _read_if(self.fold_path(arm, seed, fold))
        return record if _current(record, tier, protocol) and record.get("checkpoint_sha256") == checkpoint \
            else None

    def recorded_folds(self, arm: str, seed: int, tier: Mapping[str, Any], protocol: Mapping[str, Any],
                       folds: Sequence[str]) -> list[str]:
        """The folds of an arm × seed with a finished record for this tier and protocol, whatever checkpoint made
        them (progress only: :meth:`fold` decides whether one is reused)."""
        return [fold for fold in folds if _current(_read_if(self.fold_path(arm, seed, fold)), tier, protocol)]

    def cells(self) -> Iterable[tuple[str, int]]:
        for path in sorted((self.root / "cells").glob("*/seed*.json")):
            yield path.parent.name, int(path.stem[len("seed"):])


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON ({exc.msg})", path=path, line=exc.lineno) from None


def _read_if(path: Path) -> dict[str, Any] | None:
    return _read(path) if path.exists() else None


_ANY_PROTOCOL: Any = object()


def _current(record: Mapping[str, Any] | None, tier: Mapping[str, Any], protocol: Any = _ANY_PROTOCOL,
             status: str | None = DONE) -> bool:
    """The one currency rule of records: this tier's fingerprint and precision, the given fine-tuning
    ``protocol`` (any when left out) and ``status`` (any when None)."""
    return record is not None and record.get("tier_digest") == tier["digest"] and \
        record.get("precision") == tier["precision"] and \
        (protocol is _ANY_PROTOCOL or _canonical(record.get("protocol") or {}) == _canonical(dict(protocol or {}))) \
        and (status is None or record.get("status") == status)


def _union(recorded: Any, given: Any) -> Any:
    if isinstance(recorded, Mapping) or isinstance(given, Mapping):
        keys = list(dict.fromkeys([*(recorded or {}), *(given or {})]))
        return {k: _union((recorded or {}).get(k), (given or {}).get(k)) for k in keys}
    items = list(dict.fromkeys([*(recorded or []), *(given or [])]))
    return sorted(items) if all(isinstance(v, (int, float)) for v in items) else items


def _show(recorded: Mapping[str, Any], keys: Sequence[str]) -> str:
    values = {k: recorded.get("precision") if k == "precision" else recorded.get("fingerprint", {}).get(k)
              for k in keys}
    text = _canonical(values)
    return text if len(text) <= 300 else text[:297] + "..."


def stamp(tier: Mapping[str, Any], threads: int | None) -> dict[str, Any]:
    """What every record says about where and with what it was made."""
    return {"tier_digest": tier["digest"], "precision": tier["precision"], "code": code_version(),
            "machine": machine(threads), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def trimmed_coverage(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A coverage report without examples and with per-passage values for :data:`KEPT_K` only (every variant)."""
    if report is None:
        return None

    def trim(one: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if one is None:
            return None
        kept = {k: v for k, v in one.items() if k not in ("examples", "per_text", "model")}
        kept["per_text"] = {k: [round(float(x), 6) for x in v] for k, v in (one.get("per_text") or {}).items()
                            if k == KEPT_K}
        return kept

    out = trim(report)
    out["variants"] = {name: trim(variant) for name, variant in (report.get("variants") or {}).items()}
    return out


def rounded(per_query: Mapping[str, float]) -> dict[str, float]:
    return {str(q): round(float(v), 6) for q, v in per_query.items()}


def write_record(path: Path, record: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
    return path


def uncommitted(root: Path) -> list[Path]:
    """The record files under ``root`` that git does not have as they are (new or changed): those a run killed
    between writing a record and committing it left behind. Hidden files (a killed write's temporary) are not
    records; outside a git repository, none."""
    result = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "-z", "--", "."],
                            cwd=root, capture_output=True, text=True)
    if result.returncode:
        return []
    top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True,
                              text=True).stdout.strip())
    entries, paths = iter(result.stdout.split("\0")), []
    for entry in entries:            # "XY path" (paths from the top of the repository); a rename adds its old path
        if len(entry) > 3:
            paths.append(top / entry[3:])
            if entry[0] in "RC":
                next(entries, None)
    return sorted(p for p in paths if p.suffix == ".json" and not p.name.startswith(".") and p.is_file())


STALE_LOCK_S = 600
"""An ``index.lock`` older than this is a killed git's leftover (git holds it for a moment), not a live writer's."""


def _remove_stale_lock(cwd: Path) -> None:
    """Remove the repository's ``index.lock`` when it is older than :data:`STALE_LOCK_S` (a git killed mid-commit,
    e.g. at a session's end, leaves it and every later commit fails)."""
    git_dir = subprocess.run(["git", "rev-parse", "--absolute-git-dir"], cwd=cwd, capture_output=True, text=True)
    if git_dir.returncode:
        return
    lock = Path(git_dir.stdout.strip()) / "index.lock"
    try:
        age = time.time() - lock.stat().st_mtime
        if age > STALE_LOCK_S:
            logger.warning("removing %s, left by a git process killed %.0f s ago", lock, age)
            lock.unlink()
    except FileNotFoundError:
        pass


def commit(paths: Sequence[Path], message: str, attempts: int = 20) -> bool:
    """``git add`` + ``git commit`` of exactly ``paths`` in their repository (other staged changes stay
    uncommitted); retried while another git process holds the index lock, and a lock a killed git left long ago
    (:data:`STALE_LOCK_S`) is removed. False (logged) when it cannot."""
    paths = [Path(p).absolute() for p in paths]
    cwd = paths[0].parent
    for attempt in range(attempts):
        errors = ""
        for command in (["git", "add", "--"], ["git", "diff", "--cached", "--quiet", "--"],
                        ["git", "commit", "-q", "-m", message, "--"]):
            result = subprocess.run([*command, *map(str, paths)], cwd=cwd, capture_output=True, text=True)
            if command[1] == "diff":
                if result.returncode == 0:
                    return True        # nothing new to commit (the same record is already committed)
                continue
            if result.returncode:
                errors = result.stderr + result.stdout
                break
        if not errors:
            return True
        if "index.lock" not in errors:
            break
        _remove_stale_lock(cwd)
        time.sleep(1 + attempt)
    logger.warning("could not commit %s: %s", ", ".join(map(str, paths)), errors.strip().splitlines()[-1:])
    return False
