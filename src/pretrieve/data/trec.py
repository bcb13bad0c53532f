"""TREC run files: ``qid Q0 docid rank score tag``, one line per retrieved document.

A run in memory is ``{query_id: {doc_id: score}}``. Writing sorts each query's documents by
descending score (ties keep the order given), writes each score with ``repr`` so that reading it back
gives the identical float (rounding could create ties that trec_eval breaks by doc id), refuses ids
that the whitespace-separated format cannot hold and NaN scores, and is atomic; reading validates
every line and reports the file, line and field of the first malformed one. :class:`RunWriter` writes a run
query by query as a search produces it (a stream: no run of all queries in memory).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import IO, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pretrieve.data.jsonl import iter_lines
from pretrieve.data.records import is_run_id
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open

Run = dict[str, dict[str, float]]

_FIELDS = ("query_id", "Q0", "doc_id", "rank", "score", "tag")


#: Characters of a score in a run file at least (``repr`` of a float: 15-18 for the scores of every retriever, 3 for
#: a round one such as ``0.0``): what the estimate of a run's size counts.
SCORE_CHARS = 8


def run_bytes(query_ids: Iterable[str], k: int, docs: int, tag: str) -> int:
    """What a run of the ``query_ids`` × ``min(k, docs)`` lines ``qid Q0 docid rank score tag`` takes: the query
    ids, the ranks and the tag as written; a document id of one character and a score of :data:`SCORE_CHARS` (the
    least), so a run that fits is not refused while the estimate stays near the file (SciFact: 7.8 of 12.6 MB)."""
    depth = min(k, docs)
    rank_chars = sum(max(0, depth - 10 ** (digits - 1) + 1) for digits in range(1, 20))   # of "1" … str(depth)
    fixed = len(" Q0 ") + 1 + 1 + 1 + SCORE_CHARS + 1 + len(tag) + 1   # spaces, a 1-char id, score, tag, newline
    return sum(depth * (len(qid) + fixed) + rank_chars for qid in query_ids)


def read_run(path: str | Path) -> Run:
    """Read a TREC run file; malformed lines raise :class:`InputError`."""
    run: Run = {}
    for line_no, qid, doc_id, value in _iter_run_lines(path):
        docs = run.setdefault(qid, {})
        if doc_id in docs:
            raise InputError(f"document '{doc_id}' retrieved twice for query '{qid}'", path=path,
                             line=line_no, field="doc_id")
        docs[doc_id] = value
    if not run:
        raise InputError("run file is empty", path=path)
    return run


def iter_run(path: str | Path) -> Iterator[tuple[str, dict[str, float]]]:
    """Stream ``(query_id, {doc_id: score})`` one query at a time, for runs of any size.

    The lines of a query must be contiguous (as every TREC run writer, this one included, writes them); a
    query whose lines are split is an :class:`InputError`, as are the problems :func:`read_run` reports.
    """
    seen: set[str] = set()
    qid: str | None = None
    docs: dict[str, float] = {}
    for line_no, line_qid, doc_id, value in _iter_run_lines(path):
        if line_qid != qid:
            if qid is not None:
                yield qid, docs
            if line_qid in seen:
                raise InputError(f"the lines of query '{line_qid}' are not contiguous (sort the run by query to "
                                 "stream it)", path=path, line=line_no, field="query_id")
            seen.add(line_qid)
            qid, docs = line_qid, {}
        if doc_id in docs:
            raise InputError(f"document '{doc_id}' retrieved twice for query '{qid}'", path=path,
                             line=line_no, field="doc_id")
        docs[doc_id] = value
    if qid is None:
        raise InputError("run file is empty", path=path)
    yield qid, docs


def _iter_run_lines(path: str | Path) -> Iterator[tuple[int, str, str, float]]:
    """``(line_number, query_id, doc_id, score)`` of every non-blank line, validated."""
    for line_no, line in iter_lines(path):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise InputError(f"expected 6 columns ({' '.join(_FIELDS)}), got {len(parts)}",
                             path=path, line=line_no)
        qid, _, doc_id, rank, score, _tag = parts
        if not _is_int(rank):
            raise InputError(f"rank '{rank}' is not an integer", path=path, line=line_no, field="rank")
        try:
            value = float(score)
        except ValueError:
            raise InputError(f"score '{score}' is not a number", path=path, line=line_no,
                             field="score") from None
        if not math.isfinite(value):
            problem = "NaN" if math.isnan(value) else f"{score}: scores must be finite numbers"
            raise InputError(f"score is {problem}", path=path, line=line_no, field="score")
        yield line_no, qid, doc_id, value


def write_run(run: Run, path: str | Path, tag: str = "pretrieve", depth: int | None = None) -> None:
    """Write a run sorted by descending score per query (stable for ties), atomically.

    Scores are written exactly (``repr``); an id that is empty or contains whitespace, a tag with
    whitespace and a NaN score raise :class:`InputError` (the file would not read back).
    """
    with open_run_writer(path, tag=tag, depth=depth) as writer:
        for qid, docs in run.items():
            writer.write(qid, docs)


def run_lines(run: Run, path: str | Path, tag: str = "pretrieve", depth: int | None = None) -> Iterator[str]:
    """The TREC lines of ``run`` (see :func:`write_run`); a stream of runs writes them block by block."""
    _check_trec_token(tag, "tag", path)
    for qid, docs in run.items():
        yield from query_lines(qid, docs, path, tag, depth)


def query_lines(qid: str, docs: Mapping[str, float] | Iterable[tuple[str, float]], path: str | Path,
                tag: str = "pretrieve", depth: int | None = None) -> list[str]:
    """One query's TREC lines: documents by descending score (stable for ties), cut to ``depth``, checked."""
    _check_trec_token(qid, "query_id", path)
    items = docs.items() if isinstance(docs, Mapping) else docs
    ranked = sorted(items, key=lambda item: -item[1])
    if depth is not None:
        ranked = ranked[:depth]
    lines = []
    for rank, (doc_id, score) in enumerate(ranked, start=1):
        _check_trec_token(doc_id, "doc_id", path)
        value = float(score)
        if not math.isfinite(value):
            raise InputError(f"score of document '{doc_id}' for query '{qid}' is {value} (scores must be finite)",
                             path=path, field="score")
        lines.append(f"{qid} Q0 {doc_id} {rank} {value!r} {tag}\n")
    return lines


