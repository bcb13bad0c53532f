"""``pretrieve export``: a fine-tuned retriever as a sentence-transformers model (``Router`` for separate towers and
CoT-MoTE experts) with its model card, optionally pushed to the Hugging Face Hub (docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pretrieve.api import export
from pretrieve.cli.root import app
from pretrieve.cli.options import PASSAGE_PROMPT_HELP, QUERY_PROMPT_HELP
from pretrieve.errors import ConfigError


@app.command("export")
def export_command(
    model_dir: Path = typer.Argument(..., help="A retriever fine-tuned by pretrieve (its folder, e.g. "
                                     "OUT/finetune-s2/final of a recipe)."),
    out: Path = typer.Option(..., "--out", "-o", help="Export folder (model, tokenizer, README.md card)."),
    recipe_out: Optional[Path] = typer.Option(None, "--recipe-out", help="The recipe's output folder: its "
                                              "recipe.resolved.json and results.md go into the card."),
    metrics: Optional[Path] = typer.Option(None, "--metrics", help="A results file of this model (a recipe's "
                                           "results.json or `pretrieve evaluate --json` output): its measures go "
                                           "into the card's model-index."),
    metrics_run: Optional[str] = typer.Option(None, "--metrics-run", help="This model's run (row) in --metrics "
                                              "(default: the recipe's final row, or the file's only run)."),
    query_prompt: Optional[str] = typer.Option(None, "--query-prompt", help=QUERY_PROMPT_HELP),
    passage_prompt: Optional[str] = typer.Option(None, "--passage-prompt", help=PASSAGE_PROMPT_HELP),
    license: str = typer.Option("apache-2.0", "--license", help="License named in the card."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", help="Upload the export to this Hub model "
                                              "repository (OWNER/NAME; needs HF_TOKEN or `hf auth login`)."),
    private: bool = typer.Option(False, "--private", help="Create the Hub repository private."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --push-to-hub: export, then list what would be "
                                 "uploaded (files, sizes, repository) without contacting the Hub."),
) -> None:
    """Export MODEL_DIR to OUT as a model that loads with SentenceTransformer(OUT) and pretrieve, with a model card."""
    if metrics_run is not None and metrics is None:
        raise ConfigError("--metrics-run names a run of --metrics FILE: give --metrics too")
    from pretrieve.modeling.model_card import metrics_from_file  # lazy: torch

    measured = metrics_from_file(metrics, metrics_run) if metrics is not None else None
    exported = export(model_dir, out, recipe_out=recipe_out, query_prompt=query_prompt, passage_prompt=passage_prompt,
                      license=license, push_to_hub=push_to_hub, private=private, dry_run=dry_run, metrics=measured)
    typer.echo(f"exported: {exported}")
    if push_to_hub and not dry_run:
        typer.echo(f"pushed: https://huggingface.co/{push_to_hub}")
