"""``pretrieve bench quality | claims``: the retrieval-quality comparison and the claims benchmark's decision table.

``bench quality`` trains. It calls :func:`pretrieve.bench.quality.run.run_quality_bench` (every method pre-trained
at the same budget, fine-tuned the same way, evaluated on every ``--eval`` collection, over seeds; resumable) and
writes ``results.md`` / ``results.json`` / ``results.png`` into ``--out``; the markdown is also printed.
``--report-only`` recomputes the report from the saved records of ``--out``. ``bench claims`` applies the
pre-registered decision rules to several such comparisons (:mod:`pretrieve.bench.quality.claims`).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import typer

from pretrieve.bench.quality.arms import DEFAULT_METHODS as DEFAULT_QUALITY_METHODS
from pretrieve.bench.quality.arms import FIRST_SEED
from pretrieve.cli.bench import _numbers, _quiet_logging, _set_threads, _split, bench_app, err
from pretrieve.errors import InputError


@bench_app.command("quality")
def bench_quality_command(
    ctx: typer.Context,
    out: Path = typer.Option(..., help="Scratch directory of the comparison (checkpoints, runs, derived collections; "
                             "results.*). Rerun the same command to resume."),
    records: Optional[Path] = typer.Option(None, "--records", help="Records directory: tier.json and one small record "
                                           "per dev-grid point and per arm × seed — the comparison's state, meant to "
                                           "be committed (e.g. results/claims/tier1); a cell with a current record is "
                                           "done on any machine.", show_default="<out>/records"),
    cells: Optional[str] = typer.Option(None, "--cells", help="Run only these arm × seed cells: ARM:SEED or ARM "
                                        "(every seed), comma-separated, e.g. mlm:1,bow:1 (the dev grid runs first if "
                                        "it has no chosen point)."),
    select_only: bool = typer.Option(False, "--select-only", help="Run only the dev grid (its points without a "
                                     "record), no arm × seed cell."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Cells at once, each in its own process (2 on a 2-core CPU; "
                             "6–8 on one GPU)."),
    commit_records: bool = typer.Option(False, "--commit/--no-commit", help="Commit each record with git as it "
                                        "lands (only that file), so a machine that is replaced loses only the cells "
                                        "in flight."),
    precision: str = typer.Option("fp32", "--precision", help="The one precision of every cell (training, encoding, "
                                  "probes): fp32, bf16 or fp16; recorded, and records of another precision do not "
                                  "count."),
    base: str = typer.Option("splade-tiny", help="Starting checkpoint of every method: path or offline alias."),
    methods: Optional[str] = typer.Option(None, help="Comma-separated presets, plus 'none' (no pre-training: the "
                                          "base model is fine-tuned) and NAME-aa (an A/A control: NAME with other "
                                          "seeds).", show_default=",".join(DEFAULT_QUALITY_METHODS)
                                          + "; with --smoke none,mlm,bow,mlm-aa"),
    pretrain_data: Optional[str] = typer.Option(None, "--pretrain-data", help="Pre-training corpus: BEIR dir / "
                                                "JSONL / text, or a collection name; comma-separate several to "
                                                "pre-train on their union", show_default="--train"),
    train: Optional[str] = typer.Option(None, "--train", help="Fine-tuning collection (BEIR, its splits make the "
                                        "folds); required unless --report-only."),
    eval_: Optional[list[str]] = typer.Option(None, "--eval", help="Evaluation collection; repeat (or comma-separate) "
                                              "for several: the training collection is in-domain (pooled over the "
                                              "folds), the others zero-shot.", show_default="--train"),
    folds: str = typer.Option("train:test", "--folds", help="Comma-separated TRAIN:TEST splits of the training "
                              "collection: fine-tune on the first, evaluate on the second (cross-fitting: "
                              "train:test,test:train)."),
    dev_queries: int = typer.Option(100, "--dev-queries", min=0, help="Training queries held out of every fold "
                                    "(seeded), used only to choose the fine-tuning protocol."),
    dev_seed: int = typer.Option(0, "--dev-seed", help="Seed of the dev draw."),
    grid_lr: Optional[str] = typer.Option(None, "--grid-lr", help="Fine-tuning learning rates searched on dev "
                                          "(comma-separated, e.g. 5e-5,1e-4,3e-4); with --grid-epochs."),
    grid_epochs: Optional[str] = typer.Option(None, "--grid-epochs", help="Fine-tuning epochs searched on dev "
                                              "(comma-separated, e.g. 2,5,10)."),
    grid_grow_lr: Optional[str] = typer.Option(None, "--grid-grow-lr", help="Learning rates the grid grows by, "
                                               "once, if the best dev point has the grid's largest lr "
                                               "(pre-registration amendment 9), e.g. 3e-3."),
    grid_grow_epochs: Optional[str] = typer.Option(None, "--grid-grow-epochs", help="Epochs the grid grows by, "
                                                   "once, if the best dev point has the grid's most epochs, e.g. 80."),
    select_arm: str = typer.Option("mlm", "--select-arm", help="The arm whose first seed and fold choose the "
                                   "protocol on dev."),
    contrasts: Optional[str] = typer.Option(None, "--contrasts", help="The declared contrasts, comma-separated A-B; "
                                            "FAMILY:A-B puts one in a Holm family of that name (default: "
                                            "primary), e.g. bow-mlm,mlm-none,anchor:tsdae-mlm,aa:mlm-aa-mlm; "
                                            "multi-bootstrap + Holm within each family",
                                            show_default="the arms' subset of bow-mlm, retromae-mlm, bow-none, "
                                                         "retromae-none, mlm-none"),
    margin: float = typer.Option(0.02, "--margin", help="Non-inferiority / decision margin of a contrast's Δ."),
    bootstrap: int = typer.Option(10_000, "--bootstrap", min=100, help="Multi-bootstrap resamples."),
    probe_steps: Optional[str] = typer.Option(None, "--probe-steps", help="Pre-training steps (comma-separated, e.g. "
                                              "100,300,600) at which each arm's first seed is probed: [CLS] "
                                              "retrieval without fine-tuning and coverage; the gates are computed from them."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="Pre-training steps of every method",
                                         show_default="100; 30 with --quick; minilm-like bases 40"),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Repetitions: seeds --seed, --seed+1, ..."),
    seed: int = typer.Option(FIRST_SEED, "--seed", help="First seed."),
    quick: bool = typer.Option(False, "--quick", help="Small budget for a first look (30 pre-training steps × 16, "
                               "30 fine-tuning steps × 16)."),
    batch_size: Optional[int] = typer.Option(None, min=1, help="Pre-training batch size",
                                            show_default="32; 16 quick or minilm-like bases"),
    max_len: Optional[int] = typer.Option(None, min=8, help="Pre-training max length", show_default="144; 128 quick"),
    lr: Optional[float] = typer.Option(None, help="Pre-training learning rate",
                                       show_default="3e-4; 5e-5 for minilm-like bases"),
    pretrain_overrides: Optional[str] = typer.Option(
        None, "--pretrain", help="Pre-training overrides of every arm: a YAML/JSON file (keys of `pretrieve pretrain "
        "--config`) or key=value,key=value, e.g. bottleneck=mean (the objectives read the mean-pooled vector a "
        "mean-pooled retriever uses; docs/methods.md)."),
    finetune: Optional[str] = typer.Option(None, help="Stage-1 fine-tuning overrides: a YAML/JSON file (keys of "
                                           "`pretrieve finetune --config`, plus 'methods: {NAME: {...}}' per method) "
                                           "or key=value,key=value."),
    split: str = typer.Option("test", help="Qrels split of the zero-shot collections."),
    depth: int = typer.Option(1000, min=100, help="Retrieved passages per query."),
    coverage_texts: int = typer.Option(300, min=1, help="Passages of the coverage sample (the first N of the "
                                       "pre-training corpus)."),
    alpha: float = typer.Option(0.05, help="Significance level (bootstrap intervals, Holm, t-tests)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run again the method × seeds that failed."),
    keep_checkpoints: bool = typer.Option(False, "--keep-checkpoints", help="Keep training checkpoints of "
                                          "finished runs (final models and runs are always kept)."),
    report_only: bool = typer.Option(False, "--report-only", help="Only recompute results.* (into --out) from the "
                                     "records (--records)."),
    smoke: bool = typer.Option(False, "--smoke", help="The same comparison on a tiny random model and a synthetic "
                               "collection with budgets of a few steps: checks the whole harness in under a minute "
                               "(numbers meaningless; --base, --train, --eval, --pretrain-data and budgets ignored)."),
    progress: bool = typer.Option(False, "--progress/--no-progress", help="Progress bars of each stage."),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads of each cell (default: the cores / "
                                          "--jobs)."),
    pretrained_from: Optional[Path] = typer.Option(None, "--pretrained-from", help="Another comparison's scratch "
                                                   "--out: an arm × seed pre-trained there with these settings from "
                                                   "the same inputs (by content) is copied, not pre-trained again "
                                                   "(not for a probed first seed)."),
) -> None:
    """Retrieval quality per pre-training method at an equal budget (Drop your Decoder, Ma et al. 2024, Tables 5/6),
    cross-fitted, with a dev-chosen fine-tuning protocol, coverage and multi-bootstrap contrasts (issue #20)."""
    from pretrieve.bench.quality import report  # lazy: torch

    _quiet_logging()
    _set_threads(threads)
    if report_only:
        summary, paths = report_from_records(out, records or out / "records")
    else:
        if train is None and not smoke:
            raise InputError("give --train DIR (the fine-tuning collection)", field="train")
        summary, paths = run_comparison(comparison_settings(ctx.params), out, cells, select_only, jobs,
                                        commit_records)
    typer.echo(report.results_markdown(summary))
    err.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, markup=False)


