"""Converting collections as users have them into what the stages read: a BEIR directory + groups JSONL.

``pretrieve data convert OUT ...`` (:func:`convert`) writes ``OUT/corpus.jsonl``, ``OUT/queries.jsonl``,
``OUT/qrels/<split>.tsv`` and ``OUT/groups/<name>.jsonl`` from any of:

* **MS MARCO's native files.** ``collection.tsv`` (``pid<TAB>passage``; a third column makes it
  ``id<TAB>title<TAB>text``), ``queries.*.tsv`` (``qid<TAB>query``; several files are merged), ``qrels.*.tsv``
  (TREC's 4 columns ``qid 0 pid grade``, tab or space separated; BEIR's 3 columns too) and the TREC Deep Learning
  topics (``msmarco-test2019-queries.tsv``, the same ``qid<TAB>query`` layout) and qrels (``2019qrels-pass.txt``,
  TREC format). The files are not quoted: a quote is a character of the text, and a line is split on tabs only —
  the column count is fixed by the first line, so a tab inside a 2-column passage is an error, not a silently
  cut passage. A corpus may also be a JSONL file with ``docid`` (Tevatron's corpus layout) or ``_id``, ``title``
  and ``text``. ``titles`` (``pid<TAB>title``, the same ids in the same order, e.g. RocketQA's
  ``para.title.txt`` beside its ``para.txt``) gives the passages their titles: the titled MS MARCO corpus the BoW,
  DupMAE, CoT-MAE and CoT-MoTE authors fine-tuned on (bowdpr's ``get_data.sh`` joins the same two files).
* **Tevatron training groups** (JSONL, one query per line: ``query_id``, ``query``, ``positive_passages`` and
  ``negative_passages``, lists of ``{"docid", "title", "text"}``) → pretrieve groups
  (:mod:`pretrieve.data.groups`: ``query_id``, ``query``, ``positives``, ``negatives``: document ids only, the
  texts live in the corpus). A document id repeated within one list is kept once (counted).
* **ir_datasets names** (e.g. ``msmarco-passage/dev/small``, ``msmarco-passage/trec-dl-2019/judged``) where the
  optional ``ir_datasets`` package is installed (``pip install 'pretrieve[irds]'``): its documents (written once,
  from the first name that has them), queries and qrels (split named ``NAME=SPLIT``, or after the name:
  ``dev-small``). ir_datasets downloads the files itself on first use.

Everything streams: memory does not grow with the number of passages, queries or groups (duplicate ids are found
from an array of 64-bit id hashes, 16 bytes per id, sorted at the end; a hash match is confirmed by re-reading the
two lines; documents and queries from ir_datasets are taken as it gives them). Malformed input is an :class:`~pretrieve.errors.InputError` naming the input file, line and field;
outputs are written atomically through :mod:`pretrieve.artifacts` (so later stages fingerprint them cheaply).
Each kind given replaces that output file; kinds not given are left as they are.
"""

from __future__ import annotations

import hashlib
import json
import logging
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import numpy as np

from pretrieve import artifacts
from pretrieve.data.beir import iter_qrels
from pretrieve.data.groups import TrainingGroup
from pretrieve.data.jsonl import iter_jsonl, iter_lines, require_str
from pretrieve.data.records import duplicate_id_message, parse_document
from pretrieve.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

KIND = "converted"


@dataclass
class ConversionReport:
    """What :func:`convert` wrote: counts per output file."""

    root: Path
    documents: int = 0
    queries: int = 0
    judgments: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- duplicates
