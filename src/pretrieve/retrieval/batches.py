"""The one streaming batch encoder: texts → per-text outputs, window by window, for every kind of retriever.

:func:`encode_windows` is what every encoder run goes through (corpus shards, queries, mining, the recipe's
evaluate stage). It takes one *side* of a retriever (:class:`Side`: a tokenizer, a
maximum length, an optional prompt and a ``forward(batch) → outputs`` function) and any sized, sliceable source
of texts (a list, a :class:`~pretrieve.data.beir.Corpus` through :func:`text_source`, a ``datasets.Dataset``
whose ``ds[i:j]`` is a dict of columns), and yields the outputs window by window in input order:

* the texts of a window (``window`` texts, 8,192 by default) are tokenised by the tokenizer's batch call in a
  **background thread** (fast tokenizers release the GIL), while the model works on the previous batches;
* within a window the texts are **sorted by token length** (longest first: minimal padding, and an
  out-of-memory batch shows up at once) and cut into batches of ``batch_size``;
* a batch is padded by array operations (:func:`pad_rows`), not a Python loop over rows;
* the model runs under ``torch.inference_mode`` and the chosen precision; its outputs (dense float32 rows, or
  ``scipy.sparse`` CSR rows) are put back into input order when the window is complete.

Memory is one window of outputs plus a few batches of tokens, whatever the corpus size; a rank can encode a
contiguous slice (``start``/``end``, shard ``i`` of ``n``). :func:`encode_all` concatenates the windows (queries);
:func:`pretrieve.retrieval.index.write_parts` writes them to disk as they come (corpora).

**Precision** (:func:`pretrieve.precision.resolve_precision`): ``fp32``; ``bf16`` / ``fp16`` autocast (outputs stored as float32);
``int8`` — dynamic quantisation of every ``nn.Linear`` (``torch.ao.quantization.quantize_dynamic``, weights
int8, activations quantised per batch; CPU only); ``auto`` — ``bf16`` where the hardware computes it natively
(a CUDA device with bf16 support; a CPU with AVX512-BF16 or AMX-BF16, read from ``/proc/cpuinfo``), else
``fp32``. On a CPU without native bf16 the autocast emulates it and runs several times *slower* than fp32, which
is why ``auto`` never picks it there.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import scipy.sparse as sp
import torch

from pretrieve.data import arrow
from pretrieve.data.records import join_title
from pretrieve.errors import ConfigError
from pretrieve.precision import autocast
from pretrieve.progress import progress_bar

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 8192


# ---------------------------------------------------------------------------------------------------- sides
@dataclass
class Side:
    """One side (queries or passages) of a retriever, as the batch encoder runs it: tokenizer, length, prompt,
    and ``forward(padded batch) → outputs`` (part name → float32 rows or CSR rows)."""

    text_type: str
    tokenizer: Any
    max_length: int
    forward: Callable[[dict[str, torch.Tensor]], dict[str, Any]]
    empty: Callable[[], dict[str, Any]]
    device: torch.device
    precision: str
    settings: dict[str, Any]
    prompt: str | None = None
    title_sep: str = " "   # between a passage's title and text (the model's title_join, pretrieve.data.records)

    def empty_outputs(self) -> dict[str, Any]:
        return self.empty()


# ---------------------------------------------------------------------------------------- device, precision
def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/None → CUDA when available, else CPU."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def quantize_int8(module: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation of every ``nn.Linear`` of ``module`` (in place; CPU inference only): weights
    int8 per output channel, activations quantised per batch (``torch.ao.quantization.quantize_dynamic``)."""
    with warnings.catch_warnings():   # torch marks eager-mode quantisation deprecated in favour of torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic  # lazy: torch.ao.quantization

        return quantize_dynamic(module.cpu().eval(), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                dtype=torch.qint8, inplace=True)


