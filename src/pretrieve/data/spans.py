"""Contextual spans for CoT-MAE / CoT-MoTE pre-training: an anchor span and a context span per example.

CoT-MAE (Wu et al., 2023) cuts each document into sentence-packed spans and pairs every anchor span with a
*contextual* span of the same document; CoT-MoTE (Ma et al. 2023, §4.1) and CoT-MAE-qc use a passage and one of
its (pseudo-)queries instead. Each example holds both texts and a text type per side; the model encodes both
and each span's [CLS] vector reconstructs the other (:mod:`pretrieve.modeling.objectives.contextual`).

Document spans (:class:`SpanCorpus`, :class:`SpanDataset`):

* **Sentences.** Each document (BEIR ``title + " " + text``, JSONL ``text``, or a plain-text line) is split into
  sentences by :func:`~pretrieve.data.packing.split_sentences` — BlingFire's sentence breaker, which works offline
  from its package (CoT-MAE's scripts use NLTK's Punkt, whose model is a separate download; the choice is
  explained in :mod:`pretrieve.data.packing`). Sentences are tokenized without special tokens; a sentence longer than the span budget
  ``max_len − 2`` is cut into budget-sized pieces, each then treated as a sentence.
* **Packing.** Consecutive sentences are packed greedily into spans of at most ``max_len − 2`` tokens (CoT-MAE
  packs until the budget is *exceeded* and truncates later; it also draws a shorter target length with
  probability 0.15 — we keep every span within the budget and do not shorten). Documents with fewer than two
  spans have no context and are skipped (as in CoT-MAE's data script).
* **Anchors** (``anchors``): ``document`` (the default, CoT-MAE's ``CotMAEDataset``) — an example is a document,
  and each draw picks one of its spans at random as the anchor, so every document weighs the same and
  ``len(dataset)`` is the number of documents; ``span`` — every span is an anchor of its own (``len(dataset)`` is
  the number of spans), so long documents weigh more.
* **Context kinds** (:data:`DOCUMENT_KINDS`): ``nearby`` — the previous or the next span (uniformly among those
  that exist); ``overlap`` — a window that starts inside the anchor: its last ``k`` sentences, ``k`` uniform in
  ``[1, ⌊S/2⌋]`` and reduced until the shared part is at most half of the anchor's tokens (a single sentence
  longer than that is cut to the anchor's last ``⌊n/2⌋`` tokens), then the following sentences while they
  fit in the budget; for the last span of a document the window mirrors backwards (anchor's first sentences
  + the preceding text), as in CoT-MAE's script. So the overlap is **≤ 50 % of the anchor**, and the window
  is at most ``max_len − 2`` tokens; ``random`` — any other span of the same document (CoT-MAE's
  ``random_sampled`` with its window of 100 spans, i.e. in practice the whole document); ``mixed`` — one of
  the three, uniformly per example (CoT-MAE's default ``data_type='mixed'``). Both sides are passages
  (text type 1).

Query contexts (:class:`PairDataset`): a JSONL file of ``{"passage": str, "query": str}`` lines (or
``"queries": [str, ...]`` — e.g. several docT5query pseudo-queries of a passage, one drawn per example), e.g.
training queries with their positives (:func:`write_qrels_pairs`). The anchor is the passage (text type 1,
P-FFN in CoT-MoTE), the context the query (text type 0, Q-FFN), truncated to ``max_len`` and
``query_max_len`` tokens.

Randomness: ``dataset.draw(i, epoch)`` is a deterministic function of ``(seed, i, epoch)`` — its choices (the
anchor span of a document, the context kind of ``mixed``, the context span, the pseudo-query of a pair) come from
``numpy.random.default_rng([seed, i])`` in epoch 0 and ``default_rng([seed, i, epoch])`` after; the training loop
calls ``draw`` with the epoch, so an anchor gets a new context every time it is drawn (``redraw: true``, the
default). That is what the authors' code does: CoT-MAE's collator picks the context kind and CoT-MAE-qc's the
pseudo-query with ``random`` at every draw (only the span *candidates* are cut offline). ``redraw: false`` keeps
the epoch-0 context of each anchor for the whole run (``dataset[i]`` is always the epoch-0 draw). The masking of
both spans comes from the collator's per-step generator.

Examples: ``input_ids`` / ``context_input_ids`` (with [CLS]/[SEP]), ``text_type`` / ``context_text_type``
(0 = query, 1 = passage), ``context_kind``, and, for document spans, ``document`` with the token ranges
``anchor_range`` / ``context_range`` inside it (what the tests check).

Cache layout of :class:`SpanCorpus` (``cache_dir/<name>/``): ``tokens.npy`` (flat ids), ``sentences.npy``
(token offsets of the sentences), ``spans.npy`` (sentence offsets of the spans), ``documents.npy`` (span
offsets of the documents), ``meta.json``; written through :mod:`pretrieve.artifacts` and reused while the
source's content, the vocabulary and ``max_len`` are the same. Sources are those of
:mod:`pretrieve.data.pretrain_text` (files, ``datasets`` directories, ``hf:`` names).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from pretrieve.data.jsonl import iter_jsonl
from pretrieve.data.packing import split_sentences, splitter_version
from pretrieve import artifacts
from pretrieve.data.pretrain_text import (cache_name, iter_pretrain_texts, resolve_text_sources, source_identity,
                                          vocabulary_digest)
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_open, write_json

DOCUMENT_KINDS = ("nearby", "overlap", "random")
CONTEXT_KINDS = (*DOCUMENT_KINDS, "mixed", "pairs")
ANCHORS = ("document", "span")
QUERY_TYPE, PASSAGE_TYPE = 0, 1
_DOCS_PER_BATCH = 500
_CACHE_VERSION = "spans-v2"   # v2: BlingFire's sentences (v1: a regular expression)
_CACHE_KIND = "span-cache"


# ------------------------------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class ContextSpec:
    """Which context each anchor gets: ``kind`` (:data:`CONTEXT_KINDS`), the ``pairs`` file for ``pairs`` (needed
    when the dataset is built; a preset leaves it empty), the length limit ``query_max_len`` of queries, and
    whether the context is drawn again every epoch (``redraw``, the authors' behaviour; module docstring)."""

    kind: str = "mixed"
    pairs: str | None = None
    query_max_len: int = 32
    redraw: bool = True
    anchors: str = "document"     # document spans: one random span per document per draw (CoT-MAE), or every span

    def validate(self) -> "ContextSpec":
        if self.kind not in CONTEXT_KINDS:
            raise ConfigError(f"context.kind must be one of {', '.join(CONTEXT_KINDS)}, got {self.kind!r}")
        if self.kind != "pairs" and self.pairs:
            raise ConfigError(f"context.pairs is only used with kind 'pairs' (kind is {self.kind!r})")
        if isinstance(self.query_max_len, bool) or not isinstance(self.query_max_len, int) or self.query_max_len < 3:
            raise ConfigError(f"context.query_max_len must be an integer ≥ 3, got {self.query_max_len!r}")
        if not isinstance(self.redraw, bool):
            raise ConfigError(f"context.redraw must be true or false, got {self.redraw!r}")
        if self.anchors not in ANCHORS:
            raise ConfigError(f"context.anchors must be one of {', '.join(ANCHORS)}, got {self.anchors!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "pairs": self.pairs, "query_max_len": self.query_max_len, "redraw": self.redraw,
                "anchors": self.anchors}

    @classmethod
    def from_dict(cls, data: Any, where: str = "context") -> "ContextSpec":
        if isinstance(data, str):
            data = {"kind": data}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a mapping or a kind name, got {type(data).__name__}")
        unknown = sorted(set(data) - {"kind", "pairs", "query_max_len", "redraw", "anchors"})
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; known fields: kind, pairs, "
                              "query_max_len, redraw, anchors")
        kind = str(data.get("kind", "pairs" if data.get("pairs") else "mixed"))
        pairs = data.get("pairs")
        return cls(kind=kind, pairs=None if pairs is None else str(pairs),
                   query_max_len=data.get("query_max_len", 32), redraw=data.get("redraw", True),
                   anchors=data.get("anchors", "document")).validate()


