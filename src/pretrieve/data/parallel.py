"""Processing one large input file in parts, by several processes, with the same located errors as one reader.

A line-oriented file (JSONL, TSV, plain text) is cut into byte ranges that start at line starts
(:func:`byte_ranges`); each part is read with :func:`pretrieve.data.jsonl.iter_lines` ``(path, start, end)``
and validated by the same functions the streaming readers use. A worker counts lines from 1 at its range's
start; :func:`located_in_part` turns an :class:`~pretrieve.errors.InputError` raised there into one with the
file's real line number (the lines before the range are counted only when an error happens).

:func:`run_parts` runs a function over the parts in a pool of ``num_proc`` processes (``spawn``: safe after
torch or a tokenizer started threads) or, with one process, in this process; results come back in part order
and the first part's error (in file order) is raised as the same ``InputError`` (file, line, field), not as a
pickled copy. Gzipped files cannot be split: they are read as one part.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pretrieve.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

#: Files smaller than this per process are not worth starting a process for.
MIN_BYTES_PER_PROCESS = 16 << 20
#: A part is at most this large (more parts than processes when the file is larger).
PART_BYTES = 256 << 20
MAX_DEFAULT_PROCESSES = 8
_BLOCK = 16 << 20


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_proc(num_proc: int | None, size: int) -> int:
    """``num_proc`` as given (≥ 1), or by default one process per 16 MB of input, at most the available CPUs
    (and 8)."""
    if num_proc is not None:
        if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
            raise ConfigError(f"num_proc must be an integer >= 1, got {num_proc!r}")
        return num_proc
    return max(1, min(available_cpus(), MAX_DEFAULT_PROCESSES, size // MIN_BYTES_PER_PROCESS))


def splittable(path: str | Path) -> bool:
    """Whether a file can be read in byte ranges (not gzipped)."""
    return Path(path).suffix != ".gz"


def byte_ranges(path: str | Path, parts: int) -> list[tuple[int, int | None]]:
    """``parts`` (or fewer) non-empty byte ranges ``[start, end)`` covering the file, each starting at a line
    start. A gzipped file is one range ``(0, None)``."""
    path = Path(path)
    if not splittable(path) or parts <= 1:
        return [(0, None)]
    size = path.stat().st_size
    bounds = [0]
    with open(path, "rb") as handle:
        for k in range(1, parts):
            target = max(bounds[-1], size * k // parts)
            if target <= 0:
                continue
            handle.seek(target - 1)
            handle.readline()  # to the end of the line that holds byte target-1: the next range starts after it
            bounds.append(min(handle.tell(), size))
    bounds.append(size)
    ranges = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return ranges or [(0, size)]


def part_count(path: str | Path, num_proc: int) -> int:
    """How many parts to cut a file into: one per process, more when a part would exceed :data:`PART_BYTES`."""
    if not splittable(path):
        return 1
    return max(num_proc, math.ceil(Path(path).stat().st_size / PART_BYTES))


def lines_before(path: str | Path, offset: int) -> int:
    """Number of lines that end before byte ``offset`` (read in blocks)."""
    count = 0
    remaining = offset
    with open(path, "rb") as handle:
        while remaining > 0:
            block = handle.read(min(_BLOCK, remaining))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count


@contextlib.contextmanager
def located_in_part(path: str | Path, start: int) -> Iterator[None]:
    """Re-raise an :class:`InputError` about ``path`` raised while reading the part starting at byte ``start``
    with the file's line number instead of the part's."""
    try:
        yield
    except InputError as exc:
        if start and exc.line is not None and exc.path == str(path):
            raise InputError(exc.message, exc.path, exc.line + lines_before(path, start), exc.field) from None
        raise


@dataclass
class _Failure:
    """An error of a worker, carried back as data so the parent raises the same error type and fields."""

    kind: str
    args: tuple


def _guarded(fn: Callable[[Any], Any], task: Any) -> Any:
    try:
        return fn(task)
    except InputError as exc:
        return _Failure("input", (exc.message, exc.path, exc.line, exc.field))
    except ConfigError as exc:
        return _Failure("config", (str(exc),))


def _raise(failure: _Failure) -> None:
    if failure.kind == "input":
        raise InputError(*failure.args)
    raise ConfigError(*failure.args)


def _initialise(initializer: Callable | None, initargs: tuple) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per process: num_proc is the parallelism
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if initializer is not None:
        initializer(*initargs)


def run_parts(fn: Callable[[Any], Any], tasks: Sequence[Any], num_proc: int, *,
              initializer: Callable | None = None, initargs: tuple = (),
              on_result: Callable[[Any], None] | None = None) -> list[Any]:
    """``[fn(task) for task in tasks]`` on ``num_proc`` processes, in task order; the first error in task order
    is raised (an ``InputError`` keeps its file, line and field). ``fn``, the tasks and ``initializer`` must be
    picklable (module-level functions, plain data). ``on_result`` sees each result as it arrives, in order."""
    results: list[Any] = []
    if num_proc <= 1 or len(tasks) <= 1:
        if initializer is not None:
            initializer(*initargs)
        for task in tasks:
            result = _guarded(fn, task)
            if isinstance(result, _Failure):
                _raise(result)
            if on_result is not None:
                on_result(result)
            results.append(result)
        return results

    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=min(num_proc, len(tasks)), mp_context=context,
                                 initializer=_initialise, initargs=(initializer, initargs)) as pool:
            futures = [pool.submit(_guarded, fn, task) for task in tasks]
            try:
                for future in futures:
                    result = future.result()
                    if isinstance(result, _Failure):
                        _raise(result)
                    if on_result is not None:
                        on_result(result)
                    results.append(result)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    except BrokenProcessPool as exc:
        # A worker died: killed (memory), or it could not start because the calling script has no
        # `if __name__ == "__main__":` guard (spawned workers re-import it). Finish the remaining parts here.
        logger.warning("worker processes failed (%s); a script that starts processes needs `if __name__ == "
                       "\"__main__\":`. Continuing the remaining %d of %d parts in this process", exc,
                       len(tasks) - len(results), len(tasks))
        results.extend(run_parts(fn, tasks[len(results):], 1, initializer=initializer, initargs=initargs,
                                 on_result=on_result))
    return results
