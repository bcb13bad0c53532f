"""``pretrieve data``: validate a BEIR-layout collection, list the known collections, download one, convert
MS MARCO / TREC DL / Tevatron / ir_datasets inputs into one.

Thin wrappers over :mod:`pretrieve.data.registry` and :mod:`pretrieve.data.convert`; malformed input surfaces as
a located ``InputError``, which ``pretrieve.cli.main`` prints as one line with exit code 2.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli.root import app
from pretrieve.data.convert import convert, write_summary
from pretrieve.data.folds import halves
from pretrieve.data.registry import (KNOWN_COLLECTIONS, check_collection, data_roots, default_cache_dir,
                                     fetch_collection, find_collection, resolve_collection)
from pretrieve.errors import ConfigError

data_app = typer.Typer(help="Validate, list, download and convert BEIR-layout collections.", no_args_is_help=True)
app.add_typer(data_app, name="data")

out = Console(emoji=False)
err = Console(stderr=True, emoji=False)


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
    """List the known downloadable collections, and the local ones under the data roots: whether each is here
    (``--data NAME`` uses that copy, found as the resolver finds it: the data roots, then the cache) or would be
    downloaded."""
    cache = cache_dir or default_cache_dir()
    table = Table("name", "splits", "md5", "cached", "description")
    found_at = {}
    for info in KNOWN_COLLECTIONS.values():
        found, _ = find_collection(info.name, cache_dir=cache)
        found_at[info.name] = found
        table.add_row(info.name, ",".join(info.splits), info.md5 or "-", "yes" if found else "no", info.description)
    for root in data_roots():   # collections that are only local (adi, med, ...): usable by name all the same
        for directory in sorted(root.iterdir()) if root.is_dir() else []:
            if directory.name in found_at or not any((directory / f).exists() for f in ("corpus.jsonl",
                                                                                         "corpus.jsonl.gz")):
                continue
            found_at[directory.name] = directory
            splits = sorted(q.name.split(".")[0] for q in (directory / "qrels").glob("*.tsv"))
            table.add_row(directory.name, ",".join(splits), "-", "yes", "local collection")
    out.print(table)
    for name, found in found_at.items():
        if found is not None:
            out.print(f"{name}: {found}", highlight=False, soft_wrap=True)
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


@data_app.command("halves")
def halves_command(
    collection: str = typer.Argument(..., help="Collection directory in BEIR layout, or a name under a data root "
                                     "($PRETRIEVE_DATA, ../shared/data), as a recipe names it."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Parent directory of the two derived collections."),
    split: str = typer.Option("test", "--split", help="The split whose judged queries are halved."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draw (the same draw gives both collections)."),
) -> None:
    """Halve a split's judged queries (seeded) into OUT/NAME-a (train: one half, test: the other) and OUT/NAME-b
    (the reverse): the in-domain check of a collection without its own training queries."""
    for path in halves(resolve_collection(collection), out_dir, split=split, seed=seed):
        out.print(str(path))


@data_app.command("convert")
def convert_command(
    out_dir: Path = typer.Argument(..., help="BEIR collection directory to write (created if missing)."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="collection.tsv (pid<TAB>passage, or "
                                          "id<TAB>title<TAB>text), or a corpus JSONL (_id or docid, title, text)."),
    titles: Optional[Path] = typer.Option(None, "--titles", help="id<TAB>title, the corpus's ids in its order "
                                          "(RocketQA's para.title.txt): the passages' titles."),
    queries: Optional[List[Path]] = typer.Option(None, "--queries", help="qid<TAB>query file (queries.*.tsv, TREC "
                                                 "DL topics); repeatable, merged into queries.jsonl."),
    qrels: Optional[List[str]] = typer.Option(None, "--qrels", help="SPLIT=FILE: TREC (qid 0 pid grade) or BEIR "
                                              "qrels, written to qrels/SPLIT.tsv; repeatable."),
    groups: Optional[List[Path]] = typer.Option(None, "--groups", help="Tevatron training JSONL (query_id, query, "
                                                "positive_passages, negative_passages), written to "
                                                "groups/NAME.jsonl; repeatable."),
    ir_datasets: Optional[List[str]] = typer.Option(None, "--ir-datasets", help="NAME[=SPLIT], e.g. "
                                                    "msmarco-passage/dev/small=dev (needs the ir_datasets package); "
                                                    "repeatable."),
) -> None:
    """Convert MS MARCO / TREC DL files, Tevatron groups or ir_datasets names into a BEIR directory (streaming)."""
    pairs = []
    for spec in qrels or []:
        split, sep, file = spec.partition("=")
        if not sep or not split or not file:
            raise ConfigError(f"--qrels expects SPLIT=FILE, got {spec!r}")
        pairs.append((split, Path(file)))
    report = convert(out_dir, corpus=corpus, queries=queries or [], qrels=pairs, groups=groups or [],
                     ir_datasets=ir_datasets or [], titles=titles)
    text = io.StringIO()
    write_summary(report, text)
    out.print(text.getvalue().rstrip("\n"), highlight=False)
    for note in report.notes:
        err.print(f"[yellow]note:[/yellow] {note}", highlight=False)
