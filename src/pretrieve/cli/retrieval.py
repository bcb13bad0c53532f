"""``pretrieve bm25 | encode | search | dense``: first-stage retrieval runs from the command line.

Thin wrappers over :mod:`pretrieve.retrieval`: parse options, load the collection, call one function and print one
summary line. Run files are written by :mod:`pretrieve.retrieval.runs` (TREC format, atomically):
:func:`~pretrieve.retrieval.runs.lexical_run_file` for ``bm25`` (the ``bm25`` lexical back-end),
:func:`~pretrieve.retrieval.runs.search_run` for ``search`` and ``dense``. ``encode``, ``search`` and ``dense`` all
load the model with :func:`~pretrieve.retrieval.load.load_retriever` and go through
:func:`~pretrieve.retrieval.search.build_index` / :func:`~pretrieve.retrieval.search.search`, for every kind of
retriever. Progress bars (with ETA) go to stderr. The modules that import torch (the retriever's loading and search)
are imported inside the commands that need them, so that `pretrieve --help` and `pretrieve bm25` start without torch
or FAISS.

Outputs are checked before the work (:func:`pretrieve.outputs.producing`): a run file or index that cannot be
written, a directory where a run file should be, a file-size limit below the largest file (the BM25 index's score
array, the embeddings) or a disk without room for the index is a one-line error naming the user's path before
anything is built or encoded (``dense``/``encode``: once the model is loaded, before encoding); a write that still
fails is reported the same way. Leftovers of killed runs (a BM25 or dense scratch index beside the run, a half-written
shard) are removed first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from pretrieve.cli.root import app
from pretrieve.cli.options import PASSAGE_PROMPT_HELP, QUERY_PROMPT_HELP
from pretrieve.data.collection import BeirCollection
from pretrieve.data.jsonl import iter_lines
from pretrieve.data.registry import resolve_collection
from pretrieve.data.trec import run_bytes
from pretrieve.errors import ConfigError
from pretrieve.outputs import check_space, claim, preflight, producing, refuse_existing, write_failures
from pretrieve.retrieval import runs
from pretrieve.retrieval.cache import corpus_index_dir
from pretrieve.retrieval.index import SEARCH_MODES, SearchOptions, find_shards, lexical_backend, shard_dir_name

err = Console(stderr=True, emoji=False)

DATA_HELP = "Collection directory in BEIR layout (or a known collection name)."
MODEL_HELP = ("Retriever: a local checkpoint directory (sentence-transformers, Hugging Face, or fine-tuned by "
              "pretrieve) or a hub name.")
POOLING_HELP = ("Pooling: cls | mean | max | lasttoken | weightedmean | mean_sqrt_len_tokens (join with '+'); "
                "default: the checkpoint's sentence-transformers Pooling config, else cls. Plain checkpoints only.")
NORMALIZE_HELP = "L2-normalise vectors; default: whether the checkpoint has a sentence-transformers Normalize module."
MODE_HELP = ("Search of a model fine-tuned with the sparse/hybrid representation: dense ([CLS] part), sparse "
             "(SPLADE part, inverted index), hybrid (alpha*dense + beta*sparse with the trained weights) or rrf "
             "(reciprocal rank fusion, k=60, of the dense and sparse top 1000); default: as trained.")
PRECISION_HELP = ("Encoder precision: auto (bf16 where the hardware computes it natively — CUDA with bf16, CPU "
                  "with AVX512-BF16/AMX — else fp32), fp32, bf16, fp16 (autocast) or int8 (dynamic quantisation of "
                  "the linear layers, CPU).")
FACTORY_HELP = ("faiss.index_factory string for dense vectors: Flat (exact), HNSW32, IVF4096,Flat, IVF4096,PQ64, "
                "IVF4096,SQ8, SQfp16, ... (built once per index and kept beside it).")
GPU_HELP = ("Search on the GPU(s) (FAISS with GPU support; exact search also through torch on CUDA); default: when "
            "FAISS sees a GPU, or for exact search without FAISS, when torch does.")

# The options several commands share, declared once (typer reads the option from the annotation).
Model = Annotated[str, typer.Option("--model", "-m", help=MODEL_HELP)]
Data = Annotated[str, typer.Option("--data", "-d", help=DATA_HELP)]
RunOut = Annotated[Path, typer.Option("--out", "-o", help="Run file to write (TREC format).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out run file, and an index "
                                                             "folder pretrieve did not write (refused otherwise).")]
Split = Annotated[str, typer.Option("--split", "-s", help="Qrels split whose judged queries are searched.")]
Depth = Annotated[int, typer.Option("--k", min=1, help="Documents retrieved per query.")]
Factory = Annotated[str, typer.Option("--factory", help=FACTORY_HELP)]
Nprobe = Annotated[Optional[int], typer.Option("--nprobe", min=1, help="IVF cells visited per query.")]
EfSearch = Annotated[Optional[int], typer.Option("--ef-search", min=1, help="HNSW efSearch.")]
Gpu = Annotated[Optional[bool], typer.Option("--gpu/--no-gpu", help=GPU_HELP, show_default=False)]
Mode = Annotated[Optional[str], typer.Option("--mode", help=MODE_HELP)]
MaxLength = Annotated[Optional[int], typer.Option("--max-length", min=2,
                                                  help="Passage token limit; default: the model's.")]
Pooling = Annotated[Optional[str], typer.Option("--pooling", help=POOLING_HELP)]
Normalize = Annotated[Optional[bool], typer.Option("--normalize/--no-normalize", help=NORMALIZE_HELP,
                                                   show_default=False)]
Precision = Annotated[str, typer.Option("--precision", help=PRECISION_HELP)]
Bf16 = Annotated[bool, typer.Option("--bf16", hidden=True, help="Same as --precision bf16.")]
QueryPrompt = Annotated[Optional[str], typer.Option("--query-prompt", help=QUERY_PROMPT_HELP)]
PassagePrompt = Annotated[Optional[str], typer.Option("--passage-prompt", help=PASSAGE_PROMPT_HELP)]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:1, ... or auto.")]


def _collection(data: str) -> BeirCollection:
    return BeirCollection(resolve_collection(data))


def _precision(precision: str, bf16: bool) -> str:
    return "bf16" if bf16 else precision


def _load(model: str, device: str, precision: str, max_length: Optional[int] = None,
          query_max_length: Optional[int] = None, pooling: Optional[str] = None, normalize: Optional[bool] = None,
          query_prompt: Optional[str] = None, passage_prompt: Optional[str] = None):
    from pretrieve.retrieval.load import load_retriever  # lazy: torch

    retriever = load_retriever(model, device=device, precision=precision, max_length=max_length,
                               query_max_length=query_max_length, pooling=pooling, normalize=normalize,
                               query_prompt=query_prompt, passage_prompt=passage_prompt)
    err.print(f"retriever {model}: {retriever.describe()}", highlight=False)
    return retriever


def _options(factory: str = "Flat", metric: str = "ip", nprobe: Optional[int] = None,
             ef_search: Optional[int] = None, gpu: Optional[bool] = None) -> SearchOptions:
    return SearchOptions(factory=factory, metric=metric, nprobe=nprobe, ef_search=ef_search, use_gpu=gpu)


def _check_mode(mode: Optional[str]) -> None:
    if mode is not None and mode not in SEARCH_MODES:
        raise ConfigError(f"--mode must be one of {', '.join(SEARCH_MODES)}, got '{mode}'")


def _index_bytes(retriever, rows: int) -> int:
    """Bytes of the float32 vectors of ``rows`` passages (the least an index of a dense retriever holds, and its
    largest file); 0 for other kinds, whose size is known only once encoded."""
    dim = retriever.passage.settings.get("dim") if retriever.kind == "dense" else None
    return rows * int(dim) * 4 if dim else 0


def _documents_up_to(corpus_path: Path, k: int) -> int:
    """The corpus's lines, counted up to ``k`` (a run holds at most that many documents per query; a large corpus
    is not read to the end)."""
    count = 0
    for count, _ in enumerate(iter_lines(corpus_path), start=1):
        if count >= k:
            break
    return count


def _report(run: dict, out: Path, began: float) -> None:
    docs = sum(len(d) for d in run.values())
    err.print(f"wrote {out}: {len(run)} queries, {docs} results in {time.perf_counter() - began:.1f} s",
              highlight=False)


@app.command("bm25")
def bm25(
    data: Data,
    out: RunOut,
    split: Split = "test",
    k: Depth = 1000,
    k1: float = typer.Option(0.9, "--k1", min=0.0, help="BM25 k1 (Pyserini default)."),
    b: float = typer.Option(0.4, "--b", min=0.0, max=1.0, help="BM25 b (Pyserini default)."),
    exclude_self: bool = typer.Option(False, "--exclude-self",
                                      help="Drop the document whose id equals the query id (ArguAna-style)."),
    index: Optional[Path] = typer.Option(None, "--index", "--save-index",
                                         help="Keep the BM25 index in this directory and reuse it while the corpus "
                                              "and settings are unchanged; default: a temporary index."),
    threads: Optional[int] = typer.Option(None, "--threads", min=0, help="Search threads.",
                                          show_default="every core"),
    overwrite: Overwrite = False,
) -> None:
    """BM25 (bm25s, Lucene scoring, English stemming and stopwords) over title + text."""
    engine = lexical_backend("bm25")
    refuse_existing(out, overwrite)
    if index is not None and index.is_dir():   # a folder the user made is not replaced (a file: the preflight's)
        claim([index], overwrite)
    began = time.perf_counter()
    collection = _collection(data)
    # an existing --index is reused while current (a stale one rebuilt: a failure then is reported all the same)
    needed, largest = (0, 0) if index is not None and index.exists() else engine.index_space(collection.corpus_path)
    if index is not None:
        preflight(index, directory=True, needed_bytes=needed, largest_file=largest)
    run_size = run_bytes(collection.load_queries(split), k, _documents_up_to(collection.corpus_path, k), "bm25")
    with producing(out, needed_bytes=run_size + (0 if index else needed), largest_file=max(largest, run_size),
                   scratch=(engine.SCRATCH_NAME,)):
        queries, lines = runs.lexical_run_file(collection, split, out, k=k, params=engine.params(k1=k1, b=b),
                                               exclude_self=exclude_self, index_dir=index, n_threads=threads,
                                               show_progress=err.is_terminal, engine="bm25")
    err.print(f"wrote {out}: {queries} queries, {lines} results in {time.perf_counter() - began:.1f} s",
              highlight=False)


@app.command("encode")
def encode(
    model: Model,
    data: Data,
    out: Annotated[Path, typer.Option("--out", "-o", help="Index directory (shards go to OUT/shard-I-of-N).")],
    shard: int = typer.Option(0, "--shard", min=0, help="Which shard of the corpus to encode (0-based)."),
    num_shards: int = typer.Option(1, "--num-shards", min=1, help="Number of contiguous corpus shards."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Passages per forward pass."),
    max_length: MaxLength = None,
    pooling: Pooling = None,
    normalize: Normalize = None,
    precision: Precision = "auto",
    bf16: Bf16 = False,
    query_prompt: QueryPrompt = None,
    passage_prompt: PassagePrompt = None,
    device: Device = "auto",
    overwrite: bool = typer.Option(False, "--overwrite", help="Re-encode even when the shard is current (and "
                                   "replace a shard folder pretrieve did not write)."),
) -> None:
    """Encode one corpus shard into OUT (skipped when it is current: same model, settings and passages)."""
    from pretrieve.retrieval.search import build_index  # lazy: torch

    claim([out / shard_dir_name(shard, num_shards)], overwrite)   # a folder the user made is not replaced
    with producing(out, directory=True):
        retriever = _load(model, device, _precision(precision, bf16), max_length=max_length, pooling=pooling,
                          normalize=normalize, query_prompt=query_prompt, passage_prompt=passage_prompt)
        corpus = _collection(data).corpus_dataset()   # memory-mapped Arrow, not Python dicts
        if overwrite or not (out / shard_dir_name(shard, num_shards)).exists():   # else reused while current
            size = _index_bytes(retriever, -(-len(corpus) // num_shards))
            check_space(out, size, size)
        began = time.perf_counter()
        shard_dir = build_index(retriever, corpus, out, shard=shard, num_shards=num_shards, batch_size=batch_size,
                                overwrite=overwrite)
    err.print(f"index shard in {shard_dir} ({time.perf_counter() - began:.1f} s)", highlight=False)


@app.command("search")
def search(
    model: Annotated[str, typer.Option("--model", "-m", help=MODEL_HELP + " The one that encoded the index.")],
    data: Data,
    index: Annotated[Path, typer.Option("--index", help="Index directory written by `pretrieve encode` (or --cache).")],
    out: RunOut,
    split: Split = "test",
    k: Depth = 1000,
    factory: Factory = "Flat",
    metric: str = typer.Option("ip", "--metric", help="ip (inner product) or l2."),
    nprobe: Nprobe = None,
    ef_search: EfSearch = None,
    gpu: Gpu = None,
    mode: Mode = None,
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Queries per forward pass."),
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length", min=2,
                                                   help="Query token limit; default: the model's."),
    pooling: Pooling = None,
    normalize: Normalize = None,
    precision: Precision = "auto",
    bf16: Bf16 = False,
    query_prompt: QueryPrompt = None,
    passage_prompt: PassagePrompt = None,
    device: Device = "auto",
    overwrite: Overwrite = False,
) -> None:
    """Encode the split's queries and search every shard of INDEX (streaming top-k merge); write the run."""
    refuse_existing(out, overwrite)
    began = time.perf_counter()
    _check_mode(mode)
    find_shards(index)  # fail on a missing or incomplete index before loading the model
    queries = _collection(data).load_queries(split)
    with producing(out, needed_bytes=run_bytes(queries, k, 1, "")):   # the index's size unread: 1 per query
        retriever = _load(model, device, _precision(precision, bf16), query_max_length=query_max_length,
                          pooling=pooling, normalize=normalize, query_prompt=query_prompt,
                          passage_prompt=passage_prompt)
        run = runs.search_run(retriever, queries, index, out, k=k, tag=mode or retriever.kind, mode=mode,
                              batch_size=batch_size, options=_options(factory, metric, nprobe, ef_search, gpu))
    _report(run, out, began)


