"""BM25 lexical retrieval over a BEIR corpus (bm25s backend): build, save, memory-map, search.

The lexical back-end ``bm25`` (:data:`pretrieve.retrieval.index.LEXICAL_BACKENDS`, the
:class:`~pretrieve.retrieval.index.LexicalBackend` contract: :data:`SCRATCH_NAME`, :func:`params`,
:func:`open_index`, :func:`index_space`). Its run files and mined negatives are written by
:mod:`pretrieve.retrieval.runs` (``lexical_run_file``, ``bm25_negatives``), the one producer of run files. Every document is indexed as
``title + " " + text`` in one field, the "flat" setting of Pyserini's BEIR baselines.

Analysis (fixed per index and saved with it): lower-casing, bm25s' word splitter ``\\b\\w\\w+\\b``
(tokens of at least two word characters), bm25s' English stopword list, then the Snowball
English (Porter2) stemmer from PyStemmer. Scoring uses bm25s' ``"lucene"`` variant, i.e. Lucene's
``BM25Similarity`` (Lucene >= 8, as in Pyserini): ``idf = log(1 + (N - df + 0.5) / (df + 0.5))`` times
``tf / (tf + k1 * (1 - b + b * dl / avgdl))``, summed over the query terms (Lucene 8 dropped the
constant ``k1 + 1`` numerator factor; rankings are unchanged by it).

Defaults ``k1=0.9, b=0.4`` are Pyserini's (Anserini's) defaults, used for every dataset in the BEIR
Pyserini baselines. Measured on SciFact test (300 queries, 5,183 documents), nDCG@10:
k1=0.9/b=0.4 → 0.6762 (Pyserini flat reports 0.679); k1=1.2/b=0.75 → 0.6791; bm25s' own default
k1=1.5/b=0.75 → 0.6863; with the Porter (not Porter2) stemmer 0.6713; without stemming 0.6569.
We keep the Pyserini defaults so numbers are comparable with published BEIR baselines.

As in Lucene, a document is returned for a query only when it matches at least one query term, so a run
may hold fewer than ``k`` documents for a query; a query whose terms are all stopwords or unknown gets an
empty ranking.

Scale (MS MARCO's 8.8M passages, 500k training queries). Nothing here holds the corpus, the token lists of
all documents or the results of all queries:

* :func:`write_index` streams ``(id, text)`` pairs in chunks of :data:`CHUNK_DOCS`: each chunk is tokenised
  with bm25s' tokenizer (one vocabulary, so token ids are exactly bm25s'), reduced to (document, term,
  frequency) triples with numpy and spilled to disk; a second pass scores the triples with bm25s' own idf and
  term-frequency functions and places them by counting sort straight into the memory-mapped CSC arrays that
  ``bm25s.BM25.save`` writes (``data/indices/indptr.csc.index.npy``), so scores are bit-identical to
  ``bm25s.BM25.index``. Peak memory is one chunk plus the document lengths and the vocabulary.
* :meth:`BM25Index.load` opens a saved index with ``bm25s.BM25.load(mmap=True)``; document ids are a
  memory-mapped ``doc_ids.npy``. A search reads only the posting lists of the query's terms.
* :meth:`BM25Index.iter_search` scores batches of queries on several threads and yields each query's ranking
  in input order as soon as it is ready; :mod:`pretrieve.retrieval.runs` writes them to the run / groups file as
  they come.
* :func:`corpus_index` builds the index of a collection's corpus, or reuses the one saved at ``index_dir`` when
  it is current by :mod:`pretrieve.artifacts` (same analysis and scoring settings, same corpus content).

Each query is scored over the documents its terms occur in (sum of the terms' posting-list entries in query
order, float32, as bm25s does); when those postings cover a large share of the corpus a dense score array is
used instead. Ties are broken by corpus order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pretrieve import artifacts, ranks
from pretrieve.data.beir import Corpus, iter_corpus
from pretrieve.data.trec import Run
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, temporary_dir, write_json
from pretrieve.progress import Progress

logger = logging.getLogger(__name__)

BM25_FORMAT = "pretrieve-bm25/2"
ARTIFACT_KIND = "bm25-index"
CHUNK_DOCS = 50_000
QUERY_BATCH = 64
_META_FILE = "pretrieve_bm25.json"
_IDS_FILE = "doc_ids.npy"
_SCRATCH = "_chunks"
#: The temporary directory of an index built for one run (``.pretrieve-bm25.<random>.tmp`` beside the run).
SCRATCH_NAME = "pretrieve-bm25"
_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
#: A query is scored with a dense array over the whole corpus when its postings exceed this share of it.
_DENSE_SHARE = 0.125


#: The modules bm25s' ``selection`` imports to pick JAX for its top-k when it can.
_JAX_MODULES = ("jax", "jax.lax")


def import_bm25s():
    """Import bm25s without JAX, its logger kept at WARNING or above (bm25s sets it to DEBUG on import).

    bm25s' ``selection`` module imports ``jax.lax`` when it is importable and runs a top-k with it at import,
    which starts XLA: on a GPU it preallocates most of the device's memory, fighting torch for it. pretrieve
    never uses bm25s' top-k (the search selects its own, with numpy) and asks bm25s for its numpy backend, so JAX
    is hidden while bm25s is first imported (``sys.modules[name] = None`` makes ``import jax`` fail) and put back
    after: a program that uses JAX itself keeps it, and bm25s records JAX as unavailable.
    """
    if "bm25s" not in sys.modules:
        missing = object()
        saved = {name: sys.modules.get(name, missing) for name in _JAX_MODULES}
        sys.modules.update(dict.fromkeys(_JAX_MODULES))
        try:
            import bm25s  # noqa: F401 - lazy: bm25s — the first import, with JAX hidden
        finally:
            for name, module in saved.items():
                if module is missing:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
    import bm25s  # lazy: bm25s

    bm25s_logger = logging.getLogger("bm25s")
    bm25s_logger.setLevel(max(bm25s_logger.level, logging.WARNING))
    return bm25s


@dataclass(frozen=True)
class BM25Params:
    """Scoring and analysis settings of one BM25 index (saved with it)."""

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"

    def validate(self) -> None:
        if self.k1 < 0:
            raise ConfigError(f"BM25 k1 must be >= 0, got {self.k1}")
        if not 0.0 <= self.b <= 1.0:
            raise ConfigError(f"BM25 b must be in [0, 1], got {self.b}")
        if self.method not in _METHODS:
            raise ConfigError(f"unknown BM25 method '{self.method}' (choose from {', '.join(_METHODS)})")
        if self.stemmer is not None:
            import Stemmer  # lazy: Stemmer

            if self.stemmer not in Stemmer.algorithms():
                raise ConfigError(f"unknown stemmer '{self.stemmer}' (PyStemmer knows: "
                                  f"{', '.join(Stemmer.algorithms())})")

    def settings(self) -> dict[str, Any]:
        """What an index built with these parameters is recorded with (its freshness settings)."""
        return {"format": BM25_FORMAT, **asdict(self)}


def default_threads() -> int:
    """Threads for batch retrieval: every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def make_tokenizer(params: BM25Params):
    """The bm25s tokenizer for ``params``: lower-case, split, drop stopwords, stem."""
    bm25s = import_bm25s()
    import Stemmer  # lazy: Stemmer

    stemmer = Stemmer.Stemmer(params.stemmer) if params.stemmer else None
    return bm25s.tokenization.Tokenizer(lower=True, stopwords=params.stopwords, stemmer=stemmer)


