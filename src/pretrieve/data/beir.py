"""BEIR-layout collections: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv`` — or, for open-domain QA
sets judged by answer strings (DPR's NQ, TriviaQA, CuratedTREC), ``answers/<split>.jsonl`` (:func:`load_answers`).

The corpus is held column-wise (``ids``, ``titles``, ``texts`` lists plus one id→row dict), never as a
dict of dicts, and can also be streamed with :func:`iter_corpus` without holding it at all. Each record is
parsed by :mod:`pretrieve.data.records`; a collection directory is :class:`pretrieve.data.collection.BeirCollection`.
Malformed input raises :class:`~pretrieve.errors.InputError` naming file, line and field; qrels
that point at unknown query or document ids are a counted warning, not an error (BEIR itself ships
such qrels), see :func:`check_qrels`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pretrieve.data.jsonl import iter_jsonl, iter_lines, require_str, write_jsonl
from pretrieve.data.records import (Document, duplicate_id_message, is_run_id, join_title, parse_document,
                                    parse_query)
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open

logger = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]


def iter_corpus(path: str | Path) -> Iterator[tuple[int, Document]]:
    """Stream ``(line_number, Document)`` from a ``corpus.jsonl`` (no duplicate check: see Corpus)."""
    for line_no, obj in iter_jsonl(path):
        yield line_no, parse_document(obj, path, line_no)


@dataclass
class Corpus:
    """A corpus held column-wise: ``ids[i]``, ``titles[i]``, ``texts[i]`` describe row ``i``."""

    ids: list[str]
    titles: list[str]
    texts: list[str]
    path: str | None = None
    _row: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self._row:
            self._row = {doc_id: i for i, doc_id in enumerate(self.ids)}

    @classmethod
    def load(cls, path: str | Path) -> "Corpus":
        """Read and validate a ``corpus.jsonl``: duplicate ids and an empty corpus are errors."""
        ids: list[str] = []
        titles: list[str] = []
        texts: list[str] = []
        first_line: dict[str, int] = {}
        for line_no, doc in iter_corpus(path):
            seen = first_line.setdefault(doc.id, line_no)
            if seen != line_no:
                raise InputError(duplicate_id_message("document", doc.id, seen), path=path, line=line_no,
                                 field="_id")
            ids.append(doc.id)
            titles.append(doc.title)
            texts.append(doc.text)
        if not ids:
            raise InputError("corpus is empty (no documents)", path=path)
        return cls(ids, titles, texts, path=str(path), _row=first_line_to_rows(first_line, ids))

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._row

    def row(self, doc_id: str) -> int:
        """Row index of a document id (KeyError if unknown)."""
        return self._row[doc_id]

    def __getitem__(self, doc_id: str) -> Document:
        i = self._row[doc_id]
        return Document(self.ids[i], self.titles[i], self.texts[i])

    def full_text(self, i: int, sep: str = " ") -> str:
        """Title + text of row ``i``."""
        return join_title(self.titles[i], self.texts[i], sep)

    def texts_of(self, ids, sep: str = " ") -> list[str]:
        """Title + text of each document id, in order (KeyError for an unknown id)."""
        return [self.full_text(self._row[doc_id], sep) for doc_id in ids]

    def full_texts(self, sep: str = " ") -> list[str]:
        """Title + text of every row, in row order."""
        return [join_title(t, x, sep) for t, x in zip(self.titles, self.texts)]

    def save(self, path: str | Path) -> None:
        """Write as ``corpus.jsonl`` (atomically)."""
        write_jsonl(path, ({"_id": i, "title": t, "text": x} for i, t, x in zip(self.ids, self.titles, self.texts)))


def first_line_to_rows(first_line: dict[str, int], ids: list[str]) -> dict[str, int]:
    """Turn the id→line map used for duplicate detection into the id→row map, reusing the dict."""
    for row, doc_id in enumerate(ids):
        first_line[doc_id] = row
    return first_line


def load_queries(path: str | Path) -> dict[str, str]:
    """Read ``queries.jsonl`` into ``{query_id: text}``; duplicate ids and empty texts are errors."""
    queries: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line_no, obj in iter_jsonl(path):
        qid, text = parse_query(obj, path, line_no)
        if qid in queries:
            raise InputError(duplicate_id_message("query", qid, lines[qid]), path=path, line=line_no, field="_id")
        queries[qid] = text
        lines[qid] = line_no
    if not queries:
        raise InputError("no queries in file", path=path)
    return queries


def save_queries(queries: dict[str, str], path: str | Path) -> None:
    """Write ``{query_id: text}`` as ``queries.jsonl`` (atomically)."""
    write_jsonl(path, ({"_id": qid, "text": text} for qid, text in queries.items()))


def load_qrels(path: str | Path) -> Qrels:
    """Read relevance judgments: BEIR TSV (``query-id corpus-id score`` with header) or TREC
    (``qid iter docid rel``, whitespace separated). Non-integer grades and wrong column counts are
    located errors. Zero and negative grades are kept (evaluation treats grade ≤ 0 as non-relevant).

    A line containing a tab is split on tabs only, other lines on whitespace; an id that holds whitespace
    all the same is refused (no TREC run can hold it). A (query, document) judged on several lines is
    warned about with their line numbers, and the last line counts, as in trec_eval. Only a first line that
    names its columns (``query-id``, ``qid``, ... or ``score``, ``relevance``, ...) is taken as a header: any
    other non-integer grade is an error.
    """
    qrels: Qrels = {}
    lines: dict[tuple[str, str], int] = {}
    duplicates: list[tuple[int, int, str, str, int, int]] = []
    for line_no, qid, doc_id, grade in iter_qrels(path):
        judged = qrels.setdefault(qid, {})
        if doc_id in judged:
            duplicates.append((lines[qid, doc_id], line_no, qid, doc_id, judged[doc_id], grade))
        lines[qid, doc_id] = line_no
        judged[doc_id] = grade
    if not qrels:
        raise InputError("no judgments in qrels file", path=path)
    if duplicates:
        logger.warning("%s", duplicate_judgments(path, duplicates))
    return qrels


@dataclass(frozen=True)
class Answers:
    """The answers of one question: strings matched as DPR's ``has_answer`` matches them (``match="string"``), or
    regular expressions (``match="regex"``: CuratedTREC)."""

    answers: tuple[str, ...]
    match: str = "string"


ANSWER_MATCHES = ("string", "regex")


def load_answers(path: str | Path) -> dict[str, Answers]:
    """Read ``answers/<split>.jsonl`` (``{"_id": query id, "answers": [str, ...], "match": "string" | "regex"}`` a
    line; ``match`` defaults to ``string``) into ``{query_id: Answers}``; malformed lines are located errors."""
    answers: dict[str, Answers] = {}
    for line_no, obj in iter_jsonl(path):
        qid = require_str(obj, "_id", path, line_no, allow_empty=False)
        given = obj.get("answers")
        if not isinstance(given, list) or not given or not all(isinstance(a, str) for a in given):
            raise InputError("expected a non-empty list of answer strings", path=path, line=line_no, field="answers")
        match = obj.get("match", "string")
        if match not in ANSWER_MATCHES:
            raise InputError(f"expected one of {', '.join(ANSWER_MATCHES)}, got {match!r}", path=path, line=line_no,
                             field="match")
        if qid in answers:
            raise InputError(f"duplicate query id '{qid}'", path=path, line=line_no, field="_id")
        answers[qid] = Answers(tuple(given), match)
    if not answers:
        raise InputError("no answers in file", path=path)
    return answers


def duplicate_judgments(path: str | Path, duplicates: list[tuple[int, int, str, str, int, int]]) -> str:
    """The warning about judgments of one (query, document) on several lines: the last line counts, as in
    trec_eval and pytrec_eval (so scores equal theirs), and the lines are named so that they can be fixed.
    Warned, not refused: published qrels that the field's tools read must stay readable here."""
    first, line, qid, doc_id, before, after = duplicates[0]
    conflicting = sum(1 for *_, a, b in duplicates if a != b)
    return (f"{path}: {len(duplicates)} judgment(s) repeat a (query, document) judged on an earlier line "
            f"({conflicting} with another grade), e.g. lines {first} and {line} judge ({qid!r}, {doc_id!r}) "
            f"{before} then {after}; the last line of each counts, as in trec_eval")