# -------------------------------------------------------------------------------------------- sentences
def pack_spans(sentence_lengths: Sequence[int], budget: int) -> list[int]:
    """Greedy packing: the sentence index where each span starts (plus the end), spans ≤ ``budget`` tokens."""
    starts, total = [0], 0
    for index, length in enumerate(sentence_lengths):
        if total and total + length > budget:
            starts.append(index)
            total = 0
        total += length
    return starts + [len(sentence_lengths)] if sentence_lengths else [0]


# ------------------------------------------------------------------------------------------------ corpus
@dataclass
class SpanCorpus:
    """Tokenized documents as sentences and sentence-packed spans (memory-mapped; see the module docstring)."""

    tokens: np.ndarray
    sentences: np.ndarray
    spans: np.ndarray
    documents: np.ndarray
    cls_id: int
    sep_id: int
    max_len: int
    meta: dict

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1

    def document_spans(self, doc: int) -> range:
        return range(int(self.documents[doc]), int(self.documents[doc + 1]))

    def span_sentences(self, span: int) -> range:
        return range(int(self.spans[span]), int(self.spans[span + 1]))

    def document_tokens(self, doc: int) -> np.ndarray:
        start, end = self.document_token_range(doc)
        return self.tokens[start:end]

    def document_token_range(self, doc: int) -> tuple[int, int]:
        spans = self.document_spans(doc)
        return int(self.sentences[self.spans[spans.start]]), int(self.sentences[self.spans[spans.stop]])

    def span_token_range(self, span: int) -> tuple[int, int]:
        """Absolute token range ``[start, end)`` of a span in :attr:`tokens`."""
        return int(self.sentences[self.spans[span]]), int(self.sentences[self.spans[span + 1]])

    def sentence_bounds(self, doc: int) -> np.ndarray:
        """Absolute token offsets of the sentence boundaries of a document (first start … last end)."""
        spans = self.document_spans(doc)
        first, last = int(self.spans[spans.start]), int(self.spans[spans.stop])
        return np.asarray(self.sentences[first:last + 1], dtype=np.int64)

    @classmethod
    def build(cls, source: str | Path, tokenizer, max_len: int, cache_dir: str | Path) -> "SpanCorpus":
        """Split, tokenize and pack ``source`` once (or reuse the cache) and memory-map the result."""
        if max_len < 8:
            raise InputError(f"max_len must be at least 8, got {max_len}", field="max_len")
        sources = resolve_text_sources(source)
        if len(sources) > 1:
            raise ConfigError(f"document context spans read one corpus source, got {len(sources)} "
                              f"({', '.join(map(str, sources))}): join the documents into one file")
        source = sources[0]
        settings, inputs = source_identity(source)[:2]
        vocabulary = vocabulary_digest(tokenizer)
        settings.update({"format": _CACHE_VERSION, "max_len": max_len, "vocabulary": vocabulary,
                         "splitter": splitter_version()})
        target = Path(cache_dir) / cache_name(source, f"spans-L{max_len}", vocabulary)
        if not artifacts.is_current(target, settings, inputs, kind=_CACHE_KIND):
            with artifacts.write_dir(target, kind=_CACHE_KIND, settings=settings, inputs=inputs) as tmp:
                meta = _tokenize_spans(tmp, source, tokenizer, max_len - 2)
                meta.update({"source": str(source), "kind": source.kind, "max_len": max_len,
                             "tokenizer": getattr(tokenizer, "name_or_path", "")})
                write_json(tmp / "meta.json", meta)
        return cls.open(target, tokenizer)

    @classmethod
    def open(cls, directory: str | Path, tokenizer) -> "SpanCorpus":
        directory = Path(directory)
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r" if name == "tokens" else None)
                  for name in ("tokens", "sentences", "spans", "documents")}
        return cls(**arrays, cls_id=_special_id(tokenizer, "cls"), sep_id=_special_id(tokenizer, "sep"),
                   max_len=int(meta["max_len"]), meta=meta)


