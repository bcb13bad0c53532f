"""TREC run files: ``qid Q0 docid rank score tag``, one line per retrieved document.

A run in memory is ``{query_id: {doc_id: score}}``. Writing sorts each query's documents by
descending score (ties keep the order given), writes each score with ``repr`` so that reading it back
gives the identical float (rounding could create ties that trec_eval breaks by doc id), refuses ids
that the whitespace-separated format cannot hold and NaN scores, and is atomic; reading validates
every line and reports the file, line and field of the first malformed one.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from pretrieve.data.jsonl import iter_lines
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open

Run = dict[str, dict[str, float]]

_FIELDS = ("query_id", "Q0", "doc_id", "rank", "score", "tag")
_WHITESPACE = re.compile(r"\s")


def read_run(path: str | Path) -> Run:
    """Read a TREC run file; malformed lines raise :class:`InputError`."""
    run: Run = {}
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
        if math.isnan(value):
            raise InputError("score is NaN", path=path, line=line_no, field="score")
        docs = run.setdefault(qid, {})
        if doc_id in docs:
            raise InputError(f"document '{doc_id}' retrieved twice for query '{qid}'", path=path,
                             line=line_no, field="doc_id")
        docs[doc_id] = value
    if not run:
        raise InputError("run file is empty", path=path)
    return run


def write_run(run: Run, path: str | Path, tag: str = "pretrieve", depth: int | None = None) -> None:
    """Write a run sorted by descending score per query (stable for ties), atomically.

    Scores are written exactly (``repr``); an id that is empty or contains whitespace, a tag with
    whitespace and a NaN score raise :class:`InputError` (the file would not read back).
    """
    with atomic_open(path) as handle:
        handle.writelines(run_lines(run, path, tag=tag, depth=depth))


def run_lines(run: Run, path: str | Path, tag: str = "pretrieve", depth: int | None = None) -> Iterator[str]:
    """The TREC lines of ``run`` (see :func:`write_run`); a stream of runs writes them block by block."""
    _check_trec_token(tag, "tag", path)
    for qid, docs in run.items():
        _check_trec_token(qid, "query_id", path)
        ranked = sorted(docs.items(), key=lambda item: -item[1])
        if depth is not None:
            ranked = ranked[:depth]
        for rank, (doc_id, score) in enumerate(ranked, start=1):
            _check_trec_token(doc_id, "doc_id", path)
            value = float(score)
            if math.isnan(value):
                raise InputError(f"score of document '{doc_id}' for query '{qid}' is NaN", path=path,
                                 field="score")
            yield f"{qid} Q0 {doc_id} {rank} {value!r} {tag}\n"


def _check_trec_token(value: str, field: str, path: str | Path) -> None:
    if not value or _WHITESPACE.search(value):
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
