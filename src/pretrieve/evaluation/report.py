"""Results tables: one collection (rows = runs, columns = measures, significance marks against the first
run) and BEIR-style multi-collection tables (rows = runs, columns = collection × measure, plus average).

Both render to markdown (4-decimal values) and to a JSON-ready dict holding everything (means,
p-values, optionally per-query scores). Rendering for the terminal lives in the CLI; it reads the same
:class:`ResultsTable`. As data: ``to_pandas()`` (a DataFrame of the means, or of the per-query scores); in a
notebook a table shows its means (``repr``: the markdown table, ``_repr_html_``: an HTML table with the legend),
never the dataclass fields.

Marks: ``†`` = significantly different from the baseline (first run) at ``alpha``; ``▲``/``▼`` = the
run's mean is higher/lower than the baseline's. Only significant differences are marked. When several runs are
tested against the baseline, the decision is made on Holm's adjusted p-value (``correction="holm"``, the default):
the family is the runs tested against the baseline on one measure (and one collection); the tables show the
adjusted p-values beside the means and say so.

``pairs="all"`` tests every pair of runs (a, b), a listed before b, with the same paired test: the family is then
every pair on one measure (and one collection), the marks against the first run are decided on those Holm-adjusted
p-values, and a pairwise section lists each pair's Δ = b − a, p and Holm p.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
from scipy import stats

from pretrieve.errors import ConfigError
from pretrieve.evaluation.metrics import EvalResult
from pretrieve.evaluation.significance import (DEFAULT_ALPHA, DEFAULT_PERMUTATIONS, TESTS, SignificanceResult,
                                               check_alpha, compare, holm_family)
from pretrieve.io_utils import atomic_open, write_json

if TYPE_CHECKING:
    import pandas

SIGNIFICANCE_MARK = "†"
UP, DOWN = "▲", "▼"
DIGITS = 4
_TEST_NAMES = {"ttest": "paired two-sided t-test", "permutation": "paired two-sided randomization test"}
CORRECTIONS = ("holm",)
PAIRS = ("baseline", "all")
#: The left-aligned key columns of a pairwise table: the measure and the pair (A, B).
PAIR_KEY_COLUMNS = 3


def format_value(value: float, digits: int = DIGITS) -> str:
    """A score with ``digits`` decimals; NaN/missing as an en dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def significance_mark(result: SignificanceResult | None) -> str:
    """``†▲`` / ``†▼`` for a significant difference, ``""`` otherwise."""
    if result is None or not result.significant:
        return ""
    return SIGNIFICANCE_MARK + (UP if result.direction > 0 else DOWN if result.direction < 0 else "")


class ShownTable:
    """How a table shows itself in a console and a notebook: its means grid (:meth:`grid`) and legend, never its
    fields (a dataclass repr with every per-query score ran to 11,000 characters)."""

    def grid(self, digits: int = DIGITS) -> tuple[list[str], list[list[str]]]:
        raise NotImplementedError

    def legend(self) -> str:
        return ""

    def __repr__(self) -> str:
        header, rows = self.grid()
        legend = self.legend()
        return markdown_table(header, rows) + ("\n" + legend if legend else "")

    def _repr_html_(self) -> str:
        header, rows = self.grid()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
        legend = self.legend()
        return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                + (f"<p><small>{html.escape(legend)}</small></p>" if legend else ""))


class WrittenTable(ShownTable):
    """``write``, shared by the tables that have ``to_dict(per_query=)`` and ``to_markdown()``."""

    def write(self, json_path: str | Path | None = None, md_path: str | Path | None = None,
              per_query: bool = False, metadata: Mapping[str, Any] | None = None) -> None:
        """Write the JSON and/or markdown forms (atomically); ``metadata`` is added to the JSON."""
        if json_path is not None:
            write_json(json_path, {**self.to_dict(per_query=per_query), **(metadata or {})})
        if md_path is not None:
            with atomic_open(md_path) as handle:
                handle.write(self.to_markdown())


