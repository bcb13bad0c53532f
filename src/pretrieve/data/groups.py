"""Training groups for retriever fine-tuning: one query with its positive and negative document ids.

File format (JSONL, one group per line)::

    {"query_id": "q1", "query": "what is ...", "positives": ["d3"], "negatives": ["d7", "d2", ...],
     "positive_scores": [9.1], "negative_scores": [3.2, 1.0, ...]}

``positive_scores`` / ``negative_scores`` are optional teacher (cross-encoder) scores, one per id and in
the same order. Ids refer to a corpus; ids given as JSON integers are read as strings.

This module owns reading, validating, writing, sampling and building groups:

* :func:`read_groups` / :func:`iter_groups` stream a file (:func:`pretrieve.data.arrow.groups_dataset` reads it
  into a memory-mapped Arrow dataset with the same checks, for training at scale). Malformed input is an
  :class:`~pretrieve.errors.InputError` naming file, line and field: bad JSON, a missing field, a wrong
  type, an empty id, an id listed twice in one list, a score list whose length differs from its id
  list, a non-finite score. Softer problems are counted in :class:`GroupStats` and logged once:
  a group with no positives is skipped (it cannot be trained on); a document listed both as positive and
  negative is removed from the negatives (a positive is never a negative). Document ids missing from
  the corpus (when one is given) are an error by default — a wrong corpus is the usual cause, and
  silently training on fewer negatives would hide it; ``on_unknown="skip"`` drops them and counts them.
* :func:`sample_group` draws (one positive, N negatives) per training step as Tevatron does: positive
  uniformly at random, negatives without replacement; with fewer than N negatives the shuffled list is
  cycled (see the function for how this differs from Tevatron).
* :func:`groups_from_run` builds groups from a retrieval run: stage 1 uses BM25's top-K, stage 2 the
  top-K mined by the stage-1 dense retriever (CDMAE's fine-tuning: K₁ = 1000, K₂ = K₃ = 200), minus judged
  relevant documents, with optional teacher scores from a reranker run (stage 3).
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Collection, Container, Iterable, Iterator, Literal, Mapping, Sequence, Union

import numpy as np

from pretrieve.data.beir import Corpus
from pretrieve.data.jsonl import iter_jsonl, require_str, write_jsonl
from pretrieve.data.trec import Run, ranked_ids
from pretrieve.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]
OnUnknown = Literal["error", "skip"]
Rng = Union[random.Random, np.random.Generator]


@dataclass
class TrainingGroup:
    """A query with its positive and negative document ids (and optional teacher scores)."""

    query_id: str
    query: str
    positives: list[str]
    negatives: list[str]
    positive_scores: list[float] | None = None
    negative_scores: list[float] | None = None

    def __post_init__(self) -> None:
        for ids, scores, name in ((self.positives, self.positive_scores, "positive"),
                                  (self.negatives, self.negative_scores, "negative")):
            if scores is not None and len(scores) != len(ids):
                raise ValueError(f"query '{self.query_id}': {len(scores)} {name} scores for {len(ids)} "
                                 f"{name} ids")

    @property
    def has_scores(self) -> bool:
        """Whether both teacher score lists are present (needed for distillation)."""
        return self.positive_scores is not None and self.negative_scores is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSONL row of this group; absent score lists are left out."""
        row: dict[str, Any] = {"query_id": self.query_id, "query": self.query, "positives": self.positives,
                               "negatives": self.negatives}
        if self.positive_scores is not None:
            row["positive_scores"] = self.positive_scores
        if self.negative_scores is not None:
            row["negative_scores"] = self.negative_scores
        return row


