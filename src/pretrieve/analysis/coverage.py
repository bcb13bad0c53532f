"""Input-token coverage of dense representations (Drop your Decoder, Ma et al. 2024, §3.2, Algorithm 1, Fig. 2–5).

The [CLS] vector of the last layer is projected to the vocabulary with the checkpoint's language-model
head (``h_proj = LMHead(h_CLS)``, eq. 11 ``h_CLS · Eᵀ`` through "the BERT language model heads"); the
*input token coverage ratio* at ``k`` is the share of the top-``k`` tokens of ``h_proj`` that occur in the
tokenized input, ``|TopK(h_proj) ∩ T| / k``, averaged over texts.

Choices (the paper does not spell them out):

* **Denominator.** Algorithm 1 prints ``|T_topk ∩ T| / |T|`` but its figures are "compositions of the
  top-k tokens" (Fig. 2/4: the hit share of the top-k list, Fig. 3/5: ✓/✗ per top-20 token), so the
  reported ``ratio`` divides by ``k``. The literal reading, the share of the input's distinct tokens found
  among the top ``k`` (``|TopK ∩ T| / |T|``), is reported too as ``input_recall``.
* ``T`` is the set of the text's token ids without special tokens ([CLS], [SEP], [PAD], ...), and special
  tokens are removed from the ranking too, so they can be neither hits nor slots. Texts whose ``T`` is
  empty are skipped (counted in ``skipped``).
* Stopwords are kept by default, as the paper's examples (Fig. 3/5) rank words such as "the"; with
  ``exclude_stopwords=True`` the tokens of English stopwords (bm25s' list, the one our BM25 uses) are
  removed from both ``T`` and the ranking. ``exclude_ids`` removes any other tokens the same way, e.g. the 500
  most frequent tokens of the corpus (:func:`frequent_token_ids`), so that coverage is not won by ranking
  ubiquitous tokens.
* ``per_text`` keeps each text's hit share per ``k`` (a confidence interval over passages needs them).
* Texts are truncated to ``max_len`` tokens (default 144, the MS MARCO passage length of the papers'
  pre-training) — ``T`` is what the encoder saw.
* A checkpoint without an MLM head (e.g. all-MiniLM-L6-v2) gets the freshly created, embedding-tied
  head of :class:`pretrieve.modeling.Encoder`; its transform is random, so its coverage is a baseline of
  the tied embeddings, not of a trained head — ``head_created`` says so and the CLI prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_path
from pretrieve.retrieval.bm25 import import_bm25s

DEFAULT_KS = (10, 20, 50, 100)


@dataclass
class CoverageReport:
    """Coverage ratio per k, plus per-text top tokens with hit/miss marks for inspection."""

    model: str
    ks: tuple[int, ...]
    ratio: dict[int, float]
    num_texts: int
    input_recall: dict[int, float] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)
    head_created: bool = False
    skipped: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    per_text: dict[int, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"model": self.model, "num_texts": self.num_texts, "skipped": self.skipped,
                "head_created": self.head_created, "settings": self.settings,
                "coverage": {str(k): v for k, v in self.ratio.items()},
                "input_recall": {str(k): v for k, v in self.input_recall.items()},
                "per_text": {str(k): v for k, v in self.per_text.items()},
                "examples": self.examples}


# ---------------------------------------------------------------------- loading
def load_encoder(name_or_path: str | Path):
    """``(Encoder, head_created)`` for a checkpoint path or offline alias."""
    from pretrieve.modeling import Encoder  # lazy: transformers

    encoder = Encoder.from_pretrained(name_or_path)
    return encoder, encoder.head_created


# ---------------------------------------------------------------------- computation
def excluded_token_mask(tokenizer, exclude_stopwords: bool, exclude_ids: Sequence[int] = ()) -> torch.Tensor:
    """BoolTensor[V]: tokens that are neither counted in T nor ranked (specials, optionally stopwords and
    ``exclude_ids``)."""
    mask = torch.zeros(len(tokenizer), dtype=torch.bool)
    mask[torch.tensor(tokenizer.all_special_ids, dtype=torch.long)] = True
    if exclude_stopwords:
        mask[torch.tensor(stopword_ids(tokenizer), dtype=torch.long)] = True
    if len(exclude_ids):
        mask[torch.tensor(list(exclude_ids), dtype=torch.long)] = True
    return mask


def frequent_token_ids(tokenizer, texts: Iterable[str], n: int = 500, batch_size: int = 1000) -> list[int]:
    """The ``n`` most frequent non-special token ids of ``texts`` (ties: smaller id first), as the tokenizer
    splits them without truncation."""
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    special = set(tokenizer.all_special_ids)
    batch: list[str] = []
    for text in [*texts, None]:
        if text is not None:
            batch.append(text)
        if batch and (text is None or len(batch) == batch_size):
            for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
                np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
            batch = []
    counts[list(special)] = 0
    order = np.lexsort((np.arange(len(counts)), -counts))
    return [int(i) for i in order[:n] if counts[i] > 0]


def stopword_ids(tokenizer) -> list[int]:
    """Vocabulary ids of the English stopwords (bm25s ``STOPWORDS_EN``) that are single tokens."""
    STOPWORDS_EN = import_bm25s().stopwords.STOPWORDS_EN  # without JAX

    vocab = tokenizer.get_vocab()
    return sorted({vocab[word] for word in STOPWORDS_EN if word in vocab})


def _check_ks(ks: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 or k > vocab_size for k in ks):
        raise InputError(f"every k must be in [1, {vocab_size}], got {list(ks)}", field="ks")
    return tuple(sorted(set(ks)))


@torch.inference_mode()
def token_coverage(encoder, tokenizer, texts: Sequence[str], ks: Sequence[int] = DEFAULT_KS,
                   max_len: int = 144, batch_size: int = 32, exclude_stopwords: bool = False,
                   num_examples: int = 3, show_top: int = 20, name: str | None = None,
                   head_created: bool | None = None, exclude_ids: Sequence[int] = ()) -> CoverageReport:
    """Compute the coverage ratio of ``encoder`` (a :class:`pretrieve.modeling.Encoder`) over ``texts``.

    ``examples`` holds the top-``show_top`` tokens (✓ hit / ✗ miss) of the first ``num_examples`` texts.
    """
    if not texts:
        raise InputError("no texts to analyse", field="texts")
    ks = _check_ks(ks, encoder.vocab_size)
    was_training = encoder.training
    encoder.eval()
    excluded = excluded_token_mask(tokenizer, exclude_stopwords, exclude_ids)
    max_k = max(max(ks), show_top)
    hits = {k: [] for k in ks}
    recall = {k: [] for k in ks}
    examples: list[dict] = []
    skipped = 0
    try:
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start:start + batch_size])
            batch = tokenizer(chunk, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
            out = encoder(batch["input_ids"], batch["attention_mask"])
            logits = encoder.mlm_logits(out.cls).float()
            vocab = logits.shape[-1]
            logits[:, excluded[:vocab]] = float("-inf")
            top = logits.topk(max_k, dim=-1).indices
            present = input_token_sets(batch["input_ids"], batch["attention_mask"], excluded, vocab)
            is_hit = present.gather(1, top)
            sizes = present.sum(dim=1)
            for row in range(len(chunk)):
                if int(sizes[row]) == 0:
                    skipped += 1
                    continue
                for k in ks:
                    found = int(is_hit[row, :k].sum())
                    hits[k].append(found / k)
                    recall[k].append(found / int(sizes[row]))
                if len(examples) < num_examples:
                    tokens = tokenizer.convert_ids_to_tokens(top[row, :show_top].tolist())
                    examples.append({"text": chunk[row][:300], "top_tokens": [
                        {"token": t, "hit": bool(h)} for t, h in zip(tokens, is_hit[row, :show_top].tolist())]})
    finally:
        encoder.train(was_training)
    if skipped == len(texts):
        raise InputError("no text has a non-special token to cover", field="texts")
    if head_created is None:
        head_created = bool(getattr(encoder, "head_created", False))
    return CoverageReport(
        model=name or str(getattr(encoder.config, "_name_or_path", "")), ks=ks,
        ratio={k: float(np.mean(v)) for k, v in hits.items()},
        input_recall={k: float(np.mean(v)) for k, v in recall.items()},
        num_texts=len(texts) - skipped, examples=examples, head_created=head_created, skipped=skipped,
        settings={"max_len": max_len, "exclude_stopwords": exclude_stopwords, "excluded_ids": len(exclude_ids),
                  "show_top": show_top}, per_text=hits)


def input_token_sets(input_ids: torch.Tensor, attention_mask: torch.Tensor, excluded: torch.Tensor,
                     vocab_size: int) -> torch.Tensor:
    """BoolTensor[B, V]: which vocabulary entries occur in each text (excluded tokens and padding never)."""
    batch = input_ids.shape[0]
    present = torch.zeros(batch, vocab_size + 1, dtype=torch.bool)   # column V collects padding
    ids = input_ids.masked_fill(attention_mask == 0, vocab_size)
    present.scatter_(1, ids, True)
    present = present[:, :vocab_size]
    present[:, excluded[:vocab_size]] = False
    return present


# ---------------------------------------------------------------------- presentation
def format_examples(report: CoverageReport, width: int = 120) -> str:
    """Top tokens of a few texts, hits marked ✓ and misses ✗ (Drop your Decoder, Ma et al. 2024, Fig. 3/5)."""
    lines = []
    for example in report.examples:
        lines.append(f"text: {example['text'][:width]}")
        lines.append("  " + " ".join(f"{t['token']}{'✓' if t['hit'] else '✗'}" for t in example["top_tokens"]))
    return "\n".join(lines)


def plot_coverage(reports: dict[str, CoverageReport], path: str | Path, recall: bool = False) -> None:
    """Coverage ratio (or ``input_recall``) vs k, one line per checkpoint (PNG)."""
    # only when plotting; the object API, no pyplot: the caller's backend is left alone
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib
    from matplotlib.figure import Figure  # lazy: matplotlib

    fig = Figure(figsize=(5, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    all_ks: set[int] = set()
    for name, report in reports.items():
        values = report.input_recall if recall else report.ratio
        ks = sorted(values)
        all_ks.update(ks)
        label = f"{name} (new head)" if report.head_created else name
        ax.plot(ks, [values[k] for k in ks], marker="o", label=label)
    ax.set_xlabel("top-k tokens of CLS·Eᵀ")
    ax.set_ylabel("share of input tokens among top-k" if recall else "input token coverage ratio (hits / k)")
    ax.set_xscale("log")
    if all_ks:
        ax.set_xticks(sorted(all_ks))
        ax.set_xticklabels([str(k) for k in sorted(all_ks)])
        ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()

    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")
