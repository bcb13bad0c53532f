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
* **Throughput.** 90 TFLOP/s sustained per H100 (bf16/fp16). Two reference points: CoT-MoTE (Ma et al. 2023, §4.1)
  pre-trained 80k steps x 2,048 x 144 tokens "on 8 Tesla A100 for 12 hours" — by the count above 1.3e19 FLOPs, i.e.
  39 TFLOP/s per A100, x 2.5 for an H100 (3.2x the dense bf16 peak, less for a 110M-parameter model) ~ 100; and Drop
  your Decoder (Ma et al. 2024, Table 4) measures 266 BoW samples/s on one H800, which is 83 TFLOP/s if its samples
  are 512 tokens long (its phase-1 length; the table does not say). A faster or slower real step scales every hour
  figure alike: measure one with `pretrieve bench pretrain --device cuda` and rescale.
* **Memory per process** (8 processes): weights, gradients and AdamW states in fp32 (16 bytes a parameter) + the
  activations of one micro-batch in 16-bit precision (Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes a layer)
  + 10 bytes a vocabulary entry per scored position (16-bit logits, their fp32 log-softmax and its gradient) + 1 GB
  of CUDA context. Inference stages (encoding, mining, teacher scoring, re-ranking) at batch 64 stay under ~4 GB.
* **Wikipedia + BookCorpus phases.** pretrieve reads each BookCorpus row (one sentence) as one example and pads a
  micro-batch to its longest text, which with ~14 % 512-token Wikipedia chunks in the mix is nearly always 512: an
  epoch is ~86M examples of 512 positions. RetroMAE packs consecutive lines into 512-token sequences (~14.5M an
  epoch), ~6x less compute for the same text; the phases with ``epochs:`` (DupMAE, CDMAE) pay this in full.

Run: ``python scripts/experiments/recipe_costs.py`` (no arguments; standard library only).
"""

from __future__ import annotations

H, LAYERS, HEADS, VOCAB = 768, 12, 12, 30522
BODY = 85e6                       # parameters of the 12 layers' linear maps
PARAMS = 110e6
HEAD = 2 * H * VOCAB + 2 * H * H  # FLOPs of one vocabulary-head position, forward
TFLOPS = 90e12                    # sustained per H100 (module docstring)
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
          logits_positions: float | None = None) -> tuple[str, float, float]:
    # extra_params (CoT-MoTE's second FFN expert) cost memory, not FLOPs: each token goes through one expert
    flops = 3 * steps * tokens_per_step * fwd_per_token(length, scored, decoder_layers, decoder_scored)
    if logits_positions is None:
        logits_positions = per_process_tokens * (scored + decoder_scored)
    memory = (16 * (PARAMS + extra_params) / 1e9 + activations_gb(per_process_tokens, length, LAYERS + decoder_layers)
              + 10 * VOCAB * logits_positions / 1e9 + 1.0)
    return name, flops / TFLOPS / 3600, memory


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
WIKI_CHUNKS = 12e6       # 512-token chunks of English Wikipedia 2023 (6.4M articles, ~5.5B word pieces)
BOOK_ROWS = 74e6         # BookCorpus rows on the hub: one sentence each, one example each (not packed)
PHASE1 = WIKI_CHUNKS + BOOK_ROWS   # examples per epoch of the Wikipedia + BookCorpus phase, as pretrieve reads it

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
        pretrain("pretrain (Wikipedia + BookCorpus unpacked, 8 epochs x 256 x 512)", 8 * PHASE1 / 256, 256, 512,
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
        pretrain("pretrain (retromae, Wikipedia + BookCorpus unpacked, 8 epochs x 256 x 512)", 8 * PHASE1 / 256, 256,
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


def main() -> None:
    for recipe, stages in RECIPES.items():
        total = sum(hours for _, hours, _ in stages)
        print(f"\n**{recipe}**: {total:,.0f} H100-hours in all ({total / 8:,.1f} h on 8 GPUs)\n")
        print("| stage | H100-hours | GPU memory per process |")
        print("|---|---:|---:|")
        for name, hours, memory in stages:
            print(f"| {name} | {hours:,.1f} | {memory:,.0f} GB |")


if __name__ == "__main__":
    main()
