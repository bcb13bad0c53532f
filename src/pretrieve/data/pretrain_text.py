"""Pre-training text: read passages from a BEIR corpus, a JSONL file or plain text, tokenize them once
and cache the token ids on disk as a numpy memmap.

Sources (:func:`iter_pretrain_texts`):

* a BEIR collection directory or its ``corpus.jsonl`` — each passage is ``title + " " + text``;
* any other ``.jsonl`` file — the field ``text`` (plus ``title`` when present);
* a plain text file — one passage per non-blank line.

Chunking: each passage is tokenized without special tokens and cut into consecutive chunks of
``max_len - 2`` tokens; ``[CLS] chunk [SEP]`` (the tokenizer's own cls/sep, e.g. ``<s>``/``</s>`` for
RoBERTa) is one training example. A trailing chunk shorter than ``min_chunk`` tokens is dropped unless
it is the whole passage. (RetroMAE's pre-processing packs sentences up to the maximum length; for
passage corpora such as MS MARCO (max-len 144) and SciFact almost every passage is one chunk.)

Cache layout (``cache_dir/<key>/``): ``tokens.npy`` (flat uint16/uint32 ids), ``offsets.npy`` (int64,
``n_chunks + 1``), ``meta.json``. The key hashes the source path, size and mtime, the tokenizer's
vocabulary and ``max_len``, so a changed corpus or tokenizer is re-tokenized. Tokens are streamed to
disk in batches, so a million-passage corpus never sits in memory as Python lists.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from pretrieve.data.beir import iter_corpus, join_title
from pretrieve.data.jsonl import iter_jsonl, open_text, require_str
from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_dir, write_json

TOKENIZE_BATCH = 1000


def resolve_text_source(path: str | Path) -> tuple[Path, str]:
    """Return ``(file, kind)`` with kind ``beir`` | ``jsonl`` | ``text`` for a pre-training source."""
    path = Path(path)
    if path.is_dir():
        for name in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (path / name).exists():
                return path / name, "beir"
        raise InputError("directory has no corpus.jsonl (expected a BEIR collection)", path=path)
    if not path.exists():
        raise InputError("pre-training corpus not found", path=path)
    name = path.name.removesuffix(".gz")
    if name == "corpus.jsonl":
        return path, "beir"
    if name.endswith(".jsonl") or name.endswith(".json"):
        return path, "jsonl"
    return path, "text"


def iter_pretrain_texts(path: str | Path) -> Iterator[str]:
    """Stream the passages of a pre-training source (see the module docstring)."""
    file, kind = resolve_text_source(path)
    if kind == "beir":
        first_line: dict[str, int] = {}
        for line_no, doc in iter_corpus(file):
            seen = first_line.setdefault(doc.id, line_no)
            if seen != line_no:   # as every other reader of a corpus refuses them
                raise InputError(f"duplicate document id '{doc.id}' (first seen on line {seen})", path=file,
                                 line=line_no, field="_id")
            yield doc.full_text()
    elif kind == "jsonl":
        for line_no, obj in iter_jsonl(file):
            text = require_str(obj, "text", file, line_no)
            title = require_str(obj, "title", file, line_no, default="")
            yield join_title(title, text)
    else:
        with open_text(file) as handle:
            for line in handle:
                if line.strip():
                    yield line.strip()


@dataclass
class TokenizedCorpus:
    """Token ids of every chunk, memory-mapped: ``corpus[i]`` is ``{"input_ids": [cls, ..., sep]}``."""

    tokens: np.ndarray
    offsets: np.ndarray
    cls_id: int
    sep_id: int
    meta: dict

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return {"input_ids": [self.cls_id, *self.tokens[start:end].tolist(), self.sep_id]}

    def lengths(self) -> np.ndarray:
        """Length of each example including the two special tokens."""
        return np.diff(self.offsets) + 2

    @classmethod
    def build(cls, source: str | Path, tokenizer, max_len: int, cache_dir: str | Path,
              min_chunk: int = 8, show_progress: bool = True) -> "TokenizedCorpus":
        """Tokenize ``source`` once (or reuse the cache) and memory-map the result."""
        if max_len < 8:
            raise InputError(f"max_len must be at least 8, got {max_len}", field="max_len")
        file, kind = resolve_text_source(source)
        key = _cache_key(file, tokenizer, max_len, min_chunk)
        target = Path(cache_dir) / key
        if not (target / "meta.json").exists():
            with atomic_dir(target) as tmp:
                meta = _tokenize_to(tmp, source, tokenizer, max_len, min_chunk, show_progress)
                meta.update({"source": str(file), "kind": kind, "max_len": max_len, "min_chunk": min_chunk,
                             "tokenizer": getattr(tokenizer, "name_or_path", "")})
                write_json(tmp / "meta.json", meta)
        return cls.open(target, tokenizer)

    @classmethod
    def open(cls, directory: str | Path, tokenizer) -> "TokenizedCorpus":
        directory = Path(directory)
        meta = json.loads((directory / "meta.json").read_text())
        tokens = np.load(directory / "tokens.npy", mmap_mode="r")
        offsets = np.load(directory / "offsets.npy")
        return cls(tokens, offsets, _special_id(tokenizer, "cls"), _special_id(tokenizer, "sep"), meta)


def _special_id(tokenizer, kind: str) -> int:
    value = getattr(tokenizer, f"{kind}_token_id", None)
    if value is None:
        fallback = "bos" if kind == "cls" else "eos"
        value = getattr(tokenizer, f"{fallback}_token_id", None)
    if value is None:
        raise InputError(f"tokenizer has no {kind} token", field="tokenizer")
    return int(value)


def _cache_key(file: Path, tokenizer, max_len: int, min_chunk: int) -> str:
    stat = file.stat()
    vocab = tokenizer.get_vocab()
    vocab_hash = hashlib.sha1(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:12]
    raw = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{vocab_hash}|{max_len}|{min_chunk}|v1"
    return f"{file.parent.name}-{file.stem}-L{max_len}-{hashlib.sha1(raw.encode()).hexdigest()[:16]}"


def _chunks(ids: list[int], size: int, min_chunk: int) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        piece = ids[start:start + size]
        if start == 0 or len(piece) >= min_chunk:
            yield piece


def _tokenize_to(directory: Path, source, tokenizer, max_len: int, min_chunk: int, show_progress: bool) -> dict:
    """Stream-tokenize ``source`` into ``tokens.npy``/``offsets.npy`` inside ``directory``."""
    from tqdm.auto import tqdm

    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32
    raw_path = directory / "tokens.bin"
    offsets = [0]
    passages = 0
    with open(raw_path, "wb") as raw:
        batch: list[str] = []
        progress = tqdm(desc="tokenizing", unit=" passages", disable=not show_progress)

        def flush() -> None:
            encoded = tokenizer(batch, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
            for ids in encoded:
                for piece in _chunks(ids, max_len - 2, min_chunk):
                    if piece:
                        np.asarray(piece, dtype=dtype).tofile(raw)
                        offsets.append(offsets[-1] + len(piece))
            progress.update(len(batch))
            batch.clear()

        for text in iter_pretrain_texts(source):
            batch.append(text)
            passages += 1
            if len(batch) >= TOKENIZE_BATCH:
                flush()
        if batch:
            flush()
        progress.close()
    if len(offsets) == 1:
        raise InputError("pre-training corpus contains no text", path=str(source))
    tokens = np.fromfile(raw_path, dtype=dtype)
    np.save(directory / "tokens.npy", tokens)
    raw_path.unlink()
    np.save(directory / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    return {"passages": passages, "chunks": len(offsets) - 1, "tokens": int(offsets[-1]), "dtype": str(np.dtype(dtype))}