def _special_id(tokenizer, kind: str) -> int:
    value = getattr(tokenizer, f"{kind}_token_id", None)
    if value is None:
        value = getattr(tokenizer, "bos_token_id" if kind == "cls" else "eos_token_id", None)
    if value is None:
        raise InputError(f"tokenizer has no {kind} token", field="tokenizer")
    return int(value)


def _tokenize_spans(directory: Path, source, tokenizer, budget: int) -> dict:
    """Write the four arrays of a :class:`SpanCorpus` for ``source`` into ``directory``."""
    tokens: list[np.ndarray] = []
    sentence_offsets, span_offsets, document_offsets = [0], [0], [0]
    counts = {"documents_read": 0, "documents_without_context": 0}
    for batch in _batches(iter_pretrain_texts(source), _DOCS_PER_BATCH):
        counts["documents_read"] += len(batch)
        split = [split_sentences(text) for text in batch]
        flat = [sentence for sentences in split for sentence in sentences]
        encoded = tokenizer(flat, add_special_tokens=False, truncation=False, verbose=False)["input_ids"] if flat else []
        position = 0
        for sentences in split:
            pieces = [piece for ids in encoded[position:position + len(sentences)] for piece in _cut(ids, budget)]
            position += len(sentences)
            starts = pack_spans([len(piece) for piece in pieces], budget)
            if len(starts) - 1 < 2:
                counts["documents_without_context"] += 1
                continue
            base = len(sentence_offsets) - 1
            for piece in pieces:
                tokens.append(np.asarray(piece, dtype=np.int64))
                sentence_offsets.append(sentence_offsets[-1] + len(piece))
            span_offsets.extend(base + start for start in starts[1:])
            document_offsets.append(len(span_offsets) - 1)
    if len(document_offsets) == 1:
        raise InputError("no document of the corpus has two spans or more (nothing to pair as anchor and context)",
                         path=str(source))
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32
    np.save(directory / "tokens.npy", np.concatenate(tokens).astype(dtype))
    for name, values in (("sentences", sentence_offsets), ("spans", span_offsets), ("documents", document_offsets)):
        np.save(directory / f"{name}.npy", np.asarray(values, dtype=np.int64))
    return {**counts, "documents": len(document_offsets) - 1, "spans": len(span_offsets) - 1,
            "sentences": len(sentence_offsets) - 1, "tokens": int(sentence_offsets[-1])}