@dataclass
class GroupStats:
    """What reading or building groups kept, skipped and dropped (each group counted once)."""

    seen: int = 0
    kept: int = 0
    skipped_no_positives: int = 0
    skipped_no_negatives: int = 0
    skipped_unknown_query: int = 0
    skipped_not_in_run: int = 0
    unknown_ids_dropped: int = 0
    negatives_dropped_as_positive: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def add(self, other: "GroupStats") -> "GroupStats":
        """Add ``other``'s counts to these (e.g. the parts of several ranks); returns self."""
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    @classmethod
    def total(cls, parts: Iterable["GroupStats"]) -> "GroupStats":
        """The counts of several parts (e.g. the slices of several ranks) added up."""
        stats = cls()
        for part in parts:
            stats.add(part)
        return stats

    def problems(self) -> dict[str, int]:
        """The non-zero counts other than ``seen`` and ``kept``."""
        return {k: v for k, v in self.as_dict().items() if v and k not in ("seen", "kept")}


@dataclass
class GroupSet:
    """Groups in file (or qrels) order, with the statistics of how they were obtained."""

    groups: list[TrainingGroup]
    stats: GroupStats = field(default_factory=GroupStats)
    path: str | None = None

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator[TrainingGroup]:
        return iter(self.groups)

    def __getitem__(self, index: int) -> TrainingGroup:
        return self.groups[index]

    def doc_ids(self) -> set[str]:
        """Every document id any group refers to (what an encoder must embed for training)."""
        return {d for g in self.groups for d in (*g.positives, *g.negatives)}


# --------------------------------------------------------------------------------------------- reading

def read_groups(path: str | Path, corpus: Container[str] | None = None,
                on_unknown: OnUnknown = "error") -> GroupSet:
    """Read and validate a training-groups JSONL file (see the module docstring for the rules).

    ``corpus`` is anything supporting ``in`` over document ids (a :class:`~pretrieve.data.beir.Corpus`,
    a set). An empty result (no usable group) is an :class:`InputError`.
    """
    stats = GroupStats()
    groups = list(iter_groups(path, corpus=corpus, on_unknown=on_unknown, stats=stats))
    log_problems(str(path), stats)
    if not groups:
        raise InputError(f"no usable training group ({stats.seen} read, {stats.skipped_no_positives} without "
                         "positives)", path=path)
    return GroupSet(groups, stats, path=str(path))


def iter_groups(path: str | Path, corpus: Container[str] | None = None, on_unknown: OnUnknown = "error",
                stats: GroupStats | None = None) -> Iterator[TrainingGroup]:
    """Stream validated groups from a JSONL file, updating ``stats`` (if given) as it goes."""
    if on_unknown not in ("error", "skip"):
        raise ConfigError(f"on_unknown must be 'error' or 'skip', got {on_unknown!r}")
    stats = stats if stats is not None else GroupStats()
    shared_ids: dict[str, str] = {}  # one str object per distinct id: hard negatives repeat across groups
    for line_no, obj in iter_jsonl(path):
        stats.seen += 1
        group = parse_group(obj, path, line_no, shared_ids)
        if corpus is not None:
            group = check_known(group, corpus, on_unknown, stats, path, line_no)
        group = drop_positive_negatives(group, stats)
        if not group.positives:
            stats.skipped_no_positives += 1
            continue
        stats.kept += 1
        yield group


def parse_group(obj: dict[str, Any], path: str | Path, line: int, shared_ids: dict[str, str]) -> TrainingGroup:
    """One JSONL object as a validated group (ids shared through ``shared_ids``); no corpus check."""
    query_id = require_str(obj, "query_id", path, line, allow_empty=False)
    query = require_str(obj, "query", path, line, allow_empty=False)
    positives = _id_list(obj, "positives", path, line, shared_ids)
    negatives = _id_list(obj, "negatives", path, line, shared_ids)
    positive_scores = _score_list(obj, "positive_scores", len(positives), "positives", path, line)
    negative_scores = _score_list(obj, "negative_scores", len(negatives), "negatives", path, line)
    return TrainingGroup(query_id, query, positives, negatives, positive_scores, negative_scores)