# ------------------------------------------------------------------------------------------------ building
class DuplicateDocumentId(InputError):
    """Two documents share an id; ``rows`` are their 0-based positions in the stream."""

    def __init__(self, doc_id: str, rows: tuple[int, int]):
        self.doc_id = doc_id
        self.rows = rows
        super().__init__(f"duplicate document id '{doc_id}' (documents {rows[0] + 1} and {rows[1] + 1})")


def write_index(documents: Iterable[tuple[str, str]], directory: str | Path, params: BM25Params | None = None,
                show_progress: bool = False, chunk_docs: int = CHUNK_DOCS) -> int:
    """Index ``(doc_id, text)`` pairs into ``directory`` (created; any content there is replaced).

    Streams the documents in chunks (see the module docstring); returns the number of documents. The directory
    holds bm25s' files (``bm25s.BM25.load`` reads it), the tokenizer's vocabulary and stopwords,
    ``doc_ids.npy`` and ``pretrieve_bm25.json``.
    """
    import_bm25s()
    from bm25s import scoring  # lazy: bm25s

    params = params or BM25Params()
    params.validate()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    scratch = directory / _SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    tokenizer = make_tokenizer(params)
    lengths_parts: list[np.ndarray] = []
    ids_parts: list[np.ndarray] = []
    chunk_files: list[Path] = []
    doc_freq = np.zeros(0, dtype=np.int64)
    num_docs = 0
    with Progress(desc="BM25 tokenise", unit="docs", disable=not show_progress) as progress:
        for chunk in _batched(documents, chunk_docs):
            ids, texts = zip(*chunk)
            token_lists = list(tokenizer.streaming_tokenize(texts, update_vocab=True))
            lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
            terms = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64,
                                count=int(lengths.sum()))
            del token_lists
            rows = np.repeat(np.arange(num_docs, num_docs + len(chunk), dtype=np.int64), lengths)
            keys, term_freq = np.unique((rows << 32) | terms, return_counts=True)  # by row, then term
            triples = np.stack([keys >> 32, keys & 0xFFFFFFFF, term_freq]).astype(np.int32)
            vocab_size = len(tokenizer.get_vocab_dict())
            if vocab_size > len(doc_freq):
                doc_freq = np.concatenate([doc_freq, np.zeros(vocab_size - len(doc_freq), dtype=np.int64)])
            seen_terms, counts = np.unique(triples[1], return_counts=True)
            doc_freq[seen_terms] += counts
            chunk_files.append(scratch / f"{len(chunk_files)}.npy")
            np.save(chunk_files[-1], triples)
            lengths_parts.append(lengths.astype(np.int32))
            ids_parts.append(_id_array(ids))
            num_docs += len(chunk)
            progress.update(len(chunk))
    if num_docs == 0:
        raise InputError("cannot build a BM25 index over an empty corpus")
    doc_ids = np.concatenate(ids_parts)
    del ids_parts
    _check_unique(doc_ids)
    lengths = np.concatenate(lengths_parts)
    del lengths_parts

    # bm25s' own idf / tf functions, fed exactly what BM25.index feeds them (so the scores are bit-identical)
    retriever = _new_retriever(params)
    avg_doc_len = lengths.astype(np.int64).mean()
    frequencies = dict(enumerate(doc_freq.tolist()))
    idf = scoring._build_idf_array(frequencies, n_docs=num_docs,
                                   compute_idf_fn=scoring._select_idf_scorer(retriever.idf_method),
                                   dtype=retriever.dtype)
    nonoccurrence = None
    if params.method in retriever.methods_requiring_nonoccurrence:
        nonoccurrence = scoring._build_nonoccurrence_array(
            frequencies, n_docs=num_docs, compute_idf_fn=scoring._select_idf_scorer(retriever.idf_method),
            calculate_tfc_fn=scoring._select_tfc_scorer(params.method), l_d=avg_doc_len, l_avg=avg_doc_len,
            k1=params.k1, b=params.b, delta=retriever.delta, dtype=retriever.dtype)
    del frequencies
    tfc = scoring._select_tfc_scorer(params.method)
    indptr = np.zeros(len(doc_freq) + 1, dtype=np.int64)
    np.cumsum(doc_freq, out=indptr[1:])
    nnz = int(indptr[-1])
    data = np.lib.format.open_memmap(directory / "data.csc.index.npy", mode="w+", dtype=retriever.dtype,
                                     shape=(nnz,))
    indices = np.lib.format.open_memmap(directory / "indices.csc.index.npy", mode="w+",
                                        dtype=retriever.int_dtype, shape=(nnz,))
    heads = indptr[:-1].copy()  # next free position of each term's posting list
    for chunk_file in Progress(chunk_files, desc="BM25 score", unit="chunks", disable=not show_progress):
        rows, terms, term_freq = np.load(chunk_file)
        chunk_file.unlink()
        scores = idf[terms] * tfc(tf_array=term_freq.astype(np.float32), l_d=lengths[rows].astype(np.float64),
                                  l_avg=avg_doc_len, k1=params.k1, b=params.b, delta=retriever.delta)
        if nonoccurrence is not None:
            scores -= nonoccurrence[terms]
        order = np.argsort(terms, kind="stable")  # by term, rows ascending within a term (CSC order)
        terms, rows, scores = terms[order], rows[order], scores[order]
        seen_terms, starts, counts = np.unique(terms, return_index=True, return_counts=True)
        positions = heads[terms] + (np.arange(len(terms)) - np.repeat(starts, counts))
        data[positions] = scores.astype(retriever.dtype)
        indices[positions] = rows
        heads[seen_terms] += counts
    data.flush()
    indices.flush()
    del data, indices
    shutil.rmtree(scratch)
    np.save(directory / "indptr.csc.index.npy", indptr)
    _save_bm25s_metadata(retriever, tokenizer.get_vocab_dict(), num_docs, nonoccurrence, directory)
    tokenizer.save_vocab(str(directory))
    tokenizer.save_stopwords(str(directory))
    np.save(directory / _IDS_FILE, doc_ids)
    write_json(directory / _META_FILE, {"format": BM25_FORMAT, "params": asdict(params), "num_docs": num_docs,
                                        "num_terms": len(doc_freq), "postings": nnz})
    return num_docs


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _id_array(ids: Sequence[str]) -> np.ndarray:
    array = np.array(ids, dtype=str)
    if array.ndim != 1 or len(array) != len(ids):
        raise InputError("document ids must be strings")
    return array


