"""Writing benchmark results: markdown tables, the environment they were measured in, JSON beside them.

Every ``pretrieve bench`` command prints a markdown report and, with ``--out FILE.md``, writes it to
``FILE.md`` and the raw numbers to ``FILE.json`` (same stem). Both carry :func:`environment`: machine,
thread count, package versions, date and the exact command line, so a number in ``docs/benchmarks.md``
can be traced to how it was measured. The device helpers (:func:`bench_device`, :func:`device_name`,
:func:`synchronize`, the peak-memory pair) serve the benchmarks' ``--device`` option: on CUDA every timestamp
follows a ``torch.cuda.synchronize`` and peak memory is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from pretrieve.errors import InputError
from pretrieve.io_utils import atomic_open, write_json
from pretrieve.provenance import versions


def environment() -> dict[str, Any]:
    """Where and how a benchmark ran (CPU cores visible, torch threads, versions, date, command)."""
    import torch  # lazy: torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(["pretrieve", *sys.argv[1:]]) if Path(sys.argv[0]).name == "pretrieve" else " ".join(sys.argv),
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": versions(),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment_lines(env: dict[str, Any]) -> list[str]:
    """A short markdown bullet list describing :func:`environment`."""
    vers = env.get("versions", {})
    return [
        f"- machine: {env.get('processor')}, {env.get('cpu_count')} CPU cores visible, "
        f"torch threads {env.get('torch_threads')}",
        f"- torch {vers.get('torch', '?')}, transformers {vers.get('transformers', '?')}, "
        f"python {platform.python_version()}",
        f"- date: {env.get('date')}",
        f"- command: `{env.get('command')}`",
    ]


def fmt(value: Any, digits: int = 2) -> str:
    """A table cell: floats rounded, ``None`` as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
    """A GitHub-flavoured markdown table; numbers right-aligned."""
    def align(column: int) -> str:
        numeric = all(isinstance(row[column], (int, float)) and not isinstance(row[column], bool)
                      for row in rows if row[column] is not None) and rows
        return "---:" if numeric else "---"

    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(align(i) for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(fmt(cell, digits) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(markdown: str, data: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """Write ``markdown`` to ``out`` (a ``.md`` file) and ``data`` to the ``.json`` file beside it."""
    md_path = Path(out)
    if md_path.suffix.lower() != ".md":
        md_path = md_path.with_suffix(md_path.suffix + ".md") if md_path.suffix else md_path.with_suffix(".md")
    json_path = md_path.with_suffix(".json")
    with atomic_open(md_path) as handle:
        handle.write(markdown.rstrip() + "\n")
    write_json(json_path, data)
    return md_path, json_path


# ---------------------------------------------------------------------------------------------- devices
BENCH_DEVICES = ("cpu", "cuda")


def bench_device(device: str) -> str:
    """The device a speed benchmark runs on: ``cpu``, or ``cuda`` / ``cuda:N`` when torch sees that GPU
    (:class:`~pretrieve.errors.InputError` otherwise: one ``error:`` line, exit 2, before anything is loaded)."""
    import torch  # lazy: torch

    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if kind not in BENCH_DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise InputError(f"unknown device '{device}' (choose from cpu, cuda, cuda:N)")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__}, "
                             f"CUDA build {torch.version.cuda or 'none'})")
        if index and int(index) >= torch.cuda.device_count():
            raise InputError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return text


def device_name(device: str) -> str:
    """What made a number: ``cpu (<processor>)`` or ``cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB)``."""
    import torch  # lazy: torch

    if not device.startswith("cuda"):
        return f"cpu ({_cpu_name()})"
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    return f"cuda:{index} ({props.name}, {props.total_memory / 2 ** 30:.1f} GiB, CUDA {torch.version.cuda})"


def synchronize(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU, whose work is synchronous."""
    if device.startswith("cuda"):
        import torch  # lazy: torch

        torch.cuda.synchronize(device)


def reset_peak_memory(device: str) -> None:
    """Start a new peak-memory window (CUDA; nothing on the CPU)."""
    if device.startswith("cuda"):
        import torch  # lazy: torch

        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: str) -> float | None:
    """``torch.cuda.max_memory_allocated`` since the last :func:`reset_peak_memory`, in MiB; None on the CPU."""
    if not device.startswith("cuda"):
        return None
    import torch  # lazy: torch

    return torch.cuda.max_memory_allocated(device) / 2 ** 20
