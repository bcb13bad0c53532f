"""Pre-training methods as data: maskers + weighted objectives, presets, parsing and validation.

A method is ``{encoder masker, decoder masker, objectives with weights and params}``; the named methods of
the papers are presets, and users write new combinations in a YAML/JSON file or on the command line.
Everything is validated here, before any model is built, and every mistake raises
:class:`~pretrieve.errors.ConfigError` with the accepted values.

Presets (Drop your Decoder, Ma et al. 2024, = "Drop your Decoder", SIGIR'24; its §3.2 and §4.1 reproduce every MAE baseline "with the
same hyper-parameters", namely the settings of RetroMAE (Xiao et al., 2022)):

=========  ======================  ==================  =============================================
preset     encoder masker          decoder masker      objectives (weights)
=========  ======================  ==================  =============================================
mlm        whole-word, 0.30        —                   mlm (1) — "Further Pre-train" baseline
bow        whole-word, 0.30        —                   mlm (1) + bow (1, cosine-decayed to 0.1 as the authors'
                                                       code) — eq. 13; Table 6 ablates 0.15/0.30/0.45
ae         whole-word, 0.30        whole-word, 0.50    mlm (1) + ae (1), 1-layer decoder (eq. 4–5)
ar         whole-word, 0.30        —                   mlm (1) + ar (1), 1-layer causal decoder (eq. 6–7)
retromae   whole-word, 0.30        whole-word, 0.50    mlm (1) + enhanced (1) (eq. 8–10)
cpdae      token, 0.15             —                   mlm_views (1) + cpdae (1; λ = 0.1, JS contrast, REC mean over |V|)
cpdae-r    token, 0.15             —                   as cpdae, contrast on the dense [CLS] vectors
cdmae      whole-word, 0.30        pmi, 0.50           mlm (1) + ae (1), 2 layers + linear projection head
cdmae-     whole-word, 0.30        whole-word, 0.50    as cdmae: the matched control of "PMI masking > random
random                                                 masking" (CDMAE §4.4), only the decoder masker differs
dupmae     whole-word, 0.30        whole-word, 0.50    mlm (1) + enhanced (1; query stream through the embedding
                                                       layer, the authors' code) + ot_bow (1) — DupMAE (Xiao & Liu 2022) eq. 9
=========  ======================  ==================  =============================================

``tsdae`` (TSDAE, Wang et al. 2021) is not a PretrainModel method: ``trainer: tsdae`` marks that
:mod:`pretrieve.train.tsdae` trains it (sentence-transformers' ``DenoisingAutoEncoderLoss``) with the same
``PretrainConfig`` and the same export; it has no objectives or maskers, and ``bottleneck`` is its pooling.

``dupmae-code`` is ``dupmae`` with the authors' released OT-BoW (``variant: code``, weight 0.1); see
:mod:`pretrieve.modeling.objectives.ot_bow`.

CoT-MAE / CoT-MoTE (CoT-MoTE (Ma et al. 2023); :mod:`pretrieve.modeling.objectives.contextual`, :mod:`pretrieve.data.spans`,
:mod:`pretrieve.modeling.mote`). Three method fields, all optional (old ``method.json`` files stay loadable):
``context`` — where each anchor's context span comes from (``{kind: mixed|nearby|overlap|random}`` spans of
the same document, one random anchor span per document per draw unless ``anchors: span``, or ``{kind: pairs, pairs: <jsonl>}`` passage/query pairs), required by objectives that need
the batch feature ``context``; ``mote`` — query/passage FFN experts in the encoder; ``mote_swap`` — the Table 4
ablation (experts swapped during pre-training).

=============  ===================  ==================  =================================================
preset         encoder masker       decoder masker      objectives; context; experts
=============  ===================  ==================  =================================================
cotmae         whole-word, 0.30     whole-word, 0.45    mlm_spans + context_ae (2 layers); mixed spans
cotmote        whole-word, 0.30     —                   mlm_spans + context_ar (1 layer, passage → query only,
                                                        attention window 3); pairs; MoTE
cotmote-swap   as cotmote, experts swapped in pre-training (Table 4)
=============  ===================  ==================  =================================================

``cotmote`` needs the pairs file: ``{base: cotmote, context: {pairs: pairs.jsonl}}``.

Bottleneck (method field ``bottleneck``, optional): the sentence vector that the objectives decoding one read —
``bow``, ``ae``, ``ar``, ``enhanced``, ``cpdae`` and the contextual decoders. ``cls`` (default; the papers' and
their authors' choice, every preset) is the last layer's [CLS] vector; ``mean`` is the attention-masked mean of the
last hidden states, the vector of a mean-pooled retriever such as all-MiniLM-L6-v2
(:mod:`pretrieve.modeling.pretrain_model`). ``{base: bow, bottleneck: mean}`` in a file, ``bottleneck="mean"`` in
:func:`apply_overrides` / :func:`resolve_method`, ``--bottleneck mean`` on ``pretrieve pretrain``. Methods whose
objectives read no sentence vector (``mlm``) accept it and are unchanged. ``to_dict`` records it only when it is
``mean``, so the saved settings of every earlier (``cls``) run stay what they were.

CPDAE (Ma et al. 2022): each text is masked twice with BERT's token masking (15 %, §3.1.1); eq. 6 is
``REC + MLM + λ·CL`` with λ = 0.1 (§4.1.3). The MLM term is the mean over the masked tokens of *both* views
(both are ordinary masked inputs of the encoder): objective ``mlm_views``; ``cpdae`` holds ``REC + λ·CL``
(see :mod:`pretrieve.modeling.objectives.cpdae`). Ablations (Table 2): objective params
``contrast: none`` (w/o CL) and ``idf: <statistics dir>`` (IDF-REC).

CDMAE (Li et al. 2023): encoder masking unchanged (RetroMAE's whole-word 0.3), decoder masking importance-aware
(``pmi``: AMI over n-grams up to L = 4, Gaussian noise σ = 1, Algorithm 1) at 0.5 (§4.1); a 2-layer decoder
fed ``W·h_CLS + b`` (eq. 4); ``L = L_enc + L_dec`` (eq. 9) where "each loss is normalised": both are means
over their masked tokens (eq. 3 and 6 sum over the masked set; dividing by its size is the normalisation),
weights 1 and 1. The ``pmi`` masker works with any decoder objective: ``ae`` (masked decoder input) and
``enhanced`` (each row of the position-specific mask hides the important tokens first).

Masker parameters (``params``) exist for the ``pmi`` kind only: ``window`` (L = 4), ``sigma`` (1.0),
``whole_word`` (false: Algorithm 1 masks tokens) and ``statistics`` (null = the pre-training corpus handed
to the collator; or a path: a statistics directory or a text source to count); see
:mod:`pretrieve.masking.pmi`. They are filled with their defaults, so the saved method records them.

The encoder ratio 0.3 and decoder ratio 0.5 are RetroMAE's BERT-base settings (also DupMAE's, DupMAE (Xiao & Liu 2022)
§4 "Implementation details"). Drop your Decoder (Ma et al. 2024) does not print the ratio of its main runs; Table 6 reports BoW at
15 %, 30 % and 45 % (30 % is within noise of the best). The "Further Pre-train" MLM baseline uses the same
0.3 so that the presets differ only in their decoder (override with ``encoder_mask=0.15`` for BERT's ratio).

Decoder masker policy: an objective that reads decoder-side masks (feature ``decoder`` — ``ae`` — or
``enhanced_mask`` — ``enhanced``) with no decoder masker configured gets RetroMAE's default, whole-word
0.5, and the resolved config (saved with every run) records it; a log line says so. Configuring a decoder
masker that no objective uses is allowed (it is simply not applied).

File format (YAML or JSON; every key optional; ``base`` names a preset whose fields are overridden)::

    base: retromae
    name: retromae-bow
    encoder_masker: {ratio: 0.15}         # merged into the base's masker (kind kept)
    decoder_masker: {kind: token, ratio: 0.6}
    objectives:                           # replaces the base list
      - mlm
      - {name: enhanced, weight: 1.0}
      - {name: bow, weight: 0.5}
    # shorthands, same as the CLI: objectives: "mlm,bow", weights: "1,0.5", encoder_mask, decoder_mask

Later options (two masked views, context spans, query/passage experts) need no field here: the collator
derives the features to build from the objectives' ``requires`` (``second_view``, ``context``,
``text_type``); an encoder option such as MoTE would be a new field with a default, which keeps every saved
``method.json`` loadable.
"""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from pretrieve.data.spans import ContextSpec
from pretrieve.train import presets
from pretrieve.errors import ConfigError
from pretrieve.io_utils import load_config_file
from pretrieve.masking import MASKERS, masker_kind
from pretrieve.modeling.objectives import BOTTLENECKS, OBJECTIVES, check_objective_params, objective_class
from pretrieve.modeling.objectives.base import CDMAE, COT_MOTE, TSDAE, Citation

