"""scripts/experiments/compare_measured.py: does a run reproduce the documented numbers to 4 digits?"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "experiments" / "compare_measured.py"


def _results(path: Path, ndcg: float, chosen: str = "finetune-s2", extra_row: bool = False) -> Path:
    rows = [{"retriever": "bm25", "collection": "scifact", "run": "a.trec", "nDCG@10": 0.6762, "MRR@10": 0.6413},
            {"retriever": "final", "collection": "scifact", "run": "b.trec", "nDCG@10": ndcg,
             "fusion": {"selection": {"chosen": chosen}}}]
    if extra_row:
        rows.append({"retriever": "zero-shot", "collection": "scifact", "nDCG@10": 0.6451})
    path.write_text(json.dumps({"rows": rows}), encoding="utf-8")
    return path


def _compare(new: Path, old: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(new), str(old)], capture_output=True, text=True)


def test_numbers_equal_to_four_digits_match_and_any_other_difference_is_named(tmp_path):
    documented = _results(tmp_path / "documented.json", 0.74101)
    same = _compare(_results(tmp_path / "same.json", 0.741004), documented)       # differs in the 6th digit only
    assert same.returncode == 0 and "4 numbers compared to 4 digits: all match" in same.stdout, same.stdout
    other = _compare(_results(tmp_path / "other.json", 0.7405), documented)
    assert other.returncode == 1 and "final / scifact / nDCG@10: 0.7405 (new) vs 0.74101 (documented)" in other.stdout
    choice = _compare(_results(tmp_path / "choice.json", 0.74101, chosen="wise-0.75"), documented)
    assert choice.returncode == 1 and "final / scifact / chosen: wise-0.75 (new) vs finetune-s2" in choice.stdout
    extra = _compare(_results(tmp_path / "extra.json", 0.74101, extra_row=True), documented)
    assert extra.returncode == 1 and "zero-shot / scifact / nDCG@10: only in the new run" in extra.stdout
