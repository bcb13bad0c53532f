"""Expected GPU-hours and GPU memory per process of each stage of the paper recipes — an extrapolation, not a
measurement (no paper recipe has been timed on a GPU yet). Prints the table that docs/distributed.md ("What the
paper recipes cost") and the recipe headers quote.

How each figure is made:

* **Compute.** FLOPs of BERT-base (12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30,522) per token, forward:
  2 x 85M (the linear layers) + 4 x L x 768 per layer (attention scores and values at sequence length L), plus
  2 x 768 x 30,522 (+ the 768x768 transform) per position a vocabulary head scores (MLM: the masked 30 %; RetroMAE's
  decoders, CoT-MoTE's: every position they score; DupMAE's OT-BoW and the sparse/hybrid and DupMAE
  representations: every position). A decoder layer costs 1/12 of the encoder body per position. Training = 3 x
  forward. Padded lengths are the maximum lengths (a large random batch nearly always holds one text that reaches
  it); encoding sorts texts by length, so it is counted at MS MARCO's mean passage length (~85 word pieces with the
  title).
* **Throughput** by the stage's precision (:data:`RATE`): 90 TFLOP/s sustained per H100 in bf16/fp16, 45 in fp32
  (two thirds of the 67 TFLOP/s fp32 peak; every paper recipe now trains in bf16 or fp16). Checked against three
  published runs (:data:`PUBLISHED`, :func:`calibration`), each stage counted exactly as its recipe's estimate counts
  it (queries, decoders and heads included), an A100 taken as 1/2.5 of an H100 and an H800 as one:
  CoT-MoTE (Ma et al. 2023, §4.1: 80k steps "on 8 Tesla A100 for 12 hours"), CoT-MAE (caskcsg/ir cotmae README: "2.5
  days to finish 800k steps pre-training on 8 A100 gpus") and Drop your Decoder (Ma et al. 2024, Table 4: 266.359
  BoW samples/s on one H800, taken as 512-token samples, its phase-1 length; the table does not say). Each implied
  rate is within 1.5x of 90 (``python recipe_costs.py --check`` fails otherwise). A faster or slower real step
  scales every hour figure alike: measure one with `scripts/gpu-check.sh` (achieved TFLOP/s of a BERT-base
  pre-training step) and rescale.
* **Memory per process** (8 processes): weights, gradients and AdamW states in fp32 (16 bytes a parameter) + the
  activations of one micro-batch in 16-bit precision (Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes a layer)
  + 10 bytes a vocabulary entry per scored position (16-bit logits, their fp32 log-softmax and its gradient) + 1 GB
  of CUDA context. Inference stages (encoding, mining, teacher scoring, re-ranking) at batch 64 stay under ~4 GB.
* **Wikipedia + BookCorpus phases** are packed (``pack: true``, BookCorpus ``pack_across``; pretrieve.data.packing),
  as RetroMAE's and bowdpr's pre-processing: Wikipedia's ~12M blocks of up to 510 tokens within articles plus
  BookCorpus's ~1.0B tokens (74M rows of ~13.5) packed across rows, ~2.0M blocks, i.e. ~14M examples an epoch
  (RetroMAE's data: ~14.5M). Unpacked, each BookCorpus row would be one example padded with its micro-batch to 512:
  ~86M examples an epoch, ~6x the compute of the phases with ``epochs:`` (DupMAE, CDMAE); :data:`UNPACKED` keeps
  that figure for the docs.

Run: ``python scripts/experiments/recipe_costs.py`` prints the tables; ``--headers`` the cost block of each recipe
header (configs/NAME.yaml carries it verbatim; tests/test_recipe_costs.py compares); ``--check`` the three published
points (exit 1 when one is off by more than 1.5x). Standard library only.
"""

from __future__ import annotations

import sys

