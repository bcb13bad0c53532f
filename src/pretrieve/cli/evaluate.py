"""``pretrieve evaluate``: score TREC runs against qrels and print one row per run — or evaluate models.

Thin: it resolves the qrels (a file, or a BEIR collection + split), reads the runs, and hands them to
:mod:`pretrieve.evaluation`. The table is printed with rich (significance marks against the first
run, Holm-adjusted when several runs are tested); ``--json`` / ``--md`` write the same table to files.

With ``--model`` (repeated) instead of run files, each model (``bm25``, a pretrieve checkpoint, any
sentence-transformers model) searches every collection of ``--data`` (comma-separated) and the BEIR-style table is
printed — a row per collection and the average, a column per model — through :func:`pretrieve.api.evaluate`, the
one implementation of the Python API's ``evaluate(models=...)``; ``--out`` keeps the runs (reused while current),
``results.md`` and ``results.json``.
"""

from __future__ import annotations

from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pretrieve.api import MODEL_MEASURES, baseline_first, evaluate
from pretrieve.cli.root import app
from pretrieve.cli.root import console as err_console
from pretrieve.data.beir import load_qrels
from pretrieve.data.collection import BeirCollection
from pretrieve.data.registry import resolve_collection
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError
from pretrieve.outputs import preflight, refuse_existing, write_failures
from pretrieve.provenance import provenance

# Kept in sync with pretrieve.evaluation.metrics.DEFAULT_MEASURES (not imported, so that `--help` stays fast).
_DEFAULT_MEASURES = "MRR@10,R@5,R@20,R@50,R@100,R@1000,nDCG@10,nDCG@100,MAP"


class SignificanceTest(str, Enum):
    ttest = "ttest"
    permutation = "permutation"
    none = "none"


class Correction(str, Enum):
    holm = "holm"
    none = "none"


class Pairs(str, Enum):
    baseline = "baseline"
    all = "all"


class MissingQueries(str, Enum):
    ignore = "ignore"
    zero = "zero"


