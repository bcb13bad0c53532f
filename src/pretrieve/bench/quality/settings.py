"""Settings of ``pretrieve bench quality``: budgets, defaults per base, the checked :class:`QualityBenchSettings`.

What a comparison is (arms, seeds, folds, the fine-tuning selection grid, the contrasts and the statistics) is
described in :mod:`pretrieve.bench.quality`; this module only holds and checks the values.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from pretrieve.bench.quality.arms import (DEFAULT_METHODS, FIRST_SEED, arm_method, arm_seeds, check_arms,
                                          parse_contrasts)
from pretrieve.bench.quality.recipes import collection_path, needs_pairs
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import load_config_file
from pretrieve.models import resolve_model
from pretrieve.options import validate
from pretrieve.precision import check_precision
from pretrieve.recipe.fixtures import tiny_model, write_fixture_collection
from pretrieve.retrieval.load import ModelFiles, read_sentence_transformers_config
from pretrieve.train.finetuner import FinetuneConfig
from pretrieve.train.settings import METHOD_OVERRIDES, PretrainOptions

logger = logging.getLogger(__name__)

PRIMARY = "nDCG@10"
RETRIEVER = "finetune-s1"                  # the run name the recipe gives the stage-1 retriever
DEFAULT_FOLDS = ("train:test",)
COVERAGE_FILE = "coverage.json"
#: The one precision of a whole comparison (pre-training, fine-tuning, every encode, probes): fp32 runs on every
#: machine kind (a CPU without native bf16 computes bf16 several times slower, and ``auto`` would resolve
#: differently from machine to machine); recorded in ``tier.json`` and every record, and a record made at another
#: precision does not count.
DEFAULT_PRECISION = "fp32"


#: Pre-training budget of the full comparison: every method gets the same steps × batch × max length.
#: Sized so that 11 methods × 1 seed (pre-training + stage 1 + evaluation on SciFact and Cranfield) with
#: splade-tiny take ≈ 2.7 h of CPU time on our 2-core machine (docs/results.md: the measurement).
DEFAULT_PRETRAIN: dict[str, Any] = {"max_steps": 100, "batch_size": 32, "max_len": 144, "lr": 3e-4,
                                    "warmup_ratio": 0.1, "save_every": 50, "log_every": 10}
#: Stage-1 fine-tuning of the full comparison: configs/scifact-cpu.yaml's settings.
DEFAULT_FINETUNE: dict[str, Any] = {"pooling": "cls", "similarity": "dot", "num_negatives": 7, "batch_size": 32,
                                    "query_max_len": 32, "passage_max_len": 256, "lr": 1e-4, "epochs": 2,
                                    "save_every": 20}
#: A retrieval-ready sentence-transformers base (all-MiniLM-L6-v2: ``--base minilm``) is fine-tuned with its own
#: pooling and normalisation (filled in by :func:`defaults_for_base`), cosine temperature 0.05 and the small lr such
#: checkpoints are fine-tuned with; it is pre-trained further at a lower lr than a model whose [CLS] is untrained,
#: so that a few hundred passages adapt it to the corpus without erasing what it already does. Sized so that 7
#: methods × 2 seeds with MiniLM (fp32) take ≈ 2 h on a quiet 2-core CPU (docs/results.md: the measurement).
RETRIEVER_PRETRAIN: dict[str, Any] = {"max_steps": 40, "batch_size": 16, "max_len": 144, "lr": 5e-5,
                                      "warmup_ratio": 0.1, "save_every": 20, "log_every": 10}
RETRIEVER_FINETUNE: dict[str, Any] = {"normalize": True, "similarity": "dot", "temperature": 0.05,
                                      "num_negatives": 3, "batch_size": 16, "query_max_len": 32,
                                      "passage_max_len": 144, "lr": 2e-5, "max_steps": 30, "warmup_ratio": 0.1,
                                      "save_every": 10}
#: ``--quick``: a first look in minutes with splade-tiny.
QUICK_PRETRAIN: dict[str, Any] = {"max_steps": 30, "batch_size": 16, "max_len": 128, "lr": 3e-4,
                                  "warmup_ratio": 0.1, "save_every": 0, "log_every": 10}
QUICK_FINETUNE: dict[str, Any] = {"pooling": "cls", "similarity": "dot", "num_negatives": 3, "batch_size": 16,
                                  "query_max_len": 32, "passage_max_len": 128, "lr": 1e-4, "max_steps": 30,
                                  "save_every": 0}


def defaults_for_base(base: str, quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(pretrain, finetune)`` defaults for ``base``: a checkpoint that declares sentence-transformers pooling
    (a retrieval-ready encoder such as all-MiniLM-L6-v2) gets :data:`RETRIEVER_PRETRAIN` / :data:`RETRIEVER_FINETUNE`
    with its own pooling; any other (the papers' setting, splade-tiny) the [CLS] defaults. ``quick`` keeps the quick
    budget but still the retrieval-ready representation."""
    try:
        st = read_sentence_transformers_config(ModelFiles(resolve_model(base)))
    except (InputError, ConfigError, OSError):
        st = None
    pooling = "+".join(st.pooling) if st is not None and st.pooling else None
    if pooling not in ("cls", "mean"):
        return (dict(QUICK_PRETRAIN if quick else DEFAULT_PRETRAIN), dict(QUICK_FINETUNE if quick else DEFAULT_FINETUNE))
    finetune = {**RETRIEVER_FINETUNE, "pooling": pooling, "normalize": bool(st.normalize)}
    pretrain = dict(RETRIEVER_PRETRAIN)
    if quick:
        pretrain.update(max_steps=QUICK_PRETRAIN["max_steps"], max_len=QUICK_PRETRAIN["max_len"], save_every=0)
        finetune.update(max_steps=QUICK_FINETUNE["max_steps"], passage_max_len=QUICK_FINETUNE["passage_max_len"],
                        save_every=0)
    return pretrain, finetune


