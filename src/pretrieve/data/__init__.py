"""Data layer: BEIR collections, TREC runs and qrels, training groups, pre-training texts.

Knows nothing about models or training. Every reader validates its input and raises
:class:`pretrieve.errors.InputError` naming file, line and field. Large inputs: :mod:`pretrieve.data.arrow`
(corpus, queries and groups as memory-mapped Arrow datasets, built in parts by :mod:`pretrieve.data.parallel`),
:mod:`pretrieve.data.convert` (MS MARCO / TREC DL / Tevatron / ir_datasets into BEIR layout); both are imported
on use, not here.
"""

from pretrieve.data.beir import (Corpus, Qrels, QrelsCheck, check_qrels, iter_corpus, load_qrels, load_queries,
                                 save_qrels, save_queries)
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import (GroupSet, GroupStats, TrainingGroup, group_rng, groups_from_run, iter_groups,
                                   read_groups, sample_group, sample_group_indices, write_groups)
from pretrieve.data.jsonl import iter_jsonl, iter_lines, write_jsonl
from pretrieve.data.records import Document, join_title
from pretrieve.data.registry import (KNOWN_COLLECTIONS, CollectionInfo, CollectionReport, check_collection,
                                     fetch_collection, resolve_collection)
from pretrieve.data.trec import Run, merge_runs, read_run, run_from_arrays, top_k, write_run

__all__ = [
    "BeirCollection", "Corpus", "Document", "Qrels", "QrelsCheck", "Run", "check_qrels", "iter_corpus",
    "iter_jsonl", "join_title", "load_qrels", "load_queries", "merge_runs", "read_run", "run_from_arrays",
    "save_qrels", "save_queries", "top_k", "write_jsonl", "write_run",
    "GroupSet", "GroupStats", "TrainingGroup", "group_rng", "groups_from_run", "iter_groups", "read_groups",
    "sample_group", "sample_group_indices", "write_groups", "iter_lines",
    "KNOWN_COLLECTIONS", "CollectionInfo", "CollectionReport", "check_collection", "fetch_collection",
    "resolve_collection",
]
