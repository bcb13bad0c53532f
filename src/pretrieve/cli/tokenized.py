"""The tokenised pre-training corpus of the command line's PMI commands (``stats pmi``, ``analyze masking-stats``,
``bench masking --kinds pmi``): tokenizer loading, the token cache directory, timed corpus loading and where the
n-gram statistics of a cached corpus lie.

Torch-free at import (every command module is imported for ``pretrieve --help``): transformers and the PMI masker
are imported when a helper runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from pretrieve.data.pretrain_text import TokenizedCorpus
from pretrieve.errors import InputError
from pretrieve.models import no_remote_code, resolve_model

DEFAULT_MAX_LEN = 144  # pretrieve pretrain's default: the same token cache key


def load_tokenizer(name: str) -> Any:
    """The tokenizer of a checkpoint directory or offline alias (``minilm``), as a clear error when absent."""
    from transformers import AutoTokenizer  # lazy: transformers

    path = resolve_model(name)
    try:
        return AutoTokenizer.from_pretrained(path, **no_remote_code(path))
    except (OSError, ValueError):
        raise InputError("no tokenizer found (give a checkpoint directory with its tokenizer, or an alias "
                         "such as minilm)", path=path) from None


def pretrain_cache_dir(override: Optional[Path]) -> Path:
    """``override``, else the directory where :func:`pretrieve.masking.pmi.resolve_statistics` caches token
    ids of text sources (``$PRETRIEVE_CACHE/pretrain`` or ``~/.cache/pretrieve/pretrain``)."""
    if override is not None:
        return override
    from pretrieve.masking.pmi import _default_cache_dir  # lazy: torch

    return _default_cache_dir()


def tokenized_corpus(corpus: str, tokenizer: Any, max_len: int, cache_dir: Optional[Path]) -> tuple[Any, float]:
    """``(TokenizedCorpus, seconds)``: the corpus tokenised into chunks of ``max_len`` (or read from the cache)."""
    start = time.perf_counter()
    data = TokenizedCorpus.build(corpus, tokenizer, max_len, pretrain_cache_dir(cache_dir), show_progress=False)
    return data, time.perf_counter() - start


def statistics_cache_path(corpus: Any, window: int) -> Optional[Path]:
    """Where :func:`pretrieve.masking.pmi.corpus_statistics` caches the statistics of a memory-mapped corpus
    (``<token cache dir>-pmi-L<window>``), or None for an in-memory corpus."""
    filename = getattr(corpus.tokens, "filename", None)
    if not filename:
        return None
    cache = Path(filename).parent
    return cache.with_name(f"{cache.name}-pmi-L{window}")
