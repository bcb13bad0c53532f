"""Splitting a file into parts and running them on processes (pretrieve.data.parallel)."""

from __future__ import annotations

import os

import pytest

from pretrieve.data.jsonl import iter_lines
from pretrieve.data.parallel import byte_ranges, lines_before, located_in_part, resolve_num_proc, run_parts
from pretrieve.errors import ConfigError, InputError


def test_byte_ranges_start_at_line_starts_and_cover_the_file(tmp_path):
    path = tmp_path / "f.txt"
    lines = [f"line {i} " + "x" * (i % 17) + "\n" for i in range(100)]
    path.write_text("".join(lines) + "last without newline", encoding="utf-8")
    for parts in (1, 2, 3, 7, 500):
        ranges = byte_ranges(path, parts)
        assert ranges[0][0] == 0 and len(ranges) <= parts
        read = [line for start, end in ranges for _, line in iter_lines(path, start, end)]
        assert read == lines + ["last without newline"]
        for (_, end), (start, _) in zip(ranges, ranges[1:]):
            assert end == start and path.read_bytes()[start - 1:start] == b"\n"
    assert byte_ranges(tmp_path / "x.jsonl.gz", 4) == [(0, None)]


def test_located_in_part_gives_the_file_line(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("a\nb\nc\nd\n", encoding="utf-8")
    start = 4  # line 3
    assert lines_before(path, start) == 2
    with pytest.raises(InputError) as info:
        with located_in_part(path, start):
            raise InputError("bad", path=path, line=2, field="f")
    assert (info.value.line, info.value.field, str(info.value)) == (4, "f", f"{path}:4: field 'f': bad")


def test_resolve_num_proc():
    assert resolve_num_proc(3, 0) == 3
    assert resolve_num_proc(None, 10) == 1  # small input: one process
    with pytest.raises(ConfigError):
        resolve_num_proc(0, 10)


def _double_unless_in_a_worker(task: tuple[int, int]) -> int:
    parent, value = task
    if os.getpid() != parent:
        os._exit(3)  # a worker dying (killed, or a script without a __main__ guard)
    return 2 * value


def test_a_broken_pool_finishes_in_this_process():
    tasks = [(os.getpid(), i) for i in range(4)]
    assert run_parts(_double_unless_in_a_worker, tasks, 2) == [0, 2, 4, 6]
