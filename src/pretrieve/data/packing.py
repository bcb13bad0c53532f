"""Packing pre-training text: consecutive sentences of a document joined into examples of up to ``max_len`` tokens.

The retrieval-oriented pre-training papers do not train on one sentence per example: RetroMAE's
``examples/pretrain/preprocess.py`` (Xiao et al., 2022, "RetroMAE: Pre-Training Retrieval-oriented Language Models
Via Masked Auto-Encoder"; also DupMAE's and CDMAE's warm start) and bowdpr's ``prepare_pretrain_data.py`` (Ma et
al., 2024, "Drop your Decoder") split each Wikipedia article into sentences, tokenize them, and concatenate
consecutive sentences until a block reaches its target length; BookCorpus, whose rows are single sentences of
consecutive books without book boundaries, is packed row after row. Unpacked, 86 % of a Wikipedia + BookCorpus
epoch are one-sentence examples padded to 512 tokens.

The rule here (:class:`Packer`, used by :class:`pretrieve.data.pretrain_text.TokenizedCorpus` when ``pack`` is on):

* **Sentences** of each document by :func:`split_sentences` — BlingFire's sentence breaker (Microsoft's ``blingfire``
  package: its finite-state model ships inside the wheel, so it works offline; ~12 MB/s per core here, which keeps
  an English Wikipedia dump within hours). The authors used NLTK's Punkt, whose model is a separate data download
  (``nltk.download('punkt')``), which pretrieve cannot do at run time; pysbd (rule-based, offline) is pure Python and
  far slower. Both BlingFire and Punkt break at ``.``/``!``/``?`` but not after abbreviations such as "Dr." or
  "e.g.".
* **Target length.** The budget is ``max_len − 2`` (room for ``[CLS]``/``[SEP]``). Each new block draws its target:
  with probability ``short_seq_prob`` a length uniform in ``[3, budget]`` (RetroMAE's ``random.randint(3,
  target_length)``; bowdpr draws from ``[2, maxlen]``), else the whole budget. RetroMAE's script defaults to 0 and its
  README passes none; bowdpr's pre-training data uses 0.15 (see each recipe).
* **Whole sentences.** A sentence is added while the block plus it fits the target; otherwise the block is
  closed and the sentence starts the next one. (The authors close a block only once it has *reached* its target,
  so its last sentence overflows and the collator truncates it — the overflowing part is never trained on. Here no
  token is lost.) A sentence longer than the budget is cut into budget-sized pieces, the last piece starting the
  next block.
* **Documents.** A block never spans two documents, unless the source is named in ``pack_across`` (BookCorpus: its
  rows are sentences of one long stream; RetroMAE packs them across rows). Even then a run ends at an empty
  document (a blank line of a plain-text file: BERT's one-sentence-per-line format with blank lines between
  documents) and at a part boundary of the build (every 2^20 rows of a dataset, every 256 MB of a file;
  RetroMAE's ends every 1,000 rows, the ``map`` batch).
* **Determinism.** The target draws are a counter-based hash of the document's text and the block's number within
  it (:func:`uniform`): the same corpus packs to the same examples whatever the number of build processes, on any
  machine, and the training loop's seeded order over the cached examples then resumes a killed run to the same
  stream as any other corpus (:mod:`pretrieve.train.loop`).

Packing streams document by document; only the open block is held, so memory stays flat on any corpus.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.metadata import version
from typing import Iterable

#: The shortest target a short block may draw (RetroMAE's ``random.randint(3, target_length)``).
SHORTEST_TARGET = 3
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Packing:
    """How a corpus is packed: ``short_seq_prob`` and the sources whose documents flow into one another."""

    short_seq_prob: float = 0.0
    across: tuple[str, ...] = ()

    def settings(self) -> dict:
        """What makes a packed cache current (recorded in its ``meta.json``)."""
        return {"short_seq_prob": self.short_seq_prob, "across": list(self.across),
                "splitter": splitter_version()}


def splitter_version() -> str:
    """The sentence splitter and its version (a new model may split differently, so the cache depends on it)."""
    return f"blingfire-{version('blingfire')}"


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` by BlingFire's sentence breaker (see the module docstring); blanks dropped."""
    import blingfire  # lazy: blingfire — loads its native library and model, only when packing

    return [sentence for sentence in blingfire.text_to_sentences(text).split("\n") if sentence.strip()]


def document_key(text: str) -> int:
    """A 64-bit key of a document's text: the seed of its blocks' target draws."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def uniform(key: int, counter: int) -> float:
    """A uniform draw in [0, 1) from ``(key, counter)`` (SplitMix64's finaliser: counter-based, no state)."""
    z = (key + (counter + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class Packer:
    """Packs the tokenized sentences of consecutive documents into blocks of at most ``budget`` ids (the module
    docstring's rule); ``across`` lets a block continue into the next document."""

    def __init__(self, budget: int, short_seq_prob: float = 0.0, across: bool = False):
        if budget < SHORTEST_TARGET:
            raise ValueError(f"budget must be at least {SHORTEST_TARGET}, got {budget}")
        self.budget, self.short_seq_prob, self.across = budget, short_seq_prob, across
        self.block: list[int] = []
        self.target = 0
        self._key = 0
        self._draws = 0

    def _new_target(self) -> int:
        first, second = uniform(self._key, 2 * self._draws), uniform(self._key, 2 * self._draws + 1)
        self._draws += 1
        if first >= self.short_seq_prob:     # the authors: random.random() > short_seq_prob → the full length
            return self.budget
        return SHORTEST_TARGET + int(second * (self.budget - SHORTEST_TARGET + 1))

    def _close(self, out: list[list[int]]) -> None:
        if self.block:
            out.append(self.block)
        self.block, self.target = [], 0

    def add_document(self, sentences: Iterable[list[int]], key: int) -> list[list[int]]:
        """The blocks completed by one more document (its sentences' token ids); ``key`` seeds its draws. An empty
        document ends the open block even when packing across documents."""
        out: list[list[int]] = []
        self._key, self._draws = key, 0
        empty = True
        for sentence in sentences:
            if not sentence:
                continue
            empty = False
            if self.block and len(self.block) + len(sentence) > self.target:
                self._close(out)
            if not self.block:
                self.target = self._new_target()
            while len(sentence) > self.budget:     # longer than any block: budget-sized pieces
                self._close(out)
                out.append(list(sentence[:self.budget]))
                sentence = sentence[self.budget:]
                self.target = self._new_target()
            self.block.extend(sentence)
        if empty or not self.across:
            self._close(out)
        return out

    def finish(self) -> list[list[int]]:
        """The open block, if any (at the end of a part)."""
        out: list[list[int]] = []
        self._close(out)
        return out
