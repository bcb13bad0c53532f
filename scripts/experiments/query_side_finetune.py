"""Query-side fine-tuning against the cached corpus vectors (issue 53): does it beat all-MiniLM-L6-v2 as it comes?

Query-side fine-tuning (Lee et al. 2021, "Learning Dense Representations of Phrases at Scale", DensePhrases §4.3;
asymmetric dual encoders: Dong et al. 2022, "Exploring Dual Encoder Architectures for Question Answering") trains
only the query tower; the passage tower stays the off-the-shelf model, so the corpus vectors that the zero-shot
``pretrieve.search`` already put in the user cache stay valid: no passage is encoded in training or afterwards.
With the passage vectors frozen, each query is scored against the *whole* corpus: the loss of a (query, positive)
pair is the exact softmax cross-entropy over every cached passage vector except the query's other positives
(``logsumexp(s / τ) − s⁺ / τ``, τ 0.05, the cosine temperature pretrieve fine-tunes MiniLM with).

This measurement chose the settings of the feature it led to, ``pretrieve.finetune(..., train_towers="query")``
(:mod:`pretrieve.train.query_side`; docs/python.md runs it: 0.7098 nDCG@10 on SciFact test, +0.063 [+0.041, +0.085],
with the training loop's gradient clipping at 1.0 and weight decay 0.01, which this script does not apply). Here
the query tower is trained with plain torch
(AdamW, linear warm-up over 10 % of the steps then linear decay, bf16 autocast as ``precision="auto"`` on a CPU with
native bf16), queries encoded the same way, scored by exact inner product against the cached vectors.

    # settings chosen on the 81 dev queries held out of SciFact train (seed 0, as configs/scifact-minilm.yaml):
    python scripts/experiments/query_side_finetune.py dev 1,5e-5 1,2e-5 1,1e-4 2,5e-5
    # the chosen setting, trained on all 809 training queries, on the 300 test queries (paired 95 % interval):
    python scripts/experiments/query_side_finetune.py test 2,5e-5
    # the feature (pretrieve.finetune(train_towers="query")) on the same dev split, as a check of the port:
    python scripts/experiments/query_side_finetune.py dev-feature 2,5e-5

Each setting is ``EPOCHS,LR`` (batch 16, τ 0.05). The zero-shot search fills (or reuses) the user cache's corpus
index of ``minilm`` (SciFact: ≈ 340 s of CPU time cold); CPU seconds (user + system, ``resource.getrusage``) of
each block are printed.

Measured 2026-12-07 on the 2-core AMD EPYC (Zen 4, AVX512-BF16) of docs/python.md, loaded by other jobs (CPU
times inflated by the contention). Dev (81 held-out training queries, zero-shot 0.6634 nDCG@10; trained on the 728
others): 1 epoch lr 2e-5 0.7280 (+0.065 [+0.035, +0.094]), 1 epoch 5e-5 0.7362 (+0.073 [+0.040, +0.106]), 1 epoch
1e-4 0.7584 (+0.095 [+0.056, +0.134]), 2 epochs 5e-5 0.7742 (+0.111 [+0.070, +0.151]); 83-105 s CPU an epoch.
Test (300 queries, zero-shot 0.6466 from ``pretrieve.search``), trained on the 809 training queries: 2 epochs lr
5e-5 (the dev choice) 0.7190 nDCG@10 (+0.072 [+0.051, +0.094]), R@100 0.9477 against 0.9250, 211 s CPU of
training; 1 epoch lr 5e-5 (the recipe's, run before the last two dev settings were in) 0.6911 (+0.044 [+0.027,
+0.062]), R@100 0.9467, 159 s CPU; 3-7 s CPU for the test queries' search. The two-tower recipe settings of docs/python.md: 0.6785 (+0.032 [+0.006, +0.058]) for
1,069 s CPU of fine-tuning and corpus re-encoding. The feature on the same dev split (2026-12-07, ``dev-feature
2,5e-5``): 0.7742 nDCG@10 against 0.6634, +0.111 [+0.065, +0.156], the same mean as this script's.
"""

from __future__ import annotations