@dataclass(repr=False)
class ResultsTable(WrittenTable):
    """Runs × measures on one collection, with each run's tests against the baseline (first run)."""

    results: dict[str, EvalResult]
    measures: list[str]
    test: str | None = "ttest"
    alpha: float = DEFAULT_ALPHA
    comparisons: dict[str, dict[str, SignificanceResult]] = field(default_factory=dict)
    correction: str | None = "holm"
    #: ``"baseline"``: each run tested against the first; ``"all"``: every pair, in :attr:`pairwise`.
    pairs: str = "baseline"
    #: ``pairwise[(a, b)][measure]``: ``b`` tested against ``a`` (a listed before b), with ``pairs="all"``.
    pairwise: dict[tuple[str, str], dict[str, SignificanceResult]] = field(default_factory=dict)

    @property
    def baseline(self) -> str:
        return next(iter(self.results))

    def value(self, run: str, measure: str) -> float:
        return self.results[run].aggregate[measure]

    def mark(self, run: str, measure: str) -> str:
        return significance_mark(self.comparisons.get(run, {}).get(measure))

    def cell(self, run: str, measure: str, digits: int = DIGITS) -> str:
        """``0.6521†▲``: the mean and its significance mark."""
        return format_value(self.value(run, measure), digits) + self.mark(run, measure)

    def p_value(self, run: str, measure: str) -> float:
        """The p-value ``run``'s mark is decided on (Holm's where adjusted); NaN for the baseline or untested."""
        result = self.comparisons.get(run, {}).get(measure)
        return result.decisive_p if result is not None else float("nan")

    def legend(self) -> str:
        """One sentence explaining the marks (empty when no test was run or there is one run)."""
        if not self.test or len(self.results) < 2:
            return ""
        if self.pairs == "all":
            n_pairs = len(self.pairwise)
            adjusted = (f", Holm-adjusted over all {n_pairs} pairs of runs on each measure"
                        if self.correction == "holm" and n_pairs > 1 else "")
            return (f"{SIGNIFICANCE_MARK} significantly different from '{self.baseline}' "
                    f"({_TEST_NAMES.get(self.test, self.test)} over the per-query scores{adjusted}, "
                    f"p ≤ {self.alpha:g}); {UP} higher, {DOWN} lower. Every pair of runs (A listed before B) is "
                    f"tested: Δ = B − A, {SIGNIFICANCE_MARK} where the p-value the decision is made on is "
                    f"≤ {self.alpha:g}.")
        tested = len(self.results) - 1
        adjusted = (f", Holm-adjusted over the {tested} runs tested against it on each measure"
                    if self.correction == "holm" and tested > 1 else "")
        return (f"{SIGNIFICANCE_MARK} significantly different from '{self.baseline}' "
                f"({_TEST_NAMES.get(self.test, self.test)} over the per-query scores{adjusted}, p ≤ {self.alpha:g}); "
                f"{UP} higher, {DOWN} lower.")

    def p_table(self) -> tuple[list[str], list[list[str]]]:
        """``(header, rows)`` of the p-values the marks are decided on: a column per tested run, a row per measure
        (empty without tests)."""
        if not self.test or len(self.results) < 2:
            return [], []
        label = "p (Holm)" if self.correction == "holm" and len(self.comparisons) > 1 else "p"
        header = [f"{label} vs {self.baseline}", *self.comparisons]
        return header, [[m, *(format_p(self.p_value(run, m)) for run in self.comparisons)] for m in self.measures]

    def pair_table(self, digits: int = DIGITS) -> tuple[list[str], list[list[str]]]:
        """``(header, rows)`` of the pairwise tests (``pairs="all"``): for each measure a row per pair (A, B) with
        Δ = B − A (``†`` where significant), the raw p and Holm's (the latter without a correction left out);
        empty otherwise."""
        if self.pairs != "all" or not self.pairwise:
            return [], []
        holm = self.correction == "holm"
        header = ["Measure", "A", "B", "Δ (B − A)", "p", *(["p (Holm)"] if holm else [])]
        rows = []
        for m in self.measures:
            for (a, b), tests in self.pairwise.items():
                result = tests[m]
                delta = self.value(b, m) - self.value(a, m)
                mark = SIGNIFICANCE_MARK if result.significant else ""
                rows.append([m, a, b, f"{delta:+.{digits}f}{mark}", format_p(result.p_value),
                             *([format_p(result.p_holm)] if holm else [])])
        return header, rows

    def tests_section(self, digits: int = DIGITS) -> tuple[str, list[str], list[list[str]], int]:
        """The tests shown below the means, as ``(title, header, rows, key_columns)``: with ``pairs="all"`` the
        pairwise tests (:meth:`pair_table`, titled, its first :data:`PAIR_KEY_COLUMNS` columns naming the measure
        and the pair), else the p-values against the baseline (:meth:`p_table`, untitled, one key column); no
        rows when nothing was tested."""
        if self.pairs == "all":
            return ("Pairwise tests", *self.pair_table(digits), PAIR_KEY_COLUMNS)
        return ("", *self.p_table(), 1)

    def grid(self, digits: int = DIGITS) -> tuple[list[str], list[list[str]]]:
        """``(header, rows)`` of the means: a row per run, a column per measure (cells with their marks)."""
        return ["Run", *self.measures], [[run, *(self.cell(run, m, digits) for m in self.measures)]
                                         for run in self.results]

    def note(self) -> str:
        n_queries = sorted({result.n_queries for result in self.results.values()})
        return f"Means over {', '.join(map(str, n_queries))} queries."

    def __repr__(self) -> str:
        header, rows = self.grid()
        legend = self.legend()
        return markdown_table(header, rows, align=["l"] + ["r"] * len(self.measures)) + "\n" + self.note() + (
            " " + legend if legend else "")

    def to_pandas(self, per_query: bool = False) -> "pandas.DataFrame":
        """The means as a DataFrame (index ``run``, a column per measure, floats); ``per_query=True``: one row per
        run and query (columns ``run``, ``query``, then a column per measure)."""
        import pandas  # lazy: pandas

        if per_query:
            rows = [{"run": run, "query": query, **{m: result.per_query[m][query] for m in self.measures}}
                    for run, result in self.results.items() for query in result.per_query[self.measures[0]]]
            return pandas.DataFrame(rows, columns=["run", "query", *self.measures])
        frame = pandas.DataFrame([[self.value(run, m) for m in self.measures] for run in self.results],
                                 index=pandas.Index(list(self.results), name="run"), columns=list(self.measures))
        return frame

    def to_markdown(self, digits: int = DIGITS) -> str:
        """A GitHub-flavoured markdown table, with the legend below it (and the p-values, when tested)."""
        header, rows = self.grid(digits)
        text = markdown_table(header, rows, align=["l"] + ["r"] * len(self.measures))
        legend = self.legend()
        text += "\n" + self.note() + (" " + legend if legend else "") + "\n"
        title, p_header, p_rows, keys = self.tests_section(digits)
        if p_rows:
            if title:
                text += f"\n{title}:\n"
            text += "\n" + markdown_table(p_header, p_rows, align=["l"] * keys + ["r"] * (len(p_header) - keys))
        return text

    def to_dict(self, per_query: bool = False) -> dict[str, Any]:
        """Everything: means, query counts, test results against the baseline, per-query scores if asked."""
        runs = []
        for name, result in self.results.items():
            entry = {"name": name, **result.to_dict(per_query=per_query)}
            if name in self.comparisons:
                entry["significance"] = {m: r.to_dict() for m, r in self.comparisons[name].items()}
            runs.append(entry)
        out = {"measures": list(self.measures), "baseline": self.baseline, "test": self.test,
               "correction": self.correction if self.test else None, "alpha": self.alpha, "runs": runs}
        if self.pairs == "all":   # the default ("baseline") keeps the dict as it always was
            out["pairs"] = "all"
            out["pairwise"] = [{"a": a, "b": b, "significance": {m: r.to_dict() for m, r in tests.items()}}
                               for (a, b), tests in self.pairwise.items()]
        return out


