"""``pretrieve bench pretrain | masking | encode | ann | search-memory | scale``: speed benchmarks on this machine.

Thin wrappers: parse options, call :func:`pretrieve.bench.pretrain_speed.bench_pretrain`,
:func:`pretrieve.masking.latency.masking_latency` or :func:`pretrieve.bench.encode_speed.encoding_throughput`,
print a markdown report (stdout) and, with ``--out FILE.md``, write it plus ``FILE.json``. Progress goes to
stderr. ``bench pretrain`` and ``bench encode`` take ``--device cpu|cuda`` (default cpu: the CPU reports are
unchanged); on CUDA the timings are synchronised, the peak GPU memory is reported and the report names the GPU
(``--device cuda`` where torch sees none: one ``error:`` line, exit 2). ``bench masking --kinds ...,pmi`` times
CDMAE's importance-aware masker with the n-gram statistics of the whole ``--corpus`` (or ``--statistics``, e.g. a
directory of ``pretrieve stats pmi``); counted before timing.
The quality benchmarks (``bench quality``, ``bench claims``) live in :mod:`pretrieve.cli.bench_quality`.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer
from rich.console import Console

from pretrieve.bench import search_speed
from pretrieve.bench.report import bench_device, environment, environment_lines, markdown_table, write_report
from pretrieve.bench.scale import STAGES, ScaleSettings, report_markdown, run_scale_bench
from pretrieve.cli.root import app
from pretrieve.cli.tokenized import DEFAULT_MAX_LEN, pretrain_cache_dir
from pretrieve.data.collection import BeirCollection
from pretrieve.data.registry import resolve_collection
from pretrieve.errors import InputError
from pretrieve.models import no_remote_code, resolve_model
from pretrieve.ranks import shard_bounds
from pretrieve.retrieval.index import open_index, shard_dir_name

bench_app = typer.Typer(help="Benchmarks: pre-training step speed (Drop your Decoder, Ma et al. 2024, Table 4), masking latency, "
                             "encoding throughput, and retrieval quality per pre-training method (Tables 5/6).",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
err = Console(stderr=True, soft_wrap=True, emoji=False)

DEFAULT_SHAPES = "L2-H128,L6-H384"
DEFAULT_PRESETS = "mlm,bow,ae,ar,retromae"
#: ``bench encode``'s precisions per device (int8 is dynamic quantisation: CPU only).
DEFAULT_PRECISIONS = {"cpu": "fp32,auto,bf16,int8", "cuda": "fp32,auto,bf16,fp16"}
DEVICE_HELP = "cpu, or cuda / cuda:N: models, batches and timings on that GPU (synchronised), peak GPU memory."


def _quiet_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from transformers.utils import logging as hf_logging  # lazy: transformers

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _split(text: str, what: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise InputError(f"give at least one {what}", field=what)
    return items


def _set_threads(threads: Optional[int]) -> None:
    if threads is not None:
        import torch  # lazy: torch

        if threads < 1:
            raise InputError(f"--threads must be ≥ 1, got {threads}", field="threads")
        torch.set_num_threads(threads)


def _emit(markdown: str, data: dict[str, Any], out: Optional[Path]) -> None:
    typer.echo(markdown)
    if out is not None:
        md_path, json_path = write_report(markdown, data, out)
        err.print(f"wrote {md_path} and {json_path}", highlight=False)


def _default_tokenizer():
    """The uncased BERT vocabulary (30,522) of the offline all-MiniLM package, or of SPLADE-tiny (the same
    vocabulary) where that package is not installed (GPU images carry the smaller one)."""
    from transformers import AutoTokenizer  # lazy: transformers

    try:
        path = resolve_model("minilm")
    except InputError:
        path = resolve_model("splade-tiny")
    return AutoTokenizer.from_pretrained(path, **no_remote_code(path))


def _targets(model: Optional[str], shapes: str) -> list[tuple[str, Any, Any]]:
    """``[(name, config, tokenizer)]``: the --model checkpoint's config, or one random-init config per shape
    (real uncased vocabulary of the offline all-MiniLM package)."""
    from pretrieve.bench.pretrain_speed import is_shape, parse_shape  # lazy: torch

    if model is not None and not is_shape(model):
        from transformers import AutoConfig, AutoTokenizer  # lazy: transformers

        path = resolve_model(model)
        config = AutoConfig.from_pretrained(path, **no_remote_code(path))
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **no_remote_code(path))
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
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    packing: bool = typer.Option(False, "--packing", help="Instead of the methods side by side: the first preset "
                                 "on --corpus unpacked and packed (default corpus: a generated BookCorpus-like "
                                 "stream, packed across its lines): real-text share and real-text tokens/s."),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Pre-training step speed per method, Drop your Decoder (Ma et al. 2024) Table 4 on this machine."""
    from pretrieve.bench.pretrain_speed import PretrainBenchSettings, bench_pretrain, load_texts, result_markdown  # lazy: torch

    device = bench_device(device)
    _quiet_logging()
    _set_threads(threads)
    settings = PretrainBenchSettings(presets=tuple(_split(presets, "preset")), batch_size=batch_size,
                                     max_len=max_len, steps=steps, warmup=warmup, bf16=bf16, seed=seed,
                                     reference=reference, floor=floor, device=device)
    settings.validate()
    if packing:
        _bench_packing(model, shapes, corpus, settings, out)
        return
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


