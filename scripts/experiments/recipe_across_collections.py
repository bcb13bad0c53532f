"""The practitioner recipe on collections it was not shaped on (docs/preregistration.md, section B and amendments 14
and 16; issues 21 and 56).

Runs ``configs/scifact-minilm.yaml`` with only its data, seed and evaluation collections changed, as a new user
would, once per training case, and evaluates each case in-domain and zero-shot on every other shared collection:

* ``scifact``: SciFact train → test, zero-shot on the whole test split of Cranfield, MED, LISA, TIME and ADI;
* ``cranfield-a`` / ``-b``, ``time-a`` / ``-b``: the collection's judged queries halved (seeded, ``pretrieve data
  halves``); fine-tune on one half (its own dev queries carved by the recipe's ``dev:``), test on the other, both
  ways; zero-shot on the whole test split of SciFact and the other four (MED, LISA and ADI have too few queries for
  a half to give the recipe's 20 dev queries: they are zero-shot collections only).

**Amendment 16** (this script): the recipe's ``seed`` and its dev draw's seed are 1 in every case, the halves are
drawn with seed 1, and the ``select`` stage has no guard (its dev gate as shipped). The results page recommends
``final`` in-domain and the untrained fusion ``rrf-zero-shot`` on every collection the model was not trained on, so
the zero-shot bar holds by construction; ``final``'s zero-shot numbers are reported descriptively (how many
collections fine-tuning hurt, helped, left unchanged). The in-domain bar is judged on ``final``. Amendment 14's
guarded runs and their records (``docs/measured/across/``) are not re-made by this script.

Each case is an ordinary recipe run (resumable: re-run the same command; a finished case is not run again, so its
records keep their stage times), written to ``OUT/<case>/``; the derived recipes are written beside them
(``OUT/<case>.yaml``) so each can be re-run alone with ``pretrieve run``. After each
case, and at the end, one table of every case's recommended row and ``final`` against ``rrf-zero-shot`` on each
collection (Δ, 95 % CI, paired t-test p) and the bars, read from each run's ``results.json``, is written to
``OUT/summary.md``; ``--summary-only`` writes it from the cases that have finished. ``--commit`` copies each
finished case's ``results.json`` / ``results.md`` (paths relative to the checkout; no model, no run file) and the
summary into ``docs/measured/across-16/`` and commits those files alone, one commit per case.
``--include`` a finished run of the shipped recipe (e.g. ``outputs/scifact-minilm``) adds MED, LISA, TIME and ADI to
that run (amendment 7: the shipped recipe plus one evaluate stage, with the run's own ``out``, so its models and runs
are reused) and its rows to the table. ``--smoke`` runs every case with ``pretrieve run --smoke`` (tiny models,
sliced data: the script checked end to end in minutes; numbers meaningless).

    python scripts/experiments/recipe_across_collections.py --out outputs/across-16 --commit
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "scifact-minilm.yaml"
RECORDS = ROOT / "docs" / "measured" / "across-16"

# Every shared collection: the training cases' sources and the zero-shot collections (docs/recipes.md).
COLLECTIONS = ["scifact", "cranfield", "med", "lisa", "time", "adi"]
# The training cases, in the pre-registered order (amendments 14 and 16); "-a"/"-b": `pretrieve data halves`.
CASES = ["scifact", "cranfield-a", "time-a", "cranfield-b", "time-b"]
# The zero-shot collections ``--include`` adds to a run of the shipped recipe beyond its own Cranfield (amendment 7).
MORE_ZERO_SHOT = ["med", "lisa", "time", "adi"]
# Amendment 16's fresh randomness: the recipe's seed, its dev draw's seed and the halves' seed.
SEED = 1
BASELINE = "rrf-zero-shot"


def source_of(case: str) -> str:
    """The shared collection a case trains on (``cranfield-a`` → ``cranfield``)."""
    return case[:-2] if case[-2:] in ("-a", "-b") else case


def derived_recipe(case: str, out: Path, seed: int | None = SEED) -> dict:
    """The shipped recipe with only ``name``, ``data``, ``out``, the seeds (``seed`` and ``dev.seed``; None: as
    shipped), the guard (none: amendment 16) and the evaluated collections changed: its first evaluate stage (every
    row) on ``case``'s test queries (the SciFact case: as shipped, SciFact and Cranfield), and one more evaluate
    stage on every other shared collection's whole test split (BM25, the off-the-shelf model and the fusions, the
    same paired tests; no row of a fine-tuned model alone, whose corpus encodings would double the time on a CPU)."""
    recipe = yaml.safe_load(RECIPE.read_text())
    shipped_data = str(recipe["data"])
    recipe["name"] = f"{recipe['name']}-{case}"
    recipe["data"] = case
    recipe["out"] = str(out / case)
    if seed is not None:
        recipe["seed"] = seed
        recipe["dev"] = {**(recipe.get("dev") or {}), "seed": seed}
    for stage in recipe["stages"]:
        if "select" in stage:
            stage["select"].pop("guard", None)
    evaluates = [stage for stage in recipe["stages"] if "evaluate" in stage]
    recipe["stages"] = [stage for stage in recipe["stages"] if "evaluate" not in stage] + evaluates[:1]
    first = evaluates[0]["evaluate"]
    if case != shipped_data:
        first["collections"] = [case]      # the first (all rows), on the held-out half only
    others = [c for c in COLLECTIONS if c != source_of(case) and c not in first["collections"]]
    recipe["stages"].append({"evaluate": {**first, "collections": others, "retrievers": []}})
    return recipe


def zero_shot_recipe(run_dir: Path) -> dict:
    """``--include``: the shipped recipe, writing to the finished run ``run_dir``, with one more evaluate stage:
    zero-shot :data:`MORE_ZERO_SHOT` with BM25, the off-the-shelf model, the stage-2 model and ``final`` (fusion
    weights and model: the run's SciFact dev choice), and the same paired tests (amendment 7)."""
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["out"] = str(run_dir.resolve())
    evaluate = dict(next(stage for stage in recipe["stages"] if "evaluate" in stage)["evaluate"])
    recipe["stages"].append({"evaluate": {**evaluate, "collections": MORE_ZERO_SHOT, "retrievers": ["finetune-s2"]}})
    return recipe


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


PRETRIEVE = [sys.executable, "-m", "pretrieve"]


def make_halves(out: Path, seed: int, names: list[str]) -> Path:
    """``OUT/halves``: each collection's judged queries halved with ``seed`` (``pretrieve data halves``; made
    unless current, remade when the seed differs)."""
    halves = out / "halves"
    for name in names:
        run([*PRETRIEVE, "data", "halves", name, "--out", str(halves), "--seed", str(seed)])
    return halves


def run_recipe(recipe: dict, path: Path, halves: Path | None, smoke: bool = False) -> None:
    """Write the derived ``recipe`` to ``path`` and run it (resumable); the halves are found through --data-root,
    every other collection as usual. ``smoke``: ``pretrieve run --smoke``, written to the recipe's own ``out``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    run([*PRETRIEVE, "run", str(path), *(["--data-root", str(halves)] if halves else []), "--no-progress",
         *(["--smoke", "--out", recipe["out"]] if smoke else [])])


def final_rows(results: dict) -> list[dict]:
    """The ``final`` row of each evaluated collection of a recipe's results.json, with its paired tests."""
    return [row for row in results["rows"] if row.get("final")]


def finished(run_dir: Path) -> bool:
    """Whether the case in ``run_dir`` has finished: its ``results.json`` has evaluated ``final`` rows and is current
    (intact, every run file it was computed from unchanged)."""
    from pretrieve.recipe.results import results_are_current

    return bool(final_rows(read_results(run_dir / "results.json"))) and results_are_current(run_dir)


def read_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"rows": []}


