"""The end-to-end recipe: pre-train → fine-tune stage 1 → mine → stage 2 → reranker → stage 3 → evaluate.

``pretrieve run recipe.yaml`` executes the stages a recipe lists, top to bottom, each in its own
directory under ``out``. Before the first stage runs, the **whole recipe is validated** (every key of every
stage against the stage's declared options schema — a typo anywhere is reported with its path and a
suggestion, ``stages[4].teacher.max_negative: unknown option; did you mean max_negatives?``; values coerced to
their types; stage order checked) and **every collection it names is found** (all missing ones are reported at
once, with the places looked at); then the output directory is checked for writability and locked.

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

Each stage kind declares its options as a dataclass next to its function (``@stage("mine", MineOptions)``);
adding a stage kind means writing its function and declaring its options schema.

Stage semantics follow the papers: stages 2 and 3 re-initialise from the pre-trained checkpoint (not
from the previous stage); ``mine`` uses the latest fine-tuned retriever (the stage-1 one) to mine the
stage-2 negatives; ``teacher`` scores the mined groups with the reranker for stage 3. A second ``mine`` after stage 2
(``mine-2/``, CDMAE's (Li et al. 2023) K₃ negatives of the stage-2 retriever) replaces the mined groups the reranker and the
teacher use. ``fuse`` defines a fused
retriever (:func:`stage_fuse`: reciprocal rank fusion, or a normalised weighted sum whose weights are fitted on the
training collection's ``train`` queries only); ``evaluate`` adds its rows on every collection and, with ``final``
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

import difflib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pretrieve import artifacts, outputs, ranks
from pretrieve.errors import ConfigError, InputError, StaleOutputError
from pretrieve.io_utils import atomic_open
from pretrieve.options import join_path, validate

logger = logging.getLogger(__name__)

RESULT_MEASURES = ("nDCG@10", "MRR@10", "R@100")


@dataclass
class RunState:
    """What the stages have produced so far (paths), threaded through the recipe."""

    recipe: dict[str, Any]
    out: Path
    data: Path
    base_model: str
    pretrained: str | None = None
    retrievers: dict[str, str] = field(default_factory=dict)   # name → exported retriever dir, in order
    groups: dict[str, str] = field(default_factory=dict)       # "mined" / "teacher" → groups JSONL
    reranker: str | None = None
    fusions: dict[str, dict[str, Any]] = field(default_factory=dict)   # name → {"runs": [...], "spec": FusionSpec}
    timings: dict[str, float] = field(default_factory=dict)
    collections: dict[str, Path] = field(default_factory=dict)  # every collection name of the recipe → its path

    @property
    def init_model(self) -> str:
        """Every fine-tuning stage starts from the pre-trained checkpoint (or the base model)."""
        return self.pretrained or self.base_model

    @property
    def latest_retriever(self) -> str | None:
        return list(self.retrievers.values())[-1] if self.retrievers else None


# ------------------------------------------------------------------------------------------ stage kinds
@dataclass(frozen=True)
class Stage:
    """A recipe stage kind: the function that runs it and the dataclass that declares its options.

    ``set_by_recipe`` names declared options the recipe sets itself (refused in the stage, with the reason);
    ``check(options, where)`` (optional) validates more than types, before the first stage runs.
    """

    run: Callable[..., Any]
    options: type
    set_by_recipe: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[dict[str, Any], str], None] | None = None


STAGES: dict[str, Stage] = {}


def stage(kind: str, options: type, set_by_recipe: Mapping[str, str] | None = None,
          check: Callable[[dict[str, Any], str], None] | None = None):
    """Register the decorated function as the recipe stage ``kind`` with its options schema."""
    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        STAGES[kind] = Stage(function, options, dict(set_by_recipe or {}), check)
        return function
    return register


#: Options of a training stage that the recipe itself sets.
RECIPE_SETS = {"model": "the recipe's 'model' (or the pre-trained checkpoint) is used",
               "data": "the recipe's 'data' is used", "out": "each stage writes under the recipe's 'out'",
               "resume": "the recipe resumes its stages itself", "overwrite": "the recipe resumes its stages itself",
               "show_progress": "use --progress/--no-progress"}


@dataclass
class RecipeOptions:
    """The top level of a recipe."""

    out: str = ""
    model: str = ""
    data: str = ""
    stages: list[Any] = field(default_factory=list)
    name: str | None = None
    data_root: str | None = None
    seed: int = 42
    finetune: dict[str, Any] = field(default_factory=dict)
    dist_timeout_minutes: float | None = None   # under torchrun: the longest a rank waits (pretrieve.ranks: 60)


# ------------------------------------------------------------------------------------------ loading
def checkout_data_dir() -> Path | None:
    """``../shared/data`` beside the source checkout this package runs from (None for an installed package)."""
    root = Path(__file__).resolve().parents[2]
    return root.parent / "shared" / "data" if (root / "pyproject.toml").exists() else None


def data_roots(recipe: Mapping[str, Any], data_root: str | Path | None = None) -> list[Path]:
    """Where named collections are looked for: ``data_root`` (``--data-root``), the recipe's ``data_root``,
    ``$PRETRIEVE_DATA``, ``../shared/data`` beside a source checkout (then the download cache, see
    :func:`resolve_collection_path`)."""
    roots = []
    for value in (data_root, recipe.get("data_root"), os.environ.get("PRETRIEVE_DATA")):
        if value:
            roots.append(Path(os.path.expandvars(str(value))).expanduser())
    checkout = checkout_data_dir()
    if checkout is not None:
        roots.append(checkout)
    return roots


def find_collection(name_or_path: str, recipe: Mapping[str, Any],
                    data_root: str | Path | None = None) -> tuple[Path | None, list[Path]]:
    """``(directory, places looked at)``: a path as given, or a name under the data roots or in the download
    cache — without downloading."""
    from pretrieve.data.registry import default_cache_dir

    path = Path(os.path.expandvars(str(name_or_path))).expanduser()
    if path.is_dir():
        return path, [path]
    looked = [path] if ("/" in str(name_or_path) or str(name_or_path).startswith((".", "~"))) else []
    if not looked:
        looked = [root / str(name_or_path) for root in data_roots(recipe, data_root)]
        looked.append(default_cache_dir() / str(name_or_path).lower())
    for candidate in looked:
        if (candidate / "corpus.jsonl").exists() or (candidate / "corpus.jsonl.gz").exists():
            return candidate, looked
    return None, looked


def resolve_collection_path(name_or_path: str, recipe: Mapping[str, Any],
                            data_root: str | Path | None = None) -> Path:
    """A collection given as a path, or as a name under the first data root that has it, or in the download
    cache; a known name that is nowhere yet is downloaded; anything else is an :class:`InputError` naming the
    places looked at."""
    return resolve_collections([name_or_path], recipe, data_root)[str(name_or_path)]


def resolve_collections(names: list[str], recipe: Mapping[str, Any],
                        data_root: str | Path | None = None) -> dict[str, Path]:
    """Every collection of ``names`` → its directory; one :class:`InputError` listing *all* that cannot be found
    (with the places looked at), so a run never trains for minutes before a later stage's collection fails."""
    from pretrieve.data.registry import KNOWN_COLLECTIONS, resolve_collection

    found: dict[str, Path] = {}
    problems = []
    for name in dict.fromkeys(str(n) for n in names):
        path, looked = find_collection(name, recipe, data_root)
        if path is None and name.lower() in KNOWN_COLLECTIONS and not looked[:1] == [Path(name)]:
            try:
                path = resolve_collection(name)   # downloads into the cache
            except InputError as exc:
                problems.append(f"'{name}' (looked in {', '.join(map(str, looked))}; {exc})")
                continue
        if path is None:
            known = "" if name.lower() in KNOWN_COLLECTIONS else " and it is no collection of the download registry"
            problems.append(f"'{name}' (looked in {', '.join(map(str, looked))}{known})")
            continue
        found[name] = path
    if problems:
        raise InputError(f"collection{'s' if len(problems) > 1 else ''} not found: {'; '.join(problems)}. Give a "
                         "path, --data-root DIR (or data_root in the recipe, or $PRETRIEVE_DATA) holding "
                         "<name>/corpus.jsonl, or a name of `pretrieve data list`")
    return found


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read and validate a whole recipe (see :func:`validate_recipe`); returns it with coerced option values."""
    from pretrieve.train.run_config import load_config_file

    return validate_recipe(load_config_file(path), str(path))


def validate_recipe(recipe: Mapping[str, Any], where: str = "recipe") -> dict[str, Any]:
    """Check every key of the recipe and of each stage against the declared schemas, coerce the values, check each
    stage's further constraints and the order of the stages; one :class:`ConfigError` / :class:`InputError` naming
    the key's path otherwise. Nothing runs and nothing is written."""
    if not isinstance(recipe, Mapping):
        raise InputError("a recipe must be a mapping", path=where)
    for key in ("out", "model", "data", "stages"):
        if key not in recipe:
            raise InputError(f"recipe has no '{key}'", path=where)
    values = validate(RecipeOptions, recipe, where)
    if values.get("dist_timeout_minutes") is not None:
        try:
            ranks.check_timeout(values["dist_timeout_minutes"], "dist_timeout_minutes")
        except ConfigError as exc:
            raise InputError(str(exc), path=where, field="dist_timeout_minutes") from None
    stages = values["stages"]
    if not isinstance(stages, list) or not stages:
        raise InputError("'stages' must be a non-empty list", path=where, field="stages")
    shared = validate(STAGES["finetune"].options, values.get("finetune") or {}, join_path(where, "finetune"),
                      set_elsewhere=STAGES["finetune"].set_by_recipe)
    values["finetune"] = shared
    validated = []
    for index, entry in enumerate(stages):
        kind, options = stage_entry(entry, index)
        at = join_path(join_path(where, "stages"), index)
        spec = STAGES.get(kind)
        if spec is None:
            close = difflib.get_close_matches(kind, list(STAGES), n=1)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(STAGES)}"
            raise InputError(f"{at}: unknown stage '{kind}'; {hint}")
        at = f"{at}.{kind}"
        options = validate(spec.options, options, at, set_elsewhere=spec.set_by_recipe)
        if spec.check is not None:
            merged = {**shared, **options} if kind == "finetune" else options
            try:
                spec.check(merged, at)
            except ConfigError as exc:
                message = str(exc)
                raise ConfigError(message if message.startswith(at) else f"{at}: {message}") from None
        validated.append({kind: options})
    values["stages"] = validated
    check_stage_order(values, where)
    return values


