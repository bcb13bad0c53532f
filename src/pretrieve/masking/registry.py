"""The registry of maskers: a masker kind is known by name (``wwm``, ``token``, ``pmi``, …) with its parameters and
how it is built, so that a new masker is one module with a ``@register_masker`` builder plus its import in
:mod:`pretrieve.masking` — the pattern of the objectives (:func:`pretrieve.modeling.objectives.register_objective`).

A builder takes ``(spec, info, statistics)``: the masker spec of a method file (``kind``, ``ratio``,
``replace_probs``, ``params`` filled with the kind's defaults), the tokenizer's
:class:`~pretrieve.masking.vocab.VocabInfo`, and the corpus n-gram statistics when the kind declares
``needs_statistics`` (else None). It returns the masker: a callable ``masker(input_ids, attention_mask,
generator=…)`` giving a :class:`~pretrieve.masking.whole_word.MaskedInput`, as
:class:`~pretrieve.masking.whole_word.RandomMasker` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pretrieve.errors import ConfigError

#: ``(spec, info, statistics) -> masker``
Builder = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class MaskerKind:
    """A registered masker: its ``build`` function, the ``params`` it accepts with their ``defaults``, how they are
    checked (``check_params(params, where)``; None: the kind takes no params) and whether it needs the corpus
    n-gram statistics."""

    name: str
    build: Builder
    defaults: Mapping[str, Any] = field(default_factory=dict)
    check_params: Callable[[Mapping[str, Any], str], Any] | None = None
    needs_statistics: bool = False


MASKERS: dict[str, MaskerKind] = {}


def register_masker(name: str, *, defaults: Mapping[str, Any] | None = None,
                    check_params: Callable[[Mapping[str, Any], str], Any] | None = None,
                    needs_statistics: bool = False) -> Callable[[Builder], Builder]:
    """Decorator of a masker's builder: make the kind ``name`` known to method files and the collator."""
    def decorate(build: Builder) -> Builder:
        MASKERS[name] = MaskerKind(name, build, dict(defaults or {}), check_params, needs_statistics)
        return build
    return decorate


def masker_kind(name: str) -> MaskerKind:
    """The masker registered as ``name``."""
    if name not in MASKERS:
        raise ConfigError(f"unknown masker '{name}'; known maskers: {', '.join(MASKERS)}")
    return MASKERS[name]