def _id_list(obj: dict[str, Any], name: str, path: str | Path, line: int, shared_ids: dict[str, str]) -> list[str]:
    """A list of non-empty document ids without repeats (each id object shared through ``shared_ids``).

    Valid lists take a fast path of C-level checks; only a list that fails one is walked item by item
    to locate the problem.
    """
    if name not in obj or obj[name] is None:
        raise InputError("missing required field", path=path, line=line, field=name)
    value = obj[name]
    if not isinstance(value, list):
        raise InputError(f"expected a list of document ids, got {type(value).__name__}", path=path, line=line,
                         field=name)
    if set(map(type, value)) <= {str}:
        unique = set(value)
        if len(unique) == len(value) and "" not in unique and not any(map(str.isspace, unique)):
            return list(map(shared_ids.setdefault, value, value))
    ids: list[str] = []
    position: dict[str, int] = {}
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise InputError(f"expected a document id (string), got {type(item).__name__}", path=path,
                             line=line, field=f"{name}[{i}]")
        doc_id = str(item)
        if not doc_id.strip():
            raise InputError("empty document id", path=path, line=line, field=f"{name}[{i}]")
        if doc_id in position:
            raise InputError(f"document id '{doc_id}' listed twice (positions {position[doc_id]} and {i})",
                             path=path, line=line, field=f"{name}[{i}]")
        position[doc_id] = i
        ids.append(shared_ids.setdefault(doc_id, doc_id))
    return ids


def _score_list(obj: dict[str, Any], name: str, expected: int, ids_name: str, path: str | Path,
                line: int) -> list[float] | None:
    """An optional list of finite numbers, one per id of ``ids_name``."""
    if name not in obj or obj[name] is None:
        return None
    value = obj[name]
    if not isinstance(value, list):
        raise InputError(f"expected a list of numbers, got {type(value).__name__}", path=path, line=line,
                         field=name)
    if len(value) != expected:
        raise InputError(f"has {len(value)} scores but '{ids_name}' has {expected} ids", path=path, line=line,
                         field=name)
    if set(map(type, value)) <= {float, int} and all(map(math.isfinite, value)):
        return list(map(float, value))
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise InputError(f"expected a number, got {type(item).__name__}", path=path, line=line,
                             field=f"{name}[{i}]")
        if not math.isfinite(item):
            raise InputError(f"score {item} is not finite", path=path, line=line, field=f"{name}[{i}]")
    raise AssertionError("unreachable: the fast check failed but no item is invalid")


def check_known(group: TrainingGroup, corpus: Container[str], on_unknown: OnUnknown, stats: GroupStats,
                 path: str | Path, line: int) -> TrainingGroup:
    """Raise on (or drop and count) ids the corpus does not have."""
    if hasattr(corpus, "missing"):   # an Arrow corpus (pretrieve.data.arrow): one batched lookup per group
        absent = corpus.missing([*group.positives, *group.negatives])
        if not absent:
            return group
        known: Container[str] = _Except(absent)
    else:
        known = _membership(corpus)
        if all(map(known.__contains__, group.positives)) and all(map(known.__contains__, group.negatives)):
            return group
    kept: dict[str, tuple[list[str], list[float] | None]] = {}
    for name, ids, scores in (("positives", group.positives, group.positive_scores),
                              ("negatives", group.negatives, group.negative_scores)):
        keep = [i for i, doc_id in enumerate(ids) if doc_id in known]
        if len(keep) < len(ids):
            missing = next(i for i, doc_id in enumerate(ids) if doc_id not in known)
            if on_unknown == "error":
                raise InputError(f"unknown document id '{ids[missing]}' (not in the corpus; pass "
                                 "on_unknown='skip' to drop unknown ids)", path=path, line=line,
                                 field=f"{name}[{missing}]")
            stats.unknown_ids_dropped += len(ids) - len(keep)
        kept[name] = ([ids[i] for i in keep], None if scores is None else [scores[i] for i in keep])
    return TrainingGroup(group.query_id, group.query, kept["positives"][0], kept["negatives"][0],
                         kept["positives"][1], kept["negatives"][1])


class _Except:
    """Every id but the given ones (the ids of one group an Arrow corpus does not have)."""

    def __init__(self, absent: set[str]):
        self.absent = absent

    def __contains__(self, doc_id: object) -> bool:
        return doc_id not in self.absent


def _membership(corpus: Container[str]) -> Container[str]:
    """A container with a C-level ``__contains__``: a Corpus's id→row dict rather than its Python method."""
    return corpus._row if isinstance(corpus, Corpus) else corpus