def summary_lines(cases: list[tuple[str, Path]], measure: str = "nDCG@10", baseline: str = BASELINE) -> list[str]:
    """One line per case and collection: the row the results page recommends there and its score, ``final`` −
    ``baseline`` (Δ, 95 % CI, p), what ``final`` did there, the dev choice; then amendment 16's bars and the
    descriptive counts of ``final`` on the collections it was not trained on."""
    from pretrieve.recipe.results import row_to_use   # the results page's own rule

    lines = [f"| case | collection | trained on | recommended | {measure} | final | {baseline} | Δ final − "
             f"{baseline} | 95 % CI | p | final there | final uses |", "|---" * 12 + "|"]
    in_domain, in_domain_below, missing, kept = [], [], [], []
    effects: dict[str, list[str]] = {"hurt": [], "helped": [], "unchanged": []}
    for case, path in cases:
        results = read_results(path)
        if not final_rows(results):     # not run, or only its training stages so far
            missing.append(case)
            continue
        scores = {(row["retriever"], row["collection"]): row[measure] for row in results["rows"]}
        for row in final_rows(results):
            test = row["vs"][baseline]
            selection = (row.get("fusion") or {}).get("selection", {})
            chosen = selection.get("chosen", "?") + (f" ({selection['fusion']})" if selection.get("fusion") else "")
            if (selection.get("dev_gate") or {}).get("kept_baseline") and case not in kept:
                kept.append(case)
            use, _, effect = row_to_use(row, baseline)
            where = f"{case} on {row['collection']}"
            own = row.get("in_domain", True)
            below = bool(test["significant"] and test["mean_difference"] < 0)
            if own:
                in_domain.append(test["mean_difference"])
                in_domain_below += [where] if below else []
                there = "**below** (in-domain)" if below else "in-domain"
            else:
                label = {"below": "hurt", "above": "helped"}.get(effect, "unchanged")
                effects[label].append(where)
                there = f"**{label}**" if label == "hurt" else label
            recommended = scores.get((use, row["collection"]))
            lines.append(f"| {case} | {row['collection']} | {'yes' if own else 'no'} | `{use}` | "
                         f"{'—' if recommended is None else f'{recommended:.4f}'} | {row[measure]:.4f} | "
                         f"{scores[(baseline, row['collection'])]:.4f} | {test['mean_difference']:+.4f} | "
                         f"[{test['ci_low']:+.4f}, {test['ci_high']:+.4f}] | {test['p_value']:.2g} | {there} | "
                         f"{chosen} |")
    zero_shot = sum(len(v) for v in effects.values())
    mean = sum(in_domain) / len(in_domain) if in_domain else float("nan")
    lines += ["", f"Zero-shot bar (amendment 16: the recommended row, `{baseline}` on every collection the model was "
              f"not trained on, never significantly below `{baseline}`, p ≤ 0.05): holds by construction "
              f"({zero_shot} zero-shot comparisons).",
              f"`final` zero-shot (descriptive; paired two-sided t-test against `{baseline}`, p ≤ 0.05): hurt "
              f"{len(effects['hurt'])}, helped {len(effects['helped'])}, unchanged {len(effects['unchanged'])} of "
              f"{zero_shot}" + "".join(f"; {label}: {', '.join(where)}" for label, where in effects.items()
                                       if where and label != "unchanged") + ".",
              f"In-domain bar (`final` against `{baseline}`: mean Δ ≥ 0 over the {len(in_domain)} cases, none "
              f"significantly below, p ≤ 0.05): mean Δ {mean:+.4f}; "
              + ("**significantly below** on " + ", ".join(in_domain_below) if in_domain_below
                 else "none significantly below")
              + f" ({'holds' if in_domain and mean >= 0 and not in_domain_below else '**fails**'}; section B's "
              f"mean > 0: {'yes' if mean > 0 else 'no'}).",
              f"The dev gate kept the untrained fusion in {len(kept)} of {len(in_domain)} cases"
              + (f" ({', '.join(kept)})" if kept else "") + "."]
    if missing:
        lines += [f"Not run (no evaluated `final` yet): {', '.join(missing)}."]
    return lines


