"""Gradient caching, measured: peak memory and time of one fine-tuning step at a batch of 256 passages, plain vs.
sub-batches of 32, against a plain step at 32 passages (one sub-batch) — docs/benchmarks.md, "Gradient caching".

Each measurement runs in its own process: the peak RSS of the process is reset just before the step (Linux:
``/proc/self/clear_refs``) and read after it (``VmHWM``), and the growth over the RSS before the step is reported,
so the model, tokenizer and batch are excluded — what is left is activations, gradients and the allocator's slack;
plain and cached runs alternate, and the medians are reported. A randomly initialised BERT
(4 layers, hidden 256, 4 heads, the uncased vocabulary) stands for the encoder; passages are 64 tokens, queries 16,
dropout on, fp32, one thread.

    OMP_NUM_THREADS=1 python scripts/experiments/grad_cache_memory.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def one(mode: str, queries: int, group: int, chunk: int, shape: str = "bert4") -> dict:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from pretrieve.models import resolve_model
    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.train.accelerator import enable_gradient_checkpointing
    from pretrieve.train.grad_cache import grad_cached_step
    from pretrieve.precision import MixedPrecision

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    if shape == "demo":   # the practitioner recipe's step: all-MiniLM-L6-v2, passages 144 tokens, queries 32
        model = DualEncoder.from_pretrained(str(resolve_model("minilm")))
        query_len, passage_len = 32, 144
    else:
        with tempfile.TemporaryDirectory() as directory:
            BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=256, num_hidden_layers=4,
                                 num_attention_heads=4, intermediate_size=1024)).save_pretrained(directory)
            tokenizer.save_pretrained(directory)
            model = DualEncoder.from_pretrained(directory)
        query_len, passage_len = 16, 64
    if mode == "checkpointed":
        enable_gradient_checkpointing(model)
    model.train()
    generator = torch.Generator().manual_seed(1)
    q = torch.randint(1000, len(tokenizer), (queries, query_len), generator=generator)
    p = torch.randint(1000, len(tokenizer), (queries * group, passage_len), generator=generator)
    batch = {"query_input_ids": q, "query_attention_mask": torch.ones_like(q),
             "passage_input_ids": p, "passage_attention_mask": torch.ones_like(p)}
    with open("/proc/self/clear_refs", "w") as handle:   # reset the peak RSS (VmHWM) to the current RSS
        handle.write("5")
    current = _status_kb("VmRSS")
    started = time.perf_counter()
    if mode == "cached":
        loss, _ = grad_cached_step(model, batch, chunk, MixedPrecision())
    else:
        loss, _ = model(batch)
        loss.backward()
    seconds = time.perf_counter() - started
    peak = _status_kb("VmHWM")
    return {"mode": mode, "passages": queries * group, "chunk": chunk if mode == "cached" else None,
            "seconds": seconds, "peak_growth_mb": (peak - current) / 1024, "rss_before_mb": current / 1024,
            "loss": float(loss)}


def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


#: Per ``--shape``: the measured steps (name → mode, queries, passages per query, sub-batch) and the plain
#: full-batch step the others are compared with.
SHAPES = {
    "bert4": ({"plain-256": ("plain", 16, 16, 0), "cached-256/32": ("cached", 16, 16, 32),
               "plain-32": ("plain", 2, 16, 0)}, "plain-256"),
    "demo": ({"plain-64": ("plain", 16, 4, 0), "cached-64/16": ("cached", 16, 4, 16),
              "checkpointed-64": ("checkpointed", 16, 4, 0)}, "plain-64"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", choices=list(SHAPES), default="bert4",
                        help="bert4: the random 4-layer BERT, 256 passages; demo: the practitioner recipe's step "
                             "(all-MiniLM-L6-v2, 16 queries x 4 passages, its grad_cache_chunk 16), plain vs "
                             "gradient caching vs gradient checkpointing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", nargs=5, metavar=("MODE", "QUERIES", "GROUP", "CHUNK", "SHAPE"))
    args = parser.parse_args()
    if args.child:
        mode, queries, group, chunk, shape = args.child
        print(json.dumps(one(mode, int(queries), int(group), int(chunk), shape)))
        return
    runs, plain = SHAPES[args.shape]
    results: dict[str, list[dict]] = {name: [] for name in runs}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for _ in range(args.repeats):
        for name, spec in runs.items():   # interleaved
            out = subprocess.run([sys.executable, __file__, "--child", *map(str, spec), args.shape],
                                 capture_output=True, text=True, env=env, check=True)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {name: {"peak_growth_mb": statistics.median(r["peak_growth_mb"] for r in rows),
                      "seconds": statistics.median(r["seconds"] for r in rows), "loss": rows[0]["loss"]}
               for name, rows in results.items()}
    for name in runs:   # every other way of taking the plain step's full batch, against it
        if name == plain or runs[name][1:3] != runs[plain][1:3]:
            continue
        summary[f"memory_plain_over_{name}"] = summary[plain]["peak_growth_mb"] / summary[name]["peak_growth_mb"]
        summary[f"time_{name}_over_plain"] = summary[name]["seconds"] / summary[plain]["seconds"]
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
