"""pretrieve's one progress display, for every long loop (encoding, training, tokenising, BM25, reranking).

On a terminal or in a Jupyter notebook it is a rich bar on stderr (count, rate, elapsed, ETA, and a postfix such as
the loss). Anywhere else (a batch job, output redirected to a log file) it writes **clean lines**, never a ``\\r``
frame or an ANSI sequence: one at every completed tenth of the total (count, percent, rate, elapsed, ETA), or, when
the total is unknown, one every :data:`QUIET_SECONDS` and one at the end. The lines go to pretrieve's log when
logging is configured (the CLI) and to stderr otherwise (a script of the Python API).

:class:`Progress` takes tqdm's arguments (``total``, ``desc``, ``unit``, ``initial``, ``disable``, an iterable;
``update``, ``set_postfix``, ``close``), so a loop written for tqdm reads the same. Only one rich bar is shown at a
time (rich allows one live display); a bar started while another is shown writes lines instead. Libraries' own tqdm
bars (``datasets``, ``huggingface_hub``, ``transformers``) are switched off by the CLI when stderr is not a terminal
(:func:`pretrieve.cli.configure_logging`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Callable, Iterable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.progress import Progress as RichProgress
from rich.text import Text

logger = logging.getLogger(__name__)

QUIET_SECONDS = 30.0
"""Without a known total, a line at most this often (and one at the end)."""

_shown: list["Progress"] = []   # the bar rich is drawing now (at most one)


class Progress:
    """A progress display with tqdm's interface (module docstring)."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str = "",
                 unit: str = "it", disable: bool = False, initial: int = 0):
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.unit, self.disable = total, desc, unit.strip(), disable
        self.n = initial
        self.postfix = ""
        self._began = time.perf_counter()
        self._start_n = initial
        self._tenth = 1 + (10 * initial // total if total else 0)   # the next tenth of the total to report
        self._next_line = QUIET_SECONDS
        self._last_logged = -1
        self._rich = None
        if disable:
            return
        console = Console(stderr=True, emoji=False)
        if (console.is_terminal or console.is_jupyter) and not _shown:
            self._rich = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      _RateColumn(self.unit), TimeElapsedColumn(), TextColumn("ETA"),
                                      TimeRemainingColumn(), TextColumn("{task.fields[postfix]}"),
                                      console=console, transient=False)
            self._task = self._rich.add_task(desc, total=total, completed=initial, postfix="")
            self._rich.start()
            _shown.append(self)

    # ------------------------------------------------------------------ tqdm's interface
    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:   # also when the loop stops early: the bar never outlives it
            self.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.disable:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.n)
            return
        if self.total:
            if self._tenth <= 10 and self.n >= self._threshold():
                while self._tenth <= 10 and self.n >= self._threshold():
                    self._tenth += 1
                self._line()
        elif time.perf_counter() - self._began >= self._next_line:
            self._next_line = time.perf_counter() - self._began + QUIET_SECONDS
            self._line()

    def set_postfix(self, **values: Any) -> None:
        """Shown after the figures (``loss=0.4123``): in the bar, or in the next line written."""
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())
        if self._rich is not None:
            self._rich.update(self._task, postfix=self.postfix)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            _shown.remove(self)
            self._rich = None
        elif not self.disable and self.n != self._last_logged and self.n > self._start_n and not self.total:
            self._line()   # unknown total: the final count
        self.disable = True

    # ------------------------------------------------------------------ lines
    def _threshold(self) -> int:
        """The count at which the next tenth of the total is complete."""
        return -(-self.total * self._tenth // 10)

    def _line(self) -> None:
        self._last_logged = self.n
        elapsed = time.perf_counter() - self._began
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        if self.total:
            eta = (self.total - self.n) / rate if rate > 0 else 0.0
            line = (f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%), "
                    f"{rate:.1f} {self.unit}/s, elapsed {_clock(elapsed)}, ETA {_clock(eta)}")
        else:
            line = f"{self.desc}: {self.n} {self.unit}, {rate:.1f} {self.unit}/s, elapsed {_clock(elapsed)}"
        if self.postfix:
            line += f", {self.postfix}"
        if logger.hasHandlers():
            logger.info("%s", line)
        else:   # logging not configured (the Python API in a script): progress goes to stderr all the same
            print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_bar(total: int, description: str, enabled: bool = True,
                 unit: str = "texts") -> Iterator[Callable[[int], None]]:
    """A :class:`Progress` of ``total`` ``unit``; yields its ``update(n)``."""
    with Progress(total=total, desc=description, unit=unit, disable=not enabled or total == 0) as progress:
        yield progress.update


class _RateColumn(ProgressColumn):
    """The average rate since the start (rich's own column shows a short window)."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        speed = task.completed / elapsed if elapsed else None
        return Text(f"{speed:,.1f} {self.unit}/s" if speed else f"? {self.unit}/s", style="progress.data.speed")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
