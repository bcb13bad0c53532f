"""``pretrieve bench pretrain | masking | encode | quality``: speed and quality benchmarks on this machine.

Thin wrappers: parse options, call :func:`pretrieve.bench.pretrain_speed.bench_pretrain`,
:func:`pretrieve.masking.latency.masking_latency` or :func:`pretrieve.retrieval.throughput.encoding_throughput`,
print a markdown report (stdout) and, with ``--out FILE.md``, write it plus ``FILE.json``. Progress goes to
stderr. ``bench masking --kinds ...,pmi`` times CDMAE's importance-aware masker with the n-gram statistics of the
whole ``--corpus`` (or ``--statistics``, e.g. a directory of ``pretrieve stats pmi``); counted before timing.

``bench quality`` is different: it trains. It calls :func:`pretrieve.bench.quality.run_quality_bench` (every
method pre-trained at the same budget, fine-tuned the same way, evaluated on every ``--eval`` collection,
over seeds; resumable) and writes ``results.md`` / ``results.json`` / ``results.png`` into ``--out``; the
markdown is also printed. ``--report-only`` recomputes the report from the saved runs of ``--out``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from pretrieve.cli import app
from pretrieve.errors import InputError

bench_app = typer.Typer(help="Benchmarks: pre-training step speed (paper 000 Table 4), masking latency, "
                             "encoding throughput, and retrieval quality per pre-training method (Tables 5/6).",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
err = Console(stderr=True, soft_wrap=True)

DEFAULT_SHAPES = "L2-H128,L6-H384"
DEFAULT_PRESETS = "mlm,bow,ae,ar,retromae"
# Kept in sync with pretrieve.bench.quality.DEFAULT_METHODS (not imported, so that `--help` stays fast).
DEFAULT_QUALITY_METHODS = ("none", "mlm", "ae", "ar", "retromae", "bow", "dupmae", "cpdae", "cdmae", "cotmae",
                           "cotmote")


def _quiet_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _split(text: str, what: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise InputError(f"give at least one {what}", field=what)
    return items


def _set_threads(threads: Optional[int]) -> None:
    if threads is not None:
        import torch

        if threads < 1:
            raise InputError(f"--threads must be ≥ 1, got {threads}", field="threads")
        torch.set_num_threads(threads)


def _emit(markdown: str, data: dict[str, Any], out: Optional[Path]) -> None:
    typer.echo(markdown)
    if out is not None:
        from pretrieve.bench.report import write_report

        md_path, json_path = write_report(markdown, data, out)
        err.print(f"wrote {md_path} and {json_path}", highlight=False)


def _default_tokenizer():
    from transformers import AutoTokenizer

    from pretrieve.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("minilm"))


def _targets(model: Optional[str], shapes: str) -> list[tuple[str, Any, Any]]:
    """``[(name, config, tokenizer)]``: the --model checkpoint's config, or one random-init config per shape
    (real uncased vocabulary of the offline all-MiniLM package)."""
    from pretrieve.bench.pretrain_speed import is_shape, parse_shape

    if model is not None and not is_shape(model):
        from transformers import AutoConfig, AutoTokenizer

        from pretrieve.models import resolve_model

        path = resolve_model(model)
        config = AutoConfig.from_pretrained(path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tokenizer = _default_tokenizer()
        return [(f"{model} (L{config.num_hidden_layers}-H{config.hidden_size})", config, tokenizer)]
    tokenizer = _default_tokenizer()
    shape_list = [parse_shape(name) for name in ([model] if model is not None else _split(shapes, "shape"))]
    return [(shape.name, shape.config(len(tokenizer), 512), tokenizer) for shape in shape_list]


@bench_app.command("pretrain")
def bench_pretrain_command(
    model: Optional[str] = typer.Option(None, help="A shape (L6-H384, L2-H128, L12-H768, L<n>-H<d>[-A<heads>]) "
                                        "or a checkpoint path/alias whose config is benchmarked (random init). "
                                        "Replaces --shapes."),
    shapes: str = typer.Option(DEFAULT_SHAPES, help="Comma-separated shapes, each benchmarked in turn."),
    presets: str = typer.Option(DEFAULT_PRESETS, help="Comma-separated presets (or method files)."),
    batch_size: int = typer.Option(32, min=1, help="Examples per optimizer step."),
    max_len: int = typer.Option(128, min=8, help="Maximum tokens per example."),
    steps: int = typer.Option(10, min=1, help="Measured steps (medians over these)."),
    warmup: int = typer.Option(3, min=0, help="Discarded warm-up steps."),
    corpus: Optional[str] = typer.Option(None, help="Texts: BEIR dir / JSONL / text file (first passages in "
                                         "file order); default: synthetic texts from the vocabulary."),
    bf16: bool = typer.Option(False, "--bf16/--no-bf16", help="bf16 autocast for every runner."),
    reference: bool = typer.Option(True, "--reference/--no-reference",
                                   help="Also run the Hugging Face full-vocabulary reference step."),
    floor: bool = typer.Option(True, "--floor/--no-floor", help="Also run the encoder-only step (no vocabulary "
                               "projection): the bound on any MLM-head speed-up."),
    seed: int = typer.Option(0, help="Seed of initial weights, texts and masking."),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default: torch's choice)."),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Pre-training step speed per method, paper 000 Table 4 on this machine."""
    from pretrieve.bench.pretrain_speed import PretrainBenchSettings, bench_pretrain, load_texts, result_markdown
    from pretrieve.bench.report import environment, environment_lines

    _quiet_logging()
    _set_threads(threads)
    settings = PretrainBenchSettings(presets=tuple(_split(presets, "preset")), batch_size=batch_size,
                                     max_len=max_len, steps=steps, warmup=warmup, bf16=bf16, seed=seed,
                                     reference=reference, floor=floor)
    settings.validate()
    results, sections = [], []
    for name, config, tokenizer in _targets(model, shapes):
        texts = load_texts(corpus, batch_size * (steps + warmup), tokenizer, seed=seed)
        err.print(f"[bench pretrain] {name}: {len(settings.presets) + int(reference) + int(floor)} runners × "
                  f"{warmup + steps} steps", highlight=False)
        result = bench_pretrain(config, tokenizer, texts, settings, shape_name=name,
                                progress=lambda line: err.print(f"  {line}", highlight=False))
        results.append(result)
        sections.append(result_markdown(result))
    env = environment()
    header = "\n".join(["## Pre-training step speed", "", *environment_lines(env),
                         f"- texts: {corpus or 'synthetic (random vocabulary words)'}"])
    markdown = "\n\n".join([header, *sections])
    _emit(markdown, {"environment": env, "corpus": corpus, "results": [r.to_dict() for r in results]}, out)


