"""Which tokens a masker picks: the share of stopwords and punctuation among masked tokens and the most
often masked terms, for random vs importance-aware masking on the same corpus (CDMAE (Li et al. 2023) Fig. 2, §3.2:
"40 % of the masked tokens produced by the 15 % ratio random masking method in BERT pre-training are
stop-words or punctuation").

Choices:

* Both maskers see exactly the same batches (the pre-training chunks, ``[CLS] chunk [SEP]``) and mask the same
  number of tokens per text (the shared budget rule of :class:`~pretrieve.masking.RandomMasker`); only the
  choice of tokens differs. Default ratio 0.15 and token-level selection, the setting of the paper's
  statement (BERT's masking); :func:`compare_maskers` takes any ratio (CDMAE's decoder uses 0.5).
* A masked token counts as a **stopword** when it is a whole-word token (not a ``##`` continuation) whose
  text is in NLTK's 179-word English list (``bm25s.stopwords.STOPWORDS_EN_PLUS``), and as **punctuation**
  when every character is ASCII punctuation or a Unicode punctuation character. "Selected for
  prediction" is what counts (the 80/10/10 corruption does not matter).
* Two "top terms" lists: ``top_terms`` counts masked *tokens* (sub-word pieces included — with sub-word PMI
  statistics the pieces of rare split words rank high), ``top_words`` counts whole words all of whose
  tokens were masked, written back as text (``lymph``, not ``l ##ym ##ph``).
"""

from __future__ import annotations

import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pretrieve.errors import InputError
from pretrieve.masking import RandomMasker, VocabInfo, word_ids
from pretrieve.masking.pmi import ImportanceMasker
from pretrieve.retrieval.bm25 import import_bm25s


@dataclass
class MaskedTermStats:
    """What one masker masked over a corpus."""

    masker: str
    masked_tokens: int
    stopword_share: float
    punctuation_share: float
    top_terms: list[tuple[str, int, float]] = field(default_factory=list)  # (token, count, share of masked)
    top_words: list[tuple[str, int, float]] = field(default_factory=list)  # fully masked words (word, count, share)

    @property
    def uninformative_share(self) -> float:
        """Stopwords or punctuation (the two classes are disjoint)."""
        return self.stopword_share + self.punctuation_share

    def to_dict(self) -> dict[str, Any]:
        return {"masker": self.masker, "masked_tokens": self.masked_tokens, "stopword_share": self.stopword_share,
                "punctuation_share": self.punctuation_share, "uninformative_share": self.uninformative_share,
                "top_terms": [{"term": t, "count": c, "share": s} for t, c, s in self.top_terms],
                "top_words": [{"word": t, "count": c, "share": s} for t, c, s in self.top_words]}


def token_classes(tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """Boolean ``[V]`` arrays ``(is_stopword, is_punctuation)`` over the tokenizer's ids (see module docstring)."""
    STOPWORDS_EN_PLUS = import_bm25s().stopwords.STOPWORDS_EN_PLUS  # without JAX

    stopwords = {word.lower() for word in STOPWORDS_EN_PLUS}
    size = len(tokenizer)
    is_stopword = np.zeros(size, dtype=bool)
    is_punctuation = np.zeros(size, dtype=bool)
    special = set(getattr(tokenizer, "all_special_ids", []))
    for token, index in tokenizer.get_vocab().items():
        if index >= size or index in special or token.startswith("##"):
            continue
        text = token.lstrip("Ġ▁")
        if text.lower() in stopwords:
            is_stopword[index] = True
        elif text and all(ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in text):
            is_punctuation[index] = True
    return is_stopword, is_punctuation


def masked_term_statistics(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], maskers: Mapping[str, Any],
                           tokenizer: Any, *, seed: int = 0, top_k: int = 10) -> dict[str, MaskedTermStats]:
    """Apply every masker to every ``(input_ids, attention_mask)`` batch and summarise what it masked."""
    info = VocabInfo.from_tokenizer(tokenizer)
    is_stopword, is_punctuation = token_classes(tokenizer)
    size = len(tokenizer)
    counts = {name: np.zeros(size, dtype=np.int64) for name in maskers}
    words: dict[str, Counter] = {name: Counter() for name in maskers}
    vocab = tokenizer.convert_ids_to_tokens(list(range(size)))
    generator = torch.Generator().manual_seed(seed)
    for ids, attention in batches:
        word_of = word_ids(ids, info, attention)
        for name, masker in maskers.items():
            selected = masker(ids, attention, generator=generator).mask
            counts[name] += np.bincount(ids[selected].numpy(), minlength=size)[:size]
            words[name].update(_fully_masked_words(ids, word_of, selected, vocab))
    result = {}
    for name, per_token in counts.items():
        total = int(per_token.sum())
        if total == 0:
            raise InputError(f"masker '{name}' masked no token (empty corpus?)")
        top = np.argsort(-per_token, kind="stable")[:top_k]
        n_words = max(sum(words[name].values()), 1)
        result[name] = MaskedTermStats(
            masker=name, masked_tokens=total,
            stopword_share=float(per_token[is_stopword].sum() / total),
            punctuation_share=float(per_token[is_punctuation].sum() / total),
            top_terms=[(vocab[i], int(per_token[i]), float(per_token[i] / total)) for i in top if per_token[i] > 0],
            top_words=[(w, c, c / n_words) for w, c in words[name].most_common(top_k)])
    return result


