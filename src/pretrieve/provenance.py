"""What produced an output: package versions, git commit, command line, seed, time.

Every output directory gets a ``provenance.json`` from :func:`write_provenance`, so a number in a
results table can be traced to the code and settings that made it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from pretrieve.io_utils import write_json

_PACKAGES = ("pretrieve", "torch", "transformers", "accelerate", "faiss-cpu", "bm25s", "ir-measures", "numpy")


def git_commit() -> str | None:
    """The commit of the source tree this package runs from, with ``-dirty`` if it has local changes."""
    root = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def versions() -> dict[str, str]:
    found = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def provenance(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions(),
        **(extra or {}),
    }


def write_provenance(directory: str | Path, extra: dict[str, Any] | None = None) -> None:
    write_json(Path(directory) / "provenance.json", provenance(extra))
