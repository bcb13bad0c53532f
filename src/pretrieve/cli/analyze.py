"""``pretrieve analyze``: interpret representations and maskers.

* ``coverage`` — input-token coverage of checkpoints (Drop your Decoder, Ma et al. 2024, §3.2, Algorithm 1). Thin wrapper over
  :mod:`pretrieve.analysis.coverage`: loads each checkpoint and the first ``--num-texts`` passages of the
  corpus (file order, so the same texts for every checkpoint and every run), prints the coverage table
  (rows = checkpoints, columns = k) and the top-20 tokens of the first texts with ✓/✗, and writes
  ``coverage.json``, ``coverage.png`` (ratio vs k, one line per checkpoint) and ``provenance.json`` into
  ``--out``.
* ``masking-stats`` — which tokens random vs importance-aware (PMI) masking picks (CDMAE (Li et al. 2023) Fig. 2):
  share of stopwords and punctuation among the masked tokens and the top masked terms
  (:func:`pretrieve.analysis.masking_stats.compare_maskers`). The corpus is tokenised into the pre-training
  chunk cache; the n-gram statistics are those of the *whole* corpus (counted once and cached beside the
  token cache, or ``--statistics`` from ``pretrieve stats pmi``), the masks are drawn on its first
  ``--num-texts`` examples. Writes ``masking_stats.json``, ``masking_stats.md`` (the markdown table of
  :func:`~pretrieve.analysis.masking_stats.format_comparison`) and ``provenance.json`` into ``--out``.
* ``mlm-accuracy`` — held-out masked-token accuracy of a checkpoint's MLM head (:mod:`pretrieve.analysis.mlm_accuracy`):
  the from-scratch base's gate in the claims benchmark (accuracy ≥ 0.25, docs/preregistration.md); writes
  ``mlm_accuracy.json`` and ``provenance.json`` into ``--out``.
* ``word-distribution`` — CPDAE's decoded word distribution of a text (CPDAE, Ma et al. 2022, Table 4), sub-word
  probabilities summed per word (:func:`pretrieve.analysis.word_distribution.decode_words`).
* ``stopword-mass`` — the decoded probability mass on stopwords of CPDAE checkpoints on the same texts, e.g.
  with vs without the contrastive loss (CPDAE, Ma et al. 2022, §3.3; :func:`~pretrieve.analysis.word_distribution.
  stopword_mass`).

The last two need a pre-training checkpoint with CPDAE's MLP decoder: the ``final/`` directory of a
``pretrieve pretrain`` run whose method has a ``cpdae`` objective (``method.json`` + ``heads.safetensors``
beside the encoder); a run directory is accepted for its ``final/``. Anything else is an
:class:`~pretrieve.errors.InputError` naming what is missing (exit code 2), checked before weights load.
"""

from __future__ import annotations

import json
import logging
from itertools import islice
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from pretrieve.cli.root import app
from pretrieve.cli.tokenized import load_tokenizer, pretrain_cache_dir, tokenized_corpus
from pretrieve.data.pretrain_text import iter_pretrain_texts
from pretrieve.errors import InputError
from pretrieve.io_utils import write_json
from pretrieve.models import no_remote_code, resolve_model
from pretrieve.provenance import write_provenance

