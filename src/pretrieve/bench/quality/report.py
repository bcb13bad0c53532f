"""The report of ``pretrieve bench quality``: ``results.md``, ``results.json`` and ``results.png``.

``results.md`` has one table per measure (arms × collections + avg, mean ± std over seeds, t-test marks against
``mlm`` and ``none``, coverage and speed beside the primary measure), the coverage variants, the t-test p-values,
the **contrasts** of the declared family (Δ, 95 % multi-bootstrap interval, p, Holm p, t-test p, σ_q, τ, the
standard error, the MDE at 80 % power with and without Holm's first step, and the decision of the rule), the
fine-tuning protocol chosen on dev, the gates, failures, and how to regenerate a number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pretrieve.bench.quality.arms import BASELINES, NO_PRETRAIN, split_family
from pretrieve.bench.quality.settings import PRIMARY, RETRIEVER
from pretrieve.bench.quality.summary import per_query_rows
from pretrieve.io_utils import atomic_open, atomic_path, write_json

TABLE_COVERAGE_K = 10


def _cell(stats: Mapping[str, Any] | None, marks: str = "") -> str:
    if not stats:
        return "—"
    text = f"{stats['mean']:.4f}"
    if stats["n"] > 1:
        text += f" ± {stats['std']:.4f}"
    return text + (f" {marks}" if marks else "")


def significance_marks(cell: Mapping[str, Any]) -> str:
    """``m▲``/``m▼``: significantly better/worse than mlm; ``n▲``/``n▼``: than none (p ≤ alpha)."""
    marks = []
    for baseline, letter in (("mlm", "m"), (NO_PRETRAIN, "n")):
        test = cell.get("vs", {}).get(baseline)
        if test and test.get("significant"):
            marks.append(letter + ("▲" if test["mean_difference"] > 0 else "▼"))
    return " ".join(marks)


def _md_escape(text: str, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return (flat[:limit - 1] + "…" if len(flat) > limit else flat).replace("|", "\\|")


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def results_markdown(summary: Mapping[str, Any]) -> str:
    """``results.md``: one table per measure (methods × collections + avg), coverage, p-values, failures."""
    settings, names = summary["settings"], summary["collections"]
    pre, ft = settings["pretrain"], settings["finetune"]
    seeds = settings["seeds"]
    folds = settings.get("folds") or ["train:test"]
    sources = settings["pretrain_data"] if isinstance(settings["pretrain_data"], list) else [settings["pretrain_data"]]
    selection = summary.get("selection")
    lines = [f"# Pre-training methods at an equal budget: retrieval quality ({Path(str(settings['base'])).name})", "",
             f"- base model: `{settings['base']}`",
             f"- pre-training (every method the same): {pre.get('max_steps')} steps × batch {pre.get('batch_size')}, "
             f"max length {pre.get('max_len')}, lr {pre.get('lr')}, on "
             + " ∪ ".join(f"`{s}`" for s in sources)
             + " (cotmote: the training split's passage–query pairs); `none` = no pre-training",
             f"- fine-tuning: stage 1 (BM25 negatives) on `{settings['train']}`: "
             + ", ".join(f"{k} {v}" for k, v in ft.items())
             + (f"; per method: {json.dumps(settings['finetune_per_method'])}" if settings.get("finetune_per_method")
                else "")
             + (f"; chosen on dev: {json.dumps(selection['chosen'])}" if selection else ""),
             f"- folds (fine-tune on the first split, evaluate on the second; in-domain scores pool every fold's "
             f"test queries): {', '.join(folds)}; dev: {settings.get('dev_queries', 0)} queries of the train split "
             f"(seed {settings.get('dev_seed', 0)}) held out of every fold, for selection only",
             f"- evaluation: {summary.get('in_domain', names[0])} (in-domain, pooled over folds)"
             + (", " + ", ".join(n for n in names if n != summary.get("in_domain")) + f" ({settings['split']} split, "
                "zero-shot, per query the mean over the folds' models)" if len(names) > 1 else "")
             + f"; exact dense search, depth {settings['depth']}",
             f"- seeds: {', '.join(map(str, seeds))} (an A/A arm NAME-aa runs NAME with shifted seeds); a cell is the "
             "mean ± sample std over seeds of the collection's score; avg = mean over collections (per seed, then "
             "over seeds)",
             f"- significance (secondary): two-sided paired t-test over queries (per-query scores averaged over "
             f"seeds first), p ≤ {settings['alpha']}: m▲/m▼ better/worse than `mlm`, n▲/n▼ than `none`; it ignores "
             "the seed variance, so it marks differences that two runs of one method also show (an A/A arm's marks "
             "say how often): descriptive only; the decision statistic is the multi-bootstrap of the Contrasts "
             "section",
             f"- coverage@{TABLE_COVERAGE_K}: input-token coverage ratio of the pre-trained checkpoint's [CLS] "
             f"(Drop your Decoder, Ma et al. 2024, Fig. 2/4) on the first {settings['coverage_texts']} passages of "
             "the pre-training corpus",
             "- pre-train s: wall time of the pretrain stage; samples/s: training throughput (logs.jsonl)", ""]
    methods = summary["methods"]
    for measure in summary["measures"]:
        extra = measure == PRIMARY
        header = ["method", *names, "avg"] + ([f"coverage@{TABLE_COVERAGE_K}", "pre-train s", "samples/s"]
                                                if extra else [])
        lines += [f"## {measure}", "", "| " + " | ".join(header) + " |",
                  "|---|" + "---:|" * (len(header) - 1)]
        for method, entry in methods.items():
            if not entry["seeds"]:
                reason = ("failed: " + _md_escape(next(iter(entry["failed"].values())))
                          if entry["failed"] else "not run yet")
                lines.append("| " + " | ".join([method, reason] + ["—"] * (len(header) - 2)) + " |")
                continue
            scores = entry["scores"][measure]
            label = method
            if entry["failed"] or entry["pending"]:
                label += f" ({len(entry['seeds'])}/{len(seeds)} seeds)"
            cells = [label] + [_cell(scores[n], significance_marks(scores[n])) for n in names] + [_cell(scores["avg"])]
            if extra:
                ratio = entry["coverage"].get("ratio", {}).get(str(TABLE_COVERAGE_K))
                speed = entry["pretrain"]
                cells += ["—" if ratio is None else f"{ratio:.3f}" + (" (new head)" if entry["coverage"].get(
                    "head_created") else ""), _seconds(speed.get("wall_s")),
                          "—" if speed.get("samples_per_s") is None else f"{speed['samples_per_s']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += _contrast_section(summary)
    lines += _selection_section(selection)
    lines += _gates_section(summary.get("gates"))
    lines += _coverage_section(methods)
    lines += _pvalue_section(methods, names)
    failures = [(m, s, e) for m, entry in methods.items() for s, e in entry["failed"].items()]
    if failures:
        lines += ["## Failures", ""] + [f"- `{m}` seed {s}: {_md_escape(e, 600)}" for m, s, e in failures] + [""]
    progress = summary.get("progress") or {}
    lines += ["## Progress and provenance", "",
              f"Cells recorded: {progress.get('cells_done', 0)} done, {progress.get('cells_failed', 0)} failed, "
              f"{len(progress.get('cells_todo') or [])} to do"
              + (f" ({', '.join(_todo(cell, progress) for cell in progress['cells_todo'])})"
                 if progress.get("cells_todo") else "")
              + (f"; dev grid: {progress.get('select_done')} points recorded, "
                 f"{len(progress.get('select_todo') or [])} to do" if progress.get("select_done") is not None else "")
              + f". Precision of every cell: {settings.get('precision')}.", ""]
    for method, entry in methods.items():
        if entry.get("machines"):
            lines.append(f"- `{method}`: " + "; ".join(entry["machines"]))
    by_seed = progress.get("machines_by_seed") or {}
    if by_seed:
        lines += ["", "Machines by seed (a contrast pairs two arms within a seed): " + "; ".join(
            f"{seed}: " + ", ".join(f"{where} ({', '.join(arms)})" for where, arms in machines.items())
            for seed, machines in by_seed.items()) + "."]
    lines += ["", "## Reproducing a number", "",
              f"Every number here is recomputed from the records in `{summary.get('records')}` "
              "(`cells/<arm>/seed<k>.json`: per-query scores of every fold model on every collection, coverage, "
              "probes, timings, commit, machine and precision; `select/<point>.json`: the dev grid): "
              "`pretrieve bench quality --report-only --records DIR --out DIR2`. The TREC runs, checkpoints and "
              "`recipe.json` files of a cell are in the scratch `--out` of the machine that ran it, "
              f"`<out>/<method>/seed<k>/<fold>/runs/{RETRIEVER}__<collection>[:split].trec`.", ""]
    return "\n".join(lines)


def _todo(cell: str, progress: Mapping[str, Any]) -> str:
    """A cell still to do, with its folds already recorded (``bow/seed1: fold test:train recorded``)."""
    folds = (progress.get("folds_recorded") or {}).get(cell)
    return f"{cell}: fold{'s' if len(folds) > 1 else ''} {', '.join(folds)} recorded" if folds else cell


def _coverage_section(methods: Mapping[str, Any]) -> list[str]:
    rows = [(m, e["coverage"]) for m, e in methods.items() if e["coverage"]]
    if not rows:
        return []
    ks = sorted({int(k) for _, c in rows for k in c["ratio"]})
    variants = list(dict.fromkeys(v for _, c in rows for v in c.get("variants", {}) or {"raw": None}))
    header = [f"{v} k={k}" for v in variants for k in ks]
    lines = ["## Input-token coverage ratio (top-k of CLS·Eᵀ that occur in the input)", "",
             "raw: every token; no-stopwords: English stopwords excluded from the input and the ranking; "
             "no-frequent: the 500 most frequent tokens of the pre-training corpus excluded.", "",
             "| method | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    for method, coverage in rows:
        label = method + (" (new head)" if coverage.get("head_created") else "")
        by_variant = coverage.get("variants") or {"raw": coverage["ratio"]}
        lines.append(f"| {label} | " + " | ".join(
            f"{by_variant.get(v, {}).get(str(k), float('nan')):.4f}" for v in variants for k in ks) + " |")
    return lines + [""]


def _contrast_section(summary: Mapping[str, Any]) -> list[str]:
    """The declared family on the primary measure, every collection: the decision table."""
    table = (summary.get("contrasts") or {}).get(PRIMARY) or {}
    if not any(table.values()):
        return []
    settings = summary["settings"]
    lines = [f"## Contrasts ({PRIMARY}; multi-bootstrap over queries × seeds, {settings.get('bootstrap')} "
             "resamples)", "",
             f"Δ = mean over queries of [seed-mean of A − seed-mean of B]; 95 % percentile interval; p two-sided; "
             f"Holm within each declared family ({_families(settings.get('contrasts', []))}) per collection; "
             f"margin {settings.get('margin')}: *confirmed* if Δ ≥ +margin with Holm p < {settings['alpha']}, "
             "*refuted at this scale* if the upper bound < +margin (reported as a refutation only where a probe "
             "shows the representation changed), *undecided* otherwise. σ_q: SD over queries of the seed-averaged "
             "difference; τ: SD over seeds of each arm's mean; MDE: 80 % power at α (Holm: at α / family size) of "
             "the test Δ ≠ 0; rule's MDE: the true Δ the *confirmed* rule (Δ̂ ≥ margin and Holm p < α) reaches with "
             "80 % power, and its power at Δ = margin (at most one half). A declared contrast without results counts "
             "as p = 1 in its family. With one seed in an arm the bootstrap sees no seed variance: such a contrast "
             "is *descriptive*, never decided. t-test p: on seed-averaged scores, ignores seed variance "
             "(descriptive). Only the in-domain nDCG@10 is registered for the claims: the other collections' "
             "decisions are descriptive.", ""]
    header = ["collection", "contrast", "Δ", "95% CI", "p", "Holm p", "t-test p", "σ_q", "τ (A, B)", "SE", "MDE",
              "MDE Holm", "rule's MDE", "power at margin", "queries", "seeds", "decision"]
    lines += ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 3) + "---|"]
    for name, entries in table.items():
        for e in entries:
            ttest_p = e["ttest"].get("p_value")
            decision = e["decision"]
            if decision == "refuted-at-this-scale" and e.get("representation_changed") is not True:
                decision = "upper CI < margin (refuted at this scale only if the probe moved)"
            lines.append("| " + " | ".join([
                name, f"{e['a']} − {e['b']}" + ("" if e.get("family", "primary") == "primary" else f" ({e['family']})"), f"{e['delta']:+.4f}", f"[{e['ci_low']:+.4f}, {e['ci_high']:+.4f}]",
                f"{e['p_value']:.3g}", f"{e['p_holm']:.3g}", "—" if ttest_p is None else f"{ttest_p:.3g}",
                f"{e['sigma_q']:.4f}", f"{e['tau'][0]:.4f}, {e['tau'][1]:.4f}", f"{e['se']:.4f}", f"{e['mde']:.4f}",
                f"{e['mde_holm']:.4f}", f"{e.get('mde_rule', float('nan')):.4f}",
                f"{e.get('power_at_margin', float('nan')):.2f}", str(e["n_queries"]),
                f"{e['n_seeds'][0]}, {e['n_seeds'][1]}",
                decision]) + " |")
    return lines + [""]


def _families(contrasts) -> str:
    """``primary: bow-mlm, mlm-none; anchor: tsdae-mlm`` from the recorded (possibly labelled) contrasts."""
    families: dict[str, list[str]] = {}
    for labelled in contrasts:
        family, name = split_family(labelled)
        families.setdefault(family, []).append(name)
    return "; ".join(f"{family}: {', '.join(names)}" for family, names in families.items())


def _selection_section(selection: Mapping[str, Any] | None) -> list[str]:
    """The dev grid as a table of learning rate × epochs (the dev curve), and the chosen point."""
    if not selection:
        return []
    chosen = selection.get("chosen")
    edge = ", ".join(selection.get("edge") or [])
    if chosen is not None:
        state = f"applied to every arm and fold: **{json.dumps(chosen)}**."
        if edge:
            state += (f" It lies on the{' grown' if selection.get('grown') else ''} grid's upper edge ({edge}): "
                      "the protocol may not have converged.")
    elif selection.get("grow"):
        state = (f"**not chosen yet**: the best point {json.dumps(selection.get('best'))} lies on the grid's upper "
                 f"edge ({edge}), so the grid grows once (pre-registration amendment 9) by "
                 f"{json.dumps(selection['grow'])}.")
    else:
        state = (f"**not chosen yet**: {len(selection.get('todo') or [])} points have no record "
                 f"({', '.join(selection.get('todo') or []) or 'every point failed'}).")
    grown = (f" (grown once by the convergence rule, pre-registration amendment 9, by "
             f"{json.dumps(selection.get('grid_grow'))})" if selection.get("grown") else "")
    lines = ["## Fine-tuning protocol (chosen once on dev)", "",
             f"Grid {json.dumps(selection['grid'])}{grown} with `{selection['arm']}` seed {selection['seed']}, fold "
             f"{selection['fold']}, scored by {selection['measure']} on {selection['dev_queries']} dev queries; "
             + state, ""]
    grid = selection.get("grid") or {}
    lrs, epochs = list(grid.get("lr") or [None]), list(grid.get("epochs") or [None])
    scores = selection.get("scores") or {}

    def name(lr, epoch) -> str:
        return "-".join(part for part in (f"lr{lr:g}" if lr is not None else "",
                                          f"epochs{epoch:g}" if epoch is not None else "") if part) or "default"

    lines += ["| lr \\ epochs | " + " | ".join("—" if e is None else f"{e:g}" for e in epochs) + " |",
              "|---|" + "---:|" * len(epochs)]
    for lr in lrs:
        cells = []
        for epoch in epochs:
            value = scores.get(name(lr, epoch))
            text = "—" if value is None else "failed" if value == float("-inf") else f"{value:.4f}"
            if chosen is not None and name(lr, epoch) == name(chosen.get("lr"), chosen.get("epochs")):
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {'—' if lr is None else f'{lr:g}'} | " + " | ".join(cells) + " |")
    return lines + [""]


def _gates_section(gates: Mapping[str, Any] | None) -> list[str]:
    if not gates:
        return []
    lines = ["## Gates (after seed 1)", ""]
    for name, gate in gates.items():
        lines.append(f"- **{name}**: {'passed' if gate.get('passed') else 'not passed'} — {gate.get('rule', '')}")
    return lines + [""]


def _pvalue_section(methods: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    header = ["method"] + [f"{n} vs {b}" for n in names for b in BASELINES]
    lines = [f"## p-values ({PRIMARY}, paired t-test)", "", "| " + " | ".join(header) + " |",
             "|---|" + "---:|" * (len(header) - 1)]
    for method, entry in methods.items():
        if not entry["seeds"]:
            continue
        cells = [method]
        for name in names:
            for baseline in BASELINES:
                test = entry["scores"][PRIMARY][name].get("vs", {}).get(baseline)
                cells.append("—" if not test or test.get("p_value") is None else f"{test['p_value']:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def plot_results(summary: Mapping[str, Any], path: str | Path, measure: str = PRIMARY) -> None:
    """Grouped bars: one group per collection (+ avg), one bar per method, std over seeds as error bars."""
    # only when plotting; the object API, no pyplot: a notebook's backend is left alone
    from matplotlib import colormaps  # lazy: matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib
    from matplotlib.figure import Figure  # lazy: matplotlib

    groups = [*summary["collections"], "avg"]
    methods = [(m, e) for m, e in summary["methods"].items() if e["seeds"]]
    fig = Figure(figsize=(max(6.0, 0.3 * len(groups) * max(1, len(methods))), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / max(1, len(methods))
    x = np.arange(len(groups))
    palette = colormaps["tab10" if len(methods) <= 10 else "tab20"]   # a distinct colour per method
    for i, (method, entry) in enumerate(methods):
        cells = [entry["scores"][measure][g] for g in groups]
        errors = [c["std"] for c in cells] if any(c["n"] > 1 for c in cells) else None
        ax.bar(x - 0.4 + width * (i + 0.5), [c["mean"] for c in cells], width, yerr=errors, capsize=2, label=method,
               color=palette(i % palette.N))
    failed = [m for m, e in summary["methods"].items() if not e["seeds"]]
    ax.set_xticks(x)
    ax.set_xticklabels(groups)
    seeds = len(summary["settings"]["seeds"])
    ax.set_ylabel(f"{measure}" + (f" (mean ± std over {seeds} seeds)" if seeds > 1 else ""))
    title = f"{measure} after stage-1 fine-tuning, base {Path(str(summary['settings']['base'])).name}"
    if failed:
        title += f"\nno result: {', '.join(failed)}"
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    if methods:
        ax.legend(fontsize=7, ncol=min(6, len(methods)), loc="upper center", bbox_to_anchor=(0.5, -0.08),
                  frameon=False)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")


def write_report(out: str | Path, summary: Mapping[str, Any], records: str | Path, plot: bool = True) -> list[Path]:
    """``results.md``, ``results.json``, ``per_query.tsv`` (every per-query score with its fold label) and
    (``plot``) ``results.png`` in ``out``; returns the paths written."""
    out = Path(out)
    write_json(out / "results.json", summary)
    with atomic_open(out / "results.md") as handle:
        handle.write(results_markdown(summary))
    with atomic_open(out / "per_query.tsv") as handle:
        columns = ["arm", "seed", "collection", "fold", "query", *summary["measures"]]
        handle.write("\t".join(columns) + "\n")
        for row in per_query_rows(records, summary):
            handle.write("\t".join(str(row[c]) for c in columns) + "\n")
    paths = [out / "results.md", out / "results.json", out / "per_query.tsv"]
    if plot:
        plot_results(summary, out / "results.png")
        paths.append(out / "results.png")
    return paths


