"""``pretrieve data``: validate a BEIR-layout collection, list the known collections, download one.

Thin wrappers over :mod:`pretrieve.data.registry`; malformed input surfaces as a located
``InputError``, which ``pretrieve.cli.main`` prints as one line with exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli import app
from pretrieve.data.registry import (KNOWN_COLLECTIONS, check_collection, default_cache_dir, fetch_collection,
                                     resolve_collection)

data_app = typer.Typer(help="Validate, list and download BEIR-layout collections.", no_args_is_help=True)
app.add_typer(data_app, name="data")

out = Console()
err = Console(stderr=True)


@data_app.command("check")
def check(
    collection: str = typer.Argument(..., help="Collection directory in BEIR layout, or a known name (downloaded if not cached)."),
    split: Optional[List[str]] = typer.Option(None, "--split", "-s",
                                              help="Qrels split to check (repeatable; default: every split)."),
    strict: bool = typer.Option(False, "--strict", help="Exit with code 1 when there are warnings."),
) -> None:
    """Validate corpus, queries and qrels; print counts and unknown-id warnings."""
    report = check_collection(resolve_collection(collection), split or None)
    out.print(f"collection {report.root}")
    out.print(f"documents  {report.documents}")
    out.print(f"queries    {report.queries}")
    table = Table("split", "judged queries", "judgments", "relevant", "unknown queries", "unknown docs")
    for s in report.splits:
        table.add_row(s.split, str(s.queries), str(s.judgments), str(s.relevant), str(s.unknown_queries),
                      str(s.unknown_docs))
    out.print(table)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    if strict and report.warnings:
        raise typer.Exit(1)


@data_app.command("list")
def list_collections(
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Cache to look in (default: the user cache)."),
) -> None:
    """List the known downloadable collections and whether each is cached."""
    cache = cache_dir or default_cache_dir()
    table = Table("name", "splits", "md5", "cached", "description")
    for info in KNOWN_COLLECTIONS.values():
        cached = (cache / info.name / "corpus.jsonl").exists()
        table.add_row(info.name, ",".join(info.splits), info.md5 or "-", "yes" if cached else "no", info.description)
    out.print(table)
    out.print(f"cache: {cache}")


@data_app.command("download")
def download(
    name: str = typer.Argument(..., help="A known collection name (see `pretrieve data list`)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o",
                                           help="Parent directory; the collection goes to OUT/NAME "
                                                "(default: the user cache)."),
) -> None:
    """Download a known collection (md5-verified, unpacked atomically) unless already present."""
    path = fetch_collection(name, out_dir)
    out.print(str(path))
