"""``pretrieve mine``: hard negatives — each query's top-K by a retriever (or BM25) minus its positives.

A thin wrapper around :func:`pretrieve.retrieval.mining.mine_negatives` and
:func:`pretrieve.retrieval.runs.bm25_negatives`; progress bars go to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from pretrieve.cli.root import app
from pretrieve.cli.options import DATA_HELP, resolve_data
from pretrieve.errors import ConfigError
from pretrieve.models import resolve_model
from pretrieve.outputs import check_writable, claim, remove_leftovers
from pretrieve.retrieval.index import shard_dir_name
from pretrieve.retrieval.runs import bm25_negatives

err = Console(stderr=True, emoji=False)


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
    overwrite: bool = typer.Option(False, "--overwrite", help="Recompute even when OUT is up to date, and replace "
                                   "an output (OUT, --run-out, an index) pretrieve did not write (refused otherwise)."),
) -> None:
    """Hard negatives: each query's top-K by the retriever minus its positives, as training groups."""
    for path in (out, run_out, bm25_index, cache / shard_dir_name(0, 1) if cache else None):   # the ownership rule
        claim([path], overwrite)
    check_writable(out, directory=False)
    remove_leftovers(out.parent, depth=0)
    collection = resolve_data(data)
    if bm25 == (model is not None):
        raise ConfigError("give either --model (dense mining) or --bm25")
    if bm25:
        path = bm25_negatives(collection, split, out, depth=depth or 1000, run_out=run_out, overwrite=overwrite,
                              index_dir=bm25_index, show_progress=err.is_terminal)
    else:
        from pretrieve.retrieval.mining import mine_negatives   # lazy: torch

        path = mine_negatives(resolve_model(model), collection, split, out, depth=depth or 200,
                              batch_size=batch_size, max_length=max_length, query_max_length=query_max_length,
                              cache_dir=cache, run_out=run_out, device=device,
                              precision="bf16" if bf16 else precision, factory=factory, overwrite=overwrite)
    err.print(f"training groups: {path}", highlight=False)