def iter_qrels(path: str | Path) -> Iterator[tuple[int, str, str, int]]:
    """Stream ``(line_number, query_id, doc_id, grade)`` from a qrels file (see :func:`load_qrels` for the formats
    and checks), without holding the judgments."""
    first = True
    columns: tuple[int, int] | None = None   # (count, line) of the first data line: every line has as many
    for line_no, line in iter_lines(path):
        parts = _split_columns(line)
        if not parts:
            continue
        if first:
            first = False
            if _is_qrels_header(parts):
                columns = (len(parts), line_no)
                continue  # header line, e.g. "query-id corpus-id score"
        if columns is not None and columns[0] in (3, 4) and len(parts) in (3, 4) and len(parts) != columns[0]:
            layout = "query-id, corpus-id, score" if columns[0] == 3 else "query-id, iteration, doc-id, relevance"
            extra = "an extra" if len(parts) > columns[0] else "a missing"
            raise InputError(f"{len(parts)} columns where line {columns[1]} has {columns[0]} ({layout}): "
                             f"{extra} column", path=path, line=line_no)
        if len(parts) == 3:
            qid, doc_id, grade = parts
        elif len(parts) == 4:
            qid, _, doc_id, grade = parts
        else:
            raise InputError(f"expected 3 (BEIR) or 4 (TREC) columns, got {len(parts)}",
                             path=path, line=line_no)
        if columns is None:
            columns = (len(parts), line_no)
        if not qid or not doc_id:
            raise InputError("empty id", path=path, line=line_no, field="query-id" if not qid else "corpus-id")
        for value, field_name in ((qid, "query-id"), (doc_id, "corpus-id")):
            if not is_run_id(value):
                raise InputError(f"id {value!r} contains whitespace, which a TREC run (split on whitespace) cannot "
                                 "hold: rename it", path=path, line=line_no, field=field_name)
        if not _is_int(grade):
            raise InputError(f"relevance grade '{grade}' is not an integer", path=path, line=line_no,
                             field="score")
        yield line_no, qid, doc_id, int(grade)


