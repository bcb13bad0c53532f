"""Does a run reproduce its documented numbers? Compares every measure of every row (retriever × collection) of two
recipe ``results.json`` files, rounded to ``--digits`` (default 4), and the dev choice of each ``select`` stage.

    python scripts/experiments/compare_measured.py outputs/scifact-minilm/results.json \\
        docs/measured/scifact-minilm.results.json

Prints each difference (and each row only one side has) and exits 1 if there is any, 0 if every number matches.
``scripts/demo.sh`` ends with this comparison against the numbers documented in docs/recipes.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def numbers(results: dict[str, Any]) -> dict[tuple[str, str, str], Any]:
    """(retriever, collection, measure) → value, for every numeric measure of every row, plus each fusion's dev
    choice as (retriever, collection, "chosen")."""
    table: dict[tuple[str, str, str], Any] = {}
    for row in results["rows"]:
        key = (row["retriever"], row["collection"])
        for name, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                table[(*key, name)] = value
        selection = (row.get("fusion") or {}).get("selection")
        if selection:
            table[(*key, "chosen")] = selection["chosen"]
    return table


def differences(new: dict, old: dict, digits: int) -> list[str]:
    lines = []
    for key in sorted(set(new) | set(old)):
        if key not in new or key not in old:
            lines.append(f"{' / '.join(key)}: only in {'the new run' if key in new else 'the documented run'}")
            continue
        a, b = new[key], old[key]
        same = round(a, digits) == round(b, digits) if isinstance(a, float) or isinstance(b, float) else a == b
        if not same:
            lines.append(f"{' / '.join(key)}: {a} (new) vs {b} (documented)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new", type=Path)
    parser.add_argument("documented", type=Path)
    parser.add_argument("--digits", type=int, default=4)
    args = parser.parse_args()
    new, old = (numbers(json.loads(path.read_text(encoding="utf-8"))) for path in (args.new, args.documented))
    found = differences(new, old, args.digits)
    for line in found:
        print(line)
    print(f"{len(new)} numbers compared to {args.digits} digits: "
          + ("all match" if not found else f"{len(found)} differ"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
