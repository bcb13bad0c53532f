"""Retrieval quality of every pre-training method at an equal budget (``pretrieve bench quality``, issue #8).

Drop your Decoder's (Ma et al. 2024) Tables 5/6 compare pre-training methods by what a retriever initialised from each checkpoint
reaches after the same fine-tuning. :func:`run_quality_bench` reproduces that protocol on one machine:

1. for each method × seed, a recipe (:mod:`pretrieve.pipeline`) with ``out = <out>/<method>/seed<k>``:
   ``pretrain`` on the pre-training corpus (same steps, batch, max length, lr for every method; ``none``
   skips it and fine-tunes the base model) → ``finetune`` stage 1 on the training collection's ``train``
   split (BM25 negatives) → ``evaluate`` on every evaluation collection (the first is the in-domain one,
   the others zero-shot). The recipe is written to ``recipe.json`` beside its outputs, so
   ``pretrieve run <out>/<method>/seed<k>/recipe.json`` repeats any cell;
2. the input-token coverage ratio (Drop your Decoder, Ma et al. 2024, Fig. 2/4, :mod:`pretrieve.analysis.coverage`) of the
   pre-trained checkpoint (the base model for ``none``) on a fixed sample — the first ``coverage_texts``
   passages, file order — of the pre-training corpus, truncated to the pre-training max length;
3. a report (:func:`summarize`, :func:`results_markdown`, :func:`plot_results`) computed from the saved TREC
   runs only: ``results.md``, ``results.json`` and ``results.png`` in ``<out>``.

Method specifics:

* ``cotmote`` / ``cotmote-swap`` pre-train on passage–query pairs, not on the corpus: the training split's
  judged (passage, query) pairs, written once to ``<out>/pairs/<train>-train.jsonl`` by
  :func:`pretrieve.data.spans.write_qrels_pairs` (a stand-in for docT5query pseudo-queries, as in
  docs/cotmote.md). ``cotmae`` cuts its anchor/context spans from the pre-training corpus; documents with a
  single span give no example. ``cdmae`` counts its n-gram (PMI) statistics on the pre-training corpus.
  Token and span caches are shared by all runs (``<out>/cache``).
* Fine-tuning is the same for every method: the same BM25 training groups (built once,
  ``<out>/groups/``), the ``finetune`` settings (dense [CLS], dot product by default)
  — DupMAE included, although its paper scores with [CLS] + OT (``representation: dupmae``): an equal
  representation keeps the comparison about the pre-trained weights. A per-method override is possible
  (``finetune_per_method``, the ``methods:`` key of a ``--finetune`` YAML file) and is recorded.

Robustness. Each method × seed runs inside ``try/except Exception``: a failure (an exception, a
diverged loss — the training loop raises :class:`~pretrieve.errors.TrainingDiverged`) is recorded with its error in
``<out>/<method>/status.json`` and ``bench.json`` and reported as a failed row; the other methods go on.
A failed run is not retried on a rerun unless ``retry_failed``. Resuming: a method × seed whose
``results.json`` is current (:func:`pretrieve.pipeline.results_are_current`) is not run again (only its coverage is computed if missing); an interrupted one
resumes through the recipe runner (finished stages skipped, training from its last checkpoint). The
settings that determine the results are stored in ``bench.json`` (written atomically); a rerun with
different settings in the same ``out`` is refused. After a successful run, its training checkpoints
(``*/checkpoints``) are deleted unless ``keep_checkpoints`` (``final/`` models and runs are kept).

Statistics (per measure, per collection; seeds that failed are left out):

* **cell** — the collection-level score (mean over queries, as ``pretrieve evaluate`` computes it from the
  run) of each seed; mean ± sample standard deviation (ddof 1; 0 with one seed) over seeds;
* **avg** — per seed, the mean over collections; then mean ± std over seeds;
* **significance** — two-sided paired t-test (:func:`pretrieve.evaluation.significance.paired_ttest`,
  ``scipy.stats.ttest_rel``) against ``mlm`` (the "further pre-train" baseline) and against ``none``,
  paired by query: each query's score is first averaged over the method's seeds (and over the baseline's
  seeds), then the two per-query vectors are tested. Queries are the judged queries evaluated in either run
  (a query missing from one run scores 0 there), as in :func:`pretrieve.evaluation.significance.paired_scores`;
* **pre-training speed** — wall time of the ``pretrain`` stage (recipe ``timings_s``: tokenisation,
  statistics, training, export; only the last session's time when the stage was resumed) and samples/s of
  training alone, from the trainer's ``logs.jsonl`` (``steps × batch / Σ window seconds``, complete across
  resumes); means over seeds.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import traceback
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from pretrieve import pipeline
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_open, write_json

logger = logging.getLogger(__name__)

NO_PRETRAIN = "none"
BASELINES = ("mlm", NO_PRETRAIN)
DEFAULT_METHODS = ("none", "mlm", "ae", "ar", "retromae", "bow", "dupmae", "cpdae", "cdmae", "cotmae", "cotmote")
MEASURES = pipeline.RESULT_MEASURES        # nDCG@10, MRR@10, R@100
PRIMARY = "nDCG@10"
RETRIEVER = "finetune-s1"                  # the run name the recipe gives the stage-1 retriever
STATE_FILE = "bench.json"
STATUS_FILE = "status.json"
COVERAGE_FILE = "coverage.json"
COVERAGE_KS = (10, 20, 50, 100)
TABLE_COVERAGE_K = 10

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
    from pretrieve.models import resolve_model
    from pretrieve.retrieval.load import ModelFiles, read_sentence_transformers_config

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
    """Everything one comparison needs; :meth:`resolved` checks it and makes the paths absolute."""

    base: str
    train: str
    out: str
    methods: tuple[str, ...] = DEFAULT_METHODS
    pretrain_data: str | None = None        # default: the training collection
    eval: tuple[str, ...] = ()              # default: the training collection
    seeds: tuple[int, ...] = (42,)
    pretrain: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PRETRAIN))
    finetune: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_FINETUNE))
    finetune_per_method: dict[str, dict[str, Any]] = field(default_factory=dict)
    split: str = "test"
    depth: int = 1000
    coverage_texts: int = 300
    alpha: float = 0.05
    retry_failed: bool = False
    keep_checkpoints: bool = False
    show_progress: bool = False

    def resolved(self) -> "QualityBenchSettings":
        """Validated copy with collections as absolute paths (raises :class:`ConfigError` / :class:`InputError`)."""
        methods = tuple(self.methods)
        check_methods(methods)
        seeds = tuple(int(seed) for seed in self.seeds)
        if not seeds or len(set(seeds)) != len(seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {list(seeds)}")
        train = str(_collection(self.train))
        pretrain_data = str(_text_source(self.pretrain_data or train))
        eval_paths = tuple(str(_collection(name)) for name in (self.eval or (train,)))
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
            for key in ("model", "data", "out", "stage", "groups", "seed"):
                if key in values:
                    raise ConfigError(f"{where}: '{key}' is set by the harness")
        unknown = sorted(set(per_method) - set(methods))
        if unknown:
            logger.info("finetune overrides for methods not compared: %s", ", ".join(unknown))
        if self.coverage_texts < 1 or self.depth < 100:
            raise ConfigError("coverage_texts must be ≥ 1 and depth ≥ 100 (R@100 needs 100 results)")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha must be between 0 and 1, got {self.alpha}")
        return replace(self, methods=methods, seeds=seeds, train=train, pretrain_data=pretrain_data,
                       eval=eval_paths, pretrain=pretrain, finetune=finetune, finetune_per_method=per_method,
                       out=str(Path(self.out).expanduser().absolute()))

    def fingerprint(self) -> dict[str, Any]:
        """The settings that determine a method × seed's results (methods and seeds may grow on a rerun)."""
        return {"base": self.base, "pretrain_data": self.pretrain_data, "train": self.train,
                "eval": list(self.eval), "pretrain": self.pretrain, "finetune": self.finetune,
                "finetune_per_method": self.finetune_per_method, "split": self.split, "depth": self.depth,
                "coverage_texts": self.coverage_texts}

    def finetune_for(self, method: str) -> dict[str, Any]:
        return {**self.finetune, **self.finetune_per_method.get(method, {})}


