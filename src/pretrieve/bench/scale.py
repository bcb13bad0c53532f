"""``pretrieve bench scale``: every stage on synthetic collections of growing size, each measured in its own process.

A collection of ``N`` passages is made from the sentences of any BEIR corpus (:func:`synthetic_collection`):
each passage is the first ``words`` words of randomly drawn sentences (a numpy generator seeded by ``seed``, so
the same arguments give the same bytes); each query is a window of 4–8 words of one passage, which is its only
relevant document (``qrels/test.tsv`` for the evaluation queries, ``qrels/train.tsv`` for the training ones).
Collections are written atomically and recorded by :mod:`pretrieve.artifacts`, so a second run reuses them.

Each stage is the public ``pretrieve`` command a user would run (:func:`stage_commands`) started as a child
process; :func:`measure` reads the child's own resource usage from the kernel when it ends (``os.wait4``:
peak resident set size, user + system CPU time) and its wall time. Stages whose implementation other work
replaces (encoding, dense and approximate search, mining, the pre-training token cache) are measured through
their commands, so the harness measures whatever those commands do now. The stages:

============== =========================================================== =============================
stage          command                                                     scales with
============== =========================================================== =============================
bm25           ``bm25 --index`` (index built + eval queries searched)      passages
bm25-load      the same on the one-query split (index reused: start-up)    passages
bm25-search    the same on the eval queries (index reused: load + search)  passages × eval queries
bm25-negatives ``mine --bm25`` on the train queries (index reused)         passages × train queries
encode         ``encode`` (small model)                                    passages
dense-load     ``search`` (Flat) of the one-query split                    passages
dense-exact    ``search`` (Flat) of the eval queries                       passages × eval queries
dense-approx   ``search --factory`` (approximate)                          passages
mine           ``mine --model`` on the train queries (embeddings reused)   passages × train queries
reranker-init  ``reranker train --steps 1`` (a cross-encoder to score with) fixed
finetune       ``finetune --stage 2 --steps`` on the BM25 groups (a few steps) fixed
finetune-query ``finetune --train-towers query --steps``: the base model's      passages (corpus vectors)
               corpus vectors encoded into the user cache + a few steps
               against all of them
finetune-query-steps the same into a new output (vectors reused: load +      passages (corpus matrix)
               steps)
teacher        ``reranker teacher`` (``1 + max_negatives`` pairs per query) pairs
pretrain       ``pretrain --steps`` (token cache built + a few steps)       passages (cache)
pretrain-steps the same into a new output (cache reused: steps only)       fixed
============== =========================================================== =============================

The extrapolation to MS MARCO (8.8M passages, 6,980 dev queries, 500k training queries, 16M teacher pairs)
scales each stage's CPU time linearly in what it scales with, from the largest size measured. A per-query stage
is split into its fixed part — the same command on the collection's one-query split (``qrels/one.tsv``),
measured as its own stage — which grows with the passages only, and the rest, which grows with passages ×
queries. Peak memory is extrapolated linearly in the passages from the two largest sizes when there are two
(flat otherwise). Both are stated in the report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pretrieve import artifacts
from pretrieve.bench.report import markdown_table
from pretrieve.data.beir import iter_corpus
from pretrieve.data.registry import resolve_collection
from pretrieve.errors import ConfigError, InputError

MSMARCO = {"passages": 8_841_823, "eval_queries": 6_980, "train_queries": 502_939, "pairs": 16_000_000}
STAGES = ("bm25", "bm25-load", "bm25-search", "bm25-negatives", "encode", "dense-load", "dense-exact", "dense-approx",
          "mine", "reranker-init", "finetune", "finetune-query", "finetune-query-steps", "teacher", "pretrain",
          "pretrain-steps")
USER_CACHE = "user-cache"
"""The ``$PRETRIEVE_CACHE`` of the measured commands, under ``--out`` (query-side fine-tuning keeps the base model's
corpus vectors there)."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class ScaleSettings:
    """What ``pretrieve bench scale`` runs (see the module docstring)."""

    source: str
    out: str
    sizes: list[int] = field(default_factory=lambda: [100_000])
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    model: str = "minilm"
    eval_queries: int = 300
    train_queries: int = 1000
    words: int = 60
    seed: int = 0
    bm25_depth: int = 1000
    negatives_depth: int = 200
    mine_depth: int = 50
    factory: str = "HNSW32"
    max_negatives: int = 9
    max_length: int = 128
    batch_size: int = 64
    pretrain_steps: int = 3
    timeout: float | None = None

    def check(self) -> None:
        unknown = [stage for stage in self.stages if stage not in STAGES]
        if unknown:
            raise ConfigError(f"unknown stage(s) {', '.join(unknown)} (choose from {', '.join(STAGES)})")
        if not self.sizes or min(self.sizes) < 10:
            raise ConfigError("sizes must be at least 10 passages each")
        for name in ("eval_queries", "train_queries", "words", "max_negatives", "pretrain_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


# ------------------------------------------------------------------------------------------- collections
def source_sentences(corpus_path: str | Path, min_words: int = 4) -> list[list[str]]:
    """The sentences (as word lists, at least ``min_words`` long) of every passage of a ``corpus.jsonl``."""
    sentences = []
    for _, doc in iter_corpus(corpus_path):
        for sentence in _SENTENCE_END.split(doc.text):
            words = sentence.split()
            if len(words) >= min_words:
                sentences.append(words)
    if not sentences:
        raise InputError(f"no sentence of at least {min_words} words", path=corpus_path)
    return sentences


def synthetic_collection(source_corpus: str | Path, out_dir: str | Path, num_passages: int, eval_queries: int = 300,
                         train_queries: int = 1000, words: int = 60, seed: int = 0) -> Path:
    """A BEIR collection of ``num_passages`` synthetic passages at ``out_dir`` (reused when current)."""
    out_dir = Path(out_dir)
    settings = {"num_passages": num_passages, "eval_queries": eval_queries, "train_queries": train_queries,
                "words": words, "seed": seed, "format": "pretrieve-synthetic/2"}
    inputs = {"source": source_corpus}
    if artifacts.is_current(out_dir, settings, inputs, kind="synthetic-collection"):
        return out_dir
    if eval_queries + train_queries > num_passages:
        raise ConfigError(f"{eval_queries + train_queries} queries need at least as many passages, got {num_passages}")
    sentences = source_sentences(source_corpus)
    rng = np.random.default_rng(seed)
    with artifacts.write_dir(out_dir, "synthetic-collection", settings, inputs) as tmp:
        with open(tmp / "corpus.jsonl", "w", encoding="utf-8") as corpus:
            per_passage = words // 4 + 2  # sentences have >= 4 words: enough to fill any passage
            for start in range(0, num_passages, 10_000):
                count = min(10_000, num_passages - start)
                draws = rng.integers(len(sentences), size=(count, per_passage)).tolist()
                for i, picks in enumerate(draws, start=start):
                    text: list[str] = []
                    for pick in picks:
                        text.extend(sentences[pick])
                        if len(text) >= words:
                            break
                    corpus.write(json.dumps({"_id": f"p{i}", "title": "", "text": " ".join(text[:words])}) + "\n")
        chosen = rng.choice(num_passages, size=eval_queries + train_queries, replace=False)
        (tmp / "qrels").mkdir()
        texts = _passage_texts(tmp / "corpus.jsonl", set(chosen.tolist()))
        with open(tmp / "queries.jsonl", "w", encoding="utf-8") as queries, \
                open(tmp / "qrels" / "test.tsv", "w", encoding="utf-8") as test, \
                open(tmp / "qrels" / "train.tsv", "w", encoding="utf-8") as train:
            test.write("query-id\tcorpus-id\tscore\n")
            train.write("query-id\tcorpus-id\tscore\n")
            (tmp / "qrels" / "one.tsv").write_text(f"query-id\tcorpus-id\tscore\nq0\tp{int(chosen[0])}\t1\n")
            for n, row in enumerate(chosen.tolist()):
                passage = texts[row].split()
                length = int(rng.integers(4, 9))
                begin = int(rng.integers(0, len(passage) - length + 1))
                qid = f"q{n}" if n < eval_queries else f"t{n - eval_queries}"
                queries.write(json.dumps({"_id": qid, "text": " ".join(passage[begin:begin + length])}) + "\n")
                (test if n < eval_queries else train).write(f"{qid}\tp{row}\t1\n")
    return out_dir


def _passage_texts(corpus_path: Path, rows: set[int]) -> dict[int, str]:
    texts = {}
    with open(corpus_path, encoding="utf-8") as handle:
        for row, line in enumerate(handle):
            if row in rows:
                texts[row] = json.loads(line)["text"]
    return texts


# ------------------------------------------------------------------------------------------- measuring
def measure(argv: Sequence[str], log_path: str | Path, timeout: float | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` as a child process (output to ``log_path``) and return its wall time, CPU time (user + system)
    and peak resident set size, read from the kernel for that child (``os.wait4``), and its exit code.

    The child starts as a copy of this process (fork/exec), so its peak is never below the harness's own (~80 MB,
    far below any stage's). ``peak_anon_mb``: the highest anonymous resident memory of the child itself (not its
    worker processes) seen by sampling ``/proc`` every 0.1 s — what the stage allocates, without mapped files."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(map(str, argv)) + "\n")
        log.flush()
        child = subprocess.Popen(list(map(str, argv)), stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = None if timeout is None else began + timeout
        peak_anon_kb = 0
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak_anon_kb = max(peak_anon_kb, _anonymous_kb(child.pid))
            if deadline is not None and time.perf_counter() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.1)
        child.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(time.perf_counter() - began, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "peak_anon_mb": round(peak_anon_kb / 1024, 1),
            "returncode": child.returncode}


def _anonymous_kb(pid: int) -> int:
    """The process's anonymous resident memory now (``RssAnon`` of ``/proc/PID/status``; 0 where unreadable):
    its own allocations, without the pages of files it maps (libraries, memory-mapped Arrow and index files),
    which the kernel counts in the peak RSS but can drop and re-read at any time."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class Stage:
    """One measured command, and what its cost grows with (for the extrapolation)."""

    name: str
    argv: list[str]
    scales_with: str  # passages | passages*eval_queries | passages*train_queries | pairs | fixed
    units: dict[str, int] = field(default_factory=dict)
    clear: list[str] = field(default_factory=list)  # outputs removed first, so the stage does its work afresh
    fixed_from: str | None = None  # the stage measuring this one's fixed part (start-up + loading, one query)


def stage_commands(collection: Path, work: Path, settings: ScaleSettings, num_passages: int) -> list[Stage]:
    """The commands of every stage for one collection (outputs under ``work``)."""
    cli = [sys.executable, "-m", "pretrieve"]
    data = ["--data", str(collection)]
    model = settings.model
    pairs = settings.train_queries * (1 + settings.max_negatives)
    units = {"passages": num_passages, "eval_queries": settings.eval_queries,
             "train_queries": settings.train_queries, "pairs": pairs}
    # --overwrite: a stage may write a run file an earlier stage (or an earlier measured round) wrote
    bm25_base = [*cli, "bm25", *data, "--k", str(settings.bm25_depth), "--index", str(work / "bm25-index"),
                 "--overwrite"]
    bm25 = [*bm25_base, "--out", str(work / "bm25.trec")]
    search = [*cli, "search", "--model", model, *data, "--index", str(work / "emb"), "--k", "100",
              "--batch-size", str(settings.batch_size), "--overwrite"]
    query_side = [*cli, "finetune", "--model", model, *data, "--train-towers", "query", "--steps",
                  str(settings.pretrain_steps), "--batch-size", "4", "--save-every", str(10 ** 6), "--log-every", "1",
                  "--overwrite"]
    pretrain = [*cli, "pretrain", "--model", model, "--corpus", str(collection / "corpus.jsonl"),
                "--method", "mlm", "--steps", str(settings.pretrain_steps), "--batch-size", "8", "--max-len", "128",
                "--save-every", str(10 ** 6), "--log-every", "1"]
    stages = [
        Stage("bm25", bm25, "passages", units, clear=[str(work / "bm25-index")]),
        Stage("bm25-load", [*bm25_base, "--out", str(work / "bm25-one.trec"), "--split", "one"], "passages", units),
        Stage("bm25-search", bm25, "passages*eval_queries", units, fixed_from="bm25-load"),
        Stage("bm25-negatives", [*cli, "mine", "--bm25", *data, "--split", "train", "--out",
                                 str(work / "bm25-groups.jsonl"), "--depth", str(settings.negatives_depth),
                                 "--bm25-index", str(work / "bm25-index"), "--overwrite"],
              "passages*train_queries", units, fixed_from="bm25-load"),
        Stage("encode", [*cli, "encode", "--model", model, *data, "--out", str(work / "emb"),
                         "--batch-size", str(settings.batch_size), "--max-length", str(settings.max_length)],
              "passages", units, clear=[str(work / "emb")]),
        Stage("dense-load", [*search, "--out", str(work / "dense-one.trec"), "--split", "one"], "passages", units),
        Stage("dense-exact", [*search, "--out", str(work / "dense.trec")], "passages*eval_queries", units,
              fixed_from="dense-load"),
        Stage("dense-approx", [*search, "--out", str(work / "approx.trec"), "--factory", settings.factory],
              "passages", units),
        Stage("mine", [*cli, "mine", "--model", model, *data, "--split", "train", "--out", str(work / "mined.jsonl"),
                       "--depth", str(settings.mine_depth), "--cache", str(work / "emb"), "--max-length",
                       str(settings.max_length), "--batch-size", str(settings.batch_size), "--overwrite"],
              "passages*train_queries", units, fixed_from="dense-load"),
        Stage("reranker-init", [*cli, "reranker", "train", "--model", model, *data, "--groups",
                                str(work / "bm25-groups.jsonl"), "--out", str(work / "reranker"), "--steps", "1",
                                "--batch-size", "2", "--num-negatives", "1", "--max-len", str(settings.max_length),
                                "--max-groups", "4"], "fixed", units, clear=[str(work / "reranker")]),
        Stage("finetune", [*cli, "finetune", "--model", model, *data, "--stage", "2", "--groups",
                           str(work / "bm25-groups.jsonl"), "--out", str(work / "finetune"), "--steps",
                           str(settings.pretrain_steps), "--batch-size", "4", "--num-negatives", "3",
                           "--passage-max-len", str(settings.max_length), "--save-every", str(10 ** 6),
                           "--log-every", "1", "--overwrite"], "fixed", units, clear=[str(work / "finetune")]),
        Stage("finetune-query", [*query_side, "--out", str(work / "finetune-query")], "passages", units,
              clear=[str(work / "finetune-query"), str(Path(settings.out) / USER_CACHE / "embeddings")]),
        Stage("finetune-query-steps", [*query_side, "--out", str(work / "finetune-query-again")], "passages", units,
              clear=[str(work / "finetune-query-again")]),
        Stage("teacher", [*cli, "reranker", "teacher", "--model", str(work / "reranker" / "final"), *data,
                          "--groups", str(work / "bm25-groups.jsonl"), "--out", str(work / "teacher.jsonl"),
                          "--max-negatives", str(settings.max_negatives), "--batch-size", str(settings.batch_size),
                          "--max-len", str(settings.max_length), "--overwrite"], "pairs", units),
        Stage("pretrain", [*pretrain, "--out", str(work / "pretrain")], "passages", units,
              clear=[str(work / "pretrain")]),
        Stage("pretrain-steps", [*pretrain, "--out", str(work / "pretrain-again"), "--config",
                                 str(work / "pretrain-cache.yaml")], "fixed", units,
              clear=[str(work / "pretrain-again")]),
    ]
    (work / "pretrain-cache.yaml").parent.mkdir(parents=True, exist_ok=True)
    (work / "pretrain-cache.yaml").write_text(f"cache_dir: {json.dumps(str(work / 'pretrain' / 'cache'))}\n")
    return [stage for stage in stages if stage.name in settings.stages]


# ------------------------------------------------------------------------------------------- running
def run_scale_bench(settings: ScaleSettings, log=print) -> dict[str, Any]:
    """Make each collection, run each stage on it and return every measurement (and the extrapolation)."""
    settings.check()

    source = resolve_collection(settings.source)
    out = Path(settings.out)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PRETRIEVE_CACHE": str(Path(settings.out) / USER_CACHE)}
    results: dict[str, Any] = {"settings": asdict(settings), "sizes": {}}
    for size in sorted(settings.sizes):
        began = time.perf_counter()
        collection = synthetic_collection(source / "corpus.jsonl", out / f"collection-{size}", size,
                                          settings.eval_queries, settings.train_queries, settings.words,
                                          settings.seed)
        log(f"[bench scale] {size:,} passages in {collection} ({time.perf_counter() - began:.0f} s)")
        work = out / f"work-{size}"
        work.mkdir(parents=True, exist_ok=True)
        measured = {}
        for stage in stage_commands(collection, work, settings, size):
            for path in stage.clear:
                shutil.rmtree(path, ignore_errors=True)
            result = measure(stage.argv, work / "logs" / f"{stage.name}.log", timeout=settings.timeout, env=env)
            result.update(command=" ".join(["pretrieve", *stage.argv[3:]]), scales_with=stage.scales_with,
                          units=stage.units, fixed_from=stage.fixed_from)
            measured[stage.name] = result
            failed = "" if result["returncode"] == 0 else (f", FAILED (exit {result['returncode']}, see "
                                                           f"{work / 'logs' / (stage.name + '.log')})")
            log(f"[bench scale] {size:,} {stage.name}: {result['wall_s']:.1f} s wall, {result['cpu_s']:.1f} s CPU, "
                f"{result['peak_rss_mb']:.0f} MB peak ({result['peak_anon_mb']:.0f} MB anonymous){failed}")
        results["sizes"][str(size)] = measured
    results["extrapolation"] = extrapolate(results["sizes"])
    return results


def _linear(points: list[tuple[int, float]], target: int) -> tuple[float, str]:
    """``value(target)`` from ``(passages, value)`` points: a line through the two largest (never decreasing), or
    proportional to the passages from a single point (an upper bound for costs with a fixed part)."""
    if len(points) >= 2:
        (n0, v0), (n1, v1) = points[-2], points[-1]
        slope = max(0.0, (v1 - v0) / (n1 - n0))
        return v1 + slope * (target - n1), f"line {n0:,}–{n1:,}"
    n1, v1 = points[-1]
    return v1 * target / n1, f"∝ passages from {n1:,} (RSS flat)"


def _rss(points: list[tuple[int, float]], target: int) -> float:
    """Peak RSS at ``target`` passages: a line through the two largest sizes, or flat from one."""
    return _linear(points, target)[0] if len(points) >= 2 else points[-1][1]


def extrapolate(sizes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage: CPU hours and peak RSS at MS MARCO's size (see the module docstring for the model)."""
    ordered = sorted(sizes, key=int)
    target = MSMARCO["passages"]
    estimates: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        runs = [(int(size), sizes[size][stage]) for size in ordered
                if stage in sizes[size] and sizes[size][stage]["returncode"] == 0]
        if not runs:
            continue
        last = runs[-1][1]
        scales = last["scales_with"]
        rss_points = [(n, m["peak_rss_mb"]) for n, m in runs]
        if scales == "fixed":
            cpu_s, how = last["cpu_s"], "as measured"
            rss = rss_points[-1][1]
        elif scales == "pairs":
            cpu_s, how = last["cpu_s"] * MSMARCO["pairs"] / last["units"]["pairs"], "∝ pairs"
            rss = rss_points[-1][1]
        elif scales == "passages":
            cpu_s, how = _linear([(n, m["cpu_s"]) for n, m in runs], target)
            rss = _rss(rss_points, target)
        else:  # passages*queries: a fixed part (its one-query stage) + a per-query part
            queries = scales.split("*")[-1]
            fixed, per_query = [], []
            for n, m in runs:
                one = sizes[str(n)].get(m.get("fixed_from") or "")
                base = one["cpu_s"] if one is not None and one["returncode"] == 0 else 0.0
                fixed.append((n, base))
                per_query.append((n, max(0.0, m["cpu_s"] - base) / max(1, m["units"][queries] - 1)))
            fixed_s, how = _linear(fixed, target)
            cpu_s = fixed_s + _linear(per_query, target)[0] * MSMARCO[queries]
            rss = _rss(rss_points, target)
        estimates[stage] = {"cpu_hours": round(cpu_s / 3600, 2), "peak_rss_gb": round(rss / 1024, 2), "model": how}
    return estimates


def report_markdown(results: dict[str, Any]) -> str:
    """The measured table (one row per stage and size) and the extrapolation table."""
    rows = []
    for size, measured in sorted(results["sizes"].items(), key=lambda item: int(item[0])):
        for stage, m in measured.items():
            rows.append([stage, int(size), m["wall_s"], m["cpu_s"], _per_unit(m, measured), m["peak_rss_mb"],
                         m.get("peak_anon_mb", "—"),
                         "ok" if m["returncode"] == 0 else f"exit {m['returncode']}"])
    lines = ["## Stages at scale (measured)", "",
             markdown_table(["stage", "passages", "wall s", "CPU s", "CPU per unit", "peak RSS MB",
                             "peak anonymous MB", "status"], rows,
                            digits=2), ""]
    estimates = results.get("extrapolation", {})
    if estimates:
        lines += ["## Extrapolated to MS MARCO passage (8.8M passages, 6,980 dev queries, 500k train queries, "
                  "16M teacher pairs)", "",
                  markdown_table(["stage", "CPU hours", "peak RSS GB", "extrapolated by"],
                                 [[stage, e["cpu_hours"], e["peak_rss_gb"], e["model"]]
                                  for stage, e in estimates.items()], digits=2)]
    return "\n".join(lines)


def _per_unit(m: dict[str, Any], measured: dict[str, Any]) -> str:
    """CPU per passage, pair or query; a per-query stage's fixed part (its one-query stage) is left out."""
    scales, units = m["scales_with"], m["units"]
    if scales == "fixed":
        return "—"
    unit = scales.split("*")[-1]
    cpu_s, count = m["cpu_s"], units[unit]
    fixed = measured.get(m.get("fixed_from") or "")
    if "*" in scales and fixed is not None and fixed["returncode"] == 0:
        cpu_s, count = max(0.0, cpu_s - fixed["cpu_s"]), max(1, count - 1)
    label = {"passages": "ms/passage", "eval_queries": "ms/query", "train_queries": "ms/query", "pairs": "ms/pair"}
    return f"{1000 * cpu_s / count:.3f} {label[unit]}"
