"""Writing benchmark results: markdown tables, the environment they were measured in, JSON beside them.

Every ``pretrieve bench`` command prints a markdown report and, with ``--out FILE.md``, writes it to
``FILE.md`` and the raw numbers to ``FILE.json`` (same stem). Both carry :func:`environment`: machine,
thread count, package versions, date and the exact command line, so a number in ``docs/benchmarks.md``
can be traced to how it was measured.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from pretrieve.io_utils import atomic_open, write_json
from pretrieve.provenance import versions


def environment() -> dict[str, Any]:
    """Where and how a benchmark ran (CPU cores visible, torch threads, versions, date, command)."""
    import torch

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
