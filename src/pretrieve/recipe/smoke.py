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
collections and splits it reads (``reads``): this module holds the fixtures and the shared training budget
(:func:`capped`), and names no stage kind. The output goes to ``<out>-smoke`` unless ``--out`` is given; results are
meaningless as numbers (but pinned: ``tests/pinned/smoke``, docs/recipes.md).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import AutoConfig, AutoTokenizer, BertConfig, BertForMaskedLM, ElectraConfig, ElectraForPreTraining

from pretrieve.data.beir import iter_corpus
from pretrieve.data.collection import BeirCollection
from pretrieve.data.pretrain_text import iter_pretrain_texts
from pretrieve.data.registry import KNOWN_COLLECTIONS, data_roots
from pretrieve.errors import ConfigError
from pretrieve.io_utils import atomic_dir, atomic_open
from pretrieve.models import OFFLINE_MODELS, no_remote_code, resolve_model
from pretrieve.recipe.dev import training_split
from pretrieve.recipe.schema import STAGES

logger = logging.getLogger(__name__)

SLICE_PASSAGES = 300
MAX_EVAL_COLLECTIONS = 3
MIN_TRAIN_QUERIES, MIN_EVAL_QUERIES = 8, 2
MAX_TRAIN_QUERIES, MAX_EVAL_QUERIES = 24, 8
STEPS = 2
SMOKE_DEV_QUERIES = 4
OPTIONAL_CAPS = {"grad_cache_chunk": 3, "warmup_steps": 1}
"""Options capped only when the recipe sets them."""
FIXED = {"batch_size": 4, "max_steps": STEPS, "save_every": 1, "log_every": 1, "num_workers": 0}
"""Training options set outright; ``micro_batch_size`` and ``epochs`` are removed."""
FAMILIES = ("bert", "electra")


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

    def training(self, options: Mapping[str, Any], caps: Mapping[str, tuple[Any, Any]],
                 defaults: bool = True) -> dict[str, Any]:
        """A training stage's options within the smoke budget (:func:`capped`)."""
        return capped(options, caps, defaults)


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


def capped(options: Mapping[str, Any], caps: Mapping[str, tuple[Any, Any]], defaults: bool) -> dict[str, Any]:
    """Training options within the smoke budget: ``caps`` (option → (the stage's default, the smoke cap); a smaller
    value in the recipe is kept), :data:`OPTIONAL_CAPS` and :data:`FIXED`; with ``defaults``, options the recipe
    leaves at the stage's default are capped too (written out)."""
    values = dict(options)
    for key, (default, cap) in caps.items():
        if key in values or defaults:
            value = values.get(key, default)
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


# ------------------------------------------------------------------------------------------------- models
def model_family(name: str) -> str:
    """``bert`` or ``electra``: from the checkpoint's config when it is local or cached, else from the name."""
    model_type = None
    path = Path(os.path.expandvars(str(name))).expanduser()
    try:
        source = str(path) if path.exists() else str(name)
        if path.exists() or str(name) not in OFFLINE_MODELS:
            model_type = AutoConfig.from_pretrained(source, local_files_only=True, **no_remote_code(source)).model_type
    except (OSError, ValueError):
        model_type = None
    lowered = str(name).lower()
    if model_type is None and str(name) in OFFLINE_MODELS:
        model_type = "bert"   # minilm, splade-tiny: BERT bodies
    if model_type is None:
        model_type = "electra" if "electra" in lowered else "bert" if any(
            key in lowered for key in ("bert", "minilm", "retromae", "splade", "cotmae", "condenser", "simlm")) else None
    if model_type in ("bert", "electra"):
        return model_type
    raise ConfigError(f"smoke: no tiny stand-in for model '{name}' (family {model_type or 'unknown'}); smoke runs "
                      f"know the families {', '.join(FAMILIES)}")


def uncased_tokenizer():
    """The uncased WordPiece tokenizer of the offline all-MiniLM-L6-v2 package (30,522 tokens)."""
    return AutoTokenizer.from_pretrained(resolve_model("minilm"), trust_remote_code=False)