def _check_unique(doc_ids: np.ndarray) -> None:
    order = np.argsort(doc_ids, kind="stable")
    ordered = doc_ids[order]
    repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(repeated):
        first, second = sorted((int(order[repeated[0]]), int(order[repeated[0] + 1])))
        raise DuplicateDocumentId(str(doc_ids[first]), (first, second))


def _new_retriever(params: BM25Params):
    bm25s = import_bm25s()
    return bm25s.BM25(k1=params.k1, b=params.b, method=params.method, backend="numpy")


def _save_bm25s_metadata(retriever, vocab: dict, num_docs: int, nonoccurrence: np.ndarray | None,
                         directory: Path) -> None:
    """bm25s' ``params.index.json``, ``vocab.index.json`` (and non-occurrence array), written by ``BM25.save``
    itself — given placeholder score arrays, so the real ones written above are not copied."""
    placeholder = {"data": np.zeros(0, dtype=retriever.dtype), "indices": np.zeros(0, dtype=retriever.int_dtype),
                   "indptr": np.zeros(1, dtype=np.int64), "num_docs": num_docs}
    retriever.scores, retriever.vocab_dict, retriever.nonoccurrence_array = placeholder, vocab, nonoccurrence
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        retriever.save(scratch, show_progress=False)
        for name in os.listdir(scratch):
            if not name.endswith(".csc.index.npy"):
                os.replace(os.path.join(scratch, name), directory / name)


