"""Hard-negative mining: training groups from a retriever's top-K minus the judged positives.

* :func:`mine_negatives` — stages 2 and 3: a fine-tuned retriever's top-K₂/K₃ (200), minus positives
  (``pretrieve mine``): :func:`pretrieve.retrieval.search.search` (any kind of retriever, searched as it was
  trained, with the corpus index shared with evaluation) minus positives, nothing more.

Stage 1's BM25 negatives (CDMAE, Li et al. 2023, §3.4: BM25's top-K₁ (1000) minus positives) are
:func:`pretrieve.retrieval.runs.bm25_negatives`, which streams its groups the same way.

Negatives keep the retriever's rank order (the groups file lists them best first); only documents within
the top ``depth`` are used, and every document judged relevant (grade ≥ 1) is removed — the top-ranked
unjudged documents stay, false negatives included, as in the papers (stage 3's teacher is what softens them).
Queries without positives or without any negative left are skipped and counted
(:func:`pretrieve.data.groups.groups_from_run`). Queries are searched and their groups written block by block,
in qrels order, so memory holds one block of results, not every query's.

Outputs go through the freshness contract (:mod:`pretrieve.artifacts`): written atomically with a sidecar of the
settings and the fingerprints of their inputs (model weights, corpus, queries, qrels); a call whose output is
current returns it without recomputing, so a recipe can be re-run and resumed stage by stage.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from pretrieve import artifacts
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import GroupStats, groups_from_run
from pretrieve.data.jsonl import write_jsonl
from pretrieve.data.trec import Run
from pretrieve.errors import ConfigError, InputError
from pretrieve.models import resolve_model
from pretrieve.precision import resolve_precision
from pretrieve.retrieval.index import SearchOptions
from pretrieve.retrieval.batches import resolve_device
from pretrieve.retrieval.load import Retriever
from pretrieve.retrieval.runs import is_current, run_part, search_split
from pretrieve.retrieval.search import search

logger = logging.getLogger(__name__)

GROUPS_KIND = "groups"


# ----------------------------------------------------------------------------------- stage outputs
def meta_path(output: str | Path) -> Path:
    """The sidecar describing how ``output`` was produced (:func:`pretrieve.artifacts.sidecar_path`)."""
    return artifacts.sidecar_path(output)


def collection_of(data: str | Path | BeirCollection) -> BeirCollection:
    return data if isinstance(data, BeirCollection) else BeirCollection(Path(data))


def _check_depth(depth: int) -> None:
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")


def write_group_lines(blocks: Iterable[tuple[Run, Mapping[str, Mapping[str, int]]]], queries: Mapping[str, str],
                      depth: int, groups_path: Path, run_path: Path | None = None, tag: str = "pretrieve",
                      run_name: str | Path | None = None) -> GroupStats:
    """Write the groups of each ``(run, qrels)`` block to ``groups_path`` (and its run lines to ``run_path``) as
    the blocks come, plain files (the caller makes them atomic); returns the counts."""
    stats = GroupStats()

    def rows(run_writer) -> Iterator[dict[str, Any]]:
        for run, qrels in blocks:
            groups = groups_from_run(run, qrels, queries, depth=depth)
            stats.add(groups.stats)
            if run_writer is not None:
                for qid, docs in run.items():
                    run_writer.write(qid, docs)
            for group in groups:
                yield group.to_dict()

    with (run_part(run_path, run_name or run_path, tag=tag, depth=depth) if run_path is not None
          else contextlib.nullcontext()) as writer:
        write_jsonl(groups_path, rows(writer))
    return stats


#: Queries whose results are held at once (as a run) before their groups are written. A run costs ~125 bytes per
#: (query, document): the whole 83,886-query block that ranks split at depth 200 would hold 2.1 GB (measured); this
#: many queries ~200 MB. Counted from the start of each block, so any number of ranks cuts the same sub-blocks.
RUN_QUERIES = 8192


def _qrels_blocks(qrels: Mapping[str, Mapping[str, int]], size: int) -> Iterator[dict[str, Mapping[str, int]]]:
    """``qrels`` in blocks of ``size`` queries, in qrels order."""
    items = list(qrels.items())
    for first in range(0, max(1, len(items)), size):
        yield dict(items[first:first + size])


# ---------------------------------------------------------------------------------------- retriever
def mine_negatives(model_dir: str | Path, data: str | Path | BeirCollection, split: str, out_groups: str | Path,
                   depth: int = 200, batch_size: int = 64, max_length: int | None = None,
                   query_max_length: int | None = None, cache_dir: str | Path | None = None,
                   run_out: str | Path | None = None, device: str = "auto", precision: str = "auto",
                   factory: str = "Flat", query_block: int | None = None, show_progress: bool = True,
                   overwrite: bool = False, bf16: bool | None = None) -> Path:
    """Stage-2/3 groups: the retriever's top-``depth`` of each ``split`` query minus its positives.

    ``max_length`` / ``query_max_length`` default to the model's passage length and the query length it was
    fine-tuned with; ``precision`` is the encoder's (``auto``: bf16 where the hardware has it, else fp32;
    ``bf16=True`` is the older spelling of ``precision="bf16"``); ``factory`` a FAISS index for dense vectors
    (``Flat``: exact). The corpus index is kept in ``cache_dir`` when given. Searched and written through
    :func:`pretrieve.retrieval.runs.search_split` (the queries split by rank). Returns ``out_groups``.
    """
    _check_depth(depth)
    if bf16:
        precision = "bf16"
    collection = collection_of(data)
    resolved = resolve_model(model_dir)
    local = Path(resolved).is_dir()
    settings = {"retriever": "model" if local else resolved, "split": split, "depth": depth,
                "max_length": max_length, "query_max_length": query_max_length, "factory": factory,
                "precision": resolve_precision(precision, resolve_device(device))}
    inputs = {**({"model": Path(resolved)} if local else {}), **collection.split_inputs(split)}
    if not overwrite and is_current(out_groups, settings, inputs):
        logger.info("mined groups in %s are up to date; not recomputing", out_groups)
        return Path(out_groups)
    queries = collection.load_queries(split)
    qrels = list(collection.load_qrels(split).items())
    options = SearchOptions(factory=factory)
    block = query_block or max(256, (1 << 24) // depth)
    outputs = [(Path(out_groups), GROUPS_KIND, settings, inputs)]
    if run_out is not None:
        outputs.append((Path(run_out), "run", settings, inputs))

    def write_part(retriever: Retriever, index: Path, start: int, end: int, paths: list[Path]) -> GroupStats:
        def blocks() -> Iterator[tuple[Run, Mapping[str, Mapping[str, int]]]]:
            size = min(block, RUN_QUERIES)
            for whole in _qrels_blocks(dict(qrels[start:end]), block):
                for part in _qrels_blocks(whole, size):
                    searchable = {qid: queries[qid] for qid, judged in part.items()
                                  if qid in queries and any(grade >= 1 for grade in judged.values())}
                    run = search(retriever, searchable, index, k=depth, options=options, batch_size=batch_size,
                                 query_block=size, show_progress=show_progress) if searchable else {}
                    yield run, part

        return write_group_lines(blocks(), queries, depth, paths[0], paths[1] if run_out is not None else None,
                                 tag=retriever.kind, run_name=run_out)

    def check(parts: list[GroupStats]) -> None:
        stats = GroupStats.total(parts)
        if stats.kept == 0:
            raise InputError(f"no training group could be built ({stats.problems()})", path=collection.root)
        logger.info("wrote %d groups to %s (%s)", stats.kept, out_groups, stats.as_dict())

    search_split(resolved, collection, cache_dir, outputs, len(qrels), write_part, "mine negatives", depth=depth,
                 query_block=block, batch_size=batch_size, show_progress=show_progress, check=check, device=device,
                 precision=precision, max_length=max_length, query_max_length=query_max_length)
    return Path(out_groups)
