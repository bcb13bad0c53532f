"""A collection directory in BEIR layout (:class:`BeirCollection`): where its corpus, queries and qrels are, the
files read by :mod:`pretrieve.data.beir`, and the same files as memory-mapped Arrow datasets
(:mod:`pretrieve.data.arrow`).

:mod:`pretrieve.data.arrow` (pyarrow, ~0.2 s) is imported when a dataset is first asked for, not with this module,
so that ``pretrieve --help`` and the commands that read JSONL only do not pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pretrieve.data.beir import Corpus, Qrels, load_qrels, load_queries
from pretrieve.data.records import collection_file
from pretrieve.errors import InputError

if TYPE_CHECKING:
    import datasets

    from pretrieve.data.arrow import IdIndex


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
        return collection_file(self.root, "corpus.jsonl")

    @property
    def queries_path(self) -> Path:
        return collection_file(self.root, "queries.jsonl")

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
        from pretrieve.data.arrow import corpus_dataset  # lazy: pyarrow

        return corpus_dataset(self.corpus_path, num_proc=num_proc, cache_dir=cache_dir)

    def corpus_index(self, num_proc: int | None = None, cache_dir: str | Path | None = None) -> "IdIndex":
        """Document id → row of :meth:`corpus_dataset` (:class:`pretrieve.data.arrow.IdIndex`, no dict of ids)."""
        from pretrieve.data.arrow import build, id_index  # lazy: pyarrow

        return id_index(build("corpus", self.corpus_path, num_proc=num_proc, cache_dir=cache_dir))

    def queries_dataset(self, split: str | None = None, num_proc: int | None = None,
                        cache_dir: str | Path | None = None) -> "datasets.Dataset":
        """All queries (columns ``_id``, ``text``), or those judged in ``split``, in file order, memory-mapped."""
        from pretrieve.data.arrow import id_index, queries_dataset  # lazy: pyarrow

        dataset = queries_dataset(self.queries_path, num_proc=num_proc, cache_dir=cache_dir)
        if split is None:
            return dataset
        rows = id_index(dataset).lookup(list(self.load_qrels(split)))
        return dataset.select(np.unique(rows[rows >= 0]), keep_in_memory=True)

    def load_queries(self, split: str | None = None) -> dict[str, str]:
        """All queries, or only those judged in ``split`` (in file order)."""
        queries = load_queries(self.queries_path)
        if split is None:
            return queries
        judged = self.load_qrels(split)
        return {qid: text for qid, text in queries.items() if qid in judged}
