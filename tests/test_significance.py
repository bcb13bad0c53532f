"""The multi-bootstrap, Holm and the decision rule of ``pretrieve bench quality`` on synthetic data with known truth."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from pretrieve.errors import ConfigError
from pretrieve.evaluation.significance import (CONFIRMED, REFUTED, UNDECIDED, decide, holm,
                                               minimum_detectable_effect, multi_bootstrap)

FOLDS = np.array(["train:test"] * 120 + ["test:train"] * 80)


def synthetic(rng, effect: float, seeds=(3, 3), sigma_q: float = 0.15, tau: float = 0.005,
              noise: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Per-query scores (seeds × queries) of two arms: a shared query difficulty, the arm effect, a seed offset
    per (arm, seed) and run noise per (arm, seed, query). The true Δ is ``effect``."""
    difficulty = rng.normal(0.5, sigma_q, size=len(FOLDS))
    arms = []
    for arm, n_seeds in enumerate(seeds):
        offsets = rng.normal(0.0, tau, size=(n_seeds, 1))
        arms.append(difficulty + (effect if arm == 0 else 0.0) + offsets
                    + rng.normal(0.0, noise, size=(n_seeds, len(FOLDS))))
    return arms[0], arms[1]


def test_the_interval_covers_a_known_effect_and_p_is_small_for_a_big_one():
    rng = np.random.default_rng(0)
    a, b = synthetic(rng, effect=0.03)
    result = multi_bootstrap(a, b, FOLDS, n_boot=2000, seed=1)
    assert result.ci_low < 0.03 < result.ci_high
    assert result.delta == pytest.approx(float((a.mean(0) - b.mean(0)).mean()), abs=1e-12)
    assert result.p_value < 0.01 and result.ci_low > 0
    assert result.folds == {"train:test": 120, "test:train": 80} and result.n_seeds == (3, 3)
    assert result.sigma_q == pytest.approx(float((a.mean(0) - b.mean(0)).std(ddof=1)))
    assert result.tau[0] == pytest.approx(float(a.mean(1).std(ddof=1)))
    # the same data and seed give the same numbers; another seed a slightly different interval
    assert multi_bootstrap(a, b, FOLDS, n_boot=2000, seed=1) == result
    assert multi_bootstrap(a, b, FOLDS, n_boot=2000, seed=2).ci_low != result.ci_low


def test_coverage_over_many_synthetic_draws_is_near_95_percent():
    rng = np.random.default_rng(7)
    effect, draws = 0.02, 300
    covered = 0
    for draw in range(draws):
        a, b = synthetic(rng, effect=effect)
        result = multi_bootstrap(a, b, FOLDS, n_boot=600, seed=draw)
        covered += result.ci_low <= effect <= result.ci_high
    assert 0.91 <= covered / draws <= 0.985


def test_p_is_uniform_ish_under_the_null_and_falls_with_the_effect():
    rng = np.random.default_rng(11)
    p_values = np.array([multi_bootstrap(*synthetic(rng, effect=0.0), FOLDS, n_boot=500, seed=i).p_value
                         for i in range(300)])
    assert 0.02 <= np.mean(p_values < 0.05) <= 0.09       # the test's size is near alpha
    assert 0.4 <= np.mean(p_values) <= 0.6                # and the p-values spread over [0, 1]
    assert 0.2 <= np.mean(p_values < 0.25) <= 0.3
    big = multi_bootstrap(*synthetic(rng, effect=0.1), FOLDS, n_boot=1000)
    assert big.p_value == pytest.approx(2 / 1001)         # nothing on the far side of 0: the smallest p


def test_an_aa_setup_is_not_significant():
    """The same arm twice (same query difficulties and effect, other seeds): no difference is found."""
    rng = np.random.default_rng(3)
    difficulty = rng.normal(0.5, 0.15, size=len(FOLDS))
    runs = difficulty + rng.normal(0.0, 0.005, size=(6, 1)) + rng.normal(0.0, 0.05, size=(6, len(FOLDS)))
    result = multi_bootstrap(runs[:3], runs[3:], FOLDS, n_boot=2000)
    assert result.p_value > 0.05 and result.ci_low < 0 < result.ci_high
    identical = multi_bootstrap(runs[:3], runs[:3], FOLDS, n_boot=200)
    assert identical.delta == 0 and identical.p_value == 1.0


def test_folds_are_resampled_within_themselves():
    """A fold whose difference is constant keeps contributing exactly its share: with two folds of constant but
    different differences, every replicate's Δ equals the observed Δ (an unstratified bootstrap would vary)."""
    a = np.where(FOLDS == "train:test", 1.0, 0.0)[None, :]
    b = np.zeros((1, len(FOLDS)))
    result = multi_bootstrap(a, b, FOLDS, n_boot=300)
    assert result.delta == pytest.approx(0.6) and result.se == pytest.approx(0.0, abs=1e-12)
    assert result.ci_low == pytest.approx(0.6) and result.ci_high == pytest.approx(0.6)
    assert multi_bootstrap(a, b, None, n_boot=300).se > 0.01


def test_seeds_are_resampled_per_arm():
    """Queries that agree exactly but seeds that differ: the interval comes from the seeds alone."""
    a = np.array([[0.4] * 50, [0.6] * 50])
    b = np.full((1, 50), 0.5)
    result = multi_bootstrap(a, b, n_boot=2000)
    assert result.delta == pytest.approx(0.0) and result.ci_low == pytest.approx(-0.1)
    assert result.ci_high == pytest.approx(0.1) and result.tau == (pytest.approx(0.1414, abs=1e-4), 0.0)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same queries"):
        multi_bootstrap(np.zeros((2, 5)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="one label per query"):
        multi_bootstrap(np.zeros((2, 5)), np.zeros((2, 5)), folds=["x"])
    with pytest.raises(ConfigError, match="at least 100"):
        multi_bootstrap(np.zeros((2, 5)), np.zeros((2, 5)), n_boot=10)


def test_holm_equals_statsmodels_on_random_p_values():
    rng = np.random.default_rng(5)
    for size in (1, 2, 5, 11, 40):
        for _ in range(4):   # (statsmodels takes ~0.1 s a call)
            p = rng.uniform(0, 1, size=size) ** 3
            p[rng.integers(0, size)] = p[0]                     # ties
            expected = multipletests(p, method="holm")[1]
            np.testing.assert_allclose(holm(p), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        holm([0.5, 1.5])


def test_mde_is_the_normal_power_formula():
    assert minimum_detectable_effect(0.0059) == pytest.approx(0.0165, abs=2e-4)    # the design note's .017
    assert minimum_detectable_effect(0.0059, tests=5) > minimum_detectable_effect(0.0059)
    # by simulation: a true effect of one MDE is found about 80 % of the time
    rng = np.random.default_rng(2)
    se = 0.01
    estimates = rng.normal(minimum_detectable_effect(se), se, size=20000)
    assert np.mean(np.abs(estimates / se) > 1.959964) == pytest.approx(0.8, abs=0.01)


def test_the_decision_rule():
    assert decide(0.03, 0.05, 0.01, margin=0.02) == CONFIRMED
    assert decide(0.03, 0.05, 0.2, margin=0.02) == UNDECIDED        # big but not significant after Holm
    assert decide(0.015, 0.03, 0.001, margin=0.02) == UNDECIDED     # significant but below the margin
    assert decide(0.0, 0.019, 0.9, margin=0.02) == REFUTED
    assert decide(-0.05, -0.01, 0.001, margin=0.02) == REFUTED