class RunWriter:
    """Writes a TREC run one query at a time, so a run of any size is never held in memory.

    Each query's lines are :func:`query_lines`; a query written twice is an :class:`InputError`. ``path`` only
    names the file in error messages; :func:`open_run_writer` gives a writer whose file appears atomically.
    """

    def __init__(self, handle: IO[str], path: str | Path, tag: str = "pretrieve", depth: int | None = None):
        _check_trec_token(tag, "tag", path)
        self.handle = handle
        self.path = path
        self.tag = tag
        self.depth = depth
        self.queries = 0
        self.lines = 0
        self._seen: set[str] = set()

    def write(self, qid: str, docs: Mapping[str, float] | Iterable[tuple[str, float]]) -> int:
        """Append one query's ranking (``{doc_id: score}`` or ``(doc_id, score)`` pairs); returns its line count."""
        if qid in self._seen:
            raise InputError(f"query '{qid}' written twice", path=self.path, field="query_id")
        lines = query_lines(qid, docs, self.path, self.tag, self.depth)
        self._seen.add(qid)
        self.handle.write("".join(lines))
        self.queries += 1
        self.lines += len(lines)
        return len(lines)


@contextlib.contextmanager
def open_run_writer(path: str | Path, tag: str = "pretrieve", depth: int | None = None) -> Iterator[RunWriter]:
    """A :class:`RunWriter` on a temporary file that replaces ``path`` only when the block succeeds."""
    with atomic_open(path) as handle:
        yield RunWriter(handle, path, tag=tag, depth=depth)


def _check_trec_token(value: str, field: str, path: str | Path) -> None:
    if not is_run_id(value):
        raise InputError(f"{value!r} cannot be written to a TREC run (empty or contains whitespace)",
                         path=path, field=field)


def run_from_arrays(query_ids: Sequence[str], doc_ids: Sequence[str], indices: np.ndarray,
                    scores: np.ndarray) -> Run:
    """Build a run from search results: ``indices[q, k]`` rows into ``doc_ids`` (−1 = no result)."""
    run: Run = {}
    for q, qid in enumerate(query_ids):
        docs: dict[str, float] = {}
        for idx, score in zip(indices[q].tolist(), scores[q].tolist()):
            if idx >= 0:
                docs[doc_ids[idx]] = float(score)
        run[qid] = docs
    return run


def top_k(run: Run, k: int) -> Run:
    """Keep the ``k`` highest-scoring documents of each query."""
    return {qid: dict(sorted(docs.items(), key=lambda item: -item[1])[:k]) for qid, docs in run.items()}


def ranked_ids(run: Run, qid: str) -> list[str]:
    """Document ids of one query in rank order."""
    return [doc_id for doc_id, _ in sorted(run.get(qid, {}).items(), key=lambda item: -item[1])]


def merge_runs(runs: Iterable[Run], depth: int | None = None) -> Run:
    """Union of runs over disjoint document shards, re-ranked (and cut to ``depth``) per query."""
    merged: Run = {}
    for run in runs:
        for qid, docs in run.items():
            merged.setdefault(qid, {}).update(docs)
    return top_k(merged, depth) if depth is not None else merged


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True