def check_methods(methods: Sequence[str]) -> None:
    from pretrieve.train.method import PRESETS

    if not methods:
        raise ConfigError("give at least one method")
    unknown = [m for m in methods if m != NO_PRETRAIN and m not in PRESETS]
    if unknown:
        raise ConfigError(f"unknown method(s) {', '.join(unknown)}; choose from {NO_PRETRAIN}, "
                          f"{', '.join(PRESETS)}")
    duplicates = sorted({m for m in methods if list(methods).count(m) > 1})
    if duplicates:
        raise ConfigError(f"method(s) {', '.join(duplicates)} listed twice")


def parse_overrides(text: str | None, where: str) -> dict[str, Any]:
    """``--finetune``: a YAML/JSON file, or inline ``key=value,key=value`` (values read as JSON, else YAML)."""
    import yaml

    if not text:
        return {}
    path = Path(text).expanduser()
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file():
        from pretrieve.train.run_config import load_config_file

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
    from pretrieve.train.run_config import PretrainOptions

    return PretrainOptions


def _finetune_fields() -> type:
    from pretrieve.train.finetuner import FinetuneConfig

    return FinetuneConfig


def _check_keys(values: dict[str, Any], schema: type, where: str) -> None:
    """Refuse unknown keys (with a suggestion) and coerce the values in place (pretrieve.options)."""
    from pretrieve.options import validate

    values.update(validate(schema, values, where))


