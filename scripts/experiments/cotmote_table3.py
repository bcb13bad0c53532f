#!/usr/bin/env python
"""CoT-MoTE on SciFact in the layout of CoT-MoTE (Ma et al. 2023)'s Table 3, and its embedding analysis (App. A.1, Fig. 4).

Everything goes through the package (pre-training, fine-tuning, search, evaluation, significance, divergence);
this script only fixes the settings, runs the stages in order and writes the tables:

1. **pairs** — the SciFact train queries with their positives (``pretrieve.data.spans.write_qrels_pairs``;
   the stand-in for docT5query pseudo-queries).
2. **pre-training** (``pretrieve.train.pretrainer.pretrain``, what ``pretrieve pretrain`` runs) from
   ``splade-tiny``: ``cotmote`` (MoTE) and ``cotmote`` with ``mote: false`` (the siamese encoder, "removing
   qry-FFN"), equal budgets.
3. **fine-tuning** (``pretrieve.train.finetuner.finetune``), stage 1 with BM25 negatives, ``hybrid``
   representation (α = β = 1, FLOPS λ_q 3e-4 / λ_d 1e-4), equal budgets: *siamese* (tied, from the siamese
   checkpoint), *fully separate* (``tied: false``, both towers from the siamese checkpoint) and *CoT-MoTE*
   (tied, from the MoTE checkpoint: queries through Q-FFN, passages through P-FFN).
4. **evaluation** — the 300 test queries, every model searched in the four modes of
   ``pretrieve.retrieval.index.sparse`` (dense / sparse / hybrid / rrf, exact, top 1000) through
   ``retrieval.search.search`` (what ``pretrieve dense --mode`` runs); nDCG@10 and R@100; paired t-tests
   (``pretrieve.evaluation.significance``) of MoTE and of fully separate against siamese, per mode and measure.
   splade-tiny as shipped, wrapped as a hybrid dual encoder, is a reference row.
5. **analysis** — KL/JS between the query and passage [CLS] embeddings of 400 train pairs
   (``pretrieve.analysis.divergence``) and the t-SNE figure.

Every stage skips work whose output exists (fine-tuning checks its settings), so an interrupted run resumes.
Outputs: ``OUT/results.json`` and ``OUT/results.md`` (tables), ``OUT/runs/*.trec``, the figure at ``--figure``.

Usage::

    .venv/bin/python scripts/experiments/cotmote_table3.py --out outputs/cotmote-table3 \\
        --figure docs/cotmote-tsne.png
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

SEED = 42
PRETRAIN = {"max_steps": 60, "batch_size": 16, "lr": 1e-4, "max_len": 96, "warmup_ratio": 0.1}
FINETUNE = {"max_steps": 50, "batch_size": 8, "lr": 5e-5, "num_negatives": 3, "query_max_len": 32,
            "passage_max_len": 128, "representation": "hybrid"}
MODES = ("dense", "sparse", "hybrid", "rrf")
MEASURES = ("nDCG@10", "R@100")
DEPTH = 1000
PAIRS_FOR_ANALYSIS = 400
MODELS = {"siamese": "Siamese", "separate": "Fully separate", "mote": "CoT-MoTE",
          "reference": "splade-tiny as shipped (reference)"}
BASELINE = "siamese"

logger = logging.getLogger("cotmote_table3")


class Clock:
    """Wall time per stage (seconds)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def run(self, name: str, function, *args, **kwargs):
        began = time.perf_counter()
        result = function(*args, **kwargs)
        self.times[name] = round(self.times.get(name, 0.0) + time.perf_counter() - began, 1)
        logger.info("%s: %.0f s", name, time.perf_counter() - began)
        return result


# ------------------------------------------------------------------------------------------------ stages
def write_pairs(data: Path, out: Path) -> Path:
    from pretrieve.data.collection import BeirCollection
    from pretrieve.data.spans import write_qrels_pairs

    path = out / "pairs.jsonl"
    if not path.exists():
        logger.info("pairs: %d", write_qrels_pairs(BeirCollection(data), "train", path))
    return path


def pretrain(base: str, pairs: Path, out: Path, mote: bool) -> Path:
    from pretrieve.train.method import method_from_mapping
    from pretrieve.train.pretrainer import PretrainConfig, pretrain as run

    if (out / "final" / "method.json").exists():
        return out / "final"
    method = method_from_mapping({"base": "cotmote", "name": "cotmote" if mote else "cotmote-siamese",
                                  "mote": mote, "context": {"pairs": str(pairs)}})
    config = PretrainConfig(model=base, corpus="", out=str(out), method=method, seed=SEED, save_every=0,
                            log_every=10, show_progress=False, **PRETRAIN)
    return run(config)


