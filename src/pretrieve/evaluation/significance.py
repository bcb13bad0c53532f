"""Paired significance tests between two runs over the per-query scores of one measure.

Two tests, both two-sided and paired by query:

* ``"ttest"`` — Student's paired t-test (``scipy.stats.ttest_rel``), the test the papers report
  (p ≤ 0.05); :func:`paired_ttest` also gives the one-sided test (``alternative="greater"``, the recipe's dev
  gate).
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

**Contrasts over seeds and folds** (``pretrieve bench quality``, issue 20). :func:`multi_bootstrap` is the
paired multi-bootstrap of Sellam et al. (ICLR 2022, "The MultiBERTs", §3): the unit is the per-query score of
each (arm, seed) run, queries pooled over the cross-fitting folds. The statistic is
``Δ = mean over queries of [seed-mean of arm A − seed-mean of arm B]``. One bootstrap replicate draws, with
replacement, the seeds of each arm independently (a seed is one pre-trained model, shared by every fold) and the
queries *within each fold* (stratified: every fold keeps its size), the same queries for both arms (paired). The
95 % interval is the percentile interval of the replicates; the two-sided p-value is
``min(1, 2 · (1 + #{Δ* on the far side of 0}) / (1 + B))`` — the smallest α whose percentile interval
excludes 0, so that ``p < α`` iff the ``1 − α`` interval excludes 0. :func:`holm` is Holm's step-down adjustment
over a declared family of contrasts; :func:`decide` applies the issue's decision rule with a non-inferiority
margin; :func:`minimum_detectable_effect` is the normal-approximation MDE at the measured standard error.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Literal, Sequence

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
    #: ``1 − alpha`` confidence interval of the mean difference, where the test gives one (the t-test); else NaN.
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    #: ``p_value`` adjusted by Holm over the tests it was compared with (:func:`holm_family`); NaN when not adjusted.
    p_holm: float = float("nan")

    @property
    def decisive_p(self) -> float:
        """The p-value the decision is made on: Holm's where the test was adjusted, else the raw one."""
        return self.p_value if math.isnan(self.p_holm) else self.p_holm

    @property
    def significant(self) -> bool:
        """``p ≤ alpha``, Holm's ``p`` where adjusted (a NaN p-value, e.g. fewer than two queries, is never
        significant)."""
        return not math.isnan(self.decisive_p) and self.decisive_p <= self.alpha

    @property
    def direction(self) -> int:
        """+1 when the run scores higher than the baseline on average, −1 lower, 0 equal."""
        return int(np.sign(self.mean_difference))

    def to_dict(self) -> dict:
        """The fields (NaN as None; ``p_holm`` only where adjusted) and ``significant``."""
        out = asdict(self)
        if math.isnan(self.p_holm):
            del out["p_holm"]
        out["significant"] = self.significant
        return {key: (None if isinstance(value, float) and math.isnan(value) else value)
                for key, value in out.items()}


