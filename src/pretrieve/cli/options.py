"""Option helpers shared by the training and scoring commands (``pretrain``, ``finetune``, ``mine``, ``reranker``).

Torch-free: help texts and defaults come from the settings dataclasses of :mod:`pretrieve.train.settings`, and
config files are read by the torch-free :func:`pretrieve.io_utils.load_config_file`, so ``pretrieve --help`` never
imports torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping, Optional

import typer

from pretrieve.data.registry import resolve_collection
from pretrieve.io_utils import load_config_file

DATA_HELP = "Collection directory in BEIR layout."
SCORING_PRECISION_HELP = ("auto | fp32 | bf16 | fp16 | int8; auto: bf16 only where the hardware computes it "
                          "natively (a GPU with bf16, a CPU with AVX512-BF16/AMX), else fp32; int8: the linear "
                          "layers quantised (CPU).")
PRECISION_HELP = ("auto | fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler; auto: bf16 where the hardware "
                  "computes it natively, else fp32).")
REQUIRED = "Required (here or in --config)."
OVERWRITE_HELP = "Discard a previous run in --out (checkpoints, final/, logs) and start afresh."
INEXACT_HELP = ("Resume even when a checkpoint's RNG state cannot be restored (warns; losses differ from an "
                "uninterrupted run).")
QUERY_PROMPT_HELP = ("Text prepended to every query (E5/BGE-style instruction, e.g. 'query: '); replaces the "
                     "prompt the model saved ('' for none).")
PASSAGE_PROMPT_HELP = ("Text prepended to every passage (e.g. 'passage: '); replaces the prompt the model saved "
                       "('' for none).")
DIVERGENCE_HELP = ("Stop when the loss stays above this multiple of its running median (+ MAD, at least 1) "
                   "for 3 steps in a row (0: only non-finite losses).")


def settings_option(config_cls, name: str, *flags: str, extra: str = "", default_text: str | None = None, **kwargs):
    """An option whose value is None unless given (so a --config file can set it), with the help text and the
    default of the config dataclass field ``name`` (``default_text`` overrides the shown default)."""
    field = {f.name: f for f in dataclasses.fields(config_cls)}[name]
    shown = default_text if default_text is not None else field.default
    text = (field.metadata.get("help", "") + " " + extra).strip()
    return typer.Option(None, *flags, help=text, show_default=str(shown) if shown not in ("", None) else False,
                        **kwargs)


# The options the training commands (``finetune``, ``reranker train``) share, declared once (typer reads the option
# from the annotation; the default, None, is the signature's: a --config file's value stands).
Steps = Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps (0 = use --epochs).",
                                              show_default="0")]
Schedule = Annotated[Optional[str], typer.Option("--schedule", help="linear | cosine | constant.",
                                                 show_default="linear")]
WarmupRatio = Annotated[Optional[float], typer.Option("--warmup-ratio", help="Warmup share of the steps.",
                                                     show_default="0.1")]
WarmupSteps = Annotated[Optional[int], typer.Option("--warmup-steps", help="Warmup steps (overrides --warmup-ratio).")]
MinLrRatio = Annotated[Optional[float], typer.Option("--min-lr-ratio", help="Floor of the decay, as a fraction of --lr.",
                                                     show_default="0")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed of sampling, data order and init.",
                                             show_default="42")]
Precision = Annotated[Optional[str], typer.Option("--precision", help=PRECISION_HELP, show_default="fp32")]
Bf16 = Annotated[Optional[bool], typer.Option("--bf16/--no-bf16", help="Deprecated: --precision bf16.",
                                              show_default="off")]
GradientCheckpointing = Annotated[Optional[bool], typer.Option("--gradient-checkpointing",
                                                               help="Recompute activations in the backward pass.")]
NumWorkers = Annotated[Optional[int], typer.Option("--num-workers", help="DataLoader workers.", show_default="0")]
SaveEvery = Annotated[Optional[int], typer.Option("--save-every", help="Checkpoint every N steps.",
                                                  show_default="500")]
LogEvery = Annotated[Optional[int], typer.Option("--log-every", help="Log every N steps.", show_default="10")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint in --out.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help=OVERWRITE_HELP)]
AllowInexactResume = Annotated[bool, typer.Option("--allow-inexact-resume", help=INEXACT_HELP)]
DivergenceFactor = Annotated[Optional[float], typer.Option("--divergence-factor", help=DIVERGENCE_HELP,
                                                           show_default="10")]

#: Command parameters that are not settings (read by the command itself).
NOT_SETTINGS = ("config", "resume")
#: Flag name → settings name, where they differ.
SETTING_NAMES = {"steps": "max_steps"}
#: On/off switches whose "off" leaves the --config file's value (None: not given).
SWITCHES = ("overwrite", "allow_inexact_resume")


def training_flags(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a training command's flags give (``finetune``, ``reranker train``), from its parameters
    (``locals()`` as the command starts): paths as strings, ``--steps`` as ``max_steps``, an unset switch as None,
    without ``--config`` and ``--resume``. A None value is a flag not given (the config file's value stands)."""
    flags: dict[str, Any] = {}
    for name, value in parameters.items():
        if name in NOT_SETTINGS:
            continue
        if isinstance(value, Path):
            value = str(value)
        if name in SWITCHES:
            value = value or None
        flags[SETTING_NAMES.get(name, name)] = value
    return flags


def training_config(build: Callable[..., Any], config: Optional[Path], flags: Mapping[str, Any], resume: bool) -> Any:
    """A training command's run settings: ``build(file values, flags, resume=, where=)`` over the ``--config`` file,
    its collection resolved (a name, from the flag or the file)."""
    run_config = build(load_file(config), flags, resume=resume, where=str(config or "config"))
    run_config.data = resolve_data(run_config.data)
    return run_config


def load_file(path: Optional[Path]) -> dict:
    """The values of a ``--config`` YAML/JSON file ({} without one)."""
    return {} if path is None else load_config_file(path)


def resolve_data(data: Optional[str]) -> Optional[str]:
    """A ``--data`` collection name or path, resolved (:func:`pretrieve.data.registry.resolve_collection`)."""
    return None if not data else str(resolve_collection(data))


# ------------------------------------------------------------------------------------------ experiment trackers
REPORT_TO_HELP = ("Experiment trackers besides OUT/logs.jsonl, comma-separated, by accelerate's names: tensorboard "
                  "(events in OUT/trackers/), wandb, mlflow, comet_ml, aim, clearml, dvclive, swanlab, trackio; all "
                  "(every installed one) or none.")


def report_to_option():
    """``--report-to``, the same on every training command (``pretrain``, ``finetune``, ``reranker train``)."""
    return typer.Option(None, "--report-to", help=REPORT_TO_HELP, show_default="none")
