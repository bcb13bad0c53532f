"""The divergence guard: a run whose loss or weights explode stops, and keeps only checkpoints written while it was
healthy.

Two witnesses: the loss curve (:class:`DivergenceGuard`) and the weights themselves (:class:`WeightCheck`, run before
every checkpoint and before the final export: non-finite parameters, or a parameter norm more than
:data:`WEIGHT_GROWTH` times the run's start). A run can look healthy by its loss alone after it blew up (a collapsed
model scores every candidate alike, a loss of ln k), so neither witness is trusted alone.
"""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

import torch

from pretrieve.errors import TrainingDiverged
from pretrieve.train import checkpoint as ckpt

#: Abnormal losses in a row that make a divergence once the reference is warm (growth sustained, not a spike).
SUSTAINED = 3
#: The reference level never goes below this many nats.
MIN_SCALE = 1.0
#: The median absolute deviation of a normal distribution times this is its standard deviation.
MAD_TO_SD = 1.4826
#: Normal losses in a row that end an episode of abnormal ones: fewer (a collapsed loss between explosions) neither
#: reset the count of abnormal losses nor move the start of the divergence.
RECOVERED = 5
#: Weights whose L2 norm (all parameters) grew beyond this multiple of the run's start are diverged (a healthy run,
#: even from a random initialisation, changes it by a small factor; an exploded one by orders of magnitude).
WEIGHT_GROWTH = 10.0
#: Key of the start's weight norm in a checkpoint's trainer state (a resumed run compares with the original start).
WEIGHT_NORM_KEY = "start_weight_norm"
#: The start of the loss witness's problem (:meth:`DivergenceGuard.check`), the one divergence that
#: ``--divergence-factor`` decides: the other problems (a non-finite loss, exploded weights) call for a lower rate.
RATIO_PROBLEM = "the loss stayed above"


class DivergenceGuard:
    """Watches the loss of every step and tells a diverging run from a noisy but healthy one.

    The *reference* is the normal losses among the last ``window`` steps; its level is robust to outliers: the
    median plus the median absolute deviation (scaled to a standard deviation, 1.4826 × MAD), and never below
    :data:`MIN_SCALE` (1 nat — every pretrieve loss is a cross-entropy/KL in nats, a few units at the start, so a
    reference near 0 must not turn ordinary values into outliers: small batches of an untrained dot-product model
    swing from 0.03 to 11 between steps). A loss more than ``factor`` times that level is *abnormal*; abnormal losses
    never enter the reference, so it stays the pre-divergence level while the loss explodes.

    Abnormal losses form an *episode* that only :data:`RECOVERED` normal losses in a row end: one collapsed (low)
    loss between explosions does not end it. *Divergence* is a non-finite loss (always), or growth that is
    sustained: an abnormal loss that makes :data:`SUSTAINED` abnormal losses in the episode once ``warmup`` normal
    losses were seen, ``warmup`` before that (during the warm-up the reference is a few losses only). A lone spike
    never stops a run. ``factor`` 0 checks only for non-finite losses. The episode's first abnormal loss dates the
    divergence (:meth:`first_abnormal_step`; abnormal losses of the warm-up count), and abnormal losses stop
    checkpoint pruning (:meth:`steady`)."""

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
        episode = self.episode()
        if exceeded and len(episode) >= needed:
            in_a_row = len(episode) == episode[-1] - episode[0] + 1
            span = f"for {needed} steps in a row" if in_a_row else \
                f"at {len(episode)} of the {episode[-1] - episode[0] + 1} steps from step {episode[0]}"
            return (f"{RATIO_PROBLEM} {self.factor:g} times the level {level:.4g} (median {median:.4g} + "
                    f"1.4826 MAD, at least {MIN_SCALE:g}) of the {size} normal losses before it {span}, up to "
                    f"{loss:.4g} (divergence_factor {self.factor:g})")
        return None

    def episode(self) -> list[int]:
        """The steps of the abnormal losses since the last :data:`RECOVERED` normal losses in a row (empty when the
        run has recovered, or never left normal)."""
        steps: list[int] = []
        normal_in_a_row = 0
        for step, _, abnormal in reversed(self.history):
            if abnormal:
                steps.append(step)
                normal_in_a_row = 0
            else:
                normal_in_a_row += 1
                if normal_in_a_row >= RECOVERED:
                    break
        return steps[::-1]

    def first_abnormal_step(self, default: int) -> int:
        """The first step of the current episode of abnormal losses (the start of the divergence: a loss may explode
        during the warm-up, before the check is armed, and a collapsed loss may follow), ``default`` when the run
        is not in one."""
        episode = self.episode()
        return episode[0] if episode else default

    def steady(self, since: int) -> bool:
        """No abnormal loss from step ``since`` on: older checkpoints may be pruned (otherwise they are kept, so a
        divergence still finds one from before it)."""
        return not any(abnormal for step, _, abnormal in self.history if step >= since)