def _bench_packing(model: Optional[str], shapes: str, corpus: Optional[str], settings, out: Optional[Path]) -> None:
    """``bench pretrain --packing``: :func:`pretrieve.bench.pretrain_speed.bench_packing` per shape."""
    from pretrieve.bench.pretrain_speed import bench_packing, bookcorpus_like, packing_markdown  # lazy: torch

    with tempfile.TemporaryDirectory(prefix="pretrieve-packing-") as tmp:
        source = corpus or str(bookcorpus_like(Path(tmp) / "bookcorpus-like.txt", seed=settings.seed))
        results, sections = [], []
        for index, (name, config, tokenizer) in enumerate(_targets(model, shapes)):
            err.print(f"[bench pretrain --packing] {name}: 2 arms × {settings.warmup + settings.steps} steps",
                      highlight=False)
            result = bench_packing(config, tokenizer, source, Path(tmp) / f"cache-{index}", settings,
                                   across=corpus is None,
                                   progress=lambda line: err.print(f"  {line}", highlight=False))
            result.settings["shape"] = name
            results.append(result)
            sections.append(f"{packing_markdown(result)}\n- shape: {name}")
    env = environment()
    header = "\n".join(["## Packed pre-training text", "", *environment_lines(env),
                         f"- texts: {corpus or 'a generated BookCorpus-like stream (one short sentence per line)'}"])
    _emit("\n\n".join([header, *sections]), {"environment": env, "corpus": corpus,
                                              "packing": [r.to_dict() for r in results]}, out)


