"""``pretrieve bm25 | encode | search | dense``: first-stage retrieval runs from the command line.

Thin wrappers over :mod:`pretrieve.retrieval`: parse options, load the collection, call one function,
write the run (TREC format, atomically) and print one summary line. Progress bars (with ETA) go to
stderr.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from pretrieve.errors import ConfigError
from rich.console import Console

from pretrieve.cli import app
from pretrieve.data.beir import BeirCollection
from pretrieve.data.registry import resolve_collection
from pretrieve.data.trec import write_run

err = Console(stderr=True)

DATA_HELP = "Collection directory in BEIR layout (or a known collection name)."
MODEL_HELP = "Encoder: a local checkpoint directory (sentence-transformers or Hugging Face) or a hub name."
POOLING_HELP = ("Pooling: cls | mean | max | lasttoken | weightedmean | mean_sqrt_len_tokens (join with '+'); "
                "default: the checkpoint's sentence-transformers Pooling config, else cls.")
NORMALIZE_HELP = "L2-normalise vectors; default: whether the checkpoint has a sentence-transformers Normalize module."
MODE_HELP = ("Search of a model fine-tuned with the sparse/hybrid representation: dense ([CLS] part), sparse "
             "(SPLADE part, inverted index), hybrid (alpha*dense + beta*sparse with the trained weights) or rrf "
             "(reciprocal rank fusion, k=60, of the dense and sparse top 1000); default: as trained.")




def _collection(data: str) -> BeirCollection:
    return BeirCollection(resolve_collection(data))


def _load_encoder(model: str, pooling: Optional[str], normalize: Optional[bool], max_length: Optional[int],
                  device: str):
    from pretrieve.retrieval.encoder import DenseEncoder

    encoder = DenseEncoder.load(model, pooling=pooling, normalize=normalize, max_length=max_length, device=device)
    settings = encoder.describe()
    err.print(f"encoder {model}: pooling={settings['pooling']} normalize={settings['normalize']} "
              f"max_length={settings['max_length']} dim={settings['dim']} device={encoder.device}", highlight=False)
    return encoder


def _is_pretrieve_retriever(model: str) -> bool:
    """Whether ``model`` is a dual encoder saved by ``pretrieve finetune`` (it has ``dual_encoder.json``)."""
    return (Path(model) / "dual_encoder.json").exists()


def _report(run: dict, out: Path, began: float) -> None:
    docs = sum(len(d) for d in run.values())
    err.print(f"wrote {out}: {len(run)} queries, {docs} results in {time.perf_counter() - began:.1f} s",
              highlight=False)


@app.command("bm25")
def bm25(
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Run file to write (TREC format)."),
    split: str = typer.Option("test", "--split", "-s", help="Qrels split whose judged queries are searched."),
    k: int = typer.Option(1000, "--k", min=1, help="Documents retrieved per query."),
    k1: float = typer.Option(0.9, "--k1", min=0.0, help="BM25 k1 (Pyserini default)."),
    b: float = typer.Option(0.4, "--b", min=0.0, max=1.0, help="BM25 b (Pyserini default)."),
    exclude_self: bool = typer.Option(False, "--exclude-self",
                                      help="Drop the document whose id equals the query id (ArguAna-style)."),
    index: Optional[Path] = typer.Option(None, "--index", "--save-index",
                                         help="Keep the BM25 index in this directory and reuse it while the corpus "
                                              "and settings are unchanged; default: a temporary index."),
    threads: Optional[int] = typer.Option(None, "--threads", min=0, help="Search threads.",
                                          show_default="every core"),
) -> None:
    """BM25 (bm25s, Lucene scoring, English stemming and stopwords) over title + text."""
    from pretrieve.retrieval.bm25 import BM25Params, bm25_run_file

    began = time.perf_counter()
    queries, lines = bm25_run_file(resolve_collection(data), split, out, k=k, params=BM25Params(k1=k1, b=b),
                                   exclude_self=exclude_self, index_dir=index, n_threads=threads,
                                   show_progress=err.is_terminal)
    err.print(f"wrote {out}: {queries} queries, {lines} results in {time.perf_counter() - began:.1f} s",
              highlight=False)


@app.command("encode")
def encode(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Embeddings directory (shards go to OUT/shard-I-of-N)."),
    shard: int = typer.Option(0, "--shard", min=0, help="Which shard of the corpus to encode (0-based)."),
    num_shards: int = typer.Option(1, "--num-shards", min=1, help="Number of contiguous corpus shards."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Passages per forward pass."),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=2,
                                             help="Passage token limit; default: the model's max_seq_length."),
    pooling: Optional[str] = typer.Option(None, "--pooling", help=POOLING_HELP),
    normalize: Optional[bool] = typer.Option(None, "--normalize/--no-normalize", help=NORMALIZE_HELP,
                                             show_default=False),
    bf16: bool = typer.Option(False, "--bf16", help="bf16 autocast (CPU or GPU); vectors are stored as float32."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:1, ... or auto."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Re-encode even when a matching shard exists."),
) -> None:
    """Encode one corpus shard into EMB_DIR (skipped when already encoded with the same settings)."""
    from pretrieve.retrieval.encode import encode_corpus

    encoder = _load_encoder(model, pooling, normalize, max_length, device)
    corpus = _collection(data).load_corpus()
    began = time.perf_counter()
    shard_dir = encode_corpus(encoder, corpus, out, shard=shard, num_shards=num_shards, batch_size=batch_size,
                              max_length=max_length, bf16=bf16, overwrite=overwrite)
    err.print(f"embeddings in {shard_dir} ({time.perf_counter() - began:.1f} s)", highlight=False)


@app.command("search")
def search(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP + " Must be the passage encoder's."),
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    index: Path = typer.Option(..., "--index", help="Embeddings directory written by `pretrieve encode`."),
    out: Path = typer.Option(..., "--out", "-o", help="Run file to write (TREC format)."),
    split: str = typer.Option("test", "--split", "-s", help="Qrels split whose judged queries are searched."),
    k: int = typer.Option(1000, "--k", min=1, help="Documents retrieved per query."),
    factory: str = typer.Option("Flat", "--factory", help="faiss.index_factory string: Flat (exact), HNSW32, "
                                                          "IVF256,Flat, ..."),
    metric: str = typer.Option("ip", "--metric", help="ip (inner product) or l2."),
    nprobe: Optional[int] = typer.Option(None, "--nprobe", min=1, help="IVF cells visited per query."),
    ef_search: Optional[int] = typer.Option(None, "--ef-search", min=1, help="HNSW efSearch."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Queries per forward pass."),
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length", min=2,
                                                   help="Query token limit; default: the model's max_seq_length."),
    pooling: Optional[str] = typer.Option(None, "--pooling", help=POOLING_HELP),
    normalize: Optional[bool] = typer.Option(None, "--normalize/--no-normalize", help=NORMALIZE_HELP,
                                             show_default=False),
    bf16: bool = typer.Option(False, "--bf16", help="bf16 autocast for the query encoder."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:1, ... or auto."),
) -> None:
    """Encode the split's queries and search every shard in INDEX; write the merged run."""
    from pretrieve.retrieval.encode import find_shards
    from pretrieve.retrieval.faiss_search import search_embeddings

    began = time.perf_counter()
    find_shards(index)  # fail on a missing or incomplete embeddings directory before loading the model
    queries = _collection(data).load_queries(split)
    encoder = _load_encoder(model, pooling, normalize, None, device)
    run = search_embeddings(encoder, queries, index, k=k, factory=factory, metric=metric, batch_size=batch_size,
                            query_max_length=query_max_length, bf16=bf16, nprobe=nprobe, ef_search=ef_search)
    write_run(run, out, tag="dense", depth=k)
    _report(run, out, began)