logger = logging.getLogger(__name__)

DECODER_MASKER_FEATURES = frozenset({"decoder", "enhanced_mask"})
"""Batch features built with the decoder masker; an objective requiring one needs a decoder masker."""

ALWAYS_PRODUCED = frozenset({"mlm_labels"})
"""Features every batch carries (the encoder masker's labels)."""


@dataclass(frozen=True, kw_only=True)
class MaskerSpec:
    """Which tokens a masker selects (``kind``), how many (``ratio``) and how it corrupts them (80/10/10)."""

    kind: str = "wwm"
    ratio: float
    replace_probs: tuple[float, float, float] = (0.8, 0.1, 0.1)
    params: dict[str, Any] = field(default_factory=dict)
    """Kind-specific settings (``pmi`` only, see the module docstring), filled with the kind's defaults."""

    def __post_init__(self) -> None:
        defaults = MASKERS[self.kind].defaults if self.kind in MASKERS else {}
        object.__setattr__(self, "params", {**defaults, **dict(self.params or {})})

    def to_dict(self) -> dict[str, Any]:
        data = {"kind": self.kind, "ratio": self.ratio, "replace_probs": list(self.replace_probs)}
        if self.params:
            data["params"] = dict(self.params)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "MaskerSpec":
        data = _mapping(data, where)
        _reject_unknown(data, {"kind", "ratio", "replace_probs", "params"}, where)
        if "ratio" not in data:
            raise ConfigError(f"{where}: 'ratio' is required")
        probs = data.get("replace_probs", (0.8, 0.1, 0.1))
        if not isinstance(probs, (list, tuple)):
            raise ConfigError(f"{where}.replace_probs: expected three numbers, got {probs!r}")
        params = dict(_mapping(data.get("params") or {}, f"{where}.params"))
        return cls(kind=str(data.get("kind", "wwm")), ratio=_number(data["ratio"], f"{where}.ratio"),
                   replace_probs=tuple(_number(p, f"{where}.replace_probs") for p in probs),  # type: ignore[arg-type]
                   params=params)


