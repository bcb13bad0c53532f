"""``pretrieve reranker train | score | teacher``: the cross-encoder from the command line.

Thin wrappers: ``train`` (its options the declared :class:`pretrieve.train.settings.RerankerSettings`; a ``--config``
YAML/JSON file first, flags override it) calls
:func:`pretrieve.train.reranker.train_reranker`; ``score`` and ``teacher`` call
:func:`pretrieve.retrieval.rerank.rerank_run_file` and :func:`pretrieve.retrieval.rerank.teacher_groups`. Progress
bars go to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from pretrieve.cli.root import app
from pretrieve.cli.options import (DATA_HELP, SCORING_PRECISION_HELP, ConfigFile, resolve_data, settings_command,
                                   training_config)
from pretrieve.train.settings import RerankerSettings

err = Console(stderr=True, emoji=False)

reranker_app = typer.Typer(help="Cross-encoder reranker: train on groups, re-rank runs, score teacher groups.",
                           no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"],
                                                                   "show_default": True})
app.add_typer(reranker_app, name="reranker")


@reranker_app.command("train")
@settings_command(RerankerSettings)
def reranker_train_command(config: ConfigFile = None, **settings: Any) -> None:
    """Train a cross-encoder with listwise cross-entropy over each query's group (no in-batch negatives)."""
    from pretrieve.train.reranker import build_reranker_config, train_reranker   # lazy: torch

    final = train_reranker(training_config(build_reranker_config, config, settings))
    typer.echo(f"reranker: {final}")


@reranker_app.command("score")
def reranker_score_command(
    model: str = typer.Option(..., "--model", "-m", help="Trained reranker (RERANKER/final)."),
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    run: Path = typer.Option(..., "--run", help="Run to re-rank (TREC format)."),
    out: Path = typer.Option(..., "--out", "-o", help="Re-ranked run to write (TREC format)."),
    split: str = typer.Option("test", "--split", "-s", help="Split whose query texts are used."),
    depth: int = typer.Option(200, "--depth", min=1, help="Documents re-ranked per query (the rest are dropped)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Pairs per forward pass."),
    max_len: Optional[int] = typer.Option(None, "--max-len", min=4,
                                          help="Pair token limit; default: the training one."),
    precision: str = typer.Option("auto", "--precision", help=SCORING_PRECISION_HELP),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:1, ... or auto."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Recompute even when OUT is up to date."),
) -> None:
    """Re-rank the top-DEPTH of every query of a run with the cross-encoder."""
    from pretrieve.retrieval.rerank import rerank_run_file   # lazy: torch

    path = rerank_run_file(model, resolve_data(data), split, run, out, depth=depth, batch_size=batch_size,
                           max_len=max_len, device=device, overwrite=overwrite, precision=precision,
                           show_progress=err.is_terminal)
    err.print(f"re-ranked run: {path}", highlight=False)


@reranker_app.command("teacher")
def reranker_teacher_command(
    model: str = typer.Option(..., "--model", "-m", help="Trained reranker (RERANKER/final)."),
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    groups: Path = typer.Option(..., "--groups", help="Mined groups (the stage-2 retriever's, from `pretrieve mine`)."),
    out: Path = typer.Option(..., "--out", "-o", help="Teacher-scored groups JSONL for `finetune --stage 3`."),
    max_negatives: Optional[int] = typer.Option(None, "--max-negatives", min=1, help="Score only the first N "
                                                "negatives of each group (rank order).", show_default="all"),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Pairs per forward pass."),
    max_len: Optional[int] = typer.Option(None, "--max-len", min=4,
                                          help="Pair token limit; default: the training one."),
    precision: str = typer.Option("auto", "--precision", help=SCORING_PRECISION_HELP),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:1, ... or auto."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Recompute even when OUT is up to date."),
) -> None:
    """Score every positive and negative of each group with the reranker (stage-3 distillation targets)."""
    from pretrieve.retrieval.rerank import teacher_groups   # lazy: torch

    path = teacher_groups(model, resolve_data(data), groups, out, max_negatives=max_negatives,
                          batch_size=batch_size, max_len=max_len, device=device, overwrite=overwrite,
                          precision=precision, show_progress=err.is_terminal)
    err.print(f"teacher-scored groups: {path}", highlight=False)
