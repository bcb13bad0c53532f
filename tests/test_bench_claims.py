"""The claims benchmark's decision table (``pretrieve.bench.quality.claims``): each pre-registered rule on
hand-made tier summaries, the permutation p of Spearman's ρ against an enumeration, the A/A veto."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from pretrieve.bench.quality import claims

IN_DOMAIN = "scifact"


def entry(contrast: str, delta: float, half_width: float = 0.01, p_holm: float = 0.5, family: str = "primary",
          n_seeds=(3, 3)):
    a, b = contrast.rsplit("-", 1) if not contrast.endswith("-random") else ("cdmae", "cdmae-random")
    if contrast == "mlm-aa-mlm":
        a, b = "mlm-aa", "mlm"
    return {"contrast": contrast, "family": family, "a": a, "b": b, "delta": delta, "ci_low": delta - half_width,
            "ci_high": delta + half_width, "p_value": p_holm, "p_holm": p_holm, "mde_holm": 0.02, "n_queries": 1000,
            "n_seeds": list(n_seeds), "family_size": 5, "mde_rule": 0.026, "power_at_margin": 0.5,
            "seed_variance_estimated": min(n_seeds) > 1}


class FakeTier(claims.Tier):
    """A tier built from a hand-made summary (every arm of its contrasts finished with the pre-registered number
    of seeds unless said) and hand-made cell records: coverage, per-query scores and checkpoint digests, given as
    dicts keyed by (arm, seed), become the records :meth:`claims.Tier.record` returns, so that the tier's own
    readers (per_query, coverage, checkpoint_digest) read them as they read a records directory."""

    def __init__(self, name, contrasts=(), methods=None, gates=None, seeds=None, settings=None, selection=None,
                 coverage=None, per_query=None, digests=None):
        seeds = seeds or tuple(range(1, claims.PREREGISTERED_SEEDS[name] + 1))
        methods = {**{arm: {} for e in contrasts for arm in (e["a"], e["b"])}, **(methods or {})}
        summary = {"in_domain": IN_DOMAIN, "contrasts": {"nDCG@10": {IN_DOMAIN: list(contrasts)}},
                   "methods": {arm: {"status": "done", "seeds": list(m.get("seeds", claims.arm_seeds(arm, seeds))),
                                     "scores": {"nDCG@10": {IN_DOMAIN: {
                                         "per_seed": {str(s): v for s, v in m.get("ndcg", {}).items()},
                                         "mean": float(np.mean(list(m["ndcg"].values()))) if m.get("ndcg") else None}}},
                                     "pretrain": {"samples_per_s": m.get("speed")}} for arm, m in methods.items()},
                   "settings": {"base": "splade-tiny", "seeds": list(seeds), "finetune": {"lr": 1e-4},
                                "contrasts": [], **(settings or {})},
                   "selection": selection, "gates": gates}
        super().__init__(name, Path(f"/nonexistent/{name}"), summary)
        self._records = {}
        for (arm, seed), values in (coverage or {}).items():
            self._cell(arm, seed)["coverage"] = {"variants": {claims.COVERAGE_VARIANT: {
                "per_text": {claims.COVERAGE_K: [float(v) for v in values]}}}}
        for (arm, seed), scores in (per_query or {}).items():
            by_fold = self._cell(arm, seed)["scores"].setdefault(IN_DOMAIN, {})
            for (fold, qid), value in scores.items():
                by_fold.setdefault(fold, {}).setdefault("nDCG@10", {})[qid] = value
        for (arm, seed), value in (digests or {}).items():
            self._cell(arm, seed)["checkpoint_sha256"] = value

    def _cell(self, arm, seed):
        return self._records.setdefault((arm, seed), {"arm": arm, "seed": seed, "status": "done", "scores": {},
                                                      "coverage": None, "checkpoint_sha256": None})

    def record(self, arm, seed):
        """A finished arm × seed's hand-made record (as a records directory would hold it), None if it has none."""
        return self._records.get((arm, seed)) if seed in self.seeds(arm) else None


def moved(bow=True, retromae=True, saturated=True):
    return {"objectives_move_representation": {"arms": {"bow": {"moved": bow}, "retromae": {"moved": retromae}}},
            "pre_saturation": {"passed": saturated}}


def verdict(table, key):
    return next(c for c in table["claims"] if c["id"] == key)["verdict"]


