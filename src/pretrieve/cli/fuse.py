"""``pretrieve fuse RUN1 RUN2 ...``: one run from several, by reciprocal rank fusion or a weighted score sum.

Thin: it parses the options and calls :mod:`pretrieve.retrieval.fusion` (ranx arithmetic). Weights are
given (``--weights``) or fitted on training queries (``--fit-data DIR --fit-split train --fit-runs ...``: the
same retrievers' runs on that split's queries, scored against that split's qrels only; ``test`` is refused).
Nothing it imports loads torch or transformers (``pretrieve fuse`` stays torch-free).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from pretrieve.cli.root import app
from pretrieve.data.collection import BeirCollection
from pretrieve.data.registry import resolve_collection
from pretrieve.data.trec import iter_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.outputs import preflight, refuse_existing, write_failures
from pretrieve.retrieval import fusion


@app.command("fuse")
def fuse_command(
    runs: list[Path] = typer.Argument(..., metavar="RUN", show_default=False,
                                      help="TREC run files of the same queries (two or more)."),
    out: Path = typer.Option(..., "--out", "-o", help="Fused run to write (TREC format)."),
    method: str = typer.Option("rrf", "--method", help="rrf (reciprocal rank fusion) | wsum (normalised weighted "
                               "score sum) | auto (with --fit-*: whichever of rrf / wsum scores best on the "
                               "training queries, wsum cross-fitted on 5 folds of them)."),
    norm: Optional[str] = typer.Option(None, "--norm", help="wsum: per-query normalisation, minmax | zscore "
                                       "(default minmax; with --method auto: both are tried)."),
    weights: Optional[str] = typer.Option(None, "--weights", help="wsum: comma-separated convex weights, one per run "
                                          "(default: uniform, or fitted with --fit-data)."),
    k: int = typer.Option(60, "--k", min=1, help="rrf: the constant k of 1/(k + rank)."),
    depth: int = typer.Option(1000, "--depth", min=1, help="Documents per query taken from each run and kept."),
    fit_data: Optional[str] = typer.Option(None, "--fit-data", help="Collection (BEIR layout directory or a known "
                                           "name) whose --fit-split qrels fit the weights."),
    fit_split: str = typer.Option("train", "--fit-split", help="Qrels split of the training queries (never test)."),
    fit_runs: Optional[list[str]] = typer.Option(None, "--fit-runs", help="The same retrievers' runs on the "
                                                 "--fit-split queries, in the order of RUN (repeat the option or "
                                                 "separate with commas)."),
    fit_measure: str = typer.Option("nDCG@10", "--fit-measure", help="Measure maximised on the training queries."),
    fit_step: float = typer.Option(0.05, "--fit-step", help="Grid step of the fitted weights."),
    allow_disjoint: bool = typer.Option(False, "--allow-disjoint", help="Fuse runs that share no query (their "
                                        "union; refused by default, as it usually means runs of different "
                                        "query sets were given)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out run file (refused "
                                                              "otherwise)."),
) -> None:
    """Fuse runs (reciprocal rank fusion, or normalised scores with convex weights given or fitted on train)."""
    err = Console(stderr=True, highlight=False, emoji=False)
    refuse_existing(out, overwrite)
    if len(runs) < 2:
        raise ConfigError(f"give at least two runs to fuse, got {len(runs)}")
    for path in runs:
        if not path.is_file():
            raise ConfigError(f"{path}: run file not found")
    # before the work: a place that cannot be written, or a disk without room for about the smallest run given
    preflight(out, needed_bytes=min(path.stat().st_size for path in runs))
    train_runs = [Path(p) for value in (fit_runs or []) for p in value.split(",") if p]
    fitting = fit_data is not None or bool(train_runs)
    if fitting and (fit_data is None or not train_runs):
        raise ConfigError("fitting needs both --fit-data DIR and --fit-runs (one training run per RUN)")
    if fitting and weights is not None:
        raise ConfigError("give either --weights or --fit-data/--fit-runs, not both")
    if fitting and len(train_runs) != len(runs):
        raise ConfigError(f"{len(train_runs)} training run(s) for {len(runs)} runs: give one --fit-runs file per RUN, "
                          "in the same order")
    if method == "auto" and not fitting:
        raise ConfigError("--method auto chooses on training queries: give --fit-data and --fit-runs")
    if norm is not None and norm not in fusion.NORMS:
        raise ConfigError(f"--norm must be one of {', '.join(fusion.NORMS)}, got {norm!r}")
    for path in [*runs, *train_runs]:
        if not path.is_file():
            raise ConfigError(f"{path}: run file not found")
    _check_shared_queries(runs, allow_disjoint, err)
    if fitting:
        if method == "rrf":
            raise ConfigError("rrf has nothing to fit (k is fixed): drop --fit-*, or use --method wsum or auto")
        candidates = fusion.parse_candidates(method, norm)
        fit_data = resolve_collection(fit_data)
        spec = fusion.fit_on_split(train_runs, fit_data, fit_split, candidates=candidates, measure=fit_measure,
                                   step=fit_step, depth=depth, k=k)
        err.print(f"fitted on {spec.fit['queries']} {fit_split} queries of {fit_data}: {spec.describe()} "
                  f"({fit_measure} {spec.fit['score']:.4f}, cross-fitted {spec.fit['cross_fitted']:.4f}; single runs "
                  + ", ".join(f"{v:.4f}" for v in spec.fit["single_runs"].values()) + ")")
        fit_inputs = {f"fit_run{i + 1}": p for i, p in enumerate(train_runs)}
        fit_inputs["fit_qrels"] = BeirCollection(fit_data).qrels_path(fit_split)
    else:
        parsed = None
        if weights is not None:
            try:
                parsed = tuple(float(w) for w in weights.split(","))
            except ValueError:
                raise ConfigError(f"--weights: expected comma-separated numbers, got {weights!r}") from None
        if method == "rrf" and (norm is not None or parsed is not None):
            raise ConfigError("rrf fuses ranks: --norm and --weights belong to --method wsum")
        spec = fusion.FusionSpec(method, norm or ("minmax" if method == "wsum" else None), parsed, k=k,
                                 depth=depth).check(len(runs))
        fit_inputs = None
    with write_failures(out):   # a full disk: one line naming --out
        fused = fusion.write_fused_run(runs, out, spec, tag="fused", fit_inputs=fit_inputs)
    err.print(f"wrote {out}: {spec.describe()} of {len(runs)} runs, {len(fused)} queries")


def _check_shared_queries(runs: list[Path], allow_disjoint: bool, err) -> None:
    """Refuse runs that share no query (unless allowed); note the queries some runs lack (one streamed pass)."""
    query_sets = [{qid for qid, _ in iter_run(path)} for path in runs]
    shared = set.intersection(*query_sets)
    union = set.union(*query_sets)
    if not shared and not allow_disjoint:
        raise InputError(f"the runs share no query ({', '.join(f'{p}: {len(q)}' for p, q in zip(runs, query_sets))} "
                         "queries): were runs of different query sets given? --allow-disjoint fuses their union",
                         path=str(runs[1]))
    for path, queries in zip(runs, query_sets):
        if len(queries) < len(union):
            err.print(f"note: {path} has no result for {len(union) - len(queries)} of the {len(union)} queries of "
                      "the runs (fused from the other runs only)")
