"""Retrieval metrics: per-query and mean scores of a run against qrels, computed by ``ir_measures``.

Every measure is delegated to ``ir_measures`` and, wherever it supports the measure, to its
``pytrec_eval`` backend (the C ``trec_eval`` code that BEIR, Tevatron and the papers use). Only
measures ``pytrec_eval`` lacks go to the next ``ir_measures`` provider able to compute them; among the
defaults that is ``RR@10`` (MRR@10), computed by ir_measures' MS MARCO provider. Nothing is
hand-written here except the bookkeeping, so the numbers agree with ``pytrec_eval`` to rounding.

Conventions (chosen to match ``pytrec_eval`` / BEIR's ``EvaluateRetrieval.evaluate``):

* **Queries judged but absent from the run** score 0 (``missing="zero"``, the default), and every
  mean is over every judged query, as ``trec_eval -c`` does when systems are compared: rows of one
  table, their paired tests and the differences a report states then all share one query set (a BM25
  run that answers nothing for a query whose words are not in the corpus is not averaged over fewer
  queries than a dense run). ``missing="ignore"`` is the "answered queries only" mean of
  ``pytrec_eval`` and BEIR's ``EvaluateRetrieval.evaluate`` (published BEIR numbers ignore them); ask
  for it explicitly. A query that is in the run with no documents counts as present (it scores 0).
* **Queries in the run but not in the qrels** are ignored.
* **Relevance:** binary measures (RR, Recall, AP) count grade ≥ 1 as relevant; nDCG uses the grades
  as gains (``trec_eval``'s linear gain, log2 discount). ``ir_measures`` syntax selects other levels,
  e.g. ``"AP(rel=2)"``.
* **Recall@k** is ``trec_eval``'s ``recall_k`` (relevant in top k / all relevant), BEIR's Recall@k.
* **MRR@10** is ``ir_measures``' ``RR@10``: 1/rank of the first relevant document within the top 10,
  0 if none. (BEIR's own ``mrr`` helper divides by the number of judged queries, i.e. it behaves like
  ``missing="zero"``.)
* **Ties:** ``trec_eval`` ranks by score stored as float32, breaking ties by *descending* document id,
  while the MS MARCO provider breaks them by ascending id. Runs given to providers other than
  ``pytrec_eval`` are therefore first re-scored with ``trec_eval``'s ranking (:func:`trec_eval_ranking`),
  so every measure sees the same ranking.
* ``ignore_identical_ids`` (off by default) drops documents whose id equals the query id, as BEIR's
  ``EvaluateRetrieval.evaluate`` does by default (``ignore_identical_ids=True``) for every dataset; it matters
  where queries are documents of the corpus (ArguAna, Quora). It is wrong for collections whose query and
  document ids are unrelated numbers (MS MARCO, Cranfield), hence opt-in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

import ir_measures
import numpy as np
from ir_measures import Measure

from pretrieve.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]
MissingPolicy = Literal["ignore", "zero"]

DEFAULT_MEASURES: tuple[str, ...] = (
    "MRR@10", "R@5", "R@20", "R@50", "R@100", "R@1000", "nDCG@10", "nDCG@100", "MAP",
)
MEASURE_EXAMPLES = "nDCG@10, MRR@10 (= RR@10), R@100 (= Recall@100), MAP (= AP), P@10, AP(rel=2)"
MISSING_POLICIES: tuple[str, ...] = ("ignore", "zero")


@dataclass
class EvalResult:
    """Scores of one run: ``aggregate[measure]`` (mean) and ``per_query[measure][query_id]``.

    ``per_query`` holds the evaluated queries (see ``missing``) in qrels order; ``judged_queries`` is
    every query of the qrels (significance tests check that two results share them).
    """

    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]
    measures: list[str]
    missing: str = "zero"
    judged_queries: tuple[str, ...] = ()
    missing_queries: tuple[str, ...] = ()
    unjudged_queries: int = 0

    @property
    def n_queries(self) -> int:
        """Number of queries the means are taken over."""
        return len(next(iter(self.per_query.values()), {}))

    def to_dict(self, per_query: bool = False) -> dict[str, Any]:
        """A JSON-ready summary; per-query scores only when asked (they can be large)."""
        out: dict[str, Any] = {
            "aggregate": dict(self.aggregate),
            "n_queries": self.n_queries,
            "missing_policy": self.missing,
            "judged_queries_missing_from_run": len(self.missing_queries),
            "run_queries_without_judgments": self.unjudged_queries,
        }
        if per_query:
            out["per_query"] = {name: dict(scores) for name, scores in self.per_query.items()}
        return out


def parse_measure(name: str) -> Measure:
    """Parse a user-facing measure name (``ir_measures`` syntax); bad names raise :class:`ConfigError`."""
    text = name.strip()
    try:
        measure = ir_measures.parse_measure(text)
    except (NameError, ValueError, SyntaxError, TypeError) as exc:
        raise ConfigError(f"unknown measure '{name}' ({exc}); examples: {MEASURE_EXAMPLES}") from None
    if _provider_for(measure) is None:
        raise ConfigError(f"measure '{name}' has no available ir_measures provider; examples: {MEASURE_EXAMPLES}")
    return measure


def parse_measures(names: str | Iterable[str]) -> dict[str, Measure]:
    """``{name: Measure}`` for a comma-separated string or a list of names (order kept, duplicates dropped)."""
    if isinstance(names, str):
        names = names.split(",")
    parsed = {name.strip(): parse_measure(name) for name in names if name.strip()}
    if not parsed:
        raise ConfigError(f"no measures given; examples: {MEASURE_EXAMPLES}")
    return parsed


def _provider_for(measure: Measure):
    """``pytrec_eval`` when it supports the measure, else the first available ``ir_measures`` provider that does."""
    candidates = [ir_measures.pytrec_eval] + list(ir_measures.DefaultPipeline.providers)
    for provider in candidates:
        if provider.supports(measure) and provider.is_available():
            return provider
    return None


def trec_eval_ranking(docs: Mapping[str, float]) -> list[str]:
    """Document ids in the order ``trec_eval`` ranks them: score as float32 descending, then id descending.

    ``trec_eval`` keeps scores as C ``float`` and sorts ties with ``strcmp`` reversed; Python's string
    order equals byte order of UTF-8, so this reproduces it exactly.
    """
    if not docs:
        return []
    ids = list(docs)
    scores32 = np.fromiter(docs.values(), dtype=np.float64, count=len(ids)).astype(np.float32).tolist()
    return [doc_id for _, doc_id in sorted(zip(scores32, ids), reverse=True)]


def rescore_by_rank(run: Run) -> dict[str, dict[str, float]]:
    """The same run with tie-free scores ``n, n-1, ..., 1`` following :func:`trec_eval_ranking`."""
    rescored = {}
    for qid, docs in run.items():
        ranking = trec_eval_ranking(docs)
        rescored[qid] = {doc_id: float(len(ranking) - i) for i, doc_id in enumerate(ranking)}
    return rescored


def drop_identical_ids(run: Run) -> dict[str, dict[str, float]]:
    """Remove documents whose id equals their query's id (BEIR's ``ignore_identical_ids``)."""
    return {qid: {doc_id: s for doc_id, s in docs.items() if doc_id != qid} for qid, docs in run.items()}


class RunEvaluator:
    """Evaluates runs against one set of qrels; the ``ir_measures`` evaluators are built once.

    Use it when scoring several runs on the same qrels; :func:`evaluate` is the one-shot form.
    """

    def __init__(self, qrels: Qrels, measures: str | Sequence[str] = DEFAULT_MEASURES,
                 missing: MissingPolicy = "zero", ignore_identical_ids: bool = False):
        if missing not in MISSING_POLICIES:
            raise ConfigError(f"missing-query policy must be one of {', '.join(MISSING_POLICIES)}, got '{missing}'")
        if not qrels:
            raise InputError("qrels are empty (no judged query)")
        self.measures = parse_measures(measures)
        self.missing = missing
        self.ignore_identical_ids = ignore_identical_ids
        self.judged_queries = tuple(qrels)
        without_relevant = sum(1 for docs in qrels.values() if not any(int(g) > 0 for g in docs.values()))
        if without_relevant == len(qrels):
            logger.warning("the qrels have no relevant judgment (every grade is 0 or negative): every measure is 0 "
                           "for every run")
        elif without_relevant:
            logger.warning("%d of %d judged queries have no relevant document (grade > 0): they score 0 in every "
                           "measure", without_relevant, len(qrels))
        plain_qrels = {qid: {doc_id: int(grade) for doc_id, grade in docs.items()} for qid, docs in qrels.items()}
        by_provider: dict[Any, list[Measure]] = {}
        for measure in dict.fromkeys(self.measures.values()):
            by_provider.setdefault(_provider_for(measure), []).append(measure)
        self._evaluators = [(provider is ir_measures.pytrec_eval, provider.evaluator(measures_, plain_qrels))
                            for provider, measures_ in by_provider.items()]

    def __call__(self, run: Run, name: str | None = None) -> EvalResult:
        """Score ``run``; ``name`` only labels log messages."""
        if self.ignore_identical_ids:
            run = drop_identical_ids(run)
        judged = set(self.judged_queries)
        missing_queries = tuple(qid for qid in self.judged_queries if qid not in run)
        unjudged = sum(1 for qid in run if qid not in judged)
        if len(missing_queries) == len(self.judged_queries):
            raise InputError("no query of the run is judged in the qrels (do the query ids match?)", path=name)
        values = self._per_measure_values(run)
        if self.missing == "ignore":
            evaluated = [qid for qid in self.judged_queries if qid in run]
        else:
            evaluated = list(self.judged_queries)
        per_query = {label: {qid: values[measure].get(qid, float(measure.DEFAULT)) for qid in evaluated}
                     for label, measure in self.measures.items()}
        aggregate = {label: _aggregate(self.measures[label], scores.values()) for label, scores in per_query.items()}
        if missing_queries or unjudged:
            logger.info("%s: %d judged queries missing from the run (%s), %d run queries without judgments "
                        "(ignored)", name or "run", len(missing_queries),
                        "ignored" if self.missing == "ignore" else "scored 0", unjudged)
        return EvalResult(aggregate=aggregate, per_query=per_query, measures=list(self.measures),
                          missing=self.missing, judged_queries=self.judged_queries,
                          missing_queries=missing_queries, unjudged_queries=unjudged)

    def _per_measure_values(self, run: Run) -> dict[Measure, dict[str, float]]:
        """``{Measure: {query_id: value}}`` from every provider's evaluator."""
        plain_run = {qid: {doc_id: float(score) for doc_id, score in docs.items()} for qid, docs in run.items()}
        rescored = None
        values: dict[Measure, dict[str, float]] = {measure: {} for measure in self.measures.values()}
        for is_pytrec_eval, evaluator in self._evaluators:
            if not is_pytrec_eval and rescored is None:
                rescored = rescore_by_rank(plain_run)
            for metric in evaluator.iter_calc(plain_run if is_pytrec_eval else rescored):
                values[metric.measure][metric.query_id] = float(metric.value)
        return values