# ------------------------------------------------------------------------------------------------ the index
class BM25Index:
    """A BM25 index over one corpus; rows are mapped back to the corpus' document ids."""

    def __init__(self, retriever, tokenizer, doc_ids: np.ndarray, params: BM25Params):
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.doc_ids = doc_ids
        self.params = params
        self._data = retriever.scores["data"]
        self._indices = retriever.scores["indices"]
        self._indptr = retriever.scores["indptr"]
        self._nonoccurrence = retriever.nonoccurrence_array
        self._empty_token = tokenizer.word_to_id.get("")

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, corpus: Corpus, k1: float = 0.9, b: float = 0.4, method: str = "lucene",
              stemmer: str | None = "english", stopwords: str | None = "en",
              show_progress: bool = False) -> "BM25Index":
        """Index ``title + text`` of every document of an in-memory corpus (see :func:`corpus_index` for files)."""
        params = BM25Params(k1=k1, b=b, method=method, stemmer=stemmer, stopwords=stopwords)
        documents = ((corpus.ids[row], corpus.full_text(row)) for row in range(len(corpus)))
        return cls.build_from_documents(documents, params, show_progress=show_progress)

    @classmethod
    def build_from_texts(cls, doc_ids: Sequence[str], texts: Sequence[str], params: BM25Params | None = None,
                         show_progress: bool = False) -> "BM25Index":
        """Build from parallel lists of ids and texts (what :meth:`build` does for a Corpus)."""
        if len(doc_ids) != len(texts):
            raise InputError(f"{len(doc_ids)} document ids but {len(texts)} texts")
        return cls.build_from_documents(zip(doc_ids, texts), params, show_progress=show_progress)

    @classmethod
    def build_from_documents(cls, documents: Iterable[tuple[str, str]], params: BM25Params | None = None,
                             show_progress: bool = False) -> "BM25Index":
        """Build from ``(doc_id, text)`` pairs and hold the index in memory (written to a temporary directory and
        read back; use :func:`write_index` + :meth:`load` to keep it on disk, memory-mapped)."""
        with tempfile.TemporaryDirectory(prefix="pretrieve-bm25-") as tmp:
            write_index(documents, tmp, params, show_progress=show_progress)
            return cls.load(tmp, mmap=False)

    def __len__(self) -> int:
        return len(self.doc_ids)

    # ------------------------------------------------------------------ searching
    def search(self, queries: Mapping[str, str], k: int = 1000, exclude_self: bool = False,
               n_threads: int | None = None, show_progress: bool = False) -> Run:
        """Top-``k`` documents per query as a run ``{qid: {doc_id: score}}`` (for query sets that fit in memory;
        :meth:`iter_search` streams)."""
        return {qid: dict(ranking) for qid, ranking in self.iter_search(queries.items(), k=k, exclude_self=exclude_self,
                                                                        n_threads=n_threads,
                                                                        show_progress=show_progress)}

    def iter_search(self, queries: Iterable[tuple[str, str]], k: int = 1000, exclude_self: bool = False,
                    n_threads: int | None = None, batch_size: int = QUERY_BATCH, show_progress: bool = False,
                    total: int | None = None) -> Iterator[tuple[str, list[tuple[str, float]]]]:
        """``(query_id, [(doc_id, score), ...])`` best first, for each ``(query_id, text)`` in input order.

        Queries are tokenised here and scored in batches of ``batch_size`` on ``n_threads`` threads (default:
        every usable core; 0 or 1: this thread); at most two batches per thread are in flight, so memory does
        not grow with the number of queries. ``exclude_self`` drops a document whose id equals the query id
        (ArguAna-style collections); ``k`` documents are still returned when the corpus has them.
        """
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        threads = default_threads() if n_threads is None else n_threads
        depth = min(k + (1 if exclude_self else 0), len(self.doc_ids))
        batches = (self._tokenized(batch) for batch in _batched(queries, batch_size))
        with Progress(total=total, desc="BM25 search", unit="queries", disable=not show_progress) as progress:
            for qids, results in self._scored(batches, depth, threads):
                for qid, (rows, scores) in zip(qids, results):
                    ranking = list(zip(self.doc_ids[rows].tolist(), scores.tolist()))
                    if exclude_self:
                        ranking = [(doc_id, score) for doc_id, score in ranking if doc_id != qid]
                    yield qid, ranking[:k]
                progress.update(len(qids))

    def _tokenized(self, batch: list[tuple[str, str]]) -> tuple[list[str], list[np.ndarray]]:
        qids = [qid for qid, _ in batch]
        token_lists = self.tokenizer.streaming_tokenize([text for _, text in batch], update_vocab=False)
        terms = [np.asarray([t for t in tokens if t != self._empty_token], dtype=np.int64) for tokens in token_lists]
        return qids, terms

    def _scored(self, batches: Iterator[tuple[list[str], list[np.ndarray]]], depth: int, threads: int):
        def score_batch(batch):
            qids, terms = batch
            return qids, [self._top(query_terms, depth) for query_terms in terms]

        if threads <= 1:
            yield from map(score_batch, batches)
            return
        with ThreadPoolExecutor(max_workers=threads) as pool:
            pending: deque = deque()
            for batch in batches:
                pending.append(pool.submit(score_batch, batch))
                if len(pending) >= 2 * threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def _top(self, terms: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and scores of the ``depth`` best documents matching at least one of ``terms`` (best first)."""
        if len(terms) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        starts, ends = self._indptr[terms], self._indptr[terms + 1]
        postings = int((ends - starts).sum())
        if postings == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        num_docs = len(self.doc_ids)
        if postings > _DENSE_SHARE * num_docs:
            totals = np.zeros(num_docs, dtype=self._data.dtype)
            matched = np.zeros(num_docs, dtype=bool)
            for start, end in zip(starts.tolist(), ends.tolist()):
                rows = self._indices[start:end]
                totals[rows] += self._data[start:end]  # rows are unique within one posting list
                matched[rows] = True
            candidates = np.flatnonzero(matched)
            scores = totals[candidates]
        else:
            all_rows = np.concatenate([self._indices[s:e] for s, e in zip(starts.tolist(), ends.tolist())])
            candidates, slot = np.unique(all_rows, return_inverse=True)
            scores = np.zeros(len(candidates), dtype=self._data.dtype)
            offset = 0
            for start, end in zip(starts.tolist(), ends.tolist()):  # query-term order, as bm25s sums
                scores[slot[offset:offset + end - start]] += self._data[start:end]
                offset += end - start
        if self._nonoccurrence is not None:
            scores += self._nonoccurrence[terms].sum()
        if len(candidates) > depth:
            keep = np.argpartition(-scores, depth - 1)[:depth]
            candidates, scores = candidates[keep], scores[keep]
        order = np.lexsort((candidates, -scores))
        return candidates[order].astype(np.int64), scores[order]

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the index atomically to ``path`` (a copy of its files; no freshness record: see
        :func:`corpus_index` for an index reused across runs)."""
        path = Path(path)
        with atomic_dir(path) as tmp:
            for name, array in (("data.csc.index.npy", self._data), ("indices.csc.index.npy", self._indices),
                                ("indptr.csc.index.npy", self._indptr)):
                np.save(tmp / name, array)
            _save_bm25s_metadata(_new_retriever(self.params), self.tokenizer.get_vocab_dict(), len(self.doc_ids),
                                 self._nonoccurrence, tmp)
            self.tokenizer.save_vocab(str(tmp))
            self.tokenizer.save_stopwords(str(tmp))
            np.save(tmp / _IDS_FILE, np.asarray(self.doc_ids))
            write_json(tmp / _META_FILE, {"format": BM25_FORMAT, "params": asdict(self.params),
                                          "num_docs": len(self.doc_ids), "num_terms": len(self._indptr) - 1,
                                          "postings": len(self._data)})
        return path

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True) -> "BM25Index":
        """Open an index written by :func:`write_index` / :meth:`save`; ``mmap`` maps its arrays instead of
        reading them (``bm25s.BM25.load(mmap=True)``)."""
        bm25s = import_bm25s()

        path = Path(path)
        meta_path = path / _META_FILE
        if not meta_path.exists():
            raise InputError(f"not a pretrieve BM25 index ({_META_FILE} missing)", path=path)
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != BM25_FORMAT:
            raise InputError(f"unsupported BM25 index format {meta.get('format')!r} (expected {BM25_FORMAT}; "
                             "build the index again)", path=meta_path, field="format")
        params = BM25Params(**meta["params"])
        tokenizer = make_tokenizer(params)
        tokenizer.load_vocab(str(path))
        tokenizer.load_stopwords(str(path))
        # the search maps query words with the tokenizer's vocabulary; bm25s' copy of it is not needed
        retriever = bm25s.BM25.load(str(path), mmap=mmap, load_vocab=False, show_progress=False, backend="numpy")
        doc_ids = np.load(path / _IDS_FILE, mmap_mode="r" if mmap else None)
        if len(doc_ids) != retriever.scores["num_docs"]:
            raise InputError(f"{len(doc_ids)} document ids for {retriever.scores['num_docs']} indexed documents",
                             path=path / _IDS_FILE)
        return cls(retriever, tokenizer, doc_ids, params)