@app.command("dense")
def dense(
    model: Model,
    data: Data,
    out: RunOut,
    split: Split = "test",
    cache: Optional[Path] = typer.Option(None, "--cache", help="Keep the corpus index here and reuse it while it "
                                                               "is current; default: the user cache, as "
                                                               "pretrieve.search (PRETRIEVE_CACHE/embeddings)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Encode the corpus into a temporary index (nothing "
                                  "kept, nothing reused)."),
    k: Depth = 1000,
    factory: Factory = "Flat",
    nprobe: Nprobe = None,
    ef_search: EfSearch = None,
    gpu: Gpu = None,
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Texts per forward pass."),
    max_length: MaxLength = None,
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length", min=2,
                                                   help="Query token limit; default: the model's (the trained "
                                                        "one for a fine-tuned retriever)."),
    pooling: Pooling = None,
    normalize: Normalize = None,
    precision: Precision = "auto",
    bf16: Bf16 = False,
    query_prompt: QueryPrompt = None,
    passage_prompt: PassagePrompt = None,
    device: Device = "auto",
    mode: Mode = None,
    overwrite: Overwrite = False,
) -> None:
    """Encode the corpus and the split's queries, search, write the run.

    Every retriever is searched the way it was trained (separate towers, CoT-MoTE experts, DupMAE's CLS+OT
    score, sparse/hybrid representations); --mode picks another search of a sparse/hybrid model, --factory an
    approximate FAISS index for dense vectors.
    """
    refuse_existing(out, overwrite)   # before torch is imported: an existing --out is refused at once
    from pretrieve.retrieval.search import INDEX_SCRATCH  # lazy: torch

    began = time.perf_counter()
    _check_mode(mode)
    collection = _collection(data)
    queries = collection.load_queries(split)
    corpus = collection.corpus_dataset()
    if cache is not None and no_cache:
        raise ConfigError("--cache keeps the corpus index and --no-cache keeps none: give one of them")
    claim([cache / shard_dir_name(0, 1) if cache else None], overwrite)   # a folder the user made is not replaced
    index = preflight(cache, directory=True) if cache else out.parent   # the corpus index (scratch: beside --out)
    run_size = run_bytes(queries, k, len(corpus), mode or "dense")
    with producing(out, needed_bytes=run_size, largest_file=run_size, scratch=(INDEX_SCRATCH,)):
        with write_failures(index):
            retriever = _load(model, device, _precision(precision, bf16), max_length=max_length,
                              query_max_length=query_max_length, pooling=pooling, normalize=normalize,
                              query_prompt=query_prompt, passage_prompt=passage_prompt)
            if cache is None and not no_cache:   # the user cache, keyed by model, corpus and settings (as search)
                cache = index = preflight(corpus_index_dir(retriever, collection.corpus_path), directory=True)
            if cache is None or not (cache / shard_dir_name(0, 1)).exists():   # else reused while current
                size = _index_bytes(retriever, len(corpus))
                check_space(index, size, size)
        run = runs.search_run(retriever, queries, corpus, out, k=k, tag=mode or "dense", failures_at=index,
                              cache_dir=cache, mode=mode, batch_size=batch_size,
                              options=_options(factory, "ip", nprobe, ef_search, gpu), scratch_dir=out.parent)
    _report(run, out, began)
