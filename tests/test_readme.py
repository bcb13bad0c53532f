"""README.md is a front door: short paragraphs, the two quick-start commands, and a CLI and a Python example on
one's own collection that run as written (on a tiny random model standing in for ``minilm`` and a generated
collection standing in for ``my-collection``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from test_python_docs import notebook, run_blocks, tiny_mlm_128  # noqa: F401  (fixtures)
from test_finetune import write_collection

README = Path(__file__).resolve().parents[1] / "README.md"
QUICK_START = ["bash scripts/demo.sh", "bash scripts/test.sh"]


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _paragraphs(text: str) -> list[str]:
    """Prose blocks between blank lines (a whole list counts as one), code blocks, tables and headings left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not line.startswith(("|", "#"))]
        if lines:
            out.append("\n".join(lines))
    return out


def test_no_paragraph_of_the_readme_runs_over_80_words():
    long = [(len(p.split()), p[:60]) for p in _paragraphs(README.read_text(encoding="utf-8")) if len(p.split()) > 80]
    assert not long, long


def test_the_quick_start_is_the_two_commands():
    block = re.search(r"```bash\n(.*?)```", _section("Quick start"), re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == QUICK_START


def test_the_cli_and_python_examples_run_as_written(notebook, tmp_path, monkeypatch):  # noqa: F811
    from pretrieve.cli import app

    section = _section("On your own collection")
    monkeypatch.chdir(tmp_path)
    write_collection(tmp_path / "my-collection")
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    assert [shlex.split(c)[:2] for c in commands] == [["pretrieve", "bm25"], ["pretrieve", "dense"],
                                                      ["pretrieve", "evaluate"]]
    runner = CliRunner()
    for command in commands:
        result = runner.invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, (command, result.output)
    assert "nDCG@10" in result.output and "minilm" in result.output
    python = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(python) == 1
    namespace = run_blocks(python, "README.md")
    assert list(namespace["table"].results) == ["bm25", "minilm", "fused"]