# ------------------------------------------------------------------------------------------- collections
def corpus_documents(corpus_path: str | Path) -> Iterator[tuple[str, str]]:
    """Stream ``(doc_id, title + " " + text)`` from a ``corpus.jsonl`` (validated line by line)."""
    for _, doc in iter_corpus(corpus_path):
        yield doc.id, doc.full_text()


@contextlib.contextmanager
def corpus_index(corpus_path: str | Path, params: BM25Params | None = None, index_dir: str | Path | None = None,
                 scratch_dir: str | Path | None = None, show_progress: bool = False) -> Iterator[BM25Index]:
    """The memory-mapped BM25 index of a ``corpus.jsonl``.

    With ``index_dir``, an index there is reused when :mod:`pretrieve.artifacts` finds it current (same
    settings, same corpus content); otherwise it is built there atomically and recorded. Without, it is built
    in a temporary directory (``.pretrieve-bm25.<random>.tmp`` inside ``scratch_dir``, default the system's)
    removed when the block ends; a killed run's is a leftover the next one removes
    (:func:`pretrieve.outputs.producing`).
    """
    params = params or BM25Params()
    params.validate()
    corpus_path = Path(corpus_path)
    if index_dir is not None:
        index_dir = Path(index_dir)
        inputs = {"corpus": corpus_path}
        status = artifacts.check(index_dir, params.settings(), inputs, kind=ARTIFACT_KIND)
        if status.current:
            logger.info("reusing the BM25 index in %s", index_dir)
        else:
            if status.exists:
                logger.info("rebuilding the BM25 index: %s", status.reason)
            with artifacts.write_dir(index_dir, ARTIFACT_KIND, params.settings(), inputs) as tmp:
                _write_corpus_index(corpus_path, tmp, params, show_progress)
        yield BM25Index.load(index_dir)
        return
    with temporary_dir(SCRATCH_NAME, scratch_dir) as tmp:
        _write_corpus_index(corpus_path, tmp, params, show_progress)
        yield BM25Index.load(tmp)