def stage_entry(entry: Any, index: int) -> tuple[str, dict[str, Any]]:
    """``"mine"`` or ``{"mine": {...options}}`` → ``("mine", options)``."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping) and len(entry) == 1:
        kind, options = next(iter(entry.items()))
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"stages[{index}].{kind}: options must be a mapping")
        return str(kind), dict(options)
    raise ConfigError(f"stages[{index}]: expected a stage name or a one-key mapping, got {entry!r}")


def stage_labels(recipe: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``[(kind, label, options)]`` of the (validated) recipe's stages; a fine-tuning stage's label is
    ``finetune-s<stage>``, a repeated stage's ``<kind>-<n>`` (``pretrain-2``: a second pre-training phase)."""
    labels, counts = [], {}
    for index, entry in enumerate(recipe["stages"]):
        kind, options = stage_entry(entry, index)
        counts[kind] = counts.get(kind, 0) + 1
        stage_no = options.get("stage", recipe.get("finetune", {}).get("stage", counts[kind]))
        label = (f"finetune-s{stage_no}" if kind == "finetune"
                 else kind if counts[kind] == 1 else f"{kind}-{counts[kind]}")   # pretrain, pretrain-2: phases
        labels.append((kind, label, options))
    return labels


def check_stage_order(recipe: Mapping[str, Any], where: str = "recipe") -> None:
    """Each stage's inputs come from a stage before it (mined groups, a reranker, a retriever to re-rank)."""
    retrievers: list[str] = []
    mined = teacher = reranker = False
    for index, (kind, label, options) in enumerate(stage_labels(recipe)):
        at = f"{join_path(join_path(where, 'stages'), index)}.{kind}"
        if kind == "finetune":
            stage_no = int({**recipe.get("finetune", {}), **options}.get("stage", 1))
            if stage_no in (2, 3) and "groups" not in options and "groups" not in recipe.get("finetune", {}) \
                    and not (mined if stage_no == 2 else teacher):
                producer = "mine" if stage_no == 2 else "teacher"
                raise ConfigError(f"{at}: stage {stage_no} needs the '{producer}' stage earlier in the recipe")
            retrievers.append(label)
        elif kind == "mine":
            if not retrievers:
                raise ConfigError(f"{at}: needs a fine-tuned retriever earlier in the recipe (a 'finetune' stage)")
            mined = True
        elif kind == "reranker":
            if not mined and "groups" not in options:
                raise ConfigError(f"{at}: needs mined groups (a 'mine' stage earlier) or a 'groups' option")
            reranker = True
        elif kind == "teacher":
            if not (reranker and mined):
                raise ConfigError(f"{at}: needs a 'reranker' stage and mined groups earlier in the recipe")
            teacher = True
        elif kind == "evaluate":
            if not retrievers and not options.get("zero_shot"):
                raise ConfigError(f"{at}: no retriever to evaluate (add 'finetune' stages or zero_shot: true)")
            requested = options.get("rerank")
            if requested is not None and requested not in retrievers:
                raise ConfigError(f"{at}.rerank: no retriever named {requested!r} before this stage "
                                  f"(known: {', '.join(retrievers) or 'none'})")


