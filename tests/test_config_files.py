"""One reader for every YAML/JSON config (``--config`` files, method files, recipes): a syntax error is one line,
``error: file:line: invalid YAML: problem (column c)``, exit 2, whichever command reads the file."""

from __future__ import annotations

import sys

import pytest

from pretrieve.errors import InputError
from pretrieve.io_utils import load_config_file

BROKEN = "lr: 1e-4\nbatch_size: 4\nmax_steps: 3\nseed: [1,\n  2\nwarmup_ratio: 0\n"


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def test_a_yaml_syntax_error_is_one_line_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\n  b: 2\n")
    with pytest.raises(InputError) as caught:
        load_config_file(bad)
    assert str(caught.value) == f"{bad}:2: invalid YAML: mapping values are not allowed here (column 4)"
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"a": 1,\n "b": }\n')
    with pytest.raises(InputError, match=f"^{bad_json}:2: invalid JSON: Expecting value"):
        load_config_file(bad_json)
    a_list = tmp_path / "list.yaml"
    a_list.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="must be a mapping"):
        load_config_file(a_list, what="method")
    with pytest.raises(InputError, match="method file not found"):
        load_config_file(tmp_path / "missing.yaml", what="method")
    (tmp_path / "empty.yaml").write_text("")
    assert load_config_file(tmp_path / "empty.yaml") == {}


@pytest.mark.parametrize("command", ["config", "method", "recipe"])
def test_every_reader_reports_a_yaml_syntax_error_on_one_line(tmp_path, capsys, monkeypatch, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    args = {"config": ["finetune", "--config", str(bad), "--model", "m", "--data", str(tmp_path),
                       "--out", str(tmp_path / "o")],
            "method": ["pretrain", "--method", str(bad), "--model", "m", "--corpus", "c", "--out", str(tmp_path / "o")],
            "recipe": ["run", str(bad)]}[command]
    code, err = _main(capsys, monkeypatch, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {bad}:6: invalid YAML: ")
    assert "while parsing a flow sequence on line 4" in lines[0]
    assert "<unicode string>" not in err
