"""The practitioner recipe on collections it was not shaped on (docs/preregistration.md, section B; issue 21).

Runs ``configs/scifact-minilm.yaml`` with only its data and evaluation collections changed, as a new user would:

* ``cranfield-a`` / ``cranfield-b``: Cranfield's 225 judged queries halved (seeded, ``pretrieve data halves``);
  fine-tune on one half (its own dev queries carved by the recipe's ``dev:``), test on the other, both ways;
* the SciFact case is the recipe itself (``bash scripts/demo.sh``), whose evaluate stage has SciFact test and
  zero-shot Cranfield; ``--include`` a finished run of it (e.g. ``outputs/scifact-minilm``) adds the other
  zero-shot collections (MED, LISA, TIME, ADI) to that run — the shipped recipe plus one evaluate stage, written to
  ``OUT/scifact-zero-shot.yaml`` with the run's own ``out``, so its models and runs are reused (a run made with
  other settings is refused, naming the setting that differs) — and its rows to the table.

Each case is an ordinary recipe run (resumable: re-run the same command), written to ``OUT/<case>/``; the
derived recipes are written beside them (``OUT/<case>.yaml``) so each can be re-run alone with ``pretrieve run``.
At the end, one table of every case's ``final`` against the untrained RRF of BM25 + the off-the-shelf model (Δ,
95 % CI, paired t-test p), read from each run's ``results.json``, is printed and written to ``OUT/summary.md``.

    python scripts/experiments/recipe_across_collections.py --out outputs/across --include outputs/scifact-minilm
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "scifact-minilm.yaml"


def derived_recipe(case: str, out: Path) -> dict:
    """The shipped recipe with only ``data``, ``out``, ``name`` and the evaluated collections changed (its first
    evaluate stage, on ``case``'s test queries; the zero-shot collections are the SciFact case's)."""
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["name"] = f"{recipe['name']}-{case}"
    recipe["data"] = case
    recipe["out"] = str(out / case)
    evaluates = [stage for stage in recipe["stages"] if "evaluate" in stage]
    recipe["stages"] = [stage for stage in recipe["stages"] if "evaluate" not in stage] + evaluates[:1]
    evaluates[0]["evaluate"]["collections"] = [case]      # the first (all rows), on the held-out half only
    return recipe


# The zero-shot collections of the cross-collection check beyond the recipe's own Cranfield (docs/recipes.md).
MORE_ZERO_SHOT = ["med", "lisa", "time", "adi"]


def zero_shot_recipe(run_dir: Path) -> dict:
    """The shipped recipe, writing to the finished run ``run_dir``, with one more evaluate stage: zero-shot
    :data:`MORE_ZERO_SHOT` with BM25, the off-the-shelf model, the stage-2 model and ``final`` (fusion weights and
    model: the run's SciFact dev choice), and the same paired tests."""
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["out"] = str(run_dir.resolve())
    evaluate = dict(next(stage for stage in recipe["stages"] if "evaluate" in stage)["evaluate"])
    recipe["stages"].append({"evaluate": {**evaluate, "collections": MORE_ZERO_SHOT, "retrievers": ["finetune-s2"]}})
    return recipe


PRETRIEVE = str(Path(sys.executable).with_name("pretrieve"))


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def cranfield_halves(out: Path, seed: int) -> Path:
    """``OUT/halves``: Cranfield's judged queries halved (``pretrieve data halves``), made once."""
    halves = out / "halves"
    if not (halves / "cranfield-b" / "qrels" / "test.tsv").exists():
        run([PRETRIEVE, "data", "halves", "cranfield", "--out", str(halves), "--seed", str(seed)])
    return halves


def run_recipe(recipe: dict, path: Path, halves: Path | None) -> None:
    """Write the derived ``recipe`` to ``path`` and run it (resumable); the halves are found through --data-root,
    every other collection as usual."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    run([PRETRIEVE, "run", str(path), *(["--data-root", str(halves)] if halves else []), "--no-progress"])


def write_summary(out: Path, lines: list[str]) -> None:
    summary = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(summary)
    print(summary)


def final_rows(results: dict) -> list[dict]:
    """The ``final`` row of each evaluated collection of a recipe's results.json, with its paired tests."""
    return [row for row in results["rows"] if row.get("final")]


def summary_lines(cases: list[tuple[str, Path]], measure: str = "nDCG@10") -> list[str]:
    """One line per case and collection: ``final`` − the untrained RRF (Δ, 95 % CI, p) and the dev choice."""
    lines = ["| case | collection | final | rrf-zero-shot | Δ | 95 % CI | p | holds | final uses |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case, path in cases:
        results = json.loads(path.read_text())
        scores = {(row["retriever"], row["collection"]): row[measure] for row in results["rows"]}
        for row in final_rows(results):
            test = row["vs"]["rrf-zero-shot"]
            chosen = (row.get("fusion") or {}).get("selection", {}).get("chosen", "?")
            below = test["significant"] and test["mean_difference"] < 0
            lines.append(f"| {case} | {row['collection']} | {row[measure]:.4f} | "
                         f"{scores[('rrf-zero-shot', row['collection'])]:.4f} | {test['mean_difference']:+.4f} | "
                         f"[{test['ci_low']:+.4f}, {test['ci_high']:+.4f}] | {test['p_value']:.2g} | "
                         f"{'no' if below else 'yes'} | {chosen} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/across"))
    parser.add_argument("--halves-seed", type=int, default=0)
    parser.add_argument("--cases", default="cranfield-a,cranfield-b")
    parser.add_argument("--include", action="append", default=[],
                        help="another finished run of the recipe to add to the table (e.g. outputs/scifact-minilm)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    halves = cranfield_halves(out, args.halves_seed)
    for case in args.cases.split(","):
        run_recipe(derived_recipe(case, out), out / f"{case}.yaml", halves)
    cases = [(case, out / case / "results.json") for case in args.cases.split(",")]
    for index, path in enumerate(args.include):   # the SciFact run(s), with the other zero-shot collections added
        run_recipe(zero_shot_recipe(Path(path)), out / f"scifact-zero-shot{index or ''}.yaml", None)
        cases.append((f"scifact ({path})", Path(path) / "results.json"))
    write_summary(out, summary_lines(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
