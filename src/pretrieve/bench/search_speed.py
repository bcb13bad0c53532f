"""Approximate vs exact dense search at scale, and the peak memory of sharded exact search.

:func:`ann_benchmark` answers "which FAISS index for a fine-tuned retriever, and what does it cost in recall?" on
``size`` vectors that have the statistics of a real retriever's passage vectors: the real vectors of a collection
(e.g. all-MiniLM-L6-v2 on SciFact, 5,183 × 384) are kept as the first rows, and the rest are drawn around randomly
chosen real vectors with the real vectors' covariance — ``normalize(x_c + spread · L ε)``, ``Σ = L Lᵀ`` the
covariance of the real vectors, ``ε ~ N(0, I)`` — then L2-normalised like the model's own outputs. The mixture keeps
the real topical clusters and the anisotropy of the embedding space (what IVF and HNSW partition), and the
collection's real queries and qrels still apply (their relevant passages are among the rows), so nDCG@10 and R@k
can be measured against a million distractors. ``spread`` is chosen so that the synthetic vectors' nearest-neighbour
cosine matches that of the real ones (:func:`matching_spread`).

Every index is built and searched through the dense back-end (:class:`~pretrieve.retrieval.index.dense.DenseSearcher`
over an index directory: exactly what ``pretrieve dense/search --factory`` run), and the searches are timed
**interleaved** (exact, then each factory, ``repeats`` rounds; medians). Reported per factory: build seconds,
search seconds, speed-up over exact, the overlap of its top-k with the exact top-k (recall@k of the approximate
index against exact search, k = 100 and 1000), and nDCG@10 / R@100 / R@1000 against the qrels.

:func:`exact_search_peak_rss` measures the peak resident memory of exact search over a sharded index in a fresh
process (nothing else in it; its own high-water mark ``VmHWM``, which — unlike ``ru_maxrss`` — does not carry the
parent's peak over ``fork``/``exec``), the figure the "one shard + 0.5 GB" bar is about. Linux only.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from pretrieve.retrieval.index import (SearchOptions, find_shards, is_current as index_is_current, open_index,
                                       write_parts, writing)
from pretrieve.retrieval.index.dense import DenseSearcher

DEFAULT_FACTORIES = ("IVF1024,Flat@nprobe=16", "IVF1024,Flat@nprobe=32", "IVF1024,SQ8@nprobe=32",
                     "IVF1024,PQ48@nprobe=32", "HNSW32@ef=128")


def parse_factory(text: str) -> tuple[str, dict[str, int]]:
    """``"IVF4096,Flat@nprobe=32"`` → ``("IVF4096,Flat", {"nprobe": 32})``."""
    factory, _, params = text.partition("@")
    values = {}
    for item in filter(None, params.split(",")):
        key, _, value = item.partition("=")
        values[{"ef": "ef_search"}.get(key, key)] = int(value)
    return factory, values


def synthetic_chunks(real: np.ndarray, size: int, spread: float, seed: int = 0,
                     chunk: int = 1 << 16) -> Iterator[np.ndarray]:
    """``size`` unit vectors: the real ones first, then draws around random real ones (module docstring)."""
    rng = np.random.default_rng(seed)
    real = np.asarray(real, dtype=np.float32)
    centred = real - real.mean(axis=0)
    covariance = centred.T @ centred / max(1, len(real) - 1)
    factor = np.linalg.cholesky(covariance + 1e-6 * np.eye(len(covariance))).astype(np.float32)
    yield real
    done = len(real)
    while done < size:
        count = min(chunk, size - done)
        centres = real[rng.integers(0, len(real), count)]
        noise = rng.standard_normal((count, real.shape[1]), dtype=np.float32) @ factor.T
        vectors = centres + spread * noise
        yield vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        done += count


def nearest_neighbour_cosine(vectors: np.ndarray, sample: int = 500, seed: int = 0) -> float:
    """Mean cosine of a sample of unit vectors with their nearest other vector."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(vectors), min(sample, len(vectors)), replace=False)
    scores = vectors[rows] @ vectors.T
    scores[np.arange(len(rows)), rows] = -np.inf
    return float(scores.max(axis=1).mean())


def matching_spread(real: np.ndarray, candidates: Sequence[float] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)) -> float:
    """The spread whose synthetic vectors (mixed in as many as the real ones) have the real nearest-neighbour
    cosine — a million vectors should look as crowded around a passage as the real corpus does."""
    target = nearest_neighbour_cosine(real)
    best, gap = candidates[0], np.inf
    for spread in candidates:
        synthetic = np.concatenate(list(synthetic_chunks(real, 2 * len(real), spread, seed=1)))[len(real):]
        value = nearest_neighbour_cosine(synthetic)
        if abs(value - target) < gap:
            best, gap = spread, abs(value - target)
    return best


def is_current(path: Path, settings: Mapping[str, Any]) -> bool:
    """Whether vectors written by :func:`write_vectors` with ``settings`` are at ``path``, intact."""
    return index_is_current(path, settings, {}).current


def write_vectors(path: Path, chunks: Iterator[np.ndarray], ids: Sequence[str], settings: Mapping[str, Any]) -> Path:
    """An index directory (kind dense) of the vectors, streamed chunk by chunk."""
    with writing(path, "dense", ids, {"passage": {"dim": None}, "synthetic": dict(settings)}, settings) as tmp:
        write_parts(tmp, ({"embeddings": chunk} for chunk in chunks))
    return path


