"""One training run, start to finish: the template every trainer (pre-training, fine-tuning, the reranker) fills.

:class:`TrainingRun` (after FlagEmbedding's ``AbsRunner``) fixes the order of the steps around the loop:

1. **lock** the output directory, refuse what is in it without pretrieve's record unless ``overwrite`` (the
   ownership rule, :func:`pretrieve.outputs.claim`: a folder the user made is never trained into), remove the
   partial checkpoint saves (``checkpoints/.step-N.tmp``) a killed run left, and check its space for what the run
   still writes, the peak of ``keep + 1`` checkpoints — nothing when ``final/`` holds a complete run, which is
   reused or refused but never trained again without ``overwrite`` (:func:`pretrieve.outputs.writing`,
   :func:`pretrieve.outputs.training_space`);
2. **describe** the run — its settings and inputs (hook :meth:`TrainingRun.describe`);
3. **skip a finished run** made with the same settings from the same inputs (:func:`finished_run`), unless
   ``overwrite``;
4. **restart check**: an output holding a previous run's checkpoints is refused without ``resume`` or
   ``overwrite`` (:func:`check_restart`);
5. **fingerprint** the inputs by content (recorded in every checkpoint, so a resume on other inputs is refused);
6. **check the model** against the settings before anything heavy (hook :meth:`TrainingRun.check_model`);
7. **the accelerator** (:func:`pretrieve.train.accelerator.make_accelerator`, with the run's experiment trackers)
   and the settings checked for its number of processes;
8. **data built once**: rank 0 builds (or finds current) the cached datasets while the others wait, then they
   open them (hook :meth:`TrainingRun.build_data`, through :func:`pretrieve.ranks.built_once`);
9. **model and collator** (seeded; hooks :meth:`TrainingRun.build_model`, :meth:`TrainingRun.build_collator`),
   and the run's resolved config written beside its checkpoints (main process);
10. **train and export** (:func:`pretrieve.train.loop.train`, which resumes from the newest checkpoint when asked
    and gives the trackers the resolved config of step 9; hook :meth:`TrainingRun.export`), then
    :meth:`TrainingRun.finish`.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any, Collection, Mapping

import torch

from pretrieve import artifacts, outputs, ranks
from pretrieve.errors import ConfigError, StaleOutputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.train import checkpoint as ckpt
from pretrieve.train.accelerator import TRACKERS_DIR, make_accelerator
from pretrieve.train.settings import LoopConfig
from pretrieve.train.loop import train

logger = logging.getLogger(__name__)

#: What every training run writes into its output directory besides ``checkpoints/step-N`` and its config file.
RUN_ENTRIES = ("final", "logs.jsonl", TRACKERS_DIR)


class TrainingRun(abc.ABC):
    """The template of one training run (module docstring); a trainer subclasses it and fills the hooks.

    Class attributes: ``kind`` (what ``<out>/final`` holds, recorded in its sidecar), ``config_file`` (the resolved
    config written into ``<out>``; removed by ``--overwrite``), ``description`` (the progress bar's),
    ``not_compared`` (settings a finished run may differ in and still be reused).
    """

    kind: str = ""
    config_file: str = ""
    description: str = "train"
    not_compared: Collection[str] = ()

    def __init__(self, config: LoopConfig):
        self.config = config
        self.out = Path(config.out)
        self.accelerator = None

    # ------------------------------------------------------------------------------------------ hooks
    def check(self) -> None:
        """Settings that do not depend on files, before the output is touched."""

    @abc.abstractmethod
    def describe(self) -> tuple[dict[str, Any], dict[str, Path]]:
        """``(settings, inputs)``: what determines the result (no paths) and the local inputs to fingerprint."""

    def check_model(self) -> None:
        """Checks of the model against the settings, before the accelerator and the data."""

    @abc.abstractmethod
    def build_data(self):
        """The training dataset (every rank; caches built once, :func:`pretrieve.ranks.built_once`)."""

    @abc.abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The model to train (seeded by the template)."""

    @abc.abstractmethod
    def build_collator(self, model: torch.nn.Module, dataset):
        """Examples of ``dataset`` → a batch for ``model`` (the loop's collator contract)."""

    @abc.abstractmethod
    def config_record(self) -> dict[str, Any]:
        """What ``config_file`` holds."""

    @abc.abstractmethod
    def export(self, unwrapped: torch.nn.Module, directory: Path) -> None:
        """Write the trained model into ``directory`` (it becomes ``<out>/final``)."""

    def evaluation(self):
        """Dev evaluation while training (:class:`pretrieve.train.evaluator.Evaluation`), or None (the default)."""
        return None

    def finish(self, final: Path) -> None:
        """After training (every rank)."""

    def entries(self) -> list[Path]:
        """What the run writes into ``out`` besides its checkpoints (the ownership rule's paths,
        :func:`pretrieve.outputs.claim`; ``--overwrite`` replaces these and the checkpoints, nothing else)."""
        return [self.out / name for name in RUN_ENTRIES + (self.config_file,)]

    # ------------------------------------------------------------------------------------------ template
    def run(self) -> Path:
        """Run (resume, or skip when already finished) the training; returns ``<out>/final``."""
        self.check()
        self.config.trackers()   # an unknown tracker, or one whose package is missing, before the output is touched
        with outputs.writing(self.out):   # locked first: a killed save's leftovers are then ours to remove
            outputs.claim(self.entries(), self.config.overwrite,
                          records=[self.out / self.config_file, self.out / "final",
                                   *(path / ckpt.STATE_FILE for _, path in ckpt.list_checkpoints(self.out))])
            if outputs.process_rank() == 0:
                ckpt.remove_partial_saves(self.out)
            written = len(ckpt.list_checkpoints(self.out)) if self.config.resume else 0   # a resume writes the rest
            finished = not self.config.overwrite and artifacts.read_sidecar(self.out / "final") is not None
            needed, largest = (0, 0) if finished else \
                outputs.training_space(self.config.model, self.config.keep_checkpoints, written)
            outputs.check_space(self.out, needed, largest)
            return self._run()

    def _run(self) -> Path:
        settings, inputs = self.describe()
        config = self.config
        done = None if config.overwrite else finished_run(self.out, self.kind, settings, inputs,
                                                          ignore=self.not_compared)
        if done is None and config.reuse_from and not config.overwrite:
            done = self.reuse(settings, inputs)
        if done is not None:
            logger.info("%s is complete with the same settings; not training again", done)
            return done
        check_restart(self.out, config, files=(self.config_file,))
        fingerprints = {name: artifacts.fingerprint(path) for name, path in inputs.items()}
        self.check_model()
        self.accelerator = make_accelerator(config, self.out)
        config.validate(self.accelerator.num_processes)
        dataset = self.build_data()
        torch.manual_seed(config.seed)
        model = self.build_model()
        collator = self.build_collator(model, dataset)
        if self.accelerator.is_main_process:   # only once the inputs are read: a failed start leaves no config
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / self.config_file, self.config_record())
        final = train(model, dataset, collator, config.loop(), self.out, self.export,
                      {"config": settings | {"inputs": fingerprints}}, accelerator=self.accelerator,
                      description=self.description, record={"kind": self.kind, "settings": settings, "inputs": inputs},
                      tracked_config=self.config_record(), evaluation=self.evaluation())
        self.finish(final)
        return final

    def reuse(self, settings: Mapping[str, Any], inputs: Mapping[str, str | Path]) -> Path | None:
        """``reuse_from``'s finished run copied in as this one's (``final``, ``logs.jsonl`` and the config file),
        when the freshness rule (:func:`finished_run`) says that it was made with these settings from these
        inputs and this output holds no run of its own; returns this run's ``final``, or None (the run trains):
        another run there, none, one under several processes (each would copy)."""
        source = Path(self.config.reuse_from)
        if ranks.world_size() > 1 or ckpt.list_checkpoints(self.out) or (self.out / "final").exists():
            logger.info("not reusing %s: this output has a run of its own, or several processes run", source)
            return None
        try:
            found, why = finished_run(source, self.kind, settings, inputs, ignore=self.not_compared), "none there"
        except StaleOutputError as error:
            found, why = None, str(error)
        if found is None:
            logger.info("not reusing %s (its finished run: %s): training", source, why)
            return None
        with atomic_dir(self.out / "final") as tmp:
            shutil.copytree(found, tmp, dirs_exist_ok=True)
        for name in ("logs.jsonl", self.config_file):
            if (source / name).is_file():
                shutil.copy2(source / name, self.out / name)
        logger.info("%s: the finished run in %s has these settings and inputs; reused", self.out, source)
        return self.out / "final"      # its record came with it: current, as finished_run just found the source


