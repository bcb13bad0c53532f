"""``pretrieve finetune``: dual-encoder fine-tuning (stages 1–3) from the command line.

A thin wrapper: parse options (a ``--config`` YAML/JSON file first, flags override it), call
:func:`pretrieve.train.finetuner.finetune`, print where the result is. Progress bars go to stderr. Hard negatives
are mined by ``pretrieve mine`` (:mod:`pretrieve.cli.mine`), teacher scores by ``pretrieve reranker``
(:mod:`pretrieve.cli.rerank`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pretrieve.cli.root import app
from pretrieve.cli.options import (REQUIRED, AllowInexactResume, Bf16, DivergenceFactor, GradientCheckpointing,
                                   LogEvery, MinLrRatio, NumWorkers, Overwrite, Precision, Resume, SaveEvery, Schedule,
                                   Seed, Steps, WarmupRatio, WarmupSteps, report_to_option, settings_option,
                                   training_config, training_flags)
from pretrieve.train.evaluator import read_evaluation
from pretrieve.train.settings import FinetuneSettings


def _ft(name: str, *flags: str, **kwargs):
    return settings_option(FinetuneSettings, name, *flags, **kwargs)


# ------------------------------------------------------------------------------------------ finetune
@app.command("finetune")
def finetune_command(
    model: Optional[str] = _ft("model", "--model", "-m", extra="Path, offline alias (minilm) or hub name. "
                               + REQUIRED),
    data: Optional[str] = _ft("data", "--data", "-d", extra=REQUIRED),
    out: Optional[Path] = _ft("out", "--out", "-o", extra=REQUIRED),
    stage: Optional[int] = _ft("stage", "--stage"),
    groups: Optional[Path] = _ft("groups", "--groups"),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON file with any of these options "
                                          "(flags given here override it)."),
    split: Optional[str] = _ft("split", "--split"),
    num_negatives: Optional[int] = _ft("num_negatives", "--num-negatives"),
    query_max_len: Optional[int] = _ft("query_max_len", "--query-max-len"),
    passage_max_len: Optional[int] = _ft("passage_max_len", "--passage-max-len"),
    representation: Optional[str] = _ft("representation", "--representation",
                                        extra="e.g. dense, dupmae:cls:384,ot:260"),
    pooling: Optional[str] = _ft("pooling", "--pooling"),
    normalize: Optional[bool] = _ft("normalize", "--normalize/--no-normalize"),
    query_prompt: Optional[str] = _ft("query_prompt", "--query-prompt"),
    passage_prompt: Optional[str] = _ft("passage_prompt", "--passage-prompt"),
    similarity: Optional[str] = _ft("similarity", "--similarity"),
    temperature: Optional[float] = _ft("temperature", "--temperature"),
    tied: Optional[bool] = _ft("tied", "--tied/--separate", default_text="tied"),
    alpha: Optional[float] = _ft("alpha", "--alpha"),
    teacher_temperature: Optional[float] = _ft("teacher_temperature", "--teacher-temperature"),
    in_batch: Optional[bool] = _ft("in_batch", "--in-batch/--no-in-batch", default_text="in-batch"),
    gather: Optional[bool] = _ft("gather", "--gather/--no-gather", default_text="gather"),
    bm25_depth: Optional[int] = _ft("bm25_depth", "--bm25-depth"),
    max_groups: Optional[int] = _ft("max_groups", "--max-groups"),
    on_unknown: Optional[str] = _ft("on_unknown", "--on-unknown"),
    eval_steps: Optional[int] = _ft("eval_steps", "--eval-steps"),
    eval_data: Optional[str] = _ft("eval_data", "--eval-data"),
    eval_split: Optional[str] = _ft("eval_split", "--eval-split"),
    eval_measures: Optional[str] = _ft("eval_measures", "--eval-measures"),
    metric_for_best: Optional[str] = _ft("metric_for_best", "--metric-for-best"),
    batch_size: Optional[int] = _ft("batch_size", "--batch-size"),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Queries per forward pass "
                                                   "(gradient accumulation).",
                                                   show_default="batch_size / processes"),
    lr: Optional[float] = _ft("lr", "--lr"),
    steps: Steps = None,
    epochs: Optional[float] = _ft("epochs", "--epochs"),
    warmup_ratio: WarmupRatio = None,
    warmup_steps: WarmupSteps = None,
    schedule: Schedule = None,
    min_lr_ratio: MinLrRatio = None,
    precision: Precision = None,
    bf16: Bf16 = None,
    gradient_checkpointing: GradientCheckpointing = None,
    grad_cache_chunk: Optional[int] = _ft("grad_cache_chunk", "--grad-cache-chunk"),
    seed: Seed = None,
    save_every: SaveEvery = None,
    log_every: LogEvery = None,
    num_workers: NumWorkers = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    allow_inexact_resume: AllowInexactResume = False,
    divergence_factor: DivergenceFactor = None,
    report_to: Optional[str] = report_to_option(),
) -> None:
    """Fine-tune a dual-encoder retriever (stage 1, 2 or 3); OUT/final is a sentence-transformers model."""
    flags = training_flags(locals())   # first: the parameters only
    from pretrieve.train.finetuner import build_finetune_config, finetune   # lazy: torch

    final = finetune(training_config(build_finetune_config, config, flags, resume))
    typer.echo(f"fine-tuned retriever: {final}{best_step_note(final)}")


def best_step_note(final: Path) -> str:
    """`` (the best of the dev evaluations: step N, nDCG@10 0.4321)`` for a run that evaluated while training."""

    record = read_evaluation(final)
    if record is None:
        return ""
    return f" (the best of the dev evaluations: step {record['best_step']}, {record['metric']} {record['best_value']:.4f})"