def _timed_search(searcher, queries: np.ndarray, k: int) -> tuple[float, np.ndarray, np.ndarray]:
    began = time.perf_counter()
    scores, rows = searcher.search({"embeddings": queries}, k)
    return time.perf_counter() - began, scores, rows


def ann_benchmark(index_path: Path, queries: np.ndarray, query_ids: Sequence[str],
                  qrels: Mapping[str, Mapping[str, int]] | None, factories: Sequence[str] = DEFAULT_FACTORIES,
                  k: int = 1000, repeats: int = 3, train_size: int | None = 100_000) -> dict[str, Any]:
    """Exact vs each factory over the index at ``index_path`` (see the module docstring)."""
    from pretrieve.evaluation import evaluate  # lazy: scipy

    index = open_index(index_path)
    ids = index.ids
    searchers: dict[str, Any] = {"Flat (exact)": DenseSearcher(index, SearchOptions())}
    build: dict[str, float] = {"Flat (exact)": 0.0}
    for text in factories:
        factory, params = parse_factory(text)
        began = time.perf_counter()
        searchers[text] = DenseSearcher(index, SearchOptions(factory=factory, train_size=train_size, **params))
        build[text] = time.perf_counter() - began
    seconds: dict[str, list[float]] = {name: [] for name in searchers}
    results: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for _ in range(repeats):
        for name, searcher in searchers.items():
            elapsed, scores, rows = _timed_search(searcher, queries, k)
            seconds[name].append(elapsed)
            results[name] = (scores, rows)
    exact_rows = results["Flat (exact)"][1]
    exact_time = statistics.median(seconds["Flat (exact)"])
    report: dict[str, Any] = {"vectors": index.count, "dim": int(queries.shape[1]), "queries": len(queries), "k": k,
                              "repeats": repeats, "train_size": train_size, "factories": {}}
    for name, (scores, rows) in results.items():
        median = statistics.median(seconds[name])
        entry: dict[str, Any] = {"build_s": round(build[name], 1), "search_s": round(median, 3),
                                 "runs_s": [round(s, 3) for s in seconds[name]],
                                 "speedup": round(exact_time / median, 2)}
        for depth in (10, 100, 1000):
            if depth <= k:
                entry[f"recall@{depth}_vs_exact"] = round(_overlap(rows[:, :depth], exact_rows[:, :depth]), 4)
        if qrels is not None:
            run = {qid: {ids[row].decode("utf-8"): float(score) for row, score in zip(rows[q], scores[q]) if row >= 0}
                   for q, qid in enumerate(query_ids)}
            measured = evaluate({q: qrels[q] for q in query_ids if q in qrels}, run, ["nDCG@10", "R@100", "R@1000"])
            entry.update({measure: round(value, 4) for measure, value in measured.aggregate.items()})
        report["factories"][name] = entry
    return report


def _overlap(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact top-k that the approximate top-k holds."""
    return float(np.mean([len(set(f.tolist()) & set(e.tolist())) / max(1, len(e)) for f, e in zip(found, exact)]))


# --------------------------------------------------------------------------------------------- peak memory
def exact_search_peak_rss(root: Path, queries: np.ndarray, k: int = 1000) -> dict[str, Any]:
    """Peak RSS (MiB) of a fresh process that searches every shard under ``root`` exactly for ``queries``,
    with the streaming top-k merge of :mod:`pretrieve.retrieval.search`; also the largest shard's size."""
    shards = [open_index(path) for path in find_shards(root)]
    queries_file = root / "bench-queries.npy"
    np.save(queries_file, np.asarray(queries, dtype=np.float32))
    code = ("import json, sys, time, numpy as np\n"
            "from pretrieve.retrieval.index import SearchOptions, backend, find_shards, open_index\n"
            "def peak():  # this process's own high-water mark (ru_maxrss would include the parent's, from fork)\n"
            "    for line in open('/proc/self/status'):\n"
            "        if line.startswith('VmHWM:'):\n"
            "            return int(line.split()[1]) / 1024\n"
            "root, k = sys.argv[1], int(sys.argv[2])\n"
            "queries = np.load(sys.argv[3])\n"
            "before = peak()\n"
            "shards = [open_index(p) for p in find_shards(root)]\n"
            "began = time.perf_counter()\n"
            "searcher = backend('dense').open_searcher(shards, SearchOptions())\n"
            "scores, rows = searcher.search({'embeddings': queries}, k)\n"
            "print(json.dumps({'seconds': time.perf_counter() - began, 'rows': rows[:, :3].tolist(),\n"
            "                  'baseline_mib': before, 'peak_mib': peak()}))\n")
    try:
        output = subprocess.run([sys.executable, "-c", code, str(root), str(k), str(queries_file)], check=True,
                                capture_output=True, text=True).stdout
    finally:
        queries_file.unlink(missing_ok=True)
    measured = json.loads(output.strip().splitlines()[-1])
    shard_mib = max((shard.path / "embeddings.npy").stat().st_size for shard in shards) / 2**20
    return {"shards": len(shards), "vectors": sum(shard.count for shard in shards), "largest_shard_mib": shard_mib,
            "peak_rss_mib": round(measured["peak_mib"], 1), "baseline_rss_mib": round(measured["baseline_mib"], 1),
            "search_s": round(measured["seconds"], 1), "queries": len(queries), "k": k,
            "bar_mib": round(shard_mib + 512, 1)}
