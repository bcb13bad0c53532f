"""``pretrieve stats pmi``: precompute the corpus n-gram statistics of importance-aware (PMI) masking.

CDMAE's ``pmi`` masker (CDMAE, Li et al. 2023, §3.2) ranks tokens by their average mutual information over the n-grams of
the pre-training corpus (:mod:`pretrieve.masking.pmi`). A pre-training run counts them itself when it starts;
this command counts them once, ahead of time, and saves them where runs can point at them with the masker
parameter ``statistics`` (``decoder_masker: {kind: pmi, ratio: 0.5, params: {statistics: DIR}}`` in a method
file). It prints the sizes (tokens, chunks, n-gram positions and stored n-grams per order) and how long
tokenising, counting and saving took.

The corpus is tokenised into the same chunk cache as pre-training (:class:`~pretrieve.data.pretrain_text.
TokenizedCorpus`, ``--max-len`` tokens per example, default 144 like ``pretrieve pretrain``). Without ``--out``
the statistics go beside that cache (``<cache key>-pmi-L<window>``), where
:func:`pretrieve.masking.pmi.corpus_statistics` — and so ``pretrieve analyze masking-stats`` and any run
with the same cache directory — finds them. Counting is always done afresh (a cached copy is replaced),
so the printed time is the real counting time.

The helpers it shares with the other PMI commands (tokenizer loading, the token cache, timed corpus loading) are in
:mod:`pretrieve.cli.tokenized`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli.root import app
from pretrieve.cli.tokenized import DEFAULT_MAX_LEN, load_tokenizer, statistics_cache_path, tokenized_corpus
from pretrieve.errors import InputError
from pretrieve.provenance import write_provenance

stats_app = typer.Typer(help="Corpus statistics: n-gram counts for importance-aware (PMI) masking.",
                        no_args_is_help=True)
app.add_typer(stats_app, name="stats")
out_console = Console(soft_wrap=True, emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)

# ---------------------------------------------------------------------- stats pmi
@stats_app.command("pmi")
def pmi_command(
    corpus: str = typer.Option(..., help="Pre-training text: BEIR directory / corpus.jsonl / JSONL with 'text' / "
                               "plain text (one passage per line)."),
    model: str = typer.Option("minilm", help="Tokenizer: checkpoint directory or offline alias (statistics are "
                              "over its token ids)."),
    window: int = typer.Option(4, min=2, max=8, help="Longest n-gram L (CDMAE, Li et al. 2023, §3.2: 4)."),
    max_len: int = typer.Option(DEFAULT_MAX_LEN, min=8, help="Tokens per pre-training example (chunking; use "
                                "the run's max_len)."),
    cache_dir: Optional[Path] = typer.Option(None, help="Token cache directory", show_default="$PRETRIEVE_CACHE/"
                                             "pretrain or ~/.cache/pretrieve/pretrain"),
    out: Optional[Path] = typer.Option(None, help="Directory for the statistics (+ provenance.json)",
                                       show_default="beside the token cache, where runs find them"),
) -> None:
    """Count the corpus n-grams (orders 1..window) once and save them for `pmi` maskers."""
    from pretrieve.masking.pmi import corpus_statistics  # lazy: torch

    tokenizer = load_tokenizer(model)
    data, tokenize_s = tokenized_corpus(corpus, tokenizer, max_len, cache_dir)
    start = time.perf_counter()
    stats = corpus_statistics(data, len(tokenizer), window, cache=False)
    count_s = time.perf_counter() - start
    target = out if out is not None else statistics_cache_path(data, window)
    if target is None:  # a TokenizedCorpus is always memory-mapped; kept for clarity
        raise InputError("the corpus cache is not on disk; pass --out", field="out")
    start = time.perf_counter()
    stats.save(target)
    save_s = time.perf_counter() - start
    timings = {"tokenize_or_load_s": tokenize_s, "count_s": count_s, "save_s": save_s}
    summary = stats.summary()
    _print_pmi_summary(stats, data, summary, timings)
    out_console.print(f"saved to {target}\nuse it with a method file: decoder_masker: {{kind: pmi, ratio: 0.5, "
                      f"params: {{statistics: {target}}}}}", highlight=False)
    write_provenance(target, {"command_group": "stats pmi", "corpus": corpus, "tokenizer": model, "window": window,
                              "max_len": max_len, "summary": summary, "timings": timings})


def _print_pmi_summary(stats: Any, data: Any, summary: dict[str, Any], timings: dict[str, float]) -> None:
    passages = data.meta.get("passages")
    out_console.print(f"{summary['tokens']:,} tokens in {summary['chunks']:,} chunks"
                      + (f" ({passages:,} passages)" if passages is not None else "")
                      + f"; {int((stats.unigram_counts > 0).sum()):,} distinct tokens; window L = {stats.window}",
                      highlight=False)
    table = Table(title="n-grams per order (stored: seen at least twice)", title_justify="left")
    for column in ("order", "positions", "stored"):
        table.add_column(column, justify="right")
    for order in range(2, stats.window + 1):
        stored = summary["stored_per_order"].get(order)
        table.add_row(str(order), f"{int(stats.totals[order]):,}", "?" if stored is None else f"{stored:,}")
    table.add_row("all", f"{int(stats.totals[2:].sum()):,}", f"{summary['stored_ngrams']:,}")
    out_console.print(table)
    out_console.print(f"stored arrays {summary['table_bytes'] / 2**20:.1f} MiB; tokenize/load "
                      f"{timings['tokenize_or_load_s']:.2f} s, count {timings['count_s']:.2f} s, save "
                      f"{timings['save_s']:.2f} s", highlight=False)
