"""Batched encoding of texts, queries and corpus shards, with an on-disk cache of embeddings.

:func:`encode_texts` tokenizes once, sorts the texts by token length (longest first, so padding is
minimal and an out-of-memory batch shows up at once), embeds batches under ``torch.inference_mode``
(optionally under bf16 autocast, on CPU too) and returns float32 vectors in the input order.

:func:`encode_corpus` writes shard ``i`` of ``n`` (a contiguous row range of the corpus) as a directory
``shard-{i}-of-{n}`` holding ``embeddings.npy`` (float32 ``[rows, dim]``), ``ids.json`` (document ids in
row order) and ``meta.json`` (what produced them), written atomically. A shard whose ``meta.json``
matches the request (model and its weights' size/mtime, pooling, normalisation, length, precision,
shard range and a hash of the shard's ids, titles and texts) is reused instead of re-encoded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from pretrieve.data.beir import Corpus
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir, write_json
from pretrieve.retrieval.encoder import DenseEncoder

logger = logging.getLogger(__name__)

EMBEDDINGS_FORMAT = "pretrieve-embeddings/1"
EMBEDDINGS_FILE = "embeddings.npy"
IDS_FILE = "ids.json"
META_FILE = "meta.json"
_SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")

#: meta.json fields that must match for a cached shard to be reused.
CACHE_KEYS = ("format", "model", "model_fingerprint", "pooling", "normalize", "max_length", "dim", "dense_layers",
              "passage_prompt", "include_prompt", "dtype", "bf16", "shard", "num_shards", "rows", "content_sha1")


# -------------------------------------------------------------------------------------------- progress
@contextlib.contextmanager
def progress_bar(total: int, description: str, enabled: bool = True,
                 unit: str = "texts") -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr (count, rate, elapsed, ETA); yields ``advance(n)``.

    When stderr is not a terminal (batch jobs, log files) the same figures are logged every 10 %.
    """
    if not enabled or total == 0:
        yield lambda n: None
        return
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield _logging_progress(total, description, unit)
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task) -> Text:  # the average since the start, not rich's short window
            elapsed = task.finished_time if task.finished else task.elapsed
            speed = task.completed / elapsed if elapsed else None
            return Text(f"{speed:,.1f} {unit}/s" if speed else f"? {unit}/s", style="progress.data.speed")

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def _logging_progress(total: int, description: str, unit: str) -> Callable[[int], None]:
    """``advance(n)`` that logs count, rate and ETA at every completed tenth of ``total``."""
    began = time.perf_counter()
    state = {"done": 0, "next": max(1, total // 10)}

    def advance(n: int) -> None:
        state["done"] += n
        if state["done"] < state["next"] and state["done"] < total:
            return
        while state["next"] <= state["done"]:
            state["next"] += max(1, total // 10)
        elapsed = time.perf_counter() - began
        rate = state["done"] / elapsed if elapsed > 0 else float("inf")
        eta = (total - state["done"]) / rate if rate > 0 else 0.0
        logger.info("%s: %d/%d %s (%.0f%%), %.1f %s/s, elapsed %s, ETA %s", description, state["done"], total, unit,
                    100 * state["done"] / total, rate, unit, _clock(elapsed), _clock(eta))

    return advance


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on ``device`` (CPU or CUDA), or a no-op."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# -------------------------------------------------------------------------------------------- encoding
def encode_texts(encoder: DenseEncoder, texts: Sequence[str], batch_size: int = 64, max_length: int | None = None,
                 bf16: bool = False, show_progress: bool = True, prompt: str | None = None,
                 description: str = "encode", chunk_size: int = 65536) -> np.ndarray:
    """Embed ``texts`` → float32 ``[N, dim]`` in input order.

    Texts are tokenized ``chunk_size`` at a time (bounding memory on large corpora), sorted by token
    length within a chunk, and embedded ``batch_size`` at a time; ``max_length`` defaults to the
    encoder's. ``prompt`` is prepended to every text (sentence-transformers' prompts).
    """
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    output = np.empty((len(texts), encoder.dim), dtype=np.float32)
    with progress_bar(len(texts), description, enabled=show_progress) as advance:
        for start in range(0, len(texts), chunk_size):
            chunk = texts[start:start + chunk_size]
            tokenized = encoder.tokenize(chunk, max_length=max_length, prompt=prompt)
            order = sorted(range(len(chunk)), key=lambda i: -len(tokenized.input_ids[i]))
            for first in range(0, len(order), batch_size):
                rows = order[first:first + batch_size]
                batch = encoder.collate(tokenized, rows)
                with torch.inference_mode(), autocast(encoder.device, bf16):
                    vectors = encoder.embed_batch(batch, tokenized.prompt_length)
                output[start + np.asarray(rows)] = vectors.float().cpu().numpy()
                advance(len(rows))
    return output


def encode_queries(encoder: DenseEncoder, queries: Mapping[str, str], batch_size: int = 64,
                   max_length: int | None = None, bf16: bool = False,
                   show_progress: bool = True) -> tuple[list[str], np.ndarray]:
    """Embed ``{qid: text}`` with the encoder's query prompt → ``(query_ids, [Q, dim])``.

    ``max_length`` (the ``query_max_length`` of the CLI) defaults to the encoder's own length.
    """
    query_ids = list(queries)
    vectors = encode_texts(encoder, [queries[q] for q in query_ids], batch_size=batch_size, max_length=max_length,
                           bf16=bf16, show_progress=show_progress, prompt=encoder.query_prompt,
                           description="encode queries")
    return query_ids, vectors


def shard_bounds(num_rows: int, shard: int, num_shards: int) -> tuple[int, int]:
    """Row range ``[start, end)`` of shard ``shard`` of ``num_shards`` (contiguous, sizes differ by ≤ 1)."""
    if num_shards < 1:
        raise ConfigError(f"number of shards must be >= 1, got {num_shards}")
    if not 0 <= shard < num_shards:
        raise ConfigError(f"shard must be in [0, {num_shards - 1}], got {shard}")
    return num_rows * shard // num_shards, num_rows * (shard + 1) // num_shards


def shard_dir_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard}-of-{num_shards}"


def encode_corpus(encoder: DenseEncoder, corpus: Corpus, out_dir: str | Path, shard: int = 0, num_shards: int = 1,
                  batch_size: int = 64, max_length: int | None = None, bf16: bool = False,
                  show_progress: bool = True, overwrite: bool = False) -> Path:
    """Encode one contiguous shard of ``corpus`` (title + text) into ``out_dir/shard-{i}-of-{n}``.

    Returns the shard directory. An existing shard produced with the same settings is reused
    (logged) unless ``overwrite``.
    """
    start, end = shard_bounds(len(corpus), shard, num_shards)
    shard_dir = Path(out_dir) / shard_dir_name(shard, num_shards)
    ids = corpus.ids[start:end]
    texts = [corpus.full_text(i) for i in range(start, end)]
    meta = shard_meta(encoder, ids, texts, shard, num_shards, (start, end), max_length, bf16)
    meta["corpus"] = corpus.path
    meta["corpus_size"] = len(corpus)
    if not overwrite and is_cached(shard_dir, meta):
        logger.info("embeddings cached in %s (same model, settings and texts); not re-encoding", shard_dir)
        return shard_dir
    began = time.perf_counter()
    vectors = encode_texts(encoder, texts, batch_size=batch_size, max_length=max_length, bf16=bf16,
                           show_progress=show_progress, prompt=encoder.passage_prompt,
                           description=f"encode shard {shard + 1}/{num_shards}")
    meta["seconds"] = round(time.perf_counter() - began, 3)
    write_shard(shard_dir, vectors, ids, meta)
    return shard_dir


def shard_meta(encoder: DenseEncoder, ids: Sequence[str], texts: Sequence[str], shard: int, num_shards: int,
               rows: tuple[int, int], max_length: int | None, bf16: bool) -> dict[str, Any]:
    """The ``meta.json`` of a shard (cache keys first, then provenance)."""
    import pretrieve

    description = encoder.describe()
    description["max_length"] = max_length or encoder.max_length
    return {"format": EMBEDDINGS_FORMAT, **description, "model_fingerprint": model_fingerprint(encoder.name),
            "bf16": bool(bf16), "shard": shard, "num_shards": num_shards, "rows": list(rows), "count": len(ids),
            "content_sha1": content_hash(ids, texts),
            "pretrieve_version": pretrieve.__version__, "torch_version": torch.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def content_hash(ids: Sequence[str], texts: Sequence[str]) -> str:
    """SHA-1 over the shard's ids and encoded texts: any edit of the corpus invalidates the cache."""
    digest = hashlib.sha1()
    for doc_id, text in zip(ids, texts):
        digest.update(doc_id.encode("utf-8"))
        digest.update(b"\0")
        digest.update(text.encode("utf-8"))
        digest.update(b"\1")
    return digest.hexdigest()


def model_fingerprint(name_or_path: str) -> str:
    """Sizes and modification times of a local checkpoint's weight files (the name for hub models)."""
    root = Path(name_or_path)
    if not root.is_dir():
        return name_or_path
    weights = sorted(p for p in root.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file())
    signature = [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in weights]
    return hashlib.sha1(json.dumps(signature).encode("utf-8")).hexdigest()


def corpus_index_settings(model, model_dir: str | Path | None, max_length: int, bf16: bool,
                          ids: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
    """What a cached corpus index of a fine-tuned dual encoder depends on (DupMAE and sparse/hybrid indexes):
    the model's path and weight fingerprint, its representation, the passage length, bf16 and the texts."""
    return {"model": str(Path(str(model_dir)).resolve()) if model_dir else None,
            "model_fingerprint": model_fingerprint(str(model_dir)) if model_dir else None,
            "representation": model.representation.config(), "max_length": int(max_length), "bf16": bool(bf16),
            "content_sha1": content_hash(ids, texts)}


def same_settings(recorded: Any, current: Any) -> bool:
    """Whether two settings dicts are equal once both are JSON-normalised (as they are stored)."""
    return json.loads(json.dumps(recorded, default=str)) == json.loads(json.dumps(current, default=str))


def read_index_meta(path: str | Path, meta_file: str, index_format: str) -> dict[str, Any] | None:
    """The ``meta_file`` JSON of an index directory when it declares ``index_format``; None otherwise."""
    try:
        meta = json.loads((Path(path) / meta_file).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == index_format else None


def cached_corpus_index(cache_dir: str | Path | None, name: str, model_dir: str | Path | None,
                        settings: Mapping[str, Any], meta_file: str, index_format: str) -> tuple[Path | None, bool]:
    """Where a fine-tuned model's corpus index is cached (``cache_dir/name``; None without a cache directory)
    and whether the index there was built with ``settings`` (:func:`corpus_index_settings`; only trusted when
    the model directory, hence its weights' fingerprint, is known)."""
    if cache_dir is None:
        return None, False
    cached = Path(cache_dir) / name
    if model_dir is None:
        return cached, False
    meta = read_index_meta(cached, meta_file, index_format)
    return cached, meta is not None and same_settings(meta.get("settings"), settings)


def is_cached(shard_dir: Path, meta: Mapping[str, Any]) -> bool:
    """Whether ``shard_dir`` holds complete embeddings whose meta matches ``meta`` on :data:`CACHE_KEYS`."""
    paths = [shard_dir / name for name in (EMBEDDINGS_FILE, IDS_FILE, META_FILE)]
    if not all(path.exists() for path in paths):
        return False
    try:
        cached = json.loads((shard_dir / META_FILE).read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False
    differing = [key for key in CACHE_KEYS if _jsonable(cached.get(key)) != _jsonable(meta.get(key))]
    if differing:
        logger.info("re-encoding %s: settings differ in %s", shard_dir, ", ".join(differing))
    return not differing


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def write_shard(shard_dir: str | Path, vectors: np.ndarray, ids: Sequence[str], meta: Mapping[str, Any]) -> Path:
    """Write one shard's three files atomically (the directory appears complete or not at all)."""
    if len(vectors) != len(ids):
        raise ValueError(f"{len(vectors)} vectors for {len(ids)} ids")
    shard_dir = Path(shard_dir)
    with atomic_dir(shard_dir) as tmp:
        np.save(tmp / EMBEDDINGS_FILE, np.ascontiguousarray(vectors, dtype=np.float32))
        with open(tmp / IDS_FILE, "w", encoding="utf-8") as handle:
            json.dump(list(ids), handle)
        write_json(tmp / META_FILE, dict(meta))
    return shard_dir


# ---------------------------------------------------------------------------------------------- reading
@dataclass
class EmbeddingShard:
    """One shard on disk: vectors (memory-mapped), their document ids and meta."""

    path: Path
    embeddings: np.ndarray
    ids: list[str]
    meta: dict[str, Any]


def load_shard(shard_dir: str | Path, mmap: bool = True) -> EmbeddingShard:
    """Read a shard written by :func:`encode_corpus`; inconsistent files raise :class:`InputError`."""
    shard_dir = Path(shard_dir)
    for name in (EMBEDDINGS_FILE, IDS_FILE, META_FILE):
        if not (shard_dir / name).exists():
            raise InputError(f"incomplete embeddings shard ({name} missing)", path=shard_dir)
    embeddings = np.load(shard_dir / EMBEDDINGS_FILE, mmap_mode="r" if mmap else None)
    ids = json.loads((shard_dir / IDS_FILE).read_text(encoding="utf-8"))
    meta = json.loads((shard_dir / META_FILE).read_text(encoding="utf-8"))
    if embeddings.ndim != 2 or embeddings.shape[0] != len(ids):
        raise InputError(f"embeddings of shape {embeddings.shape} do not match {len(ids)} ids", path=shard_dir)
    return EmbeddingShard(shard_dir, embeddings, ids, meta)


def find_shards(emb_dir: str | Path) -> list[Path]:
    """The complete set of shard directories in ``emb_dir`` (or ``emb_dir`` itself if it is one), in order.

    Missing shards, or shards of different splittings mixed in one directory, raise :class:`InputError`.
    """
    emb_dir = Path(emb_dir)
    if (emb_dir / META_FILE).exists() and (emb_dir / EMBEDDINGS_FILE).exists():
        return [emb_dir]
    if not emb_dir.is_dir():
        raise InputError("embeddings directory not found", path=emb_dir)
    found: dict[int, dict[int, Path]] = {}
    for child in emb_dir.iterdir():
        match = _SHARD_DIR.match(child.name)
        if match and child.is_dir():
            found.setdefault(int(match.group(2)), {})[int(match.group(1))] = child
    if not found:
        raise InputError("no embedding shards (shard-I-of-N directories) found; run `pretrieve encode` first",
                         path=emb_dir)
    if len(found) > 1:
        raise InputError(f"shards of different splittings mixed ({', '.join(f'of-{n}' for n in sorted(found))}); "
                         "keep one", path=emb_dir)
    (num_shards, shards), = found.items()
    missing = sorted(set(range(num_shards)) - set(shards))
    if missing:
        raise InputError(f"missing shard(s) {', '.join(map(str, missing))} of {num_shards}; run `pretrieve encode "
                         f"--shard I --num-shards {num_shards}` for them", path=emb_dir)
    return [shards[i] for i in range(num_shards)]
