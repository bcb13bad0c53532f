"""Running (and resuming) a comparison: the shared inputs, the fine-tuning selection, every arm × seed.

See :mod:`pretrieve.bench.quality` for what is run. State lives in ``<out>/bench.json`` (written atomically): the
result-determining settings (a rerun with other ones is refused, naming them), the protocol chosen on dev, and the
status of every arm × seed. Everything an arm × seed produces is reused only while current
(:mod:`pretrieve.artifacts`): a recipe's ``results.json`` (:func:`~pretrieve.bench.quality.recipes.results_are_current`),
``coverage.json`` (made by that checkpoint from that corpus sample with those settings), the derived collection and
the pre-training union.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import traceback
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pretrieve import artifacts
from pretrieve.bench.quality import recipes
from pretrieve.bench.quality.arms import NO_PRETRAIN, arm_method
from pretrieve.bench.quality.gates import compute_gates
from pretrieve.bench.quality.report import write_report
from pretrieve.bench.quality.settings import (COVERAGE_FILE, PRIMARY, STATE_FILE, STATUS_FILE, QualityBenchSettings,
                                              fold_dir, grid_points, parse_fold, run_key, seed_dir)
from pretrieve.bench.quality.summary import summarize
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json

logger = logging.getLogger(__name__)

COVERAGE_KS = (10, 20, 50, 100)
#: Coverage variants: every token, English stopwords excluded, the most frequent corpus tokens excluded.
COVERAGE_VARIANTS = ("raw", "no-stopwords", "no-frequent")
FREQUENT_TOKENS = 500
FREQUENT_SAMPLE = 100_000       # passages of the pre-training corpus whose tokens are counted
PROBE_FILE = "probe.json"
PROBE_DEPTH = 100
DEV = "dev"


# --------------------------------------------------------------------------------------------- state
def load_state(out: Path, settings: QualityBenchSettings) -> dict[str, Any]:
    """``bench.json``, created on the first run; a rerun with other result-determining settings is refused."""
    path = out / STATE_FILE
    fingerprint = json.loads(json.dumps(settings.fingerprint(), default=str))
    if path.exists():
        state = json.loads(path.read_text(encoding="utf-8"))
        recorded = state.get("settings", {}).get("fingerprint", {})
        differing = artifacts.differing_values(recorded, fingerprint)
        if differing and state.get("runs"):
            raise ConfigError(f"{path} records a comparison with other settings "
                              f"({artifacts.describe_changes(recorded, fingerprint, differing)}); "
                              "use another --out, or the same settings to resume it")
    else:
        state = {"version": 2, "runs": {}}
    methods = list(dict.fromkeys([*state.get("settings", {}).get("methods", []), *settings.methods]))
    seeds = sorted(set(state.get("settings", {}).get("seeds", [])) | set(settings.seeds))
    state["settings"] = {"fingerprint": fingerprint, "methods": methods, "seeds": seeds, "alpha": settings.alpha,
                         "contrasts": list(settings.contrasts), "margin": settings.margin,
                         "bootstrap": settings.bootstrap}
    return state


def save_state(out: Path, state: Mapping[str, Any]) -> None:
    write_json(out / STATE_FILE, state)


def _write_arm_status(out: Path, arm: str, state: Mapping[str, Any]) -> None:
    prefix = f"{arm}/"
    runs = {key[len(prefix):]: value for key, value in state["runs"].items() if key.startswith(prefix)}
    write_json(out / arm / STATUS_FILE, {"method": arm, "runs": runs})


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


# -------------------------------------------------------------------------------------------- inputs
def derived_collection(settings: QualityBenchSettings) -> Path:
    """The training collection with ``dev`` carved out of its ``train`` split (:mod:`pretrieve.data.folds`), in
    ``<out>/collections/<name>`` (same directory name, so runs are named after the collection)."""
    from pretrieve.data.folds import derive_collection

    parts = {DEV: settings.dev_queries} if settings.dev_queries else {}
    return derive_collection(settings.train, Path(settings.out) / "collections" / Path(settings.train).name,
                             carve_from="train", parts=parts, seed=settings.dev_seed)


def pretrain_corpus(settings: QualityBenchSettings) -> str:
    """The pre-training corpus: the one source, or the union of several written once as JSONL (every passage of
    each source in file order, sources in the given order) in ``<out>/pretrain-data/``."""
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    sources = list(settings.pretrain_data)
    if len(sources) == 1:
        return sources[0]
    path = Path(settings.out) / "pretrain-data" / ("+".join(Path(s).stem if Path(s).is_file() else Path(s).name
                                                             for s in sources) + ".jsonl")
    record = {"sources": [Path(s).name for s in sources]}
    inputs = {f"source{i}": s for i, s in enumerate(sources)}
    if not artifacts.is_current(path, record, inputs, kind="pretrain-union"):
        path.parent.mkdir(parents=True, exist_ok=True)
        with artifacts.write_file(path, "pretrain-union", record, inputs) as tmp, \
                open(tmp, "w", encoding="utf-8") as handle:
            for source in sources:
                for text in iter_pretrain_texts(source):
                    handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return str(path)


def bm25_groups(settings: QualityBenchSettings, data: Path, split: str, arm: str) -> Path:
    """Stage-1 training groups (BM25 negatives of ``split`` of the derived collection), built once, shared."""
    from pretrieve.retrieval.bm25 import bm25_negatives

    depth = int(settings.finetune_for(arm_method(arm)[0]).get("bm25_depth", 1000))
    path = Path(settings.out) / "groups" / f"{data.name}-{split}-bm25-{depth}.jsonl"
    return bm25_negatives(data, split, path, depth=depth)


def prepare_pairs(settings: QualityBenchSettings, data: Path) -> Path | None:
    """The training split's (passage, query) pairs for pair-based methods (``dev`` left out; no fold evaluates on
    ``train`` then, :meth:`QualityBenchSettings.resolved`); written once."""
    if not any(recipes.needs_pairs(arm_method(m)[0]) for m in settings.methods):
        return None
    from pretrieve.data import BeirCollection
    from pretrieve.data.spans import write_qrels_pairs

    path = Path(settings.out) / "pairs" / f"{data.name}-train.jsonl"
    if not path.exists():
        count = write_qrels_pairs(BeirCollection(data), "train", path)
        logger.info("wrote %d passage–query pairs of the training split to %s", count, path)
    return path


def coverage_texts(settings: QualityBenchSettings, corpus: str) -> list[str]:
    """The fixed coverage sample: the first ``coverage_texts`` passages of the pre-training corpus."""
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    texts = list(islice(iter_pretrain_texts(corpus), settings.coverage_texts))
    if not texts:
        raise InputError("the pre-training corpus has no passages", path=corpus)
    return texts


# ------------------------------------------------------------------------------------------ the cells
class Bench:
    """One comparison's shared inputs, computed once per process."""

    def __init__(self, settings: QualityBenchSettings, state: dict[str, Any]):
        self.settings, self.state, self.out = settings, state, Path(settings.out)
        self.data = derived_collection(settings)
        self.corpus = pretrain_corpus(settings)
        self._pairs: Path | None = None
        self._texts: list[str] | None = None
        self._frequent: list[int] | None = None

    # -- recipes
    def pretrained(self, arm: str, seed: int) -> str:
        """The checkpoint an arm × seed fine-tunes: its pre-training's ``final`` (run unless current) or the base."""
        method = arm_method(arm)[0]
        if method == NO_PRETRAIN:
            return self.settings.base
        directory = seed_dir(self.out, arm, seed)
        if not recipes.results_are_current(directory):
            if self._pairs is None and recipes.needs_pairs(method):
                self._pairs = prepare_pairs(self.settings, self.data)
            pretrain = dict(self.settings.pretrain)
            if self.settings.probe_steps and seed == self.settings.arm_seeds(arm)[0]:
                pretrain.update(save_every=_gcd(self.settings.probe_steps), keep_checkpoints=0)
            recipe = recipes.pretrain_recipe(f"bench-quality-{arm}-seed{seed}", directory, self.settings.base,
                                             str(self.data), seed, method, pretrain, self.corpus,
                                             self.out / "cache", self._pairs)
            recipes.run_recipe(recipe, directory, self.settings.show_progress)
        return str(directory / "pretrain" / "final")

    def fold(self, arm: str, seed: int, fold: str, chosen: Mapping[str, Any]) -> Path:
        """Fine-tune an arm × seed on a fold's training split and evaluate it on the fold's test split and the
        zero-shot collections; returns the fold's directory."""
        model = self.pretrained(arm, seed)
        directory = seed_dir(self.out, arm, seed) / fold_dir(fold)
        if not recipes.results_are_current(directory):
            train_split, test_split = parse_fold(fold)
            method = arm_method(arm)[0]
            evaluate = [f"{self.data}:{test_split}", *self.zero_shot()]
            recipe = recipes.finetune_recipe(
                f"bench-quality-{arm}-seed{seed}-{fold_dir(fold)}", directory, model, str(self.data), seed,
                self.settings.finetune_for(method, chosen), train_split,
                bm25_groups(self.settings, self.data, train_split, arm), evaluate, self.settings.depth)
            recipes.run_recipe(recipe, directory, self.settings.show_progress)
        return directory

    def zero_shot(self) -> list[str]:
        train = Path(self.settings.train).name
        return [f"{path}:{self.settings.split}" for path in self.settings.eval if Path(path).name != train]

    # -- the protocol chosen on dev
    def choose_protocol(self, say: Callable[[str], None]) -> dict[str, Any]:
        """Search the grid on dev once (the selection arm's first seed, first fold), record the best point
        (dev nDCG@10; ties to the first) in ``bench.json`` and return it; ``{}`` without a grid."""
        settings = self.settings
        if not settings.grid:
            return {}
        recorded = self.state.get("selection")
        if recorded and recorded.get("chosen") is not None:
            return dict(recorded["chosen"])
        arm, seed, fold = settings.select_arm, settings.arm_seeds(settings.select_arm)[0], settings.folds[0]
        train_split = parse_fold(fold)[0]
        model = self.pretrained(arm, seed)
        method = arm_method(arm)[0]
        scores: dict[str, float] = {}
        points = grid_points(settings.grid)
        for index, point in enumerate(points, 1):
            name = _point_name(point)
            directory = self.out / "select" / name
            say(f"[select {index}/{len(points)}] {arm}/seed{seed} {fold_dir(fold)} {name}")
            if not recipes.results_are_current(directory):
                recipe = recipes.finetune_recipe(
                    f"bench-quality-select-{name}", directory, model, str(self.data), seed,
                    {**settings.finetune_for(method), **point}, train_split,
                    bm25_groups(settings, self.data, train_split, arm), [f"{self.data}:{DEV}"], settings.depth)
                recipes.run_recipe(recipe, directory, settings.show_progress)
            results = json.loads((directory / "results.json").read_text(encoding="utf-8"))
            scores[name] = float(next(row[PRIMARY] for row in results["rows"]))
        best = max(range(len(points)), key=lambda i: (scores[_point_name(points[i])], -i))
        chosen = points[best]
        self.state["selection"] = {"arm": arm, "seed": seed, "fold": fold, "measure": PRIMARY, "split": DEV,
                                   "dev_queries": settings.dev_queries, "grid": {k: list(v) for k, v in
                                                                                  settings.grid.items()},
                                   "scores": scores, "chosen": chosen}
        save_state(self.out, self.state)
        say(f"[select] chosen on dev: {_point_name(chosen)} ({PRIMARY} {scores[_point_name(chosen)]:.4f})")
        return dict(chosen)

    # -- coverage
    def checkpoint(self, arm: str, seed: int) -> str:
        """Where an arm × seed's checkpoint is (nothing is run): its pre-training's ``final``, or the base."""
        from pretrieve.models import resolve_model

        if arm_method(arm)[0] == NO_PRETRAIN:
            return resolve_model(self.settings.base)
        return str(seed_dir(self.out, arm, seed) / "pretrain" / "final")

    def coverage_record(self, arm: str, seed: int) -> tuple[Path, dict[str, Any], dict[str, str]]:
        """``(coverage.json path, settings, inputs)``: what its artefact sidecar must record to be current."""
        record = {"texts": self.settings.coverage_texts, "max_len": int(self.settings.pretrain.get("max_len", 144)),
                  "ks": list(COVERAGE_KS), "variants": list(COVERAGE_VARIANTS), "frequent": FREQUENT_TOKENS}
        inputs = {"model": self.checkpoint(arm, seed), "corpus": self.corpus}
        return seed_dir(self.out, arm, seed) / COVERAGE_FILE, record, inputs

    def coverage(self, arm: str, seed: int) -> None:
        """``coverage.json`` of the arm × seed's checkpoint (the base for ``none``) unless current."""
        self.pretrained(arm, seed)
        path, record, inputs = self.coverage_record(arm, seed)
        if artifacts.is_current(path, record, inputs, kind="coverage"):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._texts is None:
            self._texts = coverage_texts(self.settings, self.corpus)
        model = inputs["model"]
        report = checkpoint_coverage(model, self._texts, record["max_len"], self.frequent_tokens(model))
        with artifacts.write_file(path, "coverage", record, inputs) as tmp:
            tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    # -- probes
    def probe_steps(self, arm: str, seed: int) -> list[int]:
        """The probed steps of an arm × seed: the chosen steps for each arm's first seed (0 for ``none``: the
        base model), none otherwise."""
        if not self.settings.probe_steps or seed != self.settings.arm_seeds(arm)[0]:
            return []
        return [0] if arm_method(arm)[0] == NO_PRETRAIN else list(self.settings.probe_steps)

    def probe_record(self, arm: str, seed: int, step: int) -> tuple[Path, dict[str, Any], dict[str, str]]:
        """``(probe.json path, settings, inputs)`` of one probed step."""
        directory = seed_dir(self.out, arm, seed) / "probes" / f"step-{step}"
        last = step == int(self.settings.pretrain.get("max_steps") or 0)
        model = self.checkpoint(arm, seed) if step == 0 or last else str(directory / "model")
        record = {"step": step, "depth": PROBE_DEPTH, "collections": [Path(c).name for c in self.settings.eval],
                  "max_len": int(self.settings.pretrain.get("max_len", 144)), "texts": self.settings.coverage_texts,
                  "variants": list(COVERAGE_VARIANTS), "frequent": FREQUENT_TOKENS}
        inputs = {"model": model, "corpus": self.corpus, **{f"collection{i}": c for i, c in enumerate(self.settings.eval)}}
        return directory / PROBE_FILE, record, inputs

    def probe(self, arm: str, seed: int) -> None:
        """At each probed step: [CLS] retrieval without fine-tuning (dot and cosine) on every judged query of every
        split of the evaluation collections, and the coverage variants (:mod:`pretrieve.analysis.probe`)."""
        from pretrieve.analysis.probe import cls_probe, export_checkpoint_encoder

        for step in self.probe_steps(arm, seed):
            path, record, inputs = self.probe_record(arm, seed, step)
            if artifacts.is_current(path, record, inputs, kind="probe"):
                continue
            model = inputs["model"]
            if not Path(model).exists():
                checkpoint = seed_dir(self.out, arm, seed) / "pretrain" / "checkpoints" / f"step-{step}"
                export_checkpoint_encoder(checkpoint, self.checkpoint(arm, seed), model)
            if self._texts is None:
                self._texts = coverage_texts(self.settings, self.corpus)
            result = {"step": step, "retrieval": cls_probe(model, self.settings.eval, path.parent, depth=PROBE_DEPTH),
                      "coverage": checkpoint_coverage(model, self._texts, record["max_len"],
                                                      self.frequent_tokens(model))}
            with artifacts.write_file(path, "probe", record, inputs) as tmp:
                tmp.write_text(json.dumps(result) + "\n", encoding="utf-8")

    def frequent_tokens(self, model: str) -> list[int]:
        """The :data:`FREQUENT_TOKENS` most frequent tokens of the pre-training corpus (every arm shares the base
        tokenizer; counted once)."""
        if self._frequent is None:
            from transformers import AutoTokenizer

            from pretrieve.analysis.coverage import frequent_token_ids
            from pretrieve.data.pretrain_text import iter_pretrain_texts

            tokenizer = AutoTokenizer.from_pretrained(model)
            texts = islice(iter_pretrain_texts(self.corpus), FREQUENT_SAMPLE)
            self._frequent = frequent_token_ids(tokenizer, texts, FREQUENT_TOKENS)
        return self._frequent