def _cut(ids: list[int], budget: int) -> Iterator[list[int]]:
    for start in range(0, len(ids), budget):
        if ids[start:start + budget]:
            yield ids[start:start + budget]


def _batches(items, size: int) -> Iterator[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------------------------- sampling
def nearby_range(corpus: SpanCorpus, doc: int, span: int, rng: np.random.Generator) -> tuple[int, int]:
    spans = corpus.document_spans(doc)
    neighbours = [s for s in (span - 1, span + 1) if s in spans]
    return corpus.span_token_range(int(rng.choice(neighbours)))


def random_range(corpus: SpanCorpus, doc: int, span: int, rng: np.random.Generator) -> tuple[int, int]:
    others = [s for s in corpus.document_spans(doc) if s != span]
    return corpus.span_token_range(int(rng.choice(others)))


def overlap_range(corpus: SpanCorpus, doc: int, span: int, rng: np.random.Generator) -> tuple[int, int]:
    """A window sharing at most half of the anchor's tokens, extended over the neighbouring text."""
    budget = corpus.max_len - 2
    start, end = corpus.span_token_range(span)
    bounds = corpus.sentence_bounds(doc)
    inner = bounds[(bounds > start) & (bounds < end)]           # sentence boundaries strictly inside the anchor
    half = (end - start) // 2
    forward = span + 1 in corpus.document_spans(doc)
    # candidate cut points: the shared part is [cut, end) going forward, [start, cut) going backward
    cuts = inner[::-1] if forward else inner                    # nearest-to-the-edge first: 1 sentence, 2, ...
    k = int(rng.integers(1, max(1, (len(inner) + 1) // 2) + 1))  # k sentences of the anchor's S = len(inner)+1
    shared = 0
    for count in range(min(k, len(cuts)), 0, -1):
        size = end - cuts[count - 1] if forward else cuts[count - 1] - start
        if size <= half:
            shared = int(size)
            break
    if shared == 0:
        shared = half                                           # one long sentence: cut inside it
    doc_start, doc_end = corpus.document_token_range(doc)
    if forward:
        window_start = end - shared
        fitting = bounds[(bounds > end) & (bounds - window_start <= budget)]
        window_end = int(fitting.max()) if fitting.size else min(window_start + budget, doc_end)
        return window_start, window_end
    window_end = start + shared
    fitting = bounds[(bounds < start) & (window_end - bounds <= budget)]
    window_start = int(fitting.min()) if fitting.size else max(window_end - budget, doc_start)
    return window_start, window_end


_SAMPLERS = {"nearby": nearby_range, "overlap": overlap_range, "random": random_range}


# ----------------------------------------------------------------------------------------------- datasets
class SpanDataset:
    """Anchor spans of a :class:`SpanCorpus` with a context span of the same document (module docstring)."""

    def __init__(self, corpus: SpanCorpus, kind: str = "mixed", seed: int = 0, redraw: bool = True,
                 anchors: str = "document"):
        if kind not in (*DOCUMENT_KINDS, "mixed"):
            raise ConfigError(f"document context kind must be one of {', '.join((*DOCUMENT_KINDS, 'mixed'))}, "
                              f"got {kind!r}")
        if anchors not in ANCHORS:
            raise ConfigError(f"anchors must be one of {', '.join(ANCHORS)}, got {anchors!r}")
        self.corpus = corpus
        self.kind = kind
        self.seed = int(seed)
        self.redraw = bool(redraw)
        self.anchors = anchors
        self.anchor_documents = np.repeat(np.arange(corpus.num_documents), np.diff(corpus.documents))

    def __len__(self) -> int:
        return self.corpus.num_documents if self.anchors == "document" else len(self.anchor_documents)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.draw(index, 0)

    def draw(self, index: int, epoch: int) -> dict[str, Any]:
        """Anchor ``index`` with the context drawn for ``epoch`` (the epoch-0 one when ``redraw`` is off)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        rng = _draw_rng(self.seed, index, epoch if self.redraw else 0)
        corpus = self.corpus
        if self.anchors == "document":
            doc, spans = index, corpus.document_spans(index)
            span = spans.start + int(rng.integers(len(spans)))
        else:
            doc, span = int(self.anchor_documents[index]), index
        kind = self.kind if self.kind != "mixed" else DOCUMENT_KINDS[int(rng.integers(len(DOCUMENT_KINDS)))]
        anchor = corpus.span_token_range(span)
        context = _SAMPLERS[kind](corpus, doc, span, rng)
        doc_start = corpus.document_token_range(doc)[0]
        return {"input_ids": self._ids(*anchor), "context_input_ids": self._ids(*context),
                "text_type": PASSAGE_TYPE, "context_text_type": PASSAGE_TYPE, "context_kind": kind,
                "document": doc, "anchor_range": (anchor[0] - doc_start, anchor[1] - doc_start),
                "context_range": (context[0] - doc_start, context[1] - doc_start)}

    def _ids(self, start: int, end: int) -> list[int]:
        return [self.corpus.cls_id, *self.corpus.tokens[start:end].tolist(), self.corpus.sep_id]


class PairDataset:
    """(passage, query) pairs: the passage is the anchor (P-FFN), a query its context (Q-FFN)."""

    def __init__(self, path: str | Path, tokenizer, max_len: int, query_max_len: int = 32, seed: int = 0,
                 redraw: bool = True):
        self.path = Path(path)
        self.seed = int(seed)
        self.redraw = bool(redraw)
        passages: list[str] = []
        queries: list[list[str]] = []
        for line_no, obj in iter_jsonl(self.path):
            passage, options = _pair_fields(obj, self.path, line_no)
            passages.append(passage)
            queries.append(options)
        if not passages:
            raise InputError("pairs file holds no pair", path=self.path)
        self.passages = tokenizer(passages, truncation=True, max_length=max_len, verbose=False)["input_ids"]
        flat = [query for options in queries for query in options]
        encoded = tokenizer(flat, truncation=True, max_length=query_max_len, verbose=False)["input_ids"]
        self.offsets = np.cumsum([0] + [len(options) for options in queries])
        self.queries = encoded

    def __len__(self) -> int:
        return len(self.passages)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.draw(index, 0)

    def draw(self, index: int, epoch: int) -> dict[str, Any]:
        """Passage ``index`` with one of its queries, drawn for ``epoch`` (epoch 0's when ``redraw`` is off)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        choice = start + int(_draw_rng(self.seed, index, epoch if self.redraw else 0).integers(end - start))
        return {"input_ids": list(self.passages[index]), "context_input_ids": list(self.queries[choice]),
                "text_type": PASSAGE_TYPE, "context_text_type": QUERY_TYPE, "context_kind": "pairs"}


def _draw_rng(seed: int, index: int, epoch: int) -> np.random.Generator:
    """The generator of one draw: ``[seed, index]`` in epoch 0 (so ``dataset[i]`` is unchanged), with the epoch after."""
    return np.random.default_rng([seed, int(index)] if epoch == 0 else [seed, int(index), int(epoch)])


def _pair_fields(obj: Mapping[str, Any], path: Path, line_no: int) -> tuple[str, list[str]]:
    passage = obj.get("passage")
    if not isinstance(passage, str) or not passage.strip():
        raise InputError("expected a non-empty string", path=path, line=line_no, field="passage")
    if "query" in obj:
        options = [obj["query"]]
        name = "query"
    else:
        options = obj.get("queries")
        name = "queries"
        if not isinstance(options, list) or not options:
            raise InputError("expected 'query' (a string) or 'queries' (a non-empty list of strings)", path=path,
                             line=line_no, field="query")
    if not all(isinstance(query, str) and query.strip() for query in options):
        raise InputError("queries must be non-empty strings", path=path, line=line_no, field=name)
    return passage, list(options)


def build_span_dataset(spec: ContextSpec, source: str | Path | None, tokenizer, max_len: int,
                       cache_dir: str | Path, seed: int = 0) -> SpanDataset | PairDataset:
    """The dataset a method's ``context`` asks for: document spans of ``source`` or the ``pairs`` file."""
    spec = spec.validate()
    if spec.kind == "pairs" and not spec.pairs:
        raise ConfigError("context kind 'pairs' needs context.pairs: a JSONL file of {\"passage\", \"query\"} lines "
                          "(e.g. training queries with their positives, or docT5query pseudo-queries)")
    if spec.kind == "pairs":
        return PairDataset(spec.pairs, tokenizer, max_len, spec.query_max_len, seed=seed, redraw=spec.redraw)
    if source is None:
        raise ConfigError("document context spans need the pre-training corpus")
    return SpanDataset(SpanCorpus.build(source, tokenizer, max_len, cache_dir), spec.kind, seed=seed,
                       redraw=spec.redraw, anchors=spec.anchors)


def write_qrels_pairs(collection, split: str, out: str | Path, min_grade: int = 1) -> int:
    """Write every (judged-relevant passage, query) of ``split`` of a BEIR collection as pairs JSONL.

    ``collection`` is a :class:`pretrieve.data.collection.BeirCollection`. Returns the number of pairs."""
    corpus = collection.load_corpus()
    queries = collection.load_queries(split)
    qrels = collection.load_qrels(split)
    count = 0
    with atomic_open(out) as handle:
        for qid, judged in qrels.items():
            if qid not in queries:
                continue
            for doc_id, grade in judged.items():
                if grade < min_grade:
                    continue
                try:
                    row = corpus.row(doc_id)
                except (KeyError, InputError):
                    continue
                handle.write(json.dumps({"passage": corpus.full_text(row), "query": queries[qid]}) + "\n")
                count += 1
    return count