H, LAYERS, HEADS, VOCAB = 768, 12, 12, 30522
BODY = 85e6                       # parameters of the 12 layers' linear maps
PARAMS = 110e6
HEAD = 2 * H * VOCAB + 2 * H * H  # FLOPs of one vocabulary-head position, forward
RATE = {"bf16": 90e12, "fp16": 90e12, "fp32": 45e12}   # sustained FLOP/s per H100 (module docstring)
TFLOPS = RATE["bf16"]
A100, H800 = 1 / 2.5, 1.0         # one GPU of the kind, in H100s
AGREEMENT = 1.5                   # the published points must agree within this factor
MARCO_QUERIES = 502_939           # MS MARCO training queries with judgments
MARCO_PASSAGES = 8_841_823
PASSAGE_MEAN = 85                 # word pieces, title included
BEIR_DOCS = 24_550_000            # the 13 BEIR corpora of the papers' tables, summed (fever and climate-fever twice)
BEIR_MEAN = 110


def fwd_per_token(length: int, scored: float = 0.0, decoder_layers: float = 0.0, decoder_scored: float = 0.0) -> float:
    body = 2 * BODY + 4 * length * H * LAYERS
    return body + scored * HEAD + decoder_layers / LAYERS * body + decoder_scored * HEAD


def activations_gb(tokens: float, length: int, layers: float = LAYERS) -> float:
    return tokens * H * (34 + 5 * HEADS * length / H) * layers / 1e9


def train(name: str, steps: float, tokens_per_step: float, length: int, per_process_tokens: float, *,
          scored: float = 0.0, decoder_layers: float = 0.0, decoder_scored: float = 0.0, extra_params: float = 0.0,
          logits_positions: float | None = None, precision: str = "bf16") -> tuple[str, float, float]:
    # extra_params (CoT-MoTE's second FFN expert) cost memory, not FLOPs: each token goes through one expert
    flops = train_flops(steps, tokens_per_step, length, scored, decoder_layers, decoder_scored)
    if logits_positions is None:
        logits_positions = per_process_tokens * (scored + decoder_scored)
    activation_bytes = 2 if precision in ("bf16", "fp16") else 4     # Korthikanti's count is for 16-bit values
    memory = (16 * (PARAMS + extra_params) / 1e9
              + activations_gb(per_process_tokens, length, LAYERS + decoder_layers) * activation_bytes / 2
              + 10 * VOCAB * logits_positions / 1e9 + 1.0)
    return name, flops / RATE[precision] / 3600, memory


def train_flops(steps: float, tokens_per_step: float, length: int, scored: float = 0.0, decoder_layers: float = 0.0,
                decoder_scored: float = 0.0) -> float:
    """Training FLOPs: 3 x forward (module docstring)."""
    return 3 * steps * tokens_per_step * fwd_per_token(length, scored, decoder_layers, decoder_scored)


def infer(name: str, texts: float, mean_length: int, scored: float = 0.0) -> tuple[str, float, float]:
    return name, texts * mean_length * fwd_per_token(mean_length, scored) / TFLOPS / 3600, 4.0


def finetune(name: str, queries_per_step: int, group: int, plen: int, epochs: float, vocab_rep: bool = False,
             extra_params: float = 0.0, queries: int = MARCO_QUERIES) -> tuple[str, float, float]:
    steps = epochs * queries / queries_per_step
    passages = queries_per_step * group
    tokens = queries_per_step * 32 + passages * plen
    per_process = tokens / 8
    scored = 1.0 if vocab_rep else 0.0   # a vocabulary-space representation scores every position
    return train(name, steps, tokens, plen, per_process, scored=scored, extra_params=extra_params)


def pretrain(name: str, steps: float, batch: int, length: int, micro: int | None = None, **kw) -> tuple[str, float,
                                                                                                        float]:
    per_process = (micro or batch / 8) * length
    return train(name, steps, batch * length, length, per_process, **kw)


def reranker(name: str, queries_per_step: int, group: int, length: int, epochs: float) -> tuple[str, float, float]:
    steps = epochs * MARCO_QUERIES / queries_per_step
    tokens = queries_per_step * group * length
    return train(name, steps, tokens, length, tokens / 8)


