"""The fixtures of ``pretrieve run RECIPE --smoke`` (:mod:`pretrieve.recipe.smoke`): tiny random models and small
collections, written at run time so that nothing is downloaded or committed.

* :func:`tiny_model` — a randomly initialised BERT or ELECTRA (2 layers, hidden 32; BERT with an MLM head) with the
  uncased WordPiece vocabulary of the offline all-MiniLM-L6-v2 package, of the family of the model it stands for
  (:func:`model_family`: the checkpoint's ``config.json`` when local or cached, else the name).
* :func:`smoke_collection` — a BEIR collection standing for a recipe's collection: a slice of the local one (its first
  :data:`SLICE_PASSAGES` passages and the queries of each split whose relevant passages are among them) when that
  gives enough queries, else :func:`write_fixture_collection`, a synthetic collection whose queries share a topic
  with their one relevant passage (BM25 and training have signal).
* :func:`smoke_text_corpus` and :func:`smoke_pairs` — a pre-training corpus (one passage per line) and
  passage/query pairs: the first lines of a local source, else generated text.

Also used by ``pretrieve bench quality`` (:mod:`pretrieve.bench.quality.settings`) for its synthetic cells.
"""

from __future__ import annotations

import json
import logging
import os
import random
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

logger = logging.getLogger(__name__)

SLICE_PASSAGES = 300
MIN_TRAIN_QUERIES, MIN_EVAL_QUERIES = 8, 2
MAX_TRAIN_QUERIES, MAX_EVAL_QUERIES = 24, 8
FAMILIES = ("bert", "electra")


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