def weight_norm(model: torch.nn.Module) -> float:
    """The L2 norm of all of ``model``'s parameters, in float64 (inf or nan when a parameter is not finite)."""
    with torch.no_grad():
        norms = [torch.linalg.vector_norm(p.detach(), dtype=torch.float64) for p in model.parameters()]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class WeightCheck:
    """The weights' witness: non-finite parameters, or an L2 norm above ``growth`` (0: no norm check) times
    ``start``, the norm at the start of the run."""

    def __init__(self, start: float, growth: float = WEIGHT_GROWTH):
        self.start = float(start)
        self.growth = growth

    def check(self, model: torch.nn.Module) -> str | None:
        """None while the weights are sane; a description of their divergence otherwise."""
        norm = weight_norm(model)
        if not math.isfinite(norm):
            return "the weights hold non-finite values"
        if self.growth and self.start > 0 and norm > self.growth * self.start:
            return (f"the weights' norm grew from {self.start:.4g} at the start to {norm:.4g} ({norm / self.start:.3g} "
                    f"times; more than {self.growth:g} times is a divergence)")
        return None


def checkpoint_growth(checkpoint: Path) -> float | None:
    """How many times the run's start the weights' norm of ``checkpoint`` is (inf when not finite), from its files
    (``model*.safetensors``) and the start recorded in its trainer state; None when either is missing."""
    from safetensors import safe_open  # lazy: safetensors — read only when a diverged run names the checkpoint it keeps

    start = ckpt.read_state(checkpoint).get(WEIGHT_NORM_KEY)
    files = sorted(Path(checkpoint).glob("model*.safetensors"))
    if not start or not files:
        return None
    squares = 0.0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                squares += float(torch.linalg.vector_norm(handle.get_tensor(name), dtype=torch.float64)) ** 2
    norm = math.sqrt(squares)
    return norm / float(start) if math.isfinite(norm) else math.inf


def stop_diverged(accelerator, out: Path, step: int, first_bad: int, problem: str) -> None:
    """Remove the checkpoints whose weights produced (or followed) the first abnormal loss and stop the run.

    The loss logged at step ``s`` is computed with the weights after ``s - 1`` updates, i.e. those of
    checkpoint ``step-(s-1)``: checkpoints from ``first_bad - 1`` on are removed. Every checkpoint was written
    after :class:`WeightCheck` passed, unless ``--divergence-factor 0`` turned its norm check off: the newest one
    left is called healthy only when its weights, read back, are within :data:`WEIGHT_GROWTH` times the start's;
    the message names it, or says that none is kept. The advice fits the problem: ``--divergence-factor`` for the
    loss-ratio check it decides, a lower ``--lr`` for a non-finite loss or exploded weights.
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
    growth = checkpoint_growth(kept) if kept else None
    if kept is None:
        last = "no checkpoint is kept (none was written while the run was healthy)"
    elif growth is not None and not growth <= WEIGHT_GROWTH:
        last = (f"the newest checkpoint left, {kept}, is not healthy either: its weights' norm is {growth:.3g} times "
                f"the start's (checkpoints are not checked with --divergence-factor 0); do not resume from it")
    else:
        last = f"the last healthy checkpoint is kept: {kept}"
    advice = ("Lower the learning rate (--lr), or raise --divergence-factor (0 stops only at a non-finite loss), "
              if problem.startswith(RATIO_PROBLEM) else "Lower the learning rate (--lr) ")
    raise TrainingDiverged(f"training diverged at {where}: {problem}; {detail}{last}. {advice}and start again "
                           "with --overwrite or in another --out")
