"""The install (issue 25): recipes shipped in the package and run by name, torch asked as a range, FAISS and the
offline models' packages through extras. The wheel itself is built, installed beside an existing torch and run by
scripts/check-wheel.sh (minutes; docs/install.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from pretrieve.errors import ConfigError, InputError
from pretrieve.models import OFFLINE_MODELS
from pretrieve.recipe import load_recipe
from pretrieve.recipe.schema import SHIPPED_RECIPES, find_recipe
from pretrieve.retrieval.index import dense

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements(lines: list[str]) -> dict[str, Requirement]:
    return {requirement.name: requirement for requirement in map(Requirement, lines)}


def test_the_shipped_recipes_are_the_checkouts_configs():
    """The package's configs/ (what package-data puts in the wheel) is the checkout's configs/."""
    assert sorted(p.name for p in SHIPPED_RECIPES.glob("*.yaml")) == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "configs/*.yaml" in package_data["pretrieve"]


def test_a_recipe_is_found_by_name_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_recipe("bow-msmarco") == SHIPPED_RECIPES / "bow-msmarco.yaml"
    assert load_recipe("bow-msmarco") == load_recipe(ROOT / "configs" / "bow-msmarco.yaml")
    (tmp_path / "bow-msmarco").write_text("a file of that name wins")
    assert find_recipe("bow-msmarco") == Path("bow-msmarco")
    assert find_recipe("mine.yaml") == Path("mine.yaml")            # a path stays a path (and fails as one)
    with pytest.raises(InputError, match=r"bow-msmarcoo: no such recipe file.*shipped: bow-beir, bow-msmarco, "):
        find_recipe("bow-msmarcoo")


def test_the_cli_names_the_shipped_recipes_for_an_unknown_name(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "scifact-cpuu"])
    assert result.exit_code != 0 and "shipped: " in str(result.exception)


def test_torch_is_a_range_and_faiss_an_extra():
    requirements = _requirements(PROJECT["dependencies"])
    torch = requirements["torch"].specifier
    assert not any(spec.operator in ("==", "===") for spec in torch), torch
    assert "2.13.0" in torch and "2.6.0" in torch and "2.5.0" not in torch   # transformers 5 needs torch >= 2.6
    assert not {"faiss-cpu", "faiss-gpu"} & set(requirements)   # a hard faiss-cpu would clobber a site's faiss-gpu
    extras = PROJECT["optional-dependencies"]
    assert set(_requirements(extras["faiss"])) == {"faiss-cpu"}
    assert set(_requirements(extras["faiss-gpu"])) == {"faiss-gpu"}


def test_one_extra_installs_every_offline_alias():
    extra = set(_requirements(PROJECT["optional-dependencies"]["models"]))
    assert {package for package, _ in OFFLINE_MODELS.values()} <= extra
    test = _requirements(PROJECT["optional-dependencies"]["test"])
    assert {"faiss", "models"} <= test["pretrieve"].extras


def test_search_without_faiss_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)   # what `import faiss` sees where no faiss package is installed
    with pytest.raises(ConfigError, match=r"pip install 'pretrieve\[faiss\]'.*'pretrieve\[faiss-gpu\]'"):
        dense.gpu_count()
