"""The recipe's dev split: training queries held out from fine-tuning and mining, on which fusion weights are fitted
and the final model is chosen (issue 21; docs/preregistration.md, section B).

A recipe's top-level ``dev``::

    dev: {seed: 0}              # 10 % of the training queries (at least 20, at most 100), seeded
    dev: {queries: 100, seed: 0}   # exactly 100 (at most 100 of the collection's own dev split)
    dev: {split: dev}           # the collection's own dev split, all of it (nothing carved or drawn)

Which queries (:func:`prepare_dev`, by :func:`pretrieve.data.folds.held_out_dev`): when the training collection
ships its own ``dev`` split (MS MARCO, FiQA, HotpotQA, …), the dev queries are a seeded draw of at most that many of
its queries (all of them when it has fewer; none that is also judged in the training split) and the training split
stays whole; otherwise that many are carved out of the training split, which keeps the rest. The size is the
recipe's (the default: 10 % of the training split's queries, at least 20, at most 100). Either way
:func:`prepare_dev` writes the derived collection ``<out>/dev-split/<data name>`` (nothing is written into the
collection's own directory): its ``dev`` qrels are the dev queries, and every stage of the recipe then reads the
training collection from there — fine-tuning and mining see only the training split, the ``fuse`` and ``select``
stages fit and choose on ``dev`` by default (a fit of a fine-tuned retriever's weights on a split a stage trained on
is refused before anything runs: :func:`pretrieve.recipe.stages.fuse.needs`). The derived collection keeps the
source's directory name, so run files and result rows are named as before, and its ``folds.json`` records the seed
and every split's query ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pretrieve.data.collection import BeirCollection
from pretrieve.data.folds import DEV, RECORD, has_own_dev, held_out_dev
from pretrieve.errors import ConfigError, InputError
from pretrieve.options import join_path, validate

#: The pre-registered default size: this share of the training queries, within these bounds.
DEFAULT_SHARE, DEFAULT_MIN, DEFAULT_MAX = 0.10, 20, 100
DEV_PART = DEV


@dataclass
class DevOptions:
    """The recipe's ``dev``: ``queries`` carved from the training split (None: the default size, :func:`dev_size`)
    with ``seed``, or the collection's own ``split``."""

    queries: int | None = None
    seed: int = 0
    split: str | None = None


def validate_dev(values: Any, recipe: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The checked ``dev`` option (None: no dev split)."""
    if values is None:
        return None
    at = join_path(where, "dev")
    dev = validate(DevOptions, values, at)
    if dev.get("split") is not None and dev.get("queries") is not None:
        raise InputError("give either 'split' (the collection's own dev split) or 'queries' (carved), not both",
                         path=at)
    if dev.get("queries") is not None and dev["queries"] < 1:
        raise InputError(f"queries must be >= 1, got {dev['queries']}", path=at, field="queries")
    if dev.get("split") in ("test", training_split(recipe)):
        raise InputError(f"split '{dev['split']}' cannot be the dev split (it is the test or the training split)",
                         path=at, field="split")
    return dev


def training_split(recipe: Mapping[str, Any]) -> str:
    """The split fine-tuning reads (the recipe's shared ``finetune.split``, default ``train``)."""
    return str((recipe.get("finetune") or {}).get("split") or "train")


def dev_split(recipe: Mapping[str, Any]) -> str | None:
    """The name of the recipe's dev split in its training collection (None: no dev split)."""
    dev = recipe.get("dev")
    if dev is None:
        return None
    return str(dev.get("split") or DEV_PART)


def dev_size(n_train: int) -> int:
    """The pre-registered default: 10 % of ``n_train`` training queries, at least 20, at most 100."""
    return min(DEFAULT_MAX, max(DEFAULT_MIN, round(DEFAULT_SHARE * n_train)))


def prepare_dev(recipe: Mapping[str, Any], data: Path, out: Path) -> tuple[Path, dict[str, Any] | None]:
    """The training collection the stages read and the record of the dev split (None without ``dev``).

    ``dev: {seed}`` and ``dev: {queries, seed}`` write (or reuse, when current) ``<out>/dev-split/<data name>``
    (module docstring: drawn from the collection's own ``dev`` split when it has one, else carved from training);
    ``dev: {split}`` is only checked to exist."""
    dev = recipe.get("dev")
    if dev is None:
        return data, None
    train = training_split(recipe)
    collection = BeirCollection(data)
    if dev.get("split"):
        split = str(dev["split"])
        if split not in collection.splits():
            raise ConfigError(f"dev.split: collection {data} has no '{split}' split "
                              f"(has: {', '.join(collection.splits())})")
        return data, {"split": split, "queries": len(collection.load_qrels(split)), "carved": False}
    if train not in collection.splits():
        raise ConfigError(f"collection {data} has no '{train}' split to fine-tune on "
                          f"(has: {', '.join(collection.splits())})")
    n_train = len(collection.load_qrels(train))
    size = int(dev["queries"]) if dev.get("queries") is not None else dev_size(n_train)
    seed = int(dev.get("seed", 0))
    own = has_own_dev(data, train)
    if size >= n_train and not own:
        raise ConfigError(f"dev.queries: carving {size} dev queries out of the {n_train} '{train}' queries of {data} "
                          "leaves none to fine-tune on")
    derived = held_out_dev(data, out / "dev-split" / data.name, size, seed=seed, train=train)
    if not own:
        return derived, {"split": DEV_PART, "queries": size, "carved": True, "carved_from": train, "of": n_train,
                         "seed": seed, "collection": str(derived)}
    record = json.loads((derived / RECORD).read_text(encoding="utf-8"))
    return derived, {"split": DEV_PART, "queries": len(record["queries"][DEV_PART]), "carved": False,
                     "drawn_from": DEV_PART, "of": record["of"], "size": size, "seed": seed,
                     "also_in_train": len(record["also_in_train"]), "collection": str(derived)}


def dev_line(record: Mapping[str, Any] | None) -> list[str]:
    """``results.md``'s sentence on the dev split."""
    if not record:
        return []
    if record.get("carved"):
        text = (f"Dev split: {record['queries']} of the {record['of']} `{record['carved_from']}` queries "
                f"(seed {record['seed']}; ids in `dev-split/*/folds.json`), never fine-tuned or mined on")
    elif record.get("drawn_from"):
        left_out = (f"; {record['also_in_train']} also judged in the training split left out"
                    if record.get("also_in_train") else "")
        text = (f"Dev split: {record['queries']} of the {record['of']} queries of the collection's own "
                f"`{record['drawn_from']}` split (seed {record['seed']}; ids in `dev-split/*/folds.json`{left_out}), "
                "never fine-tuned or mined on")
    else:
        text = f"Dev split: the collection's own `{record['split']}` split ({record['queries']} queries)"
    return [text + "; fusion weights are fitted and the final model chosen on them.", ""]
