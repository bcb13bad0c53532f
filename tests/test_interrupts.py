"""SIGTERM as an exception (:mod:`pretrieve.interrupts`): raised inside the block with exit code 143, the previous
handler back afterwards."""

from __future__ import annotations

import os
import signal

import pytest

from pretrieve.interrupts import TrainingTerminated, sigterm_raises


def test_sigterm_inside_the_block_raises_and_the_old_handler_comes_back():
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with pytest.raises(TrainingTerminated) as caught, sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
        assert caught.value.code == 143
        os.kill(os.getpid(), signal.SIGTERM)        # after the block: the handler that was there before
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
