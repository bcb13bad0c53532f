"""``pretrieve data convert --corpus para.txt --titles para.title.txt``: RocketQA's MS MARCO passages joined with
their titles (as bowdpr's ``get_data.sh`` joins them), on a small hand-made sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrieve.data.convert import convert
from pretrieve.errors import ConfigError, InputError

PARA = ("0\tThe presence of communication amid scientific minds was equally important.\n"
        "1\tThe Manhattan Project and its atomic bomb helped bring an end to World War II.\n"
        "2\tEssay on the Manhattan Project - The Manhattan Project was to see if making an atomic bomb was possible.\n")
TITLES = "0\tThe Manhattan Project\n1\t-\n2\t\n"    # RocketQA's para.title.txt: '-' where a passage has no title


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_titled_corpus_equals_the_hand_made_join(tmp_path):
    report = convert(tmp_path / "out", corpus=write(tmp_path / "para.txt", PARA),
                     titles=write(tmp_path / "para.title.txt", TITLES))
    expected = [
        {"_id": "0", "title": "The Manhattan Project",
         "text": "The presence of communication amid scientific minds was equally important."},
        {"_id": "1", "title": "-",
         "text": "The Manhattan Project and its atomic bomb helped bring an end to World War II."},
        {"_id": "2", "title": "",
         "text": "Essay on the Manhattan Project - The Manhattan Project was to see if making an atomic bomb was "
                 "possible."}]
    lines = (tmp_path / "out" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == expected and report.documents == 3


@pytest.mark.parametrize("titles, line, match", [("0\tA\n2\tC\n1\tB\n", 2, "id '2' where the corpus has '1'"),
                                                 ("0\tA\n1\tB\n", None, "ends before document '2'"),
                                                 ("0\tA\n1\tB\n2\tC\n3\tD\n", 4, "more lines than the corpus")])
def test_titles_out_of_step_with_the_corpus_are_located(tmp_path, titles, line, match):
    with pytest.raises(InputError, match=match) as error:
        convert(tmp_path / "out", corpus=write(tmp_path / "para.txt", PARA), titles=write(tmp_path / "t.txt", titles))
    assert error.value.line == line and "t.txt" in str(error.value)
    with pytest.raises(ConfigError, match="give --corpus too"):
        convert(tmp_path / "out", titles=tmp_path / "t.txt")