def _collection(name_or_path: str) -> Path:
    return pipeline.resolve_collection_path(str(name_or_path), {}).resolve()


def _text_source(name_or_path: str) -> Path:
    path = Path(str(name_or_path)).expanduser()
    return path.resolve() if path.exists() else _collection(name_or_path)


# --------------------------------------------------------------------------------------------- state
def seed_dir(out: str | Path, method: str, seed: int) -> Path:
    return Path(out) / method / f"seed{seed}"


def run_key(method: str, seed: int) -> str:
    return f"{method}/seed{seed}"


def load_state(out: Path, settings: QualityBenchSettings) -> dict[str, Any]:
    """``bench.json``, created on the first run; a rerun with other result-determining settings is refused."""
    path = out / STATE_FILE
    fingerprint = json.loads(json.dumps(settings.fingerprint(), default=str))
    if path.exists():
        state = json.loads(path.read_text(encoding="utf-8"))
        recorded = state.get("settings", {}).get("fingerprint", {})
        differing = sorted(k for k in set(recorded) | set(fingerprint) if recorded.get(k) != fingerprint.get(k))
        if differing and state.get("runs"):
            raise ConfigError(f"{path} records a comparison with other settings ({', '.join(differing)}); "
                              "use another --out, or the same settings to resume it")
    else:
        state = {"version": 1, "runs": {}}
    methods = list(dict.fromkeys([*state.get("settings", {}).get("methods", []), *settings.methods]))
    seeds = sorted(set(state.get("settings", {}).get("seeds", [])) | set(settings.seeds))
    state["settings"] = {"fingerprint": fingerprint, "methods": methods, "seeds": seeds,
                         "alpha": settings.alpha}
    return state


def save_state(out: Path, state: Mapping[str, Any]) -> None:
    write_json(out / STATE_FILE, state)


def _write_method_status(out: Path, method: str, state: Mapping[str, Any]) -> None:
    prefix = f"{method}/"
    runs = {key[len(prefix):]: value for key, value in state["runs"].items() if key.startswith(prefix)}
    write_json(out / method / STATUS_FILE, {"method": method, "runs": runs})


# -------------------------------------------------------------------------------------------- recipes
def method_recipe(settings: QualityBenchSettings, method: str, seed: int, pairs: Path | None = None,
                  groups: Path | None = None) -> dict:
    """The recipe of one method × seed: [pretrain →] finetune stage 1 (on ``groups``, else BM25 groups built by
    the stage itself) → evaluate."""
    out = Path(settings.out)
    stages: list[dict[str, Any]] = []
    if method != NO_PRETRAIN:
        method_value: Any = method
        if needs_pairs(method):
            if pairs is None:
                raise ConfigError(f"method '{method}' needs the passage–query pairs file")
            method_value = {"base": method, "context": {"pairs": str(pairs)}}
        stages.append({"pretrain": {**settings.pretrain, "method": method_value, "corpus": settings.pretrain_data,
                                    "cache_dir": str(out / "cache")}})
    stages.append({"finetune": {"stage": 1, **({"groups": str(groups)} if groups is not None else {})}})
    stages.append({"evaluate": {"collections": list(settings.eval), "split": settings.split,
                                "depth": settings.depth}})
    return {"name": f"bench-quality-{method}-seed{seed}", "out": str(seed_dir(out, method, seed)),
            "model": settings.base, "data": settings.train, "seed": seed,
            "finetune": settings.finetune_for(method), "stages": stages}


def needs_pairs(method: str) -> bool:
    """Whether the method pre-trains on passage–query pairs (CoT-MoTE) rather than on corpus text."""
    from pretrieve.train.method import PRESETS

    spec = PRESETS.get(method)
    return spec is not None and spec.context is not None and spec.context.kind == "pairs"


def bm25_groups(settings: QualityBenchSettings, method: str) -> Path:
    """Stage-1 training groups (BM25 negatives of the train split), built once and shared by every run."""
    from pretrieve.retrieval.bm25 import bm25_negatives

    depth = int(settings.finetune_for(method).get("bm25_depth", 1000))
    path = Path(settings.out) / "groups" / f"{Path(settings.train).name}-train-bm25-{depth}.jsonl"
    return bm25_negatives(settings.train, "train", path, depth=depth)