def tiny_model(name: str, directory: Path) -> str:
    """A tiny random model of ``name``'s family, saved (once) under ``directory/<family>``; returns its path."""
    family = model_family(name)
    target = directory / family
    if (target / "config.json").exists():
        return str(target)
    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=512)
    tokenizer = uncased_tokenizer()
    torch.manual_seed(0)
    if family == "electra":
        model = ElectraForPreTraining(ElectraConfig(vocab_size=len(tokenizer), embedding_size=32, **size))
    else:
        model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), **size))
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return str(target)


# --------------------------------------------------------------------------------------------------- data
def _local_collection(name: str, recipe: Mapping[str, Any]) -> Path | None:
    """A collection directory on this machine (a path, or a name under the data roots), never downloaded."""
    path = Path(os.path.expandvars(str(name))).expanduser()
    if (path / "corpus.jsonl").exists():
        return path
    for root in data_roots(recipe):
        if (root / str(name) / "corpus.jsonl").exists():
            return root / str(name)
    return None


def _safe_name(name: Any) -> str:
    text = Path(str(name).rstrip("/")).name or "collection"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text.replace("hf:", "hf-"))


def collection_splits(name: str, recipe: Mapping[str, Any]) -> set[str]:
    """The splits collection ``name`` has: a local one's qrels files, else those the registry lists for a known
    name (none for an unknown absent one)."""
    source = _local_collection(name, recipe)
    if source is not None:
        return set(BeirCollection(source).splits())
    info = KNOWN_COLLECTIONS.get(str(name))
    return set(info.splits) if info is not None else set()


def smoke_collection(name: str, splits: set[str], data: Path, recipe: Mapping[str, Any]) -> Path:
    """A small BEIR collection standing for ``name`` with qrels for ``splits`` and every split the collection has
    (:func:`collection_splits`): a slice of the local collection when it gives enough queries in each, else a
    generated fixture. Written once under ``data/<name>``."""
    target = data / _safe_name(name)
    if (target / "corpus.jsonl").exists():
        return target
    source = _local_collection(name, recipe)
    splits = set(splits) | collection_splits(name, recipe)
    if source is None or not _write_slice(source, sorted(splits), target):
        if source is not None:
            logger.info("smoke: the first %d passages of %s hold too few judged queries; using a fixture",
                        SLICE_PASSAGES, source)
        write_fixture_collection(target, sorted(splits))
    return target


def _write_slice(source: Path, splits: list[str], target: Path) -> bool:
    collection = BeirCollection(source)
    documents = []
    for _, document in iter_corpus(collection.corpus_path):
        documents.append(document)
        if len(documents) >= SLICE_PASSAGES:
            break
    kept = {document.id for document in documents}
    queries = collection.load_queries()
    chosen: dict[str, dict[str, dict[str, int]]] = {}
    for split in splits:
        if split not in collection.splits():
            return False
        judged = {qid: {doc: grade for doc, grade in docs.items() if doc in kept}
                  for qid, docs in collection.load_qrels(split).items() if qid in queries}
        judged = {qid: docs for qid, docs in judged.items() if any(grade >= 1 for grade in docs.values())}
        wanted = MAX_TRAIN_QUERIES if split == "train" else MAX_EVAL_QUERIES
        least = MIN_TRAIN_QUERIES if split == "train" else MIN_EVAL_QUERIES
        if len(judged) < least:
            return False
        chosen[split] = dict(sorted(judged.items())[:wanted])
    used = {qid for qrels in chosen.values() for qid in qrels}
    _write_beir(target, [(d.id, d.title, d.text) for d in documents],
                {qid: queries[qid] for qid in sorted(used)}, chosen)
    return True


def _write_beir(target: Path, documents: list[tuple[str, str, str]], queries: Mapping[str, str],
                qrels: Mapping[str, Mapping[str, Mapping[str, int]]]) -> None:
    with atomic_dir(target) as tmp:
        (tmp / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n"
                                                  for i, t, x in documents), encoding="utf-8")
        (tmp / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n"
                                                   for q, t in queries.items()), encoding="utf-8")
        (tmp / "qrels").mkdir()
        for split, judged in qrels.items():
            lines = [f"{qid}\t{doc}\t{grade}\n" for qid, docs in judged.items() for doc, grade in docs.items()]
            (tmp / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(lines),
                                                       encoding="utf-8")


