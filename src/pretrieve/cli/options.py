"""Option helpers shared by the training and scoring commands (``pretrain``, ``finetune``, ``mine``, ``reranker``).

The training commands' options are built from the settings' declarations (:func:`settings_command` over the
torch-free dataclasses of :mod:`pretrieve.train.settings`: flag, help and shown default), and config files are read
by the torch-free :func:`pretrieve.io_utils.load_config_file`, so ``pretrieve --help`` never imports torch and no
default or help text is written twice.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, List, Mapping, Optional

import typer

from pretrieve.data.registry import resolve_collection
from pretrieve.io_utils import load_config_file
from pretrieve.train.settings import LoopConfig

DATA_HELP = "Collection directory in BEIR layout."
SCORING_PRECISION_HELP = ("auto | fp32 | bf16 | fp16 | int8; auto: bf16 only where the hardware computes it "
                          "natively (a GPU with bf16, a CPU with AVX512-BF16/AMX), else fp32; int8: the linear "
                          "layers quantised (CPU).")
REQUIRED = "Required (here or in --config)."
QUERY_PROMPT_HELP = ("Text prepended to every query (E5/BGE-style instruction, e.g. 'query: '); replaces the "
                     "prompt the model saved ('' for none).")
PASSAGE_PROMPT_HELP = ("Text prepended to every passage (e.g. 'passage: '); replaces the prompt the model saved "
                       "('' for none).")
ConfigFile = Annotated[Optional[Path], typer.Option("--config", help="YAML/JSON file with any of these options (flags "
                                                                 "given here override it).")]


def settings_command(schema: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator of a training command: besides its own parameters (``--config``), one option per setting of
    ``schema`` (:mod:`pretrieve.train.settings`: the flag, its help and its shown default come from the field), each
    None unless given, so that a ``--config`` file's value stands. The command receives the settings given as
    keyword arguments: paths as strings, a repeated option as a list, a one-way switch (``--resume``) not given as
    None."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(function, include_extras=True)
        own = [parameter.replace(annotation=hints.get(parameter.name, parameter.annotation))
               for parameter in inspect.signature(function).parameters.values()
               if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
        options = setting_options(schema)
        switches = {field.name for field in dataclasses.fields(schema) if is_switch(field)}

        def command(**given: Any) -> Any:
            settings = {name: _flag_value(value, name in switches) for name, value in given.items()
                        if name in options}
            return function(**{p.name: given[p.name] for p in own}, **settings)

        parameters = own + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
                            for name, (kind, info) in options.items()]
        command.__signature__ = inspect.Signature(parameters)   # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__name__, command.__doc__ = function.__name__, function.__doc__
        return command
    return decorate


def setting_options(schema: type) -> dict[str, tuple[Any, Any]]:
    """Setting name → (its command-line type, its ``typer.Option``), for the settings of ``schema`` offered on the
    command line: the required ones first, then the trainer's own, then the loop's (declaration order)."""
    hints = typing.get_type_hints(schema)
    fields = _ordered_fields(schema)
    options = {}
    for field in sorted(fields, key=lambda f: not f.metadata.get("required")):
        meta = field.metadata
        if not meta.get("cli", True):
            continue
        kind = _cli_type(hints[field.name], meta.get("multiple", False))
        flags = meta.get("flags") or _default_flags(field.name, kind)
        text = meta.get("help", "") + (" " + REQUIRED if meta.get("required") else "")
        options[field.name] = (kind, typer.Option(None, *flags, help=text, show_default=shown_default(field)))
    return options


def shown_default(field: dataclasses.Field) -> str | bool:
    """What ``--help`` shows as a setting's default: its ``shown`` text, else its value (on/off for a switch), else
    nothing (an empty or None default that the declaration does not describe)."""
    meta = field.metadata
    if meta.get("shown") is not None:
        return meta["shown"]
    default = field.default if field.default is not dataclasses.MISSING else None
    if isinstance(default, bool):
        return False if is_switch(field) else ("on" if default else "off")
    if isinstance(default, float):
        return f"{default:g}"
    return False if default in ("", None) else str(default)


def _ordered_fields(schema: type) -> list[dataclasses.Field]:
    """The fields of ``schema``, the classes below the loop's first (base to derived), then the loop's."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    order: list[str] = []
    classes = [cls for cls in reversed(schema.__mro__) if dataclasses.is_dataclass(cls) and cls is not LoopConfig]
    for cls in classes + [LoopConfig]:
        order += [name for name in inspect.get_annotations(cls) if name in fields and name not in order]
    return [fields[name] for name in order]


def _cli_type(declared: Any, multiple: bool) -> Any:
    if multiple:
        return Optional[List[str]]
    members = set(typing.get_args(declared)) or {declared}
    for kind in (bool, int, float):
        if kind in members:
            return Optional[kind]
    return Optional[str]


def _default_flags(name: str, kind: Any) -> tuple[str, ...]:
    flag = "--" + name.replace("_", "-")
    return (f"{flag}/--no-{name.replace('_', '-')}",) if kind == Optional[bool] else (flag,)


def is_switch(field: dataclasses.Field) -> bool:
    """A switch without a ``--no-`` form (``--resume``): not giving it leaves the config file's value."""
    flags = field.metadata.get("flags") or ()
    return isinstance(field.default, bool) and bool(flags) and "/" not in flags[0]


def _flag_value(value: Any, switch: bool) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value] or None
    if switch:
        return value or None
    return value


def training_config(build: Callable[..., Any], config: Optional[Path], flags: Mapping[str, Any]) -> Any:
    """A training command's run settings: ``build(file values, flags, where=)`` over the ``--config`` file, its
    collection resolved (a name, from the flag or the file)."""
    run_config = build(load_file(config), flags, where=str(config or "config"))
    run_config.data = resolve_data(run_config.data)
    return run_config


def load_file(path: Optional[Path]) -> dict:
    """The values of a ``--config`` YAML/JSON file ({} without one)."""
    return {} if path is None else load_config_file(path)


def resolve_data(data: Optional[str]) -> Optional[str]:
    """A ``--data`` collection name or path, resolved (:func:`pretrieve.data.registry.resolve_collection`)."""
    return None if not data else str(resolve_collection(data))
