"""The claims benchmark's decision table (``pretrieve.bench.quality.claims``): each pre-registered rule on
hand-made tier summaries, the permutation p of Spearman's ρ against an enumeration, the A/A veto."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from pretrieve.bench.quality import claims

IN_DOMAIN = "scifact"


def entry(contrast: str, delta: float, half_width: float = 0.01, p_holm: float = 0.5, family: str = "primary"):
    a, b = contrast.rsplit("-", 1) if not contrast.endswith("-random") else ("cdmae", "cdmae-random")
    if contrast == "mlm-aa-mlm":
        a, b = "mlm-aa", "mlm"
    return {"contrast": contrast, "family": family, "a": a, "b": b, "delta": delta, "ci_low": delta - half_width,
            "ci_high": delta + half_width, "p_value": p_holm, "p_holm": p_holm, "mde_holm": 0.02, "n_queries": 1000,
            "n_seeds": [3, 3]}


class FakeTier(claims.Tier):
    """A tier built from a hand-made summary; coverage, per-query scores and checkpoint digests given as dicts."""

    def __init__(self, name, contrasts=(), methods=None, gates=None, seeds=(1,), settings=None, selection=None,
                 coverage=None, per_query=None, digests=None):
        methods = methods or {}
        summary = {"in_domain": IN_DOMAIN, "contrasts": {"nDCG@10": {IN_DOMAIN: list(contrasts)}},
                   "methods": {arm: {"status": "done", "seeds": list(m.get("seeds", claims.arm_seeds(arm, seeds))),
                                     "scores": {"nDCG@10": {IN_DOMAIN: {"per_seed": {
                                         str(s): v for s, v in m.get("ndcg", {}).items()}}}},
                                     "pretrain": {"samples_per_s": m.get("speed")}} for arm, m in methods.items()},
                   "settings": {"base": "splade-tiny", "seeds": list(seeds), "finetune": {"lr": 1e-4},
                                "contrasts": [], **(settings or {})},
                   "selection": selection, "gates": gates}
        super().__init__(name, Path(f"/nonexistent/{name}"), summary)
        self._coverage, self._per_query, self._digests = coverage or {}, per_query or {}, digests or {}

    def coverage(self, arm, seed):
        value = self._coverage.get((arm, seed))
        return None if value is None else np.asarray(value, dtype=float)

    def per_query(self, arm, seed):
        return self._per_query[(arm, seed)]

    def checkpoint_digest(self, arm, seed):
        return self._digests.get((arm, seed))


def moved(bow=True, retromae=True, saturated=True):
    return {"objectives_move_representation": {"arms": {"bow": {"moved": bow}, "retromae": {"moved": retromae}}},
            "pre_saturation": {"passed": saturated}}


def verdict(table, key):
    return next(c for c in table["claims"] if c["id"] == key)["verdict"]


AA_OK = entry("mlm-aa-mlm", 0.001, 0.02, p_holm=0.9, family="aa")


def test_h1_is_confirmed_only_with_the_same_sign_on_the_from_scratch_base():
    tier1 = FakeTier("tier1", [entry("bow-mlm", 0.03, p_holm=0.01), entry("retromae-mlm", 0.0), AA_OK],
                     gates=moved())
    assert verdict(claims.decide_claims({"tier1": tier1}), "h1") == "pending"
    for delta, p, expected in ((0.01, 0.03, "confirmed"), (0.01, 0.2, "undecided"), (-0.01, 0.01, "undecided")):
        scratch = FakeTier("scratch", [entry("bow-mlm", delta, p_holm=p)])
        assert verdict(claims.decide_claims({"tier1": tier1, "scratch": scratch}), "h1") == expected, (delta, p)
    # a gain just under the margin is not a confirmation
    tier1 = FakeTier("tier1", [entry("bow-mlm", 0.0199, p_holm=0.001), entry("retromae-mlm", 0.0), AA_OK],
                     gates=moved())
    scratch = FakeTier("scratch", [entry("bow-mlm", 0.05, p_holm=0.001)])
    assert verdict(claims.decide_claims({"tier1": tier1, "scratch": scratch}), "h1") == "undecided"


def test_h1_is_refuted_only_where_every_arm_changed_the_representation_and_the_probe_saturated():
    nulls = [entry("bow-mlm", 0.0), entry("retromae-mlm", -0.005), entry("bow-none", 0.0),
             entry("retromae-none", 0.0), AA_OK]
    scratch = FakeTier("scratch", [entry("bow-mlm", 0.001), entry("bow-none", 0.0)])
    tiers = {"tier1": FakeTier("tier1", nulls, gates=moved()), "scratch": scratch}
    assert verdict(claims.decide_claims(tiers), "h1") == "refuted-at-this-scale"
    assert verdict(claims.decide_claims(tiers), "h0") == "refuted-at-this-scale"
    tiers["tier1"] = FakeTier("tier1", nulls, gates=moved(retromae=False))
    assert verdict(claims.decide_claims(tiers), "h1") == "undecided"
    tiers["tier1"] = FakeTier("tier1", nulls, gates=moved(saturated=False))
    assert verdict(claims.decide_claims(tiers), "h1") == "pending"          # the 6,000-step tier must run first
    tiers["budget"] = FakeTier("budget", [entry("bow-mlm", 0.004)])
    assert verdict(claims.decide_claims(tiers), "h1") == "refuted-at-this-scale"
    tiers["budget"] = FakeTier("budget", [entry("bow-mlm", 0.03, p_holm=0.01)])   # the long budget gains
    assert verdict(claims.decide_claims(tiers), "h1") == "undecided"
    # an upper bound at the margin is not below it
    tiers = {"tier1": FakeTier("tier1", [entry("bow-mlm", 0.01, 0.01), entry("retromae-mlm", 0.0), AA_OK],
                               gates=moved()), "scratch": scratch}
    assert verdict(claims.decide_claims(tiers), "h1") == "undecided"


def test_a_significant_aa_control_withholds_every_other_row():
    tier1 = FakeTier("tier1", [entry("bow-mlm", 0.05, p_holm=0.001), entry("mlm-aa-mlm", 0.03, p_holm=0.01,
                                                                          family="aa")], gates=moved())
    table = claims.decide_claims({"tier1": tier1})
    assert table["withheld"] and [c["id"] for c in table["claims"]] == ["aa"] and verdict(table, "aa") == "failed"
    assert "no other row is reported" in claims.claims_markdown(table)
    passed = claims.decide_claims({"tier1": FakeTier("tier1", [entry("bow-mlm", 0.05), AA_OK], gates=moved())})
    assert not passed["withheld"] and verdict(passed, "aa") == "passed"
    assert verdict(passed, "pmi") == verdict(passed, "minilm") == verdict(passed, "dupmae") == "pending"


def test_coverage_rises_by_the_margin_with_an_interval_over_passages():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.3, size=200)
    noise = lambda: rng.normal(0, 0.01, size=200)   # noqa: E731
    methods = {"mlm": {}, "bow": {}, "retromae": {}}

    def tier(bow_shift, retromae_shift):
        coverage = {("mlm", s): base + noise() for s in (1, 2)}
        coverage.update({("bow", s): base + bow_shift + noise() for s in (1, 2)})
        coverage.update({("retromae", s): base + retromae_shift + noise() for s in (1, 2)})
        return FakeTier("tier1", [AA_OK], methods=methods, seeds=(1, 2), coverage=coverage)

    table = claims.decide_claims({"tier1": tier(0.08, 0.06)})
    assert verdict(table, "coverage") == "confirmed"
    rise = next(c for c in table["claims"] if c["id"] == "coverage")["evidence"][0]
    assert rise["delta"] == pytest.approx(0.08, abs=0.005) and rise["ci_low"] > 0 and rise["n_queries"] == 200
    assert verdict(claims.decide_claims({"tier1": tier(0.08, 0.03)}), "coverage") == "undecided"
    assert verdict(claims.decide_claims({"tier1": tier(-0.02, -0.01)}), "coverage") == "refuted-at-this-scale"


def test_spearman_p_is_the_exact_permutation_p():
    x, y = [0.1, 0.4, 0.2, 0.5, 0.3], [0.30, 0.35, 0.31, 0.6, 0.2]
    rho, p = claims.spearman(x, y)
    assert rho == pytest.approx(stats.spearmanr(x, y).statistic)
    every = [stats.spearmanr(x, perm).statistic for perm in itertools.permutations(y)]
    assert p == pytest.approx(np.mean(np.abs(every) >= abs(rho) - 1e-12))


def test_coverage_tracks_quality_over_first_seed_checkpoints_none_once():
    arms = ("none", "mlm", "bow", "retromae", "mlm-aa")
    quality = dict(zip(arms, (0.30, 0.32, 0.36, 0.38, 0.33)))
    coverage = dict(zip(arms, (0.10, 0.12, 0.20, 0.25, 0.13)))

    def tier(name, arms_here, seeds_done=None):
        methods = {a: {"ndcg": {claims.arm_seeds(a, (1,))[0]: quality[a]}} for a in arms_here}
        if seeds_done is not None:
            for a in arms_here:
                methods[a]["seeds"] = seeds_done
        cov = {(a, claims.arm_seeds(a, (1,))[0]): [coverage[a]] * 4 for a in arms_here}
        return FakeTier(name, [AA_OK], methods=methods, coverage=cov)

    table = claims.decide_claims({"tier1": tier("tier1", arms), "cdmae": tier("cdmae", ("none",))})
    claim = next(c for c in table["claims"] if c["id"] == "tracks")
    points = claim["evidence"][0]["points"]
    assert [q["arm"] for q in points] == list(arms) and claim["evidence"][0]["rho"] == pytest.approx(1.0)
    assert claim["verdict"] == "confirmed" and claim["evidence"][0]["p_value"] == pytest.approx(2 / 120)
    # an arm whose first seed did not finish is left out (its second seed is not a stand-in)
    table = claims.decide_claims({"tier1": tier("tier1", ("none", "mlm")), "budget": tier("budget", ("bow",), [2])})
    assert verdict(table, "tracks") == "pending"


def test_bow_cost_and_tsdae_rows():
    methods = {"bow": {"speed": 95.0}, "mlm": {"speed": 100.0}}
    tier1 = FakeTier("tier1", [entry("bow-retromae", -0.005, 0.01, family="anchor"), AA_OK,
                               entry("tsdae-mlm", 0.03, p_holm=0.01, family="anchor"), entry("bow-mlm", 0.0)],
                     methods=methods)
    table = claims.decide_claims({"tier1": tier1})
    assert verdict(table, "cost") == "confirmed"
    assert verdict(table, "tsdae") == "toolkit lags TSDAE: audit the objectives"
    slow = FakeTier("tier1", [entry("bow-retromae", -0.005, 0.01, family="anchor"), AA_OK],
                    methods={"bow": {"speed": 80.0}, "mlm": {"speed": 100.0}})
    assert verdict(claims.decide_claims({"tier1": slow}), "cost") == "undecided"
    worse = FakeTier("tier1", [entry("bow-retromae", -0.04, 0.01, family="anchor"), AA_OK,
                               entry("tsdae-mlm", 0.0, family="anchor"), entry("bow-mlm", 0.0)], methods=methods)
    table = claims.decide_claims({"tier1": worse})
    assert verdict(table, "cost") == "refuted-at-this-scale"
    assert verdict(table, "tsdae") == "this regime cannot show the effect"


def test_dupmae_compares_the_same_checkpoints_under_both_representations_only_if_nothing_else_differs():
    rng = np.random.default_rng(1)
    keys = [("train:test", f"q{i}") for i in range(150)] + [("test:train", f"t{i}") for i in range(150)]
    cls = {("retromae", s): {k: float(v) for k, v in zip(keys, rng.uniform(0, 1, len(keys)))} for s in (1, 2)}
    ot = {("retromae", s): {k: v + 0.03 for k, v in cls[("retromae", s)].items()} for s in (1, 2)}
    digests = {("retromae", 1): "a", ("retromae", 2): "b"}
    tier1 = FakeTier("tier1", [AA_OK], methods={"retromae": {}}, seeds=(1, 2, 3), per_query=cls, digests=digests,
                     selection={"chosen": {"lr": 3e-4, "epochs": 5}})
    tier2c = FakeTier("dupmae", [entry("dupmae-retromae", 0.001, 0.01)], methods={"retromae": {}}, seeds=(1, 2),
                      per_query=ot, digests=digests,
                      settings={"finetune": {"lr": 3e-4, "epochs": 5, "representation": "dupmae"}})
    table = claims.decide_claims({"tier1": tier1, "dupmae": tier2c})
    row = next(c for c in table["claims"] if c["id"] == "dupmae")
    assert row["verdict"] == "confirmed" and row["evidence"][0]["delta"] == pytest.approx(0.03)
    assert row["evidence"][0]["same_checkpoints"] and row["evidence"][0]["seeds"] == [1, 2] and not row["notes"]
    assert verdict(table, "dupmae-ot") == "the gain is the representation"
    other = FakeTier("dupmae", [], methods={"retromae": {}}, seeds=(1, 2), per_query=ot, digests={},
                     settings={"finetune": {"lr": 1e-4, "epochs": 5, "representation": "dupmae"}})
    row = next(c for c in claims.decide_claims({"tier1": tier1, "dupmae": other})["claims"] if c["id"] == "dupmae")
    assert row["verdict"] == "undecided" and "differ in lr" in row["notes"][0]


def test_pmi_budget_and_minilm_rows():
    cdmae = FakeTier("cdmae", [entry("cdmae-cdmae-random", 0.002, 0.01)])
    budget = FakeTier("budget", [entry("bow-mlm", 0.03, 0.005, p_holm=0.001)])
    minilm = FakeTier("minilm", [entry("mlm-none", 0.01, p_holm=0.03), entry("bow-none", 0.02, p_holm=0.01),
                                 entry("tsdae-none", -0.01, p_holm=0.04), entry("bow-mlm", 0.01)])
    table = claims.decide_claims({"tier1": FakeTier("tier1", [AA_OK]), "cdmae": cdmae, "budget": budget,
                                  "minilm": minilm})
    assert verdict(table, "pmi") == "no effect ≥ 0.02"
    assert verdict(table, "budget") == "confirmed"
    assert verdict(table, "minilm") == "the recipe gains bow"
    gain = FakeTier("cdmae", [entry("cdmae-cdmae-random", 0.03, 0.005, p_holm=0.001)])
    assert verdict(claims.decide_claims({"cdmae": gain}), "pmi") == "confirmed"
    assert verdict(claims.decide_claims({"cdmae": gain}), "aa") == "pending"


def test_the_table_is_written_atomically_as_markdown_and_json(tmp_path):
    import json

    table = claims.decide_claims({"tier1": FakeTier("tier1", [entry("bow-mlm", 0.01), AA_OK], gates=moved())})
    paths = claims.write_claims(table, tmp_path / "claims")
    assert [p.name for p in paths] == ["claims.md", "claims.json"]
    assert json.loads(paths[1].read_text())["claims"][0]["id"] == "h1"
    text = paths[0].read_text()
    assert "| H1 retrieval-oriented pre-training beats further MLM | SPLADE-tiny: bow − mlm: +0.0100 " \
           "[+0.0000, +0.0200], Holm p 0.5, MDE 0.020" in text


def test_spearman_with_ties_and_beyond_the_exact_range():
    x, y = [1, 2, 2, 3, 4, 5], [0.1, 0.3, 0.2, 0.2, 0.5, 0.4]
    rho, p = claims.spearman(x, y)
    assert rho == pytest.approx(stats.spearmanr(x, y).statistic)
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=12), rng.normal(size=12)
    rho, p = claims.spearman(x, y)
    assert rho == pytest.approx(stats.spearmanr(x, y).statistic)
    reference = stats.permutation_test((x,), lambda v: stats.spearmanr(v, y).statistic, permutation_type="pairings",
                                       n_resamples=3_000, random_state=0).pvalue
    assert p == pytest.approx(reference, abs=0.03)
