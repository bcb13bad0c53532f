"""Run configurations from files and flags: YAML/JSON file first, command-line flags override it.

Unknown keys are errors (a typo must not silently fall back to a default), and required settings
missing from both the file and the flags are reported before any work starts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

import yaml

from pretrieve.errors import ConfigError, InputError
from pretrieve.models import resolve_model

METHOD_FLAG_KEYS = ("objectives", "weights", "encoder_mask", "decoder_mask", "encoder_masker", "decoder_masker")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping; errors name the file."""
    path = Path(path)
    if not path.exists():
        raise InputError("config file not found", path=path)
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"cannot parse config: {exc}", path=path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError("config must be a mapping of option names to values", path=path)
    return data


def merge(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """File values overridden by the flags that were given (not None)."""
    merged = dict(file_values)
    merged.update({key: value for key, value in flags.items() if value is not None})
    return merged


def check_keys(values: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")


def build_pretrain_config(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                          method_flags: Mapping[str, Any], resume: bool = False):
    """A validated :class:`PretrainConfig` with its method resolved (preset/file/mapping + flags)."""
    from pretrieve.train.method import apply_overrides, method_from_mapping, resolve_method
    from pretrieve.train.pretrainer import PretrainConfig

    known = {f.name for f in dataclasses.fields(PretrainConfig)} | set(METHOD_FLAG_KEYS)
    values = merge(file_values, flags)
    check_keys(values, known, "pretrain config")
    method_value = method_flags.get("method") or values.pop("method", None) or "bow"
    overrides = {key: method_flags.get(key) if method_flags.get(key) is not None else values.pop(key, None)
                 for key in METHOD_FLAG_KEYS}
    for key in METHOD_FLAG_KEYS:
        values.pop(key, None)
    if isinstance(method_value, Mapping):
        method = apply_overrides(method_from_mapping(method_value), where="config", **overrides)
    else:
        method = resolve_method(method_value, **overrides)
    missing = [key for key in ("model", "corpus", "out") if not values.get(key)]
    if missing:
        raise ConfigError(f"missing required option(s): {', '.join('--' + m.replace('_', '-') for m in missing)}")
    values["model"] = resolve_model(values["model"])
    values["method"] = method
    values["resume"] = resume or bool(values.get("resume", False))
    return PretrainConfig(**values)
