"""``pretrieve finetune | mine | reranker train/score/teacher``: the fine-tuning pipeline from the command line.

Thin wrappers: parse options (a ``--config`` YAML/JSON file first, flags override it), call one library
function of :mod:`pretrieve.train.finetuner`, :mod:`pretrieve.retrieval.mining` or
:mod:`pretrieve.train.reranker`, print where the result is. Progress bars go to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from pretrieve.cli import app
from pretrieve.train.settings import FinetuneSettings, RerankerSettings

err = Console(stderr=True)

reranker_app = typer.Typer(help="Cross-encoder reranker: train on groups, re-rank runs, score teacher groups.",
                           no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"],
                                                                   "show_default": True})
app.add_typer(reranker_app, name="reranker")

DATA_HELP = "Collection directory in BEIR layout."
SCORING_PRECISION_HELP = ("auto | fp32 | bf16; auto: bf16 only where the hardware computes it natively (a GPU "
                          "with bf16, a CPU with AVX512-BF16/AMX), else fp32.")
PRECISION_HELP = "fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler)."
REQUIRED = "Required (here or in --config)."
OVERWRITE_HELP = "Discard a previous run in --out (checkpoints, final/, logs) and start afresh."
INEXACT_HELP = ("Resume even when a checkpoint's RNG state cannot be restored (warns; losses differ from an "
                "uninterrupted run).")


def _option(config_cls, name: str, *flags: str, extra: str = "", default_text: str | None = None, **kwargs):
    """An option whose value is None unless given (so a --config file can set it), with the help text and the
    default of the config dataclass field ``name`` (``default_text`` overrides the shown default)."""
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(config_cls)}[name]
    shown = default_text if default_text is not None else field.default
    text = (field.metadata.get("help", "") + " " + extra).strip()
    return typer.Option(None, *flags, help=text, show_default=str(shown) if shown not in ("", None) else False,
                        **kwargs)


def _ft(name: str, *flags: str, **kwargs):
    return _option(FinetuneSettings, name, *flags, **kwargs)


def _rr(name: str, *flags: str, **kwargs):
    return _option(RerankerSettings, name, *flags, **kwargs)




def _load_file(path: Optional[Path]) -> dict:
    if path is None:
        return {}
    from pretrieve.train.run_config import load_config_file

    return load_config_file(path)


def _resolve_data(data: Optional[str]) -> Optional[str]:
    if data is None:
        return None
    from pretrieve.data.registry import resolve_collection

    return str(resolve_collection(data))


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
    batch_size: Optional[int] = _ft("batch_size", "--batch-size"),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Queries per forward pass "
                                                   "(gradient accumulation).",
                                                   show_default="batch_size / processes"),
    lr: Optional[float] = _ft("lr", "--lr"),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (0 = use --epochs).",
                                         show_default="0"),
    epochs: Optional[float] = _ft("epochs", "--epochs"),
    warmup_ratio: Optional[float] = typer.Option(None, "--warmup-ratio", help="Warmup share of the steps.",
                                                 show_default="0.1"),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="Warmup steps (overrides "
                                               "--warmup-ratio)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="linear | cosine | constant.",
                                            show_default="linear"),
    min_lr_ratio: Optional[float] = typer.Option(None, "--min-lr-ratio", help="Floor of the decay, as a fraction "
                                                 "of --lr.", show_default="0"),
    precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_HELP, show_default="fp32"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="Deprecated: --precision bf16.",
                                        show_default="off"),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing",
                                                          help="Recompute activations in the backward pass."),
    grad_cache_chunk: Optional[int] = _ft("grad_cache_chunk", "--grad-cache-chunk"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of sampling, data order and init.",
                                        show_default="42"),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Checkpoint every N steps.",
                                              show_default="500"),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Log every N steps.", show_default="10"),
    num_workers: Optional[int] = typer.Option(None, "--num-workers", help="DataLoader workers.", show_default="0"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --out."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    allow_inexact_resume: bool = typer.Option(False, "--allow-inexact-resume", help=INEXACT_HELP),
) -> None:
    """Fine-tune a dual-encoder retriever (stage 1, 2 or 3); OUT/final is a sentence-transformers model."""
    from pretrieve.train.finetuner import build_finetune_config, finetune

    flags = dict(model=model, data=_resolve_data(data), out=str(out) if out else None, stage=stage,
                 groups=str(groups) if groups else None, split=split, num_negatives=num_negatives,
                 query_max_len=query_max_len, passage_max_len=passage_max_len, representation=representation, pooling=pooling, normalize=normalize,
                 similarity=similarity, temperature=temperature, tied=tied, alpha=alpha,
                 teacher_temperature=teacher_temperature, in_batch=in_batch, gather=gather, bm25_depth=bm25_depth,
                 max_groups=max_groups, on_unknown=on_unknown, batch_size=batch_size,
                 micro_batch_size=micro_batch_size, lr=lr, max_steps=steps, epochs=epochs, warmup_ratio=warmup_ratio,
                 warmup_steps=warmup_steps, schedule=schedule, min_lr_ratio=min_lr_ratio, precision=precision,
                 bf16=bf16, gradient_checkpointing=gradient_checkpointing, grad_cache_chunk=grad_cache_chunk,
                 seed=seed, save_every=save_every, log_every=log_every, num_workers=num_workers,
                 overwrite=overwrite or None, allow_inexact_resume=allow_inexact_resume or None)
    run_config = build_finetune_config(_load_file(config), flags, resume=resume, where=str(config or "config"))
    final = finetune(run_config)
    typer.echo(f"fine-tuned retriever: {final}")


# ---------------------------------------------------------------------------------------------- mine
@app.command("mine")
def mine_command(
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Groups JSONL to write (an .artifact.json sidecar goes beside "
                             "it)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Fine-tuned retriever (e.g. STAGE1/final) or "
                                        "any dense checkpoint; omit with --bm25."),
    bm25: bool = typer.Option(False, "--bm25", help="Mine with BM25 instead of a dense model (stage-1 negatives)."),
    split: str = typer.Option("train", "--split", "-s", help="Qrels split whose queries get groups."),
    depth: Optional[int] = typer.Option(None, "--depth", min=1, help="Top-K searched; negatives are the top-K minus "
                                        "positives.", show_default="200 dense (K2/K3), 1000 BM25 (K1)"),
    run_out: Optional[Path] = typer.Option(None, "--run-out", help="Also write the retrieval run (TREC) here."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Keep the corpus index here (model mining)."),
    bm25_index: Optional[Path] = typer.Option(None, "--bm25-index", help="Keep the BM25 index here and reuse it "
                                              "while the corpus is unchanged (--bm25); default: a temporary index."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Texts per forward pass (dense)."),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=2,
                                             help="Passage token limit; default: the model's max_seq_length."),
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length", min=2, help="Query token limit; "
                                                   "default: the length the model was fine-tuned with."),
    precision: str = typer.Option("auto", "--precision", help="Encoder precision: auto (bf16 where the hardware "
                                  "has it natively, else fp32), fp32, bf16, fp16 or int8 (CPU)."),
    factory: str = typer.Option("Flat", "--factory", help="FAISS index for dense vectors (Flat = exact)."),
    bf16: bool = typer.Option(False, "--bf16", hidden=True, help="Same as --precision bf16."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:1, ... or auto."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Recompute even when OUT is up to date."),
) -> None:
    """Hard negatives: each query's top-K by the retriever minus its positives, as training groups."""
    from pretrieve.errors import ConfigError
    from pretrieve.outputs import check_writable, remove_leftovers

    check_writable(out, directory=False)
    remove_leftovers(out.parent, depth=0)
    collection = _resolve_data(data)
    if bm25 == (model is not None):
        raise ConfigError("give either --model (dense mining) or --bm25")
    if bm25:
        from pretrieve.retrieval.bm25 import bm25_negatives

        path = bm25_negatives(collection, split, out, depth=depth or 1000, run_out=run_out, overwrite=overwrite,
                              index_dir=bm25_index, show_progress=err.is_terminal)
    else:
        from pretrieve.models import resolve_model
        from pretrieve.retrieval.mining import mine_negatives

        path = mine_negatives(resolve_model(model), collection, split, out, depth=depth or 200,
                              batch_size=batch_size, max_length=max_length, query_max_length=query_max_length,
                              cache_dir=cache, run_out=run_out, device=device,
                              precision="bf16" if bf16 else precision, factory=factory, overwrite=overwrite)
    err.print(f"training groups: {path}", highlight=False)