# --------------------------------------------------------------------------------------------- text sources
def text_source(texts: Any) -> Any:
    """``texts`` as a sized source of strings for :func:`text_slice`: a corpus (``full_text``) stays itself (its
    passages are joined as they are read), a whole corpus dataset becomes a :class:`pretrieve.data.arrow.CorpusTexts`
    (which gives back the pages of every window it read), another ``datasets.Dataset`` stays itself (its ``title`` +
    ``text`` columns), a list stays a list."""
    if hasattr(texts, "cache_files") and hasattr(texts, "column_names"):
        return arrow.CorpusTexts.of(texts) or texts
    return texts


def text_slice(source: Any, start: int, end: int, sep: str = " ") -> list[str]:
    """Texts ``start:end`` of a source: a list/sequence, or a dataset whose slice is a dict of columns
    (``title`` + ``sep`` + ``text`` as passages are joined everywhere, else its ``text`` or only column), or a
    corpus."""
    if hasattr(source, "full_text") and hasattr(source, "ids"):
        return [source.full_text(i, sep) for i in range(start, min(end, len(source)))]
    if isinstance(source, arrow.CorpusTexts):
        return source.rows_text(start, end, sep)
    part = source[start:end]
    if isinstance(part, Mapping):
        if "text" in part:
            titles = part.get("title")
            if titles is None:
                return [str(text) for text in part["text"]]
            return [join_title(title or "", text, sep) for title, text in zip(titles, part["text"])]
        if len(part) == 1:
            return [str(text) for text in next(iter(part.values()))]
        raise ConfigError(f"a dataset of texts needs a 'text' column (and optionally 'title'); it has "
                          f"{', '.join(part)}")
    return [text if isinstance(text, str) else str(text) for text in part]


# -------------------------------------------------------------------------------------------------- batches
def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pad token-id rows into ``(ids [B, L], attention_mask [B, L])`` int64 arrays without a loop over rows."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    longest = int(lengths.max()) if len(rows) else 0
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    positions = np.arange(longest)[None, :]
    mask = positions >= (longest - lengths)[:, None] if left else positions < lengths[:, None]
    ids = np.full((len(rows), longest), pad_id, dtype=np.int64)
    ids[mask] = flat   # row-major order of the mask = the rows' tokens in order, for either padding side
    return ids, mask.astype(np.int64)


#: Texts per call of the tokenizer: a fast tokenizer keeps ~20 KB of Rust ``Encoding`` objects per text until the
#: call's result is dropped, and the allocator keeps that peak (166 MB for an 8,192-text window; 1,024 → 52 MB less
#: resident at the same CPU time, measured on MiniLM's tokenizer).
TOKENIZE_CHUNK = 1024


def tokenize(side: Side, texts: Sequence[str]) -> tuple[list[list[int]], list[list[int]] | None]:
    """Unpadded token ids (and token type ids when the model takes them), prompt prepended, truncated."""
    inputs = [side.prompt + text for text in texts] if side.prompt else list(texts)
    ids: list[list[int]] = []
    types: list[list[int]] | None = None
    for first in range(0, len(inputs), TOKENIZE_CHUNK):
        encoded = side.tokenizer(inputs[first:first + TOKENIZE_CHUNK], truncation=True,
                                 max_length=side.max_length, padding=False, return_attention_mask=False)
        if first == 0 and "token_type_ids" in side.tokenizer.model_input_names and "token_type_ids" in encoded:
            types = []
        ids.extend(encoded["input_ids"])
        if types is not None:
            types.extend(encoded["token_type_ids"])
    return ids, types


@dataclass
class Batch:
    """One padded batch: its rows within the window and the model inputs (numpy, moved to the device later)."""

    rows: np.ndarray
    inputs: dict[str, np.ndarray]


