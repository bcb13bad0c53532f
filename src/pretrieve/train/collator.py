"""Collation: pre-training texts → one padded, masked batch (:class:`PretrainCollator`), fine-tuning groups → a
dual-encoder batch (:class:`GroupCollator`; the cross-encoder's pairs:
:class:`pretrieve.train.reranker.PairGroupCollator`).

:class:`PretrainCollator` takes examples ``{"input_ids": [...]}`` (already tokenized with special tokens,
at most ``max_len`` ids) and returns a dict of tensors:

* always — ``input_ids`` (encoder-masked), ``attention_mask``, ``mlm_labels`` (original id at the
  encoder-masked positions, ``-100`` elsewhere);
* ``decoder`` — ``decoder_input_ids`` / ``decoder_labels``: the decoder masker applied to the *original*
  ids, independently of the encoder mask (auto-encoding decoder);
* ``original`` — ``original_input_ids`` (unmasked) and ``original_labels`` (the ids, ``-100`` at special
  tokens and padding: the targets of the auto-regressive and enhanced decoders);
* ``enhanced_mask`` — ``BoolTensor[B, L, L]``, RetroMAE's position-specific visibility
  (``pretrieve.masking.enhanced_decoding_mask``, keep ratio ``1 − decoder ratio``);
* ``bow_targets`` — ``LongTensor[B, K]``: the unique non-special ids of each original text, padded with
  ``-100`` (``K`` = the largest bag of the batch); the model gathers log-probabilities at these ids, so no
  dense ``[B, V]`` tensor is ever built in the data loader.
* ``second_view`` — ``view2_input_ids`` / ``view2_mlm_labels``: the *encoder* masker applied a second
  time to the original ids, independently of the first view (CPDAE's two masked versions of each text;
  the view shares ``attention_mask``).
* ``context`` — CoT-MAE/CoT-MoTE context spans, read from the examples' ``context_input_ids``
  (:mod:`pretrieve.data.spans`): ``context_input_ids`` / ``context_attention_mask`` / ``context_mlm_labels``
  (encoder-masked like the anchors), the decoder-side features the anchors get (``context_decoder_*`` when
  ``decoder`` is built, ``context_original_*`` when ``original`` is), and ``text_type`` /
  ``context_text_type`` (0 = query, 1 = passage; from the examples, passage when absent).

Importance-aware masking (masker kind ``pmi``, CDMAE): the masker needs the n-gram statistics of the
pre-training corpus. They come from the masker's ``statistics`` param when it is a path, else from the
``corpus`` given to the collator (the tokenized pre-training corpus; counted once and cached beside its
token cache, see :func:`pretrieve.masking.pmi.resolve_statistics`). With a ``pmi`` decoder masker the
``decoder`` feature masks the decoder input by Algorithm 1, and ``enhanced_mask`` makes each row of
RetroMAE's position-specific mask hide the most important tokens first
(:func:`pretrieve.masking.pmi.importance_enhanced_mask`).

Every step is a batched tensor operation (the only Python loop is over the B examples to copy their id
lists into the padded tensor). A feature is built by a function registered with :func:`register_feature`,
so a later objective that needs a second masked view, a context span or a text type adds one builder. Builders
that read other fields of the examples find them in ``collator.current_examples``.

Randomness and resuming: the collator owns a ``torch.Generator`` seeded with ``seed``; features consume it in
a fixed order, so the same seed and the same examples give the same batch. :meth:`state_dict` /
:meth:`load_state_dict` save and restore the generator, which resumes the masking stream exactly when
collation runs in the main process (``num_workers=0``; collation is cheap by design). In a DataLoader worker
the generator is reseeded once from ``(seed, worker id)`` so workers never repeat each other's masks
(reproducible run to run, but not resumable mid-epoch). Under DDP, pass a different ``seed`` per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from pretrieve.data.groups import TrainingGroup, sample_group_indices
from pretrieve.errors import ConfigError, InputError
from pretrieve.masking import VocabInfo, enhanced_decoding_mask, masker_kind
from pretrieve.masking.pmi import ImportanceMasker, NgramStatistics, importance_enhanced_mask, resolve_statistics
from pretrieve.train.method import ALWAYS_PRODUCED, MaskerSpec, MethodConfig

if TYPE_CHECKING:
    from pretrieve.data.arrow import CorpusTexts
    from pretrieve.data.beir import Corpus

IGNORE_INDEX = -100

FeatureBuilder = Callable[["PretrainCollator", Tensor, Tensor, torch.Generator], dict[str, Tensor]]
FEATURE_BUILDERS: dict[str, FeatureBuilder] = {}
"""Feature name → builder ``(collator, original_ids [B, L], attention_mask [B, L], generator) -> tensors``; builders run
in registration order (which fixes the order in which they consume the generator)."""


def register_feature(name: str) -> Callable[[FeatureBuilder], FeatureBuilder]:
    """Decorator: register the builder of batch feature ``name``."""
    def decorate(builder: FeatureBuilder) -> FeatureBuilder:
        if name in FEATURE_BUILDERS:
            raise ValueError(f"batch feature '{name}' already has a builder")
        FEATURE_BUILDERS[name] = builder
        return builder
    return decorate


def build_masker(spec: MaskerSpec, info: VocabInfo, statistics: NgramStatistics | None = None) -> Any:
    """The masker a :class:`MaskerSpec` describes, built by its kind's registered builder
    (:mod:`pretrieve.masking.registry`: ``wwm`` whole words, ``token`` single tokens, ``pmi`` importance-aware, which
    needs the corpus ``statistics``)."""
    return masker_kind(spec.kind).build(spec, info, statistics)


class PretrainCollator:
    """Pad, mask and build the required features of a pre-training batch (see the module docstring)."""

    def __init__(self, tokenizer: Any, method: MethodConfig, required: set[str] | None = None,
                 max_len: int = 512, seed: int = 0, pad_to_multiple_of: int | None = None, *,
                 corpus: Any = None):
        self.method = method.resolved()
        self.info = VocabInfo.from_tokenizer(tokenizer)
        required = set(self.method.required_features() if required is None else required)
        unknown = sorted(required - set(FEATURE_BUILDERS) - ALWAYS_PRODUCED)
        if unknown:
            raise ConfigError(f"the collator cannot build batch feature(s) {', '.join(unknown)}; "
                              f"known features: {', '.join(sorted(set(FEATURE_BUILDERS) | ALWAYS_PRODUCED))}")
        self.features = [name for name in FEATURE_BUILDERS if name in required]
        if max_len < 2:
            raise ConfigError(f"max_len must be ≥ 2, got {max_len}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of must be ≥ 1, got {pad_to_multiple_of}")
        self.max_len = int(max_len)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self._worker_id: int | None = None
        encoder_spec = self.method.encoder_masker
        decoder_spec = self.method.decoder_masker
        used = [spec for spec in (encoder_spec if encoder_spec.ratio > 0 else None, decoder_spec)
                if spec is not None and masker_kind(spec.kind).needs_statistics]
        statistics = self._statistics(tokenizer, corpus, used)
        self.encoder_masker = (build_masker(encoder_spec, self.info, statistics.get(id(encoder_spec)))
                               if encoder_spec.ratio > 0 else None)
        self.decoder_masker = (build_masker(decoder_spec, self.info, statistics.get(id(decoder_spec)))
                               if decoder_spec is not None else None)

    def _statistics(self, tokenizer: Any, corpus: Any, specs: list[MaskerSpec]) -> dict[int, NgramStatistics]:
        """PMI statistics of each ``pmi`` masker spec (keyed by ``id(spec)``), computed once per source."""
        found: dict[tuple[str, int], NgramStatistics] = {}
        result: dict[int, NgramStatistics] = {}
        for spec in specs:
            source = spec.params.get("statistics") or corpus
            if source is None:
                raise ConfigError(
                    "the pmi masker needs the n-gram statistics of the pre-training corpus: give the collator "
                    "the tokenized corpus (corpus=...) or set the masker's params.statistics to a statistics "
                    "directory or a text source")
            window = int(spec.params["window"])
            key = (str(source) if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__")
                   else f"object-{id(source)}", window)
            if key not in found:
                found[key] = resolve_statistics(source, window=window, vocab_size=self.info.vocab_size,
                                                tokenizer=tokenizer, max_len=self.max_len)
            result[id(spec)] = found[key]
        return result

    # ------------------------------------------------------------------ collation
    def __call__(self, examples: Sequence[Mapping[str, Any]],
                 generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Collate ``examples``; randomness from ``generator`` when given (the training loop passes one
        seeded per (seed, step, micro-batch)), else from the collator's own generator."""
        if generator is None:
            self._reseed_in_worker()
            generator = self.generator
        ids, attention = self.pad(examples)
        self.current_examples = examples
        batch: dict[str, Tensor] = {"attention_mask": attention}
        if self.encoder_masker is None:
            batch["input_ids"] = ids.clone()
            batch["mlm_labels"] = torch.full_like(ids, IGNORE_INDEX)
        else:
            masked = self.encoder_masker(ids, attention, generator=generator)
            batch["input_ids"] = masked.input_ids
            batch["mlm_labels"] = masked.labels
        for name in self.features:
            batch.update(FEATURE_BUILDERS[name](self, ids, attention, generator))
        return batch

    def pad(self, examples: Sequence[Mapping[str, Any]]) -> tuple[Tensor, Tensor]:
        """Right-pad the examples to the longest (optionally to a multiple) → ``(ids, attention_mask)``."""
        if not examples:
            raise InputError("cannot collate an empty list of examples", field="input_ids")
        rows = [self._row(example, index) for index, example in enumerate(examples)]
        longest = max(row.numel() for row in rows)
        length = longest
        if self.pad_to_multiple_of:
            multiple = self.pad_to_multiple_of
            length = min(-(-longest // multiple) * multiple, max(self.max_len, longest))
        ids = torch.full((len(rows), length), self.info.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        for index, row in enumerate(rows):
            ids[index, : row.numel()] = row
            attention[index, : row.numel()] = 1
        return ids, attention

    def _row(self, example: Mapping[str, Any], index: int) -> Tensor:
        if not isinstance(example, Mapping) or "input_ids" not in example:
            raise InputError(f"example {index} has no 'input_ids'", field="input_ids")
        row = torch.as_tensor(example["input_ids"], dtype=torch.long).flatten()
        if row.numel() == 0:
            raise InputError(f"example {index} is empty", field="input_ids")
        if row.numel() > self.max_len:
            raise InputError(f"example {index} has {row.numel()} tokens, more than max_len={self.max_len} "
                             "(truncate when tokenizing, keeping the special tokens)", field="input_ids")
        return row

    # ------------------------------------------------------------------ randomness
    def state_dict(self) -> dict[str, Any]:
        """The seed and generator state (resume the masking stream exactly)."""
        return {"seed": self.seed, "generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.generator.set_state(state["generator"])

    def _reseed_in_worker(self) -> None:
        worker = get_worker_info()
        if worker is not None and self._worker_id != worker.id:
            self._worker_id = worker.id
            self.generator.manual_seed(self.seed + 1_000_003 * (worker.id + 1))


# ---------------------------------------------------------------------- feature builders
@register_feature("decoder")
def _decoder_features(collator: PretrainCollator, ids: Tensor, attention: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """The decoder masker applied to the original ids (independent of the encoder mask)."""
    if collator.decoder_masker is None:
        raise ConfigError("batch feature 'decoder' needs a decoder masker in the method")
    masked = collator.decoder_masker(ids, attention, generator=generator)
    return {"decoder_input_ids": masked.input_ids, "decoder_labels": masked.labels}


@register_feature("original")
def _original_features(collator: PretrainCollator, ids: Tensor, attention: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """The unmasked ids, and the same ids as labels with special tokens and padding ignored."""
    predict = attention.bool() & ~collator.info.is_special[ids]
    return {"original_input_ids": ids, "original_labels": torch.where(predict, ids, IGNORE_INDEX)}


@register_feature("enhanced_mask")
def _enhanced_mask(collator: PretrainCollator, ids: Tensor, attention: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """RetroMAE's position-specific visibility; a query sees ``1 − decoder ratio`` of the tokens.

    Only the decoder masker's ratio is used: the masking module hides single tokens per row (RetroMAE hides
    whole words), so ``kind`` does not change this feature.
    """
    if collator.decoder_masker is None:
        raise ConfigError("batch feature 'enhanced_mask' needs a decoder masker in the method")
    masker = collator.decoder_masker
    visible_ratio = 1.0 - masker.ratio
    if isinstance(masker, ImportanceMasker):
        importance = masker.importance(ids, attention)
        return {"enhanced_mask": importance_enhanced_mask(attention, importance, visible_ratio=visible_ratio,
                                                          sigma=masker.sigma, generator=generator)}
    return {"enhanced_mask": enhanced_decoding_mask(attention, visible_ratio=visible_ratio,
                                                    generator=generator)}


@register_feature("bow_targets")
def _bow_targets(collator: PretrainCollator, ids: Tensor, attention: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """Unique non-special ids per row, ascending, padded with -100 (sort, drop repeats, sort again)."""
    return {"bow_targets": unique_token_ids(ids, attention.bool() & ~collator.info.is_special[ids])}


@register_feature("second_view")
def _second_view(collator: PretrainCollator, ids: Tensor, attention: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """A second, independent application of the encoder masker to the original ids (CPDAE §3.1.1)."""
    if collator.encoder_masker is None:
        raise ConfigError("batch feature 'second_view' needs encoder masking (encoder_masker.ratio > 0)")
    masked = collator.encoder_masker(ids, attention, generator=generator)
    return {"view2_input_ids": masked.input_ids, "view2_mlm_labels": masked.labels}


@register_feature("context")
def _context_spans(collator: PretrainCollator, ids: Tensor, attention: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """The examples' context spans, masked like the anchors, with both sides' text types (CoT-MAE/CoT-MoTE)."""
    examples = collator.current_examples
    lacking = [index for index, example in enumerate(examples) if "context_input_ids" not in example]
    if lacking:
        raise InputError(f"example {lacking[0]} has no 'context_input_ids': methods with context spans train on a "
                         "span dataset (pretrieve.data.spans.build_span_dataset)", field="context_input_ids")
    context, context_attention = collator.pad([{"input_ids": example["context_input_ids"]} for example in examples])
    batch = {"context_attention_mask": context_attention,
             "text_type": torch.tensor([int(example.get("text_type", 1)) for example in examples]),
             "context_text_type": torch.tensor([int(example.get("context_text_type", 1)) for example in examples])}
    if collator.encoder_masker is None:
        batch["context_input_ids"] = context.clone()
        batch["context_mlm_labels"] = torch.full_like(context, IGNORE_INDEX)
    else:
        masked = collator.encoder_masker(context, context_attention, generator=generator)
        batch["context_input_ids"], batch["context_mlm_labels"] = masked.input_ids, masked.labels
    if "decoder" in collator.features:
        batch.update({f"context_{key}": value for key, value in
                      _decoder_features(collator, context, context_attention, generator).items()})
    if "original" in collator.features:
        original = _original_features(collator, context, context_attention, generator)
        batch["context_original_ids"] = original["original_input_ids"]
        batch["context_original_labels"] = original["original_labels"]
    return batch


def unique_token_ids(ids: Tensor, keep: Tensor) -> Tensor:
    """Per row, the sorted unique values of ``ids[keep]``, right-padded with -100 → ``[B, K]`` (K ≥ 1)."""
    sentinel = torch.iinfo(torch.long).max
    values, _ = torch.where(keep, ids, sentinel).sort(dim=1)
    repeat = torch.zeros_like(keep)
    repeat[:, 1:] = values[:, 1:] == values[:, :-1]
    values, _ = values.masked_fill(repeat, sentinel).sort(dim=1)
    width = max(int((values != sentinel).sum(dim=1).max()), 1)
    values = values[:, :width]
    return values.masked_fill(values == sentinel, IGNORE_INDEX)


# ------------------------------------------------------------------------------------------ fine-tuning groups
def sampled_groups(groups: Sequence[TrainingGroup], num_negatives: int, generator: torch.Generator | None = None
                   ) -> Iterator[tuple[TrainingGroup, int, list[int]]]:
    """``(group, positive, negatives)`` for each group: the indices :func:`sample_group_indices` draws, from one numpy
    generator seeded by ``generator`` (seed 0 when None) — the bi- and cross-encoder collators' one sampling rule, so
    that a seeded data loader gives the same batches."""
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator).item()))
    for group in groups:
        positive, negatives = sample_group_indices(group, num_negatives, rng)
        yield group, positive, list(negatives)


class GroupCollator:
    """Training groups → a dual-encoder batch (queries ``[B, Lq]``, passages ``[B·G, Lp]``, teacher scores).

    Per group: one positive and ``num_negatives`` negatives drawn with a numpy generator seeded from the
    loop's ``torch.Generator`` (all randomness comes from it); the positive comes first in each group of
    ``G = 1 + num_negatives`` passages. ``teacher_scores=True`` adds the groups' teacher scores of the sampled
    documents as ``teacher_scores`` ``[B, G]``.
    """

    def __init__(self, tokenizer, corpus: "Corpus | CorpusTexts", num_negatives: int, query_max_len: int = 32,
                 passage_max_len: int = 144, teacher_scores: bool = False, query_prompt: str | None = None,
                 passage_prompt: str | None = None, title_sep: str = " "):
        self.tokenizer = tokenizer
        self.title_sep = title_sep   # between a passage's title and text (pretrieve.data.records.title_separator)
        self.prompts = {"query": query_prompt or "", "passage": passage_prompt or ""}
        self.corpus = corpus
        self.num_negatives = num_negatives
        self.query_max_len = query_max_len
        self.passage_max_len = passage_max_len
        self.teacher_scores = teacher_scores

    def __call__(self, groups: Sequence[TrainingGroup],
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        passages: list[str] = []
        teacher: list[list[float]] = []
        for group, positive, negatives in sampled_groups(groups, self.num_negatives, generator):
            ids = [group.positives[positive]] + [group.negatives[i] for i in negatives]
            passages.extend(self.corpus.texts_of(ids) if self.title_sep == " " else
                            self.corpus.texts_of(ids, self.title_sep))   # any corpus with texts_of(ids) serves
            if self.teacher_scores:
                if not group.has_scores:
                    raise InputError(f"training group of query '{group.query_id}' has no teacher scores",
                                     field="positive_scores")
                teacher.append([group.positive_scores[positive]] + [group.negative_scores[i] for i in negatives])
        batch = self._tokenize("query", [group.query for group in groups], self.query_max_len)
        batch.update(self._tokenize("passage", passages, self.passage_max_len))
        if self.teacher_scores:
            batch["teacher_scores"] = torch.tensor(teacher, dtype=torch.float32)
        return batch

    def _tokenize(self, prefix: str, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        if self.prompts[prefix]:     # as sentence-transformers does: the prompt string before the text
            texts = [self.prompts[prefix] + text for text in texts]
        encoded = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        keys = ("input_ids", "attention_mask", "token_type_ids")
        return {f"{prefix}_{key}": encoded[key] for key in keys if key in encoded}