@dataclass(frozen=True)
class ObjectiveSpec:
    """One objective of a method: registry ``name``, loss ``weight`` and constructor ``params``."""

    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight, "params": dict(self.params)}

    @classmethod
    def from_any(cls, data: Any, where: str) -> "ObjectiveSpec":
        """From a name (``"bow"``) or a mapping ``{name, weight, params}``."""
        if isinstance(data, str):
            return cls(name=data.strip())
        data = _mapping(data, where)
        _reject_unknown(data, {"name", "weight", "params"}, where)
        if "name" not in data:
            raise ConfigError(f"{where}: 'name' is required")
        params = data.get("params") or {}
        return cls(name=str(data["name"]), weight=_number(data.get("weight", 1.0), f"{where}.weight"),
                   params=dict(_mapping(params, f"{where}.params")))


@dataclass(frozen=True)
class MethodConfig:
    """A pre-training method: maskers and weighted objectives."""

    name: str
    encoder_masker: MaskerSpec
    objectives: tuple[ObjectiveSpec, ...]
    decoder_masker: MaskerSpec | None = None
    context: ContextSpec | None = None
    """Context spans (CoT-MAE/CoT-MoTE): same-document spans or passage/query pairs."""
    mote: bool = False
    """Query/passage FFN experts in the encoder (CoT-MoTE)."""
    mote_swap: bool = False
    """Swap the experts' inputs during pre-training (CoT-MoTE, Ma et al. 2023, Table 4 ablation)."""
    bottleneck: str = "cls"
    """The sentence vector the decoder objectives read: ``cls`` (position 0) or ``mean`` (masked mean)."""
    trainer: str | None = None
    """A method trained by its own module instead of :class:`~pretrieve.modeling.pretrain_model.PretrainModel`
    (a key of :data:`TRAINERS`, e.g. ``tsdae``); it has no objectives or maskers of its own."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", tuple(self.objectives))

    # ------------------------------------------------------------------ derived
    @property
    def objective_names(self) -> list[str]:
        return [spec.name for spec in self.objectives]

    def required_features(self) -> set[str]:
        """Union of the objectives' ``requires`` plus the always-produced features."""
        features = set(ALWAYS_PRODUCED)
        for spec in self.objectives:
            features |= objective_class(spec.name).requires
        return features

    def needs_decoder_masker(self) -> bool:
        return bool(self.required_features() & DECODER_MASKER_FEATURES)

    # ------------------------------------------------------------------ validation
    def resolved(self) -> "MethodConfig":
        """Validated copy with the decoder-masker default filled in (see the module docstring)."""
        config = self
        if config.trainer is not None:
            return config.validate()
        _check_objectives(config)
        if config.decoder_masker is None and config.needs_decoder_masker():
            users = [s.name for s in config.objectives
                     if objective_class(s.name).requires & DECODER_MASKER_FEATURES]
            logger.info("objective(s) %s need a decoder masker and none is configured; using %s",
                        ", ".join(users), DEFAULT_DECODER_MASKER)
            config = replace(config, decoder_masker=DEFAULT_DECODER_MASKER)
        config.validate()
        return config

    def validate(self) -> "MethodConfig":
        """Raise :class:`ConfigError` on any invalid field; return ``self``."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("method name must be a non-empty string")
        if self.bottleneck not in BOTTLENECKS:
            raise ConfigError(f"bottleneck must be one of {', '.join(BOTTLENECKS)}, got {self.bottleneck!r}")
        if self.trainer is not None:
            return _check_trainer(self)
        _check_objectives(self)
        _check_masker(self.encoder_masker, "encoder_masker", allow_zero=True)
        if self.encoder_masker.ratio == 0 and "mlm_labels" in _requires_of(self):
            raise ConfigError("objective 'mlm' needs encoder masking: encoder_masker.ratio must be > 0")
        if self.encoder_masker.ratio == 0 and "second_view" in _requires_of(self):
            raise ConfigError("a second masked view needs encoder masking: encoder_masker.ratio must be > 0")
        if self.decoder_masker is not None:
            _check_masker(self.decoder_masker, "decoder_masker", allow_zero=False)
        elif self.needs_decoder_masker():
            raise ConfigError("objectives " + ", ".join(self.objective_names) + " need a decoder masker "
                              "(set decoder_mask=..., or call resolved() to use the default)")
        if "context" in _requires_of(self) and self.context is None:
            raise ConfigError("objectives " + ", ".join(self.objective_names) + " need context spans: set "
                              "context: {kind: mixed} (spans of the same document) or {kind: pairs, pairs: FILE}")
        if self.context is not None:
            self.context.validate()
        if not isinstance(self.mote, bool) or not isinstance(self.mote_swap, bool):
            raise ConfigError("mote and mote_swap must be true or false")
        if self.mote_swap and not self.mote:
            raise ConfigError("mote_swap swaps the query/passage experts: it needs mote: true")
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "encoder_masker": self.encoder_masker.to_dict(),
            "decoder_masker": None if self.decoder_masker is None else self.decoder_masker.to_dict(),
            "objectives": [spec.to_dict() for spec in self.objectives],
            "context": None if self.context is None else self.context.to_dict(),
            "mote": self.mote,
            "mote_swap": self.mote_swap,
            # recorded only when not the default, so the settings of every earlier run stay equal (reusable)
            **({"bottleneck": self.bottleneck} if self.bottleneck != "cls" else {}),
            **({"trainer": self.trainer} if self.trainer is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "method") -> "MethodConfig":
        """Inverse of :meth:`to_dict` (validated and resolved)."""
        data = _mapping(data, where)
        _reject_unknown(data, {"name", "encoder_masker", "decoder_masker", "objectives", *_OPTIONAL_FIELDS}, where)
        for key in ("name", "encoder_masker", "objectives"):
            if key not in data:
                raise ConfigError(f"{where}: '{key}' is required")
        objectives = data["objectives"]
        if isinstance(objectives, str):
            objectives = _split(objectives)
        if not isinstance(objectives, (list, tuple)):
            raise ConfigError(f"{where}.objectives: expected a list, got {type(objectives).__name__}")
        decoder = data.get("decoder_masker")
        return cls(
            name=str(data["name"]),
            encoder_masker=MaskerSpec.from_dict(data["encoder_masker"], f"{where}.encoder_masker"),
            decoder_masker=None if decoder is None else MaskerSpec.from_dict(decoder, f"{where}.decoder_masker"),
            objectives=tuple(ObjectiveSpec.from_any(o, f"{where}.objectives[{i}]") for i, o in enumerate(objectives)),
            context=None if data.get("context") is None else ContextSpec.from_dict(data["context"], f"{where}.context"),
            mote=data.get("mote", False), mote_swap=data.get("mote_swap", False),
            bottleneck=data.get("bottleneck", "cls"), trainer=data.get("trainer"),
        ).resolved()


_OPTIONAL_FIELDS = ("context", "mote", "mote_swap", "bottleneck", "trainer")


DEFAULT_DECODER_MASKER = MaskerSpec(**presets.DECODER_MASKER)

TRAINERS: dict[str, str] = {"tsdae": "pretrieve.train.tsdae"}
"""Methods whose model is not a ``PretrainModel``, and the module that trains it (:func:`trainer_module`). Such a
module provides ``build(model_path, method, tokenizer) -> (model, collator)`` for the pre-training run (same
corpus, loop and export as every other method; the model has ``save(directory)``) and ``load_checkpoint(final,
weights) -> model``: a checkpoint of the run loaded into the model it trains, exported like ``final`` for the
probes of intermediate steps. A new trainer is that module and its entry here."""


def trainer_module(method: "MethodConfig") -> ModuleType:
    """The module that trains ``method`` (a validated method with a ``trainer``), imported when first asked for."""
    return importlib.import_module(TRAINERS[method.trainer])

def method_citations(method: MethodConfig) -> list[Citation]:
    """The papers a method pre-trains with, once each in order: its objectives' ``citation``, then CDMAE (Li et al.
    2023) for a PMI decoder masker, CoT-MoTE (Ma et al. 2023) for query/passage experts, TSDAE (Wang et al. 2021) for
    its trainer. The one source of the model card's citations and of docs/methods.md's paper table."""
    found = [objective_class(spec.name).citation for spec in method.objectives]
    found += [CDMAE] if method.decoder_masker is not None and method.decoder_masker.kind == "pmi" else []
    found += ([COT_MOTE] if method.mote else []) + ([TSDAE] if method.trainer == "tsdae" else [])
    return list(dict.fromkeys(citation for citation in found if citation is not None))


def papers_markdown() -> str:
    """docs/methods.md's table of the papers behind each preset (:func:`method_citations`; a test keeps them equal)."""
    cited = {name: method_citations(preset(name)) for name in PRESETS}
    lines = ["| preset | papers |", "|---|---|"]
    lines += [f"| `{name}` | " + ", ".join(f"{c.paper} ({c.first_author} et al. {c.year})" for c in papers) + " |"
              for name, papers in cited.items()]
    lines += [""] + [f"- {c}" for c in dict.fromkeys(c for papers in cited.values() for c in papers)]
    return "\n".join(lines)


