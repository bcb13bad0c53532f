"""Training checkpoints: written atomically, found again for ``--resume``, pruned to the last few.

A checkpoint is a directory ``<out>/checkpoints/step-<N>`` holding accelerate's state (model,
optimizer, scheduler, RNG of every process) plus ``trainer_state.json``. It is first written to a
hidden temporary directory and renamed into place only once complete, so a process killed while
saving never leaves a half-written ``step-<N>``: resuming picks the newest *complete* checkpoint. A save that
fails (a full disk) removes its temporary directory and stops the run with one line
(:class:`CheckpointWriteError`) that names the checkpoint kept and the step ``--resume`` continues from.
Works under DDP: every process writes its own RNG file into the same temporary directory, then the
main process renames it.

accelerate saves safetensors without aliased tensors and warns about each one it drops; the MLM decoder's
weight (and bias) tied to the input embeddings are such aliases by construction and are tied again when the
model is built, so that warning is turned into a DEBUG line (:class:`TiedDecoderNotice`, on accelerate's logger only
while a checkpoint is saved: importing this module changes no logger). Any other shared tensor keeps its warning.

Resuming (:func:`load_checkpoint`) is checked: a checkpoint written under other settings is refused
(:func:`check_resumable`), and so is one whose RNG state cannot be restored exactly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

import torch
from accelerate.utils import load as accelerate_load

from pretrieve import artifacts
from pretrieve.errors import InexactResumeError, PretrieveError, StaleOutputError
from pretrieve.outputs import SPACE_ERRORS
from pretrieve.train.settings import RESUMABLE_CHANGES

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
#: Key of the fp16 GradScaler's state in :data:`STATE_FILE` (JSON: numbers only, never a pickle).
SCALER_KEY = "grad_scaler"
#: Files of a checkpoint that accelerate writes with ``torch.save`` (pickles), read only by :func:`safe_load`.
PICKLED_SUFFIXES = (".bin", ".pkl", ".pt", ".pth")
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


@contextlib.contextmanager
def tied_decoder_notice() -> Iterator[None]:
    """:class:`TiedDecoderNotice` on accelerate's logger for the duration (a checkpoint's save), removed after."""
    target = logging.getLogger("accelerate.utils.other")
    notice = TiedDecoderNotice()
    target.addFilter(notice)
    try:
        yield
    finally:
        target.removeFilter(notice)


class CheckpointWriteError(PretrieveError):
    """A checkpoint, or the trained model at the end, could not be written (a full disk, a file-size limit); the
    complete checkpoints are kept."""


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


def remove_partial_saves(out_dir: str | Path) -> list[Path]:
    """Remove the ``.step-N.tmp`` folders of checkpoint saves a killed run left (complete checkpoints are renamed
    from them atomically, so none is ever needed); returns them. Called with the output directory locked."""
    root = checkpoint_root(out_dir)
    partial = sorted(root.glob(".step-*.tmp")) if root.is_dir() else []
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    if partial:
        logger.info("removed %d partial checkpoint save(s) of an interrupted run in %s: %s", len(partial), root,
                    ", ".join(path.name for path in partial))
    return partial


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(out_dir)
    return checkpoints[-1][1] if checkpoints else None


def read_state(checkpoint: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (JSON); one :class:`InexactResumeError` line when it cannot be read."""
    path = Path(checkpoint) / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise ValueError("not a trainer state with a 'step'")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InexactResumeError(f"{path}: cannot restore the training state ({_first_line(exc)}); resume from an "
                                 "earlier checkpoint (remove this one) or start afresh with --overwrite") from None
    return state


def save_checkpoint(accelerator, out_dir: str | Path, step: int, state: dict[str, Any], keep: int,
                    scaler=None) -> Path:
    """Save accelerate state + ``state`` (+ the fp16 ``scaler``'s state, as JSON) as ``step-<step>`` atomically;
    keep the newest ``keep``."""
    root = checkpoint_root(out_dir)
    final = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    try:
        with tied_decoder_notice():
            accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            extra = {SCALER_KEY: scaler.state_dict()} if scaler is not None else {}
            (tmp / STATE_FILE).write_text(json.dumps({**state, **extra, "step": step}, indent=2, default=str))
    except Exception as exc:  # noqa: BLE001 - a full disk, a file-size limit: torch and safetensors raise their own
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(write_failure(out_dir, step, exc)) from None
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _prune(out_dir, keep)
    accelerator.wait_for_everyone()
    return final


def write_failure(out_dir: str | Path, step: int, exc: Exception) -> str:
    """The one line of a checkpoint that could not be written: why, what is kept, how to continue."""
    kept = list_checkpoints(out_dir)
    where = (f"the newest complete checkpoint {kept[-1][1]} is kept: free some space and rerun the same command "
             f"with --resume to continue from step {kept[-1][0]}") if kept else \
        "no earlier checkpoint exists: free some space and rerun the same command"
    return (f"{checkpoint_root(out_dir)}: the checkpoint of step {step} could not be written ({_first_line(exc)}); "
            f"{where}")


def final_write_failure(final: str | Path, out_dir: str | Path, exc: Exception) -> str:
    """The one line of a trained model that could not be written into ``final``: why, what is kept, how to finish."""
    kept = list_checkpoints(out_dir)
    where = (f"the newest complete checkpoint {kept[-1][1]} is kept: free some space and rerun the same command "
             f"with --resume (it continues from step {kept[-1][0]})") if kept else \
        "no checkpoint is kept: free some space and rerun the same command"
    return f"{final}: the trained model could not be written ({_first_line(exc)}); {where}"


