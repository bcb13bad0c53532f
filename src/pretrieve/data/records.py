"""Records of a BEIR-layout collection, shared by every reader (the JSONL readers of :mod:`pretrieve.data.beir`,
the Arrow builders of :mod:`pretrieve.data.arrow`, the converters of :mod:`pretrieve.data.convert`):

* :class:`Document` and :func:`join_title` — a passage and the text every retriever indexes (title + text);
  :func:`title_separator` — what goes between them for a model: ``space`` (``title + " " + text``, the default) or
  ``sep`` (``title + tokenizer.sep_token + text``, the join of RetroMAE's ``preprocess.py`` and Tevatron's
  ``TrainPreProcessor``, which the BoW, DupMAE, CoT-MAE and CoT-MoTE authors fine-tuned with);
* :func:`parse_document` / :func:`parse_query` — one ``corpus.jsonl`` / ``queries.jsonl`` object, validated
  (an :class:`~pretrieve.errors.InputError` naming file, line and field), and :func:`duplicate_id_message`;
* :func:`collection_file` — ``corpus.jsonl`` / ``queries.jsonl`` of a collection directory (or its ``.gz``);
* :func:`default_cache_dir` — where downloaded collections are kept, and :func:`user_cache_dir` — pretrieve's user
  cache (``$PRETRIEVE_CACHE``, else ``$XDG_CACHE_HOME/pretrieve`` or ``~/.cache/pretrieve``), where every derived
  cache goes (Arrow datasets, corpus embeddings): never inside a data folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pretrieve.data.jsonl import require_str
from pretrieve.errors import InputError

_WHITESPACE = re.compile(r"\s")

CACHE_ENV = "PRETRIEVE_CACHE"


@dataclass(frozen=True)
class Document:
    """One passage of a corpus."""

    id: str
    title: str
    text: str

    def full_text(self, sep: str = " ") -> str:
        """Title and text joined, the input every retriever here indexes."""
        return join_title(self.title, self.text, sep)


def join_title(title: str, text: str, sep: str = " ") -> str:
    """``title + sep + text``, or just the text when the title is empty."""
    return f"{title}{sep}{text}" if title else text


#: How a model's passages join title and text: ``space`` = ``title + " " + text``; ``sep`` = ``title +
#: tokenizer.sep_token + text`` (RetroMAE's ``examples/msmarco/preprocess.py``, Tevatron's ``TrainPreProcessor``).
TITLE_JOINS = ("space", "sep")


def title_separator(join: str | None, tokenizer=None) -> str:
    """The string between title and text for ``join`` (:data:`TITLE_JOINS`; None = ``space``): ``" "``, or the
    tokenizer's separator token (``[SEP]`` for BERT and ELECTRA), which the tokenizer turns into its id."""
    if join in (None, "space"):
        return " "
    if join != "sep":
        raise ValueError(f"title_join must be one of {', '.join(TITLE_JOINS)}, got {join!r}")
    sep = getattr(tokenizer, "sep_token", None)
    if not sep:
        raise ValueError("title_join 'sep' needs a tokenizer with a separator token (sep_token)")
    return sep


def is_run_id(value: str) -> bool:
    """Whether ``value`` can be a query or document id of a TREC run (``qid Q0 docid rank score tag``, split on
    whitespace): non-empty, without a space, tab or newline."""
    return bool(value) and not _WHITESPACE.search(value)


def require_id(obj: dict, path: str | Path, line: int, kind: str = "document") -> str:
    """``obj["_id"]``, refused (a located :class:`InputError`) when empty or when no TREC run could hold it: found
    on reading, before anything is encoded or searched for it."""
    value = require_str(obj, "_id", path, line, allow_empty=False)
    if not is_run_id(value):
        raise InputError(f"{kind} id {value!r} contains whitespace, which a TREC run (split on whitespace) cannot "
                         "hold: rename it", path=path, line=line, field="_id")
    return value


def parse_document(obj: dict, path: str | Path, line: int) -> Document:
    """One ``corpus.jsonl`` object as a Document: ``_id`` (:func:`require_id`), ``title`` (optional), ``text``."""
    doc_id = require_id(obj, path, line)
    title = require_str(obj, "title", path, line, default="")
    text = require_str(obj, "text", path, line)
    return Document(doc_id, title, text)


def parse_query(obj: dict, path: str | Path, line: int) -> tuple[str, str]:
    """One ``queries.jsonl`` object as ``(query_id, text)``, both non-empty (the id: :func:`require_id`)."""
    return (require_id(obj, path, line, "query"),
            require_str(obj, "text", path, line, allow_empty=False))


def duplicate_id_message(kind: str, doc_id: str, first_line: int) -> str:
    """The error message of an id seen twice (``kind``: document | query), the same from every reader."""
    return f"duplicate {kind} id '{doc_id}' (first seen on line {first_line})"


def collection_file(root: Path, name: str) -> Path:
    """``root/name``, or ``root/name.gz`` when only that exists; :class:`InputError` when neither does."""
    path = root / name
    if path.exists():
        return path
    gz = root / f"{name}.gz"
    if gz.exists():
        return gz
    raise InputError(f"{name} not found in collection", path=root)


def user_cache_dir(*parts: str) -> Path:
    """pretrieve's user cache, ``$PRETRIEVE_CACHE`` or ``$XDG_CACHE_HOME/pretrieve`` (default
    ``~/.cache/pretrieve``), joined with ``parts``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser().joinpath(*parts)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base.joinpath("pretrieve", *parts)


def default_cache_dir() -> Path:
    """Where downloaded collections are kept: ``$PRETRIEVE_CACHE/collections`` or the XDG cache."""
    return user_cache_dir("collections")
