"""The end-to-end recipe: pre-train → fine-tune stage 1 → mine → stage 2 → reranker → stage 3 → evaluate.

``pretrieve run recipe.yaml`` executes the stages a recipe lists, top to bottom, each in its own
directory under ``out``. Before the first stage runs, the **whole recipe is validated** (every key of every
stage against the stage's declared options schema — a typo anywhere is reported with its path and a
suggestion, ``stages[4].teacher.max_negative: unknown option; did you mean max_negatives?``; values coerced to
their types; stage order checked), the output directory is checked for writability and locked (a busy one is
refused before any model is loaded), and **every collection it names is found** (all missing ones are reported at
once, with the places looked at). A recipe refused before its first stage has passed leaves the output directory as
it found it.

Every stage takes paths and returns paths and reuses only what is *current* (:mod:`pretrieve.artifacts`: its
sidecar records the settings and the fingerprints of its inputs, and its content is intact): a finished stage
is never redone, an interrupted one resumes from its last checkpoint, and a run file is searched again when the
retriever's weights, the collection, the split or the depth changed, or when the file was truncated. So killing
and restarting a run finishes with the same results as an uninterrupted one, and no number is reported from an
output that another model produced. A stage whose recipe settings (or inputs, for fine-tuning and the reranker)
changed since it finished or was interrupted is refused with the differing settings, never silently reused or
resumed; ``redo_changed=True`` (``pretrieve run --redo-changed``) instead renames that stage's directory to
``<dir>.replaced-<UTC time>`` (nothing is deleted) and runs the stage again — the stages after it then see
new inputs and are redone the same way.

Recipe (YAML or JSON)::

    name: scifact-cpu
    out: outputs/scifact-cpu
    model: minilm                 # the starting checkpoint (path, offline alias or hub name)
    data: scifact                 # training collection: a path, or a name under a data root
    data_root: null               # also searched (before $PRETRIEVE_DATA and ../shared/data beside the checkout)
    seed: 42
    dev: {seed: 0}                # held-out training queries (pretrieve.recipe.dev): fits and choices are made on them
    finetune: {pooling: mean}     # options shared by every fine-tuning stage
    stages:
      - pretrain: {method: bow, max_steps: 100}     # corpus defaults to the training collection
      - finetune: {stage: 1}
      - mine: {depth: 200}
      - finetune: {stage: 2}
      - reranker: {epochs: 1}
      - teacher: {max_negatives: 31}
      - finetune: {stage: 3}
      - fuse: {name: rrf-zero-shot, runs: [bm25, zero-shot], method: rrf}      # untrained fusion
      - fuse: {name: final, runs: [bm25, finetune-s2], method: wsum, norm: zscore}   # weights fitted on train
      - evaluate: {collections: [scifact, cranfield], split: test, bm25: true, zero_shot: true,
                   rerank_depth: 100, rerank: finetune-s2,   # a collection may name its split: "msmarco:dev"
                   final: final, compare: [bm25, zero-shot, rrf-zero-shot]}   # paired t-tests + closing paragraph
      # modes: [dense, sparse, hybrid, rrf] — retrievers fine-tuned with the sparse/hybrid representation
      #   get one row per search mode (finetune-s1-sparse, ...); default: one row, searched as trained

Several ``pretrain`` stages are pre-training phases (Drop your Decoder, Ma et al. 2024: Wikipedia + BookCorpus, then MS MARCO): each
continues from the previous one's encoder (fresh decoder heads, as the authors' released checkpoints hold only the
encoder), in ``pretrain/``, ``pretrain-2/``, …; fine-tuning starts from the last.

A collection named (not given as a path) is looked for under ``--data-root`` (``pretrieve run``), the recipe's
``data_root``, ``$PRETRIEVE_DATA`` and ``../shared/data`` beside a source checkout, in that order, then in the
download cache, and a collection of the download registry (:mod:`pretrieve.data.registry`) is downloaded there.

The package: :mod:`~pretrieve.recipe.schema` (the options, the stage registry, validation, the order of the stages
checked from what each stage needs and gives), :mod:`~pretrieve.recipe.runner` (the state threaded through the
stages, running one and setting a stale one aside, where run files live), :mod:`~pretrieve.recipe.results`
(``results.json`` / ``results.md``), :mod:`~pretrieve.recipe.smoke` (``--smoke``: the fixtures; each stage shrinks
its own options), :mod:`~pretrieve.recipe.rows` (the run files and fusions several stages share) and
:mod:`pretrieve.recipe.stages`, one module per stage kind: its options dataclass, its function and its declarations
(``@stage("mine", MineOptions, needs=..., gives="mined", smoke=...)``); adding a stage kind is one module there and
its import line (docs/recipes.md, "Adding a stage kind"). Run files are made by :mod:`pretrieve.retrieval.runs`.

Stage semantics follow the papers: stages 2 and 3 re-initialise from the pre-trained checkpoint (not
from the previous stage); ``mine`` uses the latest fine-tuned retriever (the stage-1 one) to mine the
stage-2 negatives; ``teacher`` scores the mined groups with the reranker for stage 3. A second ``mine`` after stage 2
(``mine-2/``, CDMAE's (Li et al. 2023) K₃ negatives of the stage-2 retriever) replaces the mined groups the reranker and the
teacher use. ``fuse`` defines a fused retriever (:mod:`pretrieve.recipe.stages.fuse`: reciprocal rank fusion, or a
normalised weighted sum whose weights are fitted on the training collection's dev queries — or ``train`` without a
``dev`` split, when nothing fused was trained on them); ``select`` (:mod:`pretrieve.recipe.stages.select`) fuses BM25
with whichever of the off-the-shelf, WiSE-FT-interpolated and fine-tuned models dev prefers; ``evaluate`` adds its rows
on every collection and, with ``final``
and ``compare``, paired t-tests of the final row and a closing paragraph in ``results.md``.

**Several processes** (``torchrun --nproc_per_node N -m pretrieve run``, ``accelerate launch``, several nodes
sharing the output directory): every rank runs the recipe; training stages are DDP, the others split their work by
rank — corpus encoding by whole encoding windows, queries by whole search blocks, BM25 queries, re-ranked queries,
teacher groups — and rank 0 merges the parts into the very files one process writes (:mod:`pretrieve.ranks`,
``docs/distributed.md``); ``dist_timeout_minutes`` bounds every wait, and a failed rank is named in a one-line error.

Outputs in ``out``: one directory per stage, ``runs/<retriever>__<collection>.trec`` for every
evaluated run (re-evaluate any number with ``pretrieve evaluate``), ``results.json``, ``results.md``
(one row per retriever and collection, and the time each stage took) and ``recipe.resolved.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import yaml

from pretrieve import artifacts, outputs, ranks
from pretrieve.data.registry import resolve_collections
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open
from pretrieve.models import resolve_model
from pretrieve.recipe import stages  # noqa: F401  (registers every stage kind)
from pretrieve.recipe.dev import prepare_dev
from pretrieve.recipe.results import RESULT_MEASURES, results_are_current, results_markdown
from pretrieve.recipe.runner import RESOLVED_FILE, RunState, run_stages
from pretrieve.recipe.schema import load_recipe, recipe_collections, validate_recipe
from pretrieve.recipe.smoke import smoke_out, smoke_recipe

__all__ = ["RESULT_MEASURES", "load_recipe", "results_are_current", "results_markdown", "run_recipe"]


def run_recipe(path: str | Path | Mapping[str, Any], out: str | Path | None = None, show_progress: bool = True,
               redo_changed: bool = False, data_root: str | Path | None = None, smoke: bool = False,
               dist_timeout_minutes: float | None = None) -> dict[str, Any]:
    """Execute (or resume) a recipe; returns the results dict also written to ``results.json``.

    The whole recipe is validated, then the output directory locked (a busy one is refused before any model or
    collection is looked at), and every collection found before anything is written. ``smoke``: the recipe
    made tiny (:mod:`pretrieve.recipe.smoke`), in ``<out>-smoke`` unless ``out`` is given.

    Under ``torchrun`` / ``accelerate launch`` every rank runs this: work that happens once (the smoke fixtures,
    downloads, the results files) is rank 0's while the others wait, the other stages split their work by rank
    (:mod:`pretrieve.ranks`); ``dist_timeout_minutes`` (else the recipe's) bounds every wait.

    ``path`` may be the recipe itself (a mapping): validated like a file, then kept as ``recipe.yaml`` in the output
    directory once it is locked (so that ``pretrieve run OUT/recipe.yaml`` reproduces the run)."""
    given = path if isinstance(path, Mapping) else None
    recipe = validate_recipe(given, "recipe") if given is not None else load_recipe(path)
    if dist_timeout_minutes is not None:
        ranks.check_timeout(dist_timeout_minutes, "--dist-timeout-minutes")
    ranks.init(dist_timeout_minutes or recipe.get("dist_timeout_minutes"))
    out_dir = smoke_out(recipe, out) if smoke else Path(out if out is not None else recipe["out"])
    check_out(out_dir, {name: Path(name).expanduser() for name in recipe_collections(recipe)})   # paths as given
    with outputs.writing(out_dir):   # locked first: a busy output is refused before any model or data is touched
        claim_out(out_dir, keeps_recipe=given is not None)
        if given is not None:
            path = ranks.once("keep the recipe", lambda: keep_recipe(given, out_dir))
        if smoke:
            recipe = ranks.once("prepare the smoke recipe", lambda: smoke_recipe(recipe, out))
        elif out is not None:
            recipe["out"] = str(out)
        collections = ranks.once("find the collections",
                                 lambda: resolve_collections(recipe_collections(recipe), recipe, data_root))
        check_out(out_dir, collections)
        base_model = ranks.once("find the model", lambda: resolve_model(recipe["model"]))
        data, dev = ranks.once("prepare the dev split",
                               lambda: prepare_dev(recipe, collections[str(recipe["data"])], out_dir))
        state = RunState(recipe=recipe, out=out_dir, data=data, base_model=base_model, collections=collections,
                         dev=dev)
        results = run_stages(state, path, show_progress, redo_changed)
    ranks.finish()
    return results


def check_out(out_dir: Path, collections: Mapping[str, Any]) -> None:
    """Refuse (:class:`InputError` on ``out``) an output directory that is one of the recipe's collections: its
    runs, models and results would be written among the collection's own files."""
    for name, folder in collections.items():
        folder = Path(folder)
        if folder.is_dir() and out_dir.exists() and out_dir.resolve() == folder.resolve():
            raise InputError(f"is the collection '{name}' itself; the recipe's outputs go into a folder of their own",
                             path=out_dir, field="out")


def claim_out(out_dir: Path, keeps_recipe: bool = False) -> None:
    """The ownership rule (:func:`pretrieve.outputs.claim`) for the files a recipe writes at the top of its output
    (``results.*``, the resolved recipe, ``recipe.yaml`` when kept, the run files in ``runs/``), before any stage:
    a file there without pretrieve's record is refused in one line; a stage's folder is its own command's to check."""
    runs_dir = out_dir / "runs"
    run_files = sorted(p for p in runs_dir.iterdir() if not p.name.endswith(artifacts.FILE_SIDECAR_SUFFIX)) \
        if runs_dir.is_dir() else []
    for path in (out_dir / "results.json", out_dir / "results.md", out_dir / RESOLVED_FILE,
                 out_dir / "recipe.yaml" if keeps_recipe else None, *run_files):
        outputs.claim([path], records=[out_dir / RESOLVED_FILE],
                      remedy="choose another out (--out), or move the file away")


def keep_recipe(recipe: Mapping[str, Any], out_dir: Path) -> Path:
    """``out_dir/recipe.yaml``: a recipe given as a mapping, as YAML (paths as strings, so it reads back the same)."""
    path = out_dir / "recipe.yaml"
    with atomic_open(path) as handle:
        yaml.safe_dump(json.loads(json.dumps(dict(recipe), default=str)), handle, sort_keys=False)
    return path
