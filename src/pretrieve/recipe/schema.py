"""What a recipe may say: the top-level options, the stage kinds and their options, and the checks run on the whole
recipe before its first stage.

A stage kind is registered by its module under :mod:`pretrieve.recipe.stages` with :func:`stage`: the function that
runs it, the dataclass that declares its options, and what it ``needs`` from the stages before it and ``gives`` to
the ones after it (``mine`` needs a fine-tuned retriever and gives mined groups). The order of the stages is checked
from these declarations alone (:func:`check_stage_order`), so a stage's preconditions are written once, next to it.
The same names key what the stages made at run time (:class:`pretrieve.recipe.runner.RunState`: ``state.give("mined",
label, path)``, ``state.latest("mined")``). A stage also declares, in its own module, how ``--smoke`` shrinks its
options (``smoke``, :class:`pretrieve.recipe.smoke.SmokeKit`), the collections and splits it reads (``reads``), the
result rows it adds to the evaluate stages after it (``rows``), which options name a retriever or fusion
(``name_options``), the top-level key of the options every stage of its kind shares (``shared``), how its stages are
labelled (``label``) and whether it trains or mines on the training queries (``trains``): nothing outside its module
names its kind.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pretrieve import ranks
from pretrieve.errors import ConfigError, InputError
from pretrieve.options import join_path, validate
from pretrieve.io_utils import load_config_file
from pretrieve.recipe.dev import validate_dev
from pretrieve.recipe.results import validate_expected
from pretrieve.train.settings import LoopConfig, check_trackers, default_of

#: ``needs(options, recipe, given, where)``: raises a :class:`ConfigError` (naming ``where``) unless what the stage
#: needs was given by the stages before it (``given``: what each gave → the labels of the stages that gave it).
Needs = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, list[str]], str], None]


#: ``smoke(options, kit)``: the stage's options shrunk for ``--smoke`` (:class:`pretrieve.recipe.smoke.SmokeKit`).
Smoke = Callable[[dict[str, Any], Any], dict[str, Any]]
#: ``reads(options, recipe)``: ``[(collection as the recipe names it, split or None)]`` the stage reads (None: the
#: passages only); every collection is found before the first stage, and ``--smoke`` slices these splits.
Reads = Callable[[Mapping[str, Any], Mapping[str, Any]], list[tuple[str, str | None]]]
#: ``label(options, recipe, count)``: the stage's label, ``count`` being its place among the stages of its kind (1, 2,
#: …); without one, ``<kind>`` for the first and ``<kind>-<count>`` for the others.
Label = Callable[[Mapping[str, Any], Mapping[str, Any], int], str]


@dataclass(frozen=True)
class Stage:
    """A recipe stage kind: the function that runs it and the dataclass that declares its options.

    ``set_by_recipe`` names declared options the recipe sets itself (refused in the stage, with the reason);
    ``check(options, where)`` (optional) validates more than types, before the first stage runs; ``needs`` checks
    that the stages before it gave what it reads, and ``gives`` names what it adds (one name or several; see
    :func:`check_stage_order`) — the names that key :class:`~pretrieve.recipe.runner.RunState`'s products.
    ``smoke`` shrinks its options for ``--smoke`` (none: kept as they are), ``reads`` names the collections it reads,
    ``rows(options)`` the result rows it adds to every evaluate stage after it (a fusion's name), ``name_options`` the
    options that name a retriever or fusion (:func:`check_names`), ``shared`` the top-level recipe key whose
    options every stage of the kind inherits (``finetune``), ``label`` its stages' labels (:func:`stage_labels`) and
    ``trains`` whether it trains or mines on the queries of a split of the training collection (its ``split``
    option, else the shared one, else ``train``; :func:`pretrieve.recipe.rows.trained_splits`).
    """

    run: Callable[..., Any]
    options: type
    set_by_recipe: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[dict[str, Any], str], None] | None = None
    needs: Needs | None = None
    gives: str | tuple[str, ...] | None = None
    smoke: Smoke | None = None
    reads: Reads | None = None
    rows: Callable[[Mapping[str, Any]], list[str]] | None = None
    name_options: tuple[str, ...] = ()
    shared: str | None = None
    label: Label | None = None
    trains: bool = False

    @property
    def products(self) -> tuple[str, ...]:
        """What the stage gives, as a tuple."""
        return (self.gives,) if isinstance(self.gives, str) else tuple(self.gives or ())


STAGES: dict[str, Stage] = {}


def stage(kind: str, options: type, set_by_recipe: Mapping[str, str] | None = None,
          check: Callable[[dict[str, Any], str], None] | None = None, needs: Needs | None = None,
          gives: str | tuple[str, ...] | None = None, smoke: Smoke | None = None, reads: Reads | None = None,
          rows: Callable[[Mapping[str, Any]], list[str]] | None = None, name_options: tuple[str, ...] = (),
          shared: str | None = None, label: Label | None = None, trains: bool = False):
    """Register the decorated function as the recipe stage ``kind`` with its options schema and declarations
    (:class:`Stage`)."""
    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        STAGES[kind] = Stage(function, options, dict(set_by_recipe or {}), check, needs, gives, smoke, reads, rows,
                             tuple(name_options), shared, label, trains)
        return function
    return register


#: Options of a training stage that the recipe itself sets.
RECIPE_SETS = {"model": "the recipe's 'model' (or the pre-trained checkpoint) is used",
               "data": "the recipe's 'data' is used", "out": "each stage writes under the recipe's 'out'",
               "resume": "the recipe resumes its stages itself", "overwrite": "the recipe resumes its stages itself",
               "show_progress": "use --progress/--no-progress",
               "report_to": "the recipe's top-level 'report_to' names the trackers of every training stage"}


@dataclass
class RecipeOptions:
    """The top level of a recipe; besides these, the options shared by every stage of a kind, under the key its
    stage declares (:class:`Stage` ``shared``: ``finetune``)."""

    out: str = ""
    model: str = ""
    data: str = ""
    stages: list[Any] = field(default_factory=list)
    name: str | None = None
    data_root: str | None = None
    seed: int = default_of(LoopConfig, "seed")   # every training stage's, unless the stage sets its own
    dist_timeout_minutes: float | None = None   # under torchrun: the longest a rank waits (pretrieve.ranks: 60)
    dev: dict[str, Any] | None = None   # held-out training queries (pretrieve.recipe.dev): {seed}, {queries, seed}, {split}
    expected: list[Any] | None = None   # the paper's numbers (pretrieve.recipe.results.ExpectedNumbers), per row
    report_to: str | list[str] | None = None   # every training stage's trackers (train.settings.check_trackers)


def placeholder_config(schema: type, values: Mapping[str, Any]):
    """A training stage's run config (``schema``) with placeholder paths (to run its checks before anything
    exists)."""
    paths = {"model": "<model>", "out": "<out>", "data": "<data>", "corpus": "<corpus>", "groups": "<groups>"}
    names = {f for f in schema.__dataclass_fields__}
    return schema(**{**{k: v for k, v in paths.items() if k in names}, **{k: v for k, v in values.items()
                                                                            if k in names and v is not None}})


def check_training(schema: type) -> Callable[[dict[str, Any], str], None]:
    """The ``check`` of a training stage: its run config's own checks, on placeholder paths."""
    def check(options: dict[str, Any], where: str) -> None:
        config = placeholder_config(schema, options)
        config.check()
        config.validate(1)
    return check


