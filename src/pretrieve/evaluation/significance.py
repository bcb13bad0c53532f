"""Paired significance tests between two runs over the per-query scores of one measure.

Two tests, both two-sided and paired by query:

* ``"ttest"`` — Student's paired t-test (``scipy.stats.ttest_rel``), the test the papers report
  (p ≤ 0.05).
* ``"permutation"`` — the paired randomization test of Smucker, Allan & Carterette (CIKM 2007): under
  the null hypothesis the two systems' scores of a query are exchangeable, so each per-query
  difference's sign is flipped at random; the p-value is the share of sign assignments whose mean
  difference is at least as extreme as the observed one. With ``B`` random assignments it is
  ``(1 + #extreme) / (1 + B)`` (Phipson & Smyth 2010: never 0, a valid p-value); when ``2**n ≤ B``
  all ``2**n`` assignments are enumerated and the p-value is exact. Seeded, so it is deterministic.

**Which queries are paired:** the judged queries evaluated for either run (the union of the two
``EvalResult.per_query`` key sets; both results must come from the same qrels). A query missing from
one run scores 0 for that run — even though that run's mean in the table ignores it under
``missing="ignore"``. A judged query that *neither* run retrieved is left out under ``"ignore"``
(it would only add zero differences); under ``missing="zero"`` every judged query is paired, as in
``trec_eval -c``. For complete runs all of these are the same set: every judged query.

Differences are ``run − baseline``: a positive ``mean_difference`` (▲ in tables) means the run scores
higher than the baseline.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy import stats

from pretrieve.errors import ConfigError
from pretrieve.evaluation.metrics import EvalResult

TestName = Literal["ttest", "permutation"]
TESTS: tuple[str, ...] = ("ttest", "permutation")
DEFAULT_ALPHA = 0.05
DEFAULT_PERMUTATIONS = 10_000
_PERMUTATION_CHUNK = 1_000


@dataclass(frozen=True)
class SignificanceResult:
    """Outcome of one paired test of ``run`` against ``baseline`` on one measure."""

    test: str
    statistic: float
    p_value: float
    mean_difference: float
    n: int
    alpha: float = DEFAULT_ALPHA

    @property
    def significant(self) -> bool:
        """``p ≤ alpha`` (a NaN p-value, e.g. fewer than two queries, is never significant)."""
        return not math.isnan(self.p_value) and self.p_value <= self.alpha

    @property
    def direction(self) -> int:
        """+1 when the run scores higher than the baseline on average, −1 lower, 0 equal."""
        return int(np.sign(self.mean_difference))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["significant"] = self.significant
        return {key: (None if isinstance(value, float) and math.isnan(value) else value)
                for key, value in out.items()}


def paired_ttest(baseline: np.ndarray, run: np.ndarray, alpha: float = DEFAULT_ALPHA) -> SignificanceResult:
    """Two-sided paired t-test of ``run`` vs ``baseline`` (``scipy.stats.ttest_rel(run, baseline)``).

    Degenerate cases scipy answers with NaN are defined here: all differences zero → statistic 0,
    p = 1 (identical runs are not different); fewer than two queries → NaN (not testable).
    """
    baseline, run = _paired_arrays(baseline, run)
    diff = run - baseline
    n = len(diff)
    mean_diff = float(diff.mean()) if n else float("nan")
    if n < 2:
        return SignificanceResult("ttest", float("nan"), float("nan"), mean_diff, n, alpha)
    if not np.any(diff):
        return SignificanceResult("ttest", 0.0, 1.0, 0.0, n, alpha)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # constant non-zero differences: t = ±inf, p = 0
        result = stats.ttest_rel(run, baseline)
    return SignificanceResult("ttest", float(result.statistic), float(result.pvalue), mean_diff, n, alpha)


def paired_permutation_test(baseline: np.ndarray, run: np.ndarray, n_permutations: int = DEFAULT_PERMUTATIONS,
                            seed: int = 0, alpha: float = DEFAULT_ALPHA) -> SignificanceResult:
    """Two-sided paired randomization (sign-flip) test; ``statistic`` is the observed mean difference."""
    if n_permutations < 1:
        raise ConfigError(f"number of permutations must be positive, got {n_permutations}")
    baseline, run = _paired_arrays(baseline, run)
    diff = run - baseline
    n = len(diff)
    if n == 0:
        return SignificanceResult("permutation", float("nan"), float("nan"), float("nan"), 0, alpha)
    observed = float(diff.sum())
    tolerance = 1e-9 * max(1.0, float(np.abs(diff).sum()))  # sums equal up to rounding count as extreme
    threshold = abs(observed) - tolerance
    if 2 ** n <= n_permutations:
        signs = _all_sign_vectors(n)
        extreme = int(np.count_nonzero(np.abs(signs @ diff) >= threshold))
        p_value = extreme / len(signs)
    else:
        rng = np.random.default_rng(seed)
        extreme = 0
        for start in range(0, n_permutations, _PERMUTATION_CHUNK):
            size = min(_PERMUTATION_CHUNK, n_permutations - start)
            signs = rng.integers(0, 2, size=(size, n), dtype=np.int8) * 2 - 1
            extreme += int(np.count_nonzero(np.abs(signs @ diff) >= threshold))
        p_value = (1 + extreme) / (1 + n_permutations)
    return SignificanceResult("permutation", observed / n, float(p_value), observed / n, n, alpha)


def _all_sign_vectors(n: int) -> np.ndarray:
    """Every ``±1`` vector of length ``n`` (``2**n`` rows)."""
    bits = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1
    return (bits * 2 - 1).astype(np.float64)


def _paired_arrays(baseline, run) -> tuple[np.ndarray, np.ndarray]:
    baseline = np.asarray(baseline, dtype=np.float64)
    run = np.asarray(run, dtype=np.float64)
    if baseline.shape != run.shape or baseline.ndim != 1:
        raise ValueError(f"paired scores need two 1-d arrays of equal length, got {baseline.shape} and {run.shape}")
    return baseline, run


def paired_scores(baseline: EvalResult, run: EvalResult, measure: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Query ids and the two runs' per-query scores of ``measure``, paired as the module docstring says
    (queries evaluated for either run, in qrels order; a query absent from one run scores 0 there)."""
    if set(baseline.judged_queries) != set(run.judged_queries):
        raise ConfigError("cannot pair runs evaluated against different qrels")
    for result in (baseline, run):
        if measure not in result.per_query:
            raise ConfigError(f"measure '{measure}' was not evaluated (have: {', '.join(result.per_query)})")
    base_scores, run_scores = baseline.per_query[measure], run.per_query[measure]
    query_ids = [qid for qid in baseline.judged_queries if qid in base_scores or qid in run_scores]
    return (query_ids, np.array([base_scores.get(qid, 0.0) for qid in query_ids]),
            np.array([run_scores.get(qid, 0.0) for qid in query_ids]))


def compare(baseline: EvalResult, run: EvalResult, measure: str, test: TestName = "ttest",
            alpha: float = DEFAULT_ALPHA, n_permutations: int = DEFAULT_PERMUTATIONS,
            seed: int = 0) -> SignificanceResult:
    """Test whether ``run`` differs from ``baseline`` on ``measure`` (see the module docstring)."""
    check_alpha(alpha)
    _, base_scores, run_scores = paired_scores(baseline, run, measure)
    if test == "ttest":
        return paired_ttest(base_scores, run_scores, alpha=alpha)
    if test == "permutation":
        return paired_permutation_test(base_scores, run_scores, n_permutations=n_permutations, seed=seed,
                                       alpha=alpha)
    raise ConfigError(f"unknown significance test '{test}' (choose from {', '.join(TESTS)})")


def check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"significance level alpha must be between 0 and 1, got {alpha}")