def report_from_records(out: Path, records: Path) -> tuple[dict, list[Path]]:
    """``--report-only``: the summary of the records in ``records``, and the report written into ``out``."""
    from pretrieve.bench.quality import report  # lazy: torch
    from pretrieve.bench.quality.summary import summarize  # lazy: torch

    summary = summarize(records)
    return summary, report.write_report(out, summary, records)


def comparison_settings(options: dict[str, Any]) -> Any:
    """The comparison's :class:`pretrieve.bench.quality.settings.QualityBenchSettings` from the command's options
    (``ctx.params``): the base's defaults, then the overrides and budgets given, then ``--smoke``'s."""
    from pretrieve.bench.quality import settings as quality  # lazy: torch

    given = SimpleNamespace(**options)
    pretrain, finetune_defaults = quality.defaults_for_base(given.base, given.quick)
    pretrain.update(quality.parse_overrides(given.pretrain_overrides, "--pretrain"))
    for key, value in (("max_steps", given.budget), ("batch_size", given.batch_size), ("max_len", given.max_len),
                       ("lr", given.lr)):
        if value is not None:
            pretrain[key] = value
    finetune_values, per_method = quality.split_finetune_overrides(
        quality.parse_overrides(given.finetune, "finetune"), "--finetune")

    def numbers(prefix: str, **texts: str | None) -> dict[str, tuple[float, ...]]:
        return {key: tuple(_numbers(text, f"{prefix}-{key}")) for key, text in texts.items() if text}

    def listed(text: str | None, what: str) -> tuple[str, ...] | None:
        return tuple(_split(text, what)) if text else None

    settings = quality.QualityBenchSettings(
        base=given.base, train=given.train or "", out=str(given.out),
        methods=listed(given.methods, "method") or DEFAULT_QUALITY_METHODS,
        pretrain_data=listed(given.pretrain_data, "pretrain-data"),
        eval=tuple(e for entry in given.eval_ or [] for e in _split(entry, "eval")),
        seeds=tuple(range(given.seed, given.seed + given.seeds)), pretrain=pretrain,
        finetune={**finetune_defaults, **finetune_values}, finetune_per_method=per_method, split=given.split,
        depth=given.depth, coverage_texts=given.coverage_texts, alpha=given.alpha,
        folds=tuple(_split(given.folds, "folds")), dev_queries=given.dev_queries, dev_seed=given.dev_seed,
        grid=numbers("grid", lr=given.grid_lr, epochs=given.grid_epochs),
        grid_grow=numbers("grid-grow", lr=given.grid_grow_lr, epochs=given.grid_grow_epochs),
        select_arm=given.select_arm, contrasts=listed(given.contrasts, "contrast") or (), margin=given.margin,
        bootstrap=given.bootstrap,
        probe_steps=tuple(int(v) for v in _numbers(given.probe_steps, "probe-steps")) if given.probe_steps else (),
        precision=given.precision, records=str(given.records) if given.records else None, threads=given.threads,
        retry_failed=given.retry_failed, keep_checkpoints=given.keep_checkpoints, show_progress=given.progress,
        pretrained_from=str(given.pretrained_from.expanduser().absolute()) if given.pretrained_from else None)
    return quality.smoke_settings(settings, explicit_methods=given.methods is not None) if given.smoke else settings


