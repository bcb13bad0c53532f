"""The settings of fine-tuning and reranker training that are not loop settings, declared without torch.

:class:`~pretrieve.train.finetuner.FinetuneConfig` and :class:`~pretrieve.train.reranker.RerankerConfig` are
these plus :class:`~pretrieve.train.loop.LoopConfig`. They live here, apart from the trainers, so that the
command line can build its options (help texts and defaults come from the fields' metadata) without importing
torch: ``pretrieve --help``, ``bm25``, ``evaluate`` and ``data`` never load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _help(text: str) -> Any:
    return {"help": text}


@dataclass
class FinetuneSettings:
    """Data, model, representation and loss of one fine-tuning stage (defaults: :mod:`pretrieve.train.finetuner`)."""

    model: str = field(default="", metadata=_help("Pre-trained encoder to start from (every stage starts from it)."))
    data: str = field(default="", metadata=_help("Collection in BEIR layout."))
    out: str = field(default="", metadata=_help("Output directory (checkpoints, logs, final/)."))
    split: str = field(default="train", metadata=_help("Qrels split of the training queries."))
    stage: int = field(default=1, metadata=_help("1: BM25 negatives; 2: mined negatives; 3: + distillation."))
    groups: str | None = field(default=None, metadata=_help(
        "Training groups JSONL; stage 1 builds BM25 groups when absent, stages 2/3 require it."))
    num_negatives: int = field(default=7, metadata=_help("Hard negatives per query per step (papers: 15)."))
    query_max_len: int = field(default=32, metadata=_help("Query token limit."))
    passage_max_len: int = field(default=144, metadata=_help("Passage token limit (title + text)."))
    title_join: str = field(default="space", metadata=_help(
        "Between a passage's title and its text: space (title + ' ' + text) | sep (title + the tokenizer's [SEP] + "
        "text, as RetroMAE's and Tevatron's pre-processing); saved with the model, so that search joins them alike."))
    representation: str = field(default="dense", metadata=_help("Representation type."))
    pooling: str | None = field(default=None, metadata=_help(
        "cls | mean; default: the checkpoint's sentence-transformers pooling, else cls (papers)."))
    normalize: bool | None = field(default=None, metadata=_help(
        "L2-normalise vectors; default: whether the checkpoint has a Normalize module."))
    query_prompt: str | None = field(default=None, metadata=_help(
        "Text put before every query in training and saved with the model, so that search uses it too "
        "(E5/BGE-style 'query: '); default: the checkpoint's saved sentence-transformers query prompt; '': none."))
    passage_prompt: str | None = field(default=None, metadata=_help(
        "Text put before every passage in training and saved with the model; default: the checkpoint's saved "
        "sentence-transformers passage prompt; '': none."))
    similarity: str = field(default="dot", metadata=_help("dot (papers) | cos."))
    temperature: float | None = field(default=None, metadata=_help(
        "Softmax temperature; default: 1 for dot products, 0.05 for cosine/normalised vectors."))
    tied: bool = field(default=True, metadata=_help("Siamese towers (shared weights); false: separate towers."))
    alpha: float = field(default=0.2, metadata=_help("Weight of the contrastive term in stage 3 (CDMAE, Li et al. 2023)."))
    teacher_temperature: float = field(default=1.0, metadata=_help("Temperature of the teacher's softmax (stage 3)."))
    in_batch: bool = field(default=True, metadata=_help("Use the other queries' passages as negatives too."))
    gather: bool = field(default=True, metadata=_help("Cross-device negatives under DDP."))
    bm25_depth: int = field(default=1000, metadata=_help("K1: BM25 depth of the stage-1 negatives."))
    max_groups: int | None = field(default=None, metadata=_help("Train on the first N groups only (quick runs)."))
    on_unknown: str = field(default="error", metadata=_help(
        "Document ids missing from the corpus: error | skip (drop and count them)."))
    grad_cache_chunk: int | None = field(default=None, metadata=_help(
        "Gradient caching: encode in sub-batches of this many texts (same gradients, one sub-batch of "
        "activation memory, one extra forward pass); None: off."))
    eval_steps: int = field(default=0, metadata=_help(
        "Evaluate on dev queries every N steps and at the end, logging the measures to logs.jsonl and the trackers; "
        "final/ is then the best evaluated model by --metric-for-best (0: no evaluation, final/ is the last step)."))
    eval_data: str | None = field(default=None, metadata=_help(
        "Collection of the dev queries (name or path); default: --data (a recipe: its dev split)."))
    eval_split: str | None = field(default=None, metadata=_help(
        "Qrels split of the dev queries; default: dev (a recipe: its dev split)."))
    eval_measures: str = field(default="nDCG@10,MRR@10,R@100", metadata=_help(
        "Measures logged at each evaluation (ir_measures names, comma-separated)."))
    metric_for_best: str = field(default="nDCG@10", metadata=_help(
        "The measure that picks the best evaluated model (higher is better; ties keep the earlier step)."))
    # loop settings whose defaults differ for fine-tuning
    batch_size: int = field(default=16, metadata=_help("Queries per optimizer step, all processes together."))
    lr: float = field(default=2e-5, metadata=_help("Peak learning rate (papers: 2e-5)."))
    epochs: float = field(default=3.0, metadata=_help("Epochs when --steps (config: max_steps) is 0 (papers: 3)."))


@dataclass
class RerankerSettings:
    """Model and groups of cross-encoder training."""

    model: str = field(default="", metadata=_help("Encoder to initialise the cross-encoder from."))
    data: str = field(default="", metadata=_help("Collection in BEIR layout (passage texts)."))
    groups: str = field(default="", metadata=_help("Training groups JSONL (e.g. from `pretrieve mine`)."))
    out: str = field(default="", metadata=_help("Output directory (checkpoints, logs, final/)."))
    num_negatives: int = field(default=7, metadata=_help("Hard negatives per query per step."))
    max_len: int = field(default=192, metadata=_help("Token limit of a (query, passage) pair."))
    max_groups: int | None = field(default=None, metadata=_help("Train on the first N groups only."))
    on_unknown: str = field(default="error", metadata=_help("Unknown document ids: error | skip."))
    batch_size: int = field(default=16, metadata=_help("Queries per optimizer step."))
    lr: float = field(default=3e-5, metadata=_help("Peak learning rate."))
    epochs: float = field(default=1.0, metadata=_help("Epochs when --steps (config: max_steps) is 0."))
