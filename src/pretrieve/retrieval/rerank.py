"""Re-ranking with a trained cross-encoder: re-ranked runs and teacher scores for stage-3 fine-tuning.

* :func:`rerank` / :func:`rerank_run_file` — score the top-``depth`` of every query of a run and order them by
  the cross-encoder (``pretrieve reranker score``); documents below ``depth`` are dropped from the output.
* :func:`teacher_groups` — the stage-3 input: every positive and negative of each mined group scored by the
  reranker, written as a groups file with ``positive_scores`` / ``negative_scores`` (``pretrieve reranker
  teacher``). Equivalently, a re-ranked run that covers the positives can be turned into such groups with
  :func:`pretrieve.data.groups.groups_from_run` (``scores_from_run=``); scoring the groups directly also
  covers positives the retriever did not rank in its top-K₃, which the teacher must score too.

Scoring streams (:class:`PairScorer`): the run is read query by query and the groups file group by group, pairs
are tokenised batch by batch within a length-ordered chunk, and each query's ranking / each scored group is
written as soon as its pairs are scored, so memory is one chunk whatever the number of pairs (MS MARCO's stage 3
scores ~16M). ``precision`` is the one vocabulary of :mod:`pretrieve.precision`: ``auto`` scores in bf16 only
where the hardware computes it natively (a GPU with bf16, a CPU with AVX512-BF16/AMX), else fp32; ``fp16``,
``bf16`` autocast; ``int8`` quantises the linear layers (CPU). Under several ranks (:mod:`pretrieve.ranks`) each
rank scores a contiguous slice of the run's queries / the groups and rank 0 concatenates the parts; passages are
read from the memory-mapped Arrow corpus (:class:`pretrieve.data.arrow.CorpusTexts`). Outputs are written
atomically and recorded by :mod:`pretrieve.artifacts` (settings + the model, run/groups, corpus and queries by
content); a call whose output is current is skipped. Training the cross-encoder is :mod:`pretrieve.train.reranker`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from transformers import AutoTokenizer

from pretrieve import artifacts, outputs, ranks
from pretrieve.data.arrow import CorpusTexts
from pretrieve.data.beir import Corpus
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import GroupStats, TrainingGroup, iter_groups
from pretrieve.data.trec import Run, iter_run, ranked_ids
from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.cross_encoder import CrossEncoder, tokenize_pairs, trained_max_len
from pretrieve.models import no_remote_code
from pretrieve.precision import autocast, resolve_precision
from pretrieve.progress import Progress
from pretrieve.retrieval.batches import quantize_int8
from pretrieve.retrieval.batches import resolve_device
from pretrieve.retrieval.runs import is_current, run_part

logger = logging.getLogger(__name__)

#: Pairs whose texts are ordered by length together before they are cut into batches (the sorting window).
CHUNK_BATCHES = 32


class PairScorer:
    """A trained cross-encoder + tokenizer that scores (query, passage) pairs batch by batch.

    Pairs are handled in chunks of ``CHUNK_BATCHES`` batches: a chunk is ordered by text length (so a batch pads
    little), each batch is tokenised (padding by the tokenizer) and scored under ``torch.inference_mode`` (and
    autocast when the resolved ``precision`` is bf16 or fp16), then the scores are put back in input order. Memory
    is one chunk, whatever the number of pairs. ``precision`` is any of :data:`pretrieve.precision.PRECISIONS`
    (``int8``: the linear layers quantised, on the CPU).
    """

    def __init__(self, model_dir: str | Path, device: str = "auto", max_len: int | None = None, batch_size: int = 64,
                 precision: str = "auto"):
        if batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {batch_size}")
        self.device = resolve_device(device)
        self.precision = resolve_precision(precision, self.device)
        self.model = CrossEncoder.load(model_dir).to(self.device).eval()
        if self.precision == "int8":
            self.model = quantize_int8(self.model)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), **no_remote_code(model_dir))
        self.max_len = max_len or trained_max_len(model_dir)
        self.batch_size = batch_size
        self.chunk_pairs = batch_size * CHUNK_BATCHES

    def score(self, queries: Sequence[str], passages: Sequence[str], show_progress: bool = True,
              description: str = "rerank") -> np.ndarray:
        """float32 scores of the pairs ``(queries[i], passages[i])``, in input order."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
        scores = np.empty(len(queries), dtype=np.float32)
        with Progress(total=len(queries), desc=description, unit="pairs", disable=not show_progress) as progress:
            for start in range(0, len(queries), self.chunk_pairs):
                end = min(start + self.chunk_pairs, len(queries))
                scores[start:end] = self.score_chunk(queries[start:end], passages[start:end])
                progress.update(end - start)
        return scores

    def score_chunk(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """Scores of one chunk of pairs (any size; callers keep it near :attr:`chunk_pairs`), in input order."""
        order = sorted(range(len(queries)), key=lambda i: -(len(queries[i]) + len(passages[i])))
        scores = np.empty(len(queries), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            batch = tokenize_pairs(self.tokenizer, [queries[i] for i in rows], [passages[i] for i in rows],
                                   self.max_len)
            batch = {key: value.to(self.device) for key, value in batch.items()}
            with torch.inference_mode(), autocast(self.device, self.precision):
                values = self.model.score(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
            scores[rows] = values.float().cpu().numpy()
        return scores


def score_candidates(scorer: PairScorer, corpus: "Corpus | CorpusTexts", queries: Mapping[str, str],
                     candidates: Mapping[str, Sequence[str]], show_progress: bool = True) -> Run:
    """``{qid: {doc_id: cross-encoder score}}`` for every candidate document of every query (in memory)."""
    pairs = [(qid, doc_id) for qid, docs in candidates.items() for doc_id in docs]
    _check_known(corpus, (doc_id for _, doc_id in pairs), getattr(corpus, "path", None))
    scores = scorer.score([queries[qid] for qid, _ in pairs], corpus.texts_of([d for _, d in pairs]),
                          show_progress=show_progress)
    run: Run = {qid: {} for qid in candidates}
    for (qid, doc_id), value in zip(pairs, scores.tolist()):
        run[qid][doc_id] = float(value)
    return run


def _check_known(corpus: "Corpus | CorpusTexts", doc_ids: Iterable[str], source: str | Path | None) -> None:
    doc_ids = list(doc_ids)
    absent = corpus.missing(doc_ids) if hasattr(corpus, "missing") else {d for d in doc_ids if d not in corpus}
    missing = next((doc_id for doc_id in doc_ids if doc_id in absent), None)
    if missing is not None:
        raise InputError(f"document '{missing}' is not in the corpus", path=source)


def rerank(scorer: PairScorer, corpus: "Corpus | CorpusTexts", queries: Mapping[str, str], run: Run, depth: int = 200,
           show_progress: bool = True) -> Run:
    """The top-``depth`` of each query of ``run`` (that has a text in ``queries``) re-scored by the reranker."""
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    unknown = [qid for qid in run if qid not in queries]
    if unknown:
        logger.warning("%d run queries have no text (e.g. '%s'); they are left out", len(unknown), unknown[0])
    candidates = {qid: ranked_ids(run, qid)[:depth] for qid in run if qid in queries}
    return score_candidates(scorer, corpus, queries, candidates, show_progress=show_progress)


def _chunks_of_items(items: Iterable[Any], size_of, limit: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``items`` whose summed ``size_of`` reaches ``limit`` (the last may be smaller)."""
    chunk: list[Any] = []
    total = 0
    for item in items:
        chunk.append(item)
        total += size_of(item)
        if total >= limit:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def rerank_run_file(model_dir: str | Path, data: str | Path, split: str, run_path: str | Path, out: str | Path,
                    depth: int = 200, batch_size: int = 64, max_len: int | None = None, device: str = "auto",
                    show_progress: bool = True, overwrite: bool = False, precision: str = "auto") -> Path:
    """``pretrieve reranker score``: re-rank the top-``depth`` of each query of a TREC run file and write the new run.

    The run is read query by query (its lines grouped by query, as TREC runs are) and each query's new ranking is
    written as soon as its pairs are scored, so memory does not grow with the run. A current output (same
    settings, same model, run, corpus and queries) is kept unless ``overwrite``.
    """
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    collection = BeirCollection(Path(data))
    outputs.check_writable(out, directory=False)
    outputs.remove_leftovers(Path(out).parent, depth=0)
    if not Path(run_path).exists():
        raise InputError("run file not found", path=run_path)
    resolved = resolve_precision(precision, resolve_device(device))
    settings = {"split": split, "depth": depth, "max_len": max_len or trained_max_len(model_dir),
                "precision": resolved}
    inputs = {"model": model_dir, "run": run_path, "corpus": collection.corpus_path,
              "queries": collection.queries_path}
    if not overwrite and is_current(out, settings, inputs, kind="run"):
        logger.info("re-ranked run %s is up to date; not recomputing", out)
        return Path(out)
    queries = collection.load_queries(split)
    corpus = CorpusTexts(ranks.built_once(collection.corpus_dataset))
    scorer = PairScorer(model_dir, device=device, max_len=max_len, batch_size=batch_size, precision=resolved)

    def count() -> int:
        return sum(1 for _ in iter_run(run_path))

    def write_part(start: int, end: int, paths: list[Path]) -> list[str]:
        unknown: list[str] = []

        def known_queries() -> Iterator[tuple[str, list[str]]]:
            for position, (qid, docs) in enumerate(iter_run(run_path)):
                if position < start or position >= end:
                    continue
                if qid not in queries:
                    unknown.append(qid)
                    continue
                top = sorted(docs, key=lambda doc_id: -docs[doc_id])[:depth]
                _check_known(corpus, top, run_path)
                yield qid, top

        with run_part(paths[0], out, tag="rerank", depth=depth) as writer, \
                Progress(desc="rerank", unit="queries", disable=not show_progress) as progress:
            for chunk in _chunks_of_items(known_queries(), lambda item: len(item[1]), scorer.chunk_pairs):
                passages = corpus.texts_of([doc_id for _, top in chunk for doc_id in top])
                texts = [queries[qid] for qid, top in chunk for _ in top]
                scores = scorer.score_chunk(texts, passages).tolist()
                position = 0
                for qid, top in chunk:
                    writer.write(qid, list(zip(top, scores[position:position + len(top)])))
                    position += len(top)
                progress.update(len(chunk))
        return unknown

    unknown = [qid for part in ranks.split_files([(Path(out), "run", settings, inputs)], count, write_part,
                                                 "rerank") for qid in part]
    if unknown:
        logger.warning("%d run queries have no text in split '%s' (e.g. '%s'); they are left out", len(unknown),
                       split, unknown[0])
    return Path(out)


def teacher_groups(model_dir: str | Path, data: str | Path, groups_path: str | Path, out: str | Path,
                   max_negatives: int | None = None, batch_size: int = 64, max_len: int | None = None,
                   device: str = "auto", show_progress: bool = True, overwrite: bool = False,
                   precision: str = "auto") -> Path:
    """Stage-3 groups: the groups of ``groups_path`` (e.g. the stage-2 retriever's mined top-200 minus positives),
    their negatives cut to the first ``max_negatives`` (rank order), every positive and negative scored by the
    reranker. Returns ``out``.

    Groups are read, scored and written a chunk at a time (:class:`PairScorer`), so memory does not grow with the
    number of groups or pairs. A current output (same settings, same model, groups and corpus) is kept unless
    ``overwrite``.
    """
    if max_negatives is not None and max_negatives < 1:
        raise ConfigError(f"max_negatives must be >= 1, got {max_negatives}")
    collection = BeirCollection(Path(data))
    if not Path(groups_path).exists():
        raise InputError("groups file not found", path=groups_path)
    resolved = resolve_precision(precision, resolve_device(device))
    settings = {"max_negatives": max_negatives, "max_len": max_len or trained_max_len(model_dir),
                "precision": resolved}
    inputs = {"model": model_dir, "groups": groups_path, "corpus": collection.corpus_path}
    outputs.check_writable(out, directory=False)
    outputs.remove_leftovers(Path(out).parent, depth=0)
    status = artifacts.check(out, settings, inputs, kind="groups")
    if ranks.broadcast(status.current and not overwrite, "check the teacher groups"):
        logger.info("teacher groups %s are up to date; not recomputing", out)
        return Path(out)
    if status.exists:
        logger.info("recomputing %s: %s", out, status.reason)
    corpus = CorpusTexts(ranks.built_once(collection.corpus_dataset))
    scorer = PairScorer(model_dir, device=device, max_len=max_len, batch_size=batch_size, precision=resolved)
    stats = GroupStats()

    def count() -> int:
        return sum(1 for _ in iter_groups(groups_path, corpus=corpus))

    def write_part(start: int, end: int, paths: list[Path]) -> tuple[int, int]:
        written = pairs_scored = 0
        groups = (group for position, group in enumerate(iter_groups(groups_path, corpus=corpus, stats=stats))
                  if start <= position < end)
        cut = ((group, group.negatives[:max_negatives]) for group in groups)
        with open(paths[0], "w", encoding="utf-8") as handle, \
                Progress(desc="teacher scores", unit="pairs", disable=not show_progress) as progress:
            for chunk in _chunks_of_items(cut, lambda item: len(item[0].positives) + len(item[1]),
                                          scorer.chunk_pairs):
                ids = [doc_id for group, negatives in chunk for doc_id in (*group.positives, *negatives)]
                queries = [group.query for group, negatives in chunk for _ in (*group.positives, *negatives)]
                scores = scorer.score_chunk(queries, corpus.texts_of(ids)).tolist()
                position = 0
                for group, negatives in chunk:
                    size = len(group.positives) + len(negatives)
                    values = scores[position:position + size]
                    position += size
                    scored = TrainingGroup(group.query_id, group.query, group.positives, negatives,
                                           values[:len(group.positives)], values[len(group.positives):])
                    handle.write(json.dumps(scored.to_dict(), ensure_ascii=False) + "\n")
                    written += 1
                pairs_scored += len(ids)
                progress.update(len(ids))
        return written, pairs_scored

    def check(parts: list[tuple[int, int]]) -> None:
        if sum(written for written, _ in parts) == 0:
            raise InputError(f"no usable group ({stats.problems()})", path=groups_path)

    parts = ranks.split_files([(Path(out), "groups", settings, inputs)], count, write_part, "teacher scores",
                              check=check)
    written, pairs_scored = sum(w for w, _ in parts), sum(p for _, p in parts)
    logger.info("wrote %d teacher-scored groups (%d pairs) to %s", written, pairs_scored, out)
    return Path(out)
