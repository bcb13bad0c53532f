"""A recipe's results: one row per retriever and collection (:func:`result_row`), ``results.json`` and ``results.md``
(:func:`write_results`: the table, the stage times, what each fused row is, and the final row's paired t-tests with
a closing paragraph), written as artefacts of the run files they were computed from (:func:`results_are_current`).

Each row carries the measures its collection was scored with (the evaluate stage's ``measures``; default
:data:`RESULT_MEASURES`); ``results.md`` has one table per set of measures. A recipe's ``expected`` numbers (the
paper's, :func:`validate_expected`) ride on their row as ``paper`` and are printed in a "paper" column beside ours,
with the difference, and the table of the paper they come from below.

**Which row to use** (:func:`row_to_use`; docs/preregistration.md, amendment 16): ``results.md`` recommends, per
evaluated collection, ``final`` where the model was trained (in-domain) and the untrained fusion ``rrf-zero-shot``
on every other collection, guard or not, with ``final`` beside it and a sentence where it is significantly below
or above there; and it names the candidates a ``select`` stage's dev gate or guard refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pretrieve import artifacts
from pretrieve.errors import ConfigError
from pretrieve.evaluation.answers import check_measures
from pretrieve.evaluation.significance import holm_note
from pretrieve.options import join_path, validate
from pretrieve.recipe.dev import dev_line

#: The measures of a collection whose evaluate stage names none (``nDCG@10`` is also the final row's t-test measure).
RESULT_MEASURES = ("nDCG@10", "MRR@10", "R@100")


@dataclass
class ExpectedNumbers:
    """One entry of a recipe's ``expected``: the paper's numbers for one row on one collection."""

    collection: str                 # as the evaluate stage names it: "msmarco:dev", "msmarco:test", "scifact"
    table: str                      # where the numbers are printed: 'Table 3, row "BoW Prediction"'
    values: dict[str, float]        # measure (as the evaluate stage names it) → the paper's number, as a fraction
    row: str | None = None          # the results row; default: the recipe's last fine-tuned retriever
    tolerance: float | None = None  # |ours − paper| accepted on every measure (a released retriever's check)


def validate_expected(entries: Any, where: str) -> list[dict[str, Any]]:
    """A recipe's ``expected``: a list of :class:`ExpectedNumbers` (unknown keys refused, measure names parsed,
    numbers fractions in [0, 1]); one :class:`ConfigError` naming the key's path otherwise. That each collection,
    measure and row is one the evaluate stage produces is checked by the stage (``evaluate``'s ``needs``)."""
    at = join_path(where, "expected")
    if not isinstance(entries, list):
        raise ConfigError(f"{at}: expected a list of {{collection, table, values, row}} entries, got {entries!r}")
    validated = []
    for index, entry in enumerate(entries):
        here = join_path(at, index)
        values = validate(ExpectedNumbers, entry, here)
        for key in ("collection", "table", "values"):
            if not values.get(key):
                raise ConfigError(f"{join_path(here, key)}: required")
        for measure, number in values["values"].items():
            _check_measure(measure, join_path(join_path(here, "values"), measure))
            if not 0.0 <= number <= 1.0:
                raise ConfigError(f"{join_path(join_path(here, 'values'), measure)}: {number} is not in [0, 1]; "
                                  "write the paper's numbers as fractions (0.401 for 40.1)")
        validated.append(values)
    seen = set()
    for index, entry in enumerate(validated):
        key = (entry["collection"], entry.get("row"))
        if key in seen:
            raise ConfigError(f"{join_path(at, index)}: a second entry for row {entry.get('row') or '(default)'} "
                              f"on {entry['collection']}; put its values in the first")
        seen.add(key)
    return validated


def _check_measure(measure: str, where: str) -> None:
    try:
        check_measures([str(measure)])   # an ir_measures name or answer accuracy (Acc@k)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def result_row(retriever: str, collection: str, run_path: Path, result) -> dict:
    """One row of the results: the retriever, the collection, its run file, the names of the measures of ``result``
    (``measures``) and their values."""
    return {"retriever": retriever, "collection": collection, "run": str(run_path), "measures": list(result.measures),
            **{measure: round(result.aggregate[measure], 4) for measure in result.measures}}


def row_measures(row: Mapping[str, Any]) -> list[str]:
    """The measures of a results row (rows written before rows named them: :data:`RESULT_MEASURES`)."""
    return list(row.get("measures") or RESULT_MEASURES)


def write_results(out_dir: Path, results: Mapping[str, Any], recipe: Mapping[str, Any]) -> None:
    """``results.json`` and ``results.md``, as artefacts made from the recipe's settings and its run files."""
    settings = {"recipe": {key: value for key, value in recipe.items()
                           if key not in ("out", "data_root", "dist_timeout_minutes")}}
    inputs = results_inputs(out_dir, results)
    with artifacts.write_file(out_dir / "results.json", "results", settings, inputs) as tmp:
        tmp.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    with artifacts.write_file(out_dir / "results.md", "results", settings, inputs) as tmp:
        tmp.write_text(results_markdown(results), encoding="utf-8")


def results_inputs(out_dir: Path, results: Mapping[str, Any]) -> dict[str, Path]:
    """The run files the rows of ``results`` were computed from, by file name (they live in ``out/runs``)."""
    return {Path(row["run"]).name: out_dir / "runs" / Path(row["run"]).name for row in results.get("rows", [])}


def results_are_current(out_dir: str | Path) -> bool:
    """Whether ``out/results.json`` is intact and every run file it was computed from is unchanged (the check a
    harness running many recipes uses before it skips one)."""
    out_dir = Path(out_dir)
    path = out_dir / "results.json"
    sidecar = artifacts.read_sidecar(path)
    if sidecar is None:
        return False
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return artifacts.is_current(path, sidecar.get("settings"), results_inputs(out_dir, results), kind="results")


def results_markdown(results: Mapping[str, Any]) -> str:
    """``results.md``: one row per retriever and collection, the stage times, the fused rows and the final row's
    tests."""
    lines = [f"# Results: {results['recipe']}", ""]
    for measures, rows in _tables(results["rows"]):
        lines += _table_lines(measures, rows) + [""]
    lines += _paper_lines(results["rows"])
    lines += ["Runs are in `runs/`; re-evaluate any of them with `pretrieve evaluate --data DIR --split test RUN`.", ""]
    timings = results.get("timings_s") or {}
    per_rank = results.get("rank_timings_s") or {}
    if timings and per_rank:
        world = len(next(iter(per_rank.values())))
        lines += ["## Stage times", "", "| stage | " + " | ".join(f"rank {r}: s (waiting)" for r in range(world))
                  + " |", "|---|" + "---|" * world]
        lines += [f"| {label} | " + " | ".join(f"{t['s']:.1f} ({t['waiting_s']:.1f})" for t in per_rank.get(label, []))
                  + " |" for label in timings]
        totals = [(sum(v[r]["s"] for v in per_rank.values()), sum(v[r]["waiting_s"] for v in per_rank.values()))
                  for r in range(world)]
        lines += ["| total | " + " | ".join(f"{s:.1f} ({w:.1f})" for s, w in totals) + " |", "",
                  "Waiting: seconds a rank spent at barriers for the others (work done once, or a slower rank). "
                  "A stage found finished and current takes about 0 s (it was not run again).", ""]
    elif timings:
        lines += ["## Stage times", "", "| stage | seconds |", "|---|---|"]
        lines += [f"| {label} | {seconds:.1f} |" for label, seconds in timings.items()]
        lines += [f"| total | {sum(timings.values()):.1f} |", "",
                  "A stage found finished and current takes about 0 s (it was not run again).", ""]
    lines += dev_line(results.get("dev")) + _fusion_lines(results) + _selection_lines(results)
    lines += _final_lines(results)
    return "\n".join(lines)


def _tables(rows: list[Mapping[str, Any]]) -> list[tuple[list[str], list[Mapping[str, Any]]]]:
    """The rows grouped by their measures (one table each, in order of first appearance)."""
    tables: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        tables.setdefault(tuple(row_measures(row)), []).append(row)
    return [(list(measures), grouped) for measures, grouped in tables.items()]


def _table_lines(measures: list[str], rows: list[Mapping[str, Any]]) -> list[str]:
    """One results table; a measure the paper reports for some row gets "paper" and "Δ" (ours − paper) columns."""
    with_paper = {m for row in rows for m in (row.get("paper") or {}).get("values", {})}
    header = [f"{m} | paper | Δ" if m in with_paper else m for m in measures]
    lines = ["| retriever | collection | " + " | ".join(header) + " |",
             "|---|---|" + "---|" * (len(measures) + 2 * len(with_paper & set(measures)))]
    for row in rows:
        cells = []
        for m in measures:
            cells.append(f"{row[m]:.4f}")
            if m in with_paper:
                paper = (row.get("paper") or {}).get("values", {}).get(m)
                cells += [f"{paper:.3f}", f"{row[m] - paper:+.4f}"] if paper is not None else ["", ""]
        lines.append(f"| {row['retriever']} | {row['collection']} | " + " | ".join(cells) + " |")
    return lines


def _paper_lines(rows: list[Mapping[str, Any]]) -> list[str]:
    """Where each row's paper numbers are printed."""
    lines = [f"- `{row['retriever']}` on {row['collection']}: {row['paper']['table']}{_within(row)}" for row in rows
             if row.get("paper")]
    return (["Paper numbers (column \"paper\"; Δ = ours − paper), from:", "", *lines, ""]) if lines else []


def _fusion_lines(results: Mapping[str, Any]) -> list[str]:
    """What each fused row is (components, fusion, and where its weights were fitted)."""
    fused = {row["retriever"]: row["fusion"] for row in results["rows"] if row.get("fusion")}
    lines = []
    for name, info in fused.items():
        fit = info.get("fit")
        verb = "weights fitted" if str(info["method"]).startswith("wsum") else "chosen"   # rrf fits no weight
        crossed = f", cross-fitted {fit['cross_fitted']:.4f}" if fit and "cross_fitted" in fit else ""
        how = (f", {verb} on the {fit['queries']} `{fit['split']}` queries of the training collection "
               f"({fit['measure']} {fit['score']:.4f} there{crossed})" if fit else "")
        lines.append(f"- `{name}`: {info['method']} of {' + '.join(f'`{r}`' for r in info['runs'])}{how}")
    return (["Fused rows:", "", *lines, ""]) if lines else []


def _selection_lines(results: Mapping[str, Any]) -> list[str]:
    """The dev selection of a ``select`` stage's fusion: every candidate's dev scores and which was chosen, why."""
    lines: list[str] = []
    selected = {row["retriever"]: row["fusion"]["selection"] for row in results["rows"]
                if (row.get("fusion") or {}).get("selection")}
    for name, selection in selected.items():
        lines += _guard_lines(name, selection)
        measure, chosen = selection["measure"], selection["chosen"]
        guard, gate = selection.get("guard"), selection.get("dev_gate")
        lines += [f"Dev selection of `{name}` ({measure} on the {selection['queries']} `{selection['split']}` "
                  "queries; each candidate alone, fused with weights fitted there, and cross-fitted: each fold of "
                  "the dev queries scored by weights fitted on the others):", "",
                  "| candidate | alone | fused | cross-fitted | fusion | every fusion tried: fused / cross-fitted |"
                  + (" dev gate: Δ (one-sided p) |" if gate else ""),
                  "|---|---|---|---|---|---|" + ("---|" if gate else "")]
        for candidate in selection["candidates"]:
            label = f"**{candidate['name']}** (chosen)" if candidate["name"] == chosen else candidate["name"]
            crossed = candidate.get("cross_fitted")
            tried = "; ".join(f"{m['fusion']} {m['score']:.4f} / {m['cross_fitted']:.4f}"
                              for m in candidate.get("methods", []))
            crossed_cell = "—" if crossed is None else f"{crossed:.4f}"
            verdict = candidate.get("dev_gate")
            gated = ("" if not gate else " — |" if not verdict else
                     f" {verdict['mean_difference']:+.4f} ({verdict['p_value']:.2g}) "
                     f"{'admitted' if verdict['admitted'] else '**refused**'} |")
            lines.append(f"| {label} | {candidate['alone']:.4f} | {candidate['fused']:.4f} | {crossed_cell} | "
                         f"{candidate['fusion']} | {tried or '—'} |{gated}")
        lines += ["", f"`{name}` uses `{chosen}`"
                  + (f" ({selection['fusion']})" if selection.get("fusion") else "") + f": {selection['rule']}"
                  + (f"; with the dev gate, {gate['rule']}" if gate else "")
                  + (f"; with the guard, {guard['rule']}" if guard else "") + "."
                  + _refusal_text(name, selection), ""]
    return lines


def _refusal_text(name: str, selection: Mapping[str, Any]) -> str:
    """Which candidates the dev gate or the guard refused (Δ against the untrained RRF, p), and what that left."""
    refused = selection.get("refused") or []
    if not refused:
        return ""
    def test(r: Mapping[str, Any]) -> str:
        known = r.get("mean_difference") is not None and r.get("p_value") is not None
        return f" (Δ {r['mean_difference']:+.4f}, p = {r['p_value']:.2g})" if known else ""

    text = " Refused: " + "; ".join(f"`{r['name']}` by the {r['rule']}{test(r)}" for r in refused) + "."
    if selection.get("fallback"):
        rules = " or the ".join(sorted({r["rule"] for r in refused}))
        return text + (f" Every candidate was refused by the {rules}: `{name}` is the untrained RRF of the "
                       "off-the-shelf model (`rrf-zero-shot`).")
    if (selection.get("dev_gate") or {}).get("kept_baseline"):
        return text + f" The dev gate kept the untrained fusion: `{name}` is `rrf-zero-shot`."
    return text


def _guard_lines(name: str, selection: Mapping[str, Any]) -> list[str]:
    """The guard of a selection: its collections and each candidate's test there (docs/preregistration.md,
    amendment 14)."""
    guard = selection.get("guard")
    if not guard:
        return []
    sizes = ", ".join(f"{g} {n} (evaluated on the other {guard['evaluated'][g]})" for g, n in guard["collections"].items())
    lines = [f"Guard of `{name}` (collections other than the training one; the first half of each test split, never "
             f"evaluated): {sizes} queries. Each candidate, in dev order until one is admitted, fused as it would be "
             f"used and tested against the untrained RRF of the off-the-shelf model there (Δ nDCG@10, paired t-test "
             f"p; refused when below with p ≤ {guard['p']:g}, pooled or in any one collection):", "",
             "| candidate | pooled Δ (p) | per collection Δ (p) | verdict |", "|---|---|---|---|"]
    for candidate in selection["candidates"]:
        check = candidate.get("guard")
        if not check:
            continue
        per = "; ".join(f"{g} {t['mean_difference']:+.4f} ({t['p_value']:.2g})"
                        for g, t in check["per_collection"].items())
        pooled = check["pooled"]
        lines.append(f"| {candidate['name']} | {pooled['mean_difference']:+.4f} ({pooled['p_value']:.2g}) | {per} | "
                     f"{'admitted' if check['admitted'] else '**refused**'} |")
    return lines + [""]


def row_to_use(final: Mapping[str, Any], baseline: str = "rrf-zero-shot") -> tuple[str, str, str | None]:
    """``(row, why, effect)`` for one collection's final row (docs/preregistration.md, amendment 16): ``final`` on
    the collection the model was trained on (in-domain); on every other collection the untrained fusion
    ``baseline``, whatever the selection (guard or not). ``effect``, on a collection it was not trained on only:
    ``"below"`` / ``"above"`` where ``final`` is significantly below / above ``baseline`` there (paired two-sided
    t-test, p ≤ 0.05; descriptive, read off the test queries), else None."""
    test = (final.get("vs") or {}).get(baseline) or {}
    if final.get("in_domain", True):
        return final["retriever"], "trained on it (in-domain)", None
    effect = (("below" if test.get("mean_difference", 0) < 0 else "above")
              if test.get("significant") and test.get("mean_difference") else None)
    return baseline, "not trained on it: the untrained fusion, what you had there", effect


def recommended_rows(rows: list[Mapping[str, Any]], baseline: str = "rrf-zero-shot") -> list[dict[str, Any]]:
    """``results.json``'s ``recommended``: for each final row's collection, the row to use there (:func:`row_to_use`),
    why, whether the model was trained on it, and where ``final`` is significantly ``below`` / ``above``
    ``baseline`` there (else None)."""
    out = []
    for row in rows:
        if row.get("final"):
            use, why, effect = row_to_use(row, baseline)
            out.append({"collection": row["collection"], "use": use, "why": why,
                        "in_domain": bool(row.get("in_domain", True)), "final_vs_" + baseline: effect})
    return out


def _final_lines(results: Mapping[str, Any]) -> list[str]:
    """The paired t-tests of the final row and one closing paragraph: which row to use, what each stage added, and
    the command behind every number."""
    finals = [row for row in results["rows"] if row.get("final")]
    if not finals:
        return []
    measure = RESULT_MEASURES[0]
    names = list(dict.fromkeys(name for row in finals for name in row["vs"]))
    final = finals[0]["retriever"]
    lines = [f"Paired two-sided t-tests of `{final}` against each baseline ({measure} per query; "
             "Δ = final − baseline [95 % CI], ▲/▼: p ≤ 0.05):", "",
             "| collection | " + " | ".join(f"vs `{n}`: Δ (p)" for n in names) + " |", "|---|" + "---|" * len(names)]
    for row in finals:
        cells = []
        for name in names:
            test = row["vs"].get(name)
            if not test:
                cells.append("—")
                continue
            mark = ("▲" if test["mean_difference"] > 0 else "▼") if test.get("significant") else ""
            p = test.get("p_value")
            ci = (f" [{test['ci_low']:+.4f}, {test['ci_high']:+.4f}]"
                  if test.get("ci_low") is not None and test.get("ci_high") is not None else "")
            cells.append(f"{test['mean_difference']:+.4f}{mark}{ci} (p = {p:.2g})" if p is not None else "—")
        lines.append(f"| {row['collection']} | " + " | ".join(cells) + " |")
    note = holm_note([test.get("p_value") for row in finals for test in row["vs"].values()])
    lines += ["", note] if note else []
    scores = {(row["retriever"], row["collection"]): row[measure] for row in results["rows"]}
    collections = [row["collection"] for row in finals]
    fused = {row["retriever"] for row in results["rows"] if row.get("fusion")}
    trained = [name for name in dict.fromkeys(row["retriever"] for row in results["rows"])
               if name not in ("bm25", "zero-shot", final) and name not in fused and "+rerank@" not in name]
    chain = (["zero-shot"] if any(name == "zero-shot" for name, _ in scores) else []) + trained + [final]

    def differences(better: str, worse: str) -> str:
        return " / ".join(f"{scores[(better, c)] - scores[(worse, c)]:+.4f}" for c in collections
                          if (better, c) in scores and (worse, c) in scores)

    steps = [f"`{a}` → `{b}` {differences(b, a)}" for a, b in zip(chain, chain[1:])]
    lines += ["", "**Which row to use**, per collection:", "",
              f"| collection | use | {measure} | `{final}` there: {measure}, Δ (p) | why |", "|---|---|---|---|---|"]
    sentences = []
    for row in finals:
        use, why, effect = row_to_use(row)
        collection = row["collection"]
        known = (use, collection) in scores or use == final
        score = f"{scores[(use, collection)]:.4f}" if (use, collection) in scores else "—"
        test = row["vs"].get("rrf-zero-shot")
        beside = "(this row)" if use == final else f"{row[measure]:.4f}" + (
            f", {test['mean_difference']:+.4f} (p = {test['p_value']:.2g})" if test and test.get("p_value") is not None
            else "")
        lines.append(f"| {collection} | `{use}`{'' if known else ' (add this row)'} | {score} | {beside} | {why} |")
        if effect:
            change = (f"`{final}` is {effect} the untrained fusion `rrf-zero-shot` by {test['mean_difference']:+.4f} "
                      f"[{test['ci_low']:+.4f}, {test['ci_high']:+.4f}] (p = {test['p_value']:.2g})")
            if effect == "below":
                sentences.append(f"**Fine-tuning hurt {collection}**, a collection it was not trained on: {change}; "
                                 "use `rrf-zero-shot` there.")
            else:
                sentences.append(f"Fine-tuning helped {collection}, a collection it was not trained on: {change}. "
                                 f"The page still recommends `rrf-zero-shot` there: nothing in the selection saw "
                                 f"{collection}, and a gain on one collection promises none on another; use "
                                 f"`{final}` there only after checking it on {collection}'s own judged queries.")
    if any(not row.get("in_domain", True) for row in finals):
        sentences.insert(0, "On a collection the model was not trained on, the page recommends the untrained fusion "
                            "`rrf-zero-shot` whatever the selection did (docs/preregistration.md, amendment 16): "
                            "nothing in it saw that collection, and that fusion is what you had there without "
                            f"training; `{final}` is shown beside it.")
    lines += [""] + [item for sentence in sentences for item in (sentence, "")]
    text = (f"`{final}`: {measure} "
            + " / ".join(f"{scores[(final, c)]:.4f}" for c in collections) + f" on {' / '.join(collections)}; "
            + "; ".join(f"{differences(final, n)} over `{n}`" for n in names) + ". "
            + (f"What each stage added ({measure}, {' / '.join(collections)}): " + "; ".join(steps) + ". "
               if steps else "")
            + f"Every number here comes from the runs in `runs/`; `{results.get('command', 'pretrieve run RECIPE')}` "
            "reproduces all of them (finished stages are skipped; delete the output directory to recompute).")
    return lines + [text, ""]


def _within(row: Mapping[str, Any]) -> str:
    """`` — within ±t: yes`` (or ``NO``) when the expected numbers carry a tolerance."""
    tolerance = row["paper"].get("tolerance")
    if tolerance is None:
        return ""
    ok = all(abs(row[m] - v) <= tolerance for m, v in row["paper"]["values"].items())
    return f" — within ±{tolerance:g} on every measure: {'yes' if ok else 'NO'}"