def drop_positive_negatives(group: TrainingGroup, stats: GroupStats) -> TrainingGroup:
    """Remove negatives that are also positives of the same group (counted)."""
    positives = set(group.positives)
    if positives.isdisjoint(group.negatives):
        return group
    keep = [i for i, doc_id in enumerate(group.negatives) if doc_id not in positives]
    stats.negatives_dropped_as_positive += len(group.negatives) - len(keep)
    scores = group.negative_scores
    return TrainingGroup(group.query_id, group.query, group.positives, [group.negatives[i] for i in keep],
                         group.positive_scores, None if scores is None else [scores[i] for i in keep])


def log_problems(source: str, stats: GroupStats) -> None:
    problems = stats.problems()
    if problems:
        details = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in problems.items())
        logger.warning("%s: kept %d of %d training groups (%s)", source, stats.kept, stats.seen, details)


# --------------------------------------------------------------------------------------------- writing

def write_groups(groups: Iterable[TrainingGroup], path: str | Path) -> int:
    """Write groups as JSONL, atomically; returns how many were written."""
    return write_jsonl(path, (group.to_dict() for group in groups))


# -------------------------------------------------------------------------------------------- sampling

def sample_group(group: TrainingGroup, num_negatives: int, rng: Rng) -> tuple[str, list[str]]:
    """Draw one positive and ``num_negatives`` negative ids for one training step.

    See :func:`sample_group_indices` for the sampling rule; ``rng`` is a ``random.Random`` or a numpy
    ``Generator`` (the same seed gives the same sample).
    """
    pos, negs = sample_group_indices(group, num_negatives, rng)
    return group.positives[pos], [group.negatives[i] for i in negs]


def sample_group_indices(group: TrainingGroup, num_negatives: int, rng: Rng) -> tuple[int, list[int]]:
    """Indices into ``group.positives`` / ``group.negatives`` of one training sample.

    Follows Tevatron's ``TrainDataset``: the positive is one of the positives (uniformly at random
    here; Tevatron rotates through them by epoch), and when there are at least ``num_negatives``
    negatives they are drawn without replacement. With fewer, Tevatron draws with replacement
    (``random.choices``); here the negatives are shuffled and the list is cycled, so every negative is
    used and each appears ⌊N/n⌋ or ⌈N/n⌉ times — the same expected composition with less variance.
    A group without negatives is an error unless ``num_negatives`` is 0 (in-batch negatives only).
    Use the indices to pick teacher scores for distillation.
    """
    if num_negatives < 0:
        raise ConfigError(f"num_negatives must be >= 0, got {num_negatives}")
    if not group.positives:
        raise InputError(f"training group of query '{group.query_id}' has no positives", field="positives")
    positive = _randbelow(rng, len(group.positives))
    available = len(group.negatives)
    if num_negatives == 0:
        return positive, []
    if available == 0:
        raise InputError(f"training group of query '{group.query_id}' has no negatives but {num_negatives} "
                         "are needed per group", field="negatives")
    if available >= num_negatives:
        return positive, _sample_without_replacement(rng, available, num_negatives)
    order = _sample_without_replacement(rng, available, available)
    repeats = -(-num_negatives // available)
    return positive, (order * repeats)[:num_negatives]


def group_rng(seed: int, epoch: int, index: int) -> random.Random:
    """A generator for sampling group ``index`` in ``epoch``, independent of data-loader worker order.

    Like Tevatron's per-item ``hash(item + seed)`` seeding, but mixing in the epoch so each epoch
    draws a fresh sample; string seeding is stable across Python versions and processes.
    """
    return random.Random(f"pretrieve-group:{seed}:{epoch}:{index}")


def _randbelow(rng: Rng, n: int) -> int:
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(n))
    return rng.randrange(n)


def _sample_without_replacement(rng: Rng, n: int, k: int) -> list[int]:
    if isinstance(rng, np.random.Generator):
        return rng.choice(n, size=k, replace=False).tolist()
    return rng.sample(range(n), k)


# ------------------------------------------------------------------------------------ building from runs

