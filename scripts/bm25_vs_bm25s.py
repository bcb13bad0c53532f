"""Whole-process cost of ``pretrieve bm25`` against bm25s called directly, on the same collection.

Both index ``title + " " + text`` with the same analysis (lower-case, bm25s' splitter and English stopwords,
Porter2 stemmer), score with Lucene BM25 (k1 0.9, b 0.4), retrieve the top 1000 of every test query on every
core and write a TREC run. Each is run ``--rounds`` times, alternating, as a child process whose CPU time and
peak RSS are read from the kernel (:func:`pretrieve.bench.scale.measure`); the medians and their ratio are
printed as a markdown table.

    python scripts/bm25_vs_bm25s.py --data ../shared/data/scifact --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

DIRECT = r'''
import json, sys
import bm25s, Stemmer
corpus_path, queries_path, qrels_path, out = sys.argv[1:5]
ids, texts = [], []
with open(corpus_path, encoding="utf-8") as f:
    for line in f:
        doc = json.loads(line)
        ids.append(doc["_id"])
        texts.append((doc.get("title", "") + " " + doc["text"]) if doc.get("title") else doc["text"])
judged = {line.split("\t")[0] for line in open(qrels_path, encoding="utf-8").read().splitlines()[1:] if line}
queries = {}
with open(queries_path, encoding="utf-8") as f:
    for line in f:
        q = json.loads(line)
        if q["_id"] in judged:
            queries[q["_id"]] = q["text"]
stemmer = Stemmer.Stemmer("english")
tokenizer = bm25s.tokenization.Tokenizer(lower=True, stopwords="en", stemmer=stemmer)
retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
retriever.index((tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False),
                 tokenizer.get_vocab_dict()), show_progress=False)
qids = list(queries)
tokens = tokenizer.tokenize([queries[q] for q in qids], update_vocab=False, return_as="ids", show_progress=False)
docs, scores = retriever.retrieve(tokens, k=min(1000, len(ids)), n_threads=-1, show_progress=False)
with open(out, "w", encoding="utf-8") as f:
    for i, qid in enumerate(qids):
        for rank, (d, s) in enumerate(zip(docs[i], scores[i]), start=1):
            if s > 0:
                f.write(f"{qid} Q0 {ids[d]} {rank} {float(s)!r} bm25s\n")
'''


def main() -> None:
    from pretrieve.bench.report import markdown_table
    from pretrieve.bench.scale import measure
    from pretrieve.data.collection import BeirCollection

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    collection = BeirCollection(Path(args.data))
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "pretrieve bm25": [sys.executable, "-m", "pretrieve", "bm25", "--data", args.data, "--split", args.split,
                               "--out", f"{tmp}/pretrieve.trec"],
            "bm25s directly": [sys.executable, "-c", DIRECT, str(collection.corpus_path), str(collection.queries_path),
                               str(collection.qrels_path(args.split)), f"{tmp}/bm25s.trec"],
        }
        results: dict[str, list[dict]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                result = measure(argv, Path(tmp) / "log.txt")
                if result["returncode"]:
                    sys.exit(f"{name} failed:\n" + (Path(tmp) / "log.txt").read_text())
                results[name].append(result)
    medians = {name: {key: statistics.median(r[key] for r in runs) for key in ("cpu_s", "peak_rss_mb", "wall_s")}
               for name, runs in results.items()}
    base = medians["bm25s directly"]
    rows = [[name, m["cpu_s"], m["cpu_s"] / base["cpu_s"], m["peak_rss_mb"], m["peak_rss_mb"] / base["peak_rss_mb"],
             m["wall_s"]] for name, m in medians.items()]
    print(f"{args.rounds} interleaved rounds, medians, {args.data}")
    print(markdown_table(["process", "CPU s", "CPU ratio", "peak RSS MB", "RSS ratio", "wall s"], rows))


if __name__ == "__main__":
    main()