def finished_run(out: str | Path, kind: str, settings: Mapping[str, Any], inputs: Mapping[str, str | Path],
                 ignore: Collection[str] = ()) -> Path | None:
    """``<out>/final`` when it holds a complete run of ``kind`` made with these settings from these inputs (its
    sidecar says so, :func:`pretrieve.artifacts.check`); None when there is no finished run (or only an
    incomplete one); a :class:`StaleOutputError` naming what differs when it was made otherwise.

    ``settings`` keys in ``ignore`` are not compared; inputs (model weights, corpus, groups) compare by content.
    """
    final = Path(out) / "final"
    status = artifacts.check(final, settings, inputs, kind=kind, ignore=ignore)
    if status.current:
        return final
    sidecar = artifacts.read_sidecar(final) if status.exists else None
    if sidecar is not None and sidecar.get("kind") != kind:
        raise StaleOutputError(f"{final} holds a {sidecar.get('kind')}, not a {kind}; choose another --out", out)
    if status.differing:
        recorded = sidecar.get("settings", {}) if sidecar else {}
        changed = artifacts.differing_values(recorded, settings, ignore)
        what = (f"different settings ({artifacts.describe_changes(recorded, settings, changed)})" if changed
                else f"different inputs ({', '.join(status.differing)} changed)")
        raise StaleOutputError(f"{final} holds a finished run with {what}; choose another --out, or rerun with "
                               "--overwrite to replace it", out)
    if status.exists:
        logger.info("%s is not a complete, recorded run (%s): training (again)", final, status.reason)
    return None


def check_restart(out: str | Path, config: LoopConfig, files: Collection[str] = ()) -> None:
    """Before a run starts without ``resume``: refuse an output directory that holds a previous run's checkpoints
    (naming ``--resume`` and ``--overwrite``); with ``overwrite``, remove that run (its ``checkpoints/step-N``,
    ``final/``, logs, the trackers' files and ``files``; nothing else) first."""
    out = Path(out)
    checkpoints = ckpt.list_checkpoints(out)
    previous = [path for _, path in checkpoints] + [out / name for name in (*RUN_ENTRIES, *files)
                                                    if (out / name).exists() or (out / name).is_symlink()]
    if config.resume or not previous:
        return
    if config.overwrite:   # only what a run writes: a stranger file beside it (or in checkpoints/) stays
        for path in previous:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        with contextlib.suppress(OSError):
            ckpt.checkpoint_root(out).rmdir()   # only when nothing else is in it
        logger.info("--overwrite: removed the previous run in %s", out)
        return
    if checkpoints:
        raise ConfigError(f"{out} holds checkpoints of a previous run (up to step {checkpoints[-1][0]}); continue it "
                          "with --resume, or start afresh with --overwrite (deletes them), or choose another --out")