AA_OK = entry("mlm-aa-mlm", 0.001, 0.02, p_holm=0.9, family="aa")
STRONG = {"accuracy": 0.41}


def scratch_tier(contrasts, none=0.25):
    """The from-scratch base's tier; its `none` arm fine-tuned to ``none`` nDCG@10 (the gate needs > 0.10)."""
    return FakeTier("scratch", contrasts, methods={"none": {"ndcg": {1: none, 2: none}}})


def test_h1_is_confirmed_only_with_the_same_sign_on_the_from_scratch_base():
    tier1 = FakeTier("tier1", [entry("bow-mlm", 0.03, p_holm=0.01), entry("retromae-mlm", 0.0), AA_OK],
                     gates=moved())
    assert verdict(claims.decide_claims({"tier1": tier1}), "h1") == "pending"
    for delta, p, expected in ((0.01, 0.03, "confirmed"), (0.01, 0.2, "undecided"), (-0.01, 0.01, "undecided")):
        tiers = {"tier1": tier1, "scratch": scratch_tier([entry("bow-mlm", delta, p_holm=p)])}
        assert verdict(claims.decide_claims(tiers, scratch_mlm=STRONG), "h1") == expected, (delta, p)
        assert verdict(claims.decide_claims(tiers), "h1") == "pending"      # the base's gate is not known yet
    # a gain just under the margin is not a confirmation
    tier1 = FakeTier("tier1", [entry("bow-mlm", 0.0199, p_holm=0.001), entry("retromae-mlm", 0.0), AA_OK],
                     gates=moved())
    scratch = scratch_tier([entry("bow-mlm", 0.05, p_holm=0.001)])
    table = claims.decide_claims({"tier1": tier1, "scratch": scratch}, scratch_mlm=STRONG)
    assert verdict(table, "h1") == "undecided"


def test_a_from_scratch_base_that_fails_its_gate_leaves_the_row_to_splade_tiny_alone_and_says_so():
    tier1 = FakeTier("tier1", [entry("bow-mlm", 0.03, p_holm=0.01), entry("retromae-mlm", 0.0), AA_OK],
                     gates=moved())
    no_replication = scratch_tier([entry("bow-mlm", -0.01, p_holm=0.5)])
    for gate, none in (({"accuracy": 0.18}, 0.25), (STRONG, 0.08)):
        tiers = {"tier1": tier1, "scratch": scratch_tier([entry("bow-mlm", -0.01, p_holm=0.5)], none=none)}
        table = claims.decide_claims(tiers, scratch_mlm=gate)
        row = next(c for c in table["claims"] if c["id"] == "h1")
        assert row["verdict"] == "confirmed on SPLADE-tiny only (the from-scratch base is too weak to inform)"
        shown = claims.claims_markdown(table)
        assert "from-scratch base gate: held-out MLM accuracy" in shown and ": failed" in shown
    tiers = {"tier1": tier1, "scratch": no_replication}
    assert verdict(claims.decide_claims(tiers, scratch_mlm=STRONG), "h1") == "undecided"
    # a base below the gate's accuracy runs no cell (claims.sh tier2b stops there): its report alone decides that
    # SPLADE-tiny decides; before, the row waited for Tier 2b's cells forever
    table = claims.decide_claims({"tier1": tier1}, scratch_mlm={"accuracy": 0.18})
    assert verdict(table, "h1") == "confirmed on SPLADE-tiny only (the from-scratch base is too weak to inform)"
    assert claims.scratch_gate(None, {"accuracy": 0.18})["passed"] is False
    assert claims.scratch_gate(None, STRONG)["passed"] is None                # `none` not fine-tuned yet
    assert verdict(claims.decide_claims({"tier1": tier1}, scratch_mlm=STRONG), "h1") == "pending"