def is_write_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for lack of space or at a size limit, whichever library raised it
    (an ``OSError``; safetensors' ``SafetensorError`` and torch's ``RuntimeError`` only say so in their message)."""
    if isinstance(exc, OSError) and exc.errno in SPACE_ERRORS:
        return True
    return any(marker in str(exc) for marker in WRITE_FAILURE_MARKERS)


#: How libraries that raise no ``OSError`` say a write failed (safetensors: "I/O error: No space left on device (os
#: error 28)"; torch: "PytorchStreamWriter failed writing file").
WRITE_FAILURE_MARKERS = ("No space left on device", "Disk quota exceeded", "File too large", "I/O error",
                         "failed writing file", "file write failed")


def _prune(out_dir: str | Path, keep: int) -> None:
    checkpoints = list_checkpoints(out_dir)
    for _, path in checkpoints[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)


def check_resumable(checkpoint: Path, state: Mapping[str, Any], run_info: dict[str, Any]) -> None:
    """Refuse to resume from ``checkpoint`` (its trainer ``state``) when it was written under other settings
    than ``run_info``'s."""
    recorded, current = state.get("config"), run_info.get("config")
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return
    differing = artifacts.differing_values(recorded, current, RESUMABLE_CHANGES)
    if differing:
        changes = artifacts.describe_changes(recorded, current, differing)
        raise StaleOutputError(f"{checkpoint} was written by a run with other settings ({changes}); resume with "
                               f"the same settings, or start afresh with --overwrite or in another output "
                               "directory", checkpoint.parent.parent)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0][:200] if text else ''}"


def safe_load(path: Path) -> Any:
    """A pickled checkpoint file read with ``torch.load(weights_only=True)`` and accelerate's allow-list of numpy
    types (:func:`accelerate.utils.load`): tensors, numbers, strings and containers only; a pickle that would
    construct anything else (run code) is refused, never executed."""
    return accelerate_load(path, map_location="cpu")


def check_loadable(checkpoint: Path, skip: Collection[Path] = ()) -> None:
    """Refuse (:class:`InexactResumeError`, one line naming the file) a checkpoint holding a pickled file that
    :func:`safe_load` cannot read, before anything is restored from it."""
    for path in sorted(checkpoint.iterdir()):
        if path.suffix in PICKLED_SUFFIXES and path not in skip:
            try:
                safe_load(path)
            except Exception as exc:  # noqa: BLE001 - unreadable or unsafe: refused the same way
                raise InexactResumeError(f"{checkpoint}: cannot restore the training state ({path.name}: "
                                         f"{_first_line(exc)}); resume "
                                         "from an earlier checkpoint (remove this one) or start afresh with "
                                         "--overwrite") from None


def load_checkpoint(accelerator, checkpoint: Path, allow_inexact: bool = False, state: Mapping[str, Any] | None = None,
                    scaler=None) -> None:
    """``accelerator.load_state(checkpoint)``, checked, and nothing in the checkpoint can run code: every pickled
    file is read as data only (:func:`safe_load`, also what accelerate's own ``load_state`` does with them) and
    refused when it holds anything else; the fp16 loss scale comes from ``state`` (``trainer_state.json``).

    Every process's RNG state must be restored exactly (accelerate only logs, at INFO, when it cannot read a
    ``random_states_<rank>.pkl``). A process that could not restore it fails the resume on every process
    (:class:`InexactResumeError` naming the file), or, with ``allow_inexact``, gets a warning and continues (its
    losses will differ from the uninterrupted run's). A model, optimizer or scheduler state that cannot be loaded
    always stops the resume."""
    rng_file = checkpoint / f"random_states_{accelerator.process_index}.pkl"
    problem = None
    expected = None
    try:
        expected = safe_load(rng_file)
        for key in ("random_state", "numpy_random_seed", "torch_manual_seed"):
            if key not in expected:
                raise ValueError(f"it holds no '{key}'")
    except Exception as exc:  # noqa: BLE001 - any unreadable state is reported the same way
        problem = f"{rng_file}: cannot restore the random number generators' state ({_first_line(exc)})"
    check_loadable(checkpoint, skip=[rng_file] if problem is None else list(checkpoint.glob("random_states_*.pkl")))
    try:
        accelerator.load_state(str(checkpoint))
        if scaler is not None:
            scaler.load_state_dict((state or {})[SCALER_KEY])
    except Exception as exc:  # noqa: BLE001 - a missing or corrupt model/optimizer/scheduler file: cannot continue
        raise InexactResumeError(f"{checkpoint}: cannot restore the training state ({_first_line(exc)}); resume "
                                 "from an earlier checkpoint (remove this one) or start afresh with "
                                 "--overwrite") from None
    if problem is None and not (torch.equal(torch.get_rng_state(), expected["torch_manual_seed"])
                                and random.getstate() == expected["random_state"]):
        problem = f"{rng_file}: the random number generators' state was not restored"
    failed = torch.tensor([0.0 if problem is None else 1.0], device=accelerator.device)
    if accelerator.num_processes > 1:
        failed = accelerator.reduce(failed, "sum")
    if float(failed.item()) == 0:
        return
    problem = problem or f"another process could not restore its random number generators from {checkpoint}"
    if not allow_inexact:
        raise InexactResumeError(f"{problem}: the run would not continue exactly as it was interrupted. Resume "
                                 "from an earlier checkpoint (remove this one), start afresh with --overwrite, or "
                                 "accept an inexact continuation with --allow-inexact-resume")
    logger.warning("INEXACT RESUME (--allow-inexact-resume): %s; the losses from here on will differ from an "
                   "uninterrupted run's", problem)
