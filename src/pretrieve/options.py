"""Typed, validated options: the one loader behind every config file, every set of flags and every recipe.

A *schema* is a dataclass (``PretrainConfig``, ``FinetuneConfig``, ``RerankerConfig``, a recipe stage's options,
...). :func:`validate` checks a mapping of option values against it with pydantic (``TypeAdapter`` over the
dataclass, lax mode): values are coerced to the declared types where that is unambiguous (``lr: 1e-4``, which
YAML 1.1 reads as the *string* ``"1e-4"``, becomes the float ``0.0001``; ``"3"`` becomes ``3``) and refused
otherwise, and keys the schema does not declare are refused with a suggestion. Every problem is one
:class:`~pretrieve.errors.ConfigError` line naming the key's path, e.g.::

    stages[4].teacher.max_negative: unknown option; did you mean max_negatives?
    configs/run.yaml: lr: expected a number, got 'abc'

Only the keys that were given are returned (coerced), so callers can still tell a given value from a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from typing import Any, Collection, Mapping

from pretrieve.errors import ConfigError

_MESSAGES = {
    "float_parsing": "expected a number", "float_type": "expected a number", "finite_number": "expected a finite number",
    "int_parsing": "expected an integer", "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "bool_parsing": "expected true or false", "bool_type": "expected true or false",
    "string_type": "expected a string", "list_type": "expected a list", "dict_type": "expected a mapping",
    "tuple_type": "expected a list", "literal_error": "not one of the accepted values",
}


@functools.lru_cache(maxsize=None)
def _adapter(schema: type):
    from pydantic import TypeAdapter  # lazy: pydantic

    return TypeAdapter(schema)


def field_names(schema: type) -> list[str]:
    """The option names a dataclass schema declares, in declaration order."""
    return [f.name for f in dataclasses.fields(schema)]


def join_path(where: str, key: str | int) -> str:
    """``"stages[4].teacher" + "max_len"`` → ``"stages[4].teacher.max_len"``; a file name is followed by ``": "``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if not where:
        return str(key)
    return f"{where}: {key}" if where.endswith(_FILE_SUFFIXES) else f"{where}.{key}"


_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def unknown_option(where: str, key: str, known: Collection[str], what: str = "option") -> ConfigError:
    """``<path>.<key>: unknown option; did you mean <closest>?`` (or the known names when nothing is close)."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}"
    return ConfigError(f"{join_path(where, str(key))}: unknown {what}; {hint}")


def check_known(values: Mapping[str, Any], known: Collection[str], where: str = "",
                set_elsewhere: Mapping[str, str] | None = None) -> None:
    """Refuse keys outside ``known`` (with a did-you-mean) and keys that ``set_elsewhere`` reserves
    (``{"out": "set by the recipe"}``)."""
    for key in values:
        if set_elsewhere and key in set_elsewhere:
            raise ConfigError(f"{join_path(where, str(key))}: {set_elsewhere[key]}, not an option here")
        if key not in known:
            raise unknown_option(where, key, known)


def validate(schema: type, values: Mapping[str, Any] | None, where: str = "", *,
             exclude: Collection[str] = (), set_elsewhere: Mapping[str, str] | None = None,
             extra: Collection[str] = ()) -> dict[str, Any]:
    """Check ``values`` against the dataclass ``schema``; return the given keys with coerced values.

    ``exclude``: declared options that are not accepted here (refused as unknown); ``set_elsewhere``: keys refused
    with their reason; ``extra``: keys accepted as they are (checked by their consumer).
    """
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where or 'options'}: expected a mapping of option names to values, "
                          f"got {type(values).__name__}")
    known = [name for name in field_names(schema) if name not in exclude] + list(extra)
    check_known(values, known, where, set_elsewhere)
    typed = {key: value for key, value in values.items() if key not in extra}
    instance = _validated(schema, typed, where)
    return {key: (getattr(instance, key) if key in typed else values[key]) for key in values}


def build(schema: type, values: Mapping[str, Any], where: str = "") -> Any:
    """An instance of ``schema`` from ``values`` (unknown keys refused, types coerced or refused)."""
    check_known(values, field_names(schema), where)
    return _validated(schema, dict(values), where)


def _validated(schema: type, values: dict[str, Any], where: str) -> Any:
    from pydantic import ValidationError  # lazy: pydantic

    try:
        instance = _adapter(schema).validate_python(values)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc, where)) from None
    hints = _type_hints(schema)
    for key, given in values.items():
        check_number(where, key, given, getattr(instance, key), hints.get(key, Any))
    return instance


#: The largest integer any option may hold (int64: torch, numpy and the file formats store no more); a seed is
#: at most 2**32 - 1 (numpy's ``RandomState`` takes no more).
MAX_INTEGER = 2 ** 63 - 1
MAX_SEED = 2 ** 32 - 1


def check_number(where: str, key: str, given: Any, value: Any, declared: Any = Any) -> None:
    """What pydantic's lax mode lets through, refused in one line naming the key's path: a boolean for an option
    that is not one (``batch_size: true`` is not 1), a number that is not finite (``lr: .nan``, ``inf``), an
    integer beyond int64, a seed beyond numpy's 32 bits."""
    path = join_path(where, key)
    if isinstance(given, bool) and not _accepts_bool(declared):
        raise ConfigError(f"{path}: expected a number, got {given!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: expected a finite number, got {given!r}")
    if isinstance(value, int) and not isinstance(value, bool):
        limit = MAX_SEED if key == "seed" else MAX_INTEGER
        low = 0 if limit == MAX_SEED else -MAX_INTEGER - 1
        if not low <= value <= limit:
            raise ConfigError(f"{path}: expected an integer from {low} to {limit}, got {given!r}")


def _accepts_bool(declared: Any) -> bool:
    return declared is bool or declared is Any or any(_accepts_bool(arg) for arg in typing.get_args(declared)
                                                      if isinstance(arg, type) or typing.get_args(arg))


@functools.lru_cache(maxsize=None)
def _type_hints(schema: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(schema)
    except Exception:   # an annotation that cannot be resolved here: every option is taken as declared Any
        return {}


def describe_error(exc, where: str = "") -> str:
    """The first problem of a pydantic ``ValidationError`` as ``<path>: <problem>, got <value>``."""
    errors = exc.errors(include_url=False)
    # a union (``int | None``) reports one error per member: the "not None" one says least
    useful = [e for e in errors if e.get("type") != "none_required"] or errors
    error = useful[0]
    location = error.get("loc", ())
    path = where
    for index, part in enumerate(location):
        if isinstance(part, int) or index == 0:
            path = join_path(path, part)
        # later string parts name a union member ("int", "list[str]"), not a key
    message = _MESSAGES.get(error.get("type", ""), str(error.get("msg", "invalid value")).lower())
    shown = repr(error.get("input"))
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{path or 'options'}: {message}, got {shown}"