def prepare_pairs(settings: QualityBenchSettings) -> Path | None:
    """The training split's (passage, query) pairs for pair-based methods; written once, then reused."""
    if not any(needs_pairs(m) for m in settings.methods):
        return None
    from pretrieve.data import BeirCollection
    from pretrieve.data.spans import write_qrels_pairs

    path = Path(settings.out) / "pairs" / f"{Path(settings.train).name}-train.jsonl"
    if not path.exists():
        count = write_qrels_pairs(BeirCollection(Path(settings.train)), "train", path)
        logger.info("wrote %d passage–query pairs of the training split to %s", count, path)
    return path


# ---------------------------------------------------------------------------------------------- running
def run_quality_bench(settings: QualityBenchSettings,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the comparison and write the report; returns :func:`summarize`'s dict."""
    settings = settings.resolved()
    say = progress or (lambda line: logger.info("%s", line))
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    state = load_state(out, settings)
    save_state(out, state)
    pairs: Path | None = None
    texts: list[str] | None = None
    total = len(settings.methods) * len(settings.seeds)
    index = 0
    for method in settings.methods:
        for seed in settings.seeds:
            index += 1
            key = run_key(method, seed)
            record = state["runs"].get(key, {})
            directory = seed_dir(out, method, seed)
            if record.get("status") == "done" and pipeline.results_are_current(directory) \
                    and (directory / COVERAGE_FILE).exists():
                say(f"[{index}/{total}] {key}: done earlier, skipped")
                continue
            if record.get("status") == "failed" and not settings.retry_failed:
                error = str(record.get("error", "")).splitlines()[0][:160] if record.get("error") else "?"
                say(f"[{index}/{total}] {key}: failed earlier ({error}), skipped (--retry-failed runs it again)")
                continue
            say(f"[{index}/{total}] {key}: running")
            state["runs"][key] = {"status": "running", "started": _now()}
            save_state(out, state)
            started = time.perf_counter()
            try:
                if pairs is None and needs_pairs(method):
                    pairs = prepare_pairs(settings)
                if texts is None:
                    texts = coverage_texts(settings)
                run_one(settings, method, seed, pairs, texts)
                state["runs"][key] = {"status": "done", "started": state["runs"][key]["started"],
                                      "finished": _now(), "wall_s": round(time.perf_counter() - started, 1)}
                say(f"[{index}/{total}] {key}: done in {time.perf_counter() - started:.0f} s")
            except Exception as exc:  # noqa: BLE001 - any failure of one method must not stop the others
                error = f"{type(exc).__name__}: {exc}".strip()
                logger.error("%s failed: %s", key, error)
                state["runs"][key] = {"status": "failed", "started": state["runs"][key]["started"],
                                      "finished": _now(), "wall_s": round(time.perf_counter() - started, 1),
                                      "error": error, "traceback": traceback.format_exc(limit=8)}
                say(f"[{index}/{total}] {key}: FAILED — {error.splitlines()[0][:200]}")
            save_state(out, state)
            _write_method_status(out, method, state)
        if index < total:
            try:   # a partial report while the comparison runs; the final one below is the one that counts
                write_report(out, summarize(out), plot=False)
            except Exception as exc:  # noqa: BLE001
                logger.warning("partial report not written: %s", exc)
    summary = summarize(out)
    write_report(out, summary, plot=True)
    return summary


def run_one(settings: QualityBenchSettings, method: str, seed: int, pairs: Path | None,
            texts: Sequence[str]) -> None:
    """One method × seed: the recipe (unless its ``results.json`` is current), then the coverage of its checkpoint."""
    directory = seed_dir(settings.out, method, seed)
    directory.mkdir(parents=True, exist_ok=True)
    if not pipeline.results_are_current(directory):
        recipe_path = directory / "recipe.json"
        write_json(recipe_path, method_recipe(settings, method, seed, pairs, bm25_groups(settings, method)))
        results = pipeline.run_recipe(recipe_path, show_progress=settings.show_progress)
        bad = [row for row in results.get("rows", []) if any(not math.isfinite(float(row[m])) for m in MEASURES)]
        if bad:
            (directory / "results.json").unlink()   # not a finished run: a rerun must not take it as one
            raise FloatingPointError(f"non-finite scores for {bad[0]['collection']}: {bad[0]}")
    if not (directory / COVERAGE_FILE).exists():
        model = str(directory / "pretrain" / "final") if method != NO_PRETRAIN else settings.base
        report = checkpoint_coverage(model, texts, max_len=int(settings.pretrain.get("max_len", 144)))
        write_json(directory / COVERAGE_FILE, report)
    if not settings.keep_checkpoints:
        for checkpoints in directory.glob("*/checkpoints"):
            shutil.rmtree(checkpoints, ignore_errors=True)


def coverage_texts(settings: QualityBenchSettings) -> list[str]:
    """The fixed coverage sample: the first ``coverage_texts`` passages of the pre-training corpus."""
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    texts = list(islice(iter_pretrain_texts(settings.pretrain_data), settings.coverage_texts))
    if not texts:
        raise InputError("the pre-training corpus has no passages", path=settings.pretrain_data)
    return texts


def checkpoint_coverage(model: str, texts: Sequence[str], max_len: int, ks: Sequence[int] = COVERAGE_KS) -> dict:
    """:func:`pretrieve.analysis.coverage.token_coverage` of one checkpoint (what ``pretrieve analyze coverage``
    computes), without the per-text examples."""
    from transformers import AutoTokenizer

    from pretrieve.analysis.coverage import load_encoder, token_coverage
    from pretrieve.models import resolve_model

    path = resolve_model(model)
    encoder, created = load_encoder(path)
    report = token_coverage(encoder, AutoTokenizer.from_pretrained(path), list(texts), ks=ks, max_len=max_len,
                            num_examples=0, name=str(model), head_created=created)
    return report.to_dict()


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


# -------------------------------------------------------------------------------------------- statistics
def summarize(out: str | Path) -> dict[str, Any]:
    """Everything the report shows, recomputed from ``bench.json`` and the saved runs of ``out``."""
    from pretrieve.data.beir import BeirCollection, load_qrels
    from pretrieve.evaluation import RunEvaluator

    out = Path(out)
    path = out / STATE_FILE
    if not path.exists():
        raise InputError("no comparison here (bench.json missing)", path=path)
    state = json.loads(path.read_text(encoding="utf-8"))
    fingerprint = state["settings"]["fingerprint"]
    methods, seeds = state["settings"]["methods"], state["settings"]["seeds"]
    alpha = float(state["settings"].get("alpha", 0.05))
    collections = [Path(c) for c in fingerprint["eval"]]
    names = [c.name for c in collections]
    qrels = {c.name: BeirCollection(c).qrels_path(fingerprint["split"]) for c in collections}
    evaluators = {name: RunEvaluator(load_qrels(path), list(MEASURES)) for name, path in qrels.items()}

    results: dict[str, dict[int, dict[str, Any]]] = {}   # method → seed → collection → EvalResult
    entries: dict[str, dict[str, Any]] = {}
    for method in methods:
        done, failed, pending = [], {}, []
        for seed in seeds:
            record = state["runs"].get(run_key(method, seed), {})
            if record.get("status") == "done" and (seed_dir(out, method, seed) / "results.json").exists():
                done.append(seed)   # (a finished run whose directory was removed is pending: a rerun redoes it)
            elif record.get("status") == "failed":
                failed[seed] = record.get("error", "unknown error")
            else:
                pending.append(seed)
        runs = {seed: {name: seed_dir(out, method, seed) / "runs" / f"{RETRIEVER}__{name}.trec" for name in names}
                for seed in done}
        results[method] = {seed: {name: _evaluated(evaluators[name], p, qrels[name]) for name, p in files.items()}
                           for seed, files in runs.items()}
        status = "done" if done and not failed and not pending else "failed" if failed and not done else \
            "partial" if done else "pending"
        entries[method] = {"status": status, "seeds": done, "failed": {str(s): e for s, e in failed.items()},
                           "pending": pending,
                           "runs": {str(s): {n: str(p) for n, p in files.items()} for s, files in runs.items()},
                           "scores": {}, "coverage": _coverage_summary(out, method, done),
                           "pretrain": _pretrain_summary(out, method, done)}

    for method, entry in entries.items():
        if not entry["seeds"]:
            continue
        for measure in MEASURES:
            cells: dict[str, Any] = {}
            for name in names:
                per_seed = {seed: results[method][seed][name].aggregate[measure] for seed in entry["seeds"]}
                cell = _mean_std(per_seed)
                cell["vs"] = {baseline: _significance(results, method, baseline, name, measure, alpha)
                              for baseline in BASELINES if baseline != method and results.get(baseline)}
                cells[name] = cell
            per_seed_avg = {seed: float(np.mean([cells[n]["per_seed"][str(seed)] for n in names]))
                            for seed in entry["seeds"]}
            cells["avg"] = _mean_std(per_seed_avg)
            entry["scores"][measure] = cells
    return {"settings": {**fingerprint, "methods": methods, "seeds": seeds, "alpha": alpha},
            "collections": names, "in_domain": names[0], "measures": list(MEASURES), "retriever": RETRIEVER,
            "methods": entries}


_EVALUATED: dict[tuple, Any] = {}


def _evaluated(evaluator, run_path: Path, qrels_path: Path):
    """The run's :class:`EvalResult`, memoised per (run file, qrels file) with their sizes and mtimes, so that
    the partial reports written while a comparison runs do not re-read every earlier run."""
    from pretrieve.data.trec import read_run

    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in (run_path, qrels_path))
    if key not in _EVALUATED:
        _EVALUATED[key] = evaluator(read_run(run_path), name=str(run_path))
    return _EVALUATED[key]


