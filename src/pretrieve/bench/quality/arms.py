"""The arms of ``pretrieve bench quality`` and the contrasts between them, without importing torch.

``pretrieve --help`` reads :data:`DEFAULT_METHODS` from here, so this module imports nothing heavy (the method
registry is asked only when a comparison is checked, :func:`check_arms`).

An **arm** is a method the comparison pre-trains (a preset of :mod:`pretrieve.train.method`, or ``none``: the base
model is fine-tuned as it is) under a name. ``<method>-aa`` is an A/A negative control: the same method with every
seed shifted by :data:`AA_SEED_OFFSET`, reported as an arm of its own, so that a contrast ``mlm-aa-mlm`` must come
out non-significant. A **contrast** ``a-b`` (``bow-mlm``) is the difference ``a − b``; arm names may themselves
contain ``-`` (``cdmae-random``, ``mlm-aa``), so a contrast is split where both sides are arms of the comparison.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from pretrieve.errors import ConfigError

NO_PRETRAIN = "none"
BASELINES = ("mlm", NO_PRETRAIN)
DEFAULT_METHODS = ("none", "mlm", "ae", "ar", "retromae", "bow", "dupmae", "cpdae", "cdmae", "cotmae", "cotmote")
FIRST_SEED = 42
"""The first seed of a comparison's arms (``--seed``; seeds ``FIRST_SEED``, ``FIRST_SEED + 1``, …)."""
AA_SUFFIX = "-aa"
AA_SEED_OFFSET = 1000
#: The primary family of the issue's design (Holm over these when no --contrasts are given and the arms exist).
DEFAULT_CONTRASTS = ("bow-mlm", "retromae-mlm", "bow-none", "retromae-none", "mlm-none")
#: The Holm family of a contrast written without a ``FAMILY:`` label.
PRIMARY_FAMILY = "primary"
#: The family an A/A contrast (``X-aa − X``) is always put in.
AA_FAMILY = "aa"


def split_family(text: str) -> tuple[str, str]:
    """``"anchor:tsdae-mlm"`` → ``("anchor", "tsdae-mlm")``; no label → the primary family. Holm corrects within a
    family: the pre-registration declares several (the primary contrasts, the TSDAE anchor, the A/A control)."""
    family, _, contrast = text.strip().rpartition(":")
    return (family.strip() or PRIMARY_FAMILY), contrast.strip()


def arm_method(arm: str) -> tuple[str, int]:
    """``(method, seed offset)`` of an arm: ``mlm-aa`` → ``("mlm", AA_SEED_OFFSET)``; a method's own name → 0.
    A preset whose name ends in ``-aa`` is itself (the registry wins)."""
    if arm.endswith(AA_SUFFIX) and not _is_method(arm):
        return arm[:-len(AA_SUFFIX)], AA_SEED_OFFSET
    return arm, 0


def _is_method(name: str) -> bool:
    from pretrieve.train.method import PRESETS   # lazy: torch

    return name == NO_PRETRAIN or name in PRESETS


def check_arms(arms: Sequence[str]) -> None:
    """Every arm is ``none``, a preset the method registry knows, or ``<one of those>-aa``; none twice."""
    from pretrieve.train.method import PRESETS   # lazy: torch

    if not arms:
        raise ConfigError("give at least one method")
    unknown = [arm for arm in arms if not _is_method(arm_method(arm)[0])]
    if unknown:
        raise ConfigError(f"unknown method(s) {', '.join(unknown)}; choose from {NO_PRETRAIN}, "
                          f"{', '.join(PRESETS)} (or NAME{AA_SUFFIX}: an A/A control of NAME with other seeds)")
    duplicates = sorted({arm for arm in arms if list(arms).count(arm) > 1})
    if duplicates:
        raise ConfigError(f"method(s) {', '.join(duplicates)} listed twice")


def arm_seeds(arm: str, seeds: Iterable[int]) -> list[int]:
    """The seeds an arm runs with (an A/A arm's are shifted)."""
    offset = arm_method(arm)[1]
    return [int(seed) + offset for seed in seeds]


def parse_contrast(text: str, arms: Sequence[str]) -> tuple[str, str]:
    """``"bow-mlm"`` → ``("bow", "mlm")``, split where both sides are arms of ``arms`` (exactly one way)."""
    text = text.strip()
    splits = [(text[:i], text[i + 1:]) for i, char in enumerate(text) if char == "-"
              and text[:i] in arms and text[i + 1:] in arms]
    if len(splits) != 1:
        reason = "is ambiguous" if splits else f"does not name two compared arms ({', '.join(arms)})"
        raise ConfigError(f"contrast '{text}' {reason}; write ARM-ARM, e.g. bow-mlm")
    a, b = splits[0]
    if a == b:
        raise ConfigError(f"contrast '{text}' compares an arm with itself")
    return a, b


def parse_contrasts(items: Sequence[str] | None, arms: Sequence[str]) -> tuple[str, ...]:
    """The declared family (each ``a-b``, checked, no duplicates); default: the arms' subset of
    :data:`DEFAULT_CONTRASTS`."""
    if not items:
        return tuple(c for c in DEFAULT_CONTRASTS if all(side in arms for side in c.split("-")))
    family = []
    for item in items:
        label, contrast = split_family(item)
        a, b = parse_contrast(contrast, arms)
        if label == PRIMARY_FAMILY and arm_method(a) == (b, AA_SEED_OFFSET):
            label = AA_FAMILY   # an A/A control is its own family: in another it would inflate that family's Holm
        name = f"{a}-{b}" if label == PRIMARY_FAMILY else f"{label}:{a}-{b}"
        if name in family:
            raise ConfigError(f"contrast '{name}' listed twice")
        family.append(name)
    return tuple(family)