def build_table(results: Mapping[str, EvalResult], measures: Sequence[str] | None = None,
                test: str | None = "ttest", alpha: float = DEFAULT_ALPHA,
                n_permutations: int = DEFAULT_PERMUTATIONS, seed: int = 0,
                correction: str | None = "holm", pairs: str = "baseline") -> ResultsTable:
    """Tabulate ``{run_name: EvalResult}`` (first = baseline) and test every other run against it.

    ``measures`` defaults to the first run's measures; ``test`` is ``"ttest"``, ``"permutation"`` or
    ``None`` (no tests, no marks); ``correction``: ``"holm"`` (the p-values of the runs tested against the baseline
    on one measure adjusted together, the marks decided on them) or ``None`` (each test at ``alpha`` alone).
    ``pairs="all"``: every pair of runs (a, b), a listed before b, tested (``b`` against ``a``), the Holm family
    being all the pairs on one measure; the marks against the first run are decided on those pairs' p-values.
    """
    if not results:
        raise ConfigError("no runs to tabulate")
    if test is not None and test not in TESTS:
        raise ConfigError(f"unknown significance test '{test}' (choose from {', '.join(TESTS)})")
    if correction is not None and correction not in CORRECTIONS:
        raise ConfigError(f"unknown correction '{correction}' (choose from {', '.join(CORRECTIONS)} or none)")
    if pairs not in PAIRS:
        raise ConfigError(f"unknown pairs '{pairs}' (choose from {', '.join(PAIRS)})")
    if pairs == "all" and test is None:
        raise ConfigError("pairs 'all' tests every pair of runs: choose a significance test (not none)")
    check_alpha(alpha)
    results = dict(results)
    measures = list(measures) if measures is not None else list(next(iter(results.values())).measures)
    for name, result in results.items():
        absent = [m for m in measures if m not in result.aggregate]
        if absent:
            raise ConfigError(f"run '{name}' has no score for {', '.join(absent)}")
    table = ResultsTable(results, measures, test=test, alpha=alpha, correction=correction, pairs=pairs)
    if pairs == "all":
        names = list(results)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                table.pairwise[(a, b)] = {m: compare(results[a], results[b], m, test=test, alpha=alpha,
                                                     n_permutations=n_permutations, seed=seed) for m in measures}
        if correction == "holm":
            _holm_per_measure(table.pairwise, measures)
        table.comparisons = {b: tests for (a, b), tests in table.pairwise.items() if a == table.baseline}
    elif test is not None:
        baseline = results[table.baseline]
        for name, result in list(results.items())[1:]:
            table.comparisons[name] = {m: compare(baseline, result, m, test=test, alpha=alpha,
                                                  n_permutations=n_permutations, seed=seed) for m in measures}
        if correction == "holm":
            _holm_per_measure(table.comparisons, measures)
    return table