def recipe_collections(recipe: Mapping[str, Any]) -> list[str]:
    """Every collection a (validated) recipe names: its ``data``, a pre-training ``corpus`` that is neither a file
    nor a hub dataset (``hf:NAME``), and each ``evaluate`` collection (without its ``:split``)."""
    names = [str(recipe["data"])]
    for kind, _, options in stage_labels(recipe):
        corpus = str(options.get("corpus") or "")
        if kind == "pretrain" and corpus and not corpus.startswith("hf:") and not Path(corpus).expanduser().exists():
            names.append(corpus)   # a collection name (a hub dataset, hf:NAME, is the pre-trainer's to load)
        if kind == "evaluate":
            for entry in options.get("collections") or [recipe["data"]]:
                names.append(_split_collection(str(entry))[0])
    return list(dict.fromkeys(names))


def _split_collection(entry: str) -> tuple[str, str]:
    """``"scifact"`` → ("scifact", ""); ``"msmarco:dev"`` → ("msmarco", "dev"); a path with a colon stays whole."""
    if ":" in entry and not Path(entry).exists():
        name, _, split = entry.rpartition(":")
        return name, split
    return entry, ""


def run_recipe(path: str | Path, out: str | Path | None = None, show_progress: bool = True,
               redo_changed: bool = False, data_root: str | Path | None = None, smoke: bool = False,
               dist_timeout_minutes: float | None = None) -> dict[str, Any]:
    """Execute (or resume) a recipe; returns the results dict also written to ``results.json``.

    The whole recipe is validated and every collection found before anything is written. ``smoke``: the recipe
    made tiny (:mod:`pretrieve.smoke`), in ``<out>-smoke`` unless ``out`` is given.

    Under ``torchrun`` / ``accelerate launch`` every rank runs this: work that happens once (the smoke fixtures,
    downloads, the results files) is rank 0's while the others wait, the other stages split their work by rank
    (:mod:`pretrieve.ranks`); ``dist_timeout_minutes`` (else the recipe's) bounds every wait."""
    recipe = load_recipe(path)
    if dist_timeout_minutes is not None:
        ranks.check_timeout(dist_timeout_minutes, "--dist-timeout-minutes")
    ranks.init(dist_timeout_minutes or recipe.get("dist_timeout_minutes"))
    if smoke:
        from pretrieve.smoke import smoke_recipe

        recipe = ranks.once("prepare the smoke recipe", lambda: smoke_recipe(recipe, out))
    elif out is not None:
        recipe["out"] = str(out)
    from pretrieve.models import resolve_model

    collections = ranks.once("find the collections",
                             lambda: resolve_collections(recipe_collections(recipe), recipe, data_root))
    base_model = ranks.once("find the model", lambda: resolve_model(recipe["model"]))
    out_dir = Path(recipe["out"])
    with outputs.writing(out_dir):
        results = _run_recipe(recipe, path, out_dir, collections, base_model, show_progress, redo_changed)
    ranks.finish()
    return results


def _run_recipe(recipe: dict[str, Any], path: str | Path, out_dir: Path, collections: dict[str, Path],
                base_model: str, show_progress: bool, redo_changed: bool) -> dict[str, Any]:
    from pretrieve.io_utils import write_json

    state = RunState(recipe=recipe, out=out_dir, data=collections[str(recipe["data"])], base_model=base_model,
                     collections=collections)
    if ranks.is_main():
        write_json(out_dir / "recipe.resolved.json", {**recipe, "data": str(state.data), "model": state.base_model})
    results: dict[str, Any] = {"recipe": recipe.get("name") or Path(path).stem, "rows": []}
    labels = stage_labels(recipe)
    rank_timings: dict[str, list[float]] = {}
    for index, (kind, label, options) in enumerate(labels):
        started, waited = time.perf_counter(), ranks.waited()
        logger.info("stage %d/%d: %s", index + 1, len(labels), label)
        with ranks.guard(label):
            rows = run_stage(kind, state, options, label, show_progress, redo_changed)
        state.timings[label] = round(time.perf_counter() - started, 1)
        if ranks.active():   # per rank: seconds in the stage, of which waiting for the other ranks
            mine = {"s": state.timings[label], "waiting_s": round(ranks.waited() - waited, 1)}
            rank_timings[label] = ranks.gather(mine, label)
            logger.info("%s: per rank %s", label, rank_timings[label])
        if rows:
            results["rows"].extend(rows)
    results["timings_s"] = state.timings
    if rank_timings:
        results["rank_timings_s"] = rank_timings
    results["command"] = f"pretrieve run {path}"
    if ranks.is_main():
        write_results(out_dir, results, recipe)
    ranks.barrier("write the results")
    return results


def write_results(out_dir: Path, results: Mapping[str, Any], recipe: Mapping[str, Any]) -> None:
    """``results.json`` and ``results.md``, as artefacts made from the recipe's settings and its run files."""
    import json

    settings = {"recipe": {key: value for key, value in recipe.items()
                           if key not in ("out", "data_root", "dist_timeout_minutes")}}
    inputs = results_inputs(out_dir, results)
    with artifacts.write_file(out_dir / "results.json", "results", settings, inputs) as tmp:
        tmp.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    with artifacts.write_file(out_dir / "results.md", "results", settings, inputs) as tmp:
        tmp.write_text(results_markdown(results), encoding="utf-8")


def results_inputs(out_dir: Path, results: Mapping[str, Any]) -> dict[str, Path]:
    """The run files the rows of ``results`` were computed from, by file name (they live in ``out/runs``)."""
    return {Path(row["run"]).name: out_dir / "runs" / Path(row["run"]).name for row in results.get("rows", [])}


def results_are_current(out_dir: str | Path) -> bool:
    """Whether ``out/results.json`` is intact and every run file it was computed from is unchanged (the check a
    harness running many recipes uses before it skips one)."""
    import json

    out_dir = Path(out_dir)
    path = out_dir / "results.json"
    sidecar = artifacts.read_sidecar(path)
    if sidecar is None:
        return False
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return artifacts.is_current(path, sidecar.get("settings"), results_inputs(out_dir, results), kind="results")


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