analyze_app = typer.Typer(help="Interpret representations and maskers: input-token coverage (Drop your Decoder, Ma et al. 2024, §3.2), "
                               "masked-token statistics (CDMAE, Li et al. 2023, Fig. 2), CPDAE word distributions (CPDAE, Ma et al. 2022, "
                               "Table 4).", no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")
out_console = Console(soft_wrap=True, emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--ks must be comma-separated integers, got '{text}'", field="ks") from None
    if not ks or any(k < 1 for k in ks):
        raise InputError(f"--ks must list positive integers, got '{text}'", field="ks")
    return sorted(set(ks))


def _first_texts(corpus: str, count: int) -> list[str]:
    texts = list(islice(iter_pretrain_texts(corpus), count))
    if not texts:
        raise InputError("the corpus has no passages", path=corpus)
    return texts


def _tokenizer(model_path: str, override: Optional[str]):
    from transformers import AutoTokenizer  # lazy: transformers

    source = resolve_model(override) if override else model_path
    try:
        return AutoTokenizer.from_pretrained(source, **no_remote_code(source))
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
    from transformers.utils import logging as hf_logging  # lazy: transformers

    from pretrieve.analysis.coverage import format_examples, load_encoder, token_coverage  # lazy: torch

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


@analyze_app.command("mlm-accuracy")
def mlm_accuracy_command(
    model: str = typer.Option(..., "--model", "-m", help="Checkpoint directory or offline alias (with its MLM head)."),
    corpus: str = typer.Option(..., help="Held-out texts (none the model trained on): BEIR directory / JSONL / "
                               "plain text; the first --num-texts passages in file order are used."),
    num_texts: int = typer.Option(500, min=1, help="Passages evaluated (the first N of the corpus)."),
    max_len: int = typer.Option(144, min=2, help="Texts are truncated to this many tokens."),
    mask_ratio: float = typer.Option(0.15, help="Share of each text's tokens masked (at least one)."),
    seed: int = typer.Option(0, help="Seed of the masked positions."),
    batch_size: int = typer.Option(32, min=1, help="Texts per forward pass."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer path/alias when the checkpoint has none."),
    out: Optional[Path] = typer.Option(None, help="Directory for mlm_accuracy.json, provenance.json."),
) -> None:
    """Held-out masked-token accuracy of a checkpoint's MLM head — the from-scratch base's gate of the claims
    benchmark (accuracy ≥ 0.25; docs/preregistration.md)."""
    from pretrieve.analysis.coverage import load_encoder  # lazy: torch
    from pretrieve.analysis.mlm_accuracy import mlm_accuracy  # lazy: torch

    path = resolve_model(model)
    texts = _first_texts(corpus, num_texts)
    encoder, created = load_encoder(path)
    if created:
        raise InputError("the checkpoint has no MLM head: its accuracy would measure a random head", path=path)
    result = mlm_accuracy(encoder, _tokenizer(path, tokenizer), texts, max_len=max_len, mask_ratio=mask_ratio,
                          seed=seed, batch_size=batch_size, name=model)
    report = result.to_dict()
    out_console.print(f"{model}: masked-token accuracy {result.accuracy:.4f} over {result.masked_tokens} masked "
                      f"tokens of {result.num_texts} texts; cross-entropy {result.loss:.4f} (perplexity "
                      f"{result.perplexity:.1f}); gate accuracy ≥ {report['gate']['accuracy_at_least']}: "
                      f"{'passed' if report['gate']['passed'] else 'not passed'}", highlight=False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "mlm_accuracy.json", {**report, "corpus": corpus})
        write_provenance(out, {"analysis": "mlm-accuracy", "checkpoint": str(path), "corpus": corpus,
                               "num_texts": len(texts), **result.settings})
        err.print(f"wrote {out / 'mlm_accuracy.json'}", highlight=False)


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
    from pretrieve.analysis.coverage import plot_coverage  # lazy: torch

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "coverage.json", {"settings": settings,
                                       "checkpoints": {name: r.to_dict() for name, r in reports.items()}})
    plot_coverage(reports, out / "coverage.png")
    write_provenance(out, {"analysis": "coverage", **settings})
    err.print(f"wrote {out / 'coverage.json'}, {out / 'coverage.png'}", highlight=False)


# ---------------------------------------------------------------------- masking-stats
@analyze_app.command("masking-stats")
def masking_stats_command(
    corpus: str = typer.Option(..., help="Texts: BEIR directory / corpus.jsonl / JSONL with 'text' / plain text."),
    model: str = typer.Option("minilm", help="Tokenizer: checkpoint directory or offline alias."),
    ratio: float = typer.Option(0.15, min=0.0, max=1.0, help="Mask ratio of both maskers (BERT: 0.15, CDMAE's "
                                "decoder: 0.5)."),
    num_texts: Optional[int] = typer.Option(None, min=1, help="Examples masked: the first N pre-training chunks "
                                            "(--max-len tokens) in corpus order", show_default="all"),
    max_len: int = typer.Option(144, min=8, help="Tokens per example (chunking, as in pre-training)."),
    window: int = typer.Option(4, min=2, max=8, help="Longest n-gram L of the PMI statistics."),
    sigma: float = typer.Option(1.0, min=0.0, help="σ of the Gaussian noise added to the importance."),
    whole_word: bool = typer.Option(False, "--whole-word/--token", help="Mask whole words (both maskers) "
                                    "instead of tokens."),
    statistics: Optional[str] = typer.Option(None, help="Precomputed statistics (pretrieve stats pmi)",
                                             show_default="counted from --corpus and cached"),
    top: int = typer.Option(10, min=1, help="Top masked terms listed per masker."),
    seed: int = typer.Option(0, help="Seed of both maskers."),
    cache_dir: Optional[Path] = typer.Option(None, help="Token cache directory", show_default="$PRETRIEVE_CACHE/"
                                             "pretrain or ~/.cache/pretrieve/pretrain"),
    out: Optional[Path] = typer.Option(None, help="Directory for masking_stats.json, masking_stats.md, "
                                       "provenance.json."),
) -> None:
    """Stopword and punctuation share of masked tokens, random vs PMI masking (CDMAE, Li et al. 2023, Fig. 2)."""
    from pretrieve.analysis.masking_stats import compare_maskers, format_comparison  # lazy: torch
    from pretrieve.masking.pmi import resolve_statistics  # lazy: torch

    tokenizer = load_tokenizer(model)
    data, _ = tokenized_corpus(corpus, tokenizer, max_len, cache_dir)
    stats = resolve_statistics(statistics if statistics is not None else data, window=window,
                               vocab_size=len(tokenizer), tokenizer=tokenizer, max_len=max_len,
                               cache_dir=pretrain_cache_dir(cache_dir))
    examples = len(data) if num_texts is None else min(num_texts, len(data))
    err.print(f"{examples} of {len(data)} examples, statistics over {int(stats.totals[1]):,} tokens",
              highlight=False)
    result = compare_maskers(data, tokenizer, stats, ratio=ratio, sigma=sigma, whole_word=whole_word,
                             max_examples=examples, seed=seed, top_k=top)
    _print_masking_stats(result, ratio, top)
    if out is not None:
        settings = dict(corpus=corpus, tokenizer=model, ratio=ratio, examples=examples, max_len=max_len,
                        window=window, sigma=sigma, whole_word=whole_word, statistics=statistics, seed=seed)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "masking_stats.json", {"settings": settings,
                                                "maskers": {name: item.to_dict() for name, item in result.items()}})
        (out / "masking_stats.md").write_text(format_comparison(result) + "\n", encoding="utf-8")
        write_provenance(out, {"analysis": "masking-stats", **settings})
        err.print(f"wrote {out / 'masking_stats.json'}, {out / 'masking_stats.md'}", highlight=False)


def _print_masking_stats(result, ratio: float, top: int) -> None:
    shares = Table(title=f"masked tokens at ratio {ratio:g}: share of stopwords and punctuation",
                   title_justify="left")
    for column, justify in (("masker", "left"), ("masked tokens", "right"), ("stopwords", "right"),
                            ("punctuation", "right"), ("both", "right")):
        shares.add_column(column, justify=justify)
    for item in result.values():
        shares.add_row(item.masker, f"{item.masked_tokens:,}", f"{item.stopword_share:.1%}",
                       f"{item.punctuation_share:.1%}", f"{item.uninformative_share:.1%}")
    out_console.print(shares)
    for attribute, title in (("top_terms", "most often masked tokens (share of the masked tokens)"),
                             ("top_words", "most often fully masked words (share of the fully masked words)")):
        table = Table(title=f"top-{top} {title}", title_justify="left")
        table.add_column("#", justify="right")
        lists = {name: getattr(item, attribute) for name, item in result.items()}
        for name in lists:
            table.add_column(name)
        for rank in range(max((len(terms) for terms in lists.values()), default=0)):
            table.add_row(str(rank + 1), *(f"{terms[rank][0]} ({terms[rank][2]:.1%})" if rank < len(terms) else ""
                                           for terms in lists.values()))
        out_console.print(table, markup=False)


# ---------------------------------------------------------------------- CPDAE checkpoints
def cpdae_checkpoint(name: str) -> Path:
    """The directory of a pre-training checkpoint with CPDAE's MLP decoder, or an InputError saying what is missing.

    Checks ``method.json`` (a ``cpdae`` objective) and ``heads.safetensors`` (the decoder's weights) before any
    weight is loaded. A run directory (``pretrieve pretrain --out``) stands for its ``final/``.
    """
    from pretrieve.modeling.pretrain_model import HEADS_FILE, METHOD_FILE  # lazy: torch

    path = Path(resolve_model(name))
    if not path.is_dir():
        raise InputError("checkpoint directory not found", path=path)
    if not (path / METHOD_FILE).exists() and (path / "final" / METHOD_FILE).exists():
        path = path / "final"
    method_path = path / METHOD_FILE
    if not method_path.exists():
        raise InputError(f"not a pre-training checkpoint ({METHOD_FILE} missing), so it has no CPDAE decoder; "
                         "give the final/ directory of a `pretrieve pretrain --method cpdae` run", path=path)
    try:
        method = json.loads(method_path.read_text(encoding="utf-8"))
        objectives = [str(spec["name"]) for spec in method["objectives"]]
    except (ValueError, KeyError, TypeError):
        raise InputError("unreadable method file (expected {name, objectives: [{name, ...}]})",
                         path=method_path) from None
    if "cpdae" not in objectives:
        raise InputError(f"the checkpoint was pre-trained with method '{method.get('name', '?')}' (objectives: "
                         f"{', '.join(objectives) or 'none'}), which has no CPDAE MLP decoder; give a checkpoint "
                         "of a method with the 'cpdae' objective (e.g. --method cpdae)", path=path)
    heads = path / HEADS_FILE
    if not heads.exists() or not _has_head(heads, "cpdae."):
        raise InputError(f"{HEADS_FILE} with the CPDAE decoder weights (cpdae.*) is missing; the checkpoint cannot "
                         "decode word distributions", path=path)
    return path


def _has_head(heads: Path, prefix: str) -> bool:
    from safetensors import safe_open  # lazy: safetensors

    with safe_open(str(heads), framework="pt") as handle:
        return any(key.startswith(prefix) for key in handle.keys())


def _load_cpdae(name: str, tokenizer_override: Optional[str]):
    """``(PretrainModel in eval mode, tokenizer, checkpoint path)`` of a CPDAE checkpoint."""
    from transformers.utils import logging as hf_logging  # lazy: transformers

    from pretrieve.analysis.word_distribution import as_pretrain_model  # lazy: torch

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = cpdae_checkpoint(name)
    return as_pretrain_model(path), _tokenizer(str(path), tokenizer_override), path


def _cpdae_setting(path: Path) -> str:
    """The ``cpdae`` objective's parameters as ``contrast=js, cl_weight=0.1`` (for tables)."""
    from pretrieve.modeling.pretrain_model import METHOD_FILE  # lazy: torch

    method = json.loads((path / METHOD_FILE).read_text(encoding="utf-8"))
    params = next((spec.get("params") or {} for spec in method["objectives"] if spec["name"] == "cpdae"), {})
    return ", ".join(f"{key}={value}" for key, value in params.items()) or "defaults"


# ---------------------------------------------------------------------- word-distribution
@analyze_app.command("word-distribution")
def word_distribution_command(
    model: str = typer.Option(..., "--model", "-m", help="CPDAE pre-training checkpoint (final/ of a run)."),
    text: list[str] = typer.Option(..., "--text", "-t", help="Text to decode; repeat for several."),
    top: int = typer.Option(20, min=1, help="Top words of the text and top vocabulary tokens shown."),
    max_len: int = typer.Option(512, min=2, help="Texts are truncated to this many tokens."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer path/alias when the checkpoint has none."),
    out: Optional[Path] = typer.Option(None, help="Directory for word_distribution.json, provenance.json."),
) -> None:
    """CPDAE's decoded word distribution of each text, sub-words summed per word (CPDAE, Ma et al. 2022, Table 4)."""
    from pretrieve.analysis.word_distribution import decode_words  # lazy: torch

    texts = [item for item in text if item.strip()]
    if not texts:
        raise InputError("--text is empty", field="text")
    encoder, tok, path = _load_cpdae(model, tokenizer)
    decoded = decode_words(encoder, tok, texts, top_k=top, max_len=max_len)
    for index, item in enumerate(decoded, start=1):
        out_console.print(f"\n[bold]text {index}[/bold] — decoded probability of each word (Σ over its sub-words)")
        out_console.print(item.render(), highlight=False, markup=False)
        out_console.print(f"stopword mass {item.stopword_mass:.4f}; mass on the text's tokens {item.text_mass:.4f}",
                          highlight=False)
        table = Table(title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("word of the text")
        table.add_column("p", justify="right")
        table.add_column("vocabulary token")
        table.add_column("p", justify="right")
        for rank in range(max(len(item.top_words), len(item.top_tokens))):
            word = item.top_words[rank] if rank < len(item.top_words) else ("", None)
            token = item.top_tokens[rank] if rank < len(item.top_tokens) else ("", None)
            table.add_row(str(rank + 1), word[0], _probability(word[1]), token[0], _probability(token[1]))
        out_console.print(table, markup=False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "word_distribution.json", {"checkpoint": str(path), "texts": [d.to_dict() for d in decoded]})
        write_provenance(out, {"analysis": "word-distribution", "checkpoint": str(path), "top": top,
                               "max_len": max_len})
        err.print(f"wrote {out / 'word_distribution.json'}", highlight=False)


def _probability(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4g}"


# ---------------------------------------------------------------------- stopword-mass
@analyze_app.command("stopword-mass")
def stopword_mass_command(
    model: list[str] = typer.Option(..., "--model", "-m", help="CPDAE checkpoint; repeat to compare (e.g. with "
                                    "and without the contrastive loss)."),
    corpus: str = typer.Option(..., help="Texts: BEIR directory / corpus.jsonl / JSONL with 'text' / plain "
                               "text; the first --num-texts passages in file order are used."),
    num_texts: int = typer.Option(500, min=1, help="Passages averaged over (the first N of the corpus)."),
    max_len: int = typer.Option(144, min=2, help="Texts are truncated to this many tokens."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer path/alias when a checkpoint has none."),
    out: Optional[Path] = typer.Option(None, help="Directory for stopword_mass.json, provenance.json."),
) -> None:
    """Mean decoded probability mass on stopwords per CPDAE checkpoint (CPDAE, Ma et al. 2022, §3.3)."""
    from pretrieve.analysis.word_distribution import stopword_mass  # lazy: torch

    if len(set(model)) != len(model):
        raise InputError("a checkpoint is given twice", field="model")
    texts = _first_texts(corpus, num_texts)
    paths = {name: cpdae_checkpoint(name) for name in model}  # every checkpoint checked before any loads
    masses: dict[str, float] = {}
    for name in model:
        encoder, tok, _ = _load_cpdae(name, tokenizer)
        masses[name] = stopword_mass(encoder, tok, texts, max_len=max_len)
        err.print(f"{name}: {len(texts)} texts decoded", highlight=False)
    first = masses[model[0]]
    table = Table(title=f"decoded probability mass on stopwords, mean over {len(texts)} texts", title_justify="left")
    for column, justify in (("checkpoint", "left"), ("cpdae objective", "left"), ("stopword mass", "right"),
                            ("vs first", "right")):
        table.add_column(column, justify=justify)
    for name, mass in masses.items():
        table.add_row(name, _cpdae_setting(paths[name]), f"{mass:.4f}", f"{mass / first:.3f}×" if first else "—")
    out_console.print(table, markup=False)
    if out is not None:
        settings = dict(corpus=corpus, num_texts=len(texts), max_len=max_len)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "stopword_mass.json", {"settings": settings, "checkpoints": {
            name: {"path": str(paths[name]), "cpdae": _cpdae_setting(paths[name]), "stopword_mass": mass}
            for name, mass in masses.items()}})
        write_provenance(out, {"analysis": "stopword-mass", **settings})
        err.print(f"wrote {out / 'stopword_mass.json'}", highlight=False)