def _holm_per_measure(tests: dict, measures: Sequence[str]) -> None:
    """Replace each test of ``tests`` (``{key: {measure: SignificanceResult}}``) by its Holm-adjusted copy, one
    family per measure over every key."""
    for m in measures:
        for key, result in zip(tests, holm_family([tests[key][m] for key in tests])):
            tests[key][m] = result


def format_p(p: float) -> str:
    """A p-value with 3 significant digits (``<0.001`` below); NaN as an en dash."""
    if p is None or math.isnan(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None) -> str:
    """Render a markdown table; ``align`` holds ``"l"``/``"r"`` per column."""
    align = list(align) if align is not None else ["l"] * len(header)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = [_md_row(header), _md_row(rule)] + [_md_row(row) for row in rows]
    return "\n".join(lines) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


@dataclass(repr=False)
class BeirTable(ShownTable):
    """Runs × (collection × measure) with the per-measure average over collections (BEIR-style).

    ``values[run][(collection, measure)]`` is NaN where a run lacks a collection; such a run's average
    is NaN too (an average over a subset would not be comparable).
    """

    runs: list[str]
    collections: list[str]
    measures: list[str]
    values: dict[str, dict[tuple[str, str], float]]

    def average(self, run: str, measure: str) -> float:
        """Unweighted mean over collections, as the BEIR paper reports it."""
        scores = [self.values[run][(c, measure)] for c in self.collections]
        return float("nan") if any(math.isnan(s) for s in scores) else math.fsum(scores) / len(scores)

    def columns(self) -> list[tuple[str, str]]:
        return [(c, m) for c in self.collections for m in self.measures]

    def _label(self, collection: str, measure: str) -> str:
        return collection if len(self.measures) == 1 else f"{collection} {measure}"

    def grid(self, digits: int = DIGITS) -> tuple[list[str], list[list[str]]]:
        """``(header, rows)``: a row per run, a column per collection × measure, then the averages."""
        columns = self.columns() + [("Avg", m) for m in self.measures]
        rows = [[run, *(format_value(self.values[run][col], digits) for col in self.columns()),
                 *(format_value(self.average(run, m), digits) for m in self.measures)] for run in self.runs]
        return ["Run", *(self._label(c, m) for c, m in columns)], rows

    def to_pandas(self) -> "pandas.DataFrame":
        """A DataFrame: index ``run``, columns ``(collection, measure)`` with ``("Average", measure)`` last."""
        import pandas  # lazy: pandas

        columns = self.columns() + [("Average", m) for m in self.measures]
        data = [[self.values[run][col] for col in self.columns()] + [self.average(run, m) for m in self.measures]
                for run in self.runs]
        return pandas.DataFrame(data, index=pandas.Index(list(self.runs), name="run"),
                                columns=pandas.MultiIndex.from_tuples(columns, names=["collection", "measure"]))

    def to_markdown(self, digits: int = DIGITS, bold_best: bool = True) -> str:
        """Markdown table; the best value of each column is bold (as in the papers) when ``bold_best``."""
        columns = self.columns() + [("Avg", m) for m in self.measures]
        grid = {run: [self.values[run][col] for col in self.columns()] + [self.average(run, m) for m in self.measures]
                for run in self.runs}
        best = [max((grid[run][j] for run in self.runs if not math.isnan(grid[run][j])), default=float("nan"))
                for j in range(len(columns))]
        rows = []
        for run in self.runs:
            cells = []
            for j, value in enumerate(grid[run]):
                text = format_value(value, digits)
                is_best = bold_best and len(self.runs) > 1 and not math.isnan(value) and value == best[j]
                cells.append(f"**{text}**" if is_best else text)
            rows.append([run, *cells])
        header = ["Run", *(self._label(c, m) for c, m in columns)]
        return markdown_table(header, rows, align=["l"] + ["r"] * len(columns))

    def to_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "collections": list(self.collections), "measures": list(self.measures),
            "runs": [{"name": run,
                      "scores": {c: {m: clean(self.values[run][(c, m)]) for m in self.measures}
                                 for c in self.collections},
                      "average": {m: clean(self.average(run, m)) for m in self.measures}}
                     for run in self.runs],
        }


