"""Seeded splits of a collection's judged queries into named parts, as a derived collection directory.

Cross-fitting (``pretrieve bench quality --folds train:test,test:train``) and a held-out dev set
(``--dev-queries N``; issue 21's recipe dev split) need the judged queries of a split cut into parts that never
overlap. :func:`derive_collection` writes them as an ordinary collection in BEIR layout that every command reads:

* ``corpus.jsonl`` and ``queries.jsonl`` are symbolic links to the source collection's files (nothing is copied;
  the source's name of a gzipped file is kept);
* ``qrels/<split>.tsv`` for every split of the source: the split that is carved keeps what the parts do not take,
  the others are the source's judgments as they are;
* ``qrels/<part>.tsv`` for every part (``dev``: ``N`` queries of the carved split, drawn by :func:`carve_queries`);
* ``folds.json``: the record — the source, the carved split, the seed, and each part's and split's query ids.

The directory is an artefact of :mod:`pretrieve.artifacts` (written atomically, sidecar ``artifact.json``, settings
= the carved split, the parts' sizes and the seed; inputs = the source's corpus, queries and qrels by content): it
is rebuilt when any of those changed and otherwise reused as it is.

Drawing (:func:`carve_queries`): the judged query ids, sorted, are permuted by ``numpy.random.default_rng(seed)``;
the parts take consecutive slices of that permutation in the order they are given, the rest stays in the split.
The same ids, sizes and seed always give the same parts, whatever the qrels file's line order.

**Held-out dev queries** (:func:`held_out_dev`, the one rule for every command that holds dev queries out of
training — the recipe's ``dev:``, ``pretrieve bench quality --dev-queries``): a collection that ships its own
``dev`` split (MS MARCO, FiQA, HotpotQA, NFCorpus, FEVER, …) keeps it as the held-out dev — it is disjoint from
``train`` by construction, and its name is taken — so the dev queries are a seeded draw of at most ``N`` of its
queries (:func:`carve_queries` with the seed; all of them when it has ``N`` or fewer; any query also judged in the
training split is left out), written as the derived collection's ``dev`` split while ``train`` stays whole. A
collection without a ``dev`` split has ``N`` queries carved out of ``train`` by :func:`derive_collection`, exactly
as before. Either way the result is a derived collection (nothing is written into the source's directory) whose
``dev`` split holds the dev queries and whose ``folds.json`` records them.

:func:`halves` (``pretrieve data halves``) writes the two collections of a split's judged queries cut in seeded
halves both ways (train on one half, test on the other), e.g. for a collection that has only test queries.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pretrieve import artifacts
from pretrieve.data.beir import save_qrels
from pretrieve.data.collection import BeirCollection
from pretrieve.errors import ConfigError
from pretrieve.io_utils import write_json

KIND = "derived-collection"
RECORD = "folds.json"
DEV = "dev"
"""The name of the held-out dev split (:func:`held_out_dev`)."""


def carve_queries(query_ids: Sequence[str], sizes: Mapping[str, int], seed: int) -> dict[str, list[str]]:
    """``{part: ids}`` of ``sizes`` (``{"dev": 100}``), drawn without replacement (module docstring); each part's
    ids in sorted order."""
    ids = sorted(set(query_ids))
    wanted = sum(int(n) for n in sizes.values())
    if any(int(n) < 0 for n in sizes.values()) or wanted > len(ids):
        raise ConfigError(f"cannot carve parts of sizes {dict(sizes)} out of {len(ids)} judged queries")
    order = np.random.default_rng(seed).permutation(len(ids))
    parts, start = {}, 0
    for name, size in sizes.items():
        parts[name] = sorted(ids[i] for i in order[start:start + int(size)])
        start += int(size)
    return parts


def derive_collection(source: str | Path, out: str | Path, carve_from: str = "train",
                      parts: Mapping[str, int] | None = None, seed: int = 0, rest: str | None = None) -> Path:
    """The derived collection ``out`` (module docstring), written unless current; returns ``out``. ``rest``: the
    name of what the carved split keeps (default: its own name; another name frees it for a part, as
    :func:`halves` does)."""
    source_collection = BeirCollection(Path(source))
    parts = {str(name): int(size) for name, size in (parts or {}).items()}
    rest = rest or carve_from
    splits = source_collection.splits()
    occupied = set(splits) - {carve_from} if rest != carve_from else set(splits)   # names the result already has
    clash = sorted((set(parts) | ({rest} if rest != carve_from else set())) & occupied | set(parts) & {rest})
    if carve_from not in splits:
        raise ConfigError(f"collection {source} has no '{carve_from}' split to carve (has: {', '.join(splits)})")
    if clash:
        raise ConfigError(f"part name(s) {', '.join(clash)} are already splits of {source}")
    out = Path(out)
    settings = {"carve_from": carve_from, "parts": parts, "seed": int(seed),
                **({"rest": rest} if rest != carve_from else {})}
    inputs = {"corpus": source_collection.corpus_path, "queries": source_collection.queries_path,
              **{f"qrels:{split}": source_collection.qrels_path(split) for split in splits}}
    if artifacts.is_current(out, settings, inputs, kind=KIND):
        return out
    qrels = {split: source_collection.load_qrels(split) for split in splits}
    carved = carve_queries(list(qrels[carve_from]), parts, seed)
    whole = qrels[carve_from]
    taken = {qid for ids in carved.values() for qid in ids}
    del qrels[carve_from]
    qrels[rest] = {qid: docs for qid, docs in whole.items() if qid not in taken}
    if not qrels[rest]:
        raise ConfigError(f"carving {parts} leaves no query in the '{carve_from}' split of {source}")
    for name, ids in carved.items():
        qrels[name] = {qid: whole[qid] for qid in ids}
    return _write_derived(out, source, source_collection, qrels, settings, inputs)


def has_own_dev(source: str | Path, train: str = "train") -> bool:
    """Whether the collection ships its own ``dev`` split (other than the training split ``train``): then
    :func:`held_out_dev` draws the dev queries from it instead of carving them out of ``train``."""
    return train != DEV and DEV in BeirCollection(Path(source)).splits()


def held_out_dev(source: str | Path, out: str | Path, size: int, seed: int = 0, train: str = "train") -> Path:
    """The derived collection ``out`` whose ``dev`` split holds ``size`` held-out dev queries by the rule of the
    module docstring; written unless current; returns ``out``.

    Without an own ``dev`` split (:func:`has_own_dev`) this is ``derive_collection(source, out, carve_from=train,
    parts={"dev": size} if size else {}, seed=seed)``, unchanged. With one, ``train`` and every other split are kept
    as they are and ``dev`` becomes a seeded draw of at most ``size`` of the own dev queries that are not judged in
    ``train`` (``size`` 0: the own split as it is); ``folds.json`` records ``dev_from``, ``of`` (the own split's
    size), the queries left out as also in ``train`` and every split's query ids."""
    size = int(size)
    if size < 0:
        raise ConfigError(f"cannot hold out {size} dev queries")
    if not has_own_dev(source, train):
        return derive_collection(source, out, carve_from=train, parts={DEV: size} if size else {}, seed=seed)
    source_collection = BeirCollection(Path(source))
    splits = source_collection.splits()
    if train not in splits:
        raise ConfigError(f"collection {source} has no '{train}' split to train on (has: {', '.join(splits)})")
    out = Path(out)
    settings = {"dev_from": DEV, "dev": size, "seed": int(seed), "train": train}
    inputs = {"corpus": source_collection.corpus_path, "queries": source_collection.queries_path,
              **{f"qrels:{split}": source_collection.qrels_path(split) for split in splits}}
    if artifacts.is_current(out, settings, inputs, kind=KIND):
        return out
    qrels = {split: source_collection.load_qrels(split) for split in splits}
    own = qrels[DEV]
    also_trained = sorted(set(own) & set(qrels[train]))
    candidates = [qid for qid in own if qid not in set(also_trained)]
    if not candidates:
        raise ConfigError(f"the '{DEV}' split of {source} has no judged query that is not also in its '{train}' "
                          f"split ({len(own)} judged)")
    drawn = carve_queries(candidates, {DEV: min(size, len(candidates)) if size else len(candidates)}, seed)[DEV]
    qrels[DEV] = {qid: own[qid] for qid in drawn}
    return _write_derived(out, source, source_collection, qrels, settings, inputs,
                          {"of": len(own), "also_in_train": also_trained})


