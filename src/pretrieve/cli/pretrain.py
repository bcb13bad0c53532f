"""``pretrieve pretrain``: retrieval-oriented pre-training with any method (preset, file or flags)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pretrieve.cli.root import app
from pretrieve.cli.options import DIVERGENCE_HELP, PRECISION_HELP, load_file, report_to_option
from pretrieve.data.registry import resolve_corpus

#: The method presets (pretrieve.train.method.PRESETS, listed here so that --help does not import torch; a test
#: keeps the two equal).
PRESET_NAMES = ("mlm", "bow", "ae", "ar", "retromae", "cpdae", "cpdae-r", "cdmae", "cdmae-random", "dupmae",
                "dupmae-code", "cotmae", "cotmote", "cotmote-swap", "tsdae")
REQUIRED = "Required (here or in --config)."


@app.command("pretrain")
def pretrain_command(
    model: Optional[str] = typer.Option(None, help="Encoder to start from: local path, offline alias "
                                        "(minilm, splade-tiny) or hub name (bert-base-uncased). " + REQUIRED),
    # "\\[": typer reads help as rich markup, where "[@SPLIT]" would be a tag and vanish
    corpus: Optional[List[str]] = typer.Option(None, help="Pre-training text: BEIR directory, corpus.jsonl, "
                                               "JSONL with 'text', plain text (one document per line), a datasets "
                                               "save_to_disk directory (DIR\\[@SPLIT]), or hf:NAME[:CONFIG]\\[@SPLIT]; "
                                               "several (repeated or comma-separated) are concatenated in order. "
                                               + REQUIRED),
    out: Optional[Path] = typer.Option(None, help="Output directory (checkpoints, logs, final/). " + REQUIRED),
    method: Optional[str] = typer.Option(None, help="Preset: " + ", ".join(PRESET_NAMES) + " (docs/methods.md); "
                                         "or a method YAML/JSON file. Default: bow."),
    config: Optional[Path] = typer.Option(None, help="YAML/JSON file with any of these options "
                                          "(flags given here override it)."),
    objectives: Optional[str] = typer.Option(None, help="Comma-separated objectives, e.g. mlm,bow,enhanced."),
    weights: Optional[str] = typer.Option(None, help="Comma-separated weights, one per objective."),
    encoder_mask: Optional[float] = typer.Option(None, help="Encoder mask ratio."),
    decoder_mask: Optional[float] = typer.Option(None, help="Decoder mask ratio."),
    encoder_masker: Optional[str] = typer.Option(None, help="Encoder masker kind (wwm, token, ...)."),
    decoder_masker: Optional[str] = typer.Option(None, help="Decoder masker kind (wwm, token, pmi, none)."),
    bottleneck: Optional[str] = typer.Option(None, help="Sentence vector the decoder objectives read: cls or mean "
                                             "(masked mean, for mean-pooled retrievers)", show_default="cls"),
    max_len: Optional[int] = typer.Option(None, help="Maximum tokens per example", show_default="144"),
    batch_size: Optional[int] = typer.Option(None, help="Examples per optimizer step, all processes "
                                             "together", show_default="32"),
    micro_batch_size: Optional[int] = typer.Option(None, help="Examples per forward pass (gradient "
                                                   "accumulation)", show_default="batch_size / processes"),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate", show_default="1e-4"),
    steps: Optional[int] = typer.Option(None, help="Optimizer steps (0 = use --epochs)", show_default="0"),
    epochs: Optional[float] = typer.Option(None, help="Epochs when --steps is 0", show_default="1"),
    warmup_ratio: Optional[float] = typer.Option(None, help="Warmup share of the steps", show_default="0.1"),
    warmup_steps: Optional[int] = typer.Option(None, help="Warmup steps (overrides --warmup-ratio)"),
    schedule: Optional[str] = typer.Option(None, help="linear | cosine | constant", show_default="linear"),
    min_lr_ratio: Optional[float] = typer.Option(None, help="Floor of the decay, as a fraction of --lr "
                                                 "(BoW authors: cosine to 0.1)", show_default="0"),
    precision: Optional[str] = typer.Option(None, help=PRECISION_HELP, show_default="fp32"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="Deprecated: --precision bf16",
                                        show_default="off"),
    tf32: Optional[bool] = typer.Option(None, "--tf32/--no-tf32", help="fp32 matrix products on CUDA tensor cores in "
                                        "TF32 (compute capability >= 8.0)", show_default="off"),
    gradient_checkpointing: Optional[bool] = typer.Option(None, "--gradient-checkpointing",
                                                          help="Recompute activations in the backward pass"),
    seed: Optional[int] = typer.Option(None, help="Seed of masking, data order and init", show_default="42"),
    save_every: Optional[int] = typer.Option(None, help="Checkpoint every N steps", show_default="500"),
    log_every: Optional[int] = typer.Option(None, help="Log every N steps", show_default="10"),
    num_workers: Optional[int] = typer.Option(None, help="DataLoader workers for collation", show_default="0"),
    num_proc: Optional[int] = typer.Option(None, help="Processes that build the token cache",
                                           show_default="one per 16 MB of input, up to the CPUs"),
    pack: Optional[bool] = typer.Option(None, "--pack/--no-pack", help="Pack consecutive sentences of each document "
                                        "into examples of up to --max-len tokens (as RetroMAE/bowdpr prepare "
                                        "Wikipedia and BookCorpus)", show_default="off"),
    pack_across: Optional[List[str]] = typer.Option(None, help="A --corpus source whose consecutive documents are "
                                                    "packed into one another (BookCorpus's sentence rows); "
                                                    "repeatable"),
    short_seq_prob: Optional[float] = typer.Option(None, help="Packing: probability of a random shorter target "
                                                   "length", show_default="0"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --out."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Discard a previous run in --out (checkpoints, "
                                   "final/, logs) and start afresh."),
    allow_inexact_resume: bool = typer.Option(False, "--allow-inexact-resume", help="Resume even when a "
                                              "checkpoint's RNG state cannot be restored (warns; losses differ "
                                              "from an uninterrupted run)."),
    divergence_factor: Optional[float] = typer.Option(None, help=DIVERGENCE_HELP, show_default="10"),
    report_to: Optional[str] = report_to_option(),
    reuse_from: Optional[Path] = typer.Option(None, "--reuse-from", help="Another pre-training's --out: when it "
                                              "holds a finished run with these settings from the same inputs "
                                              "(compared by content), copy it instead of training."),
) -> None:
    """Pre-train an encoder; the result in OUT/final loads with AutoModel.from_pretrained."""
    from pretrieve.train.pretrainer import pretrain   # lazy: torch
    from pretrieve.train.run_config import build_pretrain_config  # lazy: torch

    sources = corpus[0] if corpus and len(corpus) == 1 else corpus or None   # one source: as before
    flags = dict(model=model, corpus=sources, out=str(out) if out else None, max_len=max_len,
                 batch_size=batch_size, micro_batch_size=micro_batch_size, lr=lr, max_steps=steps,
                 epochs=epochs, warmup_ratio=warmup_ratio, warmup_steps=warmup_steps, schedule=schedule,
                 min_lr_ratio=min_lr_ratio, precision=precision, bf16=bf16,
                 gradient_checkpointing=gradient_checkpointing, tf32=tf32, seed=seed,
                 save_every=save_every, log_every=log_every, num_workers=num_workers, num_proc=num_proc,
                 pack=pack, pack_across=pack_across or None, short_seq_prob=short_seq_prob,
                 overwrite=overwrite or None, allow_inexact_resume=allow_inexact_resume or None,
                 divergence_factor=divergence_factor, report_to=report_to,
                 reuse_from=str(reuse_from) if reuse_from else None)
    method_flags = dict(method=method, objectives=objectives, weights=weights, encoder_mask=encoder_mask,
                        decoder_mask=decoder_mask, encoder_masker=encoder_masker, decoder_masker=decoder_masker,
                        bottleneck=bottleneck)
    run_config = build_pretrain_config(load_file(config), flags, method_flags, resume=resume,
                                       where=str(config or "config"))
    run_config.corpus = resolve_corpus(run_config.corpus)   # a collection name, from the flag or the file
    final = pretrain(run_config)
    typer.echo(f"pre-trained encoder: {final}")
