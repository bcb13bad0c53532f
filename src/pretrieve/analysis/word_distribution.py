"""What CPDAE's MLP decoder reads out of a text's [CLS] vector (CPDAE, Ma et al. 2022, Table 4, §3.3).

For a text, the pre-trained encoder's [CLS] vector (unmasked input, eval mode) goes through the ``cpdae``
objective's MLP decoder; ``z̃ = σ(z) / Σσ(z)`` is the normalised word distribution of eq. 5. Following the
Table 4 caption, a *word*'s probability is the sum of ``z̃`` over its sub-word token ids ("sum up the
normalized output probabilities of all the subwords of a whole word"; an id repeated inside one word counts
once). The paper's claim (§3.3) is that the contrastive loss suppresses common words and highlights
informative ones; :func:`stopword_mass` measures it as the probability mass ``Σ_{v ∈ stopwords} z̃_v`` on the
stopword tokens (NLTK's 179 English stopwords that are single tokens of the vocabulary), averaged over
texts — compare a ``cpdae`` checkpoint with one trained with ``contrast: none`` using
:func:`compare_stopword_mass`.

Inputs are :class:`~pretrieve.modeling.pretrain_model.PretrainModel` objects or pre-training checkpoint
directories (``final/`` of ``pretrieve pretrain``: encoder + ``heads.safetensors`` + ``method.json``), which
must contain a ``cpdae`` objective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pretrieve.errors import ConfigError
from pretrieve.retrieval.bm25 import import_bm25s


@dataclass
class DecodedWords:
    """The decoded word distribution of one text, read at the text's own words and over the vocabulary."""

    text: str
    words: list[tuple[str, float]]  # every word of the text, in order, with Σ z̃ over its sub-words
    top_words: list[tuple[str, float]]  # the text's distinct words ranked by probability
    top_tokens: list[tuple[str, float]]  # the most probable vocabulary tokens overall
    stopword_mass: float
    text_mass: float = field(default=0.0)  # Σ z̃ over the distinct token ids of the text

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "words": self.words, "top_words": self.top_words, "top_tokens": self.top_tokens,
                "stopword_mass": self.stopword_mass, "text_mass": self.text_mass}

    def render(self) -> str:
        """The text with each word's probability, ``word(0.0312)`` — the content of Table 4 in plain text."""
        return " ".join(f"{word}({prob:.3g})" for word, prob in self.words)


def as_pretrain_model(model: Any) -> Any:
    """A :class:`PretrainModel` from a model or a checkpoint directory, in eval mode."""
    from pretrieve.modeling.pretrain_model import PretrainModel  # lazy: transformers

    if isinstance(model, (str, Path)):
        model = PretrainModel.load(model)
    if not isinstance(model, PretrainModel):
        raise ConfigError(f"expected a PretrainModel or a checkpoint directory, got {type(model).__name__}")
    return model.eval()


def cpdae_objective(model: Any) -> Any:
    """The model's ``cpdae`` objective (the MLP decoder)."""
    if "cpdae" not in model.objectives:
        raise ConfigError(f"the checkpoint has no 'cpdae' objective (objectives: {', '.join(model.objectives)}); "
                          "the decoded word distribution needs CPDAE's MLP decoder")
    return model.objectives["cpdae"]


@torch.inference_mode()
def decoded_distributions(model: Any, tokenizer: Any, texts: Sequence[str], *, max_len: int = 512,
                          batch_size: int = 32) -> torch.Tensor:
    """``z̃`` for each text (FloatTensor[N, V]) from the unmasked text's [CLS] vector."""
    from pretrieve.modeling.objectives.cpdae import word_distribution  # lazy: transformers

    model = as_pretrain_model(model)
    objective = cpdae_objective(model)
    device = next(model.parameters()).device
    rows = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(list(texts[start:start + batch_size]), truncation=True, max_length=max_len,
                            padding=True, return_tensors="pt")
        out = model.encoder(encoded["input_ids"].to(device), encoded["attention_mask"].to(device))
        rows.append(word_distribution(objective.decode(out.cls)).float().cpu())
    return torch.cat(rows) if rows else torch.zeros(0, model.encoder.vocab_size)