def finetune(init: Path, data: Path, out: Path, tied: bool, groups: Path | None) -> Path:
    from pretrieve.train.finetuner import FinetuneConfig, finetune as run

    config = FinetuneConfig(model=str(init), data=str(data), out=str(out), tied=tied, seed=SEED, save_every=0,
                            log_every=10, show_progress=False, groups=str(groups) if groups else None, **FINETUNE)
    return run(config)


def reference_model(base: str, out: Path) -> Path:
    """splade-tiny as shipped, saved as a hybrid dual encoder (no training) so the same search applies."""
    from transformers import AutoTokenizer

    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.modeling.export import export_retriever
    from pretrieve.modeling.representations.sparse import HybridRepresentation

    if (out / "dual_encoder.json").exists():
        return out
    model = DualEncoder.from_pretrained(base, representation=HybridRepresentation.for_model(base))
    lengths = {key: FINETUNE[key] for key in ("query_max_len", "passage_max_len")}
    return export_retriever(model, AutoTokenizer.from_pretrained(base), out, FINETUNE["passage_max_len"],
                            training=lengths)


def evaluate_models(models: dict[str, Path], data: Path, out: Path) -> dict:
    """Every model × mode: run (cached under OUT/runs), nDCG@10 / R@100, and the per-query results."""
    from pretrieve.data.collection import BeirCollection
    from pretrieve.data.trec import read_run, write_run
    from pretrieve.evaluation import evaluate
    from pretrieve.retrieval.load import load_retriever
    from pretrieve.retrieval.search import search

    collection = BeirCollection(data)
    corpus, queries, qrels = collection.load_corpus(), collection.load_queries("test"), collection.load_qrels("test")
    results = {}
    for name, model_dir in models.items():
        retriever = load_retriever(model_dir, precision="fp32")
        for mode in MODES:
            path = out / "runs" / f"{name}-{mode}.trec"
            if not path.exists():
                run = search(retriever, queries, corpus, k=DEPTH, cache_dir=out / "cache" / name,
                             show_progress=False, mode=mode)
                write_run(run, path, tag=f"{name}-{mode}")
            results[(name, mode)] = evaluate(qrels, read_run(path), MEASURES)
    return results


def significance(results: dict) -> dict:
    """Paired t-tests (two-sided, per query) of each model against the siamese one, per mode and measure."""
    from pretrieve.evaluation.significance import compare

    tests = {}
    for name in ("separate", "mote"):
        for mode in MODES:
            for measure in MEASURES:
                outcome = compare(results[(BASELINE, mode)], results[(name, mode)], measure, test="ttest")
                tests[f"{name}|{mode}|{measure}"] = {"p_value": outcome.p_value,
                                                     "mean_difference": outcome.mean_difference, "n": outcome.n}
    return tests


def sparsity(models: dict[str, Path], data: Path, out: Path) -> dict:
    """Average non-zeros per passage (from the cached index) and per test query; bytes per passage stored."""
    from pretrieve.data.collection import BeirCollection
    from pretrieve.retrieval.batches import encode_all
    from pretrieve.retrieval.index import find_shards, open_index
    from pretrieve.retrieval.index.sparse import storage as index_storage
    from pretrieve.retrieval.load import load_retriever

    queries = list(BeirCollection(data).load_queries("test").values())
    stats = {}
    for name, model_dir in models.items():
        encoded = encode_all(load_retriever(model_dir, device="cpu", precision="fp32").query, queries)
        storage = index_storage(open_index(find_shards(out / "cache" / name)[0]))
        stats[name] = {"passage_terms": storage["sparse_entries"], "query_terms": encoded["sparse"].nnz / len(queries),
                       "sparse_bytes_per_passage": storage["sparse_bytes"],
                       "sparse_bytes_per_passage_int32_ids": storage["sparse_bytes"] + 2 * storage["sparse_entries"],
                       "dense_bytes_per_passage": storage["dense_bytes"]}
    return stats


