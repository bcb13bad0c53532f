"""Several processes running one command (``torchrun`` / ``accelerate launch``): which rank does which part of the
work, how the parts become one output, and how ranks wait for each other — with a timeout, and a one-line error
naming the rank that failed instead of a hang.

Every helper is a no-op in a single process (no ``WORLD_SIZE`` > 1 in the environment), so the recipe's stages call
them unconditionally and the same code runs on a laptop and on many GPUs of several nodes (which need only a shared
file system: parts and merged outputs are files in the output directory).

* **Who.** :func:`launched` (``WORLD_SIZE`` > 1, as torchrun and accelerate launch set it with ``RANK`` and
  ``LOCAL_RANK``), :func:`rank`, :func:`world_size`, :func:`is_main`.
* **Process groups.** :func:`init` joins the default group (NCCL on CUDA, gloo on CPU; reused when accelerate made
  it first) with an explicit timeout (:data:`DEFAULT_TIMEOUT_MINUTES`, ``dist_timeout_minutes`` in a recipe,
  ``--dist-timeout-minutes``) and makes a separate **gloo control group**: every wait here is a
  ``monitored_barrier`` on it, so waiting never runs into NCCL's watchdog and a missing rank is named.
* **Split.** :func:`shard_bounds` — the rows ``[a, b)`` of shard ``i`` of ``n``; :func:`bounds` — the contiguous
  slice ``[a, b)`` of ``count`` items (queries, corpus rows, groups) of this rank (sizes differ by at most one; a
  rank may get none when there are more ranks than items).
  :func:`split_files` — each rank writes its slice to a part file (``.<name>.part-R-of-W.tmp`` beside the output),
  and rank 0 concatenates the parts in rank order into the output, written atomically and recorded through the
  freshness contract (:func:`pretrieve.artifacts.write_file`). Outputs whose lines follow item order (TREC runs,
  groups JSONL) are then byte for byte those of one process.
* **Once.** :func:`once` — rank 0 does the work (a download, a BM25 index, a token cache) while the others wait for
  it at a barrier; everyone gets rank 0's (small, picklable) result. :func:`built_once` — rank 0 builds a cached
  output (an Arrow dataset), then the others open the current one.
* **Failures.** :func:`guard` wraps a rank's share of a stage: when it raises, the rank records the error in the
  rendezvous store before it exits; a rank waiting in :func:`barrier` (or failing in a training collective because
  its peer vanished) then raises :class:`RankFailure` — ``rank 1 of 2 failed in 'mine': InputError: ...`` — and the
  CLI prints that one line and exits 2. A rank killed without a word (``kill -9``, the OOM killer) is named by the
  monitored barrier; a rank that hangs is named when the timeout expires.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from pretrieve import artifacts
from pretrieve.errors import ConfigError, PretrieveError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MINUTES = 60.0
"""How long a rank waits for the others at one point (and the process groups' timeout): longer than the longest work
one rank does alone (a BM25 index, a token cache, merging an index), far shorter than a job's budget."""
_FAILED = "pretrieve/failed/"
_STORE_WAIT = datetime.timedelta(seconds=10)

T = TypeVar("T")


class RankFailure(PretrieveError):
    """Another rank failed, died or hangs: this rank stops too (the message names the rank)."""


_state: dict[str, Any] = {"timeout": datetime.timedelta(minutes=DEFAULT_TIMEOUT_MINUTES), "control": None,
                          "owns_group": False, "waited": 0.0}


# ------------------------------------------------------------------------------------------------------ who
def launched() -> bool:
    """True under torchrun / accelerate launch with more than one process."""
    return _env_int("WORLD_SIZE", 1) > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def _dist():
    """``torch.distributed`` when a process group can exist; None in a single process that never imported it (so
    that commands which load no model, such as ``pretrieve bm25``, do not import torch)."""
    if not launched() and "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist  # lazy: torch

    return dist if dist.is_available() else None


def active() -> bool:
    """True when a process group of more than one process is initialised."""
    dist = _dist()
    return bool(dist and dist.is_initialized() and dist.get_world_size() > 1)


def rank() -> int:
    """This process's global rank (the process group's, else ``RANK``); 0 in a single process."""
    dist = _dist()
    if dist and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0)