def _gcd(values: Sequence[int]) -> int:
    result = 0
    for value in values:
        result = math.gcd(result, int(value))
    return result


def _point_name(point: Mapping[str, Any]) -> str:
    return "-".join(f"{key}{point[key]:g}" for key in ("lr", "epochs") if key in point) or "default"


def checkpoint_coverage(model: str, texts: Sequence[str], max_len: int, frequent: Sequence[int],
                        ks: Sequence[int] = COVERAGE_KS) -> dict:
    """:func:`pretrieve.analysis.coverage.token_coverage` of one checkpoint in each of :data:`COVERAGE_VARIANTS`
    (what ``pretrieve analyze coverage`` computes), without the per-text examples; ``raw`` at the top level."""
    from transformers import AutoTokenizer

    from pretrieve.analysis.coverage import load_encoder, token_coverage

    encoder, created = load_encoder(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    variants: dict[str, Any] = {}
    for variant in COVERAGE_VARIANTS:
        try:
            report = token_coverage(encoder, tokenizer, list(texts), ks=ks, max_len=max_len, num_examples=0,
                                    name=str(model), head_created=created,
                                    exclude_stopwords=variant == "no-stopwords",
                                    exclude_ids=frequent if variant == "no-frequent" else ())
        except InputError:
            if variant == "raw":
                raise
            variants[variant] = None   # a tiny corpus: the excluded tokens are every token of every text
            continue
        variants[variant] = report.to_dict()
    return {**variants["raw"], "variants": variants}


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
    bench = Bench(settings, state)
    chosen = bench.choose_protocol(say)
    cells = [(arm, seed) for arm in settings.methods for seed in settings.arm_seeds(arm)]
    for index, (arm, seed) in enumerate(cells, 1):
        key = run_key(arm, seed)
        record = state["runs"].get(key, {})
        if record.get("status") == "done" and cell_is_current(bench, arm, seed):
            say(f"[{index}/{len(cells)}] {key}: done earlier, skipped")
            continue
        if record.get("status") == "failed" and not settings.retry_failed:
            error = str(record.get("error", "")).splitlines()[0][:160] if record.get("error") else "?"
            say(f"[{index}/{len(cells)}] {key}: failed earlier ({error}), skipped (--retry-failed runs it again)")
            continue
        say(f"[{index}/{len(cells)}] {key}: running")
        state["runs"][key] = {"status": "running", "started": _now()}
        save_state(out, state)
        started = time.perf_counter()
        try:
            run_cell(bench, arm, seed, chosen)
            state["runs"][key] = {"status": "done", "started": state["runs"][key]["started"],
                                  "finished": _now(), "wall_s": round(time.perf_counter() - started, 1)}
            say(f"[{index}/{len(cells)}] {key}: done in {time.perf_counter() - started:.0f} s")
        except Exception as exc:  # noqa: BLE001 - any failure of one cell must not stop the others
            error = f"{type(exc).__name__}: {exc}".strip()
            logger.error("%s failed: %s", key, error)
            state["runs"][key] = {"status": "failed", "started": state["runs"][key]["started"],
                                  "finished": _now(), "wall_s": round(time.perf_counter() - started, 1),
                                  "error": error, "traceback": traceback.format_exc(limit=8)}
            say(f"[{index}/{len(cells)}] {key}: FAILED — {error.splitlines()[0][:200]}")
        save_state(out, state)
        _write_arm_status(out, arm, state)
        if index < len(cells):
            try:   # a partial report while the comparison runs; the final one below is the one that counts
                write_report(out, summarize(out), plot=False)
            except Exception as exc:  # noqa: BLE001
                logger.warning("partial report not written: %s", exc)
    if settings.probe_steps:
        state["gates"] = compute_gates(bench)
        save_state(out, state)
    summary = summarize(out)
    write_report(out, summary, plot=True)
    return summary


def cell_is_current(bench: Bench, arm: str, seed: int) -> bool:
    """Whether every recipe of an arm × seed has current results and its coverage is current."""
    directory = seed_dir(bench.out, arm, seed)
    pretrained = arm_method(arm)[0] == NO_PRETRAIN or recipes.results_are_current(directory)
    return pretrained and all(recipes.results_are_current(directory / fold_dir(f)) for f in bench.settings.folds) \
        and artifacts.is_current(*bench.coverage_record(arm, seed), kind="coverage") \
        and all(artifacts.is_current(*bench.probe_record(arm, seed, step), kind="probe")
                for step in bench.probe_steps(arm, seed))


def run_cell(bench: Bench, arm: str, seed: int, chosen: Mapping[str, Any]) -> None:
    """One arm × seed: its pre-training, every fold, the coverage of its checkpoint; then its training
    checkpoints are removed unless kept (the probe steps' are the probes' to remove)."""
    for fold in bench.settings.folds:
        bench.fold(arm, seed, fold, chosen)
    bench.coverage(arm, seed)
    bench.probe(arm, seed)
    if not bench.settings.keep_checkpoints:
        directory = seed_dir(bench.out, arm, seed)
        for checkpoints in directory.glob("**/checkpoints"):
            shutil.rmtree(checkpoints, ignore_errors=True)
