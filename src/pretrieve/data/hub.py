"""Collections by name from the Hugging Face Hub (``datasets``) and from ir_datasets, written once into the user
cache in BEIR layout, so that every command reads them as it reads any collection (its Arrow datasets are then
built by :mod:`pretrieve.data.arrow` as for a local one).

Which names (:func:`hub_source`, used by the one resolver, :func:`pretrieve.data.registry.resolve_collections`,
only for a name that is neither a local directory nor a collection of pretrieve's own registry):

* **Hub datasets**: ``BeIR/<name>`` and ``mteb/<name>`` as they are, any other ``owner/name`` as ``hf:owner/name``.
  The layout BEIR and MTEB publish: a ``corpus`` config (``_id``, ``title``, ``text``) and a ``queries`` config
  (``_id``, ``text``), and the judgments (``query-id``, ``corpus-id``, ``score``, one split each) either in the
  repository's ``default`` config (MTEB) or in the repository ``<owner>/<name>-qrels`` (BEIR). MTEB's ``id``
  column is read where ``_id`` is absent. Read with ``datasets.load_dataset(..., streaming=True)``: rows are
  written as they arrive, nothing is held, and no copy is left in the ``datasets`` cache. A repository that needs
  its own loading code is refused (``trust_remote_code`` is never passed).
* **ir_datasets ids** (``beir/scifact``, ``beir/scifact/test``, ``msmarco-passage/dev/small`` …: any id of
  ``ir_datasets.registry``; ``irds:ID`` forces it): written by :func:`pretrieve.data.convert.convert`. The split of
  an id with judgments is its path below the collection (the shortest registered ancestor with documents):
  ``beir/scifact/test`` → ``test``, ``msmarco-passage/dev/small`` → ``dev-small``, an id that is itself the
  collection → ``test``; an id without judgments (``beir/scifact``) takes every registered id below it that has
  them (``train``, ``test``).

Where: ``<user cache>/collections/hub/<name with / as -->`` (:func:`~pretrieve.data.records.default_cache_dir`;
``PRETRIEVE_CACHE`` moves it), written atomically with a ``source.json`` saying where it came from; a collection
is fetched once and then found there with no network. Offline (``PRETRIEVE_OFFLINE``, ``HF_HUB_OFFLINE``,
``HF_DATASETS_OFFLINE``) or without network, a collection not yet fetched is one line naming what to fetch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from pretrieve import models   # the module, not its names: models imports the data package, which imports this
from pretrieve.data.convert import convert
from pretrieve.data.jsonl import write_jsonl
from pretrieve.data.records import default_cache_dir
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import atomic_dir

#: Hub organisations whose ``owner/name`` is a collection without the ``hf:`` prefix.
HUB_OWNERS = ("BeIR", "mteb")
HUB_DIR = "hub"
SOURCE_FILE = "source.json"
OFFLINE_ENVS = ("PRETRIEVE_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class HubSource:
    """A collection name that lives on the Hugging Face Hub (``kind="hf"``) or in ir_datasets (``"irds"``)."""

    kind: str
    id: str

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"

    def cache_dir(self, cache_dir: str | Path | None = None) -> Path:
        """``<cache>/hub/<kind>--<id with / as -->`` (``cache``: the collections cache)."""
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return root / HUB_DIR / f"{self.kind}--{self.id.replace('/', '--')}"


def hub_source(name: str) -> HubSource | None:
    """The Hub or ir_datasets source a collection name denotes (module docstring), else None."""
    text = str(name)
    if text.startswith("hf:"):
        return HubSource("hf", text[3:]) if _HUB_ID.match(text[3:]) else None
    if text.startswith("irds:"):
        return HubSource("irds", text[5:]) if text[5:] else None
    if text.startswith((".", "~", "/")) or os.sep != "/" and text.startswith(os.sep):
        return None
    if _HUB_ID.match(text) and text.split("/", 1)[0] in HUB_OWNERS:
        return HubSource("hf", text)
    if text in _irds_ids():
        return HubSource("irds", text)
    return None


def hub_names() -> list[str]:
    """The ir_datasets ids this installation knows (for "did you mean"; empty without ir_datasets)."""
    return sorted(_irds_ids())


def _irds_ids() -> set[str]:
    try:
        import ir_datasets  # optional: ir_datasets — comes with ranx; ~0.3 s, only for a name not found locally
    except ImportError:
        return set()
    return set(ir_datasets.registry)


def fetch(source: HubSource, cache_dir: str | Path | None = None) -> Path:
    """The BEIR-layout directory of ``source`` in the cache, written there first when absent (module docstring)."""
    target = source.cache_dir(cache_dir)
    if (target / "corpus.jsonl").is_file():
        return target
    offline = next((env for env in OFFLINE_ENVS if os.environ.get(env, "").strip() not in ("", "0")), None)
    what = _what_to_fetch(source)
    if offline is None and source.kind == "hf" and dataset_location(source.id) == source.id:
        offline = models.hub_unreachable_reason()   # fail in 3 s, not after huggingface_hub's five retries
    if offline:
        cause = f"{offline} is set" if offline in OFFLINE_ENVS else f"the Hugging Face Hub cannot be reached ({offline})"
        raise InputError(f"collection '{source.id}' is not in the cache ({target}) and {cause}: fetch {what} once "
                         f"with network (`pretrieve data download {source.name}`)")
    try:
        with atomic_dir(target) as tmp:
            if source.kind == "irds":
                _write_irds(source.id, tmp)
            else:
                _write_hub(source.id, tmp)
            (tmp / SOURCE_FILE).write_text(json.dumps({"kind": source.kind, "id": source.id}) + "\n",
                                           encoding="utf-8")
    except (InputError, ConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - network, hub and format errors of two libraries: one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"could not fetch collection '{source.id}' ({type(exc).__name__}: {reason[:200]}); "
                         f"fetch {what} once with network (`pretrieve data download {source.name}`), or pass a "
                         "local path to a BEIR-layout directory") from None
    return target


def _what_to_fetch(source: HubSource) -> str:
    if source.kind == "irds":
        return f"the ir_datasets collection '{source.id}'"
    return (f"the Hub datasets '{source.id}' (configs corpus, queries) and its judgments ('default' config or "
            f"'{source.id}-qrels')")


# ------------------------------------------------------------------------------------------------ the Hub
def dataset_location(repo: str) -> str:
    """What ``datasets.load_dataset`` is given for the Hub repository ``repo`` (the id itself; tests point it at a
    local copy in the Hub layout)."""
    return repo


def _load(repo: str, config: str | None = None) -> Any:
    """``{split: IterableDataset}`` of one config of ``repo``, streamed (no remote code)."""
    import datasets  # lazy: datasets

    return datasets.load_dataset(dataset_location(repo), config, streaming=True)


def _config_names(repo: str) -> list[str]:
    import datasets  # lazy: datasets

    return list(datasets.get_dataset_config_names(dataset_location(repo)))


def _only_split(splits: Any, repo: str, config: str) -> Iterable[dict]:
    names = list(splits)
    if config in names:
        return splits[config]
    if len(names) != 1:
        raise InputError(f"Hub dataset '{repo}' config '{config}' has splits {', '.join(names)}; expected one")
    return splits[names[0]]


def _id_of(row: dict, repo: str, config: str) -> str:
    value = row.get("_id", row.get("id"))
    if value is None:
        raise InputError(f"Hub dataset '{repo}' config '{config}': a row without '_id' (columns: "
                         f"{', '.join(row)})")
    return str(value)


def _write_hub(repo: str, out: Path) -> None:
    configs = _config_names(repo)
    missing = [c for c in ("corpus", "queries") if c not in configs]
    if missing:
        raise InputError(f"Hub dataset '{repo}' has no {' or '.join(missing)} config (configs: "
                         f"{', '.join(configs) or 'none'}); a collection needs corpus, queries and judgments")
    qrels = _load(repo, "default") if "default" in configs else _load(f"{repo}-qrels")
    write_jsonl(out / "corpus.jsonl", (
        {"_id": _id_of(row, repo, "corpus"), "title": row.get("title") or "", "text": row.get("text") or ""}
        for row in _only_split(_load(repo, "corpus"), repo, "corpus")))
    write_jsonl(out / "queries.jsonl", (
        {"_id": _id_of(row, repo, "queries"), "text": row.get("text") or ""}
        for row in _only_split(_load(repo, "queries"), repo, "queries")))
    (out / "qrels").mkdir()
    for split, rows in qrels.items():
        with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            for row in rows:
                handle.write(f"{row['query-id']}\t{row['corpus-id']}\t{int(row['score'])}\n")


# ------------------------------------------------------------------------------------------- ir_datasets
def irds_splits(dataset_id: str, registered: Iterable[str], has_qrels) -> dict[str, str]:
    """``{split: id}`` of the judged ids a collection id stands for (module docstring); ``has_qrels(id)``."""
    registered = set(registered)
    parts = dataset_id.split("/")
    root = next("/".join(parts[:n]) for n in range(1, len(parts) + 1) if "/".join(parts[:n]) in registered)
    if has_qrels(dataset_id):
        split = dataset_id[len(root) + 1:].replace("/", "-") if dataset_id != root else "test"
        return {split: dataset_id}
    below = sorted(i for i in registered if i.startswith(dataset_id + "/") and has_qrels(i))
    return {i[len(dataset_id) + 1:].replace("/", "-"): i for i in below}


@contextlib.contextmanager
def _quiet_irds() -> Iterator[None]:
    """While pretrieve fetches through ir_datasets: its log handlers (its own, not propagated) show WARNING and
    above only, and its tqdm bars only on a terminal (a log file gets no ``\\r`` frames; pretrieve.progress)."""
    from ir_datasets import lazy_libs  # optional: ir_datasets
    from ir_datasets.log import TqdmHandler  # optional: ir_datasets

    tqdm_module = lazy_libs.tqdm()
    terminal = sys.stderr.isatty()

    class QuietTqdm(tqdm_module.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = kwargs.get("disable", False) or not terminal
            super().__init__(*args, **kwargs)

    original_emit, original_tqdm = TqdmHandler.emit, lazy_libs.tqdm
    TqdmHandler.emit = lambda handler, record: (original_emit(handler, record)
                                                if record.levelno >= logging.WARNING else None)
    lazy_libs.tqdm = lambda: type("tqdm_module", (), {"tqdm": QuietTqdm})
    try:
        yield
    finally:
        TqdmHandler.emit, lazy_libs.tqdm = original_emit, original_tqdm


def _write_irds(dataset_id: str, out: Path) -> None:
    with _quiet_irds():
        _write_irds_collection(dataset_id, out)


def _write_irds_collection(dataset_id: str, out: Path) -> None:
    import ir_datasets  # optional: ir_datasets

    def has_qrels(i: str) -> bool:
        return ir_datasets.load(i).has_qrels()

    splits = irds_splits(dataset_id, ir_datasets.registry, has_qrels)
    if not ir_datasets.load(dataset_id).has_docs() or not splits:
        raise InputError(f"ir_datasets '{dataset_id}' is not a collection: it needs documents and judgments "
                         f"(documents: {ir_datasets.load(dataset_id).has_docs()}, judged ids: {len(splits)})")
    specs = [f"{i}={split}" for split, i in splits.items()]
    if dataset_id not in splits.values():   # the collection's own documents and queries first
        specs.insert(0, dataset_id)
    convert(out, ir_datasets=specs)
