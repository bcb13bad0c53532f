"""The practitioner recipe on collections it was not shaped on (docs/preregistration.md, section B and amendment 14;
issues 21 and 56).

Runs ``configs/scifact-minilm.yaml`` with only its data and evaluation collections changed, as a new user would, once
per training case, and evaluates each case in-domain and zero-shot on every other shared collection:

* ``scifact``: the recipe itself (SciFact train → test), plus zero-shot MED, LISA, TIME and ADI;
* ``cranfield-a`` / ``-b``, ``time-a`` / ``-b``: the collection's judged queries halved (seeded, ``pretrieve data
  halves``); fine-tune on one half (its own dev queries carved by the recipe's ``dev:``), test on the other, both
  ways; zero-shot on SciFact and the other four (MED, LISA and ADI have too few queries for a half to give the
  recipe's 20 dev queries: they are zero-shot and guard collections only).

The recipe's ``select`` stage guards the collections it was not trained on (amendment 14): the first half of each
other collection's test queries is its guard, and every zero-shot collection is evaluated on the second half.

Each case is an ordinary recipe run (resumable: re-run the same command), written to ``OUT/<case>/``; the derived
recipes are written beside them (``OUT/<case>.yaml``) so each can be re-run alone with ``pretrieve run``.
``--include`` a finished run of the shipped recipe (e.g. ``outputs/scifact-minilm``) adds the other zero-shot
collections to that run — the shipped recipe plus one evaluate stage, written to ``OUT/scifact-zero-shot.yaml`` with
the run's own ``out``, so its models and runs are reused — and its rows to the table. At the end, one table of every
case's ``final`` against the untrained RRF of BM25 + the off-the-shelf model on each collection (Δ, 95 % CI, paired
t-test p, the row the results page says to use) and the bars of issue 56, read from each run's ``results.json``, is
printed and written to ``OUT/summary.md``; ``--summary-only`` writes it from the cases that have finished.

    python scripts/experiments/recipe_across_collections.py --out outputs/across
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


# Every shared collection: the training cases' sources and the zero-shot collections (docs/recipes.md).
COLLECTIONS = ["scifact", "cranfield", "med", "lisa", "time", "adi"]
# The zero-shot collections of the cross-collection check beyond the recipe's own Cranfield.
MORE_ZERO_SHOT = ["med", "lisa", "time", "adi"]
# The training cases, in the pre-registered order (amendment 14); "-a"/"-b": halves made by `pretrieve data halves`.
CASES = ["scifact", "cranfield-a", "time-a", "cranfield-b", "time-b"]


def source_of(case: str) -> str:
    """The shared collection a case trains on (``cranfield-a`` → ``cranfield``)."""
    return case[:-2] if case[-2:] in ("-a", "-b") else case


def derived_recipe(case: str, out: Path) -> dict:
    """The shipped recipe with only ``data``, ``out``, ``name`` and the evaluated collections changed: its first
    evaluate stage (every row) on ``case``'s test queries (the SciFact case: as shipped, SciFact and Cranfield), and
    one more evaluate stage on every other shared collection (BM25, the off-the-shelf model and the fusions, the
    same paired tests; no row of a fine-tuned model alone, whose corpus encodings would double the time on a CPU)."""
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["name"] = f"{recipe['name']}-{case}"
    recipe["data"] = case
    recipe["out"] = str(out / case)
    evaluates = [stage for stage in recipe["stages"] if "evaluate" in stage]
    recipe["stages"] = [stage for stage in recipe["stages"] if "evaluate" not in stage] + evaluates[:1]
    first = evaluates[0]["evaluate"]
    if case != recipe_data():
        first["collections"] = [case]      # the first (all rows), on the held-out half only
    others = [c for c in COLLECTIONS if c != source_of(case) and c not in first["collections"]]
    recipe["stages"].append({"evaluate": {**first, "collections": others, "retrievers": []}})
    return recipe


def recipe_data() -> str:
    return str(yaml.safe_load(RECIPE.read_text())["data"])


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


def make_halves(out: Path, seed: int, names: list[str]) -> Path:
    """``OUT/halves``: each collection's judged queries halved (``pretrieve data halves``), made once."""
    halves = out / "halves"
    for name in names:
        if not (halves / f"{name}-b" / "qrels" / "test.tsv").exists():
            run([PRETRIEVE, "data", "halves", name, "--out", str(halves), "--seed", str(seed)])
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