def index_space(corpus_path: str | Path) -> tuple[int, int]:
    """``(bytes, largest file)`` the BM25 index of ``corpus_path`` takes at least, for the preflight: its score and
    row arrays are each 23-30 % of the JSONL's size on the collections measured (SciFact, NFCorpus-like medical,
    Cranfield, ADI, LISA, TIME); half of that is assumed, so an index that fits is never refused."""
    size = Path(corpus_path).stat().st_size
    return size // 4, size // 8


def _write_corpus_index(corpus_path: Path, directory: str | Path, params: BM25Params, show_progress: bool) -> None:
    try:
        write_index(corpus_documents(corpus_path), directory, params, show_progress=show_progress)
    except DuplicateDocumentId as exc:  # name the lines (found again only on this error path)
        lines = [line for row, (line, _) in enumerate(_corpus_lines(corpus_path)) if row in exc.rows]
        raise InputError(f"duplicate document id '{exc.doc_id}' (first seen on line {lines[0]})", path=corpus_path,
                         line=lines[1], field="_id") from None
    except InputError as exc:
        if exc.path is None:
            raise InputError(exc.message, path=corpus_path) from None
        raise


def _corpus_lines(corpus_path: Path) -> Iterator[tuple[int, str]]:
    for line_no, doc in iter_corpus(corpus_path):
        yield line_no, doc.id