# ------------------------------------------------------------------------------------------ reranker
@reranker_app.command("train")
def reranker_train_command(
    model: Optional[str] = _rr("model", "--model", "-m", extra="Path, alias or hub name. " + REQUIRED),
    data: Optional[str] = _rr("data", "--data", "-d", extra=REQUIRED),
    groups: Optional[Path] = _rr("groups", "--groups", extra=REQUIRED),
    out: Optional[Path] = _rr("out", "--out", "-o", extra=REQUIRED),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON file with any of these options."),
    num_negatives: Optional[int] = _rr("num_negatives", "--num-negatives"),
    max_len: Optional[int] = _rr("max_len", "--max-len"),
    max_groups: Optional[int] = _rr("max_groups", "--max-groups"),
    batch_size: Optional[int] = _rr("batch_size", "--batch-size"),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Queries per forward pass.",
                                                   show_default="batch_size / processes"),
    lr: Optional[float] = _rr("lr", "--lr"),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (0 = use --epochs).",
                                         show_default="0"),
    epochs: Optional[float] = _rr("epochs", "--epochs"),
    warmup_ratio: Optional[float] = typer.Option(None, "--warmup-ratio", help="Warmup share.", show_default="0.1"),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="Warmup steps (overrides the ratio)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="linear | cosine | constant.",
                                            show_default="linear"),
    min_lr_ratio: Optional[float] = typer.Option(None, "--min-lr-ratio", help="Floor of the decay.",
                                                 show_default="0"),
    precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_HELP, show_default="fp32"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="Deprecated: --precision bf16.",
                                        show_default="off"),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing",
                                                          help="Recompute activations in the backward pass."),
    num_workers: Optional[int] = typer.Option(None, "--num-workers", help="DataLoader workers.", show_default="0"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed.", show_default="42"),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Checkpoint every N steps.",
                                              show_default="500"),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Log every N steps.", show_default="10"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --out."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    allow_inexact_resume: bool = typer.Option(False, "--allow-inexact-resume", help=INEXACT_HELP),
) -> None:
    """Train a cross-encoder with listwise cross-entropy over each query's group (no in-batch negatives)."""
    from pretrieve.train.reranker import build_reranker_config, train_reranker

    flags = dict(model=model, data=_resolve_data(data), groups=str(groups) if groups else None,
                 out=str(out) if out else None, num_negatives=num_negatives, max_len=max_len, max_groups=max_groups,
                 batch_size=batch_size, micro_batch_size=micro_batch_size, lr=lr, max_steps=steps, epochs=epochs,
                 warmup_ratio=warmup_ratio, warmup_steps=warmup_steps, schedule=schedule, min_lr_ratio=min_lr_ratio,
                 precision=precision, bf16=bf16, gradient_checkpointing=gradient_checkpointing,
                 num_workers=num_workers, seed=seed, save_every=save_every, log_every=log_every,
                 overwrite=overwrite or None, allow_inexact_resume=allow_inexact_resume or None)
    final = train_reranker(build_reranker_config(_load_file(config), flags, resume=resume,
                                                 where=str(config or "config")))
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
    from pretrieve.train.reranker import rerank_run_file

    path = rerank_run_file(model, _resolve_data(data), split, run, out, depth=depth, batch_size=batch_size,
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
    from pretrieve.train.reranker import teacher_groups

    path = teacher_groups(model, _resolve_data(data), groups, out, max_negatives=max_negatives,
                          batch_size=batch_size, max_len=max_len, device=device, overwrite=overwrite,
                          precision=precision, show_progress=err.is_terminal)
    err.print(f"teacher-scored groups: {path}", highlight=False)