def _fully_masked_words(ids: torch.Tensor, word_of: torch.Tensor, selected: torch.Tensor,
                        vocab: list[str]) -> Iterator[str]:
    """The text of every word whose tokens were all selected (vectorised grouping, one string per word)."""
    batch, length = ids.shape
    slot = torch.where(word_of >= 0, word_of, length)
    unmasked = torch.zeros(batch, length + 1, dtype=torch.long)
    unmasked.scatter_add_(1, slot, (~selected & (word_of >= 0)).long())
    masked = torch.zeros(batch, length + 1, dtype=torch.long)
    masked.scatter_add_(1, slot, (selected & (word_of >= 0)).long())
    full = (masked > 0) & (unmasked == 0)
    keep = full.gather(1, slot) & (word_of >= 0)
    rows, cols = keep.nonzero(as_tuple=True)
    current, pieces = None, []
    for row, col in zip(rows.tolist(), cols.tolist()):
        key = (row, int(word_of[row, col]))
        if key != current and pieces:
            yield "".join(pieces)
            pieces = []
        current = key
        token = vocab[int(ids[row, col])]
        pieces.append(token[2:] if token.startswith("##") and pieces else token)
    if pieces:
        yield "".join(pieces)


def corpus_batches(corpus: Any, pad_id: int, batch_size: int = 128,
                   max_examples: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Padded ``(input_ids, attention_mask)`` batches of a tokenized corpus (``corpus[i]["input_ids"]``), in order."""
    count = len(corpus) if max_examples is None else min(len(corpus), max_examples)
    for start in range(0, count, batch_size):
        rows = [corpus[i]["input_ids"] for i in range(start, min(start + batch_size, count))]
        length = max(len(row) for row in rows)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = torch.as_tensor(row)
            attention[r, :len(row)] = 1
        yield ids, attention


def compare_maskers(corpus: Any, tokenizer: Any, statistics: Any, *, ratio: float = 0.15, sigma: float = 1.0,
                    whole_word: bool = False, batch_size: int = 128, max_examples: int | None = None,
                    seed: int = 0, top_k: int = 10) -> dict[str, MaskedTermStats]:
    """Random vs importance-aware (PMI) masking on the same batches of ``corpus`` (a ``TokenizedCorpus``).

    ``statistics``: the corpus' :class:`~pretrieve.masking.pmi.NgramStatistics` (e.g.
    :func:`pretrieve.masking.pmi.corpus_statistics`). Returns ``{"random": ..., "pmi": ...}``.
    """
    info = VocabInfo.from_tokenizer(tokenizer)
    maskers = {"random": RandomMasker(info, ratio, whole_word=whole_word),
               "pmi": ImportanceMasker(info, ratio, statistics, sigma=sigma, whole_word=whole_word)}
    batches = corpus_batches(corpus, info.pad_token_id, batch_size, max_examples)
    return masked_term_statistics(batches, maskers, tokenizer, seed=seed, top_k=top_k)


def format_comparison(stats: Mapping[str, MaskedTermStats]) -> str:
    """A markdown table of the shares and top terms of each masker."""
    lines = ["| masker | masked tokens | stopwords | punctuation | both | top masked tokens | top masked words |",
             "|---|---:|---:|---:|---:|---|---|"]
    for item in stats.values():
        terms = ", ".join(f"{t} ({s:.1%})" for t, _, s in item.top_terms)
        top_words = ", ".join(f"{t} ({s:.1%})" for t, _, s in item.top_words)
        lines.append(f"| {item.masker} | {item.masked_tokens} | {item.stopword_share:.1%} | "
                     f"{item.punctuation_share:.1%} | {item.uninformative_share:.1%} | {terms} | {top_words} |")
    return "\n".join(lines)