def run_comparison(settings: Any, out: Path, cells: str | None, select_only: bool, jobs: int,
                   commit_records: bool) -> tuple[dict, list[Path]]:
    """Run (or resume) the comparison, its progress lines on stderr; returns its summary and the report's files (in
    ``out``)."""
    from pretrieve.bench.quality import run  # lazy: torch

    started = time.perf_counter()
    summary = run.run_quality_bench(settings, progress=lambda line: err.print(line, highlight=False, markup=False),
                                    cells=_split(cells, "cell") if cells else None, select_only=select_only,
                                    jobs=jobs, commit_records=commit_records)
    err.print(f"[bench quality] {time.perf_counter() - started:.0f} s", highlight=False)
    return summary, [Path(out) / name for name in ("results.md", "results.json", "results.png")]


@bench_app.command("claims")
def bench_claims_command(
    tier1: Optional[Path] = typer.Option(None, "--tier1", help="Tier 1's comparison (SPLADE-tiny: none, mlm, bow, "
                                         "retromae, tsdae, mlm-aa; probes)."),
    budget: Optional[Path] = typer.Option(None, "--budget", help="Tier 2a's comparison (mlm vs bow at 6,000 steps)."),
    scratch: Optional[Path] = typer.Option(None, "--scratch", help="Tier 2b's comparison (the from-scratch base)."),
    dupmae: Optional[Path] = typer.Option(None, "--dupmae", help="Tier 2c's comparison (retromae and dupmae under "
                                          "CLS+OT)."),
    cdmae: Optional[Path] = typer.Option(None, "--cdmae", help="Tier 2d's comparison (cdmae vs cdmae-random)."),
    minilm: Optional[Path] = typer.Option(None, "--minilm", help="Tier 3's comparison (all-MiniLM-L6-v2, mean "
                                          "bottleneck)."),
    scratch_gate: Optional[Path] = typer.Option(None, "--scratch-gate", help="The from-scratch base's held-out MLM "
                                                "accuracy: mlm_accuracy.json of `pretrieve analyze mlm-accuracy` "
                                                "(default: gate.json in --scratch's records, where claims.sh "
                                                "tier2b puts it)."),
    cost: Optional[Path] = typer.Option(None, "--cost", help="The cost row's measurement: FILE.json of `pretrieve "
                                        "bench pretrain --presets mlm,bow --out FILE` (one machine, both arms in "
                                        "one run); default: the trainer logs' means over seeds."),
    margin: float = typer.Option(0.02, "--margin", help="The pre-registered margin."),
    alpha: float = typer.Option(0.05, "--alpha", help="The pre-registered significance level."),
    any_seeds: bool = typer.Option(False, "--any-seeds", help="Decide with the seeds each tier has (smoke runs, "
                                   "interim looks); by default a row whose arms have fewer seeds than "
                                   "pre-registered (Tier 1 and Tier 2a: 3, other tiers: 2) is pending."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the table to FILE.md and FILE.json (atomically)."),
) -> None:
    """The claims benchmark's decision table (issue #20): docs/preregistration.md's rules applied to the tiers'
    `bench quality` comparisons, each recomputed from its records alone; rows whose tiers have not finished are
    pending."""
    from pretrieve.bench.quality import claims  # lazy: torch

    given = {"tier1": tier1, "budget": budget, "scratch": scratch, "dupmae": dupmae, "cdmae": cdmae,
             "minilm": minilm}
    if not any(given.values()):
        raise InputError("give at least one tier's comparison directory, e.g. --tier1 DIR", field="tier1")
    _quiet_logging()
    if scratch_gate is None and scratch is not None and (scratch / claims.GATE_FILE).exists():
        scratch_gate = scratch / claims.GATE_FILE
    gate = claims.read_mlm_gate(scratch_gate) if scratch_gate is not None else None
    if scratch is not None and gate is not None and not (scratch / claims.TIER_FILE).exists():
        given["scratch"] = None      # only the gate's report: a base below the gate runs no cell (claims.sh tier2b)
    tiers = {name: claims.load_tier(name, path) for name, path in given.items() if path is not None}
    table = claims.decide_claims(tiers, margin=margin, alpha=alpha,
                                 seeds=None if any_seeds else claims.PREREGISTERED_SEEDS, scratch_mlm=gate,
                                 cost=claims.read_cost_report(cost) if cost is not None else None)
    typer.echo(claims.claims_markdown(table))
    if out is not None:
        paths = claims.write_claims(table, out)
        err.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, markup=False)
