"""The gates of issue #20, computed from the probes and coverage in each arm's first-seed record.

* **objectives move the representation** — for ``bow`` and ``retromae`` (those compared), against ``mlm``:
  the [CLS] probe (nDCG@10 of retrieval without fine-tuning at the last probed step, every judged query of every
  split of the evaluation collections, dot and cosine) and the stopword-excluded coverage@10 of the final
  checkpoint (per passage of the coverage sample). Each is a paired bootstrap over queries (strata: collection and
  split) or passages (:func:`pretrieve.evaluation.significance.multi_bootstrap` with one seed per arm); an arm
  *moved* a measure when ``Δ ≥ +0.02`` and the 95 % interval lies above 0. The gate passes when some arm moved
  the probe (either similarity) or the coverage; otherwise the objectives should be audited against the authors'
  code before more seeds are spent.
* **pre-saturation** — per arm, whether the probe (nDCG@10, pooled) rose by more than 0.02 between the last two
  probed steps: if so the budget is still climbing, and a null result must not be called before a longer budget.

Every gate records its inputs (the records, steps, deltas, intervals) beside its verdict. A
contrast ``a − mlm`` takes ``representation_changed`` from arm ``a``'s verdict (used by the report: "refuted at
this scale" only where the representation changed).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from pretrieve.evaluation.significance import multi_bootstrap

REFERENCE = "mlm"
GATED_ARMS = ("bow", "retromae")
MOVE = 0.02
SATURATION = 0.02
PROBE_MEASURE = "nDCG@10"
COVERAGE_VARIANT, COVERAGE_K = "no-stopwords", "10"
GATE_BOOTSTRAP = 2000


def _probe_vector(probe: dict[str, Any], similarity: str) -> dict[tuple[str, str], float]:
    return {(part, qid): value for part, result in probe["retrieval"][similarity].items()
            for qid, value in result["per_query"][PROBE_MEASURE].items()}


def _moved(a: dict, b: dict, strata: bool) -> dict[str, Any]:
    keys = sorted(set(a) | set(b), key=str)
    x = np.array([[a.get(k, 0.0) for k in keys]])
    y = np.array([[b.get(k, 0.0) for k in keys]])
    result = multi_bootstrap(x, y, [k[0] for k in keys] if strata else None, n_boot=GATE_BOOTSTRAP)
    return {"delta": result.delta, "ci_low": result.ci_low, "ci_high": result.ci_high, "n": result.n_queries,
            "moved": bool(result.delta >= MOVE and result.ci_low > 0)}


def compute_gates(first_seed: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """The gates' verdicts and inputs (module docstring) from each arm's first-seed cell record (``None``: not
    finished); arms without probes are left out."""
    probes: dict[str, dict[int, tuple[str, dict]]] = {}
    coverage: dict[str, dict | None] = {}
    for arm, record in first_seed.items():
        if not record:
            continue
        where = f"{arm}/seed{record.get('seed')}"
        coverage[arm] = record.get("coverage")
        for step, probe in (record.get("probes") or {}).items():
            probes.setdefault(arm, {})[int(step)] = (f"{where} probe step {step}", probe)
    gates: dict[str, Any] = {}
    reference = probes.get(REFERENCE)
    arms = {}
    if reference:
        ref_step = max(reference)
        ref_path, ref_probe = reference[ref_step]
        ref_cov = coverage.get(REFERENCE)
        for arm in GATED_ARMS:
            if arm not in probes:
                continue
            step = max(probes[arm])
            path, probe = probes[arm][step]
            entry: dict[str, Any] = {"step": step, "reference_step": ref_step,
                                     "inputs": {"probe": path, "reference_probe": ref_path}}
            for similarity in probe["retrieval"]:
                entry[f"probe_{similarity}"] = _moved(_probe_vector(probe, similarity),
                                                      _probe_vector(ref_probe, similarity), strata=True)
            variant = (coverage.get(arm) or {}).get("variants", {}).get(COVERAGE_VARIANT)
            ref_variant = (ref_cov or {}).get("variants", {}).get(COVERAGE_VARIANT)
            if variant and ref_variant:
                a = dict(enumerate(variant["per_text"][COVERAGE_K]))
                b = dict(enumerate(ref_variant["per_text"][COVERAGE_K]))
                entry["coverage"] = _moved(a, b, strata=False)
                entry["inputs"].update(coverage=f"{arm} coverage", reference_coverage=f"{REFERENCE} coverage")
            entry["moved"] = any(value.get("moved") for key, value in entry.items()
                                 if key.startswith("probe_") or key == "coverage")
            arms[arm] = entry
    if arms:
        gates["objectives_move_representation"] = {
            "passed": any(entry["moved"] for entry in arms.values()),
            "rule": f"bow or retromae − {REFERENCE}: Δ ≥ {MOVE} with the 95 % interval above 0 in the [CLS] probe "
                    f"({PROBE_MEASURE}, dot or cos) or in coverage@{COVERAGE_K} ({COVERAGE_VARIANT}); otherwise audit "
                    "the objectives before more seeds",
            "arms": arms}
    rising = {}
    for arm, steps in probes.items():
        if len(steps) < 2:
            continue
        last, previous = sorted(steps)[-1], sorted(steps)[-2]
        values = {}
        for similarity in steps[last][1]["retrieval"]:
            now = float(np.mean(list(_probe_vector(steps[last][1], similarity).values())))
            before = float(np.mean(list(_probe_vector(steps[previous][1], similarity).values())))
            values[similarity] = {"step": last, "previous_step": previous, "probe": now, "previous_probe": before,
                                  "rise": now - before}
        rising[arm] = {"similarities": values, "rising": any(v["rise"] > SATURATION for v in values.values()),
                       "inputs": [str(steps[previous][0]), str(steps[last][0])]}
    if rising:
        gates["pre_saturation"] = {
            "passed": not any(entry["rising"] for entry in rising.values()),
            "rule": f"the probe ({PROBE_MEASURE}, pooled) rose by at most {SATURATION} between the last two probed "
                    "steps for every arm; an arm still rising needs a longer budget before a null is called",
            "arms": rising}
    return gates