def divergence(models: dict[str, Path], data: Path, figure: Path) -> dict:
    """App. A.1: KL/JS of the query vs passage [CLS] embeddings of 400 train pairs, and the t-SNE panels."""
    from pretrieve.analysis.divergence import embedding_divergence, plot_tsne, sample_pairs
    from pretrieve.data.collection import BeirCollection
    from pretrieve.retrieval.batches import encode_all
    from pretrieve.retrieval.load import load_retriever

    pairs = sample_pairs(BeirCollection(data), "train", PAIRS_FOR_ANALYSIS, seed=SEED)
    results = {}
    for name, model_dir in models.items():
        retriever = load_retriever(model_dir, device="cpu", precision="fp32")
        queries = encode_all(retriever.query, [pair[0] for pair in pairs])["embeddings"]
        passages = encode_all(retriever.passage, [pair[1] for pair in pairs])["embeddings"]
        results[MODELS[name]] = embedding_divergence(queries, passages, seed=SEED)
    plot_tsne(results, figure, title=f"SciFact train pairs ({len(pairs)}), dense [CLS] after fine-tuning, "
                                     "t-SNE (cosine)")
    return {name: {"kl": result.kl, "js": result.js} for name, result in results.items()}


# ------------------------------------------------------------------------------------------------ tables
def markdown(results: dict, tests: dict, stats: dict, divergences: dict, times: dict) -> str:
    def p_value(name: str, mode: str, measure: str) -> str:
        test = tests.get(f"{name}|{mode}|{measure}")
        return "" if test is None else f" (p={test['p_value']:.3f})"

    lines = ["| model | nDCG@10 | R@100 |", "|---|---|---|"]
    for mode in MODES:
        lines.append(f"| **{mode}** | | |")
        for name in MODELS:
            values = [f"{100 * results[(name, mode)].aggregate[m]:.1f}{p_value(name, mode, m)}" for m in MEASURES]
            lines.append(f"| {MODELS[name]} | " + " | ".join(values) + " |")
    lines += ["", "| model | terms / passage | terms / query | sparse bytes / passage (uint16 ids; int32 ids) |",
              "|---|---|---|---|"]
    for name, values in stats.items():
        lines.append(f"| {MODELS[name]} | {values['passage_terms']:.0f} | {values['query_terms']:.0f} | "
                     f"{values['sparse_bytes_per_passage']:.0f}; {values['sparse_bytes_per_passage_int32_ids']:.0f} |")
    lines += ["", "| dual encoder | KL(P_q ‖ P_p) | JS |", "|---|---|---|"]
    for name, values in divergences.items():
        lines.append(f"| {name} | {values['kl']:.3f} | {values['js']:.3f} |")
    lines += ["", "Wall time (s): " + ", ".join(f"{stage} {seconds:.0f}" for stage, seconds in times.items()), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/cotmote-table3"))
    parser.add_argument("--data", default="scifact", help="SciFact in BEIR layout (a path or a known name).")
    parser.add_argument("--base", default="splade-tiny", help="Starting checkpoint (path or offline alias).")
    parser.add_argument("--figure", type=Path, default=Path("docs/cotmote-tsne.png"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from pretrieve.io_utils import write_json
    from pretrieve.models import resolve_model
    from pretrieve.data.registry import resolve_collection

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    out, clock = args.out, Clock()
    out.mkdir(parents=True, exist_ok=True)
    data = resolve_collection(args.data)
    base = resolve_model(args.base)

    pairs = clock.run("pairs", write_pairs, data, out)
    siamese_pt = clock.run("pretrain", pretrain, base, pairs, out / "pretrain" / "siamese", mote=False)
    mote_pt = clock.run("pretrain", pretrain, base, pairs, out / "pretrain" / "mote", mote=True)
    models = {"siamese": clock.run("finetune", finetune, siamese_pt, data, out / "finetune" / "siamese", True, None)}
    groups = out / "finetune" / "siamese" / "bm25_groups.jsonl"       # the same BM25 negatives for all three
    models["separate"] = clock.run("finetune", finetune, siamese_pt, data, out / "finetune" / "separate", False,
                                   groups)
    models["mote"] = clock.run("finetune", finetune, mote_pt, data, out / "finetune" / "mote", True, groups)
    models["reference"] = reference_model(base, out / "reference")

    results = clock.run("evaluate", evaluate_models, models, data, out)
    tests = significance(results)
    stats = clock.run("sparsity", sparsity, models, data, out)
    trained = {name: models[name] for name in ("siamese", "separate", "mote")}
    divergences = clock.run("analysis", divergence, trained, data, args.figure)
    clock.times["total"] = round(time.perf_counter() - began, 1)

    table = {f"{name}|{mode}": {m: results[(name, mode)].aggregate[m] for m in MEASURES}
             for name, mode in results}
    write_json(out / "results.json", {"settings": {"seed": SEED, "pretrain": PRETRAIN, "finetune": FINETUNE,
                                                   "depth": DEPTH, "base": base, "data": str(data)},
                                      "results": table, "ttests_vs_siamese": tests, "sparsity": stats,
                                      "divergence": divergences, "times_s": clock.times})
    text = markdown(results, tests, stats, divergences, clock.times)
    (out / "results.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