def stopword_token_ids(tokenizer: Any) -> torch.Tensor:
    """Ids of the NLTK English stopwords that are single tokens of the vocabulary."""
    STOPWORDS_EN_PLUS = import_bm25s().stopwords.STOPWORDS_EN_PLUS  # without JAX

    vocab = tokenizer.get_vocab()
    return torch.tensor(sorted({vocab[w] for w in STOPWORDS_EN_PLUS if w in vocab}), dtype=torch.long)


def decode_words(model: Any, tokenizer: Any, texts: Sequence[str], *, top_k: int = 10,
                 max_len: int = 512) -> list[DecodedWords]:
    """Table 4 for each text: its words with their decoded probabilities, plus the top tokens overall."""
    model = as_pretrain_model(model)
    distributions = decoded_distributions(model, tokenizer, texts, max_len=max_len)
    stop_ids = stopword_token_ids(tokenizer)
    results = []
    for text, probs in zip(texts, distributions):
        encoding = tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_len)
        words = _word_probabilities(text, encoding, probs)
        ranked: dict[str, float] = {}
        for word, prob in words:
            ranked[word.lower()] = max(prob, ranked.get(word.lower(), 0.0))
        top = torch.topk(probs, min(top_k, probs.numel()))
        results.append(DecodedWords(
            text=text, words=words,
            top_words=sorted(ranked.items(), key=lambda item: -item[1])[:top_k],
            top_tokens=[(tokenizer.convert_ids_to_tokens(int(i)), float(p)) for p, i in zip(top.values, top.indices)],
            stopword_mass=float(probs[stop_ids].sum()) if stop_ids.numel() else 0.0,
            text_mass=float(probs[torch.tensor(sorted(set(encoding["input_ids"])), dtype=torch.long)].sum())
            if encoding["input_ids"] else 0.0))
    return results


def _word_probabilities(text: str, encoding: Any, probs: torch.Tensor) -> list[tuple[str, float]]:
    """Each word of ``text`` (the tokenizer's pre-tokenisation) with Σ z̃ over its distinct sub-word ids."""
    ids = encoding["input_ids"]
    groups: dict[int, list[int]] = {}
    order: list[int] = []
    for position, word in enumerate(encoding.word_ids()):
        if word is None:
            continue
        if word not in groups:
            groups[word] = []
            order.append(word)
        groups[word].append(ids[position])
    words = []
    for word in order:
        span = encoding.word_to_chars(word)
        surface = text[span.start:span.end] if span is not None else "".join(map(str, groups[word]))
        distinct = torch.tensor(sorted(set(groups[word])), dtype=torch.long)
        words.append((surface, float(probs[distinct].sum())))
    return words


def stopword_mass(model: Any, tokenizer: Any, texts: Sequence[str], *, max_len: int = 512) -> float:
    """Mean over ``texts`` of the decoded probability mass on stopword tokens."""
    distributions = decoded_distributions(model, tokenizer, texts, max_len=max_len)
    stop_ids = stopword_token_ids(tokenizer)
    if distributions.shape[0] == 0:
        raise ConfigError("stopword_mass needs at least one text")
    return float(distributions[:, stop_ids].sum(dim=1).mean())


def compare_stopword_mass(models: Mapping[str, Any], tokenizer: Any, texts: Sequence[str], *,
                          max_len: int = 512) -> dict[str, float]:
    """:func:`stopword_mass` of several checkpoints (e.g. ``{"cpdae": ..., "w/o CL": ...}``) on the same texts."""
    return {name: stopword_mass(model, tokenizer, texts, max_len=max_len) for name, model in models.items()}
