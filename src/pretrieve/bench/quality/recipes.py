"""The recipes of ``pretrieve bench quality`` and the one place its package uses the recipe runner.

Every use of :mod:`pretrieve.recipe` (running a recipe, asking whether its results are current, finding a
collection, the measures it reports) goes through this module, so that the runner can move without touching the
rest of the package. A comparison writes three kinds of recipes (each ``recipe.json`` beside its outputs, so that
``pretrieve run <dir>/recipe.json`` repeats it):

* **pre-training** of an arm × seed (``<out>/<arm>/seed<k>``): one ``pretrain`` stage on the pre-training corpus,
  ``pretrain/final`` is the checkpoint every fold fine-tunes (``none`` has none: the base model is used);
* **a fold** (``<out>/<arm>/seed<k>/<train>-<test>``): ``finetune`` stage 1 on the fold's training split of the
  derived training collection (BM25 groups built once per split, ``<out>/groups/``) → ``evaluate`` on the fold's
  test split and on every zero-shot collection;
* **a selection cell** (``<out>/select/<lr>-<epochs>``): the selection arm's first seed fine-tuned on the first
  fold's training split with one point of the grid, evaluated on ``dev`` only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from pretrieve import recipe as recipe_runner   # the only import of the recipe runner in pretrieve.bench.quality
from pretrieve.data.registry import resolve_collection
from pretrieve.errors import ConfigError
from pretrieve.io_utils import write_json
from pretrieve.train.method import PRESETS

MEASURES = recipe_runner.RESULT_MEASURES        # nDCG@10, MRR@10, R@100


def collection_path(name_or_path: str) -> Path:
    """A collection named or given as a path, as an absolute path (the recipe runner's lookup)."""
    return resolve_collection(str(name_or_path)).resolve()


def results_are_current(directory: str | Path) -> bool:
    return recipe_runner.results_are_current(directory)


def run_recipe(recipe: Mapping[str, Any], directory: Path, show_progress: bool) -> dict[str, Any]:
    """Write ``recipe`` to ``<directory>/recipe.json`` and run it (resumable); a row with a non-finite score is not
    a finished run: its ``results.json`` is removed and the run fails."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "recipe.json"
    write_json(path, dict(recipe))
    results = recipe_runner.run_recipe(path, show_progress=show_progress)
    bad = [row for row in results.get("rows", []) if any(not math.isfinite(float(row[m])) for m in MEASURES)]
    if bad:
        (directory / "results.json").unlink()   # not a finished run: a rerun must not take it as one
        raise FloatingPointError(f"non-finite scores for {bad[0]['collection']}: {bad[0]}")
    return results


def needs_pairs(method: str) -> bool:
    """Whether the method pre-trains on passage–query pairs (CoT-MoTE) rather than on corpus text."""
    spec = PRESETS.get(method)
    return spec is not None and spec.context is not None and spec.context.kind == "pairs"


def pretrain_recipe(name: str, out: Path, base: str, data: str, seed: int, method: str,
                    pretrain: Mapping[str, Any], corpus: str, cache_dir: Path, pairs: Path | None = None) -> dict:
    """The pre-training recipe of one arm × seed (``method`` is the preset the arm trains)."""
    method_value: Any = method
    if needs_pairs(method):
        if pairs is None:
            raise ConfigError(f"method '{method}' needs the passage–query pairs file")
        method_value = {"base": method, "context": {"pairs": str(pairs)}}
    return {"name": name, "out": str(out), "model": base, "data": data, "seed": seed,
            "stages": [{"pretrain": {**pretrain, "method": method_value, "corpus": corpus,
                                     "cache_dir": str(cache_dir)}}]}


def finetune_recipe(name: str, out: Path, model: str, data: str, seed: int, finetune: Mapping[str, Any],
                    train_split: str, groups: Path, evaluate: list[str], depth: int,
                    precision: str = "auto") -> dict:
    """Fine-tune stage 1 on ``train_split`` of ``data`` with ``groups`` → evaluate on ``evaluate``
    (``"path:split"`` entries), encoding at ``precision``."""
    return {"name": name, "out": str(out), "model": model, "data": data, "seed": seed,
            "finetune": {**finetune, "split": train_split},
            "stages": [{"finetune": {"stage": 1, "groups": str(groups)}},
                       {"evaluate": {"collections": list(evaluate), "depth": depth, "precision": precision}}]}