ENCODE = infer("mine: encode 8.8M passages", MARCO_PASSAGES, PASSAGE_MEAN)
ENCODE_VOCAB = infer("mine: encode 8.8M passages", MARCO_PASSAGES, PASSAGE_MEAN, scored=1.0)   # vocabulary parts
TEACHER = infer("teacher: 502,939 x 201 pairs", MARCO_QUERIES * 201, PASSAGE_MEAN + 12)
BEIR = infer("encode the 13 BEIR corpora (one retriever)", BEIR_DOCS, BEIR_MEAN)
WIKI_CHUNKS = 12e6       # blocks of up to 510 tokens of English Wikipedia 2023 within articles (6.4M articles, ~5.5B
                         # word pieces; whole-sentence packing within an article gives about as many as chunking)
BOOK_ROWS = 74e6         # BookCorpus rows on the hub: one sentence each
BOOK_TOKENS = BOOK_ROWS * 13.5
PACKED_FILL = 0.97       # a packed block's share of its 510 tokens (whole sentences; tests/test_packing.py: ~0.98)
PHASE1 = WIKI_CHUNKS + BOOK_TOKENS / (510 * PACKED_FILL)   # examples per packed epoch of Wikipedia + BookCorpus
UNPACKED = WIKI_CHUNKS + BOOK_ROWS   # the same epoch unpacked: one BookCorpus row, one example

