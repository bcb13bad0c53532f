"""``pretrieve run RECIPE``: the end-to-end recipe (pre-train → fine-tune stages → evaluate)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markdown import Markdown

from pretrieve import ranks
from pretrieve.cli.root import app


@app.command("run")
def run_command(
    recipe: Path = typer.Argument(..., help="Recipe YAML/JSON file, or the name of a recipe shipped with pretrieve "
                                  "(bow-msmarco, scifact-cpu, ...: configs/; docs/recipes.md)."),
    out: Optional[Path] = typer.Option(None, help="Override the recipe's output directory."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    redo_changed: bool = typer.Option(False, "--redo-changed",
                                      help="A stage whose settings changed since it ran is moved aside "
                                           "(<dir>.replaced-<time>) and run again, instead of refused."),
    smoke: bool = typer.Option(False, "--smoke", help="Check the recipe end to end on a CPU in a minute or two: "
                               "every stage with a tiny random model of the same family, the data cut to a slice "
                               "(or a generated fixture), 2 steps per training stage; output in <out>-smoke."),
    data_root: Optional[Path] = typer.Option(None, "--data-root",
                                             help="Directory holding collections as <name>/corpus.jsonl; searched "
                                                  "first for the collections the recipe names (then the recipe's "
                                                  "data_root, $PRETRIEVE_DATA, ../shared/data, the download "
                                                  "cache)."),
    dist_timeout_minutes: Optional[float] = typer.Option(
        None, "--dist-timeout-minutes", help="Under torchrun / accelerate launch: the longest a rank waits for the "
        "others (default: the recipe's dist_timeout_minutes, else 60); a rank that died or hangs is then named in "
        "a one-line error. See docs/distributed.md."),
) -> None:
    """Run (or resume) every stage of a recipe; finished stages are skipped.

    The whole recipe is checked first (every option of every stage, every collection), so a typo or a missing
    collection is reported before anything trains. Stage times are printed at the end (and kept in results.md).
    Under torchrun --nproc_per_node N -m pretrieve run (or accelerate launch) every stage splits its work across
    the ranks (docs/distributed.md).
    """
    # here, not at the top: `pretrieve --help` and the torch-free commands must start without torch

    from pretrieve.recipe import results_markdown, run_recipe  # lazy: torch

    results = run_recipe(recipe, out=out, show_progress=progress and ranks.is_main(), redo_changed=redo_changed,
                         smoke=smoke, data_root=data_root, dist_timeout_minutes=dist_timeout_minutes)
    if ranks.is_main():
        Console().print(Markdown(results_markdown(results)))