def write_summary(out: Path, lines: list[str]) -> str:
    summary = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(summary)
    print(summary)
    return summary


def relative_to_checkout(text: str) -> str:
    """``text`` with this checkout's absolute path removed (run files named ``outputs/…`` as in the other records)."""
    return text.replace(f"{ROOT}/", "")


def commit_case(case: str, run_dir: Path, summary: str, records: Path = RECORDS) -> bool:
    """Copy the finished case's ``results.json`` / ``results.md`` and the summary into ``records`` and commit those
    files alone (``git commit -- PATHS``: nothing else staged is included); False when nothing changed (a re-run)."""
    records.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in ("results.json", "results.md"):
        target = records / f"{case}.{name}"
        target.write_text(relative_to_checkout((run_dir / name).read_text()))
        paths.append(target)
    (records / "summary.md").write_text(relative_to_checkout(summary))
    paths.append(records / "summary.md")
    git = ["git", "-C", str(records)]
    names = [str(path.resolve()) for path in paths]
    run([*git, "add", "--", *names])
    if not subprocess.run([*git, "diff", "--cached", "--quiet", "--", *names]).returncode:
        return False
    run([*git, "commit", "-q", "-m", f"cross-collection check records (amendment 16, issue 56): {case} landed",
         "--", *names])
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/across-16"))
    parser.add_argument("--seed", type=int, default=SEED, help="the recipe's, its dev draw's and the halves' seed")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--include", action="append", default=[],
                        help="a finished run of the shipped recipe (e.g. outputs/scifact-minilm) to add MED, LISA, "
                             "TIME and ADI to, and to the table (amendment 7)")
    parser.add_argument("--summary-only", action="store_true", help="write the summary of the finished cases only")
    parser.add_argument("--commit", action="store_true",
                        help="commit each finished case's results.json/results.md and the summary to --records")
    parser.add_argument("--records", type=Path, default=RECORDS, help="where --commit keeps the records")
    parser.add_argument("--smoke", action="store_true", help="every case with `pretrieve run --smoke` (a check)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cases = [case for case in args.cases.split(",") if case]
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    if args.smoke and args.commit and args.records.resolve() == RECORDS:
        parser.error("--smoke numbers are meaningless: commit them only to another --records directory")
    table = [(case, out / case / "results.json") for case in cases]
    if not args.summary_only:
        halves = make_halves(out, args.seed, sorted({source_of(c) for c in cases if source_of(c) != c}))
        for case in cases:
            if finished(out / case):   # not run again: a re-run would rewrite its stage times as ~0 s
                print(f"{case}: finished ({out / case}/results.json is current); not run again", flush=True)
            else:
                run_recipe(derived_recipe(case, out, args.seed), out / f"{case}.yaml", halves, smoke=args.smoke)
            summary = write_summary(out, summary_lines(table))
            if args.commit and final_rows(read_results(out / case / "results.json")):
                commit_case(case, out / case, summary, args.records.resolve())
    for index, path in enumerate(args.include):   # a run of the shipped recipe, with the other zero-shot collections
        if not args.summary_only:
            run_recipe(zero_shot_recipe(Path(path)), out / f"scifact-zero-shot{index or ''}.yaml", None)
        table.append((f"scifact ({path})", Path(path) / "results.json"))
    write_summary(out, summary_lines(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
