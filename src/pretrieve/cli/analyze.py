"""``pretrieve analyze coverage``: input-token coverage of checkpoints (paper 000 §3.2, Algorithm 1).

Thin wrapper over :mod:`pretrieve.analysis.coverage`: loads each checkpoint and the first ``--num-texts``
passages of the corpus (file order, so the same texts for every checkpoint and every run), prints the
coverage table (rows = checkpoints, columns = k) and the top-20 tokens of the first texts with ✓/✗, and
writes ``coverage.json``, ``coverage.png`` (ratio vs k, one line per checkpoint) and ``provenance.json``
into ``--out``.
"""

from __future__ import annotations

import logging
from itertools import islice
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli import app
from pretrieve.errors import InputError

analyze_app = typer.Typer(help="Interpret representations: input-token coverage (paper 000 §3.2).",
                          no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")
out_console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--ks must be comma-separated integers, got '{text}'", field="ks") from None
    if not ks or any(k < 1 for k in ks):
        raise InputError(f"--ks must list positive integers, got '{text}'", field="ks")
    return sorted(set(ks))


def _first_texts(corpus: str, count: int) -> list[str]:
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    texts = list(islice(iter_pretrain_texts(corpus), count))
    if not texts:
        raise InputError("the corpus has no passages", path=corpus)
    return texts


def _tokenizer(model_path: str, override: Optional[str]):
    from transformers import AutoTokenizer

    from pretrieve.models import resolve_model

    source = resolve_model(override) if override else model_path
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        raise InputError("no tokenizer found with the checkpoint; pass --tokenizer (a path or alias such as "
                         "minilm)", path=source) from None


@analyze_app.command("coverage")
def coverage_command(
    model: list[str] = typer.Option(..., "--model", "-m", help="Checkpoint directory or offline alias; repeat "
                                    "to compare checkpoints."),
    corpus: str = typer.Option(..., help="Texts: BEIR directory / corpus.jsonl / JSONL with 'text' / plain "
                               "text; the first --num-texts passages in file order are used."),
    num_texts: int = typer.Option(500, min=1, help="Passages analysed (the first N of the corpus)."),
    ks: str = typer.Option("10,20,50,100", help="Comma-separated k values (top-k tokens of CLS·Eᵀ)."),
    max_len: int = typer.Option(144, min=2, help="Texts are truncated to this many tokens."),
    exclude_stopwords: bool = typer.Option(False, "--exclude-stopwords",
                                           help="Drop English stopword tokens from the input set and ranking."),
    examples: int = typer.Option(3, min=0, help="Texts whose top tokens are printed with ✓/✗."),
    show_top: int = typer.Option(20, min=1, help="Top tokens shown per example."),
    batch_size: int = typer.Option(32, min=1, help="Texts per forward pass."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer path/alias when a checkpoint has none."),
    out: Optional[Path] = typer.Option(None, help="Directory for coverage.json, coverage.png, provenance.json."),
) -> None:
    """Input-token coverage ratio of each checkpoint's [CLS] projected to the vocabulary."""
    from transformers.utils import logging as hf_logging

    from pretrieve.analysis.coverage import format_examples, load_encoder, token_coverage
    from pretrieve.models import resolve_model

    hf_logging.set_verbosity_error()  # HF's load report; our encoder logs a created MLM head itself
    hf_logging.disable_progress_bar()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    k_values = _parse_ks(ks)
    texts = _first_texts(corpus, num_texts)
    reports = {}
    for name in model:
        if name in reports:
            raise InputError(f"checkpoint '{name}' is given twice", field="model")
        path = resolve_model(name)
        encoder, created = load_encoder(path)
        report = token_coverage(encoder, _tokenizer(path, tokenizer), texts, ks=k_values, max_len=max_len,
                                batch_size=batch_size, exclude_stopwords=exclude_stopwords,
                                num_examples=examples, show_top=show_top, name=name, head_created=created)
        reports[name] = report
        err.print(f"{name}: {report.num_texts} texts analysed", highlight=False)

    _print_table(reports, k_values, "input token coverage ratio: hits among the top-k / k", "ratio")
    _print_table(reports, k_values, "share of the input's distinct tokens found in the top-k", "input_recall")
    if any(r.head_created for r in reports.values()):
        out_console.print("* MLM head created (checkpoint had none): transform random, decoder tied to the "
                          "input embeddings — a baseline, not a trained head.", highlight=False)
    for name, report in reports.items():
        if report.examples:
            out_console.print(f"\n[bold]{name}[/bold] — top-{show_top} tokens of CLS·Eᵀ (✓ in the input, ✗ not)")
            out_console.print(format_examples(report), highlight=False, markup=False)
    if out is not None:
        _write_outputs(out, reports, dict(corpus=corpus, num_texts=len(texts), ks=k_values, max_len=max_len,
                                          exclude_stopwords=exclude_stopwords))


def _print_table(reports, ks: list[int], title: str, attribute: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("checkpoint")
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    for name, report in reports.items():
        values = getattr(report, attribute)
        label = f"{name} *" if report.head_created else name
        table.add_row(label, *(f"{values[k]:.4f}" for k in ks))
    out_console.print(table)


def _write_outputs(out: Path, reports, settings: dict) -> None:
    from pretrieve.analysis.coverage import plot_coverage
    from pretrieve.io_utils import write_json
    from pretrieve.provenance import write_provenance

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "coverage.json", {"settings": settings,
                                       "checkpoints": {name: r.to_dict() for name, r in reports.items()}})
    plot_coverage(reports, out / "coverage.png")
    write_provenance(out, {"analysis": "coverage", **settings})
    err.print(f"wrote {out / 'coverage.json'}, {out / 'coverage.png'}", highlight=False)