def summary_lines(cases: list[tuple[str, Path]], measure: str = "nDCG@10", baseline: str = "rrf-zero-shot") -> list[str]:
    """One line per case and collection: ``final`` − the untrained RRF (Δ, 95 % CI, p), whether the collection was
    trained on, the row the results page says to use there, the dev (and guard) choice; then the bars of issue 56."""
    from pretrieve.recipe.results import row_to_use   # the results page's own rule

    lines = [f"| case | collection | trained on | final | {baseline} | Δ | 95 % CI | p | bar | use there | final uses |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    in_domain, zero_shot_below, in_domain_below, missing = [], [], [], []
    for case, path in cases:
        results = json.loads(path.read_text()) if path.exists() else {"rows": []}
        if not final_rows(results):     # not run, or only its training stages so far
            missing.append(case)
            continue
        scores = {(row["retriever"], row["collection"]): row[measure] for row in results["rows"]}
        for row in final_rows(results):
            test = row["vs"][baseline]
            selection = (row.get("fusion") or {}).get("selection", {})
            chosen = selection.get("chosen", "?") + (f" ({selection['fusion']})" if selection.get("fusion") else "")
            below = bool(test["significant"] and test["mean_difference"] < 0)
            own = row.get("in_domain", True)
            if own:
                in_domain.append(test["mean_difference"])
                in_domain_below += [f"{case} on {row['collection']}"] if below else []
            else:
                zero_shot_below += [f"{case} on {row['collection']}"] if below else []
            lines.append(f"| {case} | {row['collection']} | {'yes' if own else 'no'} | {row[measure]:.4f} | "
                         f"{scores[(baseline, row['collection'])]:.4f} | {test['mean_difference']:+.4f} | "
                         f"[{test['ci_low']:+.4f}, {test['ci_high']:+.4f}] | {test['p_value']:.2g} | "
                         f"{'**below**' if below else 'holds'} | `{row_to_use(row, baseline)[0]}` | {chosen} |")
    mean = sum(in_domain) / len(in_domain) if in_domain else float("nan")
    lines += ["", f"Zero-shot bar (never significantly below `{baseline}`, p ≤ 0.05): "
              + ("**fails** on " + ", ".join(zero_shot_below) if zero_shot_below else "holds") + ".",
              f"In-domain bar (mean Δ ≥ 0 over the {len(in_domain)} cases, none significantly below): mean Δ "
              f"{mean:+.4f}; " + ("**significantly below** on " + ", ".join(in_domain_below)
                                  if in_domain_below else "none significantly below")
              + f" ({'holds' if in_domain and mean >= 0 and not in_domain_below else '**fails**'}; section B's mean > 0: "
              f"{'yes' if mean > 0 else 'no'})."]
    if missing:
        lines += [f"Not run (no evaluated `final` yet): {', '.join(missing)}."]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/across"))
    parser.add_argument("--halves-seed", type=int, default=0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--include", action="append", default=[],
                        help="another finished run of the recipe to add to the table (e.g. outputs/scifact-minilm)")
    parser.add_argument("--summary-only", action="store_true", help="write the summary of the finished cases only")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cases = [case for case in args.cases.split(",") if case]
    if not args.summary_only:
        halves = make_halves(out, args.halves_seed, sorted({source_of(c) for c in cases if source_of(c) != c}))
        for case in cases:
            run_recipe(derived_recipe(case, out), out / f"{case}.yaml", halves)
    table = [(case, out / case / "results.json") for case in cases]
    for index, path in enumerate(args.include):   # the SciFact run(s), with the other zero-shot collections added
        if not args.summary_only:
            run_recipe(zero_shot_recipe(Path(path)), out / f"scifact-zero-shot{index or ''}.yaml", None)
        table.append((f"scifact ({path})", Path(path) / "results.json"))
    write_summary(out, summary_lines(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
