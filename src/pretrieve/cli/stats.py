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

This module also holds the small helpers the other PMI commands share (``analyze masking-stats``,
``bench masking --kinds pmi``): tokenizer loading, the default cache directory and timed corpus loading.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli import app
from pretrieve.data.pretrain_text import TokenizedCorpus
from pretrieve.errors import InputError
from pretrieve.models import no_remote_code, resolve_model
from pretrieve.provenance import write_provenance

stats_app = typer.Typer(help="Corpus statistics: n-gram counts for importance-aware (PMI) masking.",
                        no_args_is_help=True)
app.add_typer(stats_app, name="stats")
out_console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_MAX_LEN = 144  # pretrieve pretrain's default: the same token cache key


# ---------------------------------------------------------------------- shared helpers
def load_tokenizer(name: str) -> Any:
    """The tokenizer of a checkpoint directory or offline alias (``minilm``), as a clear error when absent."""
    from transformers import AutoTokenizer  # heavy: keeps pretrieve --help torch-free

    path = resolve_model(name)
    try:
        return AutoTokenizer.from_pretrained(path, **no_remote_code(path))
    except (OSError, ValueError):
        raise InputError("no tokenizer found (give a checkpoint directory with its tokenizer, or an alias "
                         "such as minilm)", path=path) from None


def pretrain_cache_dir(override: Optional[Path]) -> Path:
    """``override``, else the directory where :func:`pretrieve.masking.pmi.resolve_statistics` caches token
    ids of text sources (``$PRETRIEVE_CACHE/pretrain`` or ``~/.cache/pretrieve/pretrain``)."""
    if override is not None:
        return override
    from pretrieve.masking.pmi import _default_cache_dir  # heavy: keeps pretrieve --help torch-free

    return _default_cache_dir()


def tokenized_corpus(corpus: str, tokenizer: Any, max_len: int, cache_dir: Optional[Path]) -> tuple[Any, float]:
    """``(TokenizedCorpus, seconds)``: the corpus tokenised into chunks of ``max_len`` (or read from the cache)."""
    start = time.perf_counter()
    data = TokenizedCorpus.build(corpus, tokenizer, max_len, pretrain_cache_dir(cache_dir), show_progress=False)
    return data, time.perf_counter() - start


def statistics_cache_path(corpus: Any, window: int) -> Optional[Path]:
    """Where :func:`pretrieve.masking.pmi.corpus_statistics` caches the statistics of a memory-mapped corpus
    (``<token cache dir>-pmi-L<window>``), or None for an in-memory corpus."""
    filename = getattr(corpus.tokens, "filename", None)
    if not filename:
        return None
    cache = Path(filename).parent
    return cache.with_name(f"{cache.name}-pmi-L{window}")


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
    from pretrieve.masking.pmi import corpus_statistics  # heavy: keeps pretrieve --help torch-free

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