# ------------------------------------------------------------------------------------------ stages
def _seeded(state: RunState, options: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(options)
    values.setdefault("seed", state.recipe.get("seed", 42))
    return values


def _pretrain_options() -> type:
    from pretrieve.train.run_config import PretrainOptions

    return PretrainOptions


def _check_pretrain(options: dict[str, Any], where: str) -> None:
    from pretrieve.train.run_config import resolve_pretrain_method

    values = dict(options)
    resolve_pretrain_method(values, {}, where=f"{where}.method")
    _placeholder_config("pretrain", values).validate(1)


def _placeholder_config(kind: str, values: Mapping[str, Any]):
    """The stage's run config with placeholder paths (to run its checks before anything exists)."""
    from pretrieve.train.finetuner import FinetuneConfig
    from pretrieve.train.pretrainer import PretrainConfig
    from pretrieve.train.reranker import RerankerConfig

    schema = {"pretrain": PretrainConfig, "finetune": FinetuneConfig, "reranker": RerankerConfig}[kind]
    paths = {"model": "<model>", "out": "<out>", "data": "<data>", "corpus": "<corpus>", "groups": "<groups>"}
    names = {f for f in schema.__dataclass_fields__}
    return schema(**{**{k: v for k, v in paths.items() if k in names}, **{k: v for k, v in values.items()
                                                                            if k in names and v is not None}})


def _check_training(kind: str) -> Callable[[dict[str, Any], str], None]:
    def check(options: dict[str, Any], where: str) -> None:
        config = _placeholder_config(kind, options)
        config.check()
        config.validate(1)
    return check


@stage("pretrain", _pretrain_options(), set_by_recipe={k: v for k, v in RECIPE_SETS.items() if k != "data"},
       check=_check_pretrain)
def stage_pretrain(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.pretrainer import pretrain
    from pretrieve.train.run_config import build_pretrain_config

    out = state.out / label   # a second pretrain stage (pretrain-2) continues from the first's encoder
    values = _seeded(state, options)
    corpus = str(values.get("corpus") or state.data)
    values["corpus"] = str(state.collections.get(corpus, corpus))
    method = values.pop("method", "bow")
    flags = {**values, "model": state.init_model, "out": str(out), "show_progress": show_progress}
    config = build_pretrain_config({}, flags, {"method": method}, resume=True)
    state.pretrained = str(pretrain(config))   # skipped when finished with the same settings


def _finetune_options() -> type:
    from pretrieve.train.finetuner import FinetuneConfig

    return FinetuneConfig


@stage("finetune", _finetune_options(), set_by_recipe=RECIPE_SETS, check=_check_training("finetune"))
def stage_finetune(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.finetuner import build_finetune_config, finetune

    values = {**state.recipe.get("finetune", {}), **_seeded(state, options)}
    stage_no = int(values.setdefault("stage", len(state.retrievers) + 1))
    if stage_no in (2, 3) and "groups" not in values:
        key = "mined" if stage_no == 2 else "teacher"
        if key not in state.groups:
            producer = "mine" if stage_no == 2 else "teacher"
            raise ConfigError(f"{label}: stage {stage_no} needs the '{producer}' stage earlier in the recipe")
        values["groups"] = state.groups[key]
    flags = {**values, "model": state.init_model, "data": str(state.data), "out": str(state.out / label),
             "show_progress": show_progress}
    config = build_finetune_config({}, flags, resume=True)
    state.retrievers[label] = str(finetune(config))


@dataclass
class MineOptions:
    """Options of the ``mine`` stage (:func:`pretrieve.retrieval.mining.mine_negatives`)."""

    depth: int = 200
    split: str = "train"
    batch_size: int = 64
    max_length: int | None = None
    query_max_length: int | None = None
    device: str = "auto"
    precision: str = "auto"       # auto: bf16 only where the hardware has it natively, else fp32
    factory: str = "Flat"         # a FAISS index factory string for dense vectors; Flat: exact
    bf16: bool = False            # deprecated spelling of precision: bf16


@stage("mine", MineOptions)
def stage_mine(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.retrieval.mining import mine_negatives

    retriever = state.latest_retriever
    if retriever is None:
        raise ConfigError("mine: needs a fine-tuned retriever earlier in the recipe (a 'finetune' stage)")
    values = dict(options)
    split = values.pop("split", "train")
    out = state.out / label / "groups.jsonl"   # mine-2 (CDMAE: stage-2 negatives for stage 3) beside mine
    outputs.check_writable(out, directory=False)
    outputs.remove_leftovers(out.parent, depth=0)
    path = mine_negatives(retriever, state.data, split, out, cache_dir=_embedding_cache(state, retriever),
                          show_progress=show_progress, **values)
    state.groups["mined"] = str(path)


def _reranker_options() -> type:
    from pretrieve.train.reranker import RerankerConfig

    return RerankerConfig


@stage("reranker", _reranker_options(), set_by_recipe={k: v for k, v in RECIPE_SETS.items() if k != "model"},
       check=_check_training("reranker"))
def stage_reranker(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.train.reranker import build_reranker_config, train_reranker

    if "mined" not in state.groups and "groups" not in options:
        raise ConfigError("reranker: needs mined groups (a 'mine' stage earlier) or a 'groups' option")
    values = _seeded(state, options)
    values.setdefault("groups", state.groups.get("mined"))
    values.setdefault("model", state.base_model)
    flags = {**values, "data": str(state.data), "out": str(state.out / "reranker"), "show_progress": show_progress}
    state.reranker = str(train_reranker(build_reranker_config({}, flags, resume=True)))


@dataclass
class TeacherOptions:
    """Options of the ``teacher`` stage (:func:`pretrieve.retrieval.rerank.teacher_groups`)."""

    max_negatives: int | None = None
    batch_size: int = 64
    max_len: int | None = None
    device: str = "auto"
    precision: str = "auto"


@stage("teacher", TeacherOptions)
def stage_teacher(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    from pretrieve.retrieval.rerank import teacher_groups

    if state.reranker is None or "mined" not in state.groups:
        raise ConfigError("teacher: needs a 'reranker' stage and mined groups earlier in the recipe")
    out = state.out / "teacher" / "groups.jsonl"
    outputs.remove_leftovers(out.parent, depth=0)
    state.groups["teacher"] = str(teacher_groups(state.reranker, state.data, state.groups["mined"], out,
                                                 show_progress=show_progress, **options))


def _embedding_cache(state: RunState, model_dir: str, collection: Path | None = None) -> Path:
    """One corpus-embedding cache per (model, collection): mining and evaluation share it."""
    collection = collection or state.data
    return state.out / "embeddings" / f"{Path(model_dir).parent.name}__{collection.name}"


@dataclass
class EvaluateOptions:
    """Options of the ``evaluate`` stage."""

    collections: list[str] | None = None     # default: the recipe's data; "name:split" picks a split
    split: str = "test"
    depth: int = 1000
    bm25: bool = False
    zero_shot: bool = False
    rerank_depth: int | None = None
    rerank: str | None = None
    modes: list[str] | str | None = None
    precision: str = "auto"       # of the encoders: auto, fp32, bf16, fp16, int8
    batch_size: int = 64          # texts per forward pass when encoding
    final: str | None = None      # the row to use: paired t-tests against 'compare' and a closing paragraph
    compare: list[str] = field(default_factory=list)


def _check_evaluate(options: dict[str, Any], where: str) -> None:
    _search_modes(options.get("modes"))
    if int(options.get("depth", 1000)) < 1 or (options.get("rerank_depth") is not None and options["rerank_depth"] < 1):
        raise ConfigError("depth and rerank_depth must be >= 1")


@stage("evaluate", EvaluateOptions, check=_check_evaluate)
def stage_evaluate(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> list[dict]:
    from pretrieve.data import BeirCollection, read_run
    from pretrieve.evaluation import evaluate

    _check_final_options(state, options)
    default_split = options.get("split", "test")
    depth = int(options.get("depth", 1000))
    modes = _search_modes(options.get("modes"))
    encoding = {key: options[key] for key in ("precision", "batch_size") if key in options}
    collections = [_collection_and_split(c, default_split, state)
                   for c in options.get("collections") or [state.recipe["data"]]]
    retrievers = dict(state.retrievers)
    if options.get("zero_shot", False):
        retrievers = {"zero-shot": state.base_model, **retrievers}
    if not retrievers:
        raise ConfigError("evaluate: no retriever to evaluate (add 'finetune' stages or zero_shot: true)")
    rows = []
    runs_dir = state.out / "runs"
    outputs.remove_leftovers(runs_dir, depth=0)
    for collection_path, split in collections:
        collection = BeirCollection(collection_path)
        qrels = collection.load_qrels(split)
        if options.get("bm25", False):
            run_path = _bm25_run(state, collection, split, depth)
            rows.append(_row("bm25", _run_tag(collection_path, split), run_path, evaluate(qrels, read_run(run_path), RESULT_MEASURES)))
        for name, model_dir in retrievers.items():
            for row_label, mode in _labelled_modes(name, model_dir, modes):
                run_path = _retriever_run(state, name, model_dir, collection, split, depth, row_label, mode,
                                          show_progress, encoding)
                rows.append(_row(row_label, _run_tag(collection_path, split), run_path,
                                 evaluate(qrels, read_run(run_path), RESULT_MEASURES)))
        rerank_depth = options.get("rerank_depth")
        if rerank_depth and state.reranker is not None and state.retrievers:
            name = _reranked_retriever(state, options.get("rerank"))
            _retriever_run(state, name, state.retrievers[name], collection, split, depth, name, None, show_progress,
                           encoding)
            rows.append(_rerank_row(state, name, collection_path, split, int(rerank_depth), runs_dir, qrels,
                                    show_progress))
        rows.extend(_fusion_rows(state, collection, split, depth, qrels, show_progress))
        _mark_final(rows, options, _run_tag(collection_path, split), qrels)
    return rows


def _search_modes(value: Any) -> list[str] | None:
    """The evaluate stage's ``modes`` option: None, or a list of sparse/hybrid search modes."""
    from pretrieve.retrieval.index.sparse import SEARCH_MODES

    if value is None:
        return None
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or any(mode not in SEARCH_MODES for mode in values):
        raise ConfigError(f"evaluate: 'modes' must be a non-empty list of {', '.join(SEARCH_MODES)}, got {value!r}")
    return list(dict.fromkeys(values))


def _labelled_modes(name: str, model_dir: str, modes: list[str] | None) -> list[tuple[str, str | None]]:
    """``[(row label, search mode)]``: one row per mode (``finetune-s1-sparse``) for a model fine-tuned with the
    sparse/hybrid representation when ``modes`` is given, else one row searched as trained."""
    from pretrieve.retrieval.load import retriever_kind

    if modes and retriever_kind(model_dir) in ("sparse", "hybrid"):
        return [(f"{name}-{mode}", mode) for mode in modes]
    return [(name, None)]


def _run_file_inputs(collection, split: str, model: str | None = None) -> tuple[dict[str, Path], dict[str, str]]:
    """What a run file is computed from, for its sidecar: the retriever (its weights, by content; a hub model by
    name), the corpus, the queries and the split's qrels (which select the queries)."""
    from pretrieve.train.run import run_inputs as split_inputs

    return split_inputs(model=model, corpus=collection.corpus_path, queries=collection.queries_path,
                        qrels=collection.qrels_path(split))


def _current_run(run_path: Path, settings: Mapping[str, Any], inputs: Mapping[str, Path]) -> bool:
    status = artifacts.check(run_path, settings, inputs, kind="run")
    if status.exists and not status.current:
        logger.info("searching again: %s", status.reason)
    return status.current


def _bm25_run(state: RunState, collection, split: str, depth: int) -> Path:
    """``runs/bm25__<collection>[:split].trec``, searched now unless current (the streamed BM25 path,
    :func:`pretrieve.retrieval.bm25.bm25_run_file`: one memory-mapped index per collection in ``bm25-index/``,
    queries split by rank)."""
    from pretrieve.retrieval.bm25 import bm25_run_file, bm25_run_record

    run_path = state.out / "runs" / f"bm25__{_run_tag(collection.root, split)}.trec"
    settings, inputs = bm25_run_record(collection, split, depth)
    if not ranks.broadcast(_current_run(run_path, settings, inputs), f"check {run_path.name}"):
        bm25_run_file(collection, split, run_path, k=depth, index_dir=state.out / "bm25-index" / collection.root.name)
    return run_path


def _retriever_run(state: RunState, name: str, model_dir: str, collection, split: str, depth: int, label: str,
                   mode: str | None, show_progress: bool, encoding: Mapping[str, Any] | None = None) -> Path:
    """``runs/<label>__<collection>[:split].trec``, searched now unless current: made by these weights (by content)
    from this corpus, queries and split, to this depth, in this search mode and precision, and intact (one corpus
    index per retriever, shared with mining). ``encoding``: the evaluate stage's ``precision`` / ``batch_size``.
    Under several ranks each encodes a slice of the corpus (merged into one index) and searches a slice of the
    queries (merged into the run file)."""
    from pretrieve.data import write_run
    from pretrieve.retrieval.batches import resolve_precision
    from pretrieve.retrieval.load import load_retriever, resolve_device
    from pretrieve.retrieval.search import encode_corpus, query_block_size, search

    encoding = dict(encoding or {})
    precision = resolve_precision(encoding.get("precision", "auto"), resolve_device("auto"))
    collection_name = collection.root.name   # the corpus: one index per collection, whatever the split
    run_path = state.out / "runs" / f"{label}__{_run_tag(collection.root, split)}.trec"
    inputs, named = _run_file_inputs(collection, split, model_dir)
    settings = {"split": split, "depth": depth, "mode": mode, "precision": precision, **named}
    if not ranks.broadcast(_current_run(run_path, settings, inputs), f"check {run_path.name}"):
        batch_size = int(encoding.get("batch_size", 64))
        retriever = load_retriever(model_dir, precision=precision)
        from pretrieve.data.arrow import built_once

        index = encode_corpus(retriever, built_once(collection.corpus_dataset), state.out / "embeddings" /
                              f"{name}__{collection_name}", batch_size=batch_size, show_progress=show_progress)
        queries = list(collection.load_queries(split).items())

        def write_part(start: int, end: int, paths: list[Path]) -> None:
            run = search(retriever, dict(queries[start:end]), index, k=depth, mode=mode, batch_size=batch_size,
                         show_progress=show_progress)
            write_run(run, paths[0], tag=label)

        ranks.split_files([(run_path, "run", settings, inputs)], len(queries), write_part, f"search {label}",
                          unit=query_block_size(retriever, depth))
    return run_path


def _run_tag(collection: Path, split: str) -> str:
    """How runs and result rows name a collection: its directory name, ``name:split`` for a split other than test
    (MS MARCO dev and TREC DL 2019 are two splits of one collection)."""
    return collection.name if split == "test" else f"{collection.name}:{split}"


def _collection_and_split(entry: str, default_split: str, state: RunState) -> tuple[Path, str]:
    """``"scifact"`` → (path, default split); ``"msmarco:dev"`` → (path, "dev")."""
    name, split = _split_collection(str(entry))
    path = state.collections.get(name) or resolve_collection_path(name, state.recipe)
    return path, split or default_split


def _reranked_retriever(state: RunState, requested: str | None) -> str:
    """The evaluate stage's ``rerank`` option: which retriever's run the reranker re-orders (default: the
    latest, e.g. ``finetune-s3``; ``finetune-s2`` re-ranks the run the teacher scores were computed on)."""
    if requested is None:
        return list(state.retrievers)[-1]
    if requested not in state.retrievers:
        raise ConfigError(f"evaluate: rerank: no retriever named {requested!r} "
                          f"(known: {', '.join(state.retrievers)})")
    return requested


def _rerank_row(state: RunState, name: str, collection_path: Path, split: str, depth: int, runs_dir: Path, qrels,
                show_progress: bool) -> dict:
    from pretrieve.data import read_run
    from pretrieve.evaluation import evaluate
    from pretrieve.retrieval.rerank import rerank_run_file

    source = runs_dir / f"{name}__{_run_tag(collection_path, split)}.trec"
    out = runs_dir / f"{name}+rerank@{depth}__{_run_tag(collection_path, split)}.trec"
    rerank_run_file(state.reranker, collection_path, split, source, out, depth=depth, show_progress=show_progress)
    return _row(f"{name}+rerank@{depth}", _run_tag(collection_path, split), out,
                evaluate(qrels, read_run(out), RESULT_MEASURES))


# -------------------------------------------------------------------------------------------- fusion
@dataclass
class FuseOptions:
    """Options of the ``fuse`` stage (:func:`stage_fuse`)."""

    runs: list[str] = field(default_factory=list)   # two or more: bm25, zero-shot, finetune-sN, finetune-sN+rerank@K
    name: str | None = None        # default: fuse-<run>+<run>...
    method: str = "rrf"            # rrf | wsum | auto (auto: rrf or wsum and its normalisation, chosen on train queries)
    norm: str | None = None        # wsum: minmax | zscore
    weights: list[float] | None = None   # wsum: convex weights; none: fitted on the training queries
    k: int = 60                    # rrf's k
    depth: int = 1000
    fit_split: str = "train"       # never test
    step: float = 0.05             # weight grid step when fitting
    measure: str = "nDCG@10"       # what the fit maximises


@stage("fuse", FuseOptions)
def stage_fuse(state: RunState, options: dict[str, Any], label: str, show_progress: bool) -> None:
    """A fused retriever: ``runs`` (``bm25``, ``zero-shot``, fine-tuned retrievers such as ``finetune-s2``, or
    ``finetune-s2+rerank@100``) combined by ``method`` rrf | wsum | auto (:mod:`pretrieve.retrieval.fusion`).

    ``wsum`` / ``auto`` without explicit ``weights`` fit the weights (``auto``: also rrf vs wsum and the
    normalisation) on the training collection's ``fit_split`` (default ``train``) queries: every component
    searches those queries (``runs/<component>.<split>__<collection>.trec``) and only that split's qrels are
    read; the fitted fusion is stored in ``fuse/<name>/fusion.json`` (reused while its inputs are unchanged).
    The ``evaluate`` stage then adds one row per fusion and evaluated collection — zero-shot collections use the
    fusion fitted on the training collection.
    """
    from pretrieve.retrieval import fusion

    components = options.get("runs")
    if not isinstance(components, list) or len(components) < 2 or len(set(map(str, components))) != len(components):
        raise ConfigError(f"{label}: 'runs' must list two or more distinct retrievers to fuse, got {components!r}")
    components = [str(c) for c in components]
    for component in components:
        _component_source(state, component, label)
    name = str(options.get("name") or "fuse-" + "+".join(components))
    if not name or any(ch.isspace() or ch in "/\\" for ch in name) or name in state.fusions:
        raise ConfigError(f"{label}: fusion name {name!r} must be new, non-empty, without spaces or slashes")
    method = str(options.get("method", "rrf"))
    norm = options.get("norm")
    weights = options.get("weights")
    depth = int(options.get("depth", fusion.DEFAULT_DEPTH))
    k = int(options.get("k", fusion.RRF_K))
    if weights is not None or method == "rrf":
        if method == "auto":
            raise ConfigError(f"{label}: method 'auto' chooses on training queries; it takes no 'weights'")
        spec = fusion.FusionSpec(method, norm or ("minmax" if method == "wsum" else None),
                                 tuple(float(w) for w in weights) if weights is not None else None, k=k,
                                 depth=depth).check(len(components))
    else:
        spec = _fit_fusion(state, name, components, fusion.parse_candidates(method, norm),
                           str(options.get("fit_split", "train")), str(options.get("measure", fusion.DEFAULT_FIT_MEASURE)),
                           float(options.get("step", fusion.DEFAULT_STEP)), depth, k, show_progress)
    state.fusions[name] = {"runs": components, "spec": spec}
    logger.info("%s: %s = %s of %s", label, name, spec.describe(), ", ".join(components))


def _component_source(state: RunState, component: str, where: str) -> tuple[str, str | None, int | None]:
    """``(kind, model, rerank depth)`` of a fusion component: ``("bm25", None, None)``, ``("dense", model dir,
    None)`` or ``("rerank", retriever label, depth)``."""
    if component == "bm25":
        return "bm25", None, None
    if component == "zero-shot":
        return "dense", state.base_model, None
    if component in state.retrievers:
        return "dense", state.retrievers[component], None
    base, sep, depth = component.partition("+rerank@")
    if sep and base in state.retrievers and depth.isdigit() and int(depth) > 0:
        if state.reranker is None:
            raise ConfigError(f"{where}: {component} needs a 'reranker' stage earlier in the recipe")
        return "rerank", base, int(depth)
    known = ["bm25", "zero-shot", *state.retrievers] + [f"{r}+rerank@N" for r in state.retrievers if state.reranker]
    raise ConfigError(f"{where}: unknown retriever {component!r} to fuse (known so far: {', '.join(known)})")


def _component_run(state: RunState, component: str, collection, split: str, depth: int, run_name: str,
                   show_progress: bool) -> Path:
    """``runs/<run_name>__<collection>.trec``: the component's run on the split's judged queries (searched unless
    it exists; dense retrievers share one corpus-embedding cache per collection with the evaluate stage)."""
    kind, model, rerank_depth = _component_source(state, component, "fuse")
    path = state.out / "runs" / f"{run_name}__{_run_tag(collection.root, split)}.trec"
    if kind == "bm25":
        return _bm25_run(state, collection, split, depth)
    if kind == "dense":
        return _retriever_run(state, component, model, collection, split, depth, run_name, None, show_progress)
    from pretrieve.retrieval.rerank import rerank_run_file

    source_name = model if run_name == component else f"{model}.{split}"
    source = _component_run(state, model, collection, split, depth, source_name, show_progress)
    return rerank_run_file(state.reranker, collection.root, split, source, path, depth=rerank_depth,
                           show_progress=show_progress)


def _fit_fusion(state: RunState, name: str, components: list[str], candidates, split: str, measure: str,
                step: float, depth: int, k: int, show_progress: bool):
    """The fusion fitted on the training collection's ``split`` queries (never ``test``), stored and reused."""
    import json

    from pretrieve.data import BeirCollection
    from pretrieve.retrieval import fusion

    if split == fusion.TEST_SPLIT:
        raise ConfigError(f"fuse: {name}: fit_split must be a training split, never '{split}'")
    collection = BeirCollection(state.data)
    qrels_path = collection.qrels_path(split)          # that split's qrels only; checked before any search
    train_runs = {f"run:{c}": _component_run(state, c, collection, split, depth, f"{c}.{split}", show_progress)
                  for c in components}
    path = state.out / "fuse" / name / "fusion.json"
    settings = {"runs": components, "candidates": [list(c) for c in candidates], "split": split, "measure": measure,
                "step": step, "depth": depth, "k": k}
    inputs = {**train_runs, "qrels": qrels_path}

    def fit() -> None:
        if artifacts.is_current(path, settings, inputs, kind="fusion"):
            return
        spec = fusion.fit_on_split(list(train_runs.values()), collection.root, split, candidates=candidates,
                                   measure=measure, step=step, depth=depth, k=k)
        with artifacts.write_file(path, kind="fusion", settings=settings, inputs=inputs) as tmp:
            tmp.write_text(json.dumps(spec.to_dict(), indent=2), encoding="utf-8")

    ranks.once(f"fit the fusion {name}", fit)
    return fusion.FusionSpec.from_dict(json.loads(path.read_text(encoding="utf-8")))


def _fusion_rows(state: RunState, collection, split: str, depth: int, qrels, show_progress: bool) -> list[dict]:
    """One row per fusion of the recipe on this collection: ``runs/<fusion>__<collection>.trec``."""
    from pretrieve.data import read_run
    from pretrieve.evaluation import evaluate
    from pretrieve.retrieval import fusion

    rows = []
    for name, entry in state.fusions.items():
        spec = entry["spec"]
        sources = [_component_run(state, c, collection, split, depth, c, show_progress) for c in entry["runs"]]
        path = state.out / "runs" / f"{name}__{_run_tag(collection.root, split)}.trec"
        inputs = {f"run{i + 1}": p for i, p in enumerate(sources)}
        fitted = state.out / "fuse" / name / "fusion.json"
        fit_inputs = {"fusion": fitted} if spec.fit and fitted.exists() else {}

        def fuse() -> None:   # rank 0 decides and writes: the others wait for the file
            if not artifacts.is_current(path, fusion.fusion_settings(spec), {**inputs, **fit_inputs}, kind="run"):
                fusion.write_fused_run(sources, path, spec, tag=name, fit_inputs=fit_inputs)

        ranks.once(f"fuse {name}", fuse)
        row = _row(name, _run_tag(collection.root, split), path, evaluate(qrels, read_run(path), RESULT_MEASURES))
        row["fusion"] = {"runs": entry["runs"], "method": spec.describe(), "fit": fusion.fit_record(spec)}
        rows.append(row)
    return rows


def _check_final_options(state: RunState, options: Mapping[str, Any]) -> None:
    """The evaluate stage's ``final`` (the row to use) and ``compare`` (rows it is tested against) name rows."""
    final, compare = options.get("final"), options.get("compare", [])
    if final is None:
        if compare:
            raise ConfigError("evaluate: 'compare' needs 'final' (the row the comparisons are made for)")
        return
    if not isinstance(compare, list):
        raise ConfigError(f"evaluate: 'compare' must be a list of row names, got {compare!r}")
    known = (["bm25"] if options.get("bm25") else []) + (["zero-shot"] if options.get("zero_shot") else []) \
        + list(state.retrievers) + list(state.fusions)
    for name in [final, *compare]:
        if name not in known and "+rerank@" not in str(name):
            raise ConfigError(f"evaluate: no row named {name!r} (rows: {', '.join(known)})")


def _mark_final(rows: list[dict], options: Mapping[str, Any], collection: str, qrels) -> None:
    """Paired two-sided t-tests (nDCG@10, per query) of the ``final`` row against each ``compare`` row of this
    collection, stored in the final row as ``vs``."""
    from pretrieve.data import read_run
    from pretrieve.evaluation import compare, evaluate

    final = options.get("final")
    if final is None:
        return
    here = {row["retriever"]: row for row in rows if row["collection"] == collection}
    if final not in here:
        raise ConfigError(f"evaluate: final row {final!r} was not evaluated on {collection}")
    measure = RESULT_MEASURES[0]
    result = evaluate(qrels, read_run(here[final]["run"]), [measure])
    here[final]["final"] = True
    here[final]["vs"] = {}
    for name in options.get("compare", []):
        if name not in here:
            raise ConfigError(f"evaluate: comparison row {name!r} was not evaluated on {collection}")
        baseline = evaluate(qrels, read_run(here[name]["run"]), [measure])
        here[final]["vs"][name] = {"measure": measure, **compare(baseline, result, measure, test="ttest").to_dict()}


def _row(retriever: str, collection: str, run_path: Path, result) -> dict:
    return {"retriever": retriever, "collection": collection, "run": str(run_path),
            **{measure: round(result.aggregate[measure], 4) for measure in RESULT_MEASURES}}


def results_markdown(results: Mapping[str, Any]) -> str:
    lines = [f"# Results: {results['recipe']}", "",
             "| retriever | collection | " + " | ".join(RESULT_MEASURES) + " |",
             "|---|---|" + "---|" * len(RESULT_MEASURES)]
    for row in results["rows"]:
        lines.append(f"| {row['retriever']} | {row['collection']} | "
                     + " | ".join(f"{row[m]:.4f}" for m in RESULT_MEASURES) + " |")
    lines += ["", "Runs are in `runs/`; re-evaluate any of them with `pretrieve evaluate --data DIR --split test RUN`.", ""]
    timings = results.get("timings_s") or {}
    per_rank = results.get("rank_timings_s") or {}
    if timings and per_rank:
        world = len(next(iter(per_rank.values())))
        lines += ["## Stage times", "", "| stage | " + " | ".join(f"rank {r}: s (waiting)" for r in range(world))
                  + " |", "|---|" + "---|" * world]
        lines += [f"| {label} | " + " | ".join(f"{t['s']:.1f} ({t['waiting_s']:.1f})" for t in per_rank.get(label, []))
                  + " |" for label in timings]
        totals = [(sum(v[r]["s"] for v in per_rank.values()), sum(v[r]["waiting_s"] for v in per_rank.values()))
                  for r in range(world)]
        lines += ["| total | " + " | ".join(f"{s:.1f} ({w:.1f})" for s, w in totals) + " |", "",
                  "Waiting: seconds a rank spent at barriers for the others (work done once, or a slower rank). "
                  "A stage found finished and current takes about 0 s (it was not run again).", ""]
    elif timings:
        lines += ["## Stage times", "", "| stage | seconds |", "|---|---|"]
        lines += [f"| {label} | {seconds:.1f} |" for label, seconds in timings.items()]
        lines += [f"| total | {sum(timings.values()):.1f} |", "",
                  "A stage found finished and current takes about 0 s (it was not run again).", ""]
    lines += _fusion_lines(results) + _final_lines(results)
    return "\n".join(lines)


def _fusion_lines(results: Mapping[str, Any]) -> list[str]:
    """What each fused row is (components, fusion, and where its weights were fitted)."""
    fused = {row["retriever"]: row["fusion"] for row in results["rows"] if row.get("fusion")}
    lines = []
    for name, info in fused.items():
        fit = info.get("fit")
        how = (f", weights fitted on the {fit['queries']} `{fit['split']}` queries of the training collection "
               f"({fit['measure']} {fit['score']:.4f} there)" if fit else "")
        lines.append(f"- `{name}`: {info['method']} of {' + '.join(f'`{r}`' for r in info['runs'])}{how}")
    return (["Fused rows:", "", *lines, ""]) if lines else []


def _final_lines(results: Mapping[str, Any]) -> list[str]:
    """The paired t-tests of the final row and one closing paragraph: which row to use, what each stage added, and
    the command behind every number."""
    finals = [row for row in results["rows"] if row.get("final")]
    if not finals:
        return []
    measure = RESULT_MEASURES[0]
    names = list(dict.fromkeys(name for row in finals for name in row["vs"]))
    final = finals[0]["retriever"]
    lines = [f"Paired two-sided t-tests of `{final}` against each baseline ({measure} per query; "
             "Δ = final − baseline, ▲/▼: p ≤ 0.05):", "",
             "| collection | " + " | ".join(f"vs `{n}`: Δ (p)" for n in names) + " |", "|---|" + "---|" * len(names)]
    for row in finals:
        cells = []
        for name in names:
            test = row["vs"].get(name)
            if not test:
                cells.append("—")
                continue
            mark = ("▲" if test["mean_difference"] > 0 else "▼") if test.get("significant") else ""
            p = test.get("p_value")
            cells.append(f"{test['mean_difference']:+.4f}{mark} (p = {p:.2g})" if p is not None else "—")
        lines.append(f"| {row['collection']} | " + " | ".join(cells) + " |")
    scores = {(row["retriever"], row["collection"]): row[measure] for row in results["rows"]}
    collections = [row["collection"] for row in finals]
    fused = {row["retriever"] for row in results["rows"] if row.get("fusion")}
    trained = [name for name in dict.fromkeys(row["retriever"] for row in results["rows"])
               if name not in ("bm25", "zero-shot", final) and name not in fused and "+rerank@" not in name]
    chain = (["zero-shot"] if any(name == "zero-shot" for name, _ in scores) else []) + trained + [final]

    def differences(better: str, worse: str) -> str:
        return " / ".join(f"{scores[(better, c)] - scores[(worse, c)]:+.4f}" for c in collections
                          if (better, c) in scores and (worse, c) in scores)

    steps = [f"`{a}` → `{b}` {differences(b, a)}" for a, b in zip(chain, chain[1:])]
    text = (f"**Which row to use: `{final}`** — {measure} "
            + " / ".join(f"{scores[(final, c)]:.4f}" for c in collections) + f" on {' / '.join(collections)}; "
            + "; ".join(f"{differences(final, n)} over `{n}`" for n in names) + ". "
            + (f"What each stage added ({measure}, {' / '.join(collections)}): " + "; ".join(steps) + ". "
               if steps else "")
            + f"Every number here comes from the runs in `runs/`; `{results.get('command', 'pretrieve run RECIPE')}` "
            "reproduces all of them (finished stages are skipped; delete the output directory to recompute).")
    return lines + ["", text, ""]