def preset(name: str) -> MethodConfig:
    """A named method; :class:`ConfigError` listing the presets when unknown."""
    try:
        return PRESETS[name].resolved()
    except KeyError:
        raise ConfigError(f"unknown method '{name}'; presets: {', '.join(PRESETS)} "
                          "(or give a .yaml/.json method file)") from None


def load_method_file(path: str | Path) -> MethodConfig:
    """Read a YAML/JSON method file (:func:`pretrieve.io_utils.load_config_file`), apply it over its ``base`` preset
    (if any) and validate."""
    return method_from_mapping(load_config_file(path, what="method"), where=str(path))


def method_from_mapping(data: Any, where: str = "method") -> MethodConfig:
    """Build a method from a file's mapping: ``base`` preset + field overrides + CLI-style shorthands."""
    data = dict(_mapping(data, where))
    shorthands = {key: data.pop(key) for key in ("encoder_mask", "decoder_mask", "weights") if key in data}
    base_name = data.pop("base", None)
    if base_name is None:
        if "objectives" not in data:
            raise ConfigError(f"{where}: give 'objectives' or a 'base' preset ({', '.join(PRESETS)})")
        merged: dict[str, Any] = {"name": "custom", "encoder_masker": dict(presets.ENCODER_MASKER),
                                  "decoder_masker": None}
    else:
        merged = preset(str(base_name)).to_dict()
    _reject_unknown(data, {"name", "encoder_masker", "decoder_masker", "objectives", *_OPTIONAL_FIELDS}, where)
    for key in ("encoder_masker", "decoder_masker"):
        if key in data:
            merged[key] = _merge_masker(merged.get(key), data.pop(key), f"{where}.{key}")
    if isinstance(data.get("context"), Mapping) and isinstance(merged.get("context"), Mapping):
        merged["context"] = {**merged["context"], **data.pop("context")}  # e.g. the base's kind + a pairs file
    merged.update(data)
    config = MethodConfig.from_dict(merged, where)
    if shorthands:
        config = apply_overrides(config, where=where, **shorthands)
    return config


