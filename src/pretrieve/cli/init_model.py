"""``pretrieve init-model``: a randomly initialised BERT of a given shape with a tokenizer's vocabulary (the
from-scratch base an MLM recipe turns into a small "BERT")."""

from __future__ import annotations

from pathlib import Path

import typer

from pretrieve.cli.root import app
from pretrieve.models import INIT_SEED, init_model


@app.command("init-model")
def init_model_command(
    shape: str = typer.Option(..., help="L<layers>-H<hidden>, e.g. L2-H128 or L4-H256 (hidden/64 heads, "
                              "feed-forward 4·hidden)."),
    tokenizer: str = typer.Option(..., help="Tokenizer whose vocabulary the model gets: local path, offline alias "
                                  "(splade-tiny, minilm) or hub name (bert-base-uncased)."),
    out: Path = typer.Option(..., help="Output directory (model + tokenizer, loadable with from_pretrained)."),
    seed: int = typer.Option(INIT_SEED, help="Seed of the initialisation (same seed, same weights)."),
) -> None:
    """Write a randomly initialised BertForMaskedLM with the tokenizer's vocabulary to OUT."""
    typer.echo(f"initialised model: {init_model(shape, tokenizer, out, seed)}")