def test_h1_is_refuted_only_where_every_arm_changed_the_representation_and_the_probe_saturated():
    nulls = [entry("bow-mlm", 0.0), entry("retromae-mlm", -0.005), entry("bow-none", 0.0),
             entry("retromae-none", 0.0), AA_OK]
    scratch = scratch_tier([entry("bow-mlm", 0.001), entry("bow-none", 0.0)])
    tiers = {"tier1": FakeTier("tier1", nulls, gates=moved()), "scratch": scratch}

    def decided(key):
        return verdict(claims.decide_claims(tiers, scratch_mlm=STRONG), key)

    assert decided("h1") == decided("h0") == "refuted-at-this-scale"
    tiers["tier1"] = FakeTier("tier1", nulls, gates=moved(retromae=False))
    assert decided("h1") == "undecided"
    tiers["tier1"] = FakeTier("tier1", nulls, gates=moved(saturated=False))
    assert decided("h1") == "pending"                                     # the 6,000-step tier must run first
    tiers["budget"] = FakeTier("budget", [entry("bow-mlm", 0.004)])
    assert decided("h1") == "refuted-at-this-scale"
    tiers["budget"] = FakeTier("budget", [entry("bow-mlm", 0.03, p_holm=0.01)])   # the long budget gains
    assert decided("h1") == "undecided"
    # an upper bound at the margin is not below it
    tiers = {"tier1": FakeTier("tier1", [entry("bow-mlm", 0.01, 0.01), entry("retromae-mlm", 0.0), AA_OK],
                               gates=moved()), "scratch": scratch}
    assert decided("h1") == "undecided"


def test_a_null_is_not_called_while_the_probe_rises_unless_the_long_run_has_results_with_seed_variance():
    """The long-run bug (claims-audit.md §3, bug 1): with the pre-saturation gate failed, a `budget` tier whose
    `bow`/`mlm` have no results, or have one seed each, leaves H1 and H0 pending — never refuted-at-this-scale
    (before, any `--budget` directory let the null be called)."""
    nulls = [entry("bow-mlm", 0.0), entry("retromae-mlm", -0.005), entry("bow-none", 0.0),
             entry("retromae-none", 0.0), AA_OK]
    scratch = scratch_tier([entry("bow-mlm", 0.001), entry("bow-none", 0.0)])
    tier1 = FakeTier("tier1", nulls, gates=moved(saturated=False))
    unfinished = FakeTier("budget", [], methods={"mlm": {"seeds": []}, "bow": {"seeds": []}})
    one_seed = FakeTier("budget", [entry("bow-mlm", 0.004, n_seeds=(1, 1))], seeds=(1,))
    for budget in (unfinished, one_seed):
        tiers = {"tier1": tier1, "scratch": scratch, "budget": budget}
        for baseline in ("mlm", "none"):
            row = claims.beats(tiers, baseline, 0.02, 0.05, STRONG)
            assert row["verdict"] == "pending", (budget.summary["contrasts"], baseline, row)
            assert "6,000-step tier has not run" in row["notes"][-1]
        table = claims.decide_claims(tiers, scratch_mlm=STRONG, seeds=None)     # not merely too few seeds
        assert verdict(table, "h1") == verdict(table, "h0") == "pending"
    row = claims.beats({"tier1": tier1, "scratch": scratch, "budget": one_seed}, "mlm", 0.02, 0.05, STRONG)
    assert "one seed per arm" in row["notes"][0]
    assert any(e.get("label") == "6,000 steps: bow − mlm" for e in row["evidence"])   # shown, not used
    assert "*one seed: descriptive*" in claims.claims_markdown(
        claims.decide_claims({"tier1": tier1, "scratch": scratch, "budget": one_seed}, scratch_mlm=STRONG))
    # with 3 seeds per arm the long run is evidence: the null is called (or not) on it
    three = FakeTier("budget", [entry("bow-mlm", 0.004)])
    assert three.seeds("bow") == [1, 2, 3] and claims.PREREGISTERED_SEEDS["budget"] == 3
    for baseline in ("mlm", "none"):
        assert claims.beats({"tier1": tier1, "scratch": scratch, "budget": three}, baseline, 0.02, 0.05,
                            STRONG)["verdict"] == "refuted-at-this-scale"