_WORDS = ("protein cell tumor virus enzyme membrane gene receptor kinase tissue blood immune signal pathway "
          "mutation infection vessel growth factor repair river flood solar energy market stock chess opening "
          "volcano honey bee jazz glacier vaccine desert bridge ocean tide wheat harvest comet orbit forest fire "
          "bird migration salt mining wind turbine coffee farming climate").split()
_FILLER = ("the study reports that", "recent work shows", "in practice", "researchers found that",
           "a survey explains how", "measurements suggest")


def _topic(i: int) -> tuple[str, str]:
    return _WORDS[(3 * i) % len(_WORDS)], _WORDS[(7 * i + 1) % len(_WORDS)]


def _sentences(i: int, count: int, rng: random.Random) -> list[str]:
    first, second = _topic(i)
    sentences = []
    for j in range(count):
        extra = rng.sample(_WORDS, 3)
        sentences.append(f"{rng.choice(_FILLER).capitalize()} {first} and {second} relate to {' '.join(extra)}.")
    return sentences


def write_fixture_collection(target: Path, splits: list[str], documents: int = 60) -> None:
    """A synthetic BEIR collection: ``documents`` passages on two-word topics; per split, queries whose one
    relevant passage shares their topic (train: 24 queries, other splits: 8), so BM25 and training have signal."""
    rng = random.Random(0)
    corpus = [(f"d{i}", f"{_topic(i)[0]} {_topic(i)[1]}".title(), " ".join(_sentences(i, 3, rng)))
              for i in range(documents)]
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for s, split in enumerate(splits or ["test"]):
        count = MAX_TRAIN_QUERIES if split == "train" else MAX_EVAL_QUERIES
        qrels[split] = {}
        for k in range(count):
            doc = (k * 2 + s) % documents
            qid = f"{split}-{k}"
            first, second = _topic(doc)
            queries[qid] = f"what is known about {first} and {second}"
            qrels[split][qid] = {f"d{doc}": 1}
    _write_beir(target, corpus, queries, qrels)


def smoke_text_corpus(corpus: Any, data: Path, recipe: Mapping[str, Any]) -> Path:
    """A pre-training corpus standing for ``corpus`` (a path, a collection name, ``hf:...`` or a list of them):
    its first passages when it is local, else generated multi-sentence text (one passage per line)."""
    sources = corpus if isinstance(corpus, (list, tuple)) else [corpus]
    target = data / ("text-" + "+".join(_safe_name(source) for source in sources) + ".txt")
    if target.exists():
        return target
    lines: list[str] = []
    for source in sources:
        lines.extend(_local_text(source, recipe))
    if len(lines) < 40:
        rng = random.Random(1)
        lines = [" ".join(_sentences(i, 8, rng)) for i in range(80)]
    with atomic_open(target) as handle:
        handle.write("".join(line.replace("\n", " ") + "\n" for line in lines))
    return target


def _local_text(source: Any, recipe: Mapping[str, Any]) -> list[str]:
    path = Path(os.path.expandvars(str(source))).expanduser()
    if not path.exists():
        path = _local_collection(str(source), recipe)
    if path is None or not path.exists():
        return []
    lines = []
    for text in iter_pretrain_texts(path):
        lines.append(text)
        if len(lines) >= 200:
            break
    return lines


def smoke_pairs(pairs: Any, data: Path, recipe: Mapping[str, Any]) -> Path:
    """Passage/query pairs standing for ``pairs``: its first 100 lines when it is a local file, else pairs made
    from the smoke training collection's train split (or generated)."""
    target = data / "pairs.jsonl"
    if target.exists():
        return target
    path = Path(os.path.expandvars(str(pairs))).expanduser()
    lines: list[str] = []
    if path.is_file():
        with open(path, encoding="utf-8") as handle:
            lines = [line for _, line in zip(range(100), handle) if line.strip()]
    if not lines:
        rng = random.Random(2)
        lines = [json.dumps({"passage": " ".join(_sentences(i, 3, rng)),
                             "queries": [f"what about {_topic(i)[0]} {_topic(i)[1]}", f"{_topic(i)[1]} facts"]}) + "\n"
                 for i in range(40)]
    with atomic_open(target) as handle:
        handle.write("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return target