@app.command("evaluate")
def evaluate_command(
    runs: Annotated[Optional[list[Path]], typer.Argument(help="TREC run files; the first is the baseline for "
                                                         "significance marks.", metavar="[RUN]...",
                                                         show_default=False)] = None,
    models: Annotated[Optional[list[str]], typer.Option("--model", help="Instead of RUN files: a model to evaluate "
                                                        "on every --data collection (repeat it; the first is the "
                                                        "baseline): bm25, a pretrieve checkpoint or exported "
                                                        "directory, any sentence-transformers model (path, offline "
                                                        "alias such as minilm, hub name).", show_default=False)]
        = None,
    qrels: Annotated[Optional[Path], typer.Option("--qrels", help="Qrels file (BEIR TSV or TREC format).")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help="BEIR collection directory or a known collection "
                                                "name; uses qrels/<split>.tsv (instead of --qrels). With --model: "
                                                "one or more, comma-separated.")] = None,
    split: Annotated[str, typer.Option("--split", help="Qrels split of --data.")] = "test",
    measures: Annotated[Optional[str], typer.Option("--measures", help="Comma-separated ir_measures names, e.g. "
                                                    f"nDCG@10,MRR@10,R@100,MAP (default: {_DEFAULT_MEASURES}; with "
                                                    f"--model: {MODEL_MEASURES}), and with --data answer accuracy "
                                                    "Acc@k (DPR's top-k accuracy: a passage of the top k contains "
                                                    "an answer of answers/SPLIT.jsonl; the default of a split "
                                                    "judged by answers only: Acc@5,Acc@20,Acc@100)",
                                          show_default=False)] = None,
    names: Annotated[Optional[str], typer.Option("--names", help="Comma-separated run (or model) names "
                                                 "(default: file names without extension; a model's last path "
                                                 "part).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="With --model: where the runs are kept (reused while "
                                                "current), with results.md and results.json (default: a temporary "
                                                "directory, nothing kept).")] = None,
    depth: Annotated[int, typer.Option("--depth", help="With --model: passages retrieved per query.", min=1)] = 1000,
    precision: Annotated[str, typer.Option("--precision", help="With --model: precision of the encoders "
                                           "(auto, fp32, bf16, fp16, int8).")] = "auto",
    batch_size: Annotated[int, typer.Option("--batch-size", help="With --model: texts per forward pass.", min=1)]
        = 64,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results (and p-values) as JSON.")] = None,
    md_path: Annotated[Optional[Path], typer.Option("--md", help="Write the table as markdown.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --json/--md file (refused "
                                            "otherwise).")] = False,
    per_query: Annotated[bool, typer.Option("--per-query", help="Include per-query scores in the JSON.")] = False,
    test: Annotated[SignificanceTest, typer.Option("--test", help="Paired significance test against the baseline "
                                                   "(--baseline; default: the first run).")]
        = SignificanceTest.ttest,
    alpha: Annotated[float, typer.Option("--alpha", help="Significance level (p ≤ alpha is marked).")] = 0.05,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="The run (or model) the others are tested "
                                                    "against, by name; default: the first.")] = None,
    permutations: Annotated[int, typer.Option("--permutations", help="Random sign flips of the permutation test.")]
        = 10_000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the permutation test.")] = 0,
    correction: Annotated[Correction, typer.Option("--correction", help="Multiple comparisons: 'holm' adjusts the "
                                                   "p-values of the runs tested against the first (per measure, and "
                                                   "per collection) together; 'none' tests each alone.")]
        = Correction.holm,
    pairs: Annotated[Pairs, typer.Option("--pairs", help="Which runs are tested: 'baseline' tests each against the "
                                         "baseline; 'all' tests every pair (A listed before B), Holm over all the "
                                         "pairs per measure, and prints a pairwise table (Δ = B − A, p, Holm p).")]
        = Pairs.baseline,
    missing: Annotated[MissingQueries, typer.Option("--missing", help="Judged queries absent from a run: score "
                                                    "them 'zero' (trec_eval -c; every row over the same queries) or "
                                                    "'ignore' them (answered queries only, as pytrec_eval/BEIR).")]
        = MissingQueries.zero,
    ignore_identical_ids: Annotated[bool, typer.Option("--ignore-identical-ids", help="Drop documents whose id equals "
                                                       "the query id (BEIR's option for ArguAna/Quora).")] = False,
) -> None:
    """Evaluate runs against qrels (one row per run), or models on collections (--model; a row per collection):
    marks for significant differences from the first."""
    from pretrieve.evaluation import RunEvaluator, build_table   # lazy: scipy

    if per_query and json_path is None:
        raise ConfigError("--per-query adds per-query scores to the JSON output: give --json FILE too")
    for path in (json_path, md_path):   # a file there, or a place that cannot be written: said before the work
        if path is not None:
            refuse_existing(path, overwrite)
            preflight(path)
    test_name = None if test is SignificanceTest.none else test.value
    chosen_correction = None if correction is Correction.none else correction.value
    if models:
        _evaluate_models(runs or [], models, data, qrels, names, out, split, measures, test_name, alpha,
                         chosen_correction, missing.value, ignore_identical_ids, depth, precision, batch_size,
                         json_path, md_path, per_query, baseline, pairs.value)
        return
    if not runs:
        raise ConfigError("give the RUN files to evaluate, or models with --model")
    if out is not None:
        raise ConfigError("--out keeps the runs of --model; with RUN files use --json/--md")
    if (qrels is None) == (data is None):
        raise ConfigError("give exactly one of --qrels FILE or --data DIR (with --split)")
    run_names = _run_names(runs, names)
    if qrels is not None:
        qrels_path = qrels
        evaluator = RunEvaluator(load_qrels(qrels_path), measures or _DEFAULT_MEASURES, missing=missing.value,
                                 ignore_identical_ids=ignore_identical_ids)
    else:   # qrels measures and answer accuracy (Acc@k) of the collection's split
        from pretrieve.evaluation.answers import split_evaluator   # lazy: scipy

        collection = BeirCollection(resolve_collection(data))
        qrels_path = collection.qrels_path(split)
        evaluator = split_evaluator(collection, split, measures, default=_DEFAULT_MEASURES, missing=missing.value,
                                    ignore_identical_ids=ignore_identical_ids)
    results = {}
    for name, path in zip(run_names, runs):
        results[name] = evaluator(read_run(path), name=str(path))
        _note_missing(name, results[name])
    table = build_table(baseline_first(results, baseline, "--baseline"), test=test_name, alpha=alpha,
                        n_permutations=permutations, seed=seed, correction=chosen_correction, pairs=pairs.value)
    _print_table(table)
    metadata = {"qrels": str(qrels_path), "run_files": {name: str(path) for name, path in zip(run_names, runs)},
                "provenance": _provenance()}
    _write(table, json_path, md_path, per_query, metadata)


