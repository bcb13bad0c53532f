"""Choose the practitioner recipe's fine-tuning defaults on dev queries of several collections (issue 21, item 3;
docs/preregistration.md, section B: "Defaults").

For every setting of the grid (``--lr`` × ``--epochs``) and every in-domain case — SciFact and Cranfield's two
halves (``pretrieve data halves``; fine-tune on one half's training queries) — the shipped recipe
``configs/scifact-minilm.yaml`` is run with only ``data``, the fine-tuning ``lr`` / ``epochs`` and the output
changed, and **without its evaluate stage**: nothing reads a test query. What is compared is the dev score of the
recipe's ``final`` row — the best of its ``select`` candidates (off the shelf, WiSE-FT interpolations, fine-tuned),
each fused with BM25 by RRF or a weighted sum — as ``select`` compares them: the **cross-fitted** dev score (a
weighted sum's weights fitted on four folds of the dev queries score the fifth; docs/preregistration.md, amendment
2), read from ``fuse/final.<candidate>/fusion.json``.

Decision rule (fixed before any number is seen): the setting with the highest **mean dev nDCG@10 of final over the
cases** becomes the recipe's default; a tie (4 digits) goes to the setting the recipe ships. The table also gives
each case's dev score of the fine-tuned model alone and which candidate ``select`` chose.

Each run is an ordinary, resumable recipe run in ``OUT/<case>/<setting>/`` (re-run the same command to continue);
the derived recipes are written beside them. ``--cases`` and ``--lr`` / ``--epochs`` narrow the grid.

    python scripts/experiments/recipe_defaults.py --out outputs/defaults

Cost on a 2-core AVX2-only CPU, one thread per process: a Cranfield half ≈ 30 min per setting, SciFact ≈ 2–3 h
(two fine-tunings of 46 steps per epoch and six encodings of its corpus), ≈ 19 h for the whole grid; two processes
with disjoint ``--cases`` (e.g. ``cranfield-a,cranfield-b`` and ``scifact``) share the work, and a last run with
every case (finished runs are reused) writes the combined table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_across_collections import (RECIPE, derived_recipe, make_halves, run_recipe,  # noqa: E402
                                       write_summary)  # (a sibling script, not a package)


def setting_name(lr: float, epochs: float) -> str:
    return f"lr{lr:g}-epochs{epochs:g}"


def grid_recipe(case: str, lr: float, epochs: float, out: Path) -> dict:
    """The shipped recipe for ``case`` with fine-tuning ``lr`` / ``epochs`` and no evaluate stage."""
    recipe = derived_recipe(case, out, seed=None)   # the shipped seeds, as amendment 3's grid ran
    recipe["name"] = f"{recipe['name']}-{setting_name(lr, epochs)}"
    recipe["out"] = str(out / case / setting_name(lr, epochs))
    recipe["finetune"] = {**recipe["finetune"], "lr": lr, "epochs": epochs}
    recipe["stages"] = [stage for stage in recipe["stages"] if "evaluate" not in stage]
    return recipe


def dev_scores(run_dir: Path, name: str = "final") -> dict:
    """Dev nDCG@10 of ``final`` (its chosen candidate's cross-fitted fusion score), of the fine-tuned model alone,
    and the chosen candidate, from the selection the recipe's ``select`` stage wrote to ``results.json``."""
    results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").is_file() else {}
    selection = results.get("selections", {}).get(name)
    if selection is None:
        raise FileNotFoundError(f"{run_dir}/results.json: no selection of {name!r} (has the recipe finished?)")
    candidates = {c["name"]: c for c in selection["candidates"]}
    chosen = candidates[selection["chosen"]]
    return {"final": chosen["cross_fitted"], "alone": candidates[selection["model"]]["alone"],
            "chosen": selection["chosen"], "queries": selection["queries"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/defaults"))
    parser.add_argument("--cases", default="scifact,cranfield-a,cranfield-b")
    parser.add_argument("--lr", default="1e-5,2e-5,5e-5")
    parser.add_argument("--epochs", default="1,2")
    parser.add_argument("--halves-seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    shipped = yaml.safe_load(RECIPE.read_text())["finetune"]
    default = setting_name(float(shipped["lr"]), float(shipped["epochs"]))
    cases = args.cases.split(",")
    halves = make_halves(out, args.halves_seed, ["cranfield"])
    settings = [(float(lr), float(epochs)) for lr in args.lr.split(",") for epochs in args.epochs.split(",")]
    table: dict[str, dict[str, dict]] = {}
    for lr, epochs in settings:
        for case in cases:
            recipe = grid_recipe(case, lr, epochs, out)
            run_recipe(recipe, out / case / f"{setting_name(lr, epochs)}.yaml", halves)
            table.setdefault(setting_name(lr, epochs), {})[case] = dev_scores(Path(recipe["out"]))
    means = {setting: sum(row[c]["final"] for c in cases) / len(cases) for setting, row in table.items()}
    best = max(means, key=lambda s: (round(means[s], 4), s == default))
    lines = [f"Cross-fitted dev nDCG@10 of final (fine-tuned alone; select's choice), {len(cases)} cases; rule: "
             f"highest mean, a 4-digit tie goes to the shipped {default}.", "",
             "| setting | " + " | ".join(cases) + " | mean |", "|---" * (len(cases) + 2) + "|"]
    for setting, row in table.items():
        cells = [f"{row[c]['final']:.4f} ({row[c]['alone']:.4f}; {row[c]['chosen']})" for c in cases]
        mark = " **chosen**" if setting == best else ""
        lines.append(f"| {setting}{mark} | " + " | ".join(cells) + f" | {means[setting]:.4f} |")
    write_summary(out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