@bench_app.command("masking")
def bench_masking_command(
    batch_size: int = typer.Option(128, min=1, help="Sequences per batch (CDMAE, Li et al. 2023, Table 6: 128)."),
    max_len: int = typer.Option(150, min=2, help="Sequence length (CDMAE, Li et al. 2023, Table 6: 150)."),
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
    """Per-batch masking latency (CDMAE, Li et al. 2023, Table 6 setting), all kinds interleaved in one process."""
    from pretrieve.bench.pretrain_speed import load_texts  # lazy: torch
    from pretrieve.masking.latency import masking_latency  # lazy: torch

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
    from pretrieve.masking.pmi import DEFAULT_WINDOW, resolve_statistics  # lazy: torch

    err.print(f"[bench masking] pmi statistics from {source}", highlight=False)
    return resolve_statistics(source, window=DEFAULT_WINDOW, vocab_size=len(tokenizer), tokenizer=tokenizer,
                              max_len=DEFAULT_MAX_LEN, cache_dir=pretrain_cache_dir(cache_dir))


@bench_app.command("encode")
def bench_encode_command(
    model: str = typer.Option("minilm", help="Encoder checkpoint: path or offline alias (minilm), or a BERT shape "
                              "(L12-H768 = bert-base, L<n>-H<d>[-A<heads>]): random init, mean pooling."),
    data: str = typer.Option(..., "--data", "-d", help="Collection (BEIR layout) whose first passages are encoded."),
    num_texts: int = typer.Option(512, min=1, help="Passages encoded per run (the first N of the corpus)."),
    batch_size: int = typer.Option(64, min=1, help="Encoding batch size."),
    max_length: int = typer.Option(256, min=8, help="Maximum tokens per passage."),
    repeats: int = typer.Option(3, min=1, help="Interleaved rounds (every variant once per round; median reported)."),
    precisions: Optional[str] = typer.Option(None, help="pretrieve precisions to measure (comma-separated: "
                                             "auto, fp32, bf16, fp16, int8 — int8 on the CPU only).",
                                             show_default=f"{DEFAULT_PRECISIONS['cpu']}; on CUDA "
                                                          f"{DEFAULT_PRECISIONS['cuda']}"),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default: torch's choice)."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Encoding throughput: pretrieve at each precision vs sentence-transformers fp32, interleaved rounds."""
    from pretrieve.bench.encode_speed import encoding_throughput, random_st_checkpoint  # lazy: torch
    from pretrieve.bench.pretrain_speed import is_shape, load_texts, parse_shape  # lazy: torch

    device = bench_device(device)
    shape = parse_shape(model) if is_shape(model) else None
    _quiet_logging()
    _set_threads(threads)
    texts = load_texts(resolve_collection(data), num_texts, tokenizer=None)
    chosen = _split(precisions or DEFAULT_PRECISIONS[device.partition(":")[0]], "precision")
    with tempfile.TemporaryDirectory(prefix="pretrieve-bench-encode-") as scratch:
        if shape is not None:
            tokenizer = _default_tokenizer()
            path = random_st_checkpoint(shape.config(len(tokenizer), max(512, max_length)), tokenizer,
                                        Path(scratch) / shape.name, max_seq_length=max_length)
        else:
            path = resolve_model(model)
        result = encoding_throughput(path, texts, batch_size=batch_size, max_length=max_length, repeats=repeats,
                                     precisions=chosen, device=device)
    on_gpu = device != "cpu"
    rows = [[name, v["passages_per_s"], v["median_s"], v["cpu_median_s"], v.get("vs_st"), v.get("vs_st_cpu"),
             v.get("vs_fp32"), v.get("vs_fp32_paired"), v.get("vs_fp32_cpu"), v.get("max_abs_diff_vs_st"),
             v.get("min_cosine_vs_st")] + ([v.get("peak_memory_mib")] if on_gpu else [])
            for name, v in result["variants"].items()]
    env = environment()
    model_text = f"{model} (random init)" if shape is not None else model
    lines = ["## Encoding throughput", "", *environment_lines(env),
             *([f"- device: {result['device_name']} (every variant; timings synchronised)"] if on_gpu else []),
             f"- model {model_text}, {result['passages']} passages of {data}, batch {batch_size}, max length "
             f"{result['max_length']}, median of {repeats} interleaved rounds; auto = {result['auto']} here", "",
             markdown_table(["variant", "passages/s", "median s", "CPU s", "vs sentence-transformers", "(CPU time)",
                             "vs pretrieve fp32", "(paired)", "(CPU time)", "max |Δ| vs ST", "min cos vs ST"]
                            + (["peak GPU MiB"] if on_gpu else []), rows, digits=3)]
    _emit("\n".join(lines), {"environment": env, **result}, out)


@bench_app.command("ann")
def bench_ann_command(
    work: Path = typer.Option(..., help="Working directory: the real index, the synthetic vectors and their FAISS "
                              "indexes (reused when current)."),
    model: str = typer.Option("minilm", help="Retriever whose vectors are scaled up: path or offline alias."),
    data: str = typer.Option(..., "--data", "-d", help="Collection (BEIR layout): its passages are the real vectors, "
                             "its test queries and qrels are searched."),
    size: int = typer.Option(1_000_000, min=1, help="Vectors in the synthetic collection (real ones included)."),
    factories: Optional[str] = typer.Option(None, help="FAISS factories to compare with exact search, ';'-separated, "
                                            "with search parameters after '@' (nprobe=N, ef=N).",
                                            show_default="IVF1024,Flat@nprobe=16;IVF1024,Flat@nprobe=32;"
                                                         "IVF1024,SQ8@nprobe=32;IVF1024,PQ48@nprobe=32;HNSW32@ef=128"),
    k: int = typer.Option(1000, min=10, help="Depth searched (recall@100 and @1000 against exact)."),
    repeats: int = typer.Option(3, min=1, help="Interleaved search rounds (medians reported)."),
    train_size: int = typer.Option(100_000, min=1000, help="Vectors sampled to train IVF / PQ indexes."),
    split: str = typer.Option("test", help="Qrels split of the queries."),
    seed: int = typer.Option(0, help="Seed of the synthetic vectors."),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default: torch's choice)."),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Approximate FAISS indexes vs exact search on SIZE vectors with a real retriever's statistics."""
    from pretrieve.retrieval.batches import encode_all  # lazy: torch
    from pretrieve.retrieval.load import load_retriever  # lazy: torch
    from pretrieve.retrieval.search import build_index  # lazy: torch

    _quiet_logging()
    _set_threads(threads)
    collection = BeirCollection(resolve_collection(data))
    retriever = load_retriever(model, device="cpu", precision="fp32")
    real = open_index(build_index(retriever, collection.load_corpus(), work / "real", show_progress=True))
    queries = collection.load_queries(split)
    query_ids = list(queries)
    query_vectors = encode_all(retriever.query, [queries[q] for q in query_ids])["embeddings"]
    vectors = np.asarray(real.array("embeddings"))
    spread = search_speed.matching_spread(vectors)
    settings = {"size": size, "spread": spread, "seed": seed, "real": str(real.meta.get("model"))}
    synthetic = work / f"synthetic-{size}"
    if not search_speed.is_current(synthetic, settings):
        ids = real.id_list() + [f"synthetic-{i}" for i in range(size - real.count)]
        search_speed.write_vectors(synthetic, search_speed.synthetic_chunks(vectors, size, spread, seed), ids,
                                   settings)
    result = search_speed.ann_benchmark(synthetic, query_vectors, query_ids, collection.load_qrels(split),
                                        factories=[f for f in factories.split(";") if f] if factories
                                        else search_speed.DEFAULT_FACTORIES, k=k, repeats=repeats,
                                        train_size=train_size)
    result.update(spread=spread, real_vectors=real.count, real_nn_cosine=search_speed.nearest_neighbour_cosine(vectors))
    headers = ["index", "build s", "search s", "speed-up", "recall@100 vs exact", "recall@1000 vs exact",
               "nDCG@10", "R@100", "R@1000"]
    rows = [[name, v["build_s"], v["search_s"], v["speedup"], v.get("recall@100_vs_exact"),
             v.get("recall@1000_vs_exact"), v.get("nDCG@10"), v.get("R@100"), v.get("R@1000")]
            for name, v in result["factories"].items()]
    env = environment()
    lines = ["## Approximate vs exact dense search", "", *environment_lines(env),
             f"- {result['vectors']:,} vectors ({result['dim']}-d): {real.count:,} real {model} passage vectors of "
             f"{data} + synthetic ones (spread {spread}), {len(query_ids)} {split} queries, k = {k}, medians of "
             f"{repeats} interleaved rounds", "", markdown_table(headers, rows, digits=4)]
    _emit("\n".join(lines), {"environment": env, **result}, out)


@bench_app.command("search-memory")
def bench_search_memory_command(
    work: Path = typer.Option(..., help="Directory for the sharded index (reused when current)."),
    size: int = typer.Option(1_000_000, min=1, help="Vectors."),
    dim: int = typer.Option(768, min=1, help="Vector dimension."),
    shards: int = typer.Option(4, min=1, help="Shards (contiguous row ranges)."),
    queries: int = typer.Option(300, min=1, help="Random queries searched."),
    k: int = typer.Option(1000, min=1, help="Depth."),
    out: Optional[Path] = typer.Option(None, help="Write the report to FILE.md and the numbers to FILE.json."),
) -> None:
    """Peak RSS of exact search over a sharded index of SIZE random unit vectors, in a fresh process."""

    rng = np.random.default_rng(0)
    root = work / f"random-{size}x{dim}"
    for shard in range(shards):
        start, end = shard_bounds(size, shard, shards)
        settings = {"size": size, "dim": dim, "shard": shard, "num_shards": shards, "seed": 0}
        path = root / shard_dir_name(shard, shards)
        if not search_speed.is_current(path, settings):
            chunks = (_unit(np.random.default_rng([shard, first]), min(1 << 16, end - first), dim)
                      for first in range(start, end, 1 << 16))
            search_speed.write_vectors(path, chunks, [f"d{i}" for i in range(start, end)], settings)
    result = search_speed.exact_search_peak_rss(root, _unit(rng, queries, dim), k=k)
    env = environment()
    lines = ["## Peak memory of exact sharded search", "", *environment_lines(env),
             f"- {result['vectors']:,} × {dim}-d float32 vectors in {result['shards']} shards of "
             f"{result['largest_shard_mib']:.0f} MiB; {queries} queries, k = {k}", "",
             f"- peak RSS {result['peak_rss_mib']:.0f} MiB (process baseline {result['baseline_rss_mib']:.0f} MiB); "
             f"bar: one shard + 512 MiB = {result['bar_mib']:.0f} MiB; search {result['search_s']} s"]
    _emit("\n".join(lines), {"environment": env, **result}, out)


def _unit(rng, count: int, dim: int):
    vectors = rng.standard_normal((count, dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _numbers(text: str, what: str) -> list[float]:
    values = []
    for item in _split(text, what):
        try:
            number = float(item)
        except ValueError:
            raise InputError(f"'{item}' is not a number", field=what) from None
        values.append(int(number) if what in ("grid-epochs", "grid-grow-epochs") and number.is_integer() else number)
    return values


@bench_app.command("scale")
def bench_scale_command(
    sizes: str = typer.Option("100000", help="Comma-separated collection sizes (passages)."),
    source: str = typer.Option("scifact", "--source", help="Collection whose sentences make the passages."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the collections, the stages' outputs and "
                                                    "logs, and scale.md / scale.json."),
    stages: Optional[str] = typer.Option(None, help="Comma-separated stages to run (default: all): "
                                                    + ", ".join(STAGES) + "."),
    model: str = typer.Option("minilm", help="Small encoder for the model stages (path or offline alias)."),
    eval_queries: int = typer.Option(300, min=1, help="Evaluation queries (qrels/test.tsv)."),
    train_queries: int = typer.Option(1000, min=1, help="Training queries (negatives, mining, teacher scores)."),
    max_negatives: int = typer.Option(9, min=1, help="Negatives scored by the teacher per training query."),
    factory: str = typer.Option("HNSW32", help="FAISS factory string of the approximate search."),
    words: int = typer.Option(60, min=1, help="Words per synthetic passage."),
    seed: int = typer.Option(0, help="Seed of the synthetic collections."),
    timeout: Optional[float] = typer.Option(None, min=1, help="Seconds after which a stage is stopped."),
) -> None:
    """Every stage on synthetic collections of the given sizes, each in its own measured process."""
    settings = ScaleSettings(source=source, out=str(out), sizes=[int(s) for s in _split(sizes, "size")],
                             stages=_split(stages, "stage") if stages else list(STAGES), model=model,
                             eval_queries=eval_queries, train_queries=train_queries, max_negatives=max_negatives,
                             factory=factory, words=words, seed=seed, timeout=timeout)
    results = run_scale_bench(settings, log=lambda line: err.print(line, highlight=False))
    env = environment()
    markdown = "\n".join(["# pretrieve bench scale", "", *environment_lines(env), "", report_markdown(results)])
    write_report(markdown, {"environment": env, **results}, Path(out) / "scale.md")
    typer.echo(markdown)