# ------------------------------------------------------------------------------------------ settings
@dataclass
class QualityBenchSettings:
    """Everything one comparison needs; :meth:`resolved` checks it and makes the paths absolute.

    ``methods`` are the arms (:mod:`pretrieve.bench.quality.arms`); ``pretrain_data`` one or several text sources
    pre-trained on as one corpus (default: the training collection); ``folds`` ``"a:b"`` = fine-tune on split ``a``
    of the training collection, evaluate on its split ``b``; ``dev_queries`` judged queries of the ``train`` split
    held out of every fold (selection only); ``grid`` (``{"lr": [...], "epochs": [...]}``, empty: no selection) is
    searched on dev with ``select_arm``'s first seed and first fold; ``grid_grow`` (same keys, values above the
    grid's) is where the grid grows, once, when the point chosen lies on its upper edge (pre-registration amendment
    9: :func:`pretrieve.bench.quality.summary.selection`); ``contrasts`` the declared Holm family."""

    base: str
    train: str
    out: str
    methods: tuple[str, ...] = DEFAULT_METHODS
    pretrain_data: tuple[str, ...] | str | None = None    # default: the training collection
    eval: tuple[str, ...] = ()              # default: the training collection
    seeds: tuple[int, ...] = (FIRST_SEED,)
    pretrain: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PRETRAIN))
    finetune: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_FINETUNE))
    finetune_per_method: dict[str, dict[str, Any]] = field(default_factory=dict)
    split: str = "test"
    depth: int = 1000
    coverage_texts: int = 300
    alpha: float = 0.05
    folds: tuple[str, ...] = DEFAULT_FOLDS
    dev_queries: int = 100
    dev_seed: int = 0
    grid: dict[str, tuple] = field(default_factory=dict)
    grid_grow: dict[str, tuple] = field(default_factory=dict)   # the convergence rule's values past the grid
    select_arm: str = "mlm"
    contrasts: tuple[str, ...] = ()
    margin: float = 0.02
    bootstrap: int = 10_000
    probe_steps: tuple[int, ...] = ()
    precision: str = DEFAULT_PRECISION
    records: str | None = None              # the records directory (default: <out>/records)
    threads: int | None = None              # torch threads of each cell (default: the cores / jobs)
    retry_failed: bool = False
    keep_checkpoints: bool = False
    show_progress: bool = False
    pretrained_from: str | None = None      # another comparison's scratch out: its identical pre-trainings are reused

    def resolved(self) -> "QualityBenchSettings":
        """Validated copy with collections as absolute paths (raises :class:`ConfigError` / :class:`InputError`)."""
        methods = tuple(self.methods)
        check_arms(methods)
        seeds = tuple(int(seed) for seed in self.seeds)
        if not seeds or len(set(seeds)) != len(seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {list(seeds)}")
        train = str(_collection(self.train))
        sources = (self.pretrain_data,) if isinstance(self.pretrain_data, str) else tuple(self.pretrain_data or ())
        pretrain_data = tuple(dict.fromkeys(str(_text_source(s)) for s in (sources or (train,))))
        eval_paths = tuple(str(_collection(name)) for name in (self.eval or (train,)))
        if train not in eval_paths:   # the training collection is always the in-domain one (pooled over folds)
            eval_paths = (train, *eval_paths)
        names = [Path(path).name for path in eval_paths]
        if len(set(names)) != len(names):
            raise ConfigError(f"evaluation collections need distinct directory names (runs are named after them), "
                              f"got {', '.join(names)}")
        pretrain = {**self.pretrain}
        _check_keys(pretrain, _pretrain_fields(), "pretrain settings")
        for key in ("method", "corpus", "model", "out", "seed", "cache_dir"):
            if key in pretrain:
                raise ConfigError(f"pretrain settings: '{key}' is set by the harness")
        finetune = {**self.finetune}
        per_method = {str(m): dict(v) for m, v in (self.finetune_per_method or {}).items()}
        for where, values in [("finetune settings", finetune)] + [(f"finetune settings of '{m}'", v)
                                                                  for m, v in per_method.items()]:
            _check_keys(values, _finetune_fields(), where)
            for key in ("model", "data", "out", "stage", "groups", "seed", "split"):
                if key in values:
                    raise ConfigError(f"{where}: '{key}' is set by the harness")
        unknown = sorted(set(per_method) - set(methods))
        if unknown:
            logger.info("finetune overrides for methods not compared: %s", ", ".join(unknown))
        if self.coverage_texts < 1 or self.depth < 100:
            raise ConfigError("coverage_texts must be ≥ 1 and depth ≥ 100 (R@100 needs 100 results)")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha must be between 0 and 1, got {self.alpha}")
        if not 0.0 <= self.margin < 1.0 or self.bootstrap < 100:
            raise ConfigError(f"margin must be in [0, 1) and bootstrap ≥ 100, got {self.margin}, {self.bootstrap}")
        folds = check_folds(self.folds)
        pairs = [arm for arm in methods if needs_pairs(arm_method(arm)[0])]
        if pairs and any(parse_fold(fold)[1] == "train" for fold in folds):
            raise ConfigError(f"{', '.join(pairs)} pre-train(s) on the train split's judged pairs: no fold may "
                              "evaluate on the train split (drop test:train, or the method)")
        if self.dev_queries < 0:
            raise ConfigError(f"dev_queries must be ≥ 0, got {self.dev_queries}")
        grid = check_grid(self.grid)
        grid_grow = check_grid(self.grid_grow, "grid growth")
        for key, values in grid_grow.items():
            if key not in grid or min(values) <= max(grid[key]):
                raise ConfigError(f"grid growth: {key} values must lie above the grid's own ({key}: "
                                  f"{list(grid.get(key, ()))}), got {list(values)}")
        if grid and (self.select_arm not in methods or self.dev_queries < 1):
            raise ConfigError(f"the fine-tuning grid is searched on dev with the arm '{self.select_arm}': add it to "
                              "the methods and keep dev_queries ≥ 1")

        if self.precision == "auto":
            raise ConfigError("a comparison runs at one fixed precision (fp32, bf16 or fp16), not auto: auto resolves "
                              "differently from machine to machine")
        check_precision(self.precision, training=True)
        for where, values in (("pretrain settings", pretrain), ("finetune settings", finetune)):
            if values.get("precision") not in (None, self.precision):
                raise ConfigError(f"{where}: precision is the comparison's own ({self.precision}); set --precision")
        probe_steps = tuple(sorted({int(step) for step in self.probe_steps}))
        if probe_steps and (probe_steps[0] < 1 or probe_steps[-1] > int(pretrain.get("max_steps") or 0)):
            raise ConfigError(f"probe steps must lie in [1, max_steps = {pretrain.get('max_steps')}], "
                              f"got {list(probe_steps)}")
        return replace(self, methods=methods, seeds=seeds, train=train, pretrain_data=pretrain_data,
                       eval=eval_paths, pretrain=pretrain, finetune=finetune, finetune_per_method=per_method,
                       folds=folds, grid=grid, grid_grow=grid_grow, contrasts=parse_contrasts(self.contrasts, methods),
                       probe_steps=probe_steps, out=str(Path(self.out).expanduser().absolute()),
                       records=str(Path(self.records or Path(self.out) / "records").expanduser().absolute()))

    def fingerprint(self) -> dict[str, Any]:
        """The settings that determine an arm × seed's results, with paths (made portable by
        :func:`pretrieve.bench.quality.records.portable_fingerprint`). Arms, seeds, contrasts and the dev grid may
        grow on a rerun; a cell records the protocol it was fine-tuned with instead; the precision is recorded
        beside the fingerprint."""
        return {"base": self.base, "pretrain_data": list(self.pretrain_data), "train": self.train,
                "eval": list(self.eval), "pretrain": self.pretrain, "finetune": self.finetune,
                "finetune_per_method": self.finetune_per_method, "split": self.split, "depth": self.depth,
                "coverage_texts": self.coverage_texts, "folds": list(self.folds), "dev_queries": self.dev_queries,
                "dev_seed": self.dev_seed, "select_arm": self.select_arm if self.grid else None,
                "probe_steps": list(self.probe_steps)}

    def growing(self) -> dict[str, Any]:
        """What ``tier.json`` keeps beside the fingerprint: what may grow, and the statistics' settings."""
        return {"methods": list(self.methods), "seeds": list(self.seeds), "contrasts": list(self.contrasts),
                "grid": {k: list(v) for k, v in self.grid.items()},
                "grid_grow": {k: list(v) for k, v in self.grid_grow.items()}, "select_arm": self.select_arm,
                "alpha": self.alpha, "margin": self.margin, "bootstrap": self.bootstrap}

    def finetune_for(self, method: str, chosen: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The fine-tuning settings of an arm (:func:`merged_finetune`)."""
        return merged_finetune(self.finetune, chosen, self.finetune_per_method, method)

    def arm_seeds(self, arm: str) -> list[int]:
        return arm_seeds(arm, self.seeds)


def merged_finetune(common: Mapping[str, Any], chosen: Mapping[str, Any] | None,
                    per_method: Mapping[str, Mapping[str, Any]] | None, method: str) -> dict[str, Any]:
    """The fine-tuning settings of an arm whose method is ``method``: the common ones, then the protocol chosen on
    dev, then the method's own overrides."""
    return {**common, **(chosen or {}), **(per_method or {}).get(method, {})}


SMOKE_METHODS = ("none", "mlm", "bow", "mlm-aa")
SMOKE_PRETRAIN: dict[str, Any] = {"max_steps": 2, "batch_size": 4, "max_len": 32, "lr": 1e-3, "warmup_ratio": 0.0,
                                  "save_every": 0, "log_every": 1}
SMOKE_FINETUNE: dict[str, Any] = {"pooling": "cls", "similarity": "dot", "max_steps": 2, "batch_size": 4,
                                  "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32, "bm25_depth": 20,
                                  "lr": 5e-4, "warmup_ratio": 0.0, "save_every": 0, "log_every": 1}


def smoke_settings(settings: QualityBenchSettings, explicit_methods: bool = True) -> QualityBenchSettings:
    """``--smoke``: the same comparison (arms, folds, dev, grid, contrasts, statistics) on a tiny random BERT and
    a synthetic collection (:mod:`pretrieve.recipe.fixtures`, written once under ``<out>/smoke-fixtures``), with
    budgets of a few steps, so that the whole harness runs end to end in well under a minute. The numbers mean
    nothing. Without ``explicit_methods`` the arms are :data:`SMOKE_METHODS`; method overrides of ``--pretrain``
    (``bottleneck``, objectives, maskers) are kept."""
    fixtures = Path(settings.out).expanduser().absolute() / "smoke-fixtures"
    collection = fixtures / "smoke"
    if not (collection / "corpus.jsonl").exists():
        write_fixture_collection(collection, ["train", "test"])
    model = tiny_model("bert", fixtures / "models")
    epochs = 2      # the most a smoke point trains; its growth trains one more
    grid = {key: tuple(dict.fromkeys(min(v, epochs) for v in values)) if key == "epochs" else tuple(values)
            for key, values in (settings.grid or {}).items()}
    grow = {key: (epochs + 1,) if key == "epochs" else tuple(values)
            for key, values in (settings.grid_grow or {}).items()}
    methods = tuple(settings.methods) if explicit_methods else SMOKE_METHODS
    return replace(settings, base=model, train=str(collection), eval=(), pretrain_data=None, methods=methods,
                   pretrain={**SMOKE_PRETRAIN, **{key: value for key, value in settings.pretrain.items()
                                                  if key in METHOD_OVERRIDES}},   # budgets shrink, methods stay
                   finetune=dict(SMOKE_FINETUNE), finetune_per_method={},
                   depth=100, coverage_texts=8, dev_queries=min(settings.dev_queries, 4), grid=grid,
                   grid_grow=grow,
                   bootstrap=min(settings.bootstrap, 500),
                   probe_steps=tuple(sorted({1, 2})) if settings.probe_steps else ())


def parse_fold(text: str) -> tuple[str, str]:
    """``"train:test"`` → ``("train", "test")``: fine-tune on the first split, evaluate on the second."""
    train, sep, test = str(text).partition(":")
    if not sep or not train or not test or train == test or ":" in test or "dev" in (train, test):
        raise ConfigError(f"fold '{text}': expected TRAIN_SPLIT:TEST_SPLIT of two different splits other than dev, "
                          "e.g. train:test")
    return train, test


def check_folds(folds: Sequence[str]) -> tuple[str, ...]:
    folds = tuple(str(f) for f in folds)
    if not folds or len(set(folds)) != len(folds):
        raise ConfigError(f"give distinct folds, at least one, got {list(folds)}")
    tests = [parse_fold(f)[1] for f in folds]
    if len(set(tests)) != len(tests):
        raise ConfigError(f"two folds evaluate on the same split ({', '.join(folds)}): a query would be pooled twice")
    return folds


def seed_dir(out: str | Path, arm: str, seed: int) -> Path:
    """The directory of an arm × seed: its pre-training recipe, ``coverage.json`` and one directory per fold."""
    return Path(out) / arm / f"seed{seed}"


def run_key(arm: str, seed: int) -> str:
    return f"{arm}/seed{seed}"


def fold_dir(fold: str) -> str:
    """The directory of a fold's fine-tuning and runs inside an arm × seed: ``train:test`` → ``train-test``."""
    return "-".join(parse_fold(fold))


def check_grid(grid: Mapping[str, Sequence] | None, what: str = "fine-tuning grid") -> dict[str, tuple]:
    """``{"lr": (...), "epochs": (...)}`` checked (only those keys; non-empty; positive); empty: no selection."""
    grid = {str(k): tuple(v) for k, v in (grid or {}).items() if v}
    unknown = sorted(set(grid) - {"lr", "epochs"})
    if unknown:
        raise ConfigError(f"{what}: unknown key(s) {', '.join(unknown)} (lr, epochs)")
    for key, values in grid.items():
        if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0
               for v in values):
            raise ConfigError(f"{what}: {key} values must be positive numbers, got {list(values)}")
    return grid


def grid_points(grid: Mapping[str, Sequence]) -> list[dict[str, Any]]:
    """Every combination of the grid, lr-major, in the given order (ties in selection go to the first)."""
    points: list[dict[str, Any]] = [{}]
    for key in ("lr", "epochs"):
        if key in grid:
            points = [{**point, key: value} for point in points for value in grid[key]]
    if any("epochs" in point for point in points):
        points = [{**point, "max_steps": 0} if "epochs" in point else point for point in points]
    return points


def point_name(point: Mapping[str, Any]) -> str:
    """A grid point's name (its records file and directory): ``{"lr": 3e-4, "epochs": 10}`` → ``lr0.0003-epochs10``."""
    return "-".join(f"{key}{point[key]:g}" for key in ("lr", "epochs") if key in point) or "default"


def parse_overrides(text: str | None, where: str) -> dict[str, Any]:
    """``--pretrain`` / ``--finetune``: a YAML/JSON file, or inline ``key=value,key=value`` (values read as JSON,
    else YAML)."""
    if not text:
        return {}
    path = Path(text).expanduser()
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file():
        return load_config_file(path)
    values: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where}: expected a YAML/JSON file or key=value pairs, got '{part}'")
        try:
            values[key.strip()] = json.loads(value.strip())   # numbers as JSON reads them (YAML 1.1: "2e-5" is text)
        except json.JSONDecodeError:
            values[key.strip()] = yaml.safe_load(value.strip())
    return values


def split_finetune_overrides(values: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, dict]]:
    """A ``--finetune`` mapping → (settings for every method, per-method settings under ``methods:``)."""
    values = dict(values)
    per_method = values.pop("methods", None) or {}
    if not isinstance(per_method, Mapping) or not all(isinstance(v, Mapping) for v in per_method.values()):
        raise ConfigError(f"{where}: 'methods' must map method names to settings")
    return values, {str(k): dict(v) for k, v in per_method.items()}


def _pretrain_fields() -> type:
    return PretrainOptions


def _finetune_fields() -> type:
    return FinetuneConfig


def _check_keys(values: dict[str, Any], schema: type, where: str) -> None:
    """Refuse unknown keys (with a suggestion) and coerce the values in place (pretrieve.options)."""
    values.update(validate(schema, values, where))


def _collection(name_or_path: str) -> Path:
    return collection_path(str(name_or_path))


def _text_source(name_or_path: str) -> Path:
    path = Path(str(name_or_path)).expanduser()
    return path.resolve() if path.exists() else _collection(name_or_path)


