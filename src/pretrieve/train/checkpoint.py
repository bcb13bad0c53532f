"""Training checkpoints: written atomically, found again for ``--resume``, pruned to the last few.

A checkpoint is a directory ``<out>/checkpoints/step-<N>`` holding accelerate's state (model,
optimizer, scheduler, RNG of every process) plus ``trainer_state.json``. It is first written to a
hidden temporary directory and renamed into place only once complete, so a process killed while
saving never leaves a half-written ``step-<N>``: resuming picks the newest *complete* checkpoint.
Works under DDP: every process writes its own RNG file into the same temporary directory, then the
main process renames it.

accelerate saves safetensors without aliased tensors and warns about each one it drops; the MLM decoder's
weight (and bias) tied to the input embeddings are such aliases by construction and are tied again when the
model is built, so that warning is turned into a DEBUG line (:class:`TiedDecoderNotice`). Any other shared
tensor keeps its warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_SHARED_NAMES = re.compile(r"Removed shared tensor \{(.*)\} while saving")


class TiedDecoderNotice(logging.Filter):
    """Demotes accelerate's "Removed shared tensor" warning to DEBUG when only tied MLM decoder tensors were
    dropped (they alias the input embeddings by construction and are re-tied on load)."""

    def filter(self, record: logging.LogRecord) -> bool:
        match = _SHARED_NAMES.search(record.getMessage())
        if not match:
            return True
        names = [name.strip().strip("'\"") for name in match.group(1).split(",")]
        if names and all(name.endswith(("decoder.weight", "decoder.bias")) for name in names):
            logging.getLogger(__name__).debug("checkpoint: tied decoder tensors saved once: %s", ", ".join(names))
            return False
        return True


_accelerate_logger = logging.getLogger("accelerate.utils.other")
if not any(isinstance(f, TiedDecoderNotice) for f in _accelerate_logger.filters):
    _accelerate_logger.addFilter(TiedDecoderNotice())


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).exists():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(out_dir)
    return checkpoints[-1][1] if checkpoints else None


def read_state(checkpoint: str | Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / STATE_FILE).read_text())


def save_checkpoint(accelerator, out_dir: str | Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save accelerate state + ``state`` as ``step-<step>`` atomically; keep the newest ``keep``."""
    root = checkpoint_root(out_dir)
    final = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2, default=str))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _prune(out_dir, keep)
    accelerator.wait_for_everyone()
    return final


def _prune(out_dir: str | Path, keep: int) -> None:
    checkpoints = list_checkpoints(out_dir)
    for _, path in checkpoints[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
