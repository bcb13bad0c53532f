"""``pretrieve finetune``: dual-encoder fine-tuning (stages 1–3) from the command line.

A thin wrapper: its options are the declared fine-tuning settings (:class:`pretrieve.train.settings.FinetuneSettings`,
built by :func:`pretrieve.cli.options.settings_command`); a ``--config`` YAML/JSON file first, flags override it; call
:func:`pretrieve.train.finetuner.finetune`, print where the result is. Progress bars go to stderr. Hard negatives
are mined by ``pretrieve mine`` (:mod:`pretrieve.cli.mine`), teacher scores by ``pretrieve reranker``
(:mod:`pretrieve.cli.rerank`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pretrieve.cli.options import ConfigFile, settings_command, training_config
from pretrieve.cli.root import app
from pretrieve.train.evaluator import read_evaluation
from pretrieve.train.settings import FinetuneSettings


# ------------------------------------------------------------------------------------------ finetune
@app.command("finetune")
@settings_command(FinetuneSettings)
def finetune_command(config: ConfigFile = None, **settings: Any) -> None:
    """Fine-tune a dual-encoder retriever (stage 1, 2 or 3); OUT/final is a sentence-transformers model."""
    from pretrieve.train.finetuner import build_finetune_config, finetune   # lazy: torch

    final = finetune(training_config(build_finetune_config, config, settings))
    typer.echo(f"fine-tuned retriever: {final}{best_step_note(final)}")


def best_step_note(final: Path) -> str:
    """`` (the best of the dev evaluations: step N, nDCG@10 0.4321)`` for a run that evaluated while training."""

    record = read_evaluation(final)
    if record is None:
        return ""
    return f" (the best of the dev evaluations: step {record['best_step']}, {record['metric']} {record['best_value']:.4f})"
