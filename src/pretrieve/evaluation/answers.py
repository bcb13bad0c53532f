"""Answer accuracy: top-k retrieval accuracy on open-domain QA, the measure of DPR (Karpukhin et al. 2020, "Dense
Passage Retrieval for Open-Domain Question Answering") and of the NQ/TriviaQA columns of the papers that follow it.

``Acc@k`` of a question is 1 when one of its top ``k`` passages *contains an answer*, else 0 (a question with no
retrieved passage scores 0); the mean is over every question of the answers file. "Contains an answer" is DPR's
``has_answer`` (``dpr/data/qa_validation.py``), which pyserini's ``evaluate_dpr_retrieval`` and Tevatron use too:

* ``match="string"`` (NQ, TriviaQA): passage and answer are Unicode-normalised (NFD) and tokenised by DPR's
  ``SimpleTokenizer`` — runs of letters, digits and combining marks (``[\\p{L}\\p{N}\\p{M}]+``), or any other single
  character that is not a separator or control character (``[^\\p{Z}\\p{C}]``); the passage holds the answer when the
  answer's lower-cased tokens occur in it as a contiguous sequence;
* ``match="regex"`` (CuratedTREC): the answer is a regular expression searched in the NFD passage, ignoring case
  (an answer that is not a valid expression matches nothing, as in DPR).

As in DPR and pyserini, the passage's *text* is matched, not its title. The ranking of a run is ``trec_eval``'s
(:func:`pretrieve.evaluation.metrics.trec_eval_ranking`), so ``Acc@k`` and the qrels measures read the same order.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, Iterable, Mapping, Sequence

import regex

from pretrieve.data.beir import Answers, iter_corpus
from pretrieve.data.collection import BeirCollection
from pretrieve.data.registry import benchmark_parts
from pretrieve.errors import ConfigError, InputError
from pretrieve.evaluation.metrics import (DEFAULT_MEASURES, EvalResult, MissingPolicy, Run, RunEvaluator,
                                          parse_measures, trec_eval_ranking)

#: ``Acc@k`` names (case-insensitive); ``Top-k`` accuracy in DPR's tables.
ANSWER_MEASURE = re.compile(r"^acc@(\d+)$", re.IGNORECASE)
#: The cut-offs the BoW, DPR and coCondenser tables report for NQ and TriviaQA.
DEFAULT_ANSWER_MEASURES: tuple[str, ...] = ("Acc@5", "Acc@20", "Acc@100")

_ALPHA_NUM = r"[\p{L}\p{N}\p{M}]+"
_NON_WS = r"[^\p{Z}\p{C}]"
#: DPR's SimpleTokenizer: \p{...} classes need the ``regex`` package (the standard ``re`` has none).
_TOKENS = regex.compile(f"({_ALPHA_NUM})|({_NON_WS})", flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)


def tokenize(text: str) -> list[str]:
    """DPR's ``SimpleTokenizer`` tokens of ``text``, lower-cased (``.words(uncased=True)``)."""
    return [match.group().lower() for match in _TOKENS.finditer(text)]


def has_answer(answers: Answers, text: str) -> bool:
    """Whether ``text`` contains one of ``answers`` (DPR's ``has_answer``; see the module docstring)."""
    text = unicodedata.normalize("NFD", text)
    if answers.match == "regex":
        for answer in answers.answers:
            try:
                pattern = regex.compile(unicodedata.normalize("NFD", answer),
                                        flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
            except regex.error:
                continue
            if pattern.search(text) is not None:
                return True
        return False
    words = tokenize(text)
    for answer in answers.answers:
        wanted = tokenize(unicodedata.normalize("NFD", answer))
        if not wanted:
            continue
        for start in range(len(words) - len(wanted) + 1):
            if words[start:start + len(wanted)] == wanted:
                return True
    return False


def is_answer_measure(name: str) -> bool:
    return ANSWER_MEASURE.match(name.strip()) is not None


def answer_cutoffs(names: Iterable[str]) -> dict[str, int]:
    """``{name: k}`` of ``Acc@k`` names; any other name is a :class:`ConfigError`."""
    cutoffs = {}
    for name in names:
        match = ANSWER_MEASURE.match(name.strip())
        if match is None or int(match.group(1)) < 1:
            raise ConfigError(f"unknown answer measure '{name}'; expected Acc@k with k ≥ 1, e.g. Acc@20")
        cutoffs[name.strip()] = int(match.group(1))
    return cutoffs


def check_measures(names: str | Sequence[str]) -> list[str]:
    """Measure names (a list or comma-separated) checked before any work: ``Acc@k``, or ``ir_measures`` names
    (:func:`pretrieve.evaluation.metrics.parse_measures`); a :class:`ConfigError` names the first bad one."""
    names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if str(n).strip()]
    answer_cutoffs([n for n in names if is_answer_measure(n)])
    others = [n for n in names if not is_answer_measure(n)]
    if others or not names:
        parse_measures(others)
    return names