RECIPES = {
    "bow-msmarco": [
        pretrain("pretrain (Wikipedia + BookCorpus, 140k x 2048 x 512)", 140_000, 2048, 512, micro=64, scored=0.3),
        pretrain("pretrain-2 (MS MARCO, 80k x 2048 x 144)", 80_000, 2048, 144, micro=128, scored=0.3),
        finetune("finetune-s1 (64 x 16 x 144, 3 epochs)", 64, 16, 144, 3),
        ENCODE,
        finetune("finetune-s2", 64, 16, 144, 3),
        ("evaluate (2 retrievers)", 2 * ENCODE[1], ENCODE[2]),
    ],
    "dupmae-msmarco": [
        pretrain("pretrain (Wikipedia + BookCorpus packed, 8 epochs x 256 x 512)", 8 * PHASE1 / 256, 256, 512,
                 scored=1.0, decoder_layers=1, decoder_scored=1.0),
        pretrain("pretrain-2 (MS MARCO, 20 epochs x 1024 x 150)", 20 * MARCO_PASSAGES / 1024, 1024, 150, scored=1.0,
                 decoder_layers=1, decoder_scored=1.0),
        finetune("finetune-s1 (128 x 1 x 140, 4 epochs)", 128, 1, 140, 4, vocab_rep=True),
        ENCODE_VOCAB,
        finetune("finetune-s2 (128 x 16 x 140, 4 epochs)", 128, 16, 140, 4, vocab_rep=True),
        reranker("reranker (16 x 65 x 200, 4 epochs)", 16, 65, 200, 4),
        TEACHER,
        finetune("finetune-s3", 128, 16, 140, 4, vocab_rep=True),
        ("evaluate (3 retrievers)", 3 * ENCODE_VOCAB[1], ENCODE[2]),
    ],
    "cpdae-msmarco": [
        pretrain("pretrain (Wikipedia, 3 epochs x 64 x 512, two views)", 3 * WIKI_CHUNKS / 64, 128, 512, scored=0.15),
        finetune("finetune-s1 (64 x 8 x 144, 3 epochs)", 64, 8, 144, 3),
        ENCODE,
        finetune("finetune-s2", 64, 8, 144, 3),
        ("evaluate (2 retrievers)", 2 * ENCODE[1], ENCODE[2]),
    ],
    "cdmae-msmarco": [
        pretrain("pretrain (retromae, Wikipedia + BookCorpus packed, 8 epochs x 256 x 512)", 8 * PHASE1 / 256, 256,
                 512, scored=0.3, decoder_layers=1, decoder_scored=1.0),
        pretrain("pretrain-2 (cdmae, 80k x 2048 x 144)", 80_000, 2048, 144, scored=0.3, decoder_layers=2,
                 decoder_scored=0.5),
        finetune("finetune-s1 (64 x 32 x 144, 3 epochs)", 64, 32, 144, 3),
        ENCODE,
        finetune("finetune-s2", 64, 32, 144, 3),
        ("mine-2: encode 8.8M passages", ENCODE[1], ENCODE[2]),
        reranker("reranker (64 x 32 x 192, 1 epoch)", 64, 32, 192, 1),
        TEACHER,
        finetune("finetune-s3 (32 x 64 x 144, 3 epochs)", 32, 64, 144, 3),
        ("evaluate MS MARCO (3 retrievers + re-rank 200)", 3 * ENCODE[1] + 0.1, ENCODE[2]),
        ("evaluate BEIR (finetune-s3 only)", BEIR[1], BEIR[2]),
    ],
    "cotmae-msmarco": [
        pretrain("pretrain (800k x 512 anchors + 512 contexts x 128)", 800_000, 1024, 128, scored=0.3,
                 decoder_layers=2, decoder_scored=0.45 / 2),
        finetune("finetune-s1 (64 x 16 x 144, 3 epochs)", 64, 16, 144, 3),
        ENCODE,
        finetune("finetune-s2", 64, 16, 144, 3),
        ("evaluate (2 retrievers)", 2 * ENCODE[1], ENCODE[2]),
    ],
    "cotmote-msmarco": [
        pretrain("pretrain (80k x 2048 pairs x 144 + queries)", 80_000, 2048, 144 + 16, scored=0.3,
                 decoder_layers=1, decoder_scored=0.1, extra_params=57e6),
        finetune("finetune-s1 (hybrid, 64 x 16 x 144, 3 epochs)", 64, 16, 144, 3, vocab_rep=True, extra_params=57e6),
        ENCODE_VOCAB,
        finetune("finetune-s2", 64, 16, 144, 3, vocab_rep=True, extra_params=57e6),
        ("evaluate (2 retrievers; one index serves dense/sparse/hybrid)", 2 * ENCODE_VOCAB[1], ENCODE[2]),
    ],
    "bow-beir": [
        pretrain("pretrain (as bow-msmarco phase 1)", 140_000, 2048, 512, micro=64, scored=0.3),
        finetune("finetune-s1 (1024 x 2 x 144, 10 epochs)", 1024, 2, 144, 10),
        ("evaluate BEIR", BEIR[1], BEIR[2]),
    ],
    "dupmae-beir": [
        pretrain("pretrain (as dupmae-msmarco phase 1)", 8 * PHASE1 / 256, 256, 512, scored=1.0,
                 decoder_layers=1, decoder_scored=1.0),
        finetune("finetune-s1 (1024 x 2 x 144, 10 epochs)", 1024, 2, 144, 10, vocab_rep=True),
        ("evaluate BEIR", BEIR[1], BEIR[2]),
    ],
    "msmarco-bert-base-gpu": [
        pretrain("pretrain (MS MARCO, 20 epochs x 2048 x 144)", 20 * MARCO_PASSAGES / 2048, 2048, 144, micro=128,
                 scored=0.3),
        finetune("finetune-s1 (64 x 16 x 144, 3 epochs)", 64, 16, 144, 3),
        ENCODE,
        finetune("finetune-s2", 64, 16, 144, 3),
        reranker("reranker (64 x 16 x 192, 1 epoch)", 64, 16, 192, 1),
        infer("teacher: 502,939 x 32 pairs", MARCO_QUERIES * 32, PASSAGE_MEAN + 12),
        finetune("finetune-s3", 64, 16, 144, 3),
        ("evaluate (3 retrievers + re-rank 200 + 4 BEIR sets)", 3 * ENCODE[1] + 0.3, ENCODE[2]),
    ],
}


#: The published runs: (recipe, its stage, what was published, GPU-hours, one of those GPUs in H100s).
PUBLISHED = [
    ("cotmote-msmarco", 0, 'CoT-MoTE (Ma et al. 2023) §4.1: 80k steps "on 8 Tesla A100 for 12 hours"', 8 * 12, A100),
    ("cotmae-msmarco", 0, 'caskcsg/ir cotmae README: "2.5 days to finish 800k steps pre-training on 8 A100 gpus"',
     8 * 60, A100),
    ("bow-msmarco", 0, "Drop your Decoder (Ma et al. 2024) Table 4: 266.359 BoW samples/s on one H800 (512 tokens), "
     "140k steps x 2048", 140_000 * 2048 / 266.359 / 3600, H800),
]