def window_batches(side: Side, texts: Sequence[str], batch_size: int) -> list[Batch]:
    """Tokenise a window, sort it by length (longest first, stable) and pad it into batches."""
    ids, types = tokenize(side, texts)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    order = np.argsort(-lengths, kind="stable")
    pad_id = side.tokenizer.pad_token_id if side.tokenizer.pad_token_id is not None else 0
    left = getattr(side.tokenizer, "padding_side", "right") == "left"
    batches = []
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        input_ids, mask = pad_rows([ids[i] for i in rows], pad_id, left)
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if types is not None:
            inputs["token_type_ids"] = pad_rows([types[i] for i in rows], 0, left)[0]
        batches.append(Batch(rows, inputs))
    return batches


def _background(produce: Callable[[], Iterator[Any]], prefetch: int) -> Iterator[Any]:
    """Run the generator ``produce()`` in a daemon thread, ``prefetch`` items ahead; errors are re-raised here."""
    items: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for item in produce():
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            items.put(exc)

    thread = threading.Thread(target=work, name="pretrieve-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


# -------------------------------------------------------------------------------------------------- encoding
def encode_windows(side: Side, texts: Any, batch_size: int = 64, start: int = 0, end: int | None = None,
                   window: int = DEFAULT_WINDOW, show_progress: bool = False,
                   description: str = "encode") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(first row, outputs)`` for consecutive windows of ``texts[start:end]``, outputs in input order.

    ``outputs`` maps a part name (``"embeddings"``, ``"sparse"``, …: what the side's ``forward`` returns) to a
    float32 ``[n, width]`` array or a CSR ``[n, V]`` matrix for the window's ``n`` texts.
    """
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    if window < 1:
        raise ConfigError(f"window must be >= 1, got {window}")
    source = text_source(texts)
    end = len(source) if end is None else end
    if not 0 <= start <= end <= len(source):
        raise ConfigError(f"rows {start}:{end} are outside the {len(source)} texts")
    window = max(window, batch_size)

    def produce() -> Iterator[tuple[int, int, list[Batch]]]:
        for first in range(start, end, window):
            last = min(end, first + window)
            yield first, last - first, window_batches(side, text_slice(source, first, last, side.title_sep),
                                                      batch_size)

    with progress_bar(end - start, description, enabled=show_progress) as advance:
        for first, count, batches in _background(produce, prefetch=2):
            collected: list[tuple[np.ndarray, dict[str, Any]]] = []
            for batch in batches:
                inputs = {key: torch.from_numpy(value).to(side.device) for key, value in batch.inputs.items()}
                with torch.inference_mode(), autocast(side.device, side.precision):
                    outputs = side.forward(inputs)
                collected.append((batch.rows, outputs))
                advance(len(batch.rows))
            yield first, _in_input_order(collected, count)


def _in_input_order(collected: list[tuple[np.ndarray, dict[str, Any]]], count: int) -> dict[str, Any]:
    """Scatter the batches' outputs (rows in sorted order) back into the window's input order."""
    if not collected:
        return {}
    order = np.concatenate([rows for rows, _ in collected])
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    merged: dict[str, Any] = {}
    for name in collected[0][1]:
        parts = [outputs[name] for _, outputs in collected]
        if sp.issparse(parts[0]):
            merged[name] = sp.vstack(parts, format="csr")[inverse]
        else:
            stacked = np.concatenate(parts)
            merged[name] = stacked[inverse]
    return merged


def encode_all(side: Side, texts: Any, batch_size: int = 64, window: int = DEFAULT_WINDOW,
               show_progress: bool = False, description: str = "encode") -> dict[str, Any]:
    """Every output of ``texts`` in memory (queries, small collections): the windows concatenated."""
    windows = [outputs for _, outputs in encode_windows(side, texts, batch_size, window=window,
                                                        show_progress=show_progress, description=description)]
    if not windows:
        return side.empty_outputs()
    return {name: sp.vstack([w[name] for w in windows], format="csr") if sp.issparse(windows[0][name])
            else np.concatenate([w[name] for w in windows]) for name in windows[0]}
