"""SIGTERM as an exception: :func:`sigterm_raises` turns the signal into :class:`TrainingTerminated` (exit 143) while a
block runs, so that the code around it can say what was kept — a training loop (:mod:`pretrieve.train.loop`: which
checkpoint ``--resume`` continues from) and a recipe's stage (:mod:`pretrieve.recipe.runner`). A base module: both
take it from here, and neither from the other.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class TrainingTerminated(SystemExit):
    """SIGTERM while training: the process exits with 143 (128 + 15, as the signal's default action would) once
    the code around :func:`sigterm_raises` has said what was kept."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises :class:`TrainingTerminated` (exit 143) instead of
    ending the process unannounced, so that the code around it can say what was kept; the previous handler is put
    back afterwards."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        def terminate(signum, frame):
            raise TrainingTerminated()

        previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
