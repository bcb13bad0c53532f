"""Fusion of ranked runs: reciprocal rank fusion and a normalised, weighted score combination.

Lexical and dense retrievers fail on different queries, and combining their rankings is the cheapest gain
a practitioner can have: reciprocal rank fusion of BM25 and an off-the-shelf dense model beats both on
SciFact and Cranfield without any training (docs/results.md). Two fusions over ``N`` runs
(``{query_id: {doc_id: score}}``):

* ``rrf`` — reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009): a document scores
  ``Σ_i 1 / (k + rank_i)`` over the runs that retrieved it, ``k = 60``. Ranks follow ``trec_eval``'s order
  (score descending, ties by document id descending; :func:`pretrieve.evaluation.trec_eval_ranking`), so a
  run file fuses the way it is evaluated. Nothing to fit.
* ``wsum`` — each run's scores are normalised per query, ``minmax`` (``(s − min) / (max − min)``) or
  ``zscore`` (``(s − mean) / std``, population std over the query's retrieved documents), then combined with
  convex weights ``Σ_i w_i · s̃_i`` (``w_i ≥ 0``, ``Σ w_i = 1``). A document that a run did not retrieve
  gets that run's lowest retrieved score for the query (it ranks at most there) before normalisation —
  for ``minmax`` that is 0, what ranx assumes; for ``zscore`` it keeps an unretrieved document below every
  retrieved one instead of at the mean.

The arithmetic is ranx's (``ranx.fuse``: ``rrf``, ``wsum`` with ``min-max`` / ``zmuv`` normalisation;
Bassani & Romelli, CIKM 2022); this module fixes the conventions above (ranks, unretrieved documents, query
sets, depth) and checks inputs. Each input run is cut to its top ``depth`` before fusion, and so is the result.

**Fitting without touching the test set.** :func:`fit_fusion` chooses the weights (and, given several
candidates, the method and normalisation) that maximise a measure on *training* queries. It receives the
training runs and the training qrels as values — it never opens a file — so nothing it does can read the
queries or judgments of the runs that are fused afterwards. Callers load only the training split's qrels
(``pretrieve fuse --fit-data DIR --fit-split train``; the recipe's ``fuse`` stage), and ``fit_split`` may not
be ``test``. The grid is the simplex with step ``step`` (0.05: weights 0, 0.05, …, 1 for two runs); ties
go to the weights closest to uniform.

**Choosing a method by cross-fitting.** The fitted score of a weighted sum is optimistic: its weights were chosen
on the very queries that score it, while RRF has nothing to fit. So a fit that is given several candidates
(``method: auto``) compares them by their *cross-fitted* score (docs/preregistration.md, amendment 2): the fit
queries fall into :data:`CROSS_FIT_FOLDS` seeded folds, each fold is scored by the weights fitted on the others,
and every query is scored once by weights that did not see it (RRF's cross-fitted score is its plain score). The
candidate with the highest cross-fitted score wins (ties: the earlier candidate), and its weights are then fitted on
every fit query. The report records each candidate's fitted and cross-fitted score, and the chosen one's value
per fit query in its cross-fitted score (``per_query``: what the recipe's dev gate pairs two fits on).

**Bounded memory.** A fit scores the grid :data:`FIT_BLOCK` judged queries at a time and keeps only per-query
values (:func:`_fit_blocks`); :func:`fit_on_split` streams the run files (one pass each), so a fit's peak memory
is one block's, flat in the number of fit queries (a 2-run, depth-1000 wsum fit: ~0.54 GB peak RSS for 250, 1,000
or 2,500 queries, of which ~0.29 GB are the imports; it was 0.90 GB / 2.0 GB for 250 / 1,000 when whole runs were
held).
"""

from __future__ import annotations

import gc
import itertools
import logging
import math
import random
import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pretrieve.data.collection import BeirCollection
from pretrieve.data.jsonl import iter_lines
from pretrieve.data.trec import iter_run, read_run, top_k
from pretrieve.errors import ConfigError, InputError
from pretrieve.retrieval.runs import write_run_file

logger = logging.getLogger(__name__)

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