def beir_table(results: Mapping[str, Mapping[str, EvalResult]], measure: str | Sequence[str] = "nDCG@10") -> BeirTable:
    """Build a multi-collection table from ``{run_name: {collection: EvalResult}}``.

    Collections appear in order of first appearance; ``measure`` may be one name or several.
    """
    measures = [measure] if isinstance(measure, str) else list(measure)
    if not results:
        raise ConfigError("no runs to tabulate")
    collections = list(dict.fromkeys(c for per_collection in results.values() for c in per_collection))
    values: dict[str, dict[tuple[str, str], float]] = {}
    for run, per_collection in results.items():
        values[run] = {}
        for collection in collections:
            result = per_collection.get(collection)
            for m in measures:
                if result is not None and m not in result.aggregate:
                    raise ConfigError(f"run '{run}' on '{collection}' has no score for '{m}' "
                                      f"(have: {', '.join(result.aggregate)})")
                values[run][(collection, m)] = result.aggregate[m] if result is not None else float("nan")
    return BeirTable(list(results), collections, measures, values)


@dataclass(repr=False)
class CollectionsTable(WrittenTable):
    """Several runs (models) on several collections, BEIR-style: one row per collection and the average row, one
    column per run and measure — each later run's mark and Holm-adjusted p-value against the first run on that
    collection beside its mean (``tables``: the per-collection :class:`ResultsTable`, with the tests)."""

    beir: BeirTable
    tables: dict[str, ResultsTable]

    @property
    def baseline(self) -> str:
        return self.beir.runs[0]

    def grid(self, digits: int = DIGITS) -> tuple[list[str], list[list[str]]]:
        """``(header, rows)``: a row per collection, then ``Average`` (the unweighted mean over the collections)."""
        beir, tested = self.beir, self.test is not None and len(self.beir.runs) > 1
        header, rows = ["Collection"], [[c] for c in beir.collections] + [["Average"]]
        for m in beir.measures:
            for run in beir.runs:
                header.append(run if len(beir.measures) == 1 else f"{run} {m}")
                if tested and run != self.baseline:
                    header.append("p")
                for row, c in zip(rows, beir.collections):
                    table = self.tables[c]
                    present = run in table.results
                    row.append(table.cell(run, m, digits) if present else "–")
                    if tested and run != self.baseline:
                        row.append(format_p(table.p_value(run, m)) if present else "–")
                rows[-1].append(format_value(beir.average(run, m), digits))
                if tested and run != self.baseline:
                    rows[-1].append(format_p(self.average_p(run, m)))
        return header, rows

    def average_p(self, run: str, measure: str) -> float:
        """The test on the average: a paired two-sided t-test of ``run`` against the baseline over the collections,
        each collection's mean one observation (NaN with fewer than two collections both were scored on, or when
        every difference is the same)."""
        pairs = [(self.beir.values[run][(c, measure)], self.beir.values[self.baseline][(c, measure)])
                 for c in self.beir.collections]
        pairs = [(a, b) for a, b in pairs if not (np.isnan(a) or np.isnan(b))]
        differences = np.array([a - b for a, b in pairs])
        if len(pairs) < 2 or np.allclose(differences, differences[0]):
            return float("nan")
        return float(stats.ttest_rel([a for a, _ in pairs], [b for _, b in pairs]).pvalue)

    @property
    def test(self) -> str | None:
        return next(iter(self.tables.values())).test

    def legend(self) -> str:
        """What the rows, the average and the marks are."""
        first = next(iter(self.tables.values()))
        text = f"Average: the unweighted mean over the {len(self.beir.collections)} collections."
        if self.test and len(self.beir.runs) > 1:
            n_runs = len(self.beir.runs)
            if first.pairs == "all":
                adjusted = (f", Holm-adjusted over all {n_runs * (n_runs - 1) // 2} pairs of runs on each collection "
                            "and measure" if first.correction == "holm" and n_runs > 2 else "")
            else:
                adjusted = (f", Holm-adjusted over the {n_runs - 1} runs tested against it on each collection "
                            "and measure" if first.correction == "holm" and n_runs > 2 else "")
            text += (f" {SIGNIFICANCE_MARK} significantly different from '{self.baseline}' on that collection "
                     f"({_TEST_NAMES.get(self.test, self.test)} over the per-query scores{adjusted}, "
                     f"p ≤ {first.alpha:g}); {UP} higher, {DOWN} lower; p: the p-value the mark is decided on.")
            if len(self.beir.collections) > 1:
                text += (f" Average p: paired t-test against '{self.baseline}' over the {len(self.beir.collections)} "
                         "collections (each collection's mean one observation; not corrected).")
            if first.pairs == "all":
                text += (" Pairwise tests: every pair of runs (A listed before B) on each collection, Δ = B − A, "
                         f"{SIGNIFICANCE_MARK} where the p-value the decision is made on is ≤ {first.alpha:g}.")
        return text

    def to_pandas(self, per_query: bool = False) -> "pandas.DataFrame":
        """The means as :meth:`BeirTable.to_pandas`; ``per_query=True``: every collection's per-query rows
        (:meth:`ResultsTable.to_pandas`) with a ``collection`` column first."""
        import pandas  # lazy: pandas

        if not per_query:
            return self.beir.to_pandas()
        return pandas.concat([table.to_pandas(per_query=True).assign(collection=c)[
            ["collection", "run", "query", *table.measures]] for c, table in self.tables.items()], ignore_index=True)

    def pair_tables(self, digits: int = DIGITS) -> dict[str, tuple[list[str], list[list[str]]]]:
        """Each collection's pairwise section (:meth:`ResultsTable.pair_table`; ``pairs="all"`` only)."""
        sections = {c: table.pair_table(digits) for c, table in self.tables.items()}
        return {c: section for c, section in sections.items() if section[1]}

    def to_markdown(self, digits: int = DIGITS) -> str:
        header, rows = self.grid(digits)
        text = markdown_table(header, rows, align=["l"] + ["r"] * (len(header) - 1)) + "\n" + self.legend() + "\n"
        for collection, (p_header, p_rows) in self.pair_tables(digits).items():
            text += (f"\nPairwise tests on {collection}:\n\n"
                     + markdown_table(p_header, p_rows, align=["l"] * PAIR_KEY_COLUMNS
                                      + ["r"] * (len(p_header) - PAIR_KEY_COLUMNS)))
        return text

    def to_dict(self, per_query: bool = False) -> dict[str, Any]:
        """The BEIR table (scores and averages) and, per collection, the :class:`ResultsTable` with its tests."""
        def clean(x: float) -> float | None:
            return None if x != x else x

        average_tests = {run: {m: clean(self.average_p(run, m)) for m in self.beir.measures}
                         for run in self.beir.runs[1:]} if self.test else {}
        return {**self.beir.to_dict(), "baseline": self.baseline, "average_p": average_tests,
                "per_collection": {c: table.to_dict(per_query=per_query) for c, table in self.tables.items()}}


def collections_table(results: Mapping[str, Mapping[str, EvalResult]], measures: str | Sequence[str],
                      test: str | None = "ttest", alpha: float = DEFAULT_ALPHA,
                      n_permutations: int = DEFAULT_PERMUTATIONS, seed: int = 0,
                      correction: str | None = "holm", pairs: str = "baseline") -> CollectionsTable:
    """Tabulate ``{run: {collection: EvalResult}}`` (the first run is the baseline): the BEIR table of ``measures``
    (:func:`beir_table`) and each collection's :func:`build_table` (tests against the baseline, ``correction``;
    ``pairs="all"``: every pair of runs on each collection)."""
    beir = beir_table(results, measures)
    tables = {c: build_table({run: per[c] for run, per in results.items() if c in per}, beir.measures, test=test,
                             alpha=alpha, n_permutations=n_permutations, seed=seed, correction=correction,
                             pairs=pairs)
              for c in beir.collections}
    return CollectionsTable(beir, tables)
