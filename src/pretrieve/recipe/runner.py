"""Running a validated recipe: the state threaded through its stages, one stage (a stale one set aside on request),
and the recipe's run files.

:class:`RunState` holds what the stages have produced so far (paths). :func:`run_stages` runs every stage in order,
timing each (per rank under several processes), and writes ``recipe.resolved.json`` once the first stage has passed
(a recipe refused before or at it leaves its output directory as it found it), the results files and ``export/``
(:func:`export_final`: the final retriever with its model card).
:func:`run_stage` refuses a stage whose directory was left by other settings
(:class:`pretrieve.errors.StaleOutputError`), or with ``redo_changed`` renames it to ``<dir>.replaced-<UTC time>``
(:func:`set_aside`) and runs the stage again.

The recipe's run files live in ``runs/<retriever>__<collection>[:split].trec``
(:func:`pretrieve.retrieval.runs.run_path`); a retriever's corpus index in ``embeddings/<retriever>__<collection>``
(one per retriever and collection, shared by mining and evaluation), BM25's in ``bm25-index/<collection>``; both are made by :mod:`pretrieve.retrieval.runs` (called from
:mod:`pretrieve.recipe.rows`). A retriever whose corpus index of the same weights, settings and passages is already in
the user's embedding cache (:mod:`pretrieve.retrieval.cache`: ``pretrieve.search`` put it there) searches that one
instead of encoding the corpus again (one process only).

The runner knows no stage kind: what a stage reads and makes is keyed by the names it declares
(:class:`pretrieve.recipe.schema.Stage`), and each stage module says the rest.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from pretrieve import ranks
from pretrieve.data.collection import BeirCollection
from pretrieve.errors import StaleOutputError
from pretrieve.interrupts import TrainingTerminated, sigterm_raises
from pretrieve.io_utils import write_json
from pretrieve.modeling.export import export_model
from pretrieve.modeling.model_card import metrics_of
from pretrieve.recipe.results import recommended_rows, write_results
from pretrieve.recipe.schema import STAGES, RecipeOptions, stage_labels
from pretrieve.retrieval import runs
from pretrieve.retrieval.cache import cached_index
from pretrieve.train.settings import default_of

logger = logging.getLogger(__name__)

#: The recipe as run (its collection and model resolved), written once the first stage has passed.
RESOLVED_FILE = "recipe.resolved.json"


@dataclass
class RunState:
    """What the stages have produced so far, threaded through the recipe.

    ``given`` holds the stages' products under the names they declare they ``give``
    (:class:`pretrieve.recipe.schema.Stage`): product → {name → value}, in the order made — ``given["retriever"]``:
    each fine-tuned retriever's label → its exported directory; ``given["mined"]``: each mining stage's label → its
    groups file (the latest is the one read); ``given["fusion"]``: each fusion's name → its record. ``report`` holds
    sections stages add to ``results.json`` beside the rows (``selections``: each selection's dev choice).
    """

    recipe: dict[str, Any]
    out: Path
    data: Path
    base_model: str
    given: dict[str, dict[str, Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    collections: dict[str, Path] = field(default_factory=dict)  # every collection name of the recipe → its path
    dev: dict[str, Any] | None = None      # the dev split's record (pretrieve.recipe.dev.prepare_dev), if any
    report: dict[str, dict[str, Any]] = field(default_factory=dict)

    def give(self, product: str, name: str, value: Any) -> Any:
        """Record ``value`` as the product ``product`` (a name a stage declares it gives) called ``name``."""
        self.given.setdefault(product, {})[name] = value
        return value

    def named(self, product: str) -> dict[str, Any]:
        """Every ``product`` made so far: name → value, in order (empty when none)."""
        return self.given.get(product, {})

    def latest(self, product: str) -> Any:
        """The latest ``product`` made (None when none)."""
        made = self.given.get(product)
        return list(made.values())[-1] if made else None

    @property
    def init_model(self) -> str:
        """Every fine-tuning stage starts from the latest pre-trained checkpoint (or the base model)."""
        return self.latest("pretrained") or self.base_model

    def seeded(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """A training stage's options with the recipe's seed unless the stage sets its own, and the recipe's
        experiment trackers (``report_to``)."""
        values = dict(options)
        values.setdefault("seed", self.recipe.get("seed", default_of(RecipeOptions, "seed")))
        values["report_to"] = self.recipe.get("report_to")
        return values

    def embeddings(self, retriever: str, collection: Path) -> Path:
        """The corpus index of the retriever named ``retriever`` on ``collection`` (mining and evaluation share it)."""
        return self.out / "embeddings" / f"{retriever}__{collection.name}"

    def corpus_index(self, retriever: str, collection: BeirCollection):
        """The corpus index directory of the retriever named ``retriever`` on ``collection``, chosen once the
        retriever is loaded: the user cache's when it is current there (see the module docstring), else
        :meth:`embeddings`."""
        own = self.embeddings(retriever, collection.root)
        if ranks.active():
            return own

        def choose(loaded) -> Path:
            shared = cached_index(loaded, collection.corpus_dataset(), collection.corpus_path)
            if shared is None:
                return own
            logger.info("%s on %s: the corpus index in the embedding cache is current (%s); not re-encoding",
                        retriever, collection.root.name, shared)
            return shared

        return choose

    def run_path(self, label: str, collection: Path, split: str) -> Path:
        """``runs/<label>__<collection>[:split].trec`` (:func:`pretrieve.retrieval.runs.run_path`)."""
        return runs.run_path(self.out, label, collection, split)


# ------------------------------------------------------------------------------------------------ stages
def run_stages(state: RunState, path: str | Path, show_progress: bool, redo_changed: bool) -> dict[str, Any]:
    """Every stage of ``state.recipe`` in order; returns the results (also written to ``results.json`` / ``.md``)."""
    recipe, out_dir = state.recipe, state.out
    results: dict[str, Any] = {"recipe": recipe.get("name") or Path(path).stem, "rows": []}
    labels = stage_labels(recipe)
    rank_timings: dict[str, list[float]] = {}
    for index, (kind, label, options) in enumerate(labels):
        started, waited = time.perf_counter(), ranks.waited()
        logger.info("stage %d/%d: %s", index + 1, len(labels), label)
        with ranks.guard(label), reported_interruption(label, index, len(labels)):
            rows = run_stage(kind, state, options, label, show_progress, redo_changed)
        if index == 0 and ranks.is_main():   # not before: a recipe refused at its first stage leaves no trace
            write_json(out_dir / RESOLVED_FILE, {**recipe, "data": str(state.data), "model": state.base_model})
        state.timings[label] = round(time.perf_counter() - started, 1)
        if ranks.active():   # per rank: seconds in the stage, of which waiting for the other ranks
            mine = {"s": state.timings[label], "waiting_s": round(ranks.waited() - waited, 1)}
            rank_timings[label] = ranks.gather(mine, label)
            logger.info("%s: per rank %s", label, rank_timings[label])
        if rows:
            results["rows"].extend(rows)
    if state.dev is not None:
        results["dev"] = state.dev
    results.update(state.report)   # sections stages add (every select stage's dev choice, also without evaluate)
    if recommended_rows(results["rows"]):   # per evaluated collection, the row results.md recommends (amendment 16)
        results["recommended"] = recommended_rows(results["rows"])
    results["timings_s"] = state.timings
    if rank_timings:
        results["rank_timings_s"] = rank_timings
    results["command"] = f"pretrieve run {path}"
    if ranks.is_main():
        write_results(out_dir, results, recipe)
        export_final(state, results)
    ranks.barrier("write the results")
    return results


@contextlib.contextmanager
def reported_interruption(label: str, index: int, total: int) -> Iterator[None]:
    """SIGTERM (exit 143, :class:`~pretrieve.interrupts.TrainingTerminated`) and Ctrl-C (exit 130) during a stage say
    which stage stopped and how to continue (the same command again: finished stages are reused), unless a training
    stage already said what it kept; the interruption then goes on as before."""
    with sigterm_raises():
        try:
            yield
        except (KeyboardInterrupt, TrainingTerminated) as exc:
            if not getattr(exc, "reported", False) and ranks.is_main():
                what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
                logger.warning("interrupted (%s) during the stage %s (%d of %d); the stages before it are kept: run "
                               "the same command again to continue from this stage", what, label, index + 1, total)
            raise


def export_final(state: RunState, results: Mapping[str, Any]) -> Path | None:
    """``export/``: the final row's retriever (for a fused final row, its chosen or latest fine-tuned model) as a
    sentence-transformers model whose card carries the recipe and ``results.md`` (docs/export.md)."""
    finals = [row["retriever"] for row in results["rows"] if row.get("final")]
    chosen = [row["fusion"]["selection"]["chosen"] for row in results["rows"]
              if row.get("final") and (row.get("fusion") or {}).get("selection")]
    retrievers = state.named("retriever")
    models = {**retrievers, **state.named("candidate")}
    name = next((n for n in finals + chosen if n in models), list(retrievers)[-1] if retrievers else None)
    if name is None:
        return None
    recipe = {**state.recipe, "data": str(state.data), "model": state.base_model}
    return export_model(models[name], state.out / "export", recipe=recipe, row=name,
                        results=(state.out / "results.md").read_text(encoding="utf-8"),
                        metrics=metrics_of(results["rows"], name))


def run_stage(kind: str, state: RunState, options: dict[str, Any], label: str, show_progress: bool,
              redo_changed: bool) -> list[dict] | None:
    """One stage; a stage directory left by other settings is set aside and redone when ``redo_changed``."""
    run = STAGES[kind].run
    try:
        return run(state, options, label, show_progress)
    except StaleOutputError as exc:
        directory = exc.directory.resolve()
        if state.out.resolve() not in directory.parents:
            raise
        if not redo_changed:
            raise StaleOutputError(f"{label}: {exc}; or rerun with --redo-changed to set it aside and run the "
                                   "stage again", exc.directory) from None
        aside = set_aside(directory)
        logger.warning("%s: settings changed since %s was written; moved it to %s and running the stage again",
                       label, directory, aside)
        return run(state, options, label, show_progress)


def set_aside(directory: Path) -> Path:
    """Rename ``directory`` to ``<name>.replaced-<UTC time>[-k]`` (a fresh name) and return the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    aside, k = directory.with_name(f"{directory.name}.replaced-{stamp}"), 1
    while aside.exists():
        k += 1
        aside = directory.with_name(f"{directory.name}.replaced-{stamp}-{k}")
    directory.rename(aside)
    return aside
