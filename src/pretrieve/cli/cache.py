"""``pretrieve cache``: list what the user cache holds (kind, what, model, size, age), its size, and prune it by age,
model or kind (``--dry-run`` shows what would go). Thin wrappers over :mod:`pretrieve.usercache`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli.root import app
from pretrieve.data.records import user_cache_dir
from pretrieve.errors import ConfigError
from pretrieve.usercache import (KINDS, CacheEntry, cache_entries, human_age, human_size, parse_age, remove,
                                 select)

cache_app = typer.Typer(help="List, size and prune pretrieve's user cache (collections, Arrow datasets, "
                             "encoded corpora).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

out = Console(emoji=False, soft_wrap=True)

CACHE_OPTION = typer.Option(None, "--cache-dir", help="The cache to look at (default: $PRETRIEVE_CACHE, else "
                                                      "~/.cache/pretrieve).")
OLDER_OPTION = typer.Option(None, "--older-than", help="Only entries last written longer ago than this: 90m, 12h, "
                                                       "30d, 2w.")
MODEL_OPTION = typer.Option(None, "--model", help="Only entries encoded by this model (a name, path or alias label, "
                                                  "e.g. all-MiniLM-L6-v2).")
KIND_OPTION = typer.Option(None, "--kind", help=f"Only entries of this kind: {', '.join(KINDS)}.")


def _selected(cache_dir: Optional[Path], older_than: Optional[str], model: Optional[str],
              kind: Optional[str]) -> tuple[Path, list[CacheEntry]]:
    root = cache_dir or user_cache_dir()
    age = parse_age(older_than) if older_than is not None else None
    return root, select(cache_entries(root), older_than=age, model=model, kind=kind)


def _table(entries: list[CacheEntry], now: float) -> Table:
    table = Table("kind", "what", "model", "size", "age", "path")
    for entry in entries:
        table.add_row(entry.kind, entry.what, entry.model or "-", human_size(entry.size), human_age(entry.age(now)),
                      str(entry.paths[0]) if entry.paths else "-")
    return table


@cache_app.command("list")
def list_command(cache_dir: Optional[Path] = CACHE_OPTION, older_than: Optional[str] = OLDER_OPTION,
                 model: Optional[str] = MODEL_OPTION, kind: Optional[str] = KIND_OPTION) -> None:
    """Every entry of the cache (oldest first): its kind, what it is, the model it belongs to, size and age."""
    root, entries = _selected(cache_dir, older_than, model, kind)
    out.print(_table(entries, time.time()))
    out.print(f"{len(entries)} entries, {human_size(sum(e.size for e in entries))} in {root}", highlight=False)


@cache_app.command("size")
def size_command(cache_dir: Optional[Path] = CACHE_OPTION) -> None:
    """The cache's size per kind of entry and in all."""
    root, entries = _selected(cache_dir, None, None, None)
    for kind in KINDS:
        of_kind = [e for e in entries if e.kind == kind]
        if of_kind:
            out.print(f"{kind:<11} {len(of_kind):>5} entries  {human_size(sum(e.size for e in of_kind)):>9}",
                      highlight=False)
    out.print(f"{'total':<11} {len(entries):>5} entries  {human_size(sum(e.size for e in entries)):>9}  {root}",
              highlight=False)


@cache_app.command("prune")
def prune_command(cache_dir: Optional[Path] = CACHE_OPTION, older_than: Optional[str] = OLDER_OPTION,
                  model: Optional[str] = MODEL_OPTION, kind: Optional[str] = KIND_OPTION,
                  everything: bool = typer.Option(False, "--all", help="Remove every entry (no filter)."),
                  dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed.")) -> None:
    """Remove the entries that match every filter given (``--older-than``, ``--model``, ``--kind``; ``--all``
    for the whole cache). Each is rebuilt by the next run that needs it."""
    if not (older_than or model or kind or everything):
        raise ConfigError("prune: give --older-than, --model or --kind (or --all to empty the cache)")
    root, entries = _selected(cache_dir, older_than, model, kind)
    now = time.time()
    if entries:
        out.print(_table(entries, now))
    total = human_size(sum(e.size for e in entries))
    if dry_run:
        out.print(f"dry run: would remove {len(entries)} entries ({total}) from {root}", highlight=False)
        return
    for entry in entries:
        remove(entry)
    out.print(f"removed {len(entries)} entries ({total}) from {root}", highlight=False)
