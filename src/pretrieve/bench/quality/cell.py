"""What one cell of a comparison does: the shared inputs, then an arm × seed's pre-training, folds, coverage and probes,
or a dev-grid point's fine-tuning.

:class:`Bench` holds one comparison's shared inputs for one process (the derived training collection with its dev
queries, the pre-training union, BM25 groups, the pairs of pair-based methods, the coverage sample) and runs the
recipes of a cell (:mod:`pretrieve.bench.quality.recipes`) in the scratch ``<out>``, reusing whatever is current
(:mod:`pretrieve.artifacts`: each recipe's ``results.json``, coverage and probe files), so that an interrupted cell
resumes where it stopped on the same machine. :func:`prepare_cell` and :meth:`Bench.fold` are the parts of one
arm × seed; :meth:`Bench.select_point` one point of the dev grid. Their records are made by
:mod:`pretrieve.bench.quality.cell_records`; which cells run, and where, by :mod:`pretrieve.bench.quality.run`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from itertools import islice
from pathlib import Path
from typing import Any, Mapping, Sequence

from transformers import AutoTokenizer

from pretrieve import artifacts
from pretrieve.analysis.coverage import frequent_token_ids, load_encoder, token_coverage
from pretrieve.analysis.probe import cls_probe, export_checkpoint_encoder
from pretrieve.bench.quality import recipes
from pretrieve.bench.quality.arms import NO_PRETRAIN, arm_method
from pretrieve.bench.quality.settings import (COVERAGE_FILE, RETRIEVER, QualityBenchSettings, fold_dir, parse_fold,
                                              point_name, seed_dir)
from pretrieve.data.collection import BeirCollection
from pretrieve.data.folds import held_out_dev
from pretrieve.data.pretrain_text import iter_pretrain_texts
from pretrieve.data.spans import write_qrels_pairs
from pretrieve.errors import InputError
from pretrieve.io_utils import file_digest
from pretrieve.models import no_remote_code, resolve_model
from pretrieve.retrieval.runs import bm25_negatives

logger = logging.getLogger(__name__)

COVERAGE_KS = (10, 20, 50, 100)
#: Coverage variants: every token, English stopwords excluded, the most frequent corpus tokens excluded.
COVERAGE_VARIANTS = ("raw", "no-stopwords", "no-frequent")
FREQUENT_TOKENS = 500
FREQUENT_SAMPLE = 100_000       # passages of the pre-training corpus whose tokens are counted
PROBE_FILE = "probe.json"
PROBE_DEPTH = 100
DEV = "dev"

# -------------------------------------------------------------------------------------------- inputs
def derived_collection(settings: QualityBenchSettings) -> Path:
    """The training collection with its held-out ``dev`` queries (:func:`pretrieve.data.folds.held_out_dev`: at most
    ``dev_queries`` drawn with ``dev_seed`` from the collection's own ``dev`` split when it has one, else carved out
    of its ``train`` split), in ``<out>/collections/<name>`` (same directory name, so runs are named after the
    collection)."""
    return held_out_dev(settings.train, Path(settings.out) / "collections" / Path(settings.train).name,
                        size=settings.dev_queries, seed=settings.dev_seed, train="train")


def pretrain_corpus(settings: QualityBenchSettings) -> str:
    """The pre-training corpus: the one source, or the union of several written once as JSONL (every passage of
    each source in file order, sources in the given order) in ``<out>/pretrain-data/``."""
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
    depth = int(settings.finetune_for(arm_method(arm)[0]).get("bm25_depth", 1000))
    path = Path(settings.out) / "groups" / f"{data.name}-{split}-bm25-{depth}.jsonl"
    return bm25_negatives(data, split, path, depth=depth)


def prepare_pairs(settings: QualityBenchSettings, data: Path) -> Path | None:
    """The training split's (passage, query) pairs for pair-based methods (``dev`` left out; no fold evaluates on
    ``train`` then, :meth:`QualityBenchSettings.resolved`); written once."""
    if not any(recipes.needs_pairs(arm_method(m)[0]) for m in settings.methods):
        return None

    path = Path(settings.out) / "pairs" / f"{data.name}-train.jsonl"
    if not path.exists():
        count = write_qrels_pairs(BeirCollection(data), "train", path)
        logger.info("wrote %d passage–query pairs of the training split to %s", count, path)
    return path


def coverage_texts(settings: QualityBenchSettings, corpus: str) -> list[str]:
    """The fixed coverage sample: the first ``coverage_texts`` passages of the pre-training corpus."""
    texts = list(islice(iter_pretrain_texts(corpus), settings.coverage_texts))
    if not texts:
        raise InputError("the pre-training corpus has no passages", path=corpus)
    return texts


# ------------------------------------------------------------------------------------------ the cells
class Bench:
    """One comparison's shared inputs, computed once per process."""

    def __init__(self, settings: QualityBenchSettings):
        self.settings, self.out = settings, Path(settings.out)
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
            pretrain = {**self.settings.pretrain, "precision": self.settings.precision}
            if self.settings.probe_steps and seed == self.settings.arm_seeds(arm)[0]:
                pretrain.update(save_every=_gcd(self.settings.probe_steps), keep_checkpoints=0)
            elif self.settings.pretrained_from:     # the same pre-training in another comparison: copied if current
                pretrain["reuse_from"] = str(seed_dir(Path(self.settings.pretrained_from), arm, seed) / "pretrain")
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
                self.finetune_settings(method, chosen), train_split,
                bm25_groups(self.settings, self.data, train_split, arm), evaluate, self.settings.depth,
                self.settings.precision)
            self.reuse_selected(recipe, chosen, directory)
            recipes.run_recipe(recipe, directory, self.settings.show_progress)
        return directory

    def reuse_selected(self, recipe: Mapping[str, Any], chosen: Mapping[str, Any] | None, directory: Path) -> bool:
        """The dev grid's chosen point *is* the selection arm's first seed fine-tuned on the first fold with the
        chosen protocol: when that point's fine-tuned model is in this scratch ``<out>`` and its recipe trains
        exactly what this fold's does (same model, data, seed, fine-tuning settings and groups: only the name, the
        directory and what is evaluated differ), it is copied in as this fold's, and the fine-tuning stage reuses it
        (its own freshness check compares the recorded settings and the inputs' contents once more); otherwise this
        fold trains. Returns whether it was copied."""
        if not chosen or not self.settings.grid:
            return False
        source = self.out / "select" / point_name(chosen)
        target = directory / RETRIEVER / "final"
        try:
            grid_recipe = json.loads((source / "recipe.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False

        def trains(r: Mapping[str, Any]) -> list:
            return [r.get("model"), r.get("data"), r.get("seed"), r.get("finetune"), (r.get("stages") or [{}])[0]]

        if trains(grid_recipe) != json.loads(json.dumps(trains(recipe))) or target.exists() or \
                not artifacts.sidecar_path(source / RETRIEVER / "final").exists():
            return False
        shutil.copytree(source / RETRIEVER / "final", target)
        logger.info("%s: the fine-tuned model of the dev grid's chosen point %s is this fold's; reused", directory,
                    point_name(chosen))
        return True

    def zero_shot(self) -> list[str]:
        train = Path(self.settings.train).name
        return [f"{path}:{self.settings.split}" for path in self.settings.eval if Path(path).name != train]

    def finetune_settings(self, method: str, chosen: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {**self.settings.finetune_for(method, chosen), "precision": self.settings.precision}

    # -- the protocol chosen on dev
    def select_point(self, point: Mapping[str, Any]) -> Path:
        """Fine-tune the selection arm's first seed on the first fold's training split with one grid point and
        evaluate it on dev only; returns the point's directory (``<out>/select/<point>``)."""
        settings = self.settings
        arm, seed = settings.select_arm, settings.arm_seeds(settings.select_arm)[0]
        train_split = parse_fold(settings.folds[0])[0]
        model = self.pretrained(arm, seed)
        directory = self.out / "select" / point_name(point)
        if not recipes.results_are_current(directory):
            recipe = recipes.finetune_recipe(
                f"bench-quality-select-{point_name(point)}", directory, model, str(self.data), seed,
                {**self.finetune_settings(arm_method(arm)[0]), **point}, train_split,
                bm25_groups(settings, self.data, train_split, arm), [f"{self.data}:{DEV}"], settings.depth,
                settings.precision)
            recipes.run_recipe(recipe, directory, settings.show_progress)
        return directory

    def prepare(self, arms: Sequence[str]) -> None:
        """The inputs cells share, made once before cells run side by side: every fold's (and the selection's)
        BM25 groups and the pairs file of pair-based methods."""
        for split in dict.fromkeys(parse_fold(fold)[0] for fold in self.settings.folds):
            for arm in dict.fromkeys(arms):
                bm25_groups(self.settings, self.data, split, arm)
        if self._pairs is None and any(recipes.needs_pairs(arm_method(arm)[0]) for arm in arms):
            self._pairs = prepare_pairs(self.settings, self.data)

    # -- coverage
    def checkpoint(self, arm: str, seed: int) -> str:
        """Where an arm × seed's checkpoint is (nothing is run): its pre-training's ``final``, or the base."""
        return checkpoint_path(self.settings, arm, seed)

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
                  "precision": self.settings.precision,
                  "max_len": int(self.settings.pretrain.get("max_len", 144)), "texts": self.settings.coverage_texts,
                  "variants": list(COVERAGE_VARIANTS), "frequent": FREQUENT_TOKENS}
        inputs = {"model": model, "corpus": self.corpus, **{f"collection{i}": c for i, c in enumerate(self.settings.eval)}}
        return directory / PROBE_FILE, record, inputs

    def probe(self, arm: str, seed: int) -> None:
        """At each probed step: [CLS] retrieval without fine-tuning (dot and cosine) on every judged query of every
        split of the evaluation collections, and the coverage variants (:mod:`pretrieve.analysis.probe`)."""
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
            result = {"step": step, "retrieval": cls_probe(model, self.settings.eval, path.parent, depth=PROBE_DEPTH,
                                                          precision=self.settings.precision),
                      "coverage": checkpoint_coverage(model, self._texts, record["max_len"],
                                                      self.frequent_tokens(model))}
            with artifacts.write_file(path, "probe", record, inputs) as tmp:
                tmp.write_text(json.dumps(result) + "\n", encoding="utf-8")

    def frequent_tokens(self, model: str) -> list[int]:
        """The :data:`FREQUENT_TOKENS` most frequent tokens of the pre-training corpus (every arm shares the base
        tokenizer; counted once)."""
        if self._frequent is None:
            tokenizer = AutoTokenizer.from_pretrained(model, **no_remote_code(model))
            texts = islice(iter_pretrain_texts(self.corpus), FREQUENT_SAMPLE)
            self._frequent = frequent_token_ids(tokenizer, texts, FREQUENT_TOKENS)
        return self._frequent


def checkpoint_path(settings: QualityBenchSettings, arm: str, seed: int) -> str:
    """Where an arm × seed's checkpoint is (nothing is run): its pre-training's ``final``, or the base."""
    if arm_method(arm)[0] == NO_PRETRAIN:
        return resolve_model(settings.base)
    return str(seed_dir(settings.out, arm, seed) / "pretrain" / "final")


def checkpoint_digest(settings: QualityBenchSettings, arm: str, seed: int) -> str | None:
    """SHA-1 (:func:`pretrieve.io_utils.file_digest`; recorded as ``checkpoint_sha256``, the key's historical
    name) of the weights an arm × seed pre-trained (its checkpoint's ``model.safetensors``); None for an arm
    without pre-training (the base: the tier's fingerprint already names its digest) and while they do not exist
    (not pre-trained here yet)."""
    if arm_method(arm)[0] == NO_PRETRAIN:
        return None
    weights = Path(checkpoint_path(settings, arm, seed)) / "model.safetensors"
    return file_digest(weights) if weights.exists() else None


def _gcd(values: Sequence[int]) -> int:
    result = 0
    for value in values:
        result = math.gcd(result, int(value))
    return result


def checkpoint_coverage(model: str, texts: Sequence[str], max_len: int, frequent: Sequence[int],
                        ks: Sequence[int] = COVERAGE_KS) -> dict:
    """:func:`pretrieve.analysis.coverage.token_coverage` of one checkpoint in each of :data:`COVERAGE_VARIANTS`
    (what ``pretrieve analyze coverage`` computes), without the per-text examples; ``raw`` at the top level."""

    encoder, created = load_encoder(model)
    tokenizer = AutoTokenizer.from_pretrained(model, **no_remote_code(model))
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


def prepare_cell(bench: Bench, arm: str, seed: int) -> None:
    """The part of an arm × seed's cell that does not depend on the protocol chosen on dev: its pre-training, the
    coverage of its checkpoint, its probes (first seed). Each piece is skipped when current."""
    bench.pretrained(arm, seed)
    bench.coverage(arm, seed)
    bench.probe(arm, seed)