def groups_from_run(run: Run, qrels: Qrels, queries: Mapping[str, str], depth: int,
                    num_negatives_pool: int | None = None, exclude_positives: bool = True,
                    scores_from_run: Run | None = None, min_negatives: int = 1) -> GroupSet:
    """Build training groups from a retrieval run (hard-negative mining).

    For each query of ``qrels`` (in qrels order): positives are its documents with grade ≥ 1;
    negatives are the run's top-``depth`` documents (by descending score, ties in run order) minus
    every judged-relevant document (``exclude_positives=True``; with ``False`` the list is kept as
    retrieved, e.g. to score all candidates — :func:`read_groups` drops such overlaps when reading back),
    in rank order, cut to the first ``num_negatives_pool`` (``None``: all). Judged non-relevant
    (grade ≤ 0) documents stay negatives. Queries without positives, without text in ``queries``,
    absent from the run or left with fewer than ``min_negatives`` negatives are skipped and counted.

    ``scores_from_run`` (a reranker's run over the positives and candidates) adds teacher scores for
    every positive and negative; a missing score is an :class:`InputError` naming query and document.
    """
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    if num_negatives_pool is not None and num_negatives_pool < 0:
        raise ConfigError(f"num_negatives_pool must be >= 0, got {num_negatives_pool}")
    stats = GroupStats()
    groups: list[TrainingGroup] = []
    for qid, judged in qrels.items():
        if qid in queries and qid not in run and any(grade >= 1 for grade in judged.values()):
            stats.seen += 1
            stats.skipped_not_in_run += 1
            continue
        group = group_from_ranking(qid, queries.get(qid), judged, ranked_ids(run, qid), depth, stats,
                                   num_negatives_pool, exclude_positives, min_negatives)
        if group is None:
            continue
        if scores_from_run is not None:
            group = _with_teacher_scores(group, scores_from_run)
        groups.append(group)
    log_problems("groups_from_run", stats)
    return GroupSet(groups, stats)


def group_from_ranking(qid: str, query: str | None, judged: Mapping[str, int], ranked: Sequence[str], depth: int,
                       stats: GroupStats, num_negatives_pool: int | None = None, exclude_positives: bool = True,
                       min_negatives: int = 1) -> TrainingGroup | None:
    """One query's training group from its ranking (document ids best first), or None when it is skipped.

    The rule of :func:`groups_from_run`, for one query at a time: a miner that streams its search results
    builds and writes each group as its ranking arrives. ``stats`` counts the query as seen and as kept or
    skipped (no positive, no query text, fewer than ``min_negatives`` negatives).
    """
    stats.seen += 1
    relevant = [doc_id for doc_id, grade in judged.items() if grade >= 1]
    if not relevant:
        stats.skipped_no_positives += 1
        return None
    if query is None:
        stats.skipped_unknown_query += 1
        return None
    negatives = _mined_negatives(ranked[:depth], set(relevant) if exclude_positives else set(), num_negatives_pool)
    if len(negatives) < min_negatives:
        stats.skipped_no_negatives += 1
        return None
    stats.kept += 1
    return TrainingGroup(qid, query, relevant, negatives)


def _mined_negatives(ranked: Sequence[str], excluded: Collection[str], pool: int | None) -> list[str]:
    negatives = [doc_id for doc_id in ranked if doc_id not in excluded]
    return negatives if pool is None else negatives[:pool]


def _with_teacher_scores(group: TrainingGroup, teacher: Run) -> TrainingGroup:
    scores = teacher.get(group.query_id)
    if scores is None:
        raise InputError(f"teacher run has no scores for query '{group.query_id}'", field="scores_from_run")

    def lookup(doc_id: str) -> float:
        if doc_id not in scores:
            raise InputError(f"teacher run has no score for document '{doc_id}' of query '{group.query_id}' "
                             "(rerank the positives and the mined candidates)", field="scores_from_run")
        return float(scores[doc_id])

    return TrainingGroup(group.query_id, group.query, group.positives, group.negatives,
                         [lookup(d) for d in group.positives], [lookup(d) for d in group.negatives])
