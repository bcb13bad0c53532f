"""The divergence guard: a run whose loss explodes stops, and keeps only checkpoints from before the explosion."""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

from pretrieve.errors import TrainingDiverged
from pretrieve.train import checkpoint as ckpt

#: Abnormal losses in a row that make a divergence once the reference is warm (growth sustained, not a spike).
SUSTAINED = 3
#: The reference level never goes below this many nats.
MIN_SCALE = 1.0
#: The median absolute deviation of a normal distribution times this is its standard deviation.
MAD_TO_SD = 1.4826


class DivergenceGuard:
    """Watches the loss of every step and tells a diverging run from a noisy but healthy one.

    The *reference* is the normal losses among the last ``window`` steps; its level is robust to outliers: the
    median plus the median absolute deviation (scaled to a standard deviation, 1.4826 × MAD), and never below
    :data:`MIN_SCALE` (1 nat — every pretrieve loss is a cross-entropy/KL in nats, a few units at the start, so a
    reference near 0 must not turn ordinary values into outliers: small batches of an untrained dot-product model
    swing from 0.03 to 11 between steps). A loss more than ``factor`` times that level is *abnormal*; abnormal losses
    never enter the reference, so it stays the pre-divergence level while the loss explodes.

    *Divergence* is a non-finite loss (always), or growth that is sustained: :data:`SUSTAINED` abnormal losses in a
    row once ``warmup`` normal losses were seen, ``warmup`` in a row before that (during the warm-up the reference
    is a few losses only). A lone spike never stops a run. ``factor`` 0 checks only for non-finite losses. Abnormal
    losses date the divergence and stop checkpoint pruning (:meth:`steady`)."""

    def __init__(self, factor: float = 10.0, warmup: int = 5, window: int = 100):
        self.factor = factor
        self.warmup = warmup
        self.window = window
        self.history: list[tuple[int, float, bool]] = []   # (step, loss, abnormal)

    def level(self) -> tuple[float, float, int]:
        """``(level, median, size)`` of the reference (the normal losses among the last ``window`` steps)."""
        normal = [value for _, value, abnormal in self.history[-self.window:] if not abnormal]
        if not normal:
            return MIN_SCALE, 0.0, 0
        median = statistics.median(normal)
        mad = statistics.median(abs(value - median) for value in normal)
        return max(median + MAD_TO_SD * mad, MIN_SCALE), median, len(normal)

    def check(self, step: int, loss: float) -> str | None:
        """None while the run is sane; a description of the divergence otherwise."""
        level, median, size = self.level()
        exceeded = bool(self.factor) and size > 0 and loss > self.factor * level
        self.history.append((step, float(loss), not math.isfinite(loss) or exceeded))
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        needed = SUSTAINED if size >= self.warmup else self.warmup
        in_a_row = len(self.history) >= needed and all(a for _, _, a in self.history[-needed:])
        if exceeded and in_a_row:
            return (f"the loss stayed above {self.factor:g} times the level {level:.4g} (median {median:.4g} + "
                    f"1.4826 MAD, at least {MIN_SCALE:g}) of the {size} normal losses before it for {needed} steps "
                    f"in a row, up to {loss:.4g} (divergence_factor {self.factor:g})")
        return None

    def first_abnormal_step(self, default: int) -> int:
        """The first step of the abnormal losses in a row that end the history (the start of the divergence: a loss
        may explode during the warm-up, before the check is armed), ``default`` when the last loss is normal."""
        first = default
        for step, _, abnormal in reversed(self.history):
            if not abnormal:
                break
            first = step
        return first

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
                           "(--lr) and start again with --overwrite or in another --out (--divergence-factor 0 "
                           "turns the ratio check off)")
