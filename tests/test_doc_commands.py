"""Every ``pretrieve …`` command line quoted in README.md and docs/*.md names a command that exists and flags that
command takes (issue 25, "Help and docs drift"), checked on the click command tree of the typer app — no process per
line; and every help text shows as written (rich markup would swallow ``[@SPLIT]``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from rich.text import Text

from pretrieve.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*```(\S*)")
CODE_SPAN = re.compile(r"`([^`]+)`")
# where a quoted shell command ends: a pipe, a list, a redirection or a comment
COMMAND_END = re.compile(r"\s(?:\||&&|;|>|2>|#)\s|\s(?:>|2>)\S")
PLACEHOLDERS = {"…", "...", "|"}   # an ellipsis where a command goes ends the check
ROOT_COMMAND = typer.main.get_command(app)


def quoted_commands(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every shell command quoted in a markdown file: the lines of shell code blocks (``\\``
    continuations joined) and the code spans of the prose (a span may wrap onto the next line)."""
    found: list[tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    block: str | None = None
    pending, start = "", 0
    prose: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if fence:
            block = fence.group(1).lower() if block is None else None
            continue
        if block is None:
            prose.append((number, line))
        elif block in SHELL_BLOCKS:
            if not pending:
                start = number
            pending += line.rstrip("\\").strip() + " "
            if not line.rstrip().endswith("\\"):
                found.append((start, pending.strip()))
                pending = ""
    text = "\n".join(line for _, line in prose)
    for match in CODE_SPAN.finditer(text):
        line = prose[text.count("\n", 0, match.start())][0]
        found.append((line, match.group(1).replace("\\|", "|").replace("\n", " ")))
    return found


def pretrieve_words(command: str) -> list[str] | None:
    """The words after ``pretrieve`` when ``command`` runs the CLI (``pretrieve …``, ``.venv/bin/pretrieve …``,
    ``python -m pretrieve …``, ``torchrun … -m pretrieve …``, after ``VAR=value`` settings), else None."""
    command = COMMAND_END.split(f" {command} ", maxsplit=1)[0]
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for index, word in enumerate(words):
        if word == "pretrieve" or word.endswith("/pretrieve"):
            before = words[:index]
            launched = bool(before) and before[-1] == "-m"
            if launched or all("=" in w or w in ("time", "nice", "exec") for w in before):
                return words[index + 1:]
            return None
    return None


def option_names(command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def problems(words: list[str]) -> list[str]:
    """What does not exist in ``pretrieve WORDS``: a command or sub-command, a flag of the command reached."""
    found: list[str] = []
    commands = [(ROOT_COMMAND, "pretrieve")]   # alternatives (`train|score|teacher`) are all checked
    reached_leaf = False
    for raw in words:
        word = raw.strip("[](){}")
        if word in ("…", "...") and not reached_leaf:
            break   # `pretrieve bench … --out FILE`: any of the sub-commands
        if not word or word in PLACEHOLDERS:
            continue
        if re.match(r"--?[A-Za-z]", word):
            flag = word.split("=", 1)[0]
            for command, name in commands:
                if flag not in option_names(command):
                    found.append(f"'{name}' has no option {flag}")
            continue
        if reached_leaf:
            continue   # an argument or an option's value
        groups = [(c, n) for c, n in commands if isinstance(c, typer.core.TyperGroup)]
        if not groups:
            reached_leaf = True
            continue
        following = []
        for alternative in word.split("|"):
            for command, name in groups:
                sub = command.commands.get(alternative)
                if sub is None:
                    found.append(f"'{name}' has no command '{alternative}'")
                else:
                    following.append((sub, f"{name} {alternative}"))
        if not following:
            break
        commands = following
    return found


def doc_command_lines() -> list[tuple[str, list[str]]]:
    lines = []
    for path in DOCS:
        for line, text in quoted_commands(path):
            words = pretrieve_words(text)
            if words is not None:
                lines.append((f"{path.relative_to(ROOT)}:{line}", words))
    return lines


def test_the_extractor_finds_quoted_commands_and_checks_them():
    lines = doc_command_lines()
    assert len(lines) > 50 and any(where.startswith("docs/") for where, _ in lines)
    assert pretrieve_words("torchrun --nproc_per_node 2 -m pretrieve run r.yaml | tee log") == ["run", "r.yaml"]
    assert pretrieve_words("python -c 'from pretrieve import x'") is None
    assert problems(["reranker", "train|score|teacher", "--precision", "auto|fp16"]) == []
    assert problems(["rerank", "train"]) == ["'pretrieve' has no command 'rerank'"]
    assert problems(["reranker", "score|train", "--steps", "3"]) == ["'pretrieve reranker score' has no option --steps"]
    assert problems(["run", "--smoke", "RECIPE", "--no-progress", "--redo-changed=1"]) == []


def test_every_command_line_of_the_docs_exists():
    wrong = [f"{where}: pretrieve {' '.join(words)}: {problem}"
             for where, words in doc_command_lines() for problem in problems(words)]
    assert not wrong, "\n".join(wrong)


def _all_commands(command, name="pretrieve"):
    yield name, command
    for sub_name, sub in getattr(command, "commands", {}).items():
        yield from _all_commands(sub, f"{name} {sub_name}")


@pytest.mark.parametrize("name,command", list(_all_commands(ROOT_COMMAND)), ids=lambda value: str(value))
def test_help_texts_show_as_written(name, command):
    """typer renders help as rich markup: ``[@SPLIT]`` or ``[bold]`` would be eaten; write ``\\[`` for a bracket."""
    texts = [command.help or ""] + [getattr(param, "help", None) or "" for param in command.params]
    for text in texts:
        assert Text.from_markup(text).plain == text.replace("\\[", "["), f"{name}: {text!r}"


def test_the_cli_pages_training_options_exist_on_every_training_command():
    """docs/cli.md "Training runs": each option of its table on each command its heading names."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    heading = re.search(r"\*\*Training runs\*\* \(([^;]*);", text)
    commands = [name.strip("` ") for name in heading.group(1).split(",")]
    table = text[heading.end():].split("\n\n", 2)[1]
    flags = re.findall(r"^\| `(--[a-z-]+)", table, flags=re.M)
    assert commands == ["pretrain", "finetune", "reranker train"] and "--divergence-factor" in flags
    wrong = [problem for name in commands for flag in flags for problem in problems([*name.split(), flag])]
    assert not wrong, wrong
