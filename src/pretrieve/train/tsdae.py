"""TSDAE as a pre-training arm: sentence-transformers' ``DenoisingAutoEncoderLoss`` on the arms' corpus and loop.

TSDAE (Wang, Reimers & Gurevych, Findings of EMNLP 2021) encodes a damaged text into one sentence vector and
decodes the original text from that vector alone: a transformer decoder (a causal copy of the encoder whose
cross-attention sees only the sentence vector) predicts the original tokens left to right. It is the practitioner's
unsupervised domain-adaptation recipe that the issue uses as an external anchor (GPL's table: SciFact 57.1
zero-shot, 60.0 after MLM, 62.8 after TSDAE). The loss, the decoder and the tying are sentence-transformers' own
(:class:`sentence_transformers.sentence_transformer.losses.DenoisingAutoEncoderLoss`), with the paper's settings:

* **tied encoder and decoder** (``tie_encoder_decoder=True``): the decoder is ``AutoModelForCausalLM`` loaded from
  the starting checkpoint (its MLM head becomes the LM head), every encoder weight is shared with it, and only the
  decoder's cross-attention is new;
* **pooling**: the method's ``bottleneck`` — ``cls`` (TSDAE's choice, the preset) or ``mean`` (a mean-pooled
  retriever such as all-MiniLM-L6-v2);
* **noise**: deletion of each word with probability 0.6 (TSDAE's best noise and ratio), at least one word kept.

What differs from sentence-transformers' example, and why:

* **Deletion without NLTK data.** Its ``DenoisingAutoEncoderDataset`` splits words with ``nltk.word_tokenize`` and
  re-joins them with NLTK's detokenizer; NLTK's data cannot be downloaded here. :func:`delete_words` deletes
  whole words of the already tokenized text instead: a word is a run of WordPiece tokens (a token and its ``##``
  continuations; byte-level BPE and SentencePiece word starts likewise, :mod:`pretrieve.masking.vocab`). BERT's
  pre-tokenizer, like ``word_tokenize``, splits on whitespace and makes every punctuation mark a word of its own, so
  the unit deleted is the same up to NLTK's clitics ("do" + "n't": BERT's three words "don", "'", "t" are deleted
  independently). Deleting ids rather than text skips a decode / re-tokenize round trip, so the clean target is
  exactly the token chunk every other arm trains on.
* **The data and the loop are pretrieve's**, not ``SentenceTransformerTrainer``: the same token chunks of the
  pre-training corpus (``TokenizedCorpus``: ``[CLS] chunk [SEP]`` of ``max_len``), the same order, steps, batch,
  lr schedule, precision, seed, checkpoints and resume as every other arm (:mod:`pretrieve.train.loop`); the
  deletion draws from the loop's per-micro-batch generator, so a run is a function of its seed.

Export (:meth:`TsdaeModel.save`; a checkpoint of the run is exported the same way through
:func:`load_checkpoint`, for the probes of intermediate steps): the trained body with the decoder's LM
head (initialised from the checkpoint's MLM head, trained as TSDAE's output layer, tied to the shared word
embeddings) as a standard ``*ForMaskedLM`` checkpoint — it loads with ``AutoModel`` / ``AutoModelForMaskedLM`` and
fine-tunes like any other pre-trained checkpoint — plus ``method.json``; the decoder's cross-attention is TSDAE's
training head and is not exported.

This module holds the TSDAE-specific parts only, as a trainer of :data:`pretrieve.train.method.TRAINERS`
(:func:`build`: the model and its collator; :func:`load_checkpoint`); the run itself (lock, reuse of a finished
run, tokenized corpus, loop, export of the tokenizer and config) is the pre-training entry point's, which hands a
method with ``trainer: tsdae`` to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForMaskedLM

from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json
from pretrieve.masking.vocab import VocabInfo
from pretrieve.modeling.pretrain_model import METHOD_FILE  # the resolved method, beside the exported encoder
from pretrieve.models import no_remote_code
from pretrieve.train.method import MethodConfig

DELETION_RATIO = 0.6
"""TSDAE's deletion probability per word (Wang et al. 2021: deletion at 0.6 was the best noise)."""


def delete_words(ids: list[int], continuation: Tensor, ratio: float, generator: torch.Generator | None) -> list[int]:
    """``[first, kept words…, last]``: each whole word of ``ids[1:-1]`` deleted with probability ``ratio`` (TSDAE's
    ``rand > ratio`` keeps a word), one random word kept when every word was drawn for deletion.

    ``ids`` is ``[CLS] tokens [SEP]``; ``continuation[id]`` says whether a token continues the previous word.
    """
    body = ids[1:-1]
    starts = [i for i, token in enumerate(body) if i == 0 or not bool(continuation[token])]
    if not starts:
        return list(ids)
    words = [body[start:end] for start, end in zip(starts, starts[1:] + [len(body)])]
    keep = torch.rand(len(words), generator=generator) > ratio
    if not bool(keep.any()):
        keep[int(torch.randint(len(words), (1,), generator=generator))] = True
    return [ids[0], *(token for word, kept in zip(words, keep.tolist()) if kept for token in word), ids[-1]]