def _mean_std(per_seed: Mapping[int, float]) -> dict[str, Any]:
    values = np.array(list(per_seed.values()), dtype=np.float64)
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return {"mean": float(values.mean()), "std": std, "n": len(values),
            "per_seed": {str(seed): float(value) for seed, value in per_seed.items()}}


def seed_averaged_per_query(results_by_seed: Iterable[Any], measure: str) -> tuple[tuple[str, ...], dict[str, float]]:
    """``(judged queries, {query: mean over seeds})``; a query evaluated for some seeds scores 0 in the others."""
    results = list(results_by_seed)
    queries = {qid for result in results for qid in result.per_query[measure]}
    averaged = {qid: float(np.mean([result.per_query[measure].get(qid, 0.0) for result in results]))
                for qid in queries}
    return results[0].judged_queries, averaged


def _significance(results, method: str, baseline: str, collection: str, measure: str, alpha: float) -> dict:
    from pretrieve.evaluation.significance import paired_ttest

    judged, run = seed_averaged_per_query((r[collection] for r in results[method].values()), measure)
    _, base = seed_averaged_per_query((r[collection] for r in results[baseline].values()), measure)
    queries = [qid for qid in judged if qid in run or qid in base]
    test = paired_ttest(np.array([base.get(q, 0.0) for q in queries]), np.array([run.get(q, 0.0) for q in queries]),
                        alpha=alpha)
    return test.to_dict()