def resolve_method(method: str | Path | None = None, *, objectives: str | None = None,
                   weights: str | None = None, encoder_mask: float | str | None = None,
                   decoder_mask: float | str | None = None, encoder_masker: str | None = None,
                   decoder_masker: str | None = None, bottleneck: str | None = None,
                   name: str | None = None) -> MethodConfig:
    """The method the CLI asked for: a preset name or a YAML/JSON file (or only ``objectives``), then overrides.

    ``objectives="mlm,bow,enhanced"``, ``weights="1,1,0.5"``, ``encoder_mask=0.3``, ``decoder_mask=0.5``,
    ``encoder_masker="wwm"``, ``decoder_masker="token"`` (or ``"none"``), ``bottleneck="mean"``.
    """
    if method is None:
        if objectives is None:
            raise ConfigError(f"give a method (one of {', '.join(PRESETS)} or a .yaml/.json file) or objectives=...")
        config = MethodConfig("custom", MaskerSpec(**presets.ENCODER_MASKER), tuple(ObjectiveSpec(n) for n in _split(objectives)))
    elif str(method) not in PRESETS and (Path(method).suffix.lower() in (".yaml", ".yml", ".json")
                                         or Path(method).is_file()):
        config = load_method_file(method)
    else:
        config = preset(str(method))  # unknown names raise the error listing the presets
    return apply_overrides(config, objectives=objectives, weights=weights, encoder_mask=encoder_mask,
                           decoder_mask=decoder_mask, encoder_masker=encoder_masker,
                           decoder_masker=decoder_masker, bottleneck=bottleneck, name=name, where="command line")