def passage_texts(corpus_path, wanted: set[str]) -> dict[str, str]:
    """The texts (not titles) of the ``wanted`` passages, read in one pass over a corpus file."""
    texts = {}
    for _, doc in iter_corpus(corpus_path):
        if doc.id in wanted:
            texts[doc.id] = doc.text
    return texts


class AnswerEvaluator:
    """Scores runs by answer accuracy against ``answers`` (``{query_id: Answers}``); ``texts`` gives the text of
    passage ids (a mapping, or a function of a set of ids → mapping: :func:`passage_texts` of the corpus)."""

    def __init__(self, answers: Mapping[str, Answers], measures: Sequence[str] = DEFAULT_ANSWER_MEASURES,
                 texts: Mapping[str, str] | Callable[[set[str]], Mapping[str, str]] | None = None):
        if not answers:
            raise InputError("the answers are empty (no question)")
        self.answers = dict(answers)
        self.cutoffs = answer_cutoffs(measures)
        self.texts = texts

    def __call__(self, run: Run, name: str | None = None) -> EvalResult:
        depth = max(self.cutoffs.values())
        rankings = {qid: trec_eval_ranking(run[qid])[:depth] for qid in self.answers if qid in run}
        if not rankings:
            raise InputError("no question of the answers file is in the run (do the query ids match?)", path=name)
        wanted = {doc for ranking in rankings.values() for doc in ranking}
        texts = self.texts(wanted) if callable(self.texts) else (self.texts or {})
        unknown = sorted(wanted - set(texts))
        if unknown:
            raise InputError(f"{len(unknown)} retrieved passages are not in the corpus (first: '{unknown[0]}')",
                             path=name)
        first_hit = {}   # rank (from 1) of the first passage with an answer, 0 when none
        for qid, ranking in rankings.items():
            first_hit[qid] = next((rank for rank, doc in enumerate(ranking, 1)
                                   if has_answer(self.answers[qid], texts[doc])), 0)
        per_query = {label: {qid: float(0 < first_hit.get(qid, 0) <= k) for qid in self.answers}
                     for label, k in self.cutoffs.items()}
        aggregate = {label: sum(scores.values()) / len(scores) for label, scores in per_query.items()}
        missing = tuple(qid for qid in self.answers if qid not in run)
        return EvalResult(aggregate=aggregate, per_query=per_query, measures=list(self.cutoffs), missing="zero",
                          judged_queries=tuple(self.answers), missing_queries=missing,
                          unjudged_queries=sum(1 for qid in run if qid not in self.answers))


def merge_results(first: EvalResult, second: EvalResult) -> EvalResult:
    """One result with the measures of both (qrels measures and answer accuracy of the same run)."""
    return EvalResult(aggregate={**first.aggregate, **second.aggregate},
                      per_query={**first.per_query, **second.per_query}, measures=first.measures + second.measures,
                      missing=first.missing, judged_queries=first.judged_queries,
                      missing_queries=first.missing_queries, unjudged_queries=first.unjudged_queries)


def split_evaluator(collection: BeirCollection, split: str, measures: str | Sequence[str] | None = None, *,
                    default: str | Sequence[str] = DEFAULT_MEASURES, missing: MissingPolicy = "zero",
                    ignore_identical_ids: bool = False) -> Callable[..., EvalResult]:
    """The evaluator of a collection's split: qrels measures (:class:`RunEvaluator`) and ``Acc@k``
    (:class:`AnswerEvaluator` on ``answers/<split>.jsonl`` and the corpus's texts), either or both. ``measures``:
    names (a list or comma-separated); None → ``default``, or :data:`DEFAULT_ANSWER_MEASURES` for a split judged
    by answers only."""
    if benchmark_parts(collection.root):
        raise ConfigError(f"{collection.root.name} is a benchmark of several collections, scored as the mean of its "
                          f"parts: evaluate models on it (--model / models=), or runs on one part "
                          f"({collection.root.name}/{benchmark_parts(collection.root)[0].name})")
    judged_by_answers = collection.qrels_path(split).suffix == ".jsonl"
    names = check_measures(measures if measures is not None else
                           (DEFAULT_ANSWER_MEASURES if judged_by_answers else default))
    answer_names = [n for n in names if is_answer_measure(n)]
    qrels_names = [n for n in names if not is_answer_measure(n)]
    if qrels_names and judged_by_answers:
        raise ConfigError(f"split '{split}' of {collection.root} is judged by answer strings only (no qrels): "
                          f"measure {qrels_names[0]} needs qrels; use Acc@k, e.g. {','.join(DEFAULT_ANSWER_MEASURES)}")
    by_qrels = (RunEvaluator(collection.load_qrels(split), qrels_names, missing=missing,
                             ignore_identical_ids=ignore_identical_ids) if qrels_names else None)
    by_answers = (AnswerEvaluator(collection.load_answers(split), answer_names,
                                  texts=lambda wanted: passage_texts(collection.corpus_path, wanted))
                  if answer_names else None)

    def evaluate_run(run: Run, name: str | None = None) -> EvalResult:
        results = [evaluator(run, name=name) for evaluator in (by_qrels, by_answers) if evaluator is not None]
        return results[0] if len(results) == 1 else merge_results(*results)

    return evaluate_run