def _coverage_summary(out: Path, method: str, seeds: Sequence[int]) -> dict[str, Any]:
    reports = []
    for seed in seeds:
        path = seed_dir(out, method, seed) / COVERAGE_FILE
        if path.exists():
            reports.append(json.loads(path.read_text(encoding="utf-8")))
    if not reports:
        return {}
    ks = sorted({int(k) for report in reports for k in report["coverage"]})
    return {"ratio": {str(k): float(np.mean([r["coverage"][str(k)] for r in reports if str(k) in r["coverage"]]))
                      for k in ks},
            "head_created": any(r.get("head_created") for r in reports),
            "num_texts": reports[0].get("num_texts")}


def pretrain_speed(directory: Path) -> dict[str, Any] | None:
    """Wall time of a run's pretrain stage and training samples/s from its ``logs.jsonl`` (module docstring)."""
    from pretrieve.train.loop import read_logs

    pretrain_dir = directory / "pretrain"
    config_path = pretrain_dir / "pretrain_config.json"
    if not config_path.exists():
        return None
    batch_size = int(json.loads(config_path.read_text(encoding="utf-8"))["batch_size"])
    previous, train_s = 0, 0.0
    for entry in read_logs(pretrain_dir):
        steps = int(entry["step"]) - previous
        previous = int(entry["step"])
        if entry.get("samples_per_s"):
            train_s += steps * batch_size / float(entry["samples_per_s"])
    results_path = directory / "results.json"
    timings = json.loads(results_path.read_text(encoding="utf-8")).get("timings_s", {}) if results_path.exists() else {}
    return {"steps": previous, "batch_size": batch_size, "train_s": train_s, "wall_s": timings.get("pretrain"),
            "samples_per_s": previous * batch_size / train_s if train_s > 0 else None,
            "finetune_s": timings.get(f"{RETRIEVER}"), "evaluate_s": timings.get("evaluate")}


def _pretrain_summary(out: Path, method: str, seeds: Sequence[int]) -> dict[str, Any]:
    speeds = [s for s in (pretrain_speed(seed_dir(out, method, seed)) for seed in seeds) if s is not None]
    summary: dict[str, Any] = {}
    for key in ("wall_s", "train_s", "samples_per_s"):
        values = [s[key] for s in speeds if s.get(key) is not None]
        summary[key] = float(np.mean(values)) if values else None
    for key in ("finetune_s", "evaluate_s"):
        values = []
        for seed in seeds:
            results_path = seed_dir(out, method, seed) / "results.json"
            if results_path.exists():
                timing = json.loads(results_path.read_text(encoding="utf-8")).get("timings_s", {})
                name = RETRIEVER if key == "finetune_s" else "evaluate"
                if timing.get(name) is not None:
                    values.append(timing[name])
        summary[key] = float(np.mean(values)) if values else None
    return summary


