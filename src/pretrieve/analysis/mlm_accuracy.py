"""Held-out masked-token accuracy of a checkpoint's MLM head (``pretrieve analyze mlm-accuracy``).

The claims benchmark's from-scratch base (docs/preregistration.md, section A) must first become a small "BERT": a
random L2-H128 model MLM-trained on the corpus. Its gate: a held-out MLM accuracy of at least 0.25, otherwise the
base is reported as too weak to inform. This module measures that accuracy on texts the model did not train on.

Evaluation masking (the usual way to score an MLM, not its training recipe): ``mask_ratio`` of each text's
non-special tokens — at least one — drawn without replacement by one seeded generator in text order (so the masks
do not depend on the batch size), **all** replaced by the tokenizer's mask token (the 80/10/10 corruption is a
training device). The head (:meth:`pretrieve.modeling.Encoder.mlm_logits`) scores each masked position; the
accuracy is the share of masked positions whose arg-max is the original token, pooled over texts (micro average),
beside the mean cross-entropy of the original tokens and its exponential.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pretrieve.errors import InputError

#: The from-scratch base's gate (docs/preregistration.md, section A).
GATE_ACCURACY = 0.25


@dataclass
class MlmAccuracy:
    """Masked-token accuracy, cross-entropy and perplexity over ``masked_tokens`` positions of ``num_texts`` texts."""

    model: str
    num_texts: int
    masked_tokens: int
    accuracy: float
    loss: float
    perplexity: float
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gate": {"accuracy_at_least": GATE_ACCURACY,
                                         "passed": bool(self.accuracy >= GATE_ACCURACY)}}


def evaluation_masks(candidates: Sequence[Sequence[int]], mask_ratio: float, seed: int) -> list[np.ndarray]:
    """Per text, the positions to mask: ``max(1, round(mask_ratio × |candidates|))`` of its candidate positions,
    drawn in text order by one generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    masks = []
    for positions in candidates:
        positions = np.asarray(positions, dtype=np.int64)
        count = min(len(positions), max(1, int(round(mask_ratio * len(positions))))) if len(positions) else 0
        masks.append(np.sort(rng.choice(positions, size=count, replace=False)) if count else positions[:0])
    return masks


@torch.inference_mode()
def mlm_accuracy(encoder, tokenizer, texts: Sequence[str], max_len: int = 144, mask_ratio: float = 0.15,
                 seed: int = 0, batch_size: int = 32, name: str | None = None) -> MlmAccuracy:
    """Held-out masked-token accuracy of ``encoder`` (a :class:`pretrieve.modeling.Encoder`) on ``texts``."""
    if not texts:
        raise InputError("no texts to evaluate", field="texts")
    if not 0.0 < mask_ratio <= 1.0:
        raise InputError(f"mask ratio must be in (0, 1], got {mask_ratio}", field="mask_ratio")
    if tokenizer.mask_token_id is None:
        raise InputError("the tokenizer has no mask token", field="tokenizer")
    encoded = tokenizer(list(texts), truncation=True, max_length=max_len)["input_ids"]
    special = set(tokenizer.all_special_ids)
    candidates = [[i for i, token in enumerate(ids) if token not in special] for ids in encoded]
    masks = evaluation_masks(candidates, mask_ratio, seed)
    if not any(len(m) for m in masks):
        raise InputError("no text has a non-special token to mask", field="texts")
    was_training = encoder.training
    encoder.eval()
    device = next(encoder.parameters()).device
    correct, total, loss_sum = 0, 0, 0.0
    try:
        for start in range(0, len(encoded), batch_size):
            ids = encoded[start:start + batch_size]
            width = max(len(x) for x in ids)
            input_ids = torch.full((len(ids), width), tokenizer.pad_token_id or 0, dtype=torch.long)
            attention = torch.zeros((len(ids), width), dtype=torch.long)
            rows, cols = [], []
            for row, (tokens, positions) in enumerate(zip(ids, masks[start:start + batch_size])):
                input_ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
                attention[row, :len(tokens)] = 1
                rows += [row] * len(positions)
                cols += positions.tolist()
            if not rows:
                continue
            rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
            targets = input_ids[rows_t, cols_t].clone()
            input_ids[rows_t, cols_t] = tokenizer.mask_token_id
            hidden = encoder(input_ids.to(device), attention.to(device)).last_hidden_state
            logits = encoder.mlm_logits(hidden[rows_t.to(device), cols_t.to(device)]).float()
            targets = targets.to(device)
            correct += int((logits.argmax(dim=-1) == targets).sum())
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            total += len(rows)
    finally:
        encoder.train(was_training)
    loss = loss_sum / total
    return MlmAccuracy(model=name or str(getattr(encoder.config, "_name_or_path", "")), num_texts=len(texts),
                       masked_tokens=total, accuracy=correct / total, loss=loss,
                       perplexity=math.exp(min(loss, 700.0)),
                       settings={"max_len": max_len, "mask_ratio": mask_ratio, "seed": seed,
                                 "masking": "evaluation: every chosen position replaced by the mask token"})
