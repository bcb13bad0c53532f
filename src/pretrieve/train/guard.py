"""The divergence guard: a run whose loss explodes stops, and keeps only checkpoints from before the explosion."""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

from pretrieve.errors import TrainingDiverged
from pretrieve.train import checkpoint as ckpt


class DivergenceGuard:
    """Watches the loss of every step. A loss that is non-finite, or more than ``factor`` times the median of the
    normal losses among the last ``window`` steps, is *abnormal* (abnormal losses never enter the reference, so it
    stays the pre-divergence level while the loss explodes). Divergence is a non-finite loss, or an abnormal one
    once ``warmup`` normal losses were seen, or ``warmup`` abnormal losses in a row (an explosion inside the
    warm-up). ``factor`` 0 checks only for non-finite losses. Every pretrieve loss is a cross-entropy/KL in nats (a
    few units at the start), so a tenfold jump over the running median is far outside ordinary step-to-step noise.
    Abnormal losses date the divergence and stop checkpoint pruning (:meth:`steady`)."""

    def __init__(self, factor: float = 10.0, warmup: int = 5, window: int = 100):
        self.factor = factor
        self.warmup = warmup
        self.window = window
        self.history: list[tuple[int, float, bool]] = []   # (step, loss, abnormal)

    def check(self, step: int, loss: float) -> str | None:
        """None while the run is sane; a description of the divergence otherwise."""
        recent = self.history[-self.window:]
        normal = [value for _, value, abnormal in recent if not abnormal]
        median = statistics.median(normal) if normal else 0.0
        ratio_exceeded = bool(self.factor) and median > 0 and loss > self.factor * median
        self.history.append((step, float(loss), not math.isfinite(loss) or ratio_exceeded))
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        in_a_row = len(self.history) >= self.warmup and all(a for _, _, a in self.history[-self.warmup:])
        if ratio_exceeded and (len(normal) >= self.warmup or in_a_row):
            return (f"the loss {loss:.4g} is {loss / median:.3g} times the median {median:.4g} of the "
                    f"{len(normal)} normal losses before it (divergence_factor {self.factor:g})")
        return None

    def first_abnormal_step(self, default: int) -> int:
        """The first abnormal step among the last ``window`` (the start of the divergence; a loss may explode
        during the warm-up, before the check is armed), ``default`` when there is none."""
        return next((step for step, _, abnormal in self.history[-self.window:] if abnormal), default)

    def steady(self, since: int) -> bool:
        """No abnormal loss from step ``since`` on: older checkpoints may be pruned (otherwise they are kept, so a
        divergence still finds one from before it)."""
        return not any(abnormal for step, _, abnormal in self.history if step >= since)


def stop_diverged(accelerator, out: Path, step: int, first_bad: int, problem: str) -> None:
    """Remove the checkpoints whose weights produced (or followed) the first abnormal loss and stop the run.

    The loss logged at step ``s`` is computed with the weights after ``s - 1`` updates, i.e. those of
    checkpoint ``step-(s-1)``: checkpoints from ``first_bad - 1`` on are removed.
    """
    accelerator.wait_for_everyone()
    removed = []
    if accelerator.is_main_process:
        for saved, path in ckpt.list_checkpoints(out):
            if saved >= first_bad - 1:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(saved)
    accelerator.wait_for_everyone()
    kept = ckpt.latest_checkpoint(out)
    where = f"step {step}" + (f" (abnormal from step {first_bad})" if first_bad < step else "")
    detail = (f"removed the checkpoints of steps {', '.join(map(str, removed))}; " if removed else "")
    last = f"the newest kept checkpoint is {kept.name}" if kept else "no checkpoint from before it is kept"
    raise TrainingDiverged(f"training diverged at {where}: {problem}; {detail}{last}. Lower the learning rate "
                           "(--lr) and start again with --overwrite or in another --out (divergence_factor: 0 "
                           "turns the ratio check off)")