import argparse
import copy
import math
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import pretrieve
from pretrieve.data.collection import BeirCollection
from pretrieve.data.folds import carve_queries
from pretrieve.data.registry import resolve_collection
from pretrieve.retrieval import cache as embedding_cache

TEMPERATURE = 0.05
BATCH = 16
DEV_SIZE = 81   # the recipe's dev: 10 % of SciFact's 809 training queries


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def corpus_vectors(retriever, collection: BeirCollection) -> tuple[torch.Tensor, list[str]]:
    """The corpus index the zero-shot search keeps in the user cache: its vectors and passage ids."""
    root = embedding_cache.corpus_index_dir(retriever, collection.corpus_path) / "shard-0-of-1"
    ids = [x.decode() if isinstance(x, bytes) else str(x) for x in np.load(root / "ids.npy", allow_pickle=True)]
    return torch.from_numpy(np.load(root / "embeddings.npy")).float(), ids


def encode(model, texts: list[str]) -> torch.Tensor:
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        vectors = model.encode(texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
    return vectors.float()


def dense_run(model, queries: dict[str, str], passages: torch.Tensor, ids: list[str], k: int = 100) -> dict:
    qids = sorted(queries)
    scores = encode(model, [queries[q] for q in qids]) @ passages.T
    top = torch.topk(scores, k, dim=1)
    return {q: {ids[j]: float(s) for s, j in zip(top.values[i].tolist(), top.indices[i].tolist())}
            for i, q in enumerate(qids)}


def full_corpus_loss(logits: torch.Tensor, positives: list[list[int]]) -> torch.Tensor:
    """The mean over every (query, positive) pair of ``logsumexp(logits) − logit⁺``, the logsumexp over the whole
    corpus (``logits``: queries × passages, already divided by τ) minus the query's other positives."""
    losses = []
    for i, rows in enumerate(positives):
        others = torch.zeros(logits.shape[1], dtype=torch.bool)
        others[rows] = True
        for p in rows:   # each positive against the corpus minus the query's other positives
            keep = ~others
            keep[p] = True
            losses.append(torch.logsumexp(logits[i][keep], 0) - logits[i, p])
    return torch.stack(losses).mean()


def train_query_tower(base, queries, qrels, passages, ids, epochs: int, lr: float, seed: int = 0):
    """A copy of ``base`` trained as the query tower against the frozen ``passages`` (full-corpus softmax)."""
    row = {d: i for i, d in enumerate(ids)}
    model = copy.deepcopy(base)
    model.train()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    positives = {q: [row[d] for d, g in docs.items() if g > 0 and d in row] for q, docs in qrels.items()}
    qids = sorted(q for q, rows in positives.items() if rows)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    steps = epochs * math.ceil(len(qids) / BATCH)
    warmup = max(1, int(0.1 * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (steps - s) / steps))
    for _ in range(epochs):
        order = rng.permutation(len(qids))
        for start in range(0, len(qids), BATCH):
            batch = [qids[i] for i in order[start:start + BATCH]]
            features = model.tokenize([queries[q] for q in batch])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(features)["sentence_embedding"]
            logits = torch.nn.functional.normalize(out.float(), dim=-1) @ passages.T / TEMPERATURE
            loss = full_corpus_loss(logits, [positives[q] for q in batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model


def feature_on_dev(args, collection: BeirCollection, train: dict, retriever):
    """The feature itself — ``pretrieve.finetune(..., train_towers="query")``, with the training loop's gradient
    clipping and weight decay — trained on the 728 training queries outside the dev split and searched on the 81 dev
    queries, in a temporary view of the collection (its corpus and queries linked, its qrels split)."""
    dev_ids = set(carve_queries(list(train), {"dev": DEV_SIZE}, 0)["dev"])
    with tempfile.TemporaryDirectory() as tmp:
        view = Path(tmp) / "view"
        (view / "qrels").mkdir(parents=True)
        for name in ("corpus.jsonl", "queries.jsonl"):
            (view / name).symlink_to((collection.root / name).resolve())
        for split, rows in (("train", {q: d for q, d in train.items() if q not in dev_ids}),
                            ("dev", {q: train[q] for q in dev_ids})):
            (view / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
                f"{q}\t{d}\t{g}\n" for q, docs in sorted(rows.items()) for d, g in sorted(docs.items())))
        runs = {"zero-shot": pretrieve.search(retriever, str(view), split="dev", k=100, show_progress=False)}
        for setting in args.settings:
            epochs, lr = setting.split(",")
            started = cpu_seconds()
            tuned = pretrieve.finetune(args.model, str(view), Path(tmp) / f"run-{epochs}-{lr}", train_towers="query",
                                       epochs=int(epochs), lr=float(lr), precision="auto", show_progress=False)
            print(f"{setting} (feature): {cpu_seconds() - started:.0f} s CPU", flush=True)
            runs[f"feature: epochs {epochs}, lr {lr}"] = pretrieve.search(tuned, str(view), split="dev", k=100,
                                                                          show_progress=False)
        return pretrieve.evaluate(runs, qrels=str(view / "qrels" / "dev.tsv"), measures="nDCG@10,R@100",
                                  baseline="zero-shot")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["dev", "test", "dev-feature"],
                        help="dev-feature: the feature (pretrieve.finetune(train_towers='query')) on the same dev split")
    parser.add_argument("settings", nargs="+", help="EPOCHS,LR (dev: several; test: the one chosen on dev)")
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args()
    torch.set_num_threads(2)
    collection = BeirCollection(resolve_collection(args.data))
    queries = collection.load_queries()
    train = collection.load_qrels("train")
    retriever = pretrieve.load_retriever(args.model)

    started = cpu_seconds()
    zero_shot = pretrieve.search(retriever, args.data, k=100, show_progress=False)   # fills the cache when cold
    print(f"zero-shot search (test): {cpu_seconds() - started:.0f} s CPU", flush=True)
    passages, ids = corpus_vectors(retriever, collection)
    from sentence_transformers import SentenceTransformer   # lazy: sentence_transformers
    base = SentenceTransformer(str(retriever.path), device="cpu")

    if args.mode == "dev-feature":
        table = feature_on_dev(args, collection, train, retriever)
    elif args.mode == "dev":
        dev_ids = set(carve_queries(list(train), {"dev": DEV_SIZE}, 0)["dev"])
        fit = {q: d for q, d in train.items() if q not in dev_ids}
        dev = {q: train[q] for q in dev_ids}
        runs = {"zero-shot": dense_run(base, {q: queries[q] for q in dev}, passages, ids)}
        for setting in args.settings:
            epochs, lr = setting.split(",")
            started = cpu_seconds()
            model = train_query_tower(base, queries, fit, passages, ids, int(epochs), float(lr))
            print(f"{setting}: trained on {len(fit)} queries in {cpu_seconds() - started:.0f} s CPU", flush=True)
            runs[f"epochs {epochs}, lr {lr}"] = dense_run(model, {q: queries[q] for q in dev}, passages, ids)
        table = pretrieve.evaluate(runs, qrels=dev, measures="nDCG@10,R@100", baseline="zero-shot")
    else:
        epochs, lr = args.settings[0].split(",")
        started = cpu_seconds()
        model = train_query_tower(base, queries, train, passages, ids, int(epochs), float(lr))
        print(f"query-side fine-tuning on {len(train)} queries: {cpu_seconds() - started:.0f} s CPU", flush=True)
        started = cpu_seconds()
        tuned = dense_run(model, collection.load_queries("test"), passages, ids)
        print(f"its search (test queries only, no passage encoded): {cpu_seconds() - started:.0f} s CPU", flush=True)
        table = pretrieve.evaluate({"zero-shot": zero_shot, "query-side": tuned}, args.data,
                                   measures="nDCG@10,R@100", baseline="zero-shot")
    print(table.to_markdown())
    for name, measures in table.comparisons.items():
        gain = measures["nDCG@10"]
        print(f"{name} - zero-shot: {gain.mean_difference:+.4f} nDCG@10, 95% CI [{gain.ci_low:+.4f}, "
              f"{gain.ci_high:+.4f}]")


if __name__ == "__main__":
    sys.exit(main())