def paired_ttest(baseline: np.ndarray, run: np.ndarray, alpha: float = DEFAULT_ALPHA,
                 alternative: Literal["two-sided", "greater"] = "two-sided") -> SignificanceResult:
    """Paired t-test of ``run`` vs ``baseline`` (``scipy.stats.ttest_rel(run, baseline, alternative=...)``):
    two-sided by default; ``"greater"``: one-sided, ``run`` above ``baseline`` (the interval then ``[low, inf)``).

    Degenerate cases scipy answers with NaN are defined here: all differences zero → statistic 0,
    p = 1 (identical runs are neither different nor better); fewer than two queries → NaN (not testable).
    """
    if alternative not in ("two-sided", "greater"):
        raise ConfigError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    baseline, run = _paired_arrays(baseline, run)
    diff = run - baseline
    n = len(diff)
    mean_diff = float(diff.mean()) if n else float("nan")
    if n < 2:
        return SignificanceResult("ttest", float("nan"), float("nan"), mean_diff, n, alpha)
    if not np.any(diff):
        return SignificanceResult("ttest", 0.0, 1.0, 0.0, n, alpha, 0.0, 0.0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # constant non-zero differences: t = ±inf, p = 0 (or 1)
        result = stats.ttest_rel(run, baseline, alternative=alternative)
        low, high = result.confidence_interval(confidence_level=1 - alpha)
    return SignificanceResult("ttest", float(result.statistic), float(result.pvalue), mean_diff, n, alpha,
                              float(low), float(high))


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


# ------------------------------------------------------------------------------ multi-bootstrap over seeds × queries
DEFAULT_BOOTSTRAP = 10_000
DEFAULT_POWER = 0.8
_BOOTSTRAP_CHUNK = 500
CONFIRMED, REFUTED, UNDECIDED = "confirmed", "refuted-at-this-scale", "undecided"
#: The verdict of a contrast whose arms have one seed each (or one of them has): the multi-bootstrap cannot see the
#: seed variance then (its interval is too narrow; in simulation 24–58 % false positives at a true Δ of 0), so the
#: contrast is reported, never decided (pre-registration, amendment 9).
DESCRIPTIVE = "descriptive (one seed: seed variance not estimated)"


@dataclass(frozen=True)
class BootstrapResult:
    """One contrast ``A − B``: the estimate, its percentile interval and p, and the variance components."""

    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    se: float                  # SD of the bootstrap replicates
    n_queries: int
    n_seeds: tuple[int, int]   # (A, B)
    folds: dict[str, int]      # queries per fold
    sigma_q: float             # SD over queries of the seed-averaged per-query difference (ddof 1)
    tau: tuple[float, float]   # SD over seeds of each arm's pooled mean score (ddof 1; 0 with one seed)
    n_boot: int
    alpha: float = DEFAULT_ALPHA

    def mde(self, power: float = DEFAULT_POWER, tests: int = 1) -> float:
        return minimum_detectable_effect(self.se, alpha=self.alpha, power=power, tests=tests)

    @property
    def seed_variance_estimated(self) -> bool:
        """Whether both arms have ≥ 2 seeds: with one seed the bootstrap resamples no seed variance."""
        return min(self.n_seeds) > 1

    def to_dict(self) -> dict:
        out = asdict(self)
        out["n_seeds"], out["tau"] = list(self.n_seeds), list(self.tau)
        out["mde"] = self.mde()
        out["seed_variance_estimated"] = self.seed_variance_estimated
        return out


def _seed_query_matrix(scores, name: str) -> np.ndarray:
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise ValueError(f"{name}: expected scores of shape (seeds, queries), got {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name}: non-finite scores")
    return matrix


def multi_bootstrap(a, b, folds=None, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                    alpha: float = DEFAULT_ALPHA) -> BootstrapResult:
    """Paired multi-bootstrap of ``A − B`` (module docstring).

    ``a``, ``b``: per-query scores of shape ``(seeds, queries)`` (the seeds of the two arms may differ in number
    and identity); column ``j`` of both is the same query. ``folds``: one label per column (the stratum it is
    resampled within); default one stratum. Seeded, so deterministic.
    """
    check_alpha(alpha)
    if n_boot < 100:
        raise ConfigError(f"the bootstrap needs at least 100 replicates, got {n_boot}")
    a, b = _seed_query_matrix(a, "a"), _seed_query_matrix(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must score the same queries, got {a.shape[1]} and {b.shape[1]} columns")
    n = a.shape[1]
    labels = np.asarray(["all"] * n if folds is None else [str(f) for f in folds])
    if labels.shape != (n,):
        raise ValueError(f"folds needs one label per query ({n}), got {labels.shape}")
    strata = [np.flatnonzero(labels == label) for label in dict.fromkeys(labels.tolist())]
    diff = a.mean(axis=0) - b.mean(axis=0)
    delta = float(diff.mean())
    rng = np.random.default_rng(seed)
    replicates = np.empty(n_boot)
    for start in range(0, n_boot, _BOOTSTRAP_CHUNK):
        size = min(_BOOTSTRAP_CHUNK, n_boot - start)
        weights = np.zeros((size, n))                       # query multiplicities, each fold resampled in itself
        for members in strata:
            picks = members[rng.integers(0, len(members), size=(size, len(members)))]
            np.add.at(weights, (np.arange(size)[:, None], picks), 1.0)
        weights /= n
        seeds_a = rng.integers(0, a.shape[0], size=(size, a.shape[0]))
        seeds_b = rng.integers(0, b.shape[0], size=(size, b.shape[0]))
        mean_a = (a @ weights.T).T                           # (size, seeds of A): each seed's resampled mean
        mean_b = (b @ weights.T).T
        replicates[start:start + size] = (np.take_along_axis(mean_a, seeds_a, 1).mean(1)
                                           - np.take_along_axis(mean_b, seeds_b, 1).mean(1))
    low, high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    tolerance = 1e-12
    below, above = int(np.sum(replicates <= tolerance)), int(np.sum(replicates >= -tolerance))
    p_value = min(1.0, 2 * (1 + min(below, above)) / (1 + n_boot))
    tau = tuple(float(m.mean(axis=1).std(ddof=1)) if m.shape[0] > 1 else 0.0 for m in (a, b))
    return BootstrapResult(delta=delta, ci_low=float(low), ci_high=float(high), p_value=float(p_value),
                           se=float(replicates.std(ddof=1)), n_queries=n, n_seeds=(a.shape[0], b.shape[0]),
                           folds={str(labels[m[0]]): len(m) for m in strata},
                           sigma_q=float(diff.std(ddof=1)) if n > 1 else 0.0, tau=tau, n_boot=n_boot, alpha=alpha)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order: the ``i``-th smallest of ``m``
    p-values is multiplied by ``m − i``, made monotone and capped at 1."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError("holm needs a 1-d array of p-values in [0, 1]")
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, np.maximum.accumulate(p[order] * (len(p) - np.arange(len(p)))))
    adjusted = np.empty_like(p)
    adjusted[order] = scaled
    return adjusted


def holm_family(results: Sequence[SignificanceResult]) -> list[SignificanceResult]:
    """The tests of one family (several runs against one baseline, on one measure) with their Holm-adjusted p-values
    (``p_holm``), in order; a test without a p-value (NaN: fewer than two queries) is left out of the family."""
    tested = [i for i, result in enumerate(results) if not math.isnan(result.p_value)]
    adjusted = holm([results[i].p_value for i in tested]) if tested else []
    out = list(results)
    for i, p in zip(tested, adjusted):
        out[i] = replace(results[i], p_holm=float(p))
    return out


def holm_note(p_values: Sequence[float | None], alpha: float = DEFAULT_ALPHA) -> str:
    """One sentence for a table of raw p-values: whether Holm's adjustment over them (one family) changes any
    decision at ``alpha`` (None / NaN values, tests not made, are left out)."""
    raw = [float(p) for p in p_values if p is not None and not math.isnan(float(p))]
    if len(raw) < 2:
        return ""
    adjusted = holm(raw)
    lost = sum(1 for p, q in zip(raw, adjusted) if p <= alpha < q)
    what = (f"Holm's adjustment over these {len(raw)} tests changes no decision at p ≤ {alpha:g}" if not lost else
            f"Holm's adjustment over these {len(raw)} tests makes {lost} of the "
            f"{sum(1 for p in raw if p <= alpha)} significant differences (p ≤ {alpha:g}) not significant")
    return what + " (the p-values shown are unadjusted)."


def minimum_detectable_effect(se: float, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                              tests: int = 1) -> float:
    """Smallest true Δ a two-sided test at ``alpha / tests`` (Bonferroni: the first step of Holm) detects with
    probability ``power`` when the estimate is normal with standard error ``se``: ``(z₁₋α/2 + z_power) · se``."""
    check_alpha(alpha)
    if not 0.0 < power < 1.0 or tests < 1:
        raise ConfigError(f"power must be in (0, 1) and tests ≥ 1, got {power}, {tests}")
    return float((stats.norm.ppf(1 - alpha / (2 * tests)) + stats.norm.ppf(power)) * se)


def rule_power(true_delta: float, se: float, margin: float, alpha: float = DEFAULT_ALPHA, tests: int = 1) -> float:
    """Probability that :func:`decide` says *confirmed* when the true difference is ``true_delta``, for a normal
    estimate with standard error ``se`` tested at Holm's first step (``alpha / tests``, two-sided): the estimate
    must be both ``≥ margin`` and significant, i.e. ``≥ max(margin, z₁₋α/(2m) · se)``. At ``true_delta = margin``
    this is at most one half: the rule confirms an effect of exactly the margin as often as a coin flip."""
    check_alpha(alpha)
    if se <= 0:
        return float(true_delta >= max(margin, 0.0))
    threshold = max(margin, float(stats.norm.ppf(1 - alpha / (2 * tests))) * se)
    return float(stats.norm.sf((threshold - true_delta) / se))


def rule_mde(se: float, margin: float, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
             tests: int = 1) -> float:
    """The smallest true Δ that :func:`decide` confirms with probability ``power`` (:func:`rule_power`):
    ``max(margin, z₁₋α/(2m) · se) + z_power · se`` — larger than :func:`minimum_detectable_effect` whenever the
    margin, not significance, is the binding condition."""
    check_alpha(alpha)
    if not 0.0 < power < 1.0 or tests < 1:
        raise ConfigError(f"power must be in (0, 1) and tests ≥ 1, got {power}, {tests}")
    threshold = max(margin, float(stats.norm.ppf(1 - alpha / (2 * tests))) * se)
    return float(threshold + stats.norm.ppf(power) * se)


def decide(delta: float, ci_high: float, p_holm: float, margin: float, alpha: float = DEFAULT_ALPHA,
           seed_variance_estimated: bool = True) -> str:
    """The issue's rule: *confirmed* if ``Δ ≥ +margin`` with Holm-adjusted ``p < alpha``; *refuted at this scale*
    if the interval's upper bound is ``< +margin`` (a report says so only where a probe shows the representation
    changed); otherwise *undecided*. A contrast whose bootstrap saw no seed variance (an arm with one seed) is
    :data:`DESCRIPTIVE`: its interval is too narrow to decide anything."""
    if not seed_variance_estimated:
        return DESCRIPTIVE
    if delta >= margin and p_holm < alpha:
        return CONFIRMED
    if ci_high < margin:
        return REFUTED
    return UNDECIDED
