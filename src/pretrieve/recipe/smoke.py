"""``pretrieve run RECIPE --smoke``: the same recipe — every stage, every option — made tiny, so that a recipe
meant for 8 GPUs and days is checked end to end on a CPU in a minute or two.

:func:`smoke_recipe` turns a loaded recipe into its smoke version; :func:`pretrieve.recipe.run_recipe` runs it
like any other. What changes, and nothing else:

* **Models.** Every model the recipe names (the top-level ``model``, a reranker's ``model``) is replaced by a tiny
  randomly initialised one of the same architecture family with the same tokenizer family: BERT (2 layers,
  hidden 32, with an MLM head) for BERT-family names and checkpoints (``bert-base-uncased``, ``minilm``,
  ``splade-tiny``, ``Shitao/RetroMAE``), ELECTRA (the same size) for ELECTRA names — both with the uncased
  WordPiece vocabulary of the offline all-MiniLM-L6-v2 package, so nothing is downloaded. The family comes from
  the checkpoint's ``config.json`` when it is local or cached, else from the name; another family is refused.
* **Data.** Every collection (training ``data``, each ``evaluate`` collection, the pre-training ``corpus`` of
  each phase, a pairs file) is cut to a slice when it exists locally — the first 300 passages and the queries of
  each of its splits whose relevant passages are among them — or, when it is absent (``msmarco``,
  ``hf:wikipedia``) or too small a slice results, replaced by a fixture in the same format generated here at
  run time (a synthetic BEIR collection; multi-sentence plain text for pre-training; passage/query pairs).
  A collection keeps the splits it has — a local one its own, an absent known one those the registry lists
  (:data:`pretrieve.data.registry.KNOWN_COLLECTIONS`), besides any the recipe reads — so that the smoke run meets
  what the real run meets (a collection's own ``dev`` split changes where the dev queries come from).
  Nothing is committed, nothing downloaded. Statistics files named in a method (PMI) are dropped so the sliced
  corpus is counted.
* **Dev split.** The recipe's ``dev: {seed}`` or ``{queries, seed}`` becomes 4 queries, held out by the same rule
  as the real run's (:func:`pretrieve.data.folds.held_out_dev`): drawn from the slice's own ``dev`` split when the
  collection has one, else carved out of its training queries (``dev: {split}`` uses the sliced split as it is).
* **Budgets.** Steps (2 per training stage, a checkpoint after the first), batch sizes (4), negatives (≤ 3),
  lengths (≤ 48 tokens), depths (BM25 30, mining 10, evaluation 20, re-ranking 10), the evaluated collections (the
  first 3: each is the same code path on another fixture), warm-up (≤ 1 step) and
  DataLoader workers (0); a DupMAE representation's dimensions become the tiny model's defaults. Precision,
  gradient checkpointing, gradient caching, schedules, methods and their options are kept, so the smoke run
  takes the same code paths.

Each stage kind declares its own shrinking in its module (its ``smoke`` hook, handed a :class:`SmokeKit`) and the
collections and splits it reads (``reads``): this module holds the shared training budget (:func:`capped`) and
names no stage kind; the fixtures (tiny models, slices, synthetic collections) are :mod:`pretrieve.recipe.fixtures`.
The output goes to ``<out>-smoke`` unless ``--out`` is given; results are meaningless as numbers (but pinned:
``tests/pinned/smoke``, docs/recipes.md).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from pretrieve.recipe.dev import training_split
from pretrieve.recipe.fixtures import smoke_collection, smoke_pairs, smoke_text_corpus, tiny_model
from pretrieve.recipe.schema import STAGES
from pretrieve.train.settings import default_of

MAX_EVAL_COLLECTIONS = 3
STEPS = 2
SMOKE_DEV_QUERIES = 4
OPTIONAL_CAPS = {"grad_cache_chunk": 3, "warmup_steps": 1}
"""Options capped only when the recipe sets them."""
FIXED = {"batch_size": 4, "max_steps": STEPS, "save_every": 1, "log_every": 1, "num_workers": 0}
"""Training options set outright; ``micro_batch_size`` and ``epochs`` are removed."""


# ------------------------------------------------------------------------------------------------- recipe
def smoke_out(recipe: Mapping[str, Any], out: str | Path | None = None) -> Path:
    """Where the smoke version of ``recipe`` writes: ``out``, else ``<recipe out>-smoke``."""
    return Path(out) if out is not None else Path(str(recipe["out"]).rstrip("/") + "-smoke")


@dataclass
class SmokeKit:
    """What a stage's ``smoke`` hook (:class:`pretrieve.recipe.schema.Stage`, declared in the stage's own module) uses
    to shrink its options: the fixtures made here and the training budget. ``recipe`` is the recipe as written;
    ``shared`` is true while the hook shrinks the recipe's top-level options shared by every stage of its kind."""

    recipe: Mapping[str, Any]
    smoke: dict[str, Any]
    models: Path
    data: Path
    splits: Mapping[str, set[str]]
    shared: bool = False
    max_collections: int = MAX_EVAL_COLLECTIONS

    def tiny_model(self, name: str) -> str:
        """A tiny random model of ``name``'s family (:func:`tiny_model`)."""
        return tiny_model(name, self.models)

    def collection(self, entry: Any) -> str:
        """A slice or fixture standing for the collection ``entry`` (``name`` or ``name:split``), as the entry."""
        return _smoke_entry(entry, self.splits, self.data, self.smoke)

    def text_corpus(self, corpus: Any) -> str:
        """A small pre-training corpus standing for ``corpus`` (:func:`smoke_text_corpus`)."""
        return str(smoke_text_corpus(corpus, self.data, self.smoke))

    def method(self, method: Any) -> Any:
        """A pre-training method with its pairs file sliced and PMI statistics files dropped."""
        return _smoke_method(method, self.data, self.smoke)

    def training(self, options: Mapping[str, Any], schema: type, caps: Mapping[str, Any],
                 defaults: bool = True) -> dict[str, Any]:
        """A training stage's options (declared by ``schema``) within the smoke budget (:func:`capped`)."""
        return capped(options, schema, caps, defaults)


