"""``pretrieve evaluate``: score TREC runs against qrels and print one row per run.

Thin: it resolves the qrels (a file, or a BEIR collection + split), reads the runs, and hands them to
:mod:`pretrieve.evaluation`. The table is printed with rich (significance marks against the first
run); ``--json`` / ``--md`` write the same table to files.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pretrieve.cli import app
from pretrieve.cli import console as err_console
from pretrieve.errors import ConfigError

# Kept in sync with pretrieve.evaluation.metrics.DEFAULT_MEASURES (not imported, so that `--help` stays fast).
_DEFAULT_MEASURES = "MRR@10,R@5,R@20,R@50,R@100,R@1000,nDCG@10,nDCG@100,MAP"


class SignificanceTest(str, Enum):
    ttest = "ttest"
    permutation = "permutation"
    none = "none"


class MissingQueries(str, Enum):
    ignore = "ignore"
    zero = "zero"


@app.command("evaluate")
def evaluate_command(
    runs: Annotated[list[Path], typer.Argument(help="TREC run files; the first is the baseline for significance marks.",
                                               metavar="RUN", show_default=False)],
    qrels: Annotated[Optional[Path], typer.Option("--qrels", help="Qrels file (BEIR TSV or TREC format).")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help="BEIR collection directory or a known collection "
                                                "name; uses qrels/<split>.tsv (instead of --qrels).")] = None,
    split: Annotated[str, typer.Option("--split", help="Qrels split of --data.")] = "test",
    measures: Annotated[str, typer.Option("--measures", help="Comma-separated ir_measures names, e.g. "
                                          "nDCG@10,MRR@10,R@100,MAP.")] = _DEFAULT_MEASURES,
    names: Annotated[Optional[str], typer.Option("--names", help="Comma-separated run names "
                                                 "(default: file names without extension).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results (and p-values) as JSON.")] = None,
    md_path: Annotated[Optional[Path], typer.Option("--md", help="Write the table as markdown.")] = None,
    per_query: Annotated[bool, typer.Option("--per-query", help="Include per-query scores in the JSON.")] = False,
    test: Annotated[SignificanceTest, typer.Option("--test", help="Paired significance test against the first run.")]
        = SignificanceTest.ttest,
    alpha: Annotated[float, typer.Option("--alpha", help="Significance level (p ≤ alpha is marked).")] = 0.05,
    permutations: Annotated[int, typer.Option("--permutations", help="Random sign flips of the permutation test.")]
        = 10_000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the permutation test.")] = 0,
    missing: Annotated[MissingQueries, typer.Option("--missing", help="Judged queries absent from a run: score "
                                                    "them 'zero' (trec_eval -c; every row over the same queries) or "
                                                    "'ignore' them (answered queries only, as pytrec_eval/BEIR).")]
        = MissingQueries.zero,
    ignore_identical_ids: Annotated[bool, typer.Option("--ignore-identical-ids", help="Drop documents whose id equals "
                                                       "the query id (BEIR's option for ArguAna/Quora).")] = False,
) -> None:
    """Evaluate runs against qrels: one row per run, marks for significant differences from the first run."""
    from pretrieve.data.beir import load_qrels
    from pretrieve.data.collection import BeirCollection
    from pretrieve.data.registry import resolve_collection
    from pretrieve.data.trec import read_run
    from pretrieve.evaluation import RunEvaluator, build_table

    if (qrels is None) == (data is None):
        raise ConfigError("give exactly one of --qrels FILE or --data DIR (with --split)")
    if per_query and json_path is None:
        raise ConfigError("--per-query adds per-query scores to the JSON output: give --json FILE too")
    run_names = _run_names(runs, names)
    qrels_path = qrels if qrels is not None else BeirCollection(resolve_collection(data)).qrels_path(split)
    judgments = load_qrels(qrels_path)
    evaluator = RunEvaluator(judgments, measures, missing=missing.value, ignore_identical_ids=ignore_identical_ids)
    results = {}
    for name, path in zip(run_names, runs):
        results[name] = evaluator(read_run(path), name=str(path))
        _note_missing(name, results[name])
    table = build_table(results, test=None if test is SignificanceTest.none else test.value, alpha=alpha,
                        n_permutations=permutations, seed=seed)
    _print_table(table)
    metadata = {"qrels": str(qrels_path), "run_files": {name: str(path) for name, path in zip(run_names, runs)},
                "provenance": _provenance()}
    table.write(json_path=json_path, md_path=md_path, per_query=per_query, metadata=metadata)
    for path in (json_path, md_path):
        if path is not None:
            err_console.print(f"wrote {path}", highlight=False, markup=False)


def _run_names(runs: list[Path], names: str | None) -> list[str]:
    """Names given with --names, else file names without (``.gz`` and) extension; must be unique."""
    if names is not None:
        given = [n.strip() for n in names.split(",")]
        if len(given) != len(runs) or not all(given):
            raise ConfigError(f"--names needs one non-empty name per run: got {len(given)} names for {len(runs)} runs")
    else:
        given = [Path(p.name.removesuffix(".gz")).stem for p in runs]
    duplicates = sorted({n for n in given if given.count(n) > 1})
    if duplicates:
        raise ConfigError(f"run name(s) {', '.join(duplicates)} used twice; name the runs with --names")
    return given


def _note_missing(name: str, result) -> None:
    if result.missing_queries:
        treatment = "ignored" if result.missing == "ignore" else "scored 0"
        err_console.print(f"note: run '{name}' has no results for {len(result.missing_queries)} of "
                          f"{len(result.judged_queries)} judged queries ({treatment}; see --missing)",
                          highlight=False, markup=False)


def _print_table(table) -> None:
    rich_table = Table(show_edge=False)
    rich_table.add_column("Run", no_wrap=True)
    for measure in table.measures:
        rich_table.add_column(measure, justify="right", no_wrap=True)
    for run in table.results:
        cells = []
        for measure in table.measures:
            mark = table.mark(run, measure)
            style = "green" if mark.endswith("▲") else "red" if mark.endswith("▼") else ""
            cells.append(Text(f"{table.value(run, measure):.4f}") + Text(mark, style=style))
        rich_table.add_row(Text(run), *cells)
    out = Console()
    width = out.measure(rich_table, options=out.options.update_width(10_000)).maximum
    if width > out.width:
        out = Console(width=width)  # never truncate scores: a narrow terminal wraps the lines instead
    out.print(rich_table)
    n_queries = sorted({r.n_queries for r in table.results.values()})
    legend = table.legend()
    out.print(f"Means over {', '.join(map(str, n_queries))} queries." + (" " + legend if legend else ""),
              highlight=False, markup=False)


def _provenance() -> dict:
    from importlib import metadata

    from pretrieve.provenance import provenance

    try:
        extra = {"pytrec_eval": metadata.version("pytrec-eval-terrier")}
    except metadata.PackageNotFoundError:
        extra = {}
    return provenance(extra)
