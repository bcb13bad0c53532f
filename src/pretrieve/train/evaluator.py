"""Evaluation while training: dev measures every ``eval_steps`` steps, and the best evaluated model kept.

What sentence-transformers' ``InformationRetrievalEvaluator`` does inside its trainer (``eval_steps``) and Hugging
Face's ``load_best_model_at_end`` with ``metric_for_best_model``, on pretrieve's own path: at each evaluation the
model is exported exactly as ``<out>/final`` would be (the run's ``export``), that folder is loaded with
:func:`pretrieve.retrieval.load.load_retriever`, its corpus encoded and searched by
:func:`pretrieve.retrieval.search.search` and the run scored by :class:`pretrieve.evaluation.metrics.RunEvaluator`,
so a dev score is the score the saved model gets from ``pretrieve evaluate`` — there is no second search.

* **When.** After every ``every``-th optimizer step and after the last (:meth:`Evaluation.due`); the loop writes a
  log line then too, so the ``eval/<measure>`` line of a step follows its loss line in ``logs.jsonl``, and gives the
  same values to the experiment trackers.
* **Randomness.** The evaluation runs inside ``torch.random.fork_rng``: building the model to load consumes the
  global generator, which dropout also draws from, so without the fork a run with evaluation would train otherwise
  than one without.
* **The best model** (:class:`BestModel`): an evaluated export whose ``metric`` is higher than every earlier one
  (ties keep the earlier step) is kept as ``<out>/best/step-N``; the others are deleted. The best so far
  (``{"step", "value", "metric"}``) is part of every checkpoint's trainer state, and a best folder stays while a
  kept checkpoint names it, so a resumed run starts from the best of the steps before its checkpoint (folders of
  later steps, evaluated by the interrupted run, are removed: the resumed run evaluates those steps again) and ends
  with the same best model as an uninterrupted run. At the end ``<out>/final`` is the best folder (with
  ``evaluation.json``: the metric, the best step and every evaluation), and ``<out>/best`` is removed.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pretrieve.io_utils import write_json

logger = logging.getLogger(__name__)

BEST_DIR = "best"
BEST_KEY = "best"
"""Key of the best evaluation so far in a checkpoint's trainer state."""
EVALUATION_FILE = "evaluation.json"
LOG_PREFIX = "eval/"
_STEP = re.compile(r"^step-(\d+)$")


@dataclass
class Evaluation:
    """Evaluate every ``every`` steps: ``score(directory)`` scores a model exported into ``directory`` (measure →
    value); ``metric`` picks the best; ``describe`` says on which queries (for the log and ``evaluation.json``),
    ``collection`` / ``split`` name them (the model card's ``model-index``)."""

    every: int
    metric: str
    score: Callable[[Path], Mapping[str, float]]
    describe: str = ""
    collection: str = ""
    split: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)

    def due(self, done: int, total_steps: int) -> bool:
        return done % self.every == 0 or done == total_steps


class BestModel:
    """The best evaluated export so far, kept in ``<out>/best/step-N`` (module docstring)."""

    def __init__(self, out: Path, metric: str, record: Mapping[str, Any] | None = None):
        self.root = Path(out) / BEST_DIR
        self.metric = metric
        self.step: int | None = record.get("step") if record else None
        self.value: float | None = record.get("value") if record else None

    @classmethod
    def start(cls, out: Path, metric: str, record: Mapping[str, Any] | None, start_step: int) -> "BestModel":
        """The best model of a run starting at ``start_step``: ``record`` from its checkpoint (None: none yet);
        folders of steps after ``start_step`` or of no record are removed."""
        best = cls(out, metric, record if record and record.get("metric") == metric else None)
        best.prune(keep={best.step} if best.step is not None else set(), after=start_step)
        return best

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(match.group(1)) for match in map(_STEP.match, (p.name for p in self.root.iterdir())) if match)

    def path(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def scratch(self, step: int) -> Path:
        """Where the export of ``step`` is written before it is scored (removed first if a killed run left it)."""
        path = self.root / f".step-{step}.tmp"
        shutil.rmtree(path, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        return path

    def consider(self, step: int, directory: Path, values: Mapping[str, float]) -> bool:
        """Keep ``directory`` (the export of ``step``) as ``best/step-<step>`` when its metric beats the best so
        far, else delete it; returns whether it was kept."""
        value = float(values[self.metric])
        if self.value is not None and value <= self.value:
            shutil.rmtree(directory, ignore_errors=True)
            return False
        target = self.path(step)
        shutil.rmtree(target, ignore_errors=True)
        directory.rename(target)
        self.step, self.value = step, value
        return True

    def record(self) -> dict[str, Any] | None:
        return None if self.step is None else {"step": self.step, "value": self.value, "metric": self.metric}

    def prune(self, keep: set[int], after: int | None = None) -> None:
        """Remove the best folders not in ``keep`` (and with ``after``, every one of a later step), and leftovers
        of exports that were never scored."""
        for step in self.steps():
            if step not in keep or (after is not None and step > after):
                shutil.rmtree(self.path(step), ignore_errors=True)
        if self.root.is_dir():
            for leftover in self.root.glob(".step-*.tmp"):
                shutil.rmtree(leftover, ignore_errors=True)

    def keep_for(self, checkpoint_records: list[Mapping[str, Any] | None]) -> None:
        """After a checkpoint is saved: keep the current best and the best that each kept checkpoint names."""
        keep = {self.step} if self.step is not None else set()
        keep |= {int(record["step"]) for record in checkpoint_records if record and "step" in record}
        self.prune(keep)

    def finish(self, directory: Path, evaluation: Evaluation) -> None:
        """Copy the best model into ``directory`` (the final export's folder) with ``evaluation.json``, and remove
        the best folders."""
        if self.step is None:
            raise RuntimeError("no evaluation was made")   # the last step is always evaluated
        shutil.copytree(self.path(self.step), directory, dirs_exist_ok=True)
        write_json(directory / EVALUATION_FILE, {"metric": self.metric, "best_step": self.step,
                                                 "best_value": self.value, "queries": evaluation.describe,
                                                 "collection": evaluation.collection, "split": evaluation.split,
                                                 "history": evaluation.history})
        shutil.rmtree(self.root, ignore_errors=True)


def log_values(values: Mapping[str, float]) -> dict[str, float]:
    """Measure → value as the log keys (``eval/nDCG@10``)."""
    return {f"{LOG_PREFIX}{name}": float(value) for name, value in values.items()}


def best_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The measures of the best step of an ``evaluation.json`` record (measure → value)."""
    for row in record.get("history") or []:
        if row.get("step") == record.get("best_step"):
            return {key[len(LOG_PREFIX):]: float(value) for key, value in row.items() if key.startswith(LOG_PREFIX)}
    return {}


def read_evaluation(directory: str | Path) -> dict[str, Any] | None:
    """``evaluation.json`` of a model trained with evaluation (None without one)."""
    path = Path(directory) / EVALUATION_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