def world_size() -> int:
    """Number of processes (the process group's, else ``WORLD_SIZE``); 1 in a single process."""
    dist = _dist()
    if dist and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def is_main() -> bool:
    return rank() == 0


def timeout() -> datetime.timedelta:
    return _state["timeout"]


def check_timeout(minutes: Any, where: str = "dist_timeout_minutes") -> float:
    """A timeout in minutes, > 0; a :class:`ConfigError` naming ``where`` otherwise."""
    try:
        value = float(minutes)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number of minutes, got {minutes!r}") from None
    if not value > 0:
        raise ConfigError(f"{where}: must be > 0 minutes, got {minutes!r}")
    return value


# ---------------------------------------------------------------------------------------------- groups
def init(timeout_minutes: float | None = None) -> None:
    """Join the process group of a launched run (no-op in a single process) and make the gloo control group.

    The default group is NCCL with this process's GPU (``LOCAL_RANK``) on CUDA, gloo on CPU; one that accelerate
    (or a caller) already initialised is kept. ``timeout_minutes`` (default :data:`DEFAULT_TIMEOUT_MINUTES`) bounds
    every wait of this module and the collectives of the default group made here."""
    if timeout_minutes is not None:
        _state["timeout"] = datetime.timedelta(minutes=check_timeout(timeout_minutes))
    dist = _dist()
    if not launched() or dist is None:
        return
    if not dist.is_initialized():
        import torch  # lazy: torch

        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
            backend = "nccl"
        dist.init_process_group(backend, timeout=timeout())
        _state["owns_group"] = True
    _control()


def _control():
    """The gloo group every wait and object collective of this module uses (made on first use, by every rank)."""
    if _state["control"] is None and active():
        _state["control"] = _dist().new_group(backend="gloo", timeout=timeout())
    return _state["control"]


def finish() -> None:
    """The end of a launched run: wait for every rank, then leave the process group this module made."""
    if not active():
        return
    barrier("the end of the run")
    dist = _dist()
    if _state["owns_group"]:
        dist.destroy_process_group()
        _state.update(control=None, owns_group=False)


# ---------------------------------------------------------------------------------------------- waiting
def barrier(what: str) -> None:
    """Wait (at most :func:`timeout`) until every rank reaches this point; :class:`RankFailure` names a rank that
    failed, died or did not come."""
    if not active():
        return
    dist = _dist()
    started = time.perf_counter()
    try:
        dist.monitored_barrier(_control(), timeout=timeout(), wait_all_ranks=True)
    except Exception as exc:  # noqa: BLE001 - gloo raises RuntimeError / DistError subclasses
        raise _failure(what, exc) from None
    finally:
        _state["waited"] += time.perf_counter() - started


def waited() -> float:
    """Seconds this process has spent waiting for the other ranks in :func:`barrier` (to tell work from waiting)."""
    return _state["waited"]


def broadcast(value: T, what: str) -> T:
    """Rank 0's ``value`` on every rank (after a :func:`barrier`; small picklable values)."""
    if not active():
        return value
    barrier(what)
    box = [value]
    try:
        _dist().broadcast_object_list(box, src=0, group=_control())
    except Exception as exc:  # noqa: BLE001
        raise _failure(what, exc) from None
    return box[0]


def gather(value: T, what: str) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank (after a :func:`barrier`)."""
    if not active():
        return [value]
    barrier(what)
    values: list[Any] = [None] * world_size()
    try:
        _dist().all_gather_object(values, value, group=_control())
    except Exception as exc:  # noqa: BLE001
        raise _failure(what, exc) from None
    return values


def once(what: str, work: Callable[[], T]) -> T:
    """Rank 0 runs ``work()`` while the others wait for it; every rank returns its result."""
    result = None
    if is_main():
        with guard(what):
            result = work()
    return broadcast(result, what)


def built_once(make: Callable[[], Any], what: str = "convert to Arrow") -> Any:
    """``make()`` (a builder of a cached output, e.g. :func:`pretrieve.data.arrow.corpus_dataset`) on every rank of a
    launched run: rank 0 builds (or finds current) the output while the others wait (:func:`once`), then the others
    open it; rank 0 keeps what it built."""
    if not active():
        return make()
    built: list[Any] = []
    once(what, lambda: built.append(make()))
    return built[0] if built else make()


# ---------------------------------------------------------------------------------------------- failures
@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """A rank's share of ``what``: an error is recorded for the other ranks before it propagates; an error caused
    by another rank's failure becomes a :class:`RankFailure` naming that rank."""
    try:
        yield
    except RankFailure:
        raise
    except Exception as exc:
        if not active():
            raise
        other = _announced(exclude=rank())
        if other or _lost_peer(exc):
            raise _failure(what, exc, other) from None
        _announce(what, exc)
        raise