# ------------------------------------------------------------------------------------------ loading
#: The recipes shipped with pretrieve: the checkout's ``configs/``, packaged in the wheel as ``pretrieve/configs``.
SHIPPED_RECIPES = Path(__file__).resolve().parent.parent / "configs"


def find_recipe(path_or_name: str | Path) -> Path:
    """The recipe file ``path_or_name``; a bare name that is no file here (``bow-msmarco``) names a shipped recipe
    (:data:`SHIPPED_RECIPES`)."""
    path = Path(path_or_name)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    shipped = SHIPPED_RECIPES / f"{path}.yaml"
    if not shipped.is_file():
        known = ", ".join(sorted(p.stem for p in SHIPPED_RECIPES.glob("*.yaml")))
        raise InputError(f"no such recipe file, nor a shipped recipe of that name (shipped: {known})", path=path)
    return shipped


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read and validate a whole recipe, a file or a shipped recipe's name (:func:`find_recipe`; see
    :func:`validate_recipe`); returns it with coerced option values."""
    path = find_recipe(path)
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
    shared = [spec for spec in STAGES.values() if spec.shared is not None]
    values = validate(RecipeOptions, recipe, where, extra=[spec.shared for spec in shared])
    if values.get("dist_timeout_minutes") is not None:
        try:
            ranks.check_timeout(values["dist_timeout_minutes"], "dist_timeout_minutes")
        except ConfigError as exc:
            raise InputError(str(exc), path=where, field="dist_timeout_minutes") from None
    if values.get("report_to") is not None:
        values["report_to"] = check_trackers(values["report_to"], join_path(where, "report_to"))
    stages = values["stages"]
    if not isinstance(stages, list) or not stages:
        raise InputError("'stages' must be a non-empty list", path=where, field="stages")
    for spec in shared:   # the options every stage of a kind shares, checked against its schema
        values[spec.shared] = validate(spec.options, values.get(spec.shared) or {}, join_path(where, spec.shared),
                                       set_elsewhere=spec.set_by_recipe)
    if "dev" in values:
        values["dev"] = validate_dev(values["dev"], values, where)
    if values.get("expected") is not None:
        values["expected"] = validate_expected(values["expected"], where)
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
            merged = {**values[spec.shared], **options} if spec.shared is not None else options
            try:
                spec.check(merged, at)
            except ConfigError as exc:
                message = str(exc)
                raise ConfigError(message if message.startswith(at) else f"{at}: {message}") from None
        check_names(kind, options, at)
        validated.append({kind: options})
    values["stages"] = validated
    check_stage_order(values, where)
    return values


def check_names(kind: str, options: Mapping[str, Any], at: str) -> None:
    """:class:`ConfigError` naming the option when one of the stage's ``name_options`` (options that name a retriever
    or fusion of the recipe: a run file and folders under ``out`` are named after it; single names, never paths) is
    empty, has spaces or slashes, or is ``.`` / ``..`` — checked with the whole recipe, before any stage runs."""
    for key in STAGES[kind].name_options:
        value = options.get(key)
        for index, name in (enumerate(value) if isinstance(value, list) else [(None, value)]):
            if name is None and index is None:
                continue
            text = str(name)
            if not text or text in (".", "..") or any(ch.isspace() or ch in "/\\" for ch in text):
                where = f"{at}.{key}" + (f"[{index}]" if index is not None else "")
                raise ConfigError(f"{where}: {text!r} is not a name (non-empty, without spaces or slashes): "
                                  "retrievers and fusions are named, not given as paths")


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
    """``[(kind, label, options)]`` of the (validated) recipe's stages: the label a stage kind declares
    (:class:`Stage` ``label``: a fine-tuning stage's is ``finetune-s<stage>``), else ``<kind>``, and a repeated
    stage's ``<kind>-<n>`` (``pretrain-2``: a second pre-training phase)."""
    labels, counts = [], {}
    for index, entry in enumerate(recipe["stages"]):
        kind, options = stage_entry(entry, index)
        counts[kind] = counts.get(kind, 0) + 1
        spec = STAGES.get(kind)
        label = (spec.label(options, recipe, counts[kind]) if spec is not None and spec.label is not None
                 else kind if counts[kind] == 1 else f"{kind}-{counts[kind]}")   # pretrain, pretrain-2: phases
        labels.append((kind, label, options))
    return labels


def check_stage_order(recipe: Mapping[str, Any], where: str = "recipe") -> None:
    """Each stage's inputs come from a stage before it: each stage's ``needs`` is checked against what the stages
    before it ``give`` (mined groups, a reranker, a retriever to re-rank)."""
    given: dict[str, list[str]] = {}
    for index, (kind, label, options) in enumerate(stage_labels(recipe)):
        spec = STAGES[kind]
        if spec.needs is not None:
            spec.needs(options, recipe, given, f"{join_path(join_path(where, 'stages'), index)}.{kind}")
        for product in spec.products:
            given.setdefault(product, []).append(label)


def recipe_collections(recipe: Mapping[str, Any]) -> list[str]:
    """Every collection a (validated) recipe names: its ``data`` and what each stage ``reads`` (a pre-training
    ``corpus`` that is neither a file nor a hub dataset, each ``evaluate`` collection without its ``:split``)."""
    names = [str(recipe["data"])]
    for kind, _, options in stage_labels(recipe):
        reads = STAGES[kind].reads
        names.extend(str(name) for name, _ in (reads(options, recipe) if reads is not None else []))
    return list(dict.fromkeys(names))


def split_collection(entry: str) -> tuple[str, str]:
    """``"scifact"`` → ("scifact", ""); ``"msmarco:dev"`` → ("msmarco", "dev"); a path with a colon stays whole."""
    if ":" in entry and not Path(entry).exists():
        name, _, split = entry.rpartition(":")
        return name, split
    return entry, ""