def _evaluate_models(runs: list[Path], models: list[str], data: str | None, qrels: Path | None, names: str | None,
                     out: Path | None, split: str, measures: str | None, test: str | None, alpha: float,
                     correction: str | None, missing: str, ignore_identical_ids: bool, depth: int, precision: str,
                     batch_size: int, json_path: Path | None, md_path: Path | None, per_query: bool,
                     baseline: str | None = None, pairs: str = "baseline") -> None:
    """``--model``: every model on every --data collection (:func:`pretrieve.api.evaluate`), the table printed."""
    if runs:
        raise ConfigError("give either RUN files or --model, not both")
    if qrels is not None or data is None:
        raise ConfigError("--model evaluates on collections: give --data NAME[,NAME...] (not --qrels)")
    if names is not None:
        given = [n.strip() for n in names.split(",")]
        if len(given) != len(models):
            raise ConfigError(f"--names needs one name per --model: got {len(given)} names for {len(models)} models")
        if len(set(given)) != len(given):
            raise ConfigError("--names: a name is used twice")
        chosen: list[str] | dict[str, str] = dict(zip(given, models))
    else:
        chosen = models
    table = evaluate(models=chosen, data=data, out=out, split=split, measures=measures, test=test, alpha=alpha,
                     correction=correction, missing=missing, ignore_identical_ids=ignore_identical_ids, depth=depth,
                     precision=precision, batch_size=batch_size, show_progress=True, baseline=baseline, pairs=pairs)
    header, rows = table.grid()
    out_console = _print_grid(header, rows, table.legend())
    from pretrieve.evaluation.report import PAIR_KEY_COLUMNS  # lazy: scipy
    for collection, (p_header, p_rows) in table.pair_tables().items():
        out_console.print(f"\nPairwise tests on {collection}:", highlight=False, markup=False)
        _print_grid(p_header, p_rows, "", out_console, left=PAIR_KEY_COLUMNS)
    _write(table, json_path, md_path, per_query)
    for path in ((out / "results.md", out / "results.json") if out is not None else ()):
        err_console.print(f"wrote {path}", highlight=False, markup=False)


def _write(table, json_path: Path | None, md_path: Path | None, per_query: bool, metadata: dict | None = None) -> None:
    """``--json`` / ``--md``: each file written (a full disk: one line naming that file), then said."""
    if json_path is not None:
        with write_failures(json_path):
            table.write(json_path=json_path, per_query=per_query, metadata=metadata)
        err_console.print(f"wrote {json_path}", highlight=False, markup=False)
    if md_path is not None:
        with write_failures(md_path):
            table.write(md_path=md_path)
        err_console.print(f"wrote {md_path}", highlight=False, markup=False)


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
    header = ["Run", *table.measures]
    rows = [[run, *(table.cell(run, measure) for measure in table.measures)] for run in table.results]
    n_queries = sorted({r.n_queries for r in table.results.values()})
    legend = table.legend()
    out = _print_grid(header, rows, f"Means over {', '.join(map(str, n_queries))} queries." +
                      (" " + legend if legend else ""))
    title, p_header, p_rows, keys = table.tests_section()
    if p_rows:
        if title:
            out.print(f"\n{title}:", highlight=False, markup=False)
        _print_grid(p_header, p_rows, "", out, left=keys)


def _print_grid(header: list[str], rows: list[list[str]], legend: str, out: Console | None = None,
                left: int = 1) -> Console:
    """A table (the first ``left`` columns left-aligned, the others right-aligned, ▲ green and ▼ red) and a legend
    below."""
    rich_table = Table(show_edge=False)
    for index, name in enumerate(header):
        rich_table.add_column(name, justify="left" if index < left else "right", no_wrap=True)
    for row in rows:
        cells = [Text(cell) for cell in row[:left]]
        for cell in row[left:]:
            mark = cell.lstrip("0123456789.–-")
            style = "green" if mark.endswith("▲") else "red" if mark.endswith("▼") else ""
            cells.append(Text(cell[:len(cell) - len(mark)]) + Text(mark, style=style))
        rich_table.add_row(*cells)
    if out is None:
        out = Console(emoji=False)
        width = out.measure(rich_table, options=out.options.update_width(10_000)).maximum
        if width > out.width:
            out = Console(width=width, emoji=False)  # never truncate scores: a narrow terminal wraps the lines instead
    out.print(rich_table)
    if legend:
        out.print(legend, highlight=False, markup=False)
    return out


def _provenance() -> dict:
    try:
        extra = {"pytrec_eval": metadata.version("pytrec-eval-terrier")}
    except metadata.PackageNotFoundError:
        extra = {}
    return provenance(extra)