class DeletionNoiseCollator:
    """Token chunks → ``input_ids`` / ``attention_mask`` of the damaged texts (encoder input) and ``target_input_ids``
    / ``target_attention_mask`` of the original ones (decoder target), right-padded."""

    def __init__(self, tokenizer: Any, ratio: float = DELETION_RATIO):
        if not 0 <= ratio < 1:
            raise ConfigError(f"TSDAE deletion ratio must be in [0, 1), got {ratio}")
        self.continuation = VocabInfo.from_tokenizer(tokenizer).is_continuation
        self.pad_id = int(tokenizer.pad_token_id)
        self.ratio = ratio

    def __call__(self, examples: list[dict[str, list[int]]], generator: torch.Generator | None = None) -> dict[str, Tensor]:
        targets = [list(example["input_ids"]) for example in examples]
        sources = [delete_words(ids, self.continuation, self.ratio, generator) for ids in targets]
        source_ids, source_mask = self._padded(sources)
        target_ids, target_mask = self._padded(targets)
        return {"input_ids": source_ids, "attention_mask": source_mask,
                "target_input_ids": target_ids, "target_attention_mask": target_mask}

    def _padded(self, rows: list[list[int]]) -> tuple[Tensor, Tensor]:
        length = max(len(row) for row in rows)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        return ids, mask


class TsdaeModel(nn.Module):
    """sentence-transformers' TSDAE loss around a (Transformer, Pooling) model; ``forward(batch) -> (loss, logs)``."""

    def __init__(self, model_path: str | Path, method: MethodConfig):
        super().__init__()
        self.model_path = str(model_path)
        self.method = method.to_dict()
        # no pooler: TSDAE reads the pooled token states, and an unused pooler would leave parameters without gradient
        safe = no_remote_code(self.model_path)   # trust_remote_code=False for the model, its config and its tokenizer
        transformer = Transformer(self.model_path, model_kwargs={"add_pooling_layer": False, **safe}, config_kwargs=safe,
                                  processor_kwargs=safe)
        pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=method.bottleneck)
        sentence_model = SentenceTransformer(modules=[transformer, pooling], device="cpu")
        self.loss = DenoisingAutoEncoderLoss(sentence_model, tie_encoder_decoder=True)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        target = {"input_ids": batch["target_input_ids"], "attention_mask": batch["target_attention_mask"]}
        loss = self.loss([source, target], None)
        return loss, {"loss": loss.detach()}

    def may_leave_parameters_unused(self) -> bool:
        """Every parameter (tied body, LM head, cross-attention) gets a gradient on every step (DDP need not search)."""
        return False

    def save(self, directory: str | Path) -> Path:
        """Write the trained body + LM head as a ``*ForMaskedLM`` checkpoint and ``method.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        masked_lm = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(self.model_path,
                                                                                  **no_remote_code(self.model_path)))
        state = {key: value for key, value in self.loss.decoder.state_dict().items() if ".crossattention." not in key}
        masked_lm.load_state_dict(state, strict=True)
        masked_lm.save_pretrained(str(directory), safe_serialization=True)
        write_json(directory / METHOD_FILE, self.method)
        return directory


def build(model_path: str | Path, method: MethodConfig, tokenizer: Any) -> tuple[TsdaeModel, DeletionNoiseCollator]:
    """The model and collator of a ``trainer: tsdae`` method, for the pre-training loop (seed the RNG first: the
    decoder's cross-attention is initialised here)."""
    if method.trainer != "tsdae":
        raise ConfigError(f"method '{method.name}' is not a TSDAE method (trainer: {method.trainer})")
    return TsdaeModel(model_path, method), DeletionNoiseCollator(tokenizer)


def load_checkpoint(final: str | Path, method: MethodConfig, weights: str | Path) -> TsdaeModel:
    """The model of a TSDAE run at one of its checkpoints: built as the run built it, from the run's export
    ``final`` and its ``method``, then given the checkpoint's ``weights`` (``checkpoints/step-<N>/
    model.safetensors``, the training state: each weight shared by encoder and decoder saved once). Every
    parameter must come from them (:class:`InputError` naming ``weights`` otherwise)."""
    model = TsdaeModel(final, method)
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    state = model.state_dict()
    loaded = {state[key].data_ptr() for key in state.keys() - set(missing)}
    unset = [key for key in missing if state[key].data_ptr() not in loaded]   # not tied to a loaded weight
    if unset or unexpected:
        raise InputError(f"the checkpoint does not fit the TSDAE run's model (missing {unset[:3]}, unexpected "
                         f"{list(unexpected)[:3]})", path=weights)
    return model