def apply_overrides(config: MethodConfig, *, objectives: str | list | None = None,
                    weights: str | list | None = None, encoder_mask: float | str | None = None,
                    decoder_mask: float | str | None = None, encoder_masker: str | None = None,
                    decoder_masker: str | None = None, bottleneck: str | None = None, name: str | None = None,
                    where: str = "command line") -> MethodConfig:
    """Apply CLI-style overrides to ``config`` and return the validated, resolved result.

    New ``objectives`` keep the params and weight of an objective of the same name in ``config``;
    ``weights`` (one per objective, in order) override the weights.
    """
    specs = list(config.objectives)
    if objectives is not None:
        previous = {spec.name: spec for spec in config.objectives}
        names = _split(objectives) if isinstance(objectives, str) else [str(n) for n in objectives]
        specs = [previous.get(n, ObjectiveSpec(n)) for n in names]
        if name is None and names != config.objective_names:
            name = "custom"
    if weights is not None:
        values = _split(weights) if isinstance(weights, str) else list(weights)
        if len(values) != len(specs):
            raise ConfigError(f"{where}: {len(values)} weight(s) given for {len(specs)} objective(s) "
                              f"({', '.join(s.name for s in specs)})")
        specs = [replace(spec, weight=_number(w, f"{where}: weights")) for spec, w in zip(specs, values)]
    enc = config.encoder_masker
    if encoder_mask is not None:
        enc = replace(enc, ratio=_number(encoder_mask, f"{where}: encoder_mask"))
    if encoder_masker is not None:
        enc = _with_kind(enc, str(encoder_masker))
    dec = config.decoder_masker
    if decoder_masker is not None and str(decoder_masker).lower() == "none":
        dec = None
    elif decoder_masker is not None:
        dec = _with_kind(dec or DEFAULT_DECODER_MASKER, str(decoder_masker))
    if decoder_mask is not None:
        dec = replace(dec or DEFAULT_DECODER_MASKER, ratio=_number(decoder_mask, f"{where}: decoder_mask"))
    return MethodConfig(name or config.name, enc, tuple(specs), decoder_masker=dec, context=config.context,
                        mote=config.mote, mote_swap=config.mote_swap,
                        bottleneck=config.bottleneck if bottleneck is None else str(bottleneck),
                        trainer=config.trainer).resolved()