@bench_app.command("masking")
def bench_masking_command(
    batch_size: int = typer.Option(128, min=1, help="Sequences per batch (paper 003 Table 6: 128)."),
    max_len: int = typer.Option(150, min=2, help="Sequence length (paper 003 Table 6: 150)."),
    repeats: int = typer.Option(20, min=1, help="Timed rounds (median reported)."),
    corpus: Optional[str] = typer.Option(None, help="Texts: BEIR dir / JSONL / text file; default: synthetic. "
                                         "Also the source of the pmi kind's n-gram statistics (whole corpus)."),
    kinds: str = typer.Option("random,whole_word,enhanced", help="Comma-separated masking kinds "
                              "(random, whole_word, enhanced, enhanced_independent, pmi)."),
    statistics: Optional[str] = typer.Option(None, help="n-gram statistics of the pmi kind: a directory of "
                                             "`pretrieve stats pmi` or a text source to count",
                                             show_default="--corpus, else the batch's own texts"),
    cache_dir: Optional[Path] = typer.Option(None, help="Token cache for counting statistics",
                                             show_default="$PRETRIEVE_CACHE/pretrain or ~/.cache/pretrieve/pretrain"),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default: torch's choice)."),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Per-batch masking latency (paper 003 Table 6 setting), all kinds interleaved in one process."""
    from pretrieve.bench.pretrain_speed import load_texts
    from pretrieve.bench.report import environment, environment_lines, markdown_table
    from pretrieve.masking.latency import masking_latency

    _quiet_logging()
    _set_threads(threads)
    tokenizer = _default_tokenizer()
    texts = load_texts(corpus, batch_size, tokenizer)
    chosen = _split(kinds, "kind")
    pmi_source = (statistics or corpus) if "pmi" in chosen else None
    pmi_statistics = _pmi_statistics(pmi_source, tokenizer, cache_dir) if pmi_source else None
    seconds = masking_latency(tokenizer, texts, batch_size=batch_size, max_len=max_len, repeats=repeats,
                              kinds=chosen, pmi_statistics=pmi_statistics)
    base = seconds.get("random")
    rows = [[kind, value * 1000, None if base is None else value / base] for kind, value in seconds.items()]
    env = environment()
    lines = ["## Masking latency", "", *environment_lines(env),
             f"- batch {batch_size} × length {max_len}, median of {repeats} rounds, kinds "
             f"interleaved; texts: {corpus or 'synthetic'}"]
    if "pmi" in chosen:
        lines.append("- pmi statistics: " + (f"{pmi_source} ({int(pmi_statistics.totals[1]):,} tokens)"
                                             if pmi_statistics is not None else "the batch's own texts"))
    markdown = "\n".join([*lines, "", markdown_table(["kind", "ms / batch", "vs random"], rows, digits=2)])
    _emit(markdown, {"environment": env, "batch_size": batch_size, "max_len": max_len, "repeats": repeats,
                     "corpus": corpus, "pmi_statistics": pmi_source if "pmi" in chosen else None,
                     "seconds": seconds}, out)


def _pmi_statistics(source: str, tokenizer: Any, cache_dir: Optional[Path]):
    """n-gram statistics (window 4) of ``source``: a saved statistics directory, or a text source tokenised into
    pre-training chunks of ``pretrieve pretrain``'s default 144 tokens (the benchmark's ``--max-len`` is the batch
    shape, not how the corpus is chunked) and counted; both cached, see :func:`pretrieve.masking.pmi.resolve_statistics`."""
    from pretrieve.cli.stats import DEFAULT_MAX_LEN, pretrain_cache_dir
    from pretrieve.masking.pmi import DEFAULT_WINDOW, resolve_statistics

    err.print(f"[bench masking] pmi statistics from {source}", highlight=False)
    return resolve_statistics(source, window=DEFAULT_WINDOW, vocab_size=len(tokenizer), tokenizer=tokenizer,
                              max_len=DEFAULT_MAX_LEN, cache_dir=pretrain_cache_dir(cache_dir))


@bench_app.command("encode")
def bench_encode_command(
    model: str = typer.Option("minilm", help="Encoder checkpoint: path or offline alias (minilm)."),
    data: str = typer.Option(..., "--data", "-d", help="Collection (BEIR layout) whose first passages are encoded."),
    num_texts: int = typer.Option(512, min=1, help="Passages encoded per run (the first N of the corpus)."),
    batch_size: int = typer.Option(64, min=1, help="Encoding batch size."),
    max_length: int = typer.Option(256, min=8, help="Maximum tokens per passage."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per variant (median reported)."),
    bf16: bool = typer.Option(True, "--bf16/--no-bf16", help="Also measure bf16 autocast."),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default: torch's choice)."),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Encoding throughput: pretrieve fp32/bf16 vs sentence-transformers on the same passages."""
    from pretrieve.bench.pretrain_speed import load_texts
    from pretrieve.bench.report import environment, environment_lines, markdown_table
    from pretrieve.data.registry import resolve_collection
    from pretrieve.models import resolve_model
    from pretrieve.retrieval.throughput import encoding_throughput

    _quiet_logging()
    _set_threads(threads)
    texts = load_texts(resolve_collection(data), num_texts, tokenizer=None)
    result = encoding_throughput(resolve_model(model), texts, batch_size=batch_size, max_length=max_length,
                                 repeats=repeats, include_bf16=bf16)
    variants = result["variants"]
    st = variants.get("sentence_transformers_fp32", {}).get("passages_per_s")
    rows = [[name, v["passages_per_s"], v["median_s"], None if st is None else v["passages_per_s"] / st]
            for name, v in variants.items()]
    env = environment()
    lines = ["## Encoding throughput", "", *environment_lines(env),
             f"- model {model}, {result['passages']} passages of {data}, batch {batch_size}, max length "
             f"{result['max_length']}, median of {repeats} runs", "",
             markdown_table(["variant", "passages/s", "median s", "vs sentence-transformers"], rows, digits=2)]
    for key in ("max_abs_diff_fp32_vs_st", "max_abs_diff_bf16_vs_fp32"):
        if key in result:
            lines.append(f"- {key.replace('_', ' ')}: {result[key]:.2e}")
    _emit("\n".join(lines), {"environment": env, **result}, out)


@bench_app.command("quality")
def bench_quality_command(
    out: Path = typer.Option(..., help="Directory of the comparison (bench.json, one folder per method, results.*). "
                             "Rerun the same command to resume."),
    base: str = typer.Option("splade-tiny", help="Starting checkpoint of every method: path or offline alias."),
    methods: str = typer.Option(",".join(DEFAULT_QUALITY_METHODS), help="Comma-separated presets, plus 'none' "
                                "(no pre-training: the base model is fine-tuned)."),
    pretrain_data: Optional[str] = typer.Option(None, "--pretrain-data", help="Pre-training corpus: BEIR dir / "
                                                "JSONL / text, or a collection name", show_default="--train"),
    train: Optional[str] = typer.Option(None, "--train", help="Fine-tuning collection (BEIR, train split); "
                                        "required unless --report-only."),
    eval_: Optional[list[str]] = typer.Option(None, "--eval", help="Evaluation collection; repeat (or comma-separate) "
                                              "for several: the first is in-domain, the others zero-shot.",
                                              show_default="--train"),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="Pre-training steps of every method",
                                         show_default="100; 30 with --quick; minilm-like bases 40"),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Repetitions: seeds --seed, --seed+1, ..."),
    seed: int = typer.Option(42, "--seed", help="First seed."),
    quick: bool = typer.Option(False, "--quick", help="Small budget for a first look (30 pre-training steps × 16, "
                               "30 fine-tuning steps × 16)."),
    batch_size: Optional[int] = typer.Option(None, min=1, help="Pre-training batch size",
                                            show_default="32; 16 quick or minilm-like bases"),
    max_len: Optional[int] = typer.Option(None, min=8, help="Pre-training max length", show_default="144; 128 quick"),
    lr: Optional[float] = typer.Option(None, help="Pre-training learning rate",
                                       show_default="3e-4; 5e-5 for minilm-like bases"),
    finetune: Optional[str] = typer.Option(None, help="Stage-1 fine-tuning overrides: a YAML/JSON file (keys of "
                                           "`pretrieve finetune --config`, plus 'methods: {NAME: {...}}' per method) "
                                           "or key=value,key=value."),
    split: str = typer.Option("test", help="Qrels split of the evaluation collections."),
    depth: int = typer.Option(1000, min=100, help="Retrieved passages per query."),
    coverage_texts: int = typer.Option(300, min=1, help="Passages of the coverage sample (the first N of the "
                                       "pre-training corpus)."),
    alpha: float = typer.Option(0.05, help="Significance level of the paired t-tests."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run again the method × seeds that failed."),
    keep_checkpoints: bool = typer.Option(False, "--keep-checkpoints", help="Keep training checkpoints of "
                                          "finished runs (final models and runs are always kept)."),
    report_only: bool = typer.Option(False, "--report-only", help="Only recompute results.* from the saved runs."),
    progress: bool = typer.Option(False, "--progress/--no-progress", help="Progress bars of each stage."),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default: torch's choice)."),
) -> None:
    """Retrieval quality per pre-training method at an equal budget (paper 000 Tables 5/6), with coverage."""
    from pretrieve.bench import quality

    _quiet_logging()
    _set_threads(threads)
    if report_only:
        summary = quality.summarize(out)
        paths = quality.write_report(out, summary)
    else:
        if train is None:
            raise InputError("give --train DIR (the fine-tuning collection)", field="train")
        pretrain, finetune_defaults = quality.defaults_for_base(base, quick)
        for key, value in (("max_steps", budget), ("batch_size", batch_size), ("max_len", max_len), ("lr", lr)):
            if value is not None:
                pretrain[key] = value
        finetune_values, per_method = quality.split_finetune_overrides(
            quality.parse_overrides(finetune, "finetune"), "--finetune")
        settings = quality.QualityBenchSettings(
            base=base, train=train, out=str(out), methods=tuple(_split(methods, "method")),
            pretrain_data=pretrain_data, eval=tuple(e for entry in eval_ or [] for e in _split(entry, "eval")),
            seeds=tuple(range(seed, seed + seeds)), pretrain=pretrain,
            finetune={**finetune_defaults, **finetune_values},
            finetune_per_method=per_method, split=split, depth=depth, coverage_texts=coverage_texts, alpha=alpha,
            retry_failed=retry_failed, keep_checkpoints=keep_checkpoints, show_progress=progress)
        started = time.perf_counter()
        summary = quality.run_quality_bench(settings, progress=lambda line: err.print(line, highlight=False,
                                                                                      markup=False))
        err.print(f"[bench quality] {time.perf_counter() - started:.0f} s", highlight=False)
        paths = [Path(out) / name for name in ("results.md", "results.json", "results.png")]
    typer.echo(quality.results_markdown(summary))
    err.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, markup=False)
