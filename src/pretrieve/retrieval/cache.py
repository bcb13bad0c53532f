"""The user's embedding cache: a corpus (or a list of texts) encoded once per model, reused by every later call.

``pretrieve.search`` / ``pretrieve.encode`` and the recipe's search stages look here before encoding. An entry is
keyed by what the vectors depend on, by content, through the project's one freshness contract
(:mod:`pretrieve.artifacts`):

* the **model**: :func:`pretrieve.artifacts.fingerprint` of what the side that encodes reads — for a corpus, the
  passage tower's files (:meth:`Retriever.inputs <pretrieve.retrieval.load.Retriever.inputs>`: a model whose passage
  tower was kept frozen and copied byte for byte, as query-side fine-tuning saves it, finds the corpus vectors of
  the model it started from), else the local directory (offline aliases, fine-tuned models, downloaded snapshots),
  else its hub name;
* the **texts**: :func:`pretrieve.artifacts.fingerprint` of the corpus file (a collection's ``corpus.jsonl``), or
  the SHA-1 of a list of texts;
* the **settings** of the side that encodes them (:meth:`Retriever.settings <pretrieve.retrieval.load.Retriever.
  settings>`: kind, precision, pooling, length, prompt).

A corpus entry is an ordinary corpus index (:func:`pretrieve.retrieval.search.encode_corpus`): written atomically
with its sidecar, and reused only while :mod:`pretrieve.artifacts` certifies it (same weights, settings and
passages); otherwise it is re-encoded in place. The cache lives under the user cache directory
(:func:`pretrieve.data.records.user_cache_dir`: ``$PRETRIEVE_CACHE/embeddings``, default
``~/.cache/pretrieve/embeddings``), never inside a data folder; removing it is always safe.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pretrieve import artifacts
from pretrieve.data.records import user_cache_dir
from pretrieve.retrieval.index import is_current

logger = logging.getLogger(__name__)

EMBEDDINGS = "embeddings"
"""The folder of the user cache that holds corpus indexes and encoded texts."""
TEXTS_KIND = "encoded-texts"
MIN_CACHED_TEXTS = 256
"""``encode`` caches lists of at least this many texts (fewer are cheaper to encode than to look up)."""


def cache_root() -> Path:
    """``$PRETRIEVE_CACHE/embeddings`` (default ``~/.cache/pretrieve/embeddings``)."""
    return user_cache_dir(EMBEDDINGS)


def model_fingerprint(retriever: Any, side: str = "passage") -> str:
    """The content fingerprint of what ``side`` encodes with: the passage tower's files (passages, when known),
    else the model's local directory, else its hub name."""
    if side == "passage" and getattr(retriever, "passage_files", None) is not None:
        return artifacts.fingerprint(retriever.passage_files)
    return artifacts.fingerprint(retriever.path) if retriever.path is not None else str(retriever.name)


def _key(*parts: Any) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _label(retriever: Any) -> str:
    name = Path(str(retriever.name).rstrip("/")).name or "model"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:40]


def corpus_index_dir(retriever: Any, corpus_path: str | Path) -> Path:
    """Where the corpus index of ``retriever`` over the corpus file ``corpus_path`` is kept (see the module
    docstring): ``<cache>/embeddings/<model>-<key>``."""
    key = _key("corpus", model_fingerprint(retriever), artifacts.fingerprint(corpus_path), retriever.settings())[:20]
    # the key identifies the entry, the model's name only labels it: another model with the same passage tower
    # (query-side fine-tuning) finds the entry its base model made
    made = sorted(cache_root().glob(f"*-{key}")) if cache_root().is_dir() else []
    return made[0] if made else cache_root() / f"{_label(retriever)}-{key}"


def cached_index(retriever: Any, corpus: Any, corpus_path: str | Path) -> Path | None:
    """The cached corpus index of ``retriever`` over ``corpus`` (read from ``corpus_path``) when it is current, else
    None (nothing is encoded here)."""
    from pretrieve.retrieval.search import _index_record  # lazy: torch

    root = corpus_index_dir(retriever, corpus_path)
    if not root.is_dir():
        return None
    directory, settings, _ = _index_record(retriever, corpus, root, 0, 1)
    return root if is_current(directory, settings, retriever.inputs()).current else None


def texts_file(retriever: Any, side: str, texts: Sequence[str]) -> Path:
    """Where ``texts`` encoded by ``retriever``'s ``side`` are kept (a ``.npy`` file)."""
    digest = hashlib.sha1()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    settings = getattr(retriever, side).settings
    key = _key("texts", model_fingerprint(retriever, side), retriever.kind, retriever.precision, side, settings,
               digest.hexdigest())
    return cache_root() / "texts" / f"{_label(retriever)}-{side}-{key[:20]}.npy"


def load_texts(path: Path, count: int) -> np.ndarray | None:
    """The cached vectors at ``path`` when current (intact, ``count`` rows), else None."""
    if not artifacts.check(path, kind=TEXTS_KIND).current:
        return None
    vectors = np.load(path)
    return vectors if len(vectors) == count else None


def save_texts(path: Path, vectors: np.ndarray) -> None:
    """Keep ``vectors`` at ``path`` (atomically, with its sidecar)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with artifacts.write_file(path, TEXTS_KIND) as tmp:
        with open(tmp, "wb") as handle:
            np.save(handle, vectors)
