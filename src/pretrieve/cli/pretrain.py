"""``pretrieve pretrain``: retrieval-oriented pre-training with any method (preset, file or flags).

Its options are the declared pre-training settings (:class:`pretrieve.train.settings.PretrainOptions`, built by
:func:`pretrieve.cli.options.settings_command`); a ``--config`` YAML/JSON file gives any of them, flags override it.
"""

from __future__ import annotations

from typing import Any

import typer

from pretrieve.cli.options import ConfigFile, load_file, settings_command
from pretrieve.cli.root import app
from pretrieve.data.registry import resolve_corpus
from pretrieve.train.settings import PretrainOptions


@app.command("pretrain")
@settings_command(PretrainOptions)
def pretrain_command(config: ConfigFile = None, **settings: Any) -> None:
    """Pre-train an encoder; the result in OUT/final loads with AutoModel.from_pretrained."""
    from pretrieve.train.pretrainer import pretrain   # lazy: torch
    from pretrieve.train.run_config import build_pretrain_config  # lazy: torch

    corpus = settings.get("corpus")
    settings["corpus"] = corpus[0] if corpus and len(corpus) == 1 else corpus   # one source: as before
    run_config = build_pretrain_config(load_file(config), settings, {}, where=str(config or "config"))
    run_config.corpus = resolve_corpus(run_config.corpus)   # a collection name, from the flag or the file
    final = pretrain(run_config)
    typer.echo(f"pre-trained encoder: {final}")