def _write_derived(out: Path, source: str | Path, source_collection: BeirCollection, qrels: dict,
                   settings: dict, inputs: dict, extra: dict | None = None) -> Path:
    """Write a derived collection (atomically, with its artefact sidecar): the source's corpus and queries linked,
    each non-empty split's qrels, and ``folds.json`` (the settings, ``extra`` and every split's query ids)."""
    with artifacts.write_dir(out, KIND, settings, inputs) as tmp:
        for path in (source_collection.corpus_path, source_collection.queries_path):
            os.symlink(path.resolve(), tmp / path.name)
        (tmp / "qrels").mkdir()
        for split, judgments in qrels.items():
            if judgments:
                save_qrels(judgments, tmp / "qrels" / f"{split}.tsv")
        write_json(tmp / RECORD, {"source": str(Path(source).resolve()), **settings, **(extra or {}),
                                  "queries": {split: list(judgments) for split, judgments in qrels.items()}})
    return out


def halves(source: str | Path, out_dir: str | Path, split: str = "test", seed: int = 0) -> tuple[Path, Path]:
    """Two derived collections ``<out_dir>/<name>-a`` and ``<name>-b`` that split ``split``'s judged queries into
    seeded halves both ways (docs/preregistration.md, section B: Cranfield's 225 judged queries): ``-a`` trains on
    the first half (its ``train`` split) and tests on the other (``test``), ``-b`` the reverse. The first half is
    :func:`carve_queries`'s draw of ``n // 2`` queries with ``seed``; both collections draw the same."""
    source = Path(source)
    n = len(BeirCollection(source).load_qrels(split))
    if n < 2:
        raise ConfigError(f"the '{split}' split of {source} has {n} judged queries: too few to halve")
    out_dir = Path(out_dir)
    first = derive_collection(source, out_dir / f"{source.name}-a", carve_from=split, parts={"train": n // 2},
                              seed=seed, rest="test")
    second = derive_collection(source, out_dir / f"{source.name}-b", carve_from=split, parts={"test": n // 2},
                               seed=seed, rest="train")
    return first, second


def split_queries(collection: str | Path, split: str) -> set[str]:
    """The judged query ids of one split of a collection."""
    return set(BeirCollection(Path(collection)).load_qrels(split))