def smoke_recipe(recipe: Mapping[str, Any], out: str | Path | None = None) -> dict[str, Any]:
    """The smoke version of ``recipe`` (a loaded recipe mapping); writes its tiny models and data under the new
    ``out`` (default ``<recipe out>-smoke``). Each stage shrinks its own options (its ``smoke`` hook)."""
    smoke = copy.deepcopy(dict(recipe))
    smoke["out"] = str(smoke_out(recipe, out))
    smoke["name"] = f"{recipe.get('name', 'recipe')} (smoke)"
    root = Path(smoke["out"])
    models, data = root / "smoke-models", root / "smoke-data"
    stages = [_stage(entry) for entry in smoke["stages"]]
    splits = _needed_splits(smoke, stages)

    smoke["model"] = tiny_model(smoke["model"], models)
    smoke["data"] = str(smoke_collection(smoke["data"], splits[smoke["data"]], data, smoke))
    kit = SmokeKit(recipe, smoke, models, data, splits)
    for spec in STAGES.values():   # options shared by every stage of a kind: capped with the defaults written out
        if spec.shared is not None and spec.smoke is not None:
            smoke[spec.shared] = spec.smoke(dict(smoke.get(spec.shared) or {}), replace(kit, shared=True))
    if smoke.get("dev") and not smoke["dev"].get("split"):
        # of the slice's 8-24 training queries, or of its own dev split's 2-8 (pretrieve.data.folds.held_out_dev)
        smoke["dev"] = {**smoke["dev"], "queries": SMOKE_DEV_QUERIES}
    for index, (kind, options) in enumerate(stages):
        shrink = STAGES[kind].smoke
        if shrink is not None:
            stages[index] = (kind, shrink(options, kit))
    smoke["stages"] = [{kind: options} for kind, options in stages]
    smoke.pop("data_root", None)
    return smoke


def _stage(entry: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    (kind, options), = entry.items()
    return str(kind), dict(options or {})


def capped(options: Mapping[str, Any], schema: type, caps: Mapping[str, Any], defaults: bool) -> dict[str, Any]:
    """Training options within the smoke budget: ``caps`` (option → the smoke cap; a smaller value in the recipe is
    kept), :data:`OPTIONAL_CAPS` and :data:`FIXED`; with ``defaults``, options the recipe leaves at their default
    (declared by ``schema``, :mod:`pretrieve.train.settings`) are capped too (written out)."""
    values = dict(options)
    for key, cap in caps.items():
        if key in values or defaults:
            value = values.get(key, default_of(schema, key))
            values[key] = value if value is None else min(value, cap)
    for key, cap in OPTIONAL_CAPS.items():
        if values.get(key) is not None:
            values[key] = min(values[key], cap)
    representation = str(values.get("representation", ""))
    if representation.startswith("dupmae:"):   # its dimensions are the base model's (384 of 768): tiny defaults
        values["representation"] = "dupmae"
    values.update(FIXED)
    for key in ("micro_batch_size", "epochs", "show_progress"):
        values.pop(key, None)
    return values


def _needed_splits(recipe: Mapping[str, Any], stages: list[tuple[str, dict]]) -> dict[str, set[str]]:
    """Collection entry (as written in the recipe) → the qrels splits the recipe reads from it (each stage's
    ``reads``)."""
    splits: dict[str, set[str]] = {recipe["data"]: set()}
    dev = recipe.get("dev") or {}
    if dev:   # the collection's own dev split, or the training split the dev queries are carved from
        splits[recipe["data"]].add(str(dev.get("split") or training_split(recipe)))
    for kind, options in stages:
        reads = STAGES[kind].reads
        for name, split in reads(options, recipe) if reads is not None else []:
            if split is not None:
                splits.setdefault(name, set()).add(split)
    return splits


def _name_and_split(entry: Any, default: str) -> tuple[str, str]:
    text = str(entry)
    if ":" in text and not Path(text).exists():
        name, _, split = text.partition(":")
        return name, split or default
    return text, default


def _smoke_entry(entry: Any, splits: Mapping[str, set[str]], data: Path, recipe: Mapping[str, Any]) -> str:
    name, split = _name_and_split(entry, "test")
    path = smoke_collection(name, splits.get(name, {split}), data, recipe)
    return f"{path}:{split}" if ":" in str(entry) and not Path(str(entry)).exists() else str(path)


def _smoke_method(method: Any, data: Path, recipe: Mapping[str, Any]) -> Any:
    """A method mapping with its pairs file sliced (or made) and PMI statistics files dropped."""
    if not isinstance(method, Mapping):
        return method
    method = copy.deepcopy(dict(method))
    context = method.get("context")
    if isinstance(context, Mapping) and context.get("pairs"):
        method["context"] = {**context, "pairs": str(smoke_pairs(context["pairs"], data, recipe))}
    for key in ("decoder_masker", "encoder_masker"):
        masker = method.get(key)
        if isinstance(masker, Mapping) and isinstance(masker.get("params"), Mapping):
            masker["params"] = {k: v for k, v in masker["params"].items() if k != "statistics"}
    return method