def bm25_run(corpus: Corpus, queries: Mapping[str, str], k: int = 1000, k1: float = 0.9, b: float = 0.4,
             exclude_self: bool = False) -> Run:
    """Index an in-memory ``corpus`` and search ``queries`` in one call."""
    index = BM25Index.build(corpus, k1=k1, b=b)
    return index.search(queries, k=k, exclude_self=exclude_self)


@contextlib.contextmanager
def shared_corpus_index(corpus_path: str | Path, params: BM25Params, index_dir: str | Path | None = None,
                        scratch_dir: str | Path | None = None, show_progress: bool = False) -> Iterator[BM25Index]:
    """:func:`corpus_index`, built once when several ranks run (:mod:`pretrieve.ranks`): rank 0 builds it (in
    ``index_dir``, default ``scratch_dir/.bm25-index``) while the others wait, then every rank memory-maps it."""
    if ranks.active() and index_dir is None:
        index_dir = Path(scratch_dir or ".") / ".bm25-index"
    if ranks.active():
        def build() -> None:
            with corpus_index(corpus_path, params, index_dir, scratch_dir=scratch_dir, show_progress=show_progress):
                pass

        ranks.once("build the BM25 index", build)
    with corpus_index(corpus_path, params, index_dir, scratch_dir=scratch_dir, show_progress=show_progress) as index:
        yield index


# ------------------------------------------------------------------------------------- the lexical back-end
def params(**options: Any) -> BM25Params:
    """The back-end's settings from named options (``k1``, ``b``, ``method``, ``stemmer``, ``stopwords``)."""
    return BM25Params(**options)


#: The back-end's index over a corpus file, built once across ranks (see :func:`shared_corpus_index`).
open_index = shared_corpus_index