METHODS = ("rrf", "wsum")
NORMS = ("minmax", "zscore")
RRF_K = 60
DEFAULT_DEPTH = 1000
DEFAULT_STEP = 0.05
DEFAULT_FIT_MEASURE = "nDCG@10"
FIT_BLOCK = 64      # judged queries fused and scored at a time when fitting (the memory of a fit is one block's)
CROSS_FIT_FOLDS = 5  # folds of the fit queries for the cross-fitted score (amendment 2)
CROSS_FIT_SEED = 0
TEST_SPLIT = "test"
_RANX_NORMS = {"minmax": "min-max", "zscore": "zmuv"}


@dataclass(frozen=True)
class FusionSpec:
    """How runs are fused: ``rrf`` (``k``) or ``wsum`` (``norm``, convex ``weights``; None = uniform)."""

    method: str = "rrf"
    norm: str | None = None
    weights: tuple[float, ...] | None = None
    k: int = RRF_K
    depth: int = DEFAULT_DEPTH
    fit: dict[str, Any] | None = field(default=None, compare=False)   # how the weights were chosen, if fitted

    def check(self, n_runs: int | None = None) -> "FusionSpec":
        """Validated (raises :class:`ConfigError`); returns self."""
        if self.method not in METHODS:
            raise ConfigError(f"fusion method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.depth < 1:
            raise ConfigError(f"fusion depth must be >= 1, got {self.depth}")
        if self.method == "rrf":
            if self.norm is not None or self.weights is not None:
                raise ConfigError("rrf fuses ranks: it takes neither a normalisation nor weights (use the method wsum)")
            if self.k < 1:
                raise ConfigError(f"rrf k must be >= 1, got {self.k}")
            return self
        if self.norm not in NORMS:
            raise ConfigError(f"wsum needs a normalisation, one of {', '.join(NORMS)}; got {self.norm!r}")
        if self.weights is not None:
            check_weights(self.weights, n_runs)
        return self

    def settings(self) -> dict[str, Any]:
        """What determines the fused run (recorded in its sidecar)."""
        values = {"method": self.method, "depth": self.depth}
        if self.method == "rrf":
            values["k"] = self.k
        else:
            values.update(norm=self.norm, weights=list(self.weights) if self.weights is not None else None)
        return values

    def describe(self) -> str:
        """``rrf(k=60)`` / ``wsum(zscore; 0.3, 0.7)``."""
        if self.method == "rrf":
            return f"rrf(k={self.k})"
        weights = "uniform" if self.weights is None else ", ".join(f"{w:g}" for w in self.weights)
        return f"wsum({self.norm}; {weights})"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["weights"] = list(self.weights) if self.weights is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FusionSpec":
        weights = data.get("weights")
        return cls(method=str(data.get("method", "rrf")), norm=data.get("norm"),
                   weights=tuple(float(w) for w in weights) if weights is not None else None,
                   k=int(data.get("k", RRF_K)), depth=int(data.get("depth", DEFAULT_DEPTH)), fit=data.get("fit"))


def check_weights(weights: Sequence[float], n_runs: int | None = None) -> tuple[float, ...]:
    """Convex weights: one per run, each ≥ 0, summing to 1 (within 1e-6)."""
    values = tuple(float(w) for w in weights)
    if n_runs is not None and len(values) != n_runs:
        raise ConfigError(f"{len(values)} weight(s) for {n_runs} runs: give one weight per run")
    if any(not math.isfinite(w) or w < 0 for w in values):
        raise ConfigError(f"weights must be finite and >= 0, got {list(values)}")
    if abs(sum(values) - 1.0) > 1e-6:
        raise ConfigError(f"weights must sum to 1 (a convex combination), got {list(values)} (sum {sum(values):g})")
    return values


# ------------------------------------------------------------------------------------------- fusing
def fuse_runs(runs: Sequence[Run], spec: FusionSpec) -> dict[str, dict[str, float]]:
    """The fused run (every query of any input run; each query's top ``spec.depth``)."""
    runs = list(runs)
    if len(runs) < 2:
        raise ConfigError(f"fusion needs at least two runs, got {len(runs)}")
    spec.check(len(runs))
    queries, ranx_runs = _ranx_inputs(runs, spec)
    return _combine(ranx_runs, queries, spec)


def _ranx_inputs(runs: Sequence[Run], spec: FusionSpec) -> tuple[list[str], list[Any]]:
    """Every query of any run, and the runs as ranx runs prepared for ``spec.method`` (module docstring)."""
    queries = list(dict.fromkeys(qid for run in runs for qid in run))
    if not queries:
        raise InputError("the runs to fuse have no query")
    prepared = [_prepared(run, queries, spec.depth, ranks=spec.method == "rrf") for run in runs]
    if spec.method == "wsum":
        prepared = _fill_unretrieved(prepared, queries)
    return queries, _to_ranx(prepared, spec.norm if spec.method == "wsum" else None)


def _combine(ranx_runs: list[Any], queries: Sequence[str], spec: FusionSpec,
             cut: bool = True) -> dict[str, dict[str, float]]:
    """Fuse prepared ranx runs; each query's top ``spec.depth`` (``cut``), else every fused document."""
    fused = _ranx_fuse(ranx_runs, spec) if ranx_runs else {}
    fused = {qid: fused.get(qid, {}) for qid in queries}
    return top_k(fused, spec.depth) if cut else fused


def _prepared(run: Run, queries: Sequence[str], depth: int, ranks: bool) -> dict[str, dict[str, float]]:
    """The run's top ``depth`` per query in trec_eval order; with ``ranks``, scores replaced by
    ``depth', …, 1`` (tie-free, so ranx ranks exactly that order)."""
    from pretrieve.evaluation.metrics import trec_eval_ranking  # lazy: scipy

    out: dict[str, dict[str, float]] = {}
    for qid in queries:
        docs = run.get(qid) or {}
        for doc_id, score in docs.items():
            if not math.isfinite(float(score)):
                raise InputError(f"score of document '{doc_id}' for query '{qid}' is not finite ({score})")
        ranking = trec_eval_ranking(docs)[:depth]
        out[qid] = ({doc_id: float(len(ranking) - i) for i, doc_id in enumerate(ranking)} if ranks
                    else {doc_id: float(docs[doc_id]) for doc_id in ranking})
    return out


def _fill_unretrieved(runs: list[dict[str, dict[str, float]]], queries: Sequence[str]) -> list[dict]:
    """Give a document a run did not retrieve that run's lowest score for the query (module docstring)."""
    for qid in queries:
        union = list(dict.fromkeys(doc_id for run in runs for doc_id in run[qid]))
        for run in runs:
            docs = run[qid]
            if docs and len(docs) < len(union):
                floor = min(docs.values())
                for doc_id in union:
                    docs.setdefault(doc_id, floor)
    return runs


def _to_ranx(runs: list[dict[str, dict[str, float]]], norm: str | None = None) -> list[Any]:
    """ranx runs over the queries some run retrieved for, normalised per query by ranx when ``norm`` is given
    (ranx needs the same query ids in every run, each with an entry: a run that retrieved nothing for a query
    gets a placeholder no other run has, dropped after fusion)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # numba's type-safety notes
        from ranx import Run as RanxRun  # lazy: ranx
        from ranx import normalize  # lazy: ranx

        queries = [qid for qid in runs[0] if any(run[qid] for run in runs)]
        if not queries:
            return []
        ranx_runs = [RanxRun({qid: dict(run[qid]) or {_placeholder(i): 0.0} for qid in queries}, name=f"run{i}")
                     for i, run in enumerate(runs)]
        return [normalize(run, _RANX_NORMS[norm]) for run in ranx_runs] if norm else ranx_runs


def _ranx_fuse(ranx_runs: list[Any], spec: FusionSpec) -> dict[str, dict[str, float]]:
    """``ranx.fuse``: rrf, or wsum of runs that :func:`_to_ranx` normalised (min-max / zmuv)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ranx import fuse  # lazy: ranx

        n_runs = len(ranx_runs)
        if spec.method == "rrf":
            fused = fuse(ranx_runs, norm=None, method="rrf", params={"k": spec.k})
        else:
            weights = list(spec.weights) if spec.weights is not None else [1.0 / n_runs] * n_runs
            fused = fuse(ranx_runs, norm=None, method="wsum", params={"weights": weights})
        result = fused.to_dict()
    placeholders = {_placeholder(i) for i in range(n_runs)}
    return {qid: {doc_id: float(score) for doc_id, score in docs.items() if doc_id not in placeholders}
            for qid, docs in result.items()}


def _placeholder(i: int) -> str:
    return f"\x00pretrieve-empty-{i}"


# ------------------------------------------------------------------------------------------- fitting
def fit_fusion(train_runs: Sequence[Run], train_qrels: Qrels,
               candidates: Sequence[tuple[str, str | None]] = (("wsum", "minmax"),),
               measure: str = DEFAULT_FIT_MEASURE, step: float = DEFAULT_STEP, depth: int = DEFAULT_DEPTH,
               k: int = RRF_K, split: str = "train", block: int = FIT_BLOCK) -> FusionSpec:
    """The fusion that scores best on the training queries: for each candidate ``(method, norm)`` (``rrf``
    has nothing to fit; ``wsum`` tries every convex weight vector on the grid of ``step``), the mean
    ``measure`` of the fused training runs against ``train_qrels``.

    Only values come in — the training runs and the training qrels, no path — so the test queries and their
    judgments cannot take part. ``split`` names where the qrels came from (recorded); ``test`` is refused.
    The grid is scored ``block`` judged queries at a time (:func:`_fit_blocks`).
    """
    runs = list(train_runs)
    _check_block(block)
    wanted = set(train_qrels)
    order = list(dict.fromkeys(qid for run in runs for qid in run if qid in wanted))
    blocks = ([{qid: run[qid] for qid in order[start:start + block] if qid in run} for run in runs]
              for start in range(0, len(order), block))
    return _fit_blocks(blocks, len(runs), train_qrels, len(order), candidates, measure, step, depth, k, split)


def _fit_blocks(blocks: Iterable[list[Run]], n_runs: int, qrels: Qrels, judged: int,
                candidates: Sequence[tuple[str, str | None]], measure: str, step: float, depth: int, k: int,
                split: str) -> FusionSpec:
    """:func:`fit_fusion` on the runs given as consecutive ``blocks`` of queries (each block: one partial run per
    input run): every query's measure depends on that query's documents alone, so each block is fused and scored
    for every trial on its own and only the per-query values are kept — the memory of a fit is that of one block,
    flat in the number of fit queries. Aggregated in the qrels' order, exactly as one evaluation of every query."""
    from pretrieve.evaluation.metrics import RunEvaluator  # lazy: scipy

    if split == TEST_SPLIT:
        raise ConfigError("fusion weights are fitted on training queries, never on the test split "
                          "(use the train or a dev split)")
    if n_runs < 2:
        raise ConfigError(f"fitting a fusion needs at least two training runs, got {n_runs}")
    if not candidates:
        raise ConfigError("give at least one (method, norm) candidate to fit")
    if not 0.0 < step <= 0.5 or abs(round(1.0 / step) * step - 1.0) > 1e-9:
        raise ConfigError(f"step must divide 1 (e.g. 0.05, 0.1, 0.25), got {step}")
    if not judged:
        raise InputError("the training runs share no query with the training qrels")
    trials = [(c, spec.check(n_runs)) for c, (method, norm) in enumerate(candidates)
              for spec in ([FusionSpec("rrf", k=k, depth=depth)] if method == "rrf" else
                           [FusionSpec("wsum", norm, weights, depth=depth) for weights in simplex_grid(n_runs, step)])]
    values: list[dict[str, float]] = [{} for _ in trials]     # per trial: query → measure
    singles: list[dict[str, float]] = [{} for _ in range(n_runs)]
    cutoff = _cutoff(measure, depth)
    evaluator = None
    for runs in blocks:
        queries = list(dict.fromkeys(qid for run in runs for qid in run))
        if not queries:
            continue
        evaluator = RunEvaluator({qid: qrels[qid] for qid in queries}, [measure])
        prepared: dict[tuple[str, str | None], Any] = {}
        for i, (_, spec) in enumerate(trials):
            key = (spec.method, spec.norm)
            if key not in prepared:      # each candidate's runs prepared (and, for wsum, read into a matrix) once
                block_queries, ranx_runs = _ranx_inputs(runs, spec)
                prepared[key] = (_ScoreMatrix(ranx_runs, block_queries) if spec.method == "wsum"
                                 else (block_queries, ranx_runs))
            if spec.method == "wsum":
                fused = prepared[key].weighted_sum(spec.weights, cutoff)
            else:
                fused = _combine(prepared[key][1], prepared[key][0], spec, cut=cutoff is None)
            values[i].update(evaluator(fused).per_query[measure])
        for j, run in enumerate(runs):
            if any(qid in run for qid in queries):
                singles[j].update(evaluator(run).per_query[measure])
        del prepared, runs
        gc.collect()   # ranx's runs hold reference cycles: freed now, the next block reuses their memory
    parsed = evaluator.measures[measure]   # the ir_measures measure: its own aggregation, as RunEvaluator's

    def aggregate(per_query: Mapping[str, float], qids: Iterable[str] = qrels) -> float:
        result = parsed.aggregator()   # every judged query (one no run has: the default)
        for qid in qids:
            result.add(per_query.get(qid, float(parsed.DEFAULT)))
        return float(result.result())

    scores = [aggregate(per_query) for per_query in values]        # each trial on every fit query, once

    def best_trial(indices: Sequence[int], score: Callable[[int], float]) -> int:   # ties: closest to uniform
        return max(indices, key=lambda i: (round(score(i), 12), -_distance_from_uniform(trials[i][1], n_runs)))

    folds = cross_fit_folds(list(qrels))

    def cross_fitted(indices: Sequence[int], fitted: int) -> tuple[float, dict[str, float]]:
        """The cross-fitted score and each fit query's value in it (out of fold)."""
        if len(indices) == 1 or len(folds) < 2:      # nothing fitted (rrf), or too few queries to hold any out
            return scores[fitted], {qid: values[fitted].get(qid, float(parsed.DEFAULT)) for qid in qrels}
        out_of_fold: dict[str, float] = {}
        for fold in folds:
            held_out = set(fold)
            kept = [qid for qid in qrels if qid not in held_out]
            chosen = best_trial(indices, lambda i: aggregate(values[i], kept))
            out_of_fold.update({qid: values[chosen].get(qid, float(parsed.DEFAULT)) for qid in fold})
        return aggregate(out_of_fold), {qid: out_of_fold[qid] for qid in qrels}

    per_candidate = [[i for i, (c, _) in enumerate(trials) if c == index] for index in range(len(candidates))]
    fitted = [best_trial(indices, scores.__getitem__) for indices in per_candidate]
    crossed, crossed_per_query = zip(*(cross_fitted(indices, index) for indices, index in zip(per_candidate, fitted)))
    chosen = max(range(len(candidates)), key=lambda c: (round(crossed[c], 12), -c))
    best = trials[fitted[chosen]][1]
    best_score = scores[fitted[chosen]]
    single_scores = {f"run{i}": aggregate(per_query) for i, per_query in enumerate(singles)}
    report = {"split": split, "measure": measure, "queries": judged, "step": step,
              "score": best_score, "cross_fitted": crossed[chosen], "folds": len(folds),
              "per_query": crossed_per_query[chosen],
              "single_runs": single_scores,
              "candidates": [{"fusion": trials[fitted[c]][1].describe(), "score": scores[fitted[c]],
                              "cross_fitted": crossed[c]} for c in range(len(candidates))],
              "trials": [{"fusion": spec.describe(), "score": score} for score, (_, spec) in zip(scores, trials)]}
    logger.info("fitted %s on %d %s queries: %s %.4f, cross-fitted %.4f (single runs: %s)", best.describe(),
                judged, split, measure, best_score, crossed[chosen],
                ", ".join(f"{v:.4f}" for v in single_scores.values()))
    return replace(best, fit=report)


def cross_fit_folds(qids: Sequence[str], folds: int = CROSS_FIT_FOLDS, seed: int = CROSS_FIT_SEED) -> list[list[str]]:
    """The fit queries in ``folds`` seeded folds of near-equal size (fewer when there are fewer queries), for the
    cross-fitted score of :func:`fit_fusion`. The order of ``qids`` does not matter."""
    order = sorted(qids)
    random.Random(seed).shuffle(order)
    n = min(folds, len(order))
    return [order[i::n] for i in range(n)] if n else []


class _ScoreMatrix:
    """The normalised runs of a ``wsum`` fit as one ``[documents, runs]`` matrix (a document a run did not
    retrieve scores 0 there, as in ranx's weighted sum), so that each weight vector of the grid costs one
    matrix-vector product instead of a fusion and a conversion of the fused run back from ranx (ranx's
    ``Run.to_dict`` on a fused run of 800 queries × 2,000 documents takes seconds; a fit tries 21 weights or more).
    ``tests/test_fusion.py`` checks that every weight scores as ``ranx.fuse`` does."""

    def __init__(self, ranx_runs: Sequence[Any], queries: Sequence[str]) -> None:
        placeholders = {_placeholder(i) for i in range(len(ranx_runs))}
        runs = [run.to_dict() for run in ranx_runs] if ranx_runs else []
        self.queries = list(queries)
        self.docs: list[list[str]] = []
        bounds, blocks = [0], []
        for qid in self.queries:
            per_run = [run.get(qid, {}) for run in runs]
            docs = list(dict.fromkeys(doc for docs in per_run for doc in docs if doc not in placeholders))
            block = np.zeros((len(docs), len(runs)))
            for j, scored in enumerate(per_run):
                block[:, j] = [scored.get(doc, 0.0) for doc in docs]
            self.docs.append(docs)
            blocks.append(block)
            bounds.append(bounds[-1] + len(docs))
        self.bounds = bounds
        self.matrix = np.concatenate(blocks) if blocks else np.zeros((0, len(runs)))

    def weighted_sum(self, weights: Sequence[float], cutoff: int | None) -> dict[str, dict[str, float]]:
        """``Σ_i w_i · s̃_i`` per query; with ``cutoff``, only the documents that can rank in the top ``cutoff``
        (every document scoring, as trec_eval's float32, at least the ``cutoff``-th score: ties kept), which
        leaves a measure @``cutoff`` unchanged."""
        fused = self.matrix @ np.asarray(weights, dtype=np.float64)
        out: dict[str, dict[str, float]] = {}
        for i, qid in enumerate(self.queries):
            scores = fused[self.bounds[i]:self.bounds[i + 1]]
            docs = self.docs[i]
            if cutoff is not None and len(docs) > cutoff:
                scores32 = scores.astype(np.float32)
                keep = np.flatnonzero(scores32 >= np.partition(scores32, -cutoff)[-cutoff])
                out[qid] = {docs[j]: float(scores[j]) for j in keep}
            else:
                out[qid] = {doc: float(score) for doc, score in zip(docs, scores)}
        return out


def _cutoff(measure: str, depth: int) -> int | None:
    """The rank cutoff of a measure @k with k ≤ ``depth`` (only the top k can change it), else None."""
    match = re.search(r"@(\d+)$", measure)
    return int(match.group(1)) if match and int(match.group(1)) <= depth else None


def simplex_grid(n: int, step: float) -> list[tuple[float, ...]]:
    """Every weight vector of ``n`` non-negative multiples of ``step`` that sum to 1 (exactly: integer parts)."""
    parts = round(1.0 / step)
    grid = []
    for cuts in itertools.combinations(range(parts + n - 1), n - 1):   # stars and bars
        bounds = (-1, *cuts, parts + n - 1)
        grid.append(tuple(round((bounds[i + 1] - bounds[i] - 1) / parts, 10) for i in range(n)))
    return sorted(grid)


def _distance_from_uniform(spec: FusionSpec, n: int) -> float:
    if spec.weights is None:
        return 0.0
    return float(sum((w - 1.0 / n) ** 2 for w in spec.weights))


def parse_candidates(method: str, norm: str | None) -> list[tuple[str, str | None]]:
    """``method`` rrf | wsum | auto and ``norm`` minmax | zscore | None → the candidates :func:`fit_fusion` tries
    (``auto``: rrf and wsum with the given norm, or with both norms when none is given)."""
    if method == "auto":
        norms = [norm] if norm else list(NORMS)
        return [("rrf", None)] + [("wsum", n) for n in norms]
    if method == "rrf":
        return [("rrf", None)]
    if method == "wsum":
        return [("wsum", norm or "minmax")]
    raise ConfigError(f"fusion method must be one of {', '.join((*METHODS, 'auto'))}, got {method!r}")


# ------------------------------------------------------------------------------------------- files
def fit_on_split(train_run_paths: Sequence[str | Path], collection: str | Path, split: str = "train",
                 candidates: Sequence[tuple[str, str | None]] = (("wsum", "minmax"),),
                 measure: str = DEFAULT_FIT_MEASURE, step: float = DEFAULT_STEP, depth: int = DEFAULT_DEPTH,
                 k: int = RRF_K, block: int = FIT_BLOCK) -> FusionSpec:
    """:func:`fit_fusion` on run files of ``split``'s queries and that split's qrels only (``test`` refused
    before anything is read). The runs are streamed (:func:`streamed_blocks`): a fit holds ``block`` queries of
    each run at a time, whatever the number of training queries."""
    if split == TEST_SPLIT:
        raise ConfigError("fusion weights are fitted on training queries, never on the test split "
                          "(use the train or a dev split)")
    _check_block(block)
    qrels = BeirCollection(Path(collection)).load_qrels(split)
    readers = [_QueryReader(Path(path), set(qrels)) for path in train_run_paths]
    order = merged_order([reader.ids for reader in readers])
    return _fit_blocks(streamed_blocks(readers, order, block), len(readers), qrels, len(order), candidates,
                       measure, step, depth, k, split)


def _check_block(block: int) -> None:
    if block < 1:
        raise ConfigError(f"block (queries scored at a time) must be >= 1, got {block}")


class _QueryReader:
    """One pass over a run file, query by query (:func:`pretrieve.data.trec.iter_run`), handing out the queries
    asked for. ``ids``: the file's queries among ``wanted``, in file order (a first pass reads only the query
    column). A query asked for before the ones the file lists ahead of it is found by reading on, keeping the
    wanted queries read meanwhile: runs written in the same query order (as every run of one split here is) keep
    none."""

    def __init__(self, path: Path, wanted: set[str]) -> None:
        self.ids = [qid for qid in dict.fromkeys(line.split(None, 1)[0] for _, line in iter_lines(path)
                                                 if line.strip()) if qid in wanted]
        self.present = set(self.ids)
        self.path = path
        self.stream: Iterator[tuple[str, dict[str, float]]] | None = None
        self.ahead: dict[str, dict[str, float]] = {}

    def take(self, ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """``{qid: {doc_id: score}}`` of the ``ids`` this run has."""
        if self.stream is None:
            self.stream = iter_run(self.path)
        out = {}
        for qid in ids:
            if qid not in self.present:
                continue
            while qid not in self.ahead:
                read, docs = next(self.stream)
                if read in self.present:
                    self.ahead[read] = docs
            out[qid] = self.ahead.pop(qid)
        return out


def merged_order(sequences: Sequence[Sequence[str]]) -> list[str]:
    """Every id of the ``sequences`` once, in an order that keeps each sequence's own order when they agree (runs
    of one split listing its queries in the same order, each maybe lacking some): the next id is a sequence's
    next one that no other sequence lists later (when none is, the order disagrees: the first sequence's next)."""
    positions = [{qid: i for i, qid in enumerate(sequence)} for sequence in sequences]
    at = [0] * len(sequences)
    order: list[str] = []
    emitted: set[str] = set()
    while True:
        for j, sequence in enumerate(sequences):
            while at[j] < len(sequence) and sequence[at[j]] in emitted:
                at[j] += 1
        heads = [sequence[at[j]] for j, sequence in enumerate(sequences) if at[j] < len(sequence)]
        if not heads:
            return order
        ready = [qid for qid in heads if all(position.get(qid, at[j]) <= at[j] for j, position in enumerate(positions))]
        order.append((ready or heads)[0])
        emitted.add(order[-1])


def streamed_blocks(readers: Sequence[_QueryReader], order: Sequence[str], block: int) -> Iterator[list[Run]]:
    """The runs' queries ``order`` in consecutive blocks of ``block``, each as one partial run per reader."""
    for start in range(0, len(order), block):
        ids = order[start:start + block]
        yield [reader.take(ids) for reader in readers]


def fit_record(spec: FusionSpec) -> dict[str, Any] | None:
    """The part of a fitted spec's report that describes the fit (recorded with the fused run)."""
    if not spec.fit:
        return None
    return {key: spec.fit[key] for key in ("split", "measure", "queries", "step", "score", "cross_fitted", "folds")
            if key in spec.fit}


def write_fused_run(run_paths: Sequence[str | Path], out: str | Path, spec: FusionSpec, tag: str = "fused",
                    fit_inputs: Mapping[str, str | Path] | None = None) -> dict[str, dict[str, float]]:
    """Fuse run files into ``out`` (TREC, atomic, with the freshness sidecar: the fusion's settings and the
    fingerprints of the input runs — and of the training runs and qrels when the weights were fitted)."""
    fused = fuse_runs([read_run(path) for path in run_paths], spec)
    inputs = {f"run{i + 1}": Path(path) for i, path in enumerate(run_paths)}
    inputs.update({name: Path(path) for name, path in (fit_inputs or {}).items()})
    write_run_file(fused, out, tag=tag, depth=spec.depth, settings=fusion_settings(spec), inputs=inputs)
    return fused


def fusion_settings(spec: FusionSpec) -> dict[str, Any]:
    """A fused run's recorded settings: the fusion, and how its weights were fitted (if they were)."""
    return {"fusion": spec.settings(), "fitted": fit_record(spec)}