# ----------------------------------------------------------------------------------------------- report
def _cell(stats: Mapping[str, Any] | None, marks: str = "") -> str:
    if not stats:
        return "—"
    text = f"{stats['mean']:.4f}"
    if stats["n"] > 1:
        text += f" ± {stats['std']:.4f}"
    return text + (f" {marks}" if marks else "")


def significance_marks(cell: Mapping[str, Any]) -> str:
    """``m▲``/``m▼``: significantly better/worse than mlm; ``n▲``/``n▼``: than none (p ≤ alpha)."""
    marks = []
    for baseline, letter in (("mlm", "m"), (NO_PRETRAIN, "n")):
        test = cell.get("vs", {}).get(baseline)
        if test and test.get("significant"):
            marks.append(letter + ("▲" if test["mean_difference"] > 0 else "▼"))
    return " ".join(marks)


def _md_escape(text: str, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return (flat[:limit - 1] + "…" if len(flat) > limit else flat).replace("|", "\\|")


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def results_markdown(summary: Mapping[str, Any]) -> str:
    """``results.md``: one table per measure (methods × collections + avg), coverage, p-values, failures."""
    settings, names = summary["settings"], summary["collections"]
    pre, ft = settings["pretrain"], settings["finetune"]
    seeds = settings["seeds"]
    lines = [f"# Pre-training methods at an equal budget: retrieval quality ({Path(str(settings['base'])).name})", "",
             f"- base model: `{settings['base']}`",
             f"- pre-training (every method the same): {pre.get('max_steps')} steps × batch {pre.get('batch_size')}, "
             f"max length {pre.get('max_len')}, lr {pre.get('lr')}, on `{settings['pretrain_data']}` "
             "(cotmote: the training split's passage–query pairs); `none` = no pre-training",
             f"- fine-tuning: stage 1 (BM25 negatives) on the train split of `{settings['train']}`: "
             + ", ".join(f"{k} {v}" for k, v in ft.items())
             + (f"; per method: {json.dumps(settings['finetune_per_method'])}" if settings.get("finetune_per_method")
                else ""),
             f"- evaluation: {settings['split']} split of {names[0]} (in-domain)"
             + (", " + ", ".join(names[1:]) + " (zero-shot)" if len(names) > 1 else "")
             + f"; exact dense search, depth {settings['depth']}",
             f"- seeds: {', '.join(map(str, seeds))}; a cell is the mean ± sample std over seeds of the collection's "
             "score; avg = mean over collections (per seed, then over seeds)",
             f"- significance: two-sided paired t-test over queries (per-query scores averaged over seeds first), "
             f"p ≤ {settings['alpha']}: m▲/m▼ better/worse than `mlm`, n▲/n▼ than `none`",
             f"- coverage@{TABLE_COVERAGE_K}: input-token coverage ratio of the pre-trained checkpoint's [CLS] "
             f"(Drop your Decoder, Ma et al. 2024, Fig. 2/4) on the first {settings['coverage_texts']} passages of the pre-training corpus",
             "- pre-train s: wall time of the pretrain stage; samples/s: training throughput (logs.jsonl)", ""]
    methods = summary["methods"]
    for measure in summary["measures"]:
        extra = measure == PRIMARY
        header = ["method", *names, "avg"] + ([f"coverage@{TABLE_COVERAGE_K}", "pre-train s", "samples/s"]
                                                if extra else [])
        lines += [f"## {measure}", "", "| " + " | ".join(header) + " |",
                  "|---|" + "---:|" * (len(header) - 1)]
        for method, entry in methods.items():
            if not entry["seeds"]:
                reason = ("failed: " + _md_escape(next(iter(entry["failed"].values())))
                          if entry["failed"] else "not run yet")
                lines.append("| " + " | ".join([method, reason] + ["—"] * (len(header) - 2)) + " |")
                continue
            scores = entry["scores"][measure]
            label = method
            if entry["failed"] or entry["pending"]:
                label += f" ({len(entry['seeds'])}/{len(seeds)} seeds)"
            cells = [label] + [_cell(scores[n], significance_marks(scores[n])) for n in names] + [_cell(scores["avg"])]
            if extra:
                ratio = entry["coverage"].get("ratio", {}).get(str(TABLE_COVERAGE_K))
                speed = entry["pretrain"]
                cells += ["—" if ratio is None else f"{ratio:.3f}" + (" (new head)" if entry["coverage"].get(
                    "head_created") else ""), _seconds(speed.get("wall_s")),
                          "—" if speed.get("samples_per_s") is None else f"{speed['samples_per_s']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += _coverage_section(methods)
    lines += _pvalue_section(methods, names)
    failures = [(m, s, e) for m, entry in methods.items() for s, e in entry["failed"].items()]
    if failures:
        lines += ["## Failures", ""] + [f"- `{m}` seed {s}: {_md_escape(e, 600)}" for m, s, e in failures] + [""]
    example = next(((m, s, runs) for m, e in methods.items() for s, runs in e["runs"].items()), None)
    lines += ["## Reproducing a number", "",
              f"Every cell is computed from the saved TREC runs `<out>/<method>/seed<k>/runs/{RETRIEVER}__<collection>.trec` "
              "(per-seed values in results.json). Re-evaluate one with:", ""]
    if example is not None:
        method, seed, runs = example
        name = names[0]
        lines += ["```", f"pretrieve evaluate --data {settings['eval'][0]} --split {settings['split']} "
                  f"--measures {','.join(summary['measures'])} {runs[name]}", "```", ""]
    lines += ["Each run's recipe is `<out>/<method>/seed<k>/recipe.json` (`pretrieve run` repeats it).", ""]
    return "\n".join(lines)


def _coverage_section(methods: Mapping[str, Any]) -> list[str]:
    rows = [(m, e["coverage"]) for m, e in methods.items() if e["coverage"]]
    if not rows:
        return []
    ks = sorted({int(k) for _, c in rows for k in c["ratio"]})
    lines = ["## Input-token coverage ratio (top-k of CLS·Eᵀ that occur in the input)", "",
             "| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for method, coverage in rows:
        label = method + (" (new head)" if coverage.get("head_created") else "")
        lines.append(f"| {label} | " + " | ".join(f"{coverage['ratio'].get(str(k), float('nan')):.4f}" for k in ks)
                     + " |")
    return lines + [""]


def _pvalue_section(methods: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    header = ["method"] + [f"{n} vs {b}" for n in names for b in BASELINES]
    lines = [f"## p-values ({PRIMARY}, paired t-test)", "", "| " + " | ".join(header) + " |",
             "|---|" + "---:|" * (len(header) - 1)]
    for method, entry in methods.items():
        if not entry["seeds"]:
            continue
        cells = [method]
        for name in names:
            for baseline in BASELINES:
                test = entry["scores"][PRIMARY][name].get("vs", {}).get(baseline)
                cells.append("—" if not test or test.get("p_value") is None else f"{test['p_value']:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def plot_results(summary: Mapping[str, Any], path: str | Path, measure: str = PRIMARY) -> None:
    """Grouped bars: one group per collection (+ avg), one bar per method, std over seeds as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pretrieve.io_utils import atomic_path

    groups = [*summary["collections"], "avg"]
    methods = [(m, e) for m, e in summary["methods"].items() if e["seeds"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(groups) * max(1, len(methods))), 4.5))
    width = 0.8 / max(1, len(methods))
    x = np.arange(len(groups))
    palette = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")   # a distinct colour per method
    for i, (method, entry) in enumerate(methods):
        cells = [entry["scores"][measure][g] for g in groups]
        errors = [c["std"] for c in cells] if any(c["n"] > 1 for c in cells) else None
        ax.bar(x - 0.4 + width * (i + 0.5), [c["mean"] for c in cells], width, yerr=errors, capsize=2, label=method,
               color=palette(i % palette.N))
    failed = [m for m, e in summary["methods"].items() if not e["seeds"]]
    ax.set_xticks(x)
    ax.set_xticklabels(groups)
    seeds = len(summary["settings"]["seeds"])
    ax.set_ylabel(f"{measure}" + (f" (mean ± std over {seeds} seeds)" if seeds > 1 else ""))
    title = f"{measure} after stage-1 fine-tuning, base {Path(str(summary['settings']['base'])).name}"
    if failed:
        title += f"\nno result: {', '.join(failed)}"
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    if methods:
        ax.legend(fontsize=7, ncol=min(6, len(methods)), loc="upper center", bbox_to_anchor=(0.5, -0.08),
                  frameon=False)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def write_report(out: str | Path, summary: Mapping[str, Any], plot: bool = True) -> list[Path]:
    """``results.md``, ``results.json`` and (``plot``) ``results.png`` in ``out``; returns the paths written."""
    out = Path(out)
    write_json(out / "results.json", summary)
    with atomic_open(out / "results.md") as handle:
        handle.write(results_markdown(summary))
    paths = [out / "results.md", out / "results.json"]
    if plot:
        plot_results(summary, out / "results.png")
        paths.append(out / "results.png")
    return paths