def _lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another process vanished (gloo, NCCL, the store)."""
    text = str(exc).lower()
    return any(sign in text for sign in ("connection closed by peer", "connection reset", "broken pipe",
                                         "failed to pass monitoredbarrier", "ncclremoteerror", "socket timeout"))


def _store():
    try:
        from torch.distributed import distributed_c10d  # lazy: torch

        store = distributed_c10d._get_default_store()
        store.set_timeout(_STORE_WAIT)
        return store
    except Exception:  # noqa: BLE001 - no store (or its host is gone): failures are then named without a message
        return None


def _announce(what: str, exc: BaseException) -> None:
    store = _store()
    if store is None:
        return
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    with contextlib.suppress(Exception):
        store.set(f"{_FAILED}{rank()}", f"{what}\0{message}")


def _announced(exclude: int) -> dict[int, tuple[str, str]]:
    """``{rank: (what, message)}`` of the other ranks that recorded a failure."""
    store = _store()
    found: dict[int, tuple[str, str]] = {}
    if store is None:
        return found
    for other in range(world_size()):
        if other == exclude:
            continue
        key = f"{_FAILED}{other}"
        with contextlib.suppress(Exception):
            if store.check([key]):
                what, _, message = store.get(key).decode("utf-8", "replace").partition("\0")
                found[other] = (what, message)
    return found


def _failure(what: str, exc: BaseException, announced: Mapping[int, tuple[str, str]] | None = None) -> RankFailure:
    me, world = rank(), world_size()
    announced = announced if announced is not None else _announced(exclude=me)
    if announced:
        other, (where, message) = next(iter(sorted(announced.items())))
        return RankFailure(f"rank {other} of {world} failed in '{where}': {message} (rank {me} stopped at '{what}')")
    text = str(exc)
    named = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    minutes = timeout().total_seconds() / 60
    if named:
        missing = ", ".join(part.strip() for part in named.group(1).split(",") if part.strip())
        return RankFailure(f"rank {missing} of {world} did not reach '{what}' within {minutes:g} min: it died or "
                           f"hangs (see its log; dist_timeout_minutes sets the wait); rank {me} stops")
    missing = _roll_call()
    announced = _announced(exclude=me)   # a peer may have recorded its error meanwhile
    if announced:
        return _failure(what, exc, announced)
    if missing:
        return RankFailure(f"rank {', '.join(map(str, missing))} of {world} died during '{what}' (it vanished without "
                           f"an error: killed, out of memory? see its log); rank {me} stops")
    first = text.strip().splitlines()[0][:160] if text.strip() else type(exc).__name__
    return RankFailure(f"rank {me} of {world} lost contact with the other ranks during '{what}' ({first}); "
                       "see the other ranks' logs")


ROLL_CALL_SECONDS = 15.0
"""How long a rank that lost a peer waits for the other survivors to answer the roll call that names the dead."""


def _roll_call(seconds: float = ROLL_CALL_SECONDS) -> list[int] | None:
    """The ranks that do not answer within ``seconds`` (every survivor of a lost peer answers, as it fails too);
    None when the rendezvous store is gone (its host, rank 0 outside torchrun, died)."""
    store = _store()
    if store is None:
        return None
    try:
        store.set(f"pretrieve/roll-call/{rank()}", "here")
        deadline = time.monotonic() + seconds
        while True:
            missing = [r for r in range(world_size()) if not store.check([f"pretrieve/roll-call/{r}"])]
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.25)
    except Exception:  # noqa: BLE001 - the store went away with its host
        return [0] if rank() != 0 else None


# ---------------------------------------------------------------------------------------------- splitting
def shard_bounds(num_rows: int, shard: int, num_shards: int) -> tuple[int, int]:
    """Row range ``[start, end)`` of shard ``shard`` of ``num_shards`` (contiguous, sizes differ by ≤ 1)."""
    if num_shards < 1:
        raise ConfigError(f"number of shards must be >= 1, got {num_shards}")
    if not 0 <= shard < num_shards:
        raise ConfigError(f"shard must be in [0, {num_shards - 1}], got {shard}")
    return num_rows * shard // num_shards, num_rows * (shard + 1) // num_shards


def bounds(count: int, of_rank: int | None = None, world: int | None = None, unit: int = 1) -> tuple[int, int]:
    """The contiguous slice ``[a, b)`` of ``count`` items that rank ``of_rank`` (default: this one) handles: whole
    runs of ``unit`` items (the block a single process works on at once: an encoding window, a query block), so that
    every unit is computed exactly as one process computes it; slices differ by at most one unit."""
    if unit < 1:
        raise ConfigError(f"unit must be >= 1, got {unit}")
    units = -(-count // unit)
    first, last = shard_bounds(units, rank() if of_rank is None else of_rank, world_size() if world is None else world)
    return min(count, first * unit), min(count, last * unit)


def part_path(path: str | Path, of_rank: int | None = None, world: int | None = None) -> Path:
    """Where a rank writes its part of ``path``: a hidden ``.tmp`` sibling (cleaned like any interrupted write)."""
    path = Path(path)
    r, w = rank() if of_rank is None else of_rank, world_size() if world is None else world
    return path.with_name(f".{path.name}.part-{r}-of-{w}.tmp")


def split_files(outputs: Sequence[tuple[Path, str, Mapping[str, Any], Mapping[str, Any]]],
                count: int | Callable[[], int], write_part: Callable[[int, int, list[Path]], T], what: str,
                check: Callable[[list[T]], None] | None = None, unit: int = 1) -> list[T]:
    """Write files of ``count`` items split by rank; returns every rank's ``write_part`` result, in rank order.
    ``count`` may be a function, called only when several ranks split the items (a stream that must be read
    through to be counted is then read once more only where it is split).

    ``outputs``: ``(path, kind, settings, inputs)`` of each file (as :func:`pretrieve.artifacts.write_file` takes
    them). Each rank calls ``write_part(a, b, paths)`` for its slice ``[a, b)`` (:func:`bounds` of ``unit``), writing item
    order into one path per output; ``check(results)`` (every rank, same answer) may refuse the result before
    anything is written; rank 0 then concatenates the parts in rank order into each output, atomically and
    recorded. In a single process ``write_part(0, count, …)`` (``0, sys.maxsize`` for a ``count`` function: every item)
    writes the outputs' temporary files directly."""
    if not active():
        with contextlib.ExitStack() as stack:
            tmps = [stack.enter_context(artifacts.write_file(path, kind, settings, inputs))
                    for path, kind, settings, inputs in outputs]
            result = write_part(0, count if isinstance(count, int) else sys.maxsize, tmps)
            if check is not None:
                check([result])
        return [result]
    count = count if isinstance(count, int) else count()
    start, end = bounds(count, unit=unit)
    parts = [part_path(path) for path, *_ in outputs]
    with guard(what):
        for part in parts:
            part.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        result = write_part(start, end, parts)
        logger.info("%s: rank %d wrote items %d-%d of %d in %.1f s", what, rank(), start, end, count,
                    time.perf_counter() - started)
    results = gather(result, what)
    if check is not None:
        with guard(what):
            check(results)
    if is_main():
        with guard(f"{what} (merging the parts)"):
            for path, kind, settings, inputs in outputs:
                with artifacts.write_file(path, kind, settings, inputs) as tmp, open(tmp, "wb") as handle:
                    for other in range(world_size()):
                        _append(handle, part_path(path, other))
    barrier(f"{what} (merged)")
    for part in parts:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    return results


def _append(handle, part: Path) -> None:
    if not part.exists():
        raise ConfigError(f"the part {part} of another rank is missing (is the output directory on a file system "
                          "every node shares?)")
    with open(part, "rb") as source:
        shutil.copyfileobj(source, handle, 1 << 20)