class IdLedger:
    """Finds a repeated id among many without holding the ids: their 64-bit hashes and where each was read."""

    def __init__(self, kind: str, files: Sequence[Path]):
        self.kind = kind
        self.files = list(files)
        self.hashes = array("Q")
        self.where = array("Q")  # file index << 40 | line number

    def add(self, value: str, file_index: int, line: int) -> None:
        self.hashes.append(int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little"))
        self.where.append(file_index << 40 | line)

    def check(self) -> None:
        """Raise a located :class:`InputError` for the first repeated id (in reading order)."""
        hashes = np.frombuffer(self.hashes, dtype=np.uint64) if len(self.hashes) else np.zeros(0, np.uint64)
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        same = np.nonzero(ordered[1:] == ordered[:-1])[0]
        del ordered
        found: tuple[int, int] | None = None  # (position of the repeat, of the first occurrence)
        for i in same.tolist():
            second = int(order[i + 1])
            j = i
            while j >= 0 and hashes[order[j]] == hashes[second]:
                first = int(order[j])
                if self._id_at(first) == self._id_at(second) and (found is None or second < found[0]):
                    found = (second, first)
                j -= 1
        if found is not None:
            second, first = found
            (f2, l2), (f1, l1) = self._split(second), self._split(first)
            value = self._id_at(second)
            if f1 == f2:
                message = duplicate_id_message(self.kind, value, l1)
            else:
                message = f"duplicate {self.kind} id '{value}' (first seen at {self.files[f1]}:{l1})"
            raise InputError(message, path=self.files[f2], line=l2, field="id")

    def _split(self, position: int) -> tuple[int, int]:
        packed = self.where[position]
        return packed >> 40, packed & ((1 << 40) - 1)

    def _id_at(self, position: int) -> str:
        file_index, line = self._split(position)
        for line_no, text in iter_lines(self.files[file_index]):
            if line_no == line:
                return _tsv_or_json_id(text)
        raise AssertionError("unreachable: a recorded line is missing")


def _tsv_or_json_id(line: str) -> str:
    if line.lstrip().startswith("{"):
        obj = json.loads(line)
        return str(obj.get("_id", obj.get("docid")))
    return line.rstrip("\r\n").split("\t", 1)[0].strip()


# ------------------------------------------------------------------------------------------- readers
def _tsv_rows(path: Path, layouts: str, allowed: Sequence[int]) -> Iterator[tuple[int, list[str]]]:
    """``(line, columns)`` of a tab-separated file; the first line fixes the column count (one of ``allowed``,
    described by ``layouts``)."""
    expected = None
    for line_no, line in iter_lines(path):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        parts = text.split("\t")
        if expected is None:
            if len(parts) not in allowed:
                raise InputError(f"expected {layouts} tab-separated columns, got {len(parts)}", path=path,
                                 line=line_no)
            expected = len(parts)
        elif len(parts) != expected:
            raise InputError(f"expected {expected} tab-separated columns (as on the first line), got {len(parts)}",
                             path=path, line=line_no)
        if not parts[0].strip():
            raise InputError("empty id", path=path, line=line_no, field="id")
        yield line_no, [parts[0].strip(), *parts[1:]]


def iter_corpus_file(path: Path) -> Iterator[tuple[int, str, str, str]]:
    """``(line, id, title, text)`` of a TSV collection or a JSONL corpus (``_id`` or ``docid``)."""
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl") or name.endswith(".json"):
        for line_no, obj in iter_jsonl(path):
            if "_id" not in obj and "docid" in obj:
                obj = {**obj, "_id": obj["docid"]}
            doc = parse_document(obj, path, line_no)
            yield line_no, doc.id, doc.title, doc.text
        return
    for line_no, parts in _tsv_rows(path, "2 (id, text) or 3 (id, title, text)", (2, 3)):
        if len(parts) == 2:
            yield line_no, parts[0], "", parts[1]
        else:
            yield line_no, parts[0], parts[1], parts[2]


def iter_queries_file(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line, id, text)`` of a ``qid<TAB>query`` file (or a BEIR ``queries.jsonl``)."""
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        for line_no, obj in iter_jsonl(path):
            yield (line_no, require_str(obj, "_id", path, line_no, allow_empty=False),
                   require_str(obj, "text", path, line_no, allow_empty=False))
        return
    for line_no, (qid, text) in _tsv_rows(path, "2 (id, text)", (2,)):
        if not text.strip():
            raise InputError("must not be empty", path=path, line=line_no, field="text")
        yield line_no, qid, text


def iter_tevatron_groups(path: Path, stats: dict[str, int]) -> Iterator[TrainingGroup]:
    """Tevatron's training JSONL as :class:`TrainingGroup` (document ids only)."""
    for line_no, obj in iter_jsonl(path):
        query_id = require_str(obj, "query_id", path, line_no, allow_empty=False)
        query = require_str(obj, "query", path, line_no, allow_empty=False)
        lists = []
        for name, required in (("positive_passages", True), ("negative_passages", False)):
            value = obj.get(name)
            if value is None:
                if required:
                    raise InputError("missing required field", path=path, line=line_no, field=name)
                value = []
            if not isinstance(value, list):
                raise InputError(f"expected a list of passages, got {type(value).__name__}", path=path, line=line_no,
                                 field=name)
            ids: list[str] = []
            for i, passage in enumerate(value):
                if not isinstance(passage, dict):
                    raise InputError(f"expected a passage object, got {type(passage).__name__}", path=path,
                                     line=line_no, field=f"{name}[{i}]")
                doc_id = require_str(passage, "docid", path, line_no, allow_empty=False) if "docid" in passage \
                    else _missing(path, line_no, f"{name}[{i}].docid")
                ids.append(doc_id)
            unique = list(dict.fromkeys(ids))
            stats["repeated_ids_dropped"] = stats.get("repeated_ids_dropped", 0) + len(ids) - len(unique)
            lists.append(unique)
        yield TrainingGroup(query_id, query, lists[0], lists[1])


def _missing(path: Path, line: int, field_name: str) -> str:
    raise InputError("missing required field", path=path, line=line, field=field_name)


# ------------------------------------------------------------------------------------------- ir_datasets
def load_ir_dataset(name: str):
    """``ir_datasets.load(name)``, with a clear error when the package is missing or the name unknown."""
    try:
        import ir_datasets  # optional: ir_datasets
    except ImportError:
        raise ConfigError(f"reading '{name}' needs the ir_datasets package, which is not installed: "
                          "pip install 'pretrieve[irds]' (or pip install ir-datasets)") from None
    try:
        return ir_datasets.load(name)
    except KeyError:
        raise InputError("unknown ir_datasets name (see https://ir-datasets.com)", path=name) from None


def _irds_text(record: Any) -> str:
    text = getattr(record, "text", None)
    return text if isinstance(text, str) else record.default_text()


def irds_split_name(name: str) -> str:
    """The default split of an ir_datasets name: what follows the first ``/``, with ``/`` → ``-``."""
    _, _, rest = name.partition("/")
    return (rest or name).replace("/", "-")


# ------------------------------------------------------------------------------------------- convert
def convert(out: str | Path, corpus: str | Path | None = None, queries: Sequence[str | Path] = (),
            qrels: Sequence[tuple[str, str | Path]] = (), groups: Sequence[str | Path] = (),
            ir_datasets: Sequence[str] = (), titles: str | Path | None = None) -> ConversionReport:
    """Write a BEIR directory (and groups) at ``out`` from the given inputs (see the module docstring).

    ``qrels``: ``(split, file)`` pairs; ``ir_datasets``: names, each optionally ``NAME=SPLIT``.
    """
    root = Path(out)
    if titles is not None and corpus is None:
        raise ConfigError("--titles gives the passages of --corpus their titles: give --corpus too")
    if not (corpus or queries or qrels or groups or ir_datasets):
        raise ConfigError("nothing to convert: give --corpus, --queries, --qrels, --groups or --ir-datasets")
    irds = [(spec.partition("=")[0], spec.partition("=")[2] or irds_split_name(spec.partition("=")[0]))
            for spec in ir_datasets]
    loaded = [(name, split, load_ir_dataset(name)) for name, split in irds]  # fail before writing anything
    inputs = [Path(p) for p in ([corpus] if corpus else []) + ([titles] if titles else []) + list(queries)
              + [f for _, f in qrels] + list(groups)]
    for path in inputs:
        if not path.is_file():
            raise InputError("file not found" if not path.exists() else "is a directory, expected a file", path=path)
    splits = [split for split, _ in qrels] + [split for _, split, ds in loaded if ds.has_qrels()]
    repeated = sorted({s for s in splits if splits.count(s) > 1})
    if repeated:
        raise ConfigError(f"qrels split '{repeated[0]}' is given twice")
    report = ConversionReport(root)
    irds_docs = next(((name, ds) for name, _, ds in loaded if ds.has_docs()), None)
    if corpus is not None and irds_docs is not None:
        raise ConfigError(f"both --corpus and the documents of ir_datasets '{irds_docs[0]}' given: pick one")
    if corpus is not None:
        report.documents = _write_corpus(root / "corpus.jsonl", Path(corpus), None if titles is None else Path(titles))
    elif irds_docs is not None:
        report.documents = _write_irds_corpus(root / "corpus.jsonl", *irds_docs)
    irds_queries = [(name, ds) for name, _, ds in loaded if ds.has_queries()]
    if queries or irds_queries:
        report.queries = _write_queries(root / "queries.jsonl", [Path(q) for q in queries], irds_queries)
    for split, path in qrels:
        report.judgments[split] = _write_qrels(root / "qrels" / f"{split}.tsv", Path(path))
    for name, split, ds in loaded:
        if ds.has_qrels():
            report.judgments[split] = _write_irds_qrels(root / "qrels" / f"{split}.tsv", name, ds)
    for path in groups:
        path = Path(path)
        stem = path.name.removesuffix(".gz").removesuffix(".jsonl").removesuffix(".json")
        count, stats = _write_groups(root / "groups" / f"{stem}.jsonl", path)
        report.groups[str(root / "groups" / f"{stem}.jsonl")] = count
        if stats.get("repeated_ids_dropped"):
            report.notes.append(f"{path}: {stats['repeated_ids_dropped']} document ids listed twice in one list "
                                "were kept once")
    return report


def _write_lines(target: Path, settings: dict, inputs: dict, rows: Iterator[str]) -> int:
    count = 0
    with artifacts.write_file(target, kind=KIND, settings=settings, inputs=inputs) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(row)
                count += 1
    return count


def _json_line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _write_corpus(target: Path, source: Path, titles: Path | None = None) -> int:
    ledger = IdLedger("document", [source])

    def rows() -> Iterator[str]:
        titled = None if titles is None else _tsv_rows(titles, "2 (id, title)", (2,))
        for line_no, doc_id, title, text in iter_corpus_file(source):
            ledger.add(doc_id, 0, line_no)
            if titled is not None:
                title = _title_of(doc_id, next(titled, None), titles)
            yield _json_line({"_id": doc_id, "title": title, "text": text})
        if titled is not None and (extra := next(titled, None)) is not None:
            raise InputError("titles file has more lines than the corpus", path=titles, line=extra[0])
        if not len(ledger.hashes):
            raise InputError("corpus is empty (no documents)", path=source)
        ledger.check()

    settings = {"from": "corpus"} if titles is None else {"from": "corpus+titles"}
    inputs = {"corpus": source} if titles is None else {"corpus": source, "titles": titles}
    return _write_lines(target, settings, inputs, rows())


def _title_of(doc_id: str, row: tuple[int, list[str]] | None, path: Path) -> str:
    """The title of ``doc_id`` from the titles file's next row (the same ids in the same order as the corpus)."""
    if row is None:
        raise InputError(f"titles file ends before document '{doc_id}' of the corpus", path=path)
    line_no, (title_id, title) = row
    if title_id != doc_id:
        raise InputError(f"id '{title_id}' where the corpus has '{doc_id}' (the titles must follow the corpus's "
                         "order)", path=path, line=line_no, field="id")
    return title


def _write_irds_corpus(target: Path, name: str, dataset) -> int:
    def rows() -> Iterator[str]:
        for doc in dataset.docs_iter():
            yield _json_line({"_id": str(doc.doc_id), "title": getattr(doc, "title", "") or "",
                              "text": _irds_text(doc)})

    return _write_lines(target, {"from": "ir_datasets", "name": name}, {}, rows())


def _write_queries(target: Path, files: list[Path], irds: list[tuple[str, Any]]) -> int:
    ledger = IdLedger("query", files)

    def rows() -> Iterator[str]:
        for index, path in enumerate(files):
            for line_no, qid, text in iter_queries_file(path):
                ledger.add(qid, index, line_no)
                yield _json_line({"_id": qid, "text": text})
        ledger.check()
        seen: set[str] = set()  # ir_datasets queries: a few thousand per name
        for name, dataset in irds:
            for query in dataset.queries_iter():
                qid = str(query.query_id)
                if qid not in seen:
                    seen.add(qid)
                    yield _json_line({"_id": qid, "text": _irds_text(query)})

    count = _write_lines(target, {"from": "queries", "ir_datasets": [name for name, _ in irds]},
                         {f"queries-{i}": f for i, f in enumerate(files)}, rows())
    if not count:
        raise InputError("no queries in the inputs", path=target)
    return count


def _write_qrels(target: Path, source: Path) -> int:
    def rows() -> Iterator[str]:
        yield "query-id\tcorpus-id\tscore\n"
        for _, qid, doc_id, grade in iter_qrels(source):
            yield f"{qid}\t{doc_id}\t{grade}\n"

    count = _write_lines(target, {"from": "qrels"}, {"qrels": source}, rows()) - 1
    if not count:
        raise InputError("no judgments in qrels file", path=source)
    return count


def _write_irds_qrels(target: Path, name: str, dataset) -> int:
    def rows() -> Iterator[str]:
        yield "query-id\tcorpus-id\tscore\n"
        for qrel in dataset.qrels_iter():
            yield f"{qrel.query_id}\t{qrel.doc_id}\t{int(qrel.relevance)}\n"

    return _write_lines(target, {"from": "ir_datasets", "name": name}, {}, rows()) - 1


def _write_groups(target: Path, source: Path) -> tuple[int, dict[str, int]]:
    stats: dict[str, int] = {}
    rows = (_json_line(group.to_dict()) for group in iter_tevatron_groups(source, stats))
    return _write_lines(target, {"from": "tevatron-groups"}, {"groups": source}, rows), stats


def write_summary(report: ConversionReport, handle: TextIO) -> None:
    """Plain-text counts of a conversion (what the CLI prints)."""
    handle.write(f"collection {report.root}\n")
    if report.documents:
        handle.write(f"documents  {report.documents}\n")
    if report.queries:
        handle.write(f"queries    {report.queries}\n")
    for split, count in report.judgments.items():
        handle.write(f"qrels      {split}: {count} judgments\n")
    for path, count in report.groups.items():
        handle.write(f"groups     {path}: {count}\n")