# ---------------------------------------------------------------------- helpers
def _check_objectives(config: MethodConfig) -> None:
    if not config.objectives:
        raise ConfigError("a method needs at least one objective")
    seen: set[str] = set()
    for spec in config.objectives:
        if spec.name not in OBJECTIVES:
            raise ConfigError(f"unknown objective '{spec.name}'; known objectives: {', '.join(sorted(OBJECTIVES))}")
        if spec.name in seen:
            raise ConfigError(f"objective '{spec.name}' is listed twice")
        seen.add(spec.name)
        if not math.isfinite(spec.weight) or spec.weight < 0:
            raise ConfigError(f"objective '{spec.name}': weight must be a finite number ≥ 0, got {spec.weight}")
        check_objective_params(spec.name, spec.params)
    if all(spec.weight == 0 for spec in config.objectives):
        raise ConfigError("at least one objective needs a weight > 0")


def _check_trainer(config: MethodConfig) -> MethodConfig:
    """A method with its own trainer: a known trainer, and none of the fields only PretrainModel reads."""
    if config.trainer not in TRAINERS:
        raise ConfigError(f"unknown trainer {config.trainer!r}; known trainers: {', '.join(TRAINERS)}")
    extra = [key for key, value in (("objectives", config.objectives), ("decoder_masker", config.decoder_masker),
                                    ("encoder_masker", config.encoder_masker.ratio), ("context", config.context),
                                    ("mote", config.mote)) if value]
    if extra:
        raise ConfigError(f"method '{config.name}' is trained by {TRAINERS[config.trainer]}, which takes no "
                          f"{', '.join(extra)}")
    return config


def _with_kind(spec: MaskerSpec, kind: str) -> MaskerSpec:
    """``spec`` with another kind; the previous kind's params are dropped (they belong to that kind)."""
    return spec if kind == spec.kind else replace(spec, kind=kind, params={})


def _check_masker(spec: MaskerSpec, where: str, *, allow_zero: bool) -> None:
    if spec.kind not in MASKERS:
        raise ConfigError(f"{where}: unknown masker '{spec.kind}'; known maskers: {', '.join(MASKERS)}")
    kind = masker_kind(spec.kind)
    if kind.check_params is not None:
        kind.check_params(spec.params, f"{where}.params")
    elif spec.params:
        raise ConfigError(f"{where}: masker '{spec.kind}' takes no params, got {', '.join(map(str, spec.params))}")
    low_ok = spec.ratio >= 0 if allow_zero else spec.ratio > 0
    if not (math.isfinite(spec.ratio) and low_ok and spec.ratio < 1):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ConfigError(f"{where}: mask ratio must be in {interval}, got {spec.ratio}")
    probs = spec.replace_probs
    if len(probs) != 3 or any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-6):
        raise ConfigError(f"{where}: replace_probs must be three non-negative numbers (mask, random, keep) "
                          f"summing to 1, got {list(probs)}")


def _requires_of(config: MethodConfig) -> set[str]:
    features: set[str] = set()
    for spec in config.objectives:
        features |= objective_class(spec.name).requires
    return features


def _merge_masker(base: Any, override: Any, where: str) -> dict[str, Any] | None:
    if override is None:
        return None
    if isinstance(override, str):
        override = {"kind": override}
    override = dict(_mapping(override, where))
    merged = dict(base or DEFAULT_DECODER_MASKER.to_dict())
    if "kind" in override and override["kind"] != merged.get("kind") and "params" not in override:
        merged.pop("params", None)  # the base kind's params do not apply to another kind
    merged.update(override)
    return merged


def _split(text: str) -> list[str]:
    return [part.strip() for part in str(text).split(",") if part.strip()]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number, got {value!r}") from None


def _mapping(data: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    return data


def _reject_unknown(data: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}; "
                          f"known fields: {', '.join(sorted(known))}")


PRESETS: dict[str, MethodConfig] = {name: MethodConfig.from_dict({"name": name, **data}, f"preset {name}")
                                     for name, data in presets.PRESETS.items()}
"""The named methods (:mod:`pretrieve.train.presets`, plain data), validated against the registries."""
