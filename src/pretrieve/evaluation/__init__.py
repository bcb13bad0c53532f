"""Evaluation: retrieval metrics (ir_measures / pytrec_eval), paired significance tests, results tables.

Knows nothing about models: it scores runs (``{query_id: {doc_id: score}}``) against qrels
(``{query_id: {doc_id: grade}}``) and formats the numbers.
"""

from pretrieve.evaluation.metrics import (DEFAULT_MEASURES, EvalResult, RunEvaluator, evaluate, parse_measure,
                                          parse_measures, trec_eval_ranking)
from pretrieve.evaluation.report import (BeirTable, CollectionsTable, ResultsTable, beir_table, build_table,
                                         collections_table, format_p, format_value)
from pretrieve.evaluation.significance import (SignificanceResult, compare, holm, holm_family, holm_note,
                                               paired_permutation_test, paired_scores, paired_ttest)

__all__ = [
    "DEFAULT_MEASURES", "BeirTable", "CollectionsTable", "EvalResult", "ResultsTable", "RunEvaluator",
    "SignificanceResult", "beir_table", "build_table", "collections_table", "compare", "evaluate", "format_p",
    "format_value", "holm", "holm_family", "holm_note", "paired_permutation_test", "paired_scores", "paired_ttest",
    "parse_measure", "parse_measures", "trec_eval_ranking",
]
