"""Pre-training text: where it comes from (:class:`TextSource`), and its token ids cached once on disk
(:class:`TokenizedCorpus`), built by several processes and read through a memory map.

Sources (``--corpus``; :func:`resolve_text_source`):

* a BEIR collection directory or its ``corpus.jsonl`` — each passage is ``title + " " + text``;
* any other ``.jsonl`` / ``.json`` file (``.gz`` too) — the field ``text`` (plus ``title`` when present);
* a plain text file — **one document per line**; blank lines are skipped (a file with one sentence per line and
  blank lines between documents, BERT's pre-training format, therefore gives one example per sentence: join
  each document's lines first);
* a ``datasets`` directory written by ``Dataset.save_to_disk`` (a ``DatasetDict`` directory: its ``train`` split,
  or ``DIR@SPLIT``), e.g. an Arrow corpus from :mod:`pretrieve.data.arrow`;
* ``hf:NAME[:CONFIG][@SPLIT]`` — ``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train")`` for users with
  internet access (e.g. ``hf:wikimedia/wikipedia:20231101.en`` or ``hf:bookcorpus/bookcorpus``, the corpora
  BERT and the retrieval-oriented pre-training papers used); downloaded once into the ``datasets`` cache.
  ``datasets`` sources need a ``text`` column (``title`` is prepended when present).

Several sources (``--corpus A,B``, ``--corpus A --corpus B``, ``corpus: [A, B]`` in a config or recipe;
:func:`split_corpus`) are **concatenated** in the order given — the chunks of A, then those of B — and the training
loop draws every epoch in a seeded random order over the whole: each source weighs by its number of chunks, as in
RetroMAE's pre-processing (``concatenate_datasets([bookcorpus, wikipedia])``, then a random sampler). The cache's
``meta.json`` records each source's passages, chunks, tokens and first chunk (``sources``).

Chunking: each passage is tokenized without special tokens and cut into consecutive chunks of ``max_len - 2``
tokens; ``[CLS] chunk [SEP]`` (the tokenizer's own cls/sep, e.g. ``<s>``/``</s>`` for RoBERTa) is one training
example. A trailing chunk shorter than ``min_chunk`` tokens is dropped unless it is the whole passage. For passage
corpora such as MS MARCO (max-len 144) and SciFact almost every passage is one chunk.

Packing (``packing``, the ``pack`` / ``pack_across`` / ``short_seq_prob`` settings of a pre-training run): each
passage is split into sentences and consecutive sentences are packed into examples of up to ``max_len - 2``
tokens, as the authors' pre-processing does for Wikipedia and BookCorpus (:mod:`pretrieve.data.packing`: the rule,
the sentence splitter, and why). A plain-text file is then read with its blank lines as document boundaries, so
BERT's format (one sentence per line, a blank line between documents) packs each document's lines when the file
is named in ``pack_across``.

Building (:meth:`TokenizedCorpus.build`): the source is cut into parts — byte ranges at line starts of a file,
contiguous row ranges of a dataset — and tokenized by ``num_proc`` processes
(:func:`pretrieve.data.parallel.run_parts`; default: one per 16 MB of input up to the CPUs; a ``.gz`` file is one
part), each streaming its token ids and chunk lengths to its own files; the parts are then joined into
``tokens.npy`` and ``offsets.npy`` with plain file writes. Nothing is held per passage, so memory does not grow with
the corpus, and the result is the same for any ``num_proc``.

Cache (``cache_dir/<name>-L<max_len>-<key>/``): ``tokens.npy`` (flat uint16/uint32 ids), ``offsets.npy`` (int64,
``n_chunks + 1``), ``meta.json``, written atomically through :mod:`pretrieve.artifacts` and reused only while
current: same format, ``max_len``, ``min_chunk`` and tokenizer vocabulary, same input content (the file's
fingerprint; for a ``datasets`` source, its Arrow files'). Both arrays are opened with ``np.load(mmap_mode="r")``:
a training process holds only the pages it reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pretrieve import artifacts
from pretrieve.data.beir import iter_corpus
from pretrieve.data.jsonl import _open_binary, iter_jsonl, iter_lines, require_str
from pretrieve.data.packing import Packer, Packing, document_key, split_sentences
from pretrieve.data.parallel import byte_ranges, located_in_part, part_count, resolve_num_proc, run_parts
from pretrieve.data.records import join_title, parse_document
from pretrieve.errors import InputError
from pretrieve.progress import Progress

logger = logging.getLogger(__name__)

TOKENIZE_BATCH = 1000
TOKEN_CACHE_KIND = "token-cache"
TOKEN_CACHE_FORMAT = "pretrieve-tokens/2"
HF_PREFIX = "hf:"
#: Rows of a ``datasets`` corpus per part (parts are spread over the processes).
DATASET_PART_ROWS = 1 << 20


# ---------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class TextSource:
    """A pre-training text source: ``kind`` ``beir`` | ``jsonl`` | ``text`` (``path`` is the file) or ``datasets``
    (``path`` is a ``save_to_disk`` directory, or ``name`` a hub dataset with ``config``)."""

    kind: str
    path: str = ""
    name: str = ""
    config: str | None = None
    split: str | None = None

    @property
    def is_file(self) -> bool:
        return self.kind != "datasets"

    @property
    def label(self) -> str:
        """A short name for cache directories and messages."""
        if self.is_file:
            file = Path(self.path)
            return f"{file.parent.name}-{file.name.split('.')[0]}"
        return (self.name or Path(self.path).name).replace("/", "-") + (f"-{self.config}" if self.config else "")

    def __str__(self) -> str:
        if self.name:
            config = f":{self.config}" if self.config else ""
            return HF_PREFIX + self.name + config + (f"@{self.split}" if self.split else "")
        return self.path + (f"@{self.split}" if self.split and not self.is_file else "")


def split_corpus(value: str | Path | TextSource | list | tuple) -> list[str | TextSource]:
    """The sources a corpus value names: a list as given, a comma-separated string split at its commas (unless
    the whole string is an existing path), anything else as one source."""
    if isinstance(value, (list, tuple)):
        items = [item for entry in value for item in split_corpus(entry)]
    elif isinstance(value, TextSource) or "," not in str(value) or Path(str(value)).exists():
        items = [value if isinstance(value, TextSource) else str(value)]
    else:
        items = [part.strip() for part in str(value).split(",")]
    if not items or any(not str(item) for item in items):
        raise InputError(f"empty pre-training corpus in {value!r} (expected SOURCE or SOURCE,SOURCE,...)",
                         field="corpus")
    return items


def resolve_text_sources(value: str | Path | TextSource | list | tuple) -> list[TextSource]:
    """Every :class:`TextSource` a corpus value names (:func:`split_corpus`), in order."""
    return [resolve_text_source(item) for item in split_corpus(value)]


def resolve_text_source(source: str | Path | TextSource) -> TextSource:
    """The :class:`TextSource` a ``--corpus`` value names (see the module docstring)."""
    if isinstance(source, TextSource):
        return source
    text = str(source)
    if text.startswith(HF_PREFIX):
        spec, _, split = text[len(HF_PREFIX):].partition("@")
        name, _, config = spec.partition(":")
        if not name:
            raise InputError("expected hf:NAME[:CONFIG][@SPLIT]", path=text)
        return TextSource("datasets", name=name, config=config or None, split=split or None)
    path, split = Path(text), None
    if not path.exists() and "@" in path.name:
        base, _, split = text.rpartition("@")
        path = Path(base)
    if path.is_dir():
        for name in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (path / name).exists():
                return TextSource("beir", str(path / name))
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            return TextSource("datasets", str(path), split=split)
        raise InputError("directory is neither a BEIR collection (no corpus.jsonl) nor a datasets directory "
                         "(no state.json / dataset_dict.json)", path=path)
    if not path.exists():
        raise InputError("pre-training corpus not found", path=path)
    name = path.name.removesuffix(".gz")
    if name == "corpus.jsonl":
        return TextSource("beir", str(path))
    if name.endswith(".jsonl") or name.endswith(".json"):
        return TextSource("jsonl", str(path))
    return TextSource("text", str(path))


def open_text_dataset(source: TextSource):
    """The ``datasets.Dataset`` of a ``datasets`` source (memory-mapped), checked to have a ``text`` column."""
    import datasets  # lazy: datasets

    if source.name:
        try:
            dataset = datasets.load_dataset(source.name, source.config, split=source.split or "train")
        except Exception as exc:  # noqa: BLE001 - offline, unknown name, missing config: one clear line
            raise InputError(f"cannot load the dataset ({type(exc).__name__}: {exc})", path=str(source)) from None
    else:
        dataset = datasets.load_from_disk(source.path)
        if isinstance(dataset, datasets.DatasetDict):
            split = source.split or "train"
            if split not in dataset:
                raise InputError(f"no split '{split}' (available: {', '.join(dataset)}); name one as DIR@SPLIT",
                                 path=source.path)
            dataset = dataset[split]
    if "text" not in dataset.column_names:
        raise InputError(f"dataset has no 'text' column (columns: {', '.join(dataset.column_names)})",
                         path=str(source), field="text")
    return dataset


def iter_pretrain_texts(source: str | Path | TextSource, start: int = 0, end: int | None = None,
                        keep_blank: bool = False) -> Iterator[str]:
    """Stream the passages of a pre-training source (see the module docstring); ``start``/``end`` select a part:
    a byte range of a file (at line starts) or a row range of a dataset. ``keep_blank``: a blank line of a plain
    text file is an empty passage (a document boundary to packing) instead of skipped."""
    source = resolve_text_source(source)
    if source.kind == "beir":
        first_line: dict[str, int] = {}   # duplicates within this part (a part of a parallel build holds its own)
        for line_no, doc in _iter_beir(source.path, start, end):
            seen = first_line.setdefault(doc.id, line_no)
            if seen != line_no:   # as every other reader of a corpus refuses them
                raise InputError(f"duplicate document id '{doc.id}' (first seen on line {seen})", path=source.path,
                                 line=line_no, field="_id")
            yield doc.full_text()
    elif source.kind == "jsonl":
        for line_no, obj in iter_jsonl(source.path, start, end):
            text = require_str(obj, "text", source.path, line_no)
            title = require_str(obj, "title", source.path, line_no, default="")
            yield join_title(title, text)
    elif source.kind == "text":
        for _, line in iter_lines(source.path, start, end):
            if line.strip() or keep_blank:
                yield line.strip()
    else:
        yield from _iter_dataset_texts(open_text_dataset(source), str(source), start, end)


def _iter_beir(path: str, start: int, end: int | None):
    if not start and end is None:
        yield from iter_corpus(path)
        return
    for line_no, obj in iter_jsonl(path, start, end):
        yield line_no, parse_document(obj, path, line_no)


def _iter_dataset_texts(dataset, where: str, start: int, end: int | None) -> Iterator[str]:
    end = len(dataset) if end is None else end
    columns = ["text", "title"] if "title" in dataset.column_names else ["text"]
    view = dataset.select_columns(columns).select(range(start, end))
    row = start
    for batch in view.iter(batch_size=TOKENIZE_BATCH):
        titles = batch.get("title") or [None] * len(batch["text"])
        for text, title in zip(batch["text"], titles):
            if not isinstance(text, str):
                raise InputError(f"row {row}: expected a string, got {type(text).__name__}", path=where, field="text")
            yield join_title(title, text) if isinstance(title, str) else text
            row += 1


# ---------------------------------------------------------------------------------------------- the cache
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
    def build(cls, source: str | Path | TextSource | list, tokenizer, max_len: int, cache_dir: str | Path,
              min_chunk: int = 8, show_progress: bool = True, num_proc: int | None = None,
              packing: Packing | None = None) -> "TokenizedCorpus":
        """Tokenize ``source`` (one source or several, concatenated in order; :func:`split_corpus`) once with
        ``num_proc`` processes (or reuse the current cache); memory-map it. ``packing``: pack the sentences of each
        document (:mod:`pretrieve.data.packing`) instead of chunking each document alone."""
        if max_len < 8:
            raise InputError(f"max_len must be at least 8, got {max_len}", field="max_len")
        sources = resolve_text_sources(source)
        target, settings, inputs, units, num_proc = _plan(sources, tokenizer, max_len, min_chunk, cache_dir, num_proc,
                                                          packing)
        status = artifacts.check(target, settings, inputs, kind=TOKEN_CACHE_KIND)
        if not status.current:
            if status.exists:
                logger.info("re-tokenizing: %s", status.reason)
            with artifacts.write_dir(target, kind=TOKEN_CACHE_KIND, settings=settings, inputs=inputs) as tmp:
                meta = _tokenize_to(tmp, sources, units, tokenizer, num_proc, show_progress)
                meta.update({"source": ",".join(map(str, sources)), "kind": "+".join(s.kind for s in sources),
                             "max_len": max_len, "min_chunk": min_chunk,
                             "packing": packing.settings() if packing else None,
                             "tokenizer": getattr(tokenizer, "name_or_path", "")})
                (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return cls.open(target, tokenizer)

    @classmethod
    def open(cls, directory: str | Path, tokenizer) -> "TokenizedCorpus":
        directory = Path(directory)
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        tokens = np.load(directory / "tokens.npy", mmap_mode="r")
        offsets = np.load(directory / "offsets.npy", mmap_mode="r")
        return cls(tokens, offsets, _special_id(tokenizer, "cls"), _special_id(tokenizer, "sep"), meta)


def _special_id(tokenizer, kind: str) -> int:
    value = getattr(tokenizer, f"{kind}_token_id", None)
    if value is None:
        fallback = "bos" if kind == "cls" else "eos"
        value = getattr(tokenizer, f"{fallback}_token_id", None)
    if value is None:
        raise InputError(f"tokenizer has no {kind} token", field="tokenizer")
    return int(value)


def vocabulary_digest(tokenizer) -> str:
    """SHA-1 of the tokenizer's vocabulary (what makes cached token ids valid)."""
    return hashlib.sha1(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()


def source_identity(source: TextSource):
    """``(settings, inputs, parts, size, dataset)`` of a source for the freshness contract and the split into parts:
    a file is its own input (parts: byte ranges, no dataset); a dataset's inputs are its Arrow files (parts: row
    ranges)."""
    if source.is_file:
        path = Path(source.path)
        _open_binary(path).close()
        return {"source_kind": source.kind}, {"corpus": path}, [], path.stat().st_size, None
    dataset = open_text_dataset(source)
    files = [Path(entry["filename"]) for entry in dataset.cache_files]
    if not files:
        raise InputError("dataset is held in memory, not in Arrow files", path=str(source))
    settings = {"source_kind": "datasets", "rows": len(dataset), "dataset": source.name or None,
                "config": source.config, "split": source.split}
    inputs = {f"arrow-{i:05d}": file for i, file in enumerate(files)}
    rows = len(dataset)
    parts = [(a, min(a + DATASET_PART_ROWS, rows)) for a in range(0, rows, DATASET_PART_ROWS)]
    return settings, inputs, parts, sum(file.stat().st_size for file in files), dataset


def cache_name(source: TextSource, tag: str, *settings: Any) -> str:
    """``<source label>-<tag>-<key>``: where a cache of ``source`` made with ``settings`` lives (its freshness is
    decided by :mod:`pretrieve.artifacts`, not by this name)."""
    where = source.name if source.name else str(Path(source.path).resolve())
    raw = "|".join(map(str, (where, source.config, source.split, tag, *settings)))
    return f"{source.label}-{tag}-{hashlib.sha1(raw.encode()).hexdigest()[:16]}"


def corpus_cache_name(sources: list[TextSource], tag: str, *settings: Any) -> str:
    """:func:`cache_name` of one source; of several, their labels joined by ``+`` and a key over all of them."""
    if len(sources) == 1:
        return cache_name(sources[0], tag, *settings)
    raw = "|".join(cache_name(source, tag, *settings) for source in sources)
    label = "+".join(source.label for source in sources)[:80]
    return f"{label}-{tag}-{hashlib.sha1(raw.encode()).hexdigest()[:16]}"


def _plan(sources: list[TextSource], tokenizer, max_len: int, min_chunk: int, cache_dir: str | Path,
          num_proc: int | None, packing: Packing | None = None):
    """``(target, settings, inputs, units, num_proc)``: where the cache goes, what makes it current (one source:
    its own settings and inputs; several: a list of settings and the inputs of each, prefixed ``sourceN-``) and
    the parts to tokenize, source after source. A source packed across documents is cut into the same parts for
    any ``num_proc`` (a run of packed documents ends at a part's end)."""
    across = packed_across(sources, packing)
    identities = [source_identity(source) for source in sources]
    if len(sources) == 1:
        settings, inputs = identities[0][0], identities[0][1]
    else:
        settings = {"sources": [identity[0] for identity in identities]}
        inputs = {f"source{i}-{key}": path
                  for i, identity in enumerate(identities) for key, path in identity[1].items()}
    vocab = vocabulary_digest(tokenizer)
    settings.update({"format": TOKEN_CACHE_FORMAT, "max_len": max_len, "min_chunk": min_chunk, "vocabulary": vocab})
    tag = f"L{max_len}"
    if packing is not None:
        settings["packing"] = packing.settings()
        tag += "-packed"
    num_proc = resolve_num_proc(num_proc, sum(identity[3] for identity in identities))
    packed = sorted(settings.get("packing", {}).items())
    target = Path(cache_dir) / corpus_cache_name(sources, tag, vocab, min_chunk, *packed)
    dtype = np.dtype(np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32).str
    units = []
    for index, (source, (_, _, parts, _, dataset)) in enumerate(zip(sources, identities)):
        if source.is_file:
            parts = byte_ranges(source.path, part_count(source.path, 1 if across[index] else num_proc))
        elif num_proc > 1 and len(parts) < num_proc and not across[index]:  # spread a dataset over the processes
            rows = parts[-1][1] if parts else 0
            step = max(1, -(-rows // num_proc))
            parts = [(a, min(a + step, rows)) for a in range(0, rows, step)]
        first = len(units)
        units += [_Unit(source, start, end, f"part-{first + i:05d}", max_len, min_chunk, dtype, dataset, index,
                        packing, across[index])
                  for i, (start, end) in enumerate(parts)]
    return target, settings, inputs, units, num_proc


def packed_across(sources: list[TextSource], packing: Packing | None) -> list[bool]:
    """For each source, whether its documents are packed into one another (named in ``packing.across``); a name
    that is none of the sources is an error."""
    if packing is None:
        return [False] * len(sources)
    named = {str(resolve_text_source(name)): name for name in packing.across}
    unknown = [name for key, name in named.items() if key not in {str(source) for source in sources}]
    if unknown:
        raise InputError(f"pack_across names {', '.join(unknown)}, which is not among the corpus's sources "
                         f"({', '.join(map(str, sources))})", field="pack_across")
    return [str(source) in named for source in sources]


@dataclass(frozen=True)
class _Unit:
    source: TextSource
    start: int
    end: int | None
    out: str
    max_len: int
    min_chunk: int
    dtype: str
    dataset: Any = None  # the opened datasets.Dataset of a datasets source (pickles as its file paths)
    source_index: int = 0   # which of the corpus's sources
    packing: Packing | None = None
    across: bool = False    # pack this source's documents into one another


@dataclass
class _UnitResult:
    passages: int
    chunks: int
    tokens: int


_TOKENIZER: list = []  # the tokenizer of this (worker) process, set once by _set_tokenizer


def _set_tokenizer(tokenizer) -> None:
    _TOKENIZER[:] = [tokenizer]


def _chunk(encoded: list[list[int]], size: int, min_chunk: int) -> tuple[list[list[int]], list[int]]:
    """Unpacked: each passage's ids cut into chunks of ``size`` (module docstring); ``(kept ids, chunk lengths)``."""
    kept: list[list[int]] = []
    lengths: list[int] = []
    for ids in encoded:
        full, rest = divmod(len(ids), size)
        if rest and (full == 0 or rest >= min_chunk):
            kept.append(ids)
            lengths.extend([size] * full + [rest])
        elif full:
            kept.append(ids[:full * size])
            lengths.extend([size] * full)
    return kept, lengths


def _pack(tokenizer, texts: list[str], packer: Packer) -> list[list[int]]:
    """Packed: the blocks the passages complete (their sentences tokenized in one call)."""
    sentences = [split_sentences(text) for text in texts]
    flat = [sentence for each in sentences for sentence in each]
    encoded = tokenizer(flat, add_special_tokens=False, truncation=False, verbose=False)["input_ids"] if flat else []
    blocks, position = [], 0
    for text, each in zip(texts, sentences):
        blocks += packer.add_document(encoded[position:position + len(each)], document_key(text))
        position += len(each)
    return blocks


def _tokenize_unit(unit: _Unit) -> _UnitResult:
    """Tokenize one part: token ids to ``<out>.tokens``, chunk lengths (int32) to ``<out>.lengths``."""
    tokenizer = _TOKENIZER[0]
    dtype = np.dtype(unit.dtype)
    size = unit.max_len - 2
    packer = None if unit.packing is None else Packer(size, unit.packing.short_seq_prob, unit.across)
    passages = chunks = tokens = 0
    start = unit.start if unit.source.is_file else 0
    with located_in_part(unit.source.path, start), open(unit.out + ".tokens", "wb") as token_file, \
            open(unit.out + ".lengths", "wb") as length_file:
        batch: list[str] = []

        def write(kept: list[list[int]], lengths: list[int]) -> None:
            nonlocal chunks, tokens
            total = sum(lengths)
            np.fromiter(itertools.chain.from_iterable(kept), dtype=dtype, count=total).tofile(token_file)
            np.asarray(lengths, dtype=np.int32).tofile(length_file)
            chunks += len(lengths)
            tokens += total

        def flush() -> None:
            if packer is None:
                encoded = tokenizer(batch, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
                write(*_chunk(encoded, size, unit.min_chunk))
            else:
                blocks = _pack(tokenizer, batch, packer)
                write(blocks, [len(block) for block in blocks])
            batch.clear()

        texts = (iter_pretrain_texts(unit.source, unit.start, unit.end, keep_blank=packer is not None)
                 if unit.dataset is None else _iter_dataset_texts(unit.dataset, str(unit.source), unit.start, unit.end))
        for text in texts:
            batch.append(text)
            passages += bool(text) or packer is None   # a blank line (kept as a boundary) is no passage
            if len(batch) >= TOKENIZE_BATCH:
                flush()
        if batch:
            flush()
        if packer is not None:
            blocks = packer.finish()
            write(blocks, [len(block) for block in blocks])
    return _UnitResult(passages, chunks, tokens)


def _tokenize_to(directory: Path, sources: list[TextSource], units: list[_Unit], tokenizer, num_proc: int,
                 show_progress: bool) -> dict:
    """Tokenize the parts (``num_proc`` processes) and join them, in order, into ``tokens.npy`` / ``offsets.npy``;
    the counts of each source go to ``sources``."""
    dtype = np.dtype(units[0].dtype) if units else np.dtype(np.uint16)
    units = [dataclasses.replace(unit, out=str(directory / unit.out)) for unit in units]
    logger.info("tokenizing %s (%d parts, %d processes)", ", ".join(map(str, sources)), len(units), num_proc)
    progress = Progress(total=len(units), desc="tokenizing", unit=" parts", disable=not show_progress)
    results = run_parts(_tokenize_unit, units, num_proc, initializer=_set_tokenizer, initargs=(tokenizer,),
                        on_result=lambda _: progress.update(1))
    progress.close()
    total_chunks = sum(r.chunks for r in results)
    total_tokens = sum(r.tokens for r in results)
    per_source = []
    first_chunk = 0
    for index, source in enumerate(sources):
        own = [r for unit, r in zip(units, results) if unit.source_index == index]
        counts = {"passages": sum(r.passages for r in own), "chunks": sum(r.chunks for r in own),
                  "tokens": sum(r.tokens for r in own)}
        if not counts["chunks"]:
            raise InputError("pre-training corpus contains no text", path=str(source))
        per_source.append({"source": str(source), "kind": source.kind, "first_chunk": first_chunk, **counts})
        first_chunk += counts["chunks"]
    with open(directory / "tokens.npy", "wb") as out:
        _write_npy_header(out, dtype, total_tokens)
        for unit in units:
            with open(unit.out + ".tokens", "rb") as part:
                shutil.copyfileobj(part, out, 16 << 20)
            Path(unit.out + ".tokens").unlink()
    with open(directory / "offsets.npy", "wb") as out:
        _write_npy_header(out, np.int64, total_chunks + 1)
        np.zeros(1, dtype=np.int64).tofile(out)
        running = 0
        for unit in units:
            for block in _blocks(Path(unit.out + ".lengths"), np.int32):
                ends = np.cumsum(block, dtype=np.int64) + running
                ends.tofile(out)
                running = int(ends[-1])
            Path(unit.out + ".lengths").unlink()
    return {"passages": sum(r.passages for r in results), "chunks": total_chunks, "tokens": total_tokens,
            "dtype": str(np.dtype(dtype)), "parts": len(units), "sources": per_source}


def _write_npy_header(handle, dtype, length: int) -> None:
    np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": (length,)})


def _blocks(path: Path, dtype, items: int = 1 << 22) -> Iterator[np.ndarray]:
    """A raw array file in blocks of ``items`` values."""
    with open(path, "rb") as handle:
        while len(block := np.fromfile(handle, dtype=dtype, count=items)):
            yield block
