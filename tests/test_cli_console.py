"""The CLI's consoles print names as they are: ``fold test:train:`` is a fold's name, not rich's ``:train:`` emoji
(the claims harness printed 🚋 in its job lines before the consoles were made with ``emoji=False``)."""

from __future__ import annotations

import importlib

import pytest
from rich.console import Console

CONSOLES = [("pretrieve.cli", "console"), ("pretrieve.cli.bench", "err"), ("pretrieve.cli.analyze", "err"),
            ("pretrieve.cli.analyze", "out_console"), ("pretrieve.cli.stats", "err"),
            ("pretrieve.cli.stats", "out_console"), ("pretrieve.cli.data", "out"), ("pretrieve.cli.rerank", "err")]


@pytest.mark.parametrize("module,name", CONSOLES)
def test_console_prints_colon_names_verbatim(module: str, name: str) -> None:
    console: Console = getattr(importlib.import_module(module), name)
    with console.capture() as captured:
        console.print("[3/17] bow/seed2 fold test:train: fine-tuned", highlight=False, markup=False)
    assert captured.get().strip() == "[3/17] bow/seed2 fold test:train: fine-tuned"