def test_a_one_seed_budget_row_is_descriptive_never_decided():
    from pretrieve.evaluation.significance import DESCRIPTIVE

    gain = FakeTier("budget", [entry("bow-mlm", 0.03, 0.005, p_holm=0.001, n_seeds=(1, 1))], seeds=(1,))
    null = FakeTier("budget", [entry("bow-mlm", 0.0, 0.005, p_holm=0.9, n_seeds=(1, 1))], seeds=(1,))
    for budget in (gain, null):
        assert verdict(claims.decide_claims({"budget": budget}, seeds=None), "budget") == DESCRIPTIVE
    row = next(c for c in claims.decide_claims({"budget": gain})["claims"] if c["id"] == "budget")
    assert row["verdict"] == "pending" and "1 of 3 seeds" in row["notes"][-1]   # Tier 2a now runs 3 seeds


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
        coverage = {("mlm", s): base + noise() for s in (1, 2, 3)}
        coverage.update({("bow", s): base + bow_shift + noise() for s in (1, 2, 3)})
        coverage.update({("retromae", s): base + retromae_shift + noise() for s in (1, 2, 3)})
        return FakeTier("tier1", [AA_OK], methods=methods, coverage=coverage)

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


def test_coverage_tracks_quality_over_first_seed_checkpoints_of_three_tiers_none_once():
    points = {"tier1": {"none": (0.10, 0.30), "mlm": (0.12, 0.32), "bow": (0.20, 0.36), "mlm-aa": (0.13, 0.33)},
              "budget": {"mlm": (0.14, 0.34), "bow": (0.25, 0.40)},
              "cdmae": {"none": (0.10, 0.30), "cdmae": (0.15, 0.35), "cdmae-random": (0.11, 0.31)}}

    def tier(name, first_seed_done=True):
        arms = points[name]
        seed = lambda arm: claims.arm_seeds(arm, (1,))[0]   # noqa: E731
        methods = {a: {"ndcg": {seed(a): q}, **({} if first_seed_done else {"seeds": [seed(a) + 1]})}
                   for a, (_, q) in arms.items()}
        return FakeTier(name, [AA_OK] if name == "tier1" else [], methods=methods,
                        coverage={(a, seed(a)): [c] * 4 for a, (c, _) in arms.items()})

    table = claims.decide_claims({name: tier(name) for name in points})
    claim = next(c for c in table["claims"] if c["id"] == "tracks")
    used = [(q["tier"], q["arm"]) for q in claim["evidence"][0]["points"]]
    assert sorted(used) == sorted([("tier1", a) for a in points["tier1"]] + [
        ("budget", "mlm"), ("budget", "bow"), ("cdmae", "cdmae"), ("cdmae", "cdmae-random")])
    assert claim["verdict"] == "confirmed" and claim["evidence"][0]["rho"] == pytest.approx(1.0)
    assert claim["evidence"][0]["p_value"] == pytest.approx(2 / math.factorial(8))
    # every first-seed checkpoint of the three tiers, or the row is pending (its verdict so far kept)
    partial = claims.decide_claims({"tier1": tier("tier1"), "budget": tier("budget")})
    row = next(c for c in partial["claims"] if c["id"] == "tracks")
    assert row["verdict"] == "pending" and row["interim"] == "confirmed" and "Tier 2d" in row["notes"][-1]
    late = claims.decide_claims({"tier1": tier("tier1"), "budget": tier("budget", False), "cdmae": tier("cdmae")})
    row = next(c for c in late["claims"] if c["id"] == "tracks")
    assert row["verdict"] == "pending" and "Tier 2a (6,000 steps) bow" in row["notes"][-1]


def test_a_row_with_fewer_seeds_than_pre_registered_is_pending_with_its_verdict_so_far():
    tier1 = FakeTier("tier1", [entry("bow-retromae", -0.04, 0.01, family="anchor"), AA_OK], seeds=(1,),
                     methods={"bow": {"speed": 95.0}, "mlm": {"speed": 100.0}})
    table = claims.decide_claims({"tier1": tier1})
    row = next(c for c in table["claims"] if c["id"] == "cost")
    assert row["verdict"] == "pending" and row["interim"] == "refuted-at-this-scale"
    assert "bow: 1 of 3 seeds" in row["notes"][-1] and verdict(table, "aa") == "pending"
    assert "**pending** (so far: refuted-at-this-scale)" in claims.claims_markdown(table)
    decided = claims.decide_claims({"tier1": tier1}, seeds=None)
    assert verdict(decided, "cost") == "refuted-at-this-scale" and verdict(decided, "aa") == "passed"


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
                               entry("tsdae-mlm", 0.0, family="anchor"), entry("bow-mlm", 0.0),
                               entry("retromae-mlm", 0.005)], methods=methods)
    table = claims.decide_claims({"tier1": worse})
    assert verdict(table, "cost") == "refuted-at-this-scale"
    assert verdict(table, "tsdae") == "this regime cannot show the effect"


