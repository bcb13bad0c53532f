"""BM25 lexical retrieval over a BEIR corpus (bm25s backend): build, search, save, load.

Owns the lexical baseline and the first-stage negative miner. Every document is indexed as
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

As in Lucene, a document is returned for a query only when it matches at least one query term
(score > 0), so a run may hold fewer than ``k`` documents for a query; a query whose terms are
all stopwords or unknown gets an empty ranking.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pretrieve.data.beir import Corpus
from pretrieve.data.trec import Run


def _import_bm25s():
    """Import bm25s, which sets its own logger to DEBUG on import; keep it at WARNING or above."""
    import bm25s

    bm25s_logger = logging.getLogger("bm25s")
    bm25s_logger.setLevel(max(bm25s_logger.level, logging.WARNING))
    return bm25s
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json

logger = logging.getLogger(__name__)

BM25_FORMAT = "pretrieve-bm25/1"
_META_FILE = "pretrieve_bm25.json"
_IDS_FILE = "doc_ids.json"
_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


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
            import Stemmer

            if self.stemmer not in Stemmer.algorithms():
                raise ConfigError(f"unknown stemmer '{self.stemmer}' (PyStemmer knows: "
                                  f"{', '.join(Stemmer.algorithms())})")


def default_threads() -> int:
    """Threads for batch retrieval: every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class BM25Index:
    """A BM25 index over one corpus; rows are mapped back to the corpus' document ids."""

    def __init__(self, retriever, tokenizer, doc_ids: list[str], params: BM25Params):
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.doc_ids = doc_ids
        self.params = params

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, corpus: Corpus, k1: float = 0.9, b: float = 0.4, method: str = "lucene",
              stemmer: str | None = "english", stopwords: str | None = "en",
              show_progress: bool = False) -> "BM25Index":
        """Tokenize ``title + text`` of every document and build the score matrix."""
        params = BM25Params(k1=k1, b=b, method=method, stemmer=stemmer, stopwords=stopwords)
        return cls.build_from_texts(corpus.ids, corpus.full_texts(), params, show_progress=show_progress)

    @classmethod
    def build_from_texts(cls, doc_ids: Sequence[str], texts: Sequence[str], params: BM25Params | None = None,
                         show_progress: bool = False) -> "BM25Index":
        """Build from parallel lists of ids and texts (what :meth:`build` does for a Corpus)."""
        bm25s = _import_bm25s()

        params = params or BM25Params()
        params.validate()
        if len(doc_ids) != len(texts):
            raise InputError(f"{len(doc_ids)} document ids but {len(texts)} texts")
        if not doc_ids:
            raise InputError("cannot build a BM25 index over an empty corpus")
        tokenizer = make_tokenizer(params)
        token_ids = tokenizer.tokenize(list(texts), update_vocab=True, return_as="ids",
                                       show_progress=show_progress)
        retriever = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
        retriever.index((token_ids, tokenizer.get_vocab_dict()), show_progress=show_progress)
        return cls(retriever, tokenizer, list(doc_ids), params)

    def __len__(self) -> int:
        return len(self.doc_ids)

    # ------------------------------------------------------------------ searching
    def search(self, queries: Mapping[str, str], k: int = 1000, exclude_self: bool = False,
               n_threads: int | None = None, show_progress: bool = False) -> Run:
        """Top-``k`` documents per query as a run ``{qid: {doc_id: score}}``.

        ``exclude_self`` drops a document whose id equals the query id (ArguAna-style collections,
        where each query is also a corpus document); ``k`` documents are still returned when the
        corpus has them. ``n_threads`` (default: every usable core) parallelises the batch.
        """
        qids, indices, scores = self.search_arrays(queries, k=k + (1 if exclude_self else 0),
                                                   n_threads=n_threads, show_progress=show_progress)
        run: Run = {}
        for row, qid in enumerate(qids):
            docs: dict[str, float] = {}
            for idx, score in zip(indices[row].tolist(), scores[row].tolist()):
                if score <= 0.0:
                    break  # sorted descending: the rest match no query term
                doc_id = self.doc_ids[idx]
                if exclude_self and doc_id == qid:
                    continue
                docs[doc_id] = float(score)
                if len(docs) == k:
                    break
            run[qid] = docs
        return run

    def search_arrays(self, queries: Mapping[str, str], k: int = 1000, n_threads: int | None = None,
                      show_progress: bool = False) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Batch retrieval as arrays: ``(query_ids, rows [Q, k'], scores [Q, k'])``, ``k' = min(k, N)``.

        Rows index :attr:`doc_ids`; scores are sorted descending and 0 marks a non-matching document.
        """
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        qids = list(queries)
        if not qids:
            return [], np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        k = min(k, len(self.doc_ids))
        token_ids = self.tokenizer.tokenize([queries[q] for q in qids], update_vocab=False, return_as="ids",
                                            show_progress=False)
        threads = default_threads() if n_threads is None else n_threads
        indices, scores = self.retriever.retrieve(token_ids, k=k, show_progress=show_progress,
                                                  n_threads=threads if len(qids) > 1 else 0)
        return qids, np.asarray(indices, dtype=np.int64), np.asarray(scores, dtype=np.float32)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the index (bm25s files + tokenizer vocabulary + document ids + params) atomically."""
        path = Path(path)
        with atomic_dir(path) as tmp:
            self.retriever.save(str(tmp), show_progress=False)
            self.tokenizer.save_vocab(str(tmp))
            self.tokenizer.save_stopwords(str(tmp))
            with open(tmp / _IDS_FILE, "w", encoding="utf-8") as handle:
                json.dump(self.doc_ids, handle)
            write_json(tmp / _META_FILE, {"format": BM25_FORMAT, "params": asdict(self.params),
                                          "num_docs": len(self.doc_ids)})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "BM25Index":
        """Load an index written by :meth:`save`."""
        bm25s = _import_bm25s()

        path = Path(path)
        meta_path = path / _META_FILE
        if not meta_path.exists():
            raise InputError(f"not a pretrieve BM25 index ({_META_FILE} missing)", path=path)
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != BM25_FORMAT:
            raise InputError(f"unsupported BM25 index format {meta.get('format')!r} (expected {BM25_FORMAT})",
                             path=meta_path, field="format")
        params = BM25Params(**meta["params"])
        tokenizer = make_tokenizer(params)
        tokenizer.load_vocab(str(path))
        tokenizer.load_stopwords(str(path))
        retriever = bm25s.BM25.load(str(path), show_progress=False)
        doc_ids = json.loads((path / _IDS_FILE).read_text(encoding="utf-8"))
        if len(doc_ids) != retriever.scores["num_docs"]:
            raise InputError(f"{len(doc_ids)} document ids for {retriever.scores['num_docs']} indexed documents",
                             path=path / _IDS_FILE)
        return cls(retriever, tokenizer, doc_ids, params)


def make_tokenizer(params: BM25Params):
    """The bm25s tokenizer for ``params``: lower-case, split, drop stopwords, stem."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer(params.stemmer) if params.stemmer else None
    return bm25s.tokenization.Tokenizer(lower=True, stopwords=params.stopwords, stemmer=stemmer)


def bm25_run(corpus: Corpus, queries: Mapping[str, str], k: int = 1000, k1: float = 0.9, b: float = 0.4,
             exclude_self: bool = False) -> Run:
    """Index ``corpus`` and search ``queries`` in one call (the ``pretrieve bm25`` command)."""
    index = BM25Index.build(corpus, k1=k1, b=b)
    return index.search(queries, k=k, exclude_self=exclude_self)