_HEADER_ID_NAMES = {"query-id", "query_id", "queryid", "qid", "query", "topic", "topic-id", "topic_id"}
_HEADER_GRADE_NAMES = {"score", "relevance", "rel", "label", "grade", "judgment", "judgement"}


def _split_columns(line: str) -> list[str]:
    """Tab-separated columns when the line has a tab (ids may contain spaces), else whitespace-separated."""
    stripped = line.strip()
    if "\t" in stripped:
        return [part.strip() for part in stripped.split("\t")]
    return stripped.split()


def _is_qrels_header(parts: list[str]) -> bool:
    """A header names its columns; a data line whose grade merely fails to parse is not a header."""
    if _is_int(parts[-1]):
        return False
    return parts[0].lower() in _HEADER_ID_NAMES or parts[-1].lower() in _HEADER_GRADE_NAMES


def save_qrels(qrels: Qrels, path: str | Path, trec: bool = False) -> None:
    """Write qrels as BEIR TSV (default) or TREC format, atomically."""
    with atomic_open(path) as handle:
        if not trec:
            handle.write("query-id\tcorpus-id\tscore\n")
        for qid, docs in qrels.items():
            for doc_id, grade in docs.items():
                handle.write(f"{qid} 0 {doc_id} {grade}\n" if trec else f"{qid}\t{doc_id}\t{grade}\n")


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


@dataclass
class QrelsCheck:
    """Counts of judgments that point at ids the collection does not have."""

    unknown_queries: int = 0
    unknown_docs: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.unknown_queries == 0 and self.unknown_docs == 0


def check_qrels(qrels: Qrels, query_ids=None, doc_ids=None, path: str | Path | None = None) -> QrelsCheck:
    """Count qrels entries whose query or document id is unknown and log one warning with the counts.

    Such entries are kept: BEIR's own qrels contain a few, and dropping them would change Recall's
    denominator relative to published numbers.
    """
    check = QrelsCheck()
    for qid, docs in qrels.items():
        if query_ids is not None and qid not in query_ids:
            check.unknown_queries += 1
            if len(check.examples) < 3:
                check.examples.append(f"query '{qid}'")
        if doc_ids is not None:
            for doc_id in docs:
                if doc_id not in doc_ids:
                    check.unknown_docs += 1
                    if len(check.examples) < 3:
                        check.examples.append(f"document '{doc_id}'")
    if not check.ok:
        logger.warning("%s: %d judged queries not in the queries file, %d judgments of documents not in the "
                       "corpus (e.g. %s); kept as they are", path or "qrels", check.unknown_queries,
                       check.unknown_docs, ", ".join(check.examples))
    return check