def test_the_tsdae_null_needs_h1s_upper_bounds_below_the_margin_too():
    """Amendment 9 (d)(5): "TSDAE null too" — TSDAE's upper bound below the margin and H1 merely not confirmed
    is not enough; every compared arm's upper bound must be below it as well (claims-audit.md §3)."""
    tsdae_null = entry("tsdae-mlm", 0.0, family="anchor")
    for h1, expected in (([entry("bow-mlm", 0.0), entry("retromae-mlm", 0.015)], "undecided"),   # retromae: ≤ +0.025
                         ([entry("bow-mlm", 0.0)], "undecided"),                                # retromae unknown
                         ([entry("bow-mlm", 0.0), entry("retromae-mlm", 0.0)], "this regime cannot show the effect")):
        table = claims.decide_claims({"tier1": FakeTier("tier1", [tsdae_null, AA_OK, *h1])})
        assert verdict(table, "tsdae") == expected, h1


def test_dupmae_compares_the_same_checkpoints_under_both_representations_only_if_nothing_else_differs():
    rng = np.random.default_rng(1)
    keys = [("train:test", f"q{i}") for i in range(150)] + [("test:train", f"t{i}") for i in range(150)]
    cls = {("retromae", s): {k: float(v) for k, v in zip(keys, rng.uniform(0, 1, len(keys)))} for s in (1, 2)}
    ot = {("retromae", s): {k: v + 0.03 for k, v in cls[("retromae", s)].items()} for s in (1, 2)}
    digests = {("retromae", 1): "a", ("retromae", 2): "b"}
    tier1 = FakeTier("tier1", [AA_OK], methods={"retromae": {}}, seeds=(1, 2, 3), per_query=cls, digests=digests,
                     selection={"chosen": {"lr": 3e-4, "epochs": 5, "max_steps": 0}})   # as the grid records it
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
           "[+0.0000, +0.0200], Holm p 0.5 (of 5), MDE 0.020, rule's MDE 0.026 (power at the margin 0.50)" in text


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


def test_the_scratch_gate_file_is_checked(tmp_path):
    from pretrieve.errors import InputError

    good = tmp_path / "mlm_accuracy.json"
    good.write_text('{"accuracy": 0.31, "masked_tokens": 900}')
    assert claims.read_mlm_gate(good)["accuracy"] == 0.31
    bad = tmp_path / "bad.json"
    bad.write_text('{"acc": 0.3}')
    with pytest.raises(InputError, match="no 'accuracy'"):
        claims.read_mlm_gate(bad)
    broken = tmp_path / "broken.json"
    broken.write_text('{"accuracy": \n')
    with pytest.raises(InputError, match="not JSON") as info:
        claims.read_mlm_gate(broken)
    assert info.value.line == 2


def _fold_scores(rng, shift=0.0):
    keys = [("train:test", f"q{i}") for i in range(60)] + [("test:train", f"t{i}") for i in range(40)]
    return {k: float(np.clip(v + (shift if k[0] == "test:train" else 0.0), 0, 1))
            for k, v in zip(keys, rng.uniform(0, 1, len(keys)))}