@app.command("dense")
def dense(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    data: str = typer.Option(..., "--data", "-d", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Run file to write (TREC format)."),
    split: str = typer.Option("test", "--split", "-s", help="Qrels split whose judged queries are searched."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Keep corpus embeddings here and reuse them; "
                                                               "default: a temporary directory."),
    k: int = typer.Option(1000, "--k", min=1, help="Documents retrieved per query."),
    factory: str = typer.Option("Flat", "--factory", help="faiss.index_factory string (Flat = exact)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Texts per forward pass."),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=2,
                                             help="Passage token limit; default: the model's max_seq_length."),
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length", min=2,
                                                   help="Query token limit; default: the model's max_seq_length."),
    pooling: Optional[str] = typer.Option(None, "--pooling", help=POOLING_HELP),
    normalize: Optional[bool] = typer.Option(None, "--normalize/--no-normalize", help=NORMALIZE_HELP,
                                             show_default=False),
    bf16: bool = typer.Option(False, "--bf16", help="bf16 autocast; vectors are stored as float32."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:1, ... or auto."),
    mode: Optional[str] = typer.Option(None, "--mode", help=MODE_HELP),
) -> None:
    """Encode the corpus and the split's queries, search exactly, write the run.

    A model fine-tuned by pretrieve is searched as it was trained (separate towers, CoT-MoTE experts, DupMAE's
    CLS+OT score, sparse/hybrid representations); --mode picks another search of a sparse/hybrid model.
    """
    from pretrieve.retrieval.faiss_search import dense_run
    from pretrieve.retrieval.sparse_search import SEARCH_MODES

    began = time.perf_counter()
    if mode is not None and mode not in SEARCH_MODES:
        raise ConfigError(f"--mode must be one of {', '.join(SEARCH_MODES)}, got '{mode}'")
    collection = _collection(data)
    queries = collection.load_queries(split)
    corpus = collection.load_corpus()
    if _is_pretrieve_retriever(model):
        # A fine-tuned pretrieve retriever: separate query/passage towers, DupMAE's CLS+OT representation,
        # sparse/hybrid (SPLADE) representations and CoT-MoTE experts are searched the way the model was trained.
        from pretrieve.retrieval.mining import dense_search

        if pooling is not None or normalize is not None or factory != "Flat":
            raise ConfigError("--pooling/--normalize/--factory do not apply to a fine-tuned pretrieve retriever "
                              "(its representation is saved with it)")
        run = dense_search(model, corpus, queries, k=k, cache_dir=cache, batch_size=batch_size,
                           max_length=max_length, query_max_length=query_max_length, device=device, bf16=bf16,
                           mode=mode)
    else:
        if mode not in (None, "dense"):
            raise ConfigError(f"--mode {mode} needs a pretrieve retriever fine-tuned with the sparse or hybrid "
                              f"representation; {model} is a plain dense encoder")
        encoder = _load_encoder(model, pooling, normalize, None, device)
        run = dense_run(encoder, corpus, queries, k=k, cache_dir=cache, factory=factory, batch_size=batch_size,
                        max_length=max_length, query_max_length=query_max_length, bf16=bf16)
    write_run(run, out, tag=mode or "dense", depth=k)
    _report(run, out, began)
