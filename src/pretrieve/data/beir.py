"""BEIR-layout collections: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.

The corpus is held column-wise (``ids``, ``titles``, ``texts`` lists plus one id→row dict), never as a
dict of dicts, and can also be streamed with :func:`iter_corpus` without holding it at all.
Malformed input raises :class:`~pretrieve.errors.InputError` naming file, line and field; qrels
that point at unknown query or document ids are a counted warning, not an error (BEIR itself ships
such qrels), see :func:`check_qrels`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from pretrieve.data.jsonl import iter_jsonl, iter_lines, require_str, write_jsonl
from pretrieve.errors import InputError

if TYPE_CHECKING:
    import datasets

    from pretrieve.data.arrow import IdIndex

logger = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Document:
    """One passage of a corpus."""

    id: str
    title: str
    text: str

    def full_text(self, sep: str = " ") -> str:
        """Title and text joined, the input every retriever here indexes."""
        return join_title(self.title, self.text, sep)


def join_title(title: str, text: str, sep: str = " ") -> str:
    """``title + sep + text``, or just the text when the title is empty."""
    return f"{title}{sep}{text}" if title else text


def iter_corpus(path: str | Path) -> Iterator[tuple[int, Document]]:
    """Stream ``(line_number, Document)`` from a ``corpus.jsonl`` (no duplicate check: see Corpus)."""
    for line_no, obj in iter_jsonl(path):
        yield line_no, parse_document(obj, path, line_no)


def parse_document(obj: dict, path: str | Path, line: int) -> Document:
    """One ``corpus.jsonl`` object as a Document: ``_id`` (non-empty), ``title`` (optional), ``text``."""
    doc_id = require_str(obj, "_id", path, line, allow_empty=False)
    title = require_str(obj, "title", path, line, default="")
    text = require_str(obj, "text", path, line)
    return Document(doc_id, title, text)


def duplicate_id_message(kind: str, doc_id: str, first_line: int) -> str:
    """The error message of an id seen twice (``kind``: document | query), the same from every reader."""
    return f"duplicate {kind} id '{doc_id}' (first seen on line {first_line})"


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


def parse_query(obj: dict, path: str | Path, line: int) -> tuple[str, str]:
    """One ``queries.jsonl`` object as ``(query_id, text)``, both non-empty."""
    return (require_str(obj, "_id", path, line, allow_empty=False),
            require_str(obj, "text", path, line, allow_empty=False))


def save_queries(queries: dict[str, str], path: str | Path) -> None:
    """Write ``{query_id: text}`` as ``queries.jsonl`` (atomically)."""
    write_jsonl(path, ({"_id": qid, "text": text} for qid, text in queries.items()))


def load_qrels(path: str | Path) -> Qrels:
    """Read relevance judgments: BEIR TSV (``query-id corpus-id score`` with header) or TREC
    (``qid iter docid rel``, whitespace separated). Non-integer grades and wrong column counts are
    located errors. Zero and negative grades are kept (evaluation treats grade ≤ 0 as non-relevant).

    A line containing a tab is split on tabs only, so ids with spaces in a BEIR TSV stay whole; other
    lines are split on whitespace. Only a first line that names its columns (``query-id``, ``qid``, ...
    or ``score``, ``relevance``, ...) is taken as a header: any other non-integer grade is an error.
    """
    qrels: Qrels = {}
    for _, qid, doc_id, grade in iter_qrels(path):
        qrels.setdefault(qid, {})[doc_id] = grade
    if not qrels:
        raise InputError("no judgments in qrels file", path=path)
    return qrels


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
    from pretrieve.io_utils import atomic_open

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


@dataclass
class BeirCollection:
    """A collection directory in BEIR layout."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise InputError("collection directory not found", path=self.root)

    @property
    def corpus_path(self) -> Path:
        return _existing(self.root, "corpus.jsonl")

    @property
    def queries_path(self) -> Path:
        return _existing(self.root, "queries.jsonl")

    def qrels_path(self, split: str) -> Path:
        path = self.root / "qrels" / f"{split}.tsv"
        if not path.exists():
            available = sorted(p.stem for p in (self.root / "qrels").glob("*.tsv"))
            raise InputError(f"no qrels for split '{split}' (available: {', '.join(available) or 'none'})",
                             path=path)
        return path

    def split_inputs(self, split: str) -> dict[str, Path]:
        """The files a run or groups file of ``split`` is made from (recorded by content in its freshness
        sidecar, :mod:`pretrieve.artifacts`): the corpus, the queries and the split's qrels."""
        return {"corpus": self.corpus_path, "queries": self.queries_path, "qrels": self.qrels_path(split)}

    def splits(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "qrels").glob("*.tsv"))

    def load_corpus(self) -> Corpus:
        return Corpus.load(self.corpus_path)

    def load_qrels(self, split: str) -> Qrels:
        return load_qrels(self.qrels_path(split))

    def corpus_dataset(self, num_proc: int | None = None, cache_dir: str | Path | None = None) -> "datasets.Dataset":
        """The corpus as a memory-mapped Arrow dataset: columns ``_id``, ``title``, ``text``, row ``i`` = the
        ``i``-th passage of ``corpus.jsonl`` (built once, see :mod:`pretrieve.data.arrow`)."""
        from pretrieve.data.arrow import corpus_dataset

        return corpus_dataset(self.corpus_path, num_proc=num_proc, cache_dir=cache_dir)

    def corpus_index(self, num_proc: int | None = None, cache_dir: str | Path | None = None) -> "IdIndex":
        """Document id → row of :meth:`corpus_dataset` (:class:`pretrieve.data.arrow.IdIndex`, no dict of ids)."""
        from pretrieve.data.arrow import build, id_index

        return id_index(build("corpus", self.corpus_path, num_proc=num_proc, cache_dir=cache_dir))

    def queries_dataset(self, split: str | None = None, num_proc: int | None = None,
                        cache_dir: str | Path | None = None) -> "datasets.Dataset":
        """All queries (columns ``_id``, ``text``), or those judged in ``split``, in file order, memory-mapped."""
        from pretrieve.data.arrow import id_index, queries_dataset

        dataset = queries_dataset(self.queries_path, num_proc=num_proc, cache_dir=cache_dir)
        if split is None:
            return dataset
        import numpy as np

        rows = id_index(dataset).lookup(list(self.load_qrels(split)))
        return dataset.select(np.unique(rows[rows >= 0]), keep_in_memory=True)

    def load_queries(self, split: str | None = None) -> dict[str, str]:
        """All queries, or only those judged in ``split`` (in file order)."""
        queries = load_queries(self.queries_path)
        if split is None:
            return queries
        judged = self.load_qrels(split)
        return {qid: text for qid, text in queries.items() if qid in judged}


def _existing(root: Path, name: str) -> Path:
    path = root / name
    if path.exists():
        return path
    gz = root / f"{name}.gz"
    if gz.exists():
        return gz
    raise InputError(f"{name} not found in collection", path=root)