def test_sensitivity_gives_each_fold_alone_and_retromae_against_every_mlm_run():
    """claims-audit-3 F1/F2: beside the pooled decision, each contrast within one fold (its mean difference over
    that fold's queries only), and retromae against mlm's and mlm-aa's runs stacked as one arm; descriptive — the
    decision rows do not change."""
    rng = np.random.default_rng(7)
    per_query = {(arm, s): _fold_scores(rng, 0.05 if arm == "retromae" else 0.0)
                 for arm in ("none", "mlm", "retromae") for s in (1, 2, 3)}
    per_query.update({("mlm-aa", s): _fold_scores(rng) for s in (1001, 1002, 1003)})
    tier1 = FakeTier("tier1", [entry("retromae-mlm", 0.02), AA_OK], methods={"none": {}}, per_query=per_query)
    lines = claims.sensitivity({"tier1": tier1})
    by_label = {e["label"]: e for e in lines}
    for fold in ("train:test", "test:train"):
        e = by_label[f"Tier 1 (SPLADE-tiny): retromae − mlm, fold {fold} only"]
        hand = np.mean([np.mean([per_query[("retromae", s)][k] for s in (1, 2, 3)])
                        - np.mean([per_query[("mlm", s)][k] for s in (1, 2, 3)])
                        for k in per_query[("mlm", 1)] if k[0] == fold])
        assert e["delta"] == pytest.approx(hand) and e["fold"] == fold and e["ci_low"] < e["delta"] < e["ci_high"]
        assert e["n_queries"] == (60 if fold == "train:test" else 40)
    six = by_label["Tier 1 (SPLADE-tiny): retromae − all 6 MLM runs (mlm and mlm-aa), pooled"]
    mlm_runs = [per_query[(arm, s)] for arm, seeds in (("mlm", (1, 2, 3)), ("mlm-aa", (1001, 1002, 1003)))
                for s in seeds]
    hand = np.mean([np.mean([per_query[("retromae", s)][k] for s in (1, 2, 3)]) - np.mean([r[k] for r in mlm_runs])
                    for k in per_query[("mlm", 1)]])
    assert six["delta"] == pytest.approx(hand) and six["n_seeds"] == [3, 6]
    table = claims.decide_claims({"tier1": tier1})
    assert table["sensitivity"] == lines
    shown = claims.claims_markdown(table)
    assert "## Sensitivity (descriptive: no rule reads these lines)" in shown and "fold train:test only" in shown
    # a tier without per-query records (only its summary) has no sensitivity lines
    assert claims.sensitivity({"tier1": FakeTier("tier1", [entry("retromae-mlm", 0.02), AA_OK])}) == []


def test_the_json_is_the_same_bytes_whatever_the_last_float_digit(tmp_path):
    """claims-audit-3 F5: the BLAS's thread count moves the 16th digit of a bootstrap; the JSON rounds every float
    to 12 significant digits, so a rebuild anywhere gives the same bytes."""
    table = claims.decide_claims({"tier1": FakeTier("tier1", [entry("bow-mlm", 0.01), AA_OK], gates=moved())})
    nudged = claims.decide_claims({"tier1": FakeTier("tier1", [entry("bow-mlm", 0.01 + 3e-17), AA_OK],
                                                     gates=moved())})
    a = claims.write_claims(table, tmp_path / "a")[1].read_bytes()
    b = claims.write_claims(nudged, tmp_path / "b")[1].read_bytes()
    assert a == b and b"0.01," in a
    assert claims._rounded({"x": [0.1 + 0.2, float("nan"), 3, "s"]})["x"][0] == 0.3


def test_the_cost_row_reads_one_machines_bench_pretrain_report(tmp_path):
    """claims-audit-3 F7: the cost ratio comes from one `bench pretrain` run with both arms (named in the row),
    not from trainer logs averaged across machines; a file that is not such a report is one located error."""
    import json

    report = {"environment": {"processor": "Test CPU", "cpu_count": 2, "date": "2026-12-07"},
              "results": [{"shape": "splade-tiny (L2-H128)", "settings": {"batch_size": 32, "max_len": 144,
                                                                         "device_name": "cpu (Test CPU)"},
                           "rows": {"mlm": {"samples_per_s": 100.0}, "bow": {"samples_per_s": 95.0}},
                           "ratios": {"throughput_vs_mlm": {"mlm": 1.0, "bow": 0.95}}}]}
    path = tmp_path / "bow-mlm.json"
    path.write_text(json.dumps(report))
    cost = claims.read_cost_report(path)
    assert cost["ratio"] == 0.95 and "Test CPU" in cost["machine"]
    close = FakeTier("tier1", [entry("bow-retromae", -0.005, 0.01), AA_OK],
                     methods={"bow": {"speed": 1.0}, "mlm": {"speed": 2.0}})
    assert verdict(claims.decide_claims({"tier1": close}), "cost") == "undecided"          # logs: 0.5
    table = claims.decide_claims({"tier1": close}, cost=cost)
    row = next(c for c in table["claims"] if c["id"] == "cost")
    assert row["verdict"] == "confirmed" and not row["notes"]
    assert "one run on Test CPU, 2 cores" in claims.claims_markdown(table)
    path.write_text(json.dumps({"environment": {}, "results": [{"rows": {}}]}))
    with pytest.raises(claims.InputError, match="bench pretrain"):
        claims.read_cost_report(path)