def _aggregate(measure: Measure, values: Iterable[float]) -> float:
    """The measure's own ``ir_measures`` aggregation (the mean for every ranking measure)."""
    aggregator = measure.aggregator()
    for value in values:
        aggregator.add(value)
    return float(aggregator.result())


def evaluate(qrels: Qrels, run: Run, measures: str | Sequence[str] = DEFAULT_MEASURES, *,
             missing: MissingPolicy = "zero", ignore_identical_ids: bool = False) -> EvalResult:
    """Score one run (``{query_id: {doc_id: score}}``) against qrels (``{query_id: {doc_id: grade}}``).

    ``measures`` are ``ir_measures`` names such as ``"nDCG@10"``, ``"MRR@10"``, ``"R@100"``, ``"MAP"``
    (a list or a comma-separated string); the result is keyed by the names as given. See the module
    docstring for how missing queries, ties and relevance grades are treated.
    """
    return RunEvaluator(qrels, measures, missing=missing, ignore_identical_ids=ignore_identical_ids)(run)


def mean_of_parts(parts: Mapping[str, EvalResult]) -> EvalResult:
    """One result for a benchmark scored as the mean of its parts' scores — BEIR's CQADupStack, the mean of its 12
    forums' means (not the mean over all their queries): ``aggregate[m]`` = mean over the parts of their
    ``aggregate[m]``; ``per_query`` holds every part's queries as ``<part>/<query id>`` (what paired tests pair)."""
    if not parts:
        raise ConfigError("a benchmark needs at least one part")
    first = next(iter(parts.values()))
    measures = list(first.measures)
    aggregate = {m: float(np.mean([result.aggregate[m] for result in parts.values()])) for m in measures}
    per_query = {m: {f"{part}/{qid}": value for part, result in parts.items()
                     for qid, value in result.per_query[m].items()} for m in measures}
    return EvalResult(aggregate=aggregate, per_query=per_query, measures=measures, missing=first.missing,
                      judged_queries=tuple(f"{part}/{qid}" for part, r in parts.items() for qid in r.judged_queries),
                      missing_queries=tuple(f"{part}/{qid}" for part, r in parts.items() for qid in r.missing_queries),
                      unjudged_queries=sum(r.unjudged_queries for r in parts.values()))
