"""Run a function in N CPU processes joined by a gloo process group, for multi-process tests.

    from ddp_utils import run_distributed

    def work(rank: int, world_size: int, scale: float) -> dict:   # module level: spawn pickles it by name
        ...                                                        # torch.distributed is initialised here
        return {"grad": tensor}                                    # anything torch.save can write

    results = run_distributed(work, world_size=2, args=(0.5,))     # [rank 0's result, rank 1's result]

Processes are started with ``torch.multiprocessing`` (spawn), rendezvous over TCP on a free local port (picked
by binding port 0; retried on the rare race where another process takes it first), use one intra-op thread
each (the test machines are small and shared), and are killed — only these processes — if they outlive
``timeout`` (a deadlocked collective must fail the test, not hang the suite). An exception in any rank is
re-raised in the caller with that rank's traceback.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PORT_RETRIES = 3


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_distributed(fn: Callable[..., Any], world_size: int = 2, args: tuple = (), timeout: float = 60.0,
                    backend: str = "gloo") -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes; return the results by rank."""
    for attempt in range(PORT_RETRIES):
        try:
            return _run_once(fn, world_size, args, timeout, backend, free_port())
        except mp.ProcessRaisedException as error:
            if "address already in use" not in str(error).lower() or attempt == PORT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _run_once(fn: Callable[..., Any], world_size: int, args: tuple, timeout: float, backend: str,
              port: int) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="ddp_test_") as out_dir:
        context = mp.start_processes(_worker, args=(fn, world_size, args, backend, port, timeout, out_dir),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not context.join(timeout=0.2):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"{world_size} processes running {fn.__name__} did not finish in {timeout} s")
        return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def _worker(rank: int, fn: Callable[..., Any], world_size: int, args: tuple, backend: str, port: int,
            timeout: float, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()   # rank 0 hosts the TCP store: tearing it down while a peer still talks to it aborts
    finally:
        dist.destroy_process_group()
