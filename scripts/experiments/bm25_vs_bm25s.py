"""Whole-process `pretrieve bm25` against bm25s called directly, on one BEIR collection (issue: "MS MARCO scale").

Both sides do the same work: read corpus.jsonl and the split's queries, tokenise (lower-case, English stopwords,
Porter2 stemmer), index title + text with Lucene BM25 (k1 0.9, b 0.4), retrieve the top 1000 per query and write a
TREC run. Each side is a fresh process; CPU time (user + system) and peak RSS come from the kernel (``os.wait4``);
the two are interleaved for ``--rounds`` rounds and the medians compared.

    python scripts/experiments/bm25_vs_bm25s.py --data "$PRETRIEVE_DATA/scifact" --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

DIRECT = r'''
import csv, json, sys
import bm25s, Stemmer
data, split, out = sys.argv[1:4]
ids, texts = [], []
with open(f"{data}/corpus.jsonl", encoding="utf-8") as f:
    for line in f:
        d = json.loads(line)
        ids.append(d["_id"]); texts.append((d.get("title") or "") + " " + (d.get("text") or ""))
wanted = set()
with open(f"{data}/qrels/{split}.tsv", encoding="utf-8") as f:
    next(f)
    for row in csv.reader(f, delimiter="\t"):
        wanted.add(row[0])
qids, queries = [], []
with open(f"{data}/queries.jsonl", encoding="utf-8") as f:
    for line in f:
        q = json.loads(line)
        if q["_id"] in wanted:
            qids.append(q["_id"]); queries.append(q["text"])
stemmer = Stemmer.Stemmer("english")
retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
docs, scores = retriever.retrieve(bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False),
                                  k=min(1000, len(ids)), show_progress=False, n_threads=0)
with open(out, "w", encoding="utf-8") as f:
    for i, qid in enumerate(qids):
        for rank, (doc, score) in enumerate(zip(docs[i], scores[i]), 1):
            f.write(f"{qid} Q0 {ids[doc]} {rank} {score:.6f} bm25s\n")
'''


def measure(argv: list[str]) -> tuple[float, float, float]:
    began = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({status})")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"pretrieve bm25": [sys.executable, "-m", "pretrieve", "bm25", "--data", args.data, "--split",
                                     args.split, "--k", "1000", "--out", f"{tmp}/pretrieve.trec"],
                 "bm25s direct": [sys.executable, "-c", DIRECT, args.data, args.split, f"{tmp}/bm25s.trec"]}
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, argv in sides.items():
                results[name].append(measure(argv))
    medians = {name: [statistics.median(m[i] for m in runs) for i in range(3)] for name, runs in results.items()}
    for name, (cpu, rss, wall) in medians.items():
        print(f"{name:16s} CPU {cpu:6.2f} s   peak RSS {rss:7.1f} MiB   wall {wall:6.2f} s   (medians of {args.rounds})")
    (cpu_p, rss_p, _), (cpu_b, rss_b, _) = medians["pretrieve bm25"], medians["bm25s direct"]
    print(f"ratio pretrieve / bm25s: CPU {cpu_p / cpu_b:.2f}x, peak RSS {rss_p / rss_b:.2f}x")


if __name__ == "__main__":
    main()
