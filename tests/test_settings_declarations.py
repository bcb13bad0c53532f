"""Every training default is written once, in :mod:`pretrieve.train.settings`, and what users see agrees with it.

:func:`disagreements` derives from the declarations what each place should expose and lists where it does not: the
options of ``pretrain``, ``finetune`` and ``reranker train`` (flag present, None unless given, help text and shown
default as declared), the recipe's stage schemas and top-level seed, the ``--smoke`` caps (caps below the declared
default, never a restated default) and the Python API's keyword defaults. The planted-disagreement tests check that
the check fails when one place drifts.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re

import pytest
import typer.main
from typer.testing import CliRunner

import pretrieve
from pretrieve.cli import app
from pretrieve.recipe.schema import STAGES, RecipeOptions
from pretrieve.train import settings as declared
from pretrieve.train.settings import (FinetuneSettings, LoopConfig, PretrainOptions, PretrainSettings,
                                      RerankerSettings)

#: Command → the settings its options declare.
COMMANDS = {("pretrain",): PretrainOptions, ("finetune",): FinetuneSettings, ("reranker", "train"): RerankerSettings}
#: Command parameters that are not settings.
NOT_SETTINGS = {"config", "help"}
#: Recipe stage kind → the declaration its options extend.
STAGE_SETTINGS = {"pretrain": PretrainOptions, "finetune": FinetuneSettings, "reranker": RerankerSettings}
#: API function → the declaration its keyword arguments (and ``**settings``) take.
API = {"pretrain": PretrainSettings, "finetune": FinetuneSettings}


def expected_shown(field: dataclasses.Field):
    """What ``--help`` must show as the default of a declared setting."""
    meta = field.metadata
    if meta.get("shown") is not None:
        return meta["shown"]
    default = field.default
    if isinstance(default, bool):
        one_way = bool(meta.get("flags")) and "/" not in meta["flags"][0]
        return False if one_way else ("on" if default else "off")
    if default in ("", None) or default is dataclasses.MISSING:
        return False
    return f"{default:g}" if isinstance(default, float) else str(default)


def command(path: tuple[str, ...]):
    group = typer.main.get_command(app)
    for name in path:
        group = group.commands[name]
    return group


def cli_disagreements() -> list[str]:
    problems = []
    for path, schema in COMMANDS.items():
        where = " ".join(path)
        params = {p.name: p for p in command(path).params}
        fields = {f.name: f for f in dataclasses.fields(schema)}
        for name in set(params) - set(fields) - NOT_SETTINGS:
            problems.append(f"{where}: option {name} is no declared setting")
        for name, field in fields.items():
            if not field.metadata.get("cli", True):
                continue
            param = params.get(name)
            if param is None:
                problems.append(f"{where}: setting {name} has no option")
                continue
            if param.default is not None:
                problems.append(f"{where} {name}: default {param.default!r} (a config file's value would not stand)")
            if param.show_default != expected_shown(field):
                problems.append(f"{where} {name}: shows default {param.show_default!r}, declared "
                                f"{expected_shown(field)!r}")
            if not (param.help or "").startswith(field.metadata["help"]):
                problems.append(f"{where} {name}: help {param.help!r} is not the declared one")
    return problems


def recipe_disagreements() -> list[str]:
    problems = []
    for kind, base in STAGE_SETTINGS.items():
        schema = STAGES[kind].options
        base_defaults = {f.name: f.default for f in dataclasses.fields(base)}
        for field in dataclasses.fields(schema):
            if field.name in base_defaults and field.default != base_defaults[field.name]:
                problems.append(f"recipe stage {kind}.{field.name}: default {field.default!r}, declared "
                                f"{base_defaults[field.name]!r}")
    if RecipeOptions.seed != declared.default_of(LoopConfig, "seed"):
        problems.append(f"recipe seed: default {RecipeOptions.seed!r}, declared {declared.default_of(LoopConfig, 'seed')}")
    from pretrieve.recipe.stages import finetune, pretrain, reranker

    for kind, module in (("finetune", finetune), ("reranker", reranker), ("pretrain", pretrain)):
        schema = STAGE_SETTINGS[kind]
        for key, cap in module.SMOKE_CAPS.items():
            default = declared.default_of(schema, key)
            if not isinstance(cap, (int, float)) or isinstance(cap, bool) or not cap < default:
                problems.append(f"smoke cap {kind}.{key}: {cap!r} is not a cap below the declared default {default!r}")
    return problems


def api_disagreements() -> list[str]:
    problems = []
    for name, schema in API.items():
        signature = inspect.signature(getattr(pretrieve, name))
        fields = {f.name: f for f in dataclasses.fields(schema)}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
            problems.append(f"{name}(): takes no **settings")
        for parameter in signature.parameters.values():
            field = fields.get(parameter.name)
            if field is None or parameter.default is inspect.Parameter.empty:
                continue
            if parameter.default != field.default:
                problems.append(f"{name}({parameter.name}=): default {parameter.default!r}, declared {field.default!r}")
    return problems


def disagreements() -> list[str]:
    return cli_disagreements() + recipe_disagreements() + api_disagreements()


# ------------------------------------------------------------------------------------------------- the check
def test_every_cli_recipe_smoke_and_api_default_is_the_declared_one():
    assert disagreements() == []


def test_the_rendered_help_shows_each_trainers_declared_learning_rate():
    runner = CliRunner()
    for path, schema in COMMANDS.items():
        text = runner.invoke(app, [*path, "--help"], terminal_width=200).output
        flat = " ".join(text.replace("│", " ").split())
        lr = expected_shown({f.name: f for f in dataclasses.fields(schema)}["lr"])
        assert re.search(rf"--lr <float> Peak learning rate[^[]*\[default: \({re.escape(lr)}\)\]", flat), (path, flat)


def test_each_trainer_keeps_its_learning_rate_and_the_loop_declares_it_once():
    assert [declared.default_of(s, "lr") for s in (PretrainOptions, FinetuneSettings, RerankerSettings)] == \
        [1e-4, 2e-5, 3e-5]
    flags = {s.__name__: {f.name: f for f in dataclasses.fields(s)}["lr"].metadata["flags"]
             for s in (PretrainOptions, FinetuneSettings, RerankerSettings)}
    assert len(set(flags.values())) == 1   # one declaration (flags, check) with each trainer's own default


# ------------------------------------------------------------------------------------------------- the check fails
def _replace_default(monkeypatch, schema: type, name: str, default) -> None:
    field = copy.copy(schema.__dataclass_fields__[name])
    field.default = default
    monkeypatch.setitem(schema.__dataclass_fields__, name, field)


def test_a_cli_default_that_drifts_from_its_declaration_is_caught(monkeypatch):
    _replace_default(monkeypatch, FinetuneSettings, "lr", 5e-5)   # the CLI was built from 2e-5
    assert any(p.startswith("finetune lr: shows default '2e-05', declared '5e-05'") for p in disagreements())


def test_a_cli_help_that_drifts_is_caught(monkeypatch):
    field = copy.copy(RerankerSettings.__dataclass_fields__["num_negatives"])
    field.metadata = {**field.metadata, "help": "Negatives."}
    monkeypatch.setitem(RerankerSettings.__dataclass_fields__, "num_negatives", field)
    assert any(p.startswith("reranker train num_negatives: help") for p in disagreements())


def test_a_recipe_default_that_drifts_is_caught(monkeypatch):
    _replace_default(monkeypatch, STAGES["finetune"].options, "num_negatives", 5)
    assert "recipe stage finetune.num_negatives: default 5, declared 7" in disagreements()
    monkeypatch.setattr(RecipeOptions, "seed", 7)
    assert any(p.startswith("recipe seed: default 7") for p in disagreements())


def test_a_smoke_cap_that_restates_a_default_is_caught(monkeypatch):
    from pretrieve.recipe.stages import reranker

    monkeypatch.setitem(reranker.SMOKE_CAPS, "num_negatives", (7, 3))   # the old (default, cap) pair
    assert any(p.startswith("smoke cap reranker.num_negatives") for p in disagreements())


def test_an_api_default_that_drifts_is_caught(monkeypatch):
    _replace_default(monkeypatch, PretrainSettings, "method", "retromae")   # the API's signature says bow
    assert "pretrain(method=): default 'bow', declared 'retromae'" in disagreements()


@pytest.mark.parametrize("schema", [PretrainOptions, FinetuneSettings, RerankerSettings])
def test_every_setting_has_a_help_text(schema):
    assert [f.name for f in dataclasses.fields(schema) if not f.metadata.get("help")] == []