def calibration() -> list[dict]:
    """Each published run beside this module's estimate of the same stage: H100-hours both ways, their ratio
    (estimated / published) and the FLOP/s per H100 the run implies (its stage counted as the estimate counts it)."""
    rows = []
    for recipe, index, source, gpu_hours, per_h100 in PUBLISHED:
        name, hours, _ = RECIPES[recipe][index]
        published = gpu_hours * per_h100
        rows.append({"recipe": recipe, "stage": name, "source": source, "estimated_h100_hours": hours,
                     "published_h100_hours": published, "ratio": hours / published,
                     "implied_tflops_per_h100": hours * TFLOPS / published / 1e12})
    return rows


def short_name(stage: str) -> str:
    """A stage's name in a recipe header: up to its description ("mine: encode ..." → "mine")."""
    return stage.split(" (")[0].split(":")[0].strip()


def header_block(recipe: str) -> str:
    """The cost block of a recipe header (the ``# Cost:`` lines of configs/NAME.yaml)."""
    stages = RECIPES[recipe]
    total = sum(hours for _, hours, _ in stages)
    items = [f"{short_name(name)} {hours:,.1f} ({memory:,.0f} GB)".replace(" ", "\0") for name, hours, memory in stages]
    text = ("Cost: EXTRAPOLATED, not measured on a GPU: FLOPs of BERT-base at this recipe's batch x length x steps, "
            "at 90 TFLOP/s per H100 in bf16/fp16 (45 in fp32); three published runs (CoT-MoTE's 12 h on 8 A100s, "
            "CoT-MAE's 2.5 days on 8 A100s, Drop your Decoder's Table 4 H800 speed) agree within 1.5x "
            "(scripts/experiments/recipe_costs.py, docs/distributed.md; scripts/gpu-check.sh measures the rate). "
            "H100-hours per stage (GPU memory per process): " + ", ".join(items) + f"; in all ~{total:,.0f} "
            f"H100-hours, ~{total / 8:,.1f} h on 8 H100s.")
    if all(memory <= 40 for _, _, memory in stages):
        text += " Every process fits a 40\0GB card."
    return "\n".join(wrap(text, first="# ", rest="#   ")).replace("\0", " ")   # a stage's figures stay on one line


def wrap(text: str, first: str, rest: str, width: int = 118) -> list[str]:
    lines, line = [], first
    for word in text.split(" "):
        if len(line) + len(word) + 1 > width and line.strip("# "):
            lines.append(line.rstrip())
            line = rest
        line += ("" if line in (first, rest) else " ") + word
    return lines + [line.rstrip()]


def main(argv: list[str]) -> int:
    if "--headers" in argv:
        for recipe in RECIPES:
            print(f"--- configs/{recipe}.yaml\n{header_block(recipe)}")
        return 0
    if "--check" in argv:
        bad = 0
        for row in calibration():
            ok = 1 / AGREEMENT <= row["ratio"] <= AGREEMENT
            bad += not ok
            print(f"{'ok ' if ok else 'OFF'} {row['source']}: published {row['published_h100_hours']:,.0f} H100-h, "
                  f"estimated {row['estimated_h100_hours']:,.0f} (ratio {row['ratio']:.2f}; "
                  f"{row['implied_tflops_per_h100']:.0f} TFLOP/s per H100)")
        return 1 if bad else 0
    for recipe, stages in RECIPES.items():
        total = sum(hours for _, hours, _ in stages)
        print(f"\n**{recipe}**: {total:,.0f} H100-hours in all ({total / 8:,.1f} h on 8 GPUs)\n")
        print("| stage | H100-hours | GPU memory per process |")
        print("|---|---:|---:|")
        for name, hours, memory in stages:
            print(f"| {name} | {hours:,.1f} | {memory:,.0f} GB |")
    print("\n| published run | published H100-h | estimated H100-h | ratio | implied TFLOP/s per H100 |")
    print("|---|---:|---:|---:|---:|")
    for row in calibration():
        print(f"| {row['source']} | {row['published_h100_hours']:,.0f} | {row['estimated_h100_hours']:,.0f} | "
              f"{row['ratio']:.2f} | {row['implied_tflops_per_h100']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
