"""A run's configuration from a file and flags: YAML/JSON file first, command-line flags override it (the settings
themselves are declared in :mod:`pretrieve.train.settings`).

Files are read by :func:`pretrieve.io_utils.load_config_file` (one line ``file:line: problem`` for a syntax error).
Every value goes through the one validating loader (:mod:`pretrieve.options`): unknown keys are errors (a typo
must not silently fall back to a default; the message suggests the closest option), values are coerced to
their declared types (``lr: 1e-4``, a string to YAML 1.1, is a float) or refused with the key's path, and
required settings missing from both the file and the flags are reported before any work starts.
"""

from __future__ import annotations

from typing import Any, Mapping

from pretrieve.errors import ConfigError
from pretrieve.io_utils import load_config_file  # noqa: F401 - the one config reader, re-exported for its users
from pretrieve.models import resolve_model
from pretrieve.options import validate
from pretrieve.train.method import apply_overrides, method_from_mapping, resolve_method
from pretrieve.train.pretrainer import PretrainConfig
from pretrieve.train.settings import METHOD_OVERRIDES, PretrainOptions, default_of


def merge(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """File values overridden by the flags that were given (not None)."""
    merged = dict(file_values)
    merged.update({key: value for key, value in flags.items() if value is not None})
    return merged


def validated_values(schema: type, file_values: Mapping[str, Any], flags: Mapping[str, Any],
                     where: str = "config") -> dict[str, Any]:
    """The config file's values (checked and coerced, errors prefixed by ``where``, e.g. the file's name) overridden
    by the given flags, checked again as a whole."""
    values = merge(validate(schema, file_values, where), flags)
    return validate(schema, values)


def resolve_pretrain_method(values: dict[str, Any], method_flags: Mapping[str, Any], where: str = "config"):
    """Pop ``method`` and the method overrides from ``values`` (flags in ``method_flags`` win) and return the
    resolved, validated :class:`~pretrieve.train.method.MethodConfig` (preset, file or mapping + overrides)."""
    method_value = (method_flags.get("method") or values.pop("method", None)
                    or default_of(PretrainOptions, "method"))
    values.pop("method", None)
    overrides = {key: method_flags.get(key) if method_flags.get(key) is not None else values.pop(key, None)
                 for key in METHOD_OVERRIDES}
    for key in METHOD_OVERRIDES:
        values.pop(key, None)
    if isinstance(method_value, Mapping):
        return apply_overrides(method_from_mapping(method_value, where=where), where=where, **overrides)
    return resolve_method(method_value, **overrides)


def build_pretrain_config(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                          method_flags: Mapping[str, Any], resume: bool = False, where: str = "pretrain config"):
    """A validated :class:`PretrainConfig` with its method resolved (preset/file/mapping + flags)."""
    values = validated_values(PretrainOptions, file_values, flags, where)
    method = resolve_pretrain_method(values, method_flags)
    missing = [key for key in ("model", "corpus", "out") if not values.get(key)]
    if missing:
        raise ConfigError(f"missing required option(s): {', '.join('--' + m.replace('_', '-') for m in missing)}")
    values["model"] = resolve_model(values["model"])
    values["method"] = method
    values["resume"] = resume or bool(values.get("resume", False))
    return PretrainConfig(**values)
