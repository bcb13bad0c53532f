"""Pre-training step speed of every method, on the CPU or a GPU (Drop your Decoder, Ma et al. 2024, Table 4).

Drop your Decoder (Ma et al. 2024) (§4.2 "Pre-training Efficiency", Table 4) compares, per method: the data-processing time, the
time of the additional decoder, and training samples/s with its "degeneration" relative to plain further
pre-training (MLM). :func:`bench_pretrain` measures the same quantities for our presets, side by side in
one process, plus a reference step the way Hugging Face-based reference code (RetroMAE, bowdpr) does it:

* **step** — one full optimizer step: forward + backward + gradient clipping (1.0) + AdamW (our trainer's
  optimizer, :func:`pretrieve.train.loop.build_optimizer`), on an already collated batch; samples/s =
  ``batch_size / median step time``;
* **collate** — data processing per batch with the real collator (:class:`PretrainCollator`: padding,
  encoder masking, and every feature the method's objectives require, e.g. RetroMAE's [B, L, L]
  position-specific masks). Tokenization is done once beforehand, as our pre-training caches token ids
  (:class:`pretrieve.data.pretrain_text.TokenizedCorpus`);
* **encoder fwd / objective fwd** — wall time inside the encoder's forward and inside each objective's
  forward (the MLM head projection of ``mlm``, the [CLS] projection of ``bow``, the decoder layers of
  ``ae``/``ar``/``enhanced``), measured with forward pre-/post-hooks during the timed step (CPU execution
  is synchronous, so wall time between the hooks is the module's time; on CUDA each hook first waits for the
  GPU with ``torch.cuda.synchronize``). Drop your Decoder (Ma et al. 2024) reports the decoder's "GPU time" the
  same way: forward of the extra module only;
* **hf_reference** — a plain ``AutoModelForMaskedLM`` (``BertForMaskedLM``) computing full-vocabulary logits
  at every position ``[B, L, V]`` with ``labels=``, fed by Hugging Face's
  ``DataCollatorForLanguageModeling(whole_word_mask=True, mlm_probability=<encoder ratio>)`` (the successor
  of ``DataCollatorForWholeWordMask`` in transformers 5; the offsets it needs are padded per batch by a
  small glue function, timed as part of its collation). Same shape, same initial weights, same texts;
* **encoder_only** (diagnostic floor) — the same encoder with a trivial loss on its last hidden states
  (mean of squares) and no vocabulary projection at all: forward + backward + AdamW of the body alone.
  ``hf_reference / encoder_only`` is the largest speed-up *any* MLM-head optimisation can give on this
  shape (Amdahl's bound), which tells whether a missed "≥ 2×" bar is fixable in the head or not.

Protocol: every runner gets its own model (same seed → same initial encoder weights) and optimizer. Each
step draws the next ``batch_size`` texts and runs every runner once on them, in an order that rotates from
step to step, so the drift of a shared, noisy machine hits all runners alike; the first ``warmup`` steps are
discarded and medians over the remaining ``steps`` are reported. Each phase is timed twice: wall clock (the
published samples/s) and the process's CPU time (``time.process_time``). With one torch thread
(``--threads 1``) the CPU time excludes the time the process waited while other processes held the core, so
on a shared, loaded machine the CPU-time ratios are the load-insensitive ones (with more threads, OpenMP
workers spinning at barriers count as CPU time too). Collation randomness is seeded per step
(:func:`pretrieve.train.loop.micro_batch_seed`), so all presets mask the same tokens. Ratios between
runners are the numbers to publish; absolute samples/s move ±20 % with the machine's load.

Device (``settings.device``, ``--device``): ``cpu`` (the default) or ``cuda``. On CUDA every runner's model
and optimizer live on the GPU, the collated batch is copied there inside the timed forward phase (collation
itself stays on the CPU, as in a trainer's data loader), every phase boundary follows a ``torch.cuda.synchronize``
(so wall time is GPU time), the peak of ``torch.cuda.max_memory_allocated`` over a runner's measured steps is
reported (``peak_memory_mib``), ``bf16`` autocasts on CUDA, and the bars are judged on wall clock (CPU time
measures only the launching thread there). The report names the device (``cuda:0 (NVIDIA H100 …)``) beside
every section it made.

Shapes: random-init BERT configs (``L6-H384`` = MiniLM: 12 heads, FFN 1536; ``L2-H128``: 2 heads, FFN 512;
``L12-H768`` = bert-base), with the real uncased vocabulary (30,522) from the offline all-MiniLM package (or
SPLADE-tiny's, the same vocabulary, where that package is not installed);
or the shape of a checkpoint given by path/alias (its config, randomly initialised: speed does not depend
on the weights, and all runners then start equal).
"""

from __future__ import annotations

import contextlib
import re
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from pretrieve.bench.report import (bench_device, device_name, fmt, markdown_table, peak_memory_mib, reset_peak_memory,
                                    synchronize)
from pretrieve.data.packing import Packing
from pretrieve.data.pretrain_text import TokenizedCorpus, iter_pretrain_texts
from pretrieve.errors import ConfigError, InputError
from pretrieve.train.settings import LoopConfig, default_of

DEFAULT_PRESETS = ("mlm", "bow", "ae", "ar", "retromae")
REFERENCE = "hf_reference"
FLOOR = "encoder_only"
BASELINE = "mlm"
#: Sustained TFLOP/s per H100 in bf16/fp16 that scripts/experiments/recipe_costs.py (the recipe headers' hours) assumes.
ASSUMED_TFLOPS = 90.0

#: Known shapes: layers, hidden, attention heads, FFN size.
KNOWN_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "L2-H128": (2, 128, 2, 512),        # SPLADE-tiny / BERT-tiny
    "L4-H256": (4, 256, 4, 1024),       # BERT-mini
    "L4-H512": (4, 512, 8, 2048),       # BERT-small
    "L6-H384": (6, 384, 12, 1536),      # MiniLM-L6-H384 (all-MiniLM-L6-v2)
    "L12-H768": (12, 768, 12, 3072),    # bert-base
}
_SHAPE = re.compile(r"^L(\d+)-H(\d+)(?:-A(\d+))?$", re.IGNORECASE)


# ---------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class BertShape:
    """A BERT encoder shape; :meth:`config` gives a random-init config with a given vocabulary."""

    layers: int
    hidden: int
    heads: int
    ffn: int

    @property
    def name(self) -> str:
        return f"L{self.layers}-H{self.hidden}"

    @property
    def size(self) -> int:
        """Body parameters up to a constant (``layers · hidden²``), to compare shapes."""
        return self.layers * self.hidden * self.hidden

    def config(self, vocab_size: int, max_len: int):
        from transformers import BertConfig  # lazy: transformers

        return BertConfig(vocab_size=vocab_size, hidden_size=self.hidden, num_hidden_layers=self.layers,
                          num_attention_heads=self.heads, intermediate_size=self.ffn,
                          max_position_embeddings=max(512, max_len), type_vocab_size=2)


def parse_shape(text: str) -> BertShape:
    """``L6-H384`` (known shapes get their head count and FFN size), or ``L<layers>-H<hidden>[-A<heads>]``
    (default heads ``hidden / 64``, FFN ``4 · hidden``)."""
    match = _SHAPE.match(text.strip())
    if match is None:
        raise InputError(f"'{text}' is not a shape like L6-H384 or L6-H384-A12 (known: {', '.join(KNOWN_SHAPES)})",
                         field="shape")
    layers, hidden = int(match.group(1)), int(match.group(2))
    known = KNOWN_SHAPES.get(f"L{layers}-H{hidden}")
    heads = int(match.group(3)) if match.group(3) else (known[2] if known else max(1, hidden // 64))
    ffn = known[3] if known else 4 * hidden
    if layers < 1 or hidden < 1 or hidden % heads:
        raise InputError(f"shape '{text}': hidden size {hidden} must be a positive multiple of the {heads} heads",
                         field="shape")
    return BertShape(layers, hidden, heads, ffn)


def step_flops(shape: BertShape, vocab: int, tokens: int, length: int, scored: float) -> float:
    """FLOPs of one training step over ``tokens`` positions padded to ``length``, counted as
    scripts/experiments/recipe_costs.py counts them: 3 × forward, where a position's forward is 2 × the body's
    linear parameters + 4 · length · hidden per layer (attention), plus a vocabulary head (2 · hidden · vocab +
    the hidden² transform, twice) at the ``scored`` share of positions."""
    body = shape.layers * (4 * shape.hidden ** 2 + 2 * shape.hidden * shape.ffn)
    per_token = (2 * body + 4 * length * shape.hidden * shape.layers
                 + scored * (2 * shape.hidden * vocab + 2 * shape.hidden ** 2))
    return 3.0 * tokens * per_token


def is_shape(text: str) -> bool:
    return _SHAPE.match(text.strip()) is not None


def shape_of_config(config) -> BertShape:
    """The shape of a Hugging Face config (``intermediate_size`` defaults to ``4 · hidden`` when absent)."""
    hidden = int(config.hidden_size)
    return BertShape(int(config.num_hidden_layers), hidden, int(config.num_attention_heads),
                     int(getattr(config, "intermediate_size", 4 * hidden)))


# ---------------------------------------------------------------------- texts
def load_texts(corpus: str | Path | None, count: int, tokenizer: Any, seed: int = 0,
               words_per_text: int = 200) -> list[str]:
    """The first ``count`` passages of ``corpus`` (BEIR dir / JSONL / text, in file order), or synthetic
    texts when ``corpus`` is None. A corpus with fewer passages is cycled."""
    if count < 1:
        raise ConfigError(f"need at least one text, asked for {count}")
    if corpus is None:
        return synthetic_texts(tokenizer, count, words_per_text=words_per_text, seed=seed)

    texts = list(islice(iter_pretrain_texts(corpus), count))
    if not texts:
        raise InputError("the corpus has no passages", path=corpus)
    return [texts[i % len(texts)] for i in range(count)]


def synthetic_texts(tokenizer: Any, count: int, words_per_text: int = 200, seed: int = 0) -> list[str]:
    """Texts of words drawn uniformly (seeded) from the tokenizer's alphabetic whole-word vocabulary."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = set(tokenizer.all_special_tokens)
    words = [token for token, _ in vocab if token.isalpha() and token.isascii() and token not in special]
    if not words:
        raise ConfigError("the tokenizer has no alphabetic whole-word tokens to build synthetic texts from")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(words), size=(count, words_per_text))
    return [" ".join(words[i] for i in row) for row in picks]


# ---------------------------------------------------------------------- timing helpers
class ModuleTimer:
    """Wall time spent inside the forward of registered modules (forward pre-/post-hooks).

    Nested calls of the same module are timed once (outermost); time of a module called inside another
    timed module counts for both.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: dict[str, list[float]] = defaultdict(list)
        self._handles: list[Any] = []
        self.device = device

    def watch(self, name: str, module: nn.Module) -> None:
        def before(_module, _args, _kwargs=None):
            synchronize(self.device)
            self._open[name].append(time.perf_counter())

        def after(_module, _args, _output):
            synchronize(self.device)
            began = self._open[name].pop()
            if not self._open[name]:
                self.seconds[name] += time.perf_counter() - began

        self._handles.append(module.register_forward_pre_hook(before))
        self._handles.append(module.register_forward_hook(after))

    def reset(self) -> None:
        self.seconds = defaultdict(float)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _autocast(bf16: bool, device: str = "cpu"):
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _to_device(batch: dict[str, Any], device: str) -> dict[str, Any]:
    if device == "cpu":
        return batch
    return {key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
            for key, value in batch.items()}


def _optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> None:
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------- runners
@dataclass
class StepTiming:
    """Seconds of one measured step of one runner: wall clock per phase, process CPU time per phase."""

    collate: float
    forward: float
    backward: float
    optimizer: float
    cpu_collate: float = 0.0
    cpu_step: float = 0.0
    modules: dict[str, float] = field(default_factory=dict)
    peak_memory_mib: float | None = None

    @property
    def step(self) -> float:
        return self.forward + self.backward + self.optimizer


class Runner:
    """One timed training set-up; subclasses provide ``collate(examples, generator)`` and ``loss(batch)``
    and set ``module`` (what the optimizer updates), ``optimizer``, ``bf16`` and ``timer``."""

    name: str = ""
    module: nn.Module
    optimizer: torch.optim.Optimizer
    bf16: bool = False
    max_grad_norm: float = 1.0
    timer: ModuleTimer
    device: str = "cpu"

    def collate(self, examples: Sequence[dict[str, Any]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def extra_modules(self, forward_s: float) -> dict[str, float]:
        return {}

    def step(self, examples: Sequence[dict[str, Any]], generator: torch.Generator) -> StepTiming:
        """Collate, then forward + backward + clip + AdamW; every phase timed (wall and CPU; on CUDA each
        boundary after a synchronize, the batch's copy to the GPU inside the forward phase)."""
        device = self.device
        synchronize(device)
        reset_peak_memory(device)
        c0, w0 = time.process_time(), time.perf_counter()
        batch = self.collate(examples, generator)
        c1, w1 = time.process_time(), time.perf_counter()
        self.timer.reset()
        with _autocast(self.bf16, device):
            loss = self.loss(_to_device(batch, device))
        synchronize(device)
        w2 = time.perf_counter()
        loss.backward()
        synchronize(device)
        w3 = time.perf_counter()
        _optimizer_step(self.module, self.optimizer, self.max_grad_norm)
        synchronize(device)
        c4, w4 = time.process_time(), time.perf_counter()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{self.name}: non-finite loss {float(loss)}")
        modules = dict(self.timer.seconds) | self.extra_modules(w2 - w1)
        return StepTiming(w1 - w0, w2 - w1, w3 - w2, w4 - w3, cpu_collate=c1 - c0, cpu_step=c4 - c1,
                          modules=modules, peak_memory_mib=peak_memory_mib(device))


class PresetRunner(Runner):
    """One pre-training method (preset name or method file) with our model, collator and optimizer."""

    def __init__(self, method_name: str, config, tokenizer: Any, max_len: int, seed: int, bf16: bool,
                 lr: float = default_of(LoopConfig, "lr"), max_grad_norm: float = 1.0, device: str = "cpu"):
        from pretrieve.modeling import Encoder, PretrainModel  # lazy: transformers
        from pretrieve.train.collator import PretrainCollator  # lazy: transformers
        from pretrieve.train.loop import build_optimizer  # lazy: transformers
        from pretrieve.train.method import resolve_method  # lazy: transformers

        self.name = method_name
        self.method = resolve_method(method_name)
        torch.manual_seed(seed)  # same initial encoder for every runner
        self.module = self.model = PretrainModel(Encoder.from_config(config), self.method).to(device)
        self.model.train()
        self.collator = PretrainCollator(tokenizer, self.method, required=self.model.required_features(),
                                         max_len=max_len, seed=seed)
        self.optimizer = build_optimizer(self.model, LoopConfig(lr=lr))
        self.bf16, self.max_grad_norm, self.device = bf16, max_grad_norm, device
        self.timer = ModuleTimer(device)
        self.timer.watch("encoder", self.model.encoder)
        for name, objective in self.model.objectives.items():
            self.timer.watch(f"objective:{name}", objective)

    @property
    def objective_names(self) -> list[str]:
        return list(self.model.objectives)

    @property
    def features(self) -> set[str]:
        return set(self.model.required_features())

    def collate(self, examples, generator):
        return self.collator([{"input_ids": example["input_ids"]} for example in examples], generator=generator)

    def loss(self, batch):
        return self.model(batch)[0]


class HFReferenceRunner(Runner):
    """Plain Hugging Face MLM: full-vocabulary logits at every position, HF's whole-word-mask collator."""

    name = REFERENCE

    def __init__(self, config, tokenizer: Any, mask_ratio: float, seed: int, bf16: bool,
                 lr: float = default_of(LoopConfig, "lr"), max_grad_norm: float = 1.0, device: str = "cpu"):
        from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling  # lazy: transformers

        from pretrieve.train.loop import build_optimizer  # lazy: transformers

        torch.manual_seed(seed)
        self.module = self.model = AutoModelForMaskedLM.from_config(config).to(device)
        self.model.train()
        with warnings.catch_warnings():  # "random token replacement is not supported with whole word masking"
            warnings.simplefilter("ignore")
            self.collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mask_ratio,
                                                            whole_word_mask=True, seed=seed)
        self.optimizer = build_optimizer(self.model, LoopConfig(lr=lr))
        self.bf16, self.max_grad_norm, self.device = bf16, max_grad_norm, device
        self.timer = ModuleTimer(device)
        self.timer.watch("encoder", self.model.base_model)

    def collate(self, examples, generator):
        self.collator.generator = generator
        return self.collator(pad_offsets(examples))

    def loss(self, batch):
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          labels=batch["labels"]).loss

    def extra_modules(self, forward_s: float) -> dict[str, float]:
        return {"head+loss": max(0.0, forward_s - self.timer.seconds.get("encoder", 0.0))}


class EncoderOnlyRunner(Runner):
    """Diagnostic floor: the encoder body with a trivial loss, no vocabulary projection (see module docstring)."""

    name = FLOOR

    def __init__(self, config, tokenizer: Any, max_len: int, seed: int, bf16: bool,
                 lr: float = default_of(LoopConfig, "lr"), max_grad_norm: float = 1.0, device: str = "cpu"):
        from pretrieve.modeling import Encoder  # lazy: transformers
        from pretrieve.train.collator import PretrainCollator  # lazy: transformers
        from pretrieve.train.loop import build_optimizer  # lazy: transformers
        from pretrieve.train.method import resolve_method  # lazy: transformers

        torch.manual_seed(seed)
        self.module = self.encoder = Encoder.from_config(config).to(device)
        self.encoder.train()
        self.collator = PretrainCollator(tokenizer, resolve_method(BASELINE), max_len=max_len, seed=seed)
        self.optimizer = build_optimizer(self.encoder, LoopConfig(lr=lr))
        self.bf16, self.max_grad_norm, self.device = bf16, max_grad_norm, device
        self.timer = ModuleTimer(device)
        self.timer.watch("encoder", self.encoder)

    def collate(self, examples, generator):
        return self.collator([{"input_ids": example["input_ids"]} for example in examples], generator=generator)

    def loss(self, batch):
        hidden = self.encoder(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        return hidden.float().pow(2).mean()


def pad_offsets(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Glue HF's whole-word collator needs: ``tokenizer.pad`` pads the ids, the attention mask and the
    special-tokens mask but not ``offset_mapping``; pad it to the longest example with (0, 0)."""
    longest = max(len(example["input_ids"]) for example in examples)
    padded = []
    for example in examples:
        missing = longest - len(example["input_ids"])
        padded.append({"input_ids": example["input_ids"], "attention_mask": example["attention_mask"],
                       "special_tokens_mask": example["special_tokens_mask"],
                       "offset_mapping": list(example["offset_mapping"]) + [(0, 0)] * missing})
    return padded


# ---------------------------------------------------------------------- the benchmark
@dataclass
class PretrainBenchSettings:
    """What to measure; the defaults are the issue's (batch 32, length 128, 10 steps after 3 warm-up)."""

    presets: tuple[str, ...] = DEFAULT_PRESETS
    batch_size: int = 32
    max_len: int = 128
    steps: int = 10
    warmup: int = 3
    bf16: bool = False
    seed: int = 0
    reference: bool = True
    floor: bool = True
    device: str = "cpu"

    def validate(self) -> None:
        if self.batch_size < 1 or self.max_len < 8 or self.steps < 1 or self.warmup < 0:
            raise ConfigError("batch_size ≥ 1, max_len ≥ 8, steps ≥ 1 and warmup ≥ 0 are required, got "
                              f"{self.batch_size}, {self.max_len}, {self.steps}, {self.warmup}")
        if not self.presets:
            raise ConfigError("give at least one preset to benchmark")
        if len(set(self.presets)) != len(self.presets):
            raise ConfigError(f"presets listed twice: {list(self.presets)}")
        bench_device(self.device)


@dataclass
class PretrainBenchResult:
    """Medians per runner, ratios and the issue's bars, for one shape."""

    shape: str
    settings: dict[str, Any]
    rows: dict[str, dict[str, Any]]
    ratios: dict[str, Any]
    bars: list[dict[str, Any]]
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "settings": self.settings, "rows": self.rows, "ratios": self.ratios,
                "bars": self.bars, "samples": self.samples}

    @classmethod
    def from_dict(cls, data: dict[str, Any], threads: int | None = None) -> "PretrainBenchResult":
        """A saved result with its ratios and bars recomputed from the rows (render old JSON with this code).

        ``threads`` (torch threads of that run) decides the bars' basis when the JSON does not record it.
        """
        settings = dict(data["settings"])
        threads = settings.get("torch_threads", threads)
        basis = "cpu" if threads == 1 else "wall"
        c = settings["config"]
        shape = BertShape(int(c["layers"]), int(c["hidden"]), int(c["heads"]), int(c["ffn"]))
        ratios = _ratios(data["rows"])
        return cls(data["shape"], settings, data["rows"], ratios, _bars(ratios, shape, basis),
                   data.get("samples", {}))


def tokenize_examples(tokenizer: Any, texts: Sequence[str], max_len: int) -> list[dict[str, Any]]:
    """Tokenize once: ids for our collator, plus the offsets/special mask HF's whole-word collator needs."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_len, return_offsets_mapping=True,
                        return_special_tokens_mask=True)
    keys = ("input_ids", "attention_mask", "special_tokens_mask", "offset_mapping")
    return [{key: encoded[key][i] for key in keys} for i in range(len(texts))]


def bench_pretrain(config, tokenizer: Any, texts: Sequence[str], settings: PretrainBenchSettings | None = None,
                   *, shape_name: str | None = None,
                   progress: Callable[[str], None] | None = None) -> PretrainBenchResult:
    """Measure every preset (and the HF reference) on ``config``'s shape; see the module docstring."""
    from pretrieve.train.loop import micro_batch_seed  # lazy: transformers

    settings = settings or PretrainBenchSettings()
    settings.validate()
    examples = tokenize_examples(tokenizer, texts, settings.max_len)
    if not examples:
        raise InputError("no texts to benchmark on", field="texts")
    runners: dict[str, Any] = {}
    for name in settings.presets:
        runners[name] = PresetRunner(name, config, tokenizer, settings.max_len, settings.seed, settings.bf16,
                                     device=settings.device)
    if settings.reference:
        # the baseline's encoder mask ratio (RetroMAE's 0.3 for every preset), so both mask alike
        source = runners.get(BASELINE) or next(iter(runners.values()))
        mask_ratio = source.method.encoder_masker.ratio
        runners[REFERENCE] = HFReferenceRunner(config, tokenizer, mask_ratio, settings.seed, settings.bf16,
                                               device=settings.device)
    if settings.floor:
        runners[FLOOR] = EncoderOnlyRunner(config, tokenizer, settings.max_len, settings.seed, settings.bf16,
                                           device=settings.device)

    names = list(runners)
    timings: dict[str, list[StepTiming]] = {name: [] for name in names}
    total = settings.warmup + settings.steps
    for step in range(total):
        start = (step * settings.batch_size) % len(examples)
        batch = [examples[(start + i) % len(examples)] for i in range(settings.batch_size)]
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:
            generator = torch.Generator().manual_seed(micro_batch_seed(settings.seed, step, 0))
            timing = runners[name].step(batch, generator)
            if step >= settings.warmup:
                timings[name].append(timing)
        if progress is not None:
            phase = "warm-up" if step < settings.warmup else "measured"
            progress(f"step {step + 1}/{total} ({phase}) done")
    shape_spec = shape_of_config(config)
    shape = shape_name or shape_spec.name
    rows = {name: _summarise(timings[name], settings.batch_size) for name in names}
    lengths = [len(example["input_ids"]) for example in examples]
    padded = settings.batch_size * max(lengths)   # synthetic texts all reach max_len
    for name, runner in runners.items():
        rows[name]["objectives"] = getattr(runner, "objective_names", [])
        rows[name]["features"] = sorted(getattr(runner, "features", []))
        scored = _scored_share(name, runner)
        if scored is not None:   # the runners whose whole step the FLOP count covers
            rows[name]["achieved_tflops"] = (step_flops(shape_spec, config.vocab_size, padded, max(lengths), scored)
                                             / rows[name]["step_s"] / 1e12)
    ratios = _ratios(rows)
    on_gpu = settings.device != "cpu"
    basis = "cpu" if torch.get_num_threads() == 1 and not on_gpu else "wall"
    bars = _bars(ratios, shape_spec, basis)
    samples = {name: {"step_s": [t.step for t in timings[name]], "cpu_step_s": [t.cpu_step for t in timings[name]],
                      "collate_s": [t.collate for t in timings[name]]} for name in names}
    info = {"batch_size": settings.batch_size, "max_len": settings.max_len, "steps": settings.steps,
            "warmup": settings.warmup, "bf16": settings.bf16, "seed": settings.seed,
            "presets": list(settings.presets), "reference": settings.reference, "floor": settings.floor,
            "torch_threads": torch.get_num_threads(), "bars_judged_on": basis,
            "mean_tokens_per_example": float(np.mean([len(e["input_ids"]) for e in examples])),
            "config": {"layers": shape_spec.layers, "hidden": shape_spec.hidden, "heads": shape_spec.heads,
                       "ffn": shape_spec.ffn, "vocab": config.vocab_size},
            "device": settings.device, "device_name": device_name(settings.device)}
    return PretrainBenchResult(shape, info, rows, ratios, bars, samples)


def _scored_share(name: str, runner: Any) -> float | None:
    """The share of positions a runner's vocabulary head scores: the masked ones (mlm: its encoder mask ratio), all
    (the HF reference), none (encoder only); None for methods with decoders (not in the count)."""
    if name == REFERENCE:
        return 1.0
    if name == FLOOR:
        return 0.0
    if name == BASELINE:
        return float(runner.method.encoder_masker.ratio)
    return None


def _summarise(timings: list[StepTiming], batch_size: int) -> dict[str, Any]:
    def median(values: list[float]) -> float:
        return float(statistics.median(values))

    step = [t.step for t in timings]
    modules: dict[str, list[float]] = defaultdict(list)
    for timing in timings:
        for key, value in timing.modules.items():
            modules[key].append(value)
    objective_fwd = {key.split(":", 1)[1]: median(v) for key, v in modules.items() if key.startswith("objective:")}
    row: dict[str, Any] = {
        "step_s": median(step),
        "cpu_step_s": median([t.cpu_step for t in timings]),
        "step_p25_s": float(np.percentile(step, 25)),
        "step_p75_s": float(np.percentile(step, 75)),
        "samples_per_s": batch_size / median(step),
        "forward_s": median([t.forward for t in timings]),
        "backward_s": median([t.backward for t in timings]),
        "optimizer_s": median([t.optimizer for t in timings]),
        "collate_s": median([t.collate for t in timings]),
        "cpu_collate_s": median([t.cpu_collate for t in timings]),
        "encoder_forward_s": median(modules["encoder"]) if modules.get("encoder") else None,
        "objective_forward_s": objective_fwd,
    }
    if modules.get("head+loss"):
        row["head_loss_forward_s"] = median(modules["head+loss"])
    peaks = [t.peak_memory_mib for t in timings if t.peak_memory_mib is not None]
    if peaks:
        row["peak_memory_mib"] = max(peaks)
    return row


def _ratios(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Ratios of wall-clock medians and, under ``cpu``, of CPU-time medians (from the rows alone).

    ``mlm_head_speedup_vs_hf`` compares the MLM head's share of a step, ``step − encoder-only step``: what
    gathering the masked positions before the vocabulary projection actually changes.
    """
    ratios: dict[str, Any] = {}
    for suffix, step_key, collate_key in (("", "step_s", "collate_s"), ("cpu", "cpu_step_s", "cpu_collate_s")):
        part: dict[str, Any] = {}
        base = rows.get(BASELINE)
        presets = [name for name in rows if name not in (REFERENCE, FLOOR)]
        if base is not None and REFERENCE in rows:
            part["mlm_step_speedup_vs_hf"] = rows[REFERENCE][step_key] / base[step_key]
            part["mlm_collate_speedup_vs_hf"] = rows[REFERENCE][collate_key] / base[collate_key]
        if REFERENCE in rows and FLOOR in rows:
            part["hf_step_vs_encoder_only"] = rows[REFERENCE][step_key] / rows[FLOOR][step_key]
        if base is not None and FLOOR in rows:
            part["mlm_step_vs_encoder_only"] = base[step_key] / rows[FLOOR][step_key]
            if REFERENCE in rows and base[step_key] > rows[FLOOR][step_key]:
                part["mlm_head_speedup_vs_hf"] = ((rows[REFERENCE][step_key] - rows[FLOOR][step_key])
                                                  / (base[step_key] - rows[FLOOR][step_key]))
        if base is not None:
            part["throughput_vs_mlm"] = {name: base[step_key] / rows[name][step_key] for name in presets}
            part["degeneration_vs_mlm"] = {name: 1.0 - value for name, value in part["throughput_vs_mlm"].items()}
            part["collate_vs_mlm"] = {name: rows[name][collate_key] / base[collate_key] for name in presets}
            enhanced = [name for name in presets if "enhanced_mask" in rows[name].get("features", ())]
            if enhanced:
                part["enhanced_collate_vs_random"] = {name: rows[name][collate_key] / base[collate_key]
                                                      for name in enhanced}
        if suffix:
            ratios[suffix] = part
        else:
            ratios.update(part)
    return ratios


def _bars(ratios: dict[str, Any], shape: BertShape, basis: str) -> list[dict[str, Any]]:
    """The issue's three bars with ``value`` (wall-clock medians) and ``value_cpu`` (CPU-time medians).

    ``met`` is judged on ``basis`` — ``"cpu"`` when torch ran one thread (then CPU time is the
    load-insensitive measure), else ``"wall"`` — and is None when not measured or not applicable.
    """
    minilm = KNOWN_SHAPES["L6-H384"]
    large_enough = shape.size >= minilm[0] * minilm[1] ** 2
    measures = {"wall": ratios, "cpu": ratios.get("cpu", {})}

    def pick(part: dict[str, Any], key: str) -> Any:
        if key == "bow":
            return part.get("throughput_vs_mlm", {}).get("bow")
        if key == "enhanced":
            enhanced = part.get("enhanced_collate_vs_random", {})
            return max(enhanced.values()) if enhanced else None
        return part.get(key)

    def bar(text: str, key: str, threshold: float, applies: bool, at_least: bool) -> dict[str, Any]:
        wall, cpu = pick(measures["wall"], key), pick(measures["cpu"], key)
        judged = cpu if basis == "cpu" else wall
        met = None
        if judged is not None and applies:
            met = judged >= threshold if at_least else judged <= threshold
        return {"bar": text, "value": wall, "value_cpu": cpu, "basis": basis, "threshold": threshold,
                "applies": applies and judged is not None, "met": met}

    first = bar("masked-only MLM step ≥ 2× HF full-vocabulary step", "mlm_step_speedup_vs_hf", 2.0, True, True)
    first["bound"] = pick(measures[basis], "hf_step_vs_encoder_only")
    return [first,
            bar("bow step ≥ 0.95× mlm step (L6-H384 or larger)", "bow", 0.95, large_enough, True),
            bar("enhanced-decoding collation ≤ 2× random-masking collation", "enhanced", 2.0, True, False)]


# ---------------------------------------------------------------------- markdown
def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def result_markdown(result: PretrainBenchResult) -> str:
    """One section: the per-runner table, ratios and bars."""
    s = result.settings
    on_gpu = s.get("device", "cpu") != "cpu"
    where = f" — on {s.get('device_name', s.get('device'))}" if on_gpu else ""
    lines = [f"### {result.shape} — batch {s['batch_size']}, max length {s['max_len']}, "
             f"{'bf16 autocast' if s['bf16'] else 'fp32'}, median of {s['steps']} steps after {s['warmup']} "
             f"warm-up (mean {s['mean_tokens_per_example']:.0f} tokens/example){where}", ""]
    headers = ["runner", "samples/s", "step ms (p25–p75)", "vs mlm", "step CPU ms", "vs mlm (CPU)", "fwd ms",
               "bwd ms", "AdamW ms", "encoder fwd ms", "objective fwd ms", "collate ms", "collate vs mlm"]
    if on_gpu:
        headers.append("peak GPU MiB")
    table = []
    throughput = result.ratios.get("throughput_vs_mlm", {})
    throughput_cpu = result.ratios.get("cpu", {}).get("throughput_vs_mlm", {})
    collate = result.ratios.get("collate_vs_mlm", {})
    for name, row in result.rows.items():
        objectives = row.get("objective_forward_s") or {}
        if name == REFERENCE:
            objective_text = f"head+loss {row.get('head_loss_forward_s', 0) * 1000:.1f}"
        else:
            objective_text = ", ".join(f"{key} {value * 1000:.1f}" for key, value in objectives.items()) or "—"
        table.append([
            name, row["samples_per_s"],
            f"{row['step_s'] * 1000:.0f} ({row['step_p25_s'] * 1000:.0f}–{row['step_p75_s'] * 1000:.0f})",
            throughput.get(name), round(row["cpu_step_s"] * 1000), throughput_cpu.get(name),
            _ms(row["forward_s"]), _ms(row["backward_s"]), _ms(row["optimizer_s"]),
            _ms(row.get("encoder_forward_s")), objective_text, _ms(row["collate_s"]), collate.get(name),
        ] + ([row.get("peak_memory_mib")] if on_gpu else []))
    lines.append(markdown_table(headers, table, digits=2))
    lines.append("")
    ratios, cpu = result.ratios, result.ratios.get("cpu", {})
    if "mlm_step_speedup_vs_hf" in ratios:
        lines.append(f"- masked-only MLM step vs HF full-vocabulary step: **{ratios['mlm_step_speedup_vs_hf']:.2f}×** "
                     f"faster (CPU time: {cpu['mlm_step_speedup_vs_hf']:.2f}×); our collation vs HF's whole-word "
                     f"collator: {ratios['mlm_collate_speedup_vs_hf']:.2f}× faster")
    if "mlm_head_speedup_vs_hf" in ratios:
        lines.append(f"- MLM head alone (step − encoder-only step): masked positions only vs full vocabulary at every "
                     f"position: {ratios['mlm_head_speedup_vs_hf']:.2f}× faster "
                     f"(CPU time: {cpu.get('mlm_head_speedup_vs_hf', float('nan')):.2f}×)")
    if "hf_step_vs_encoder_only" in ratios:
        lines.append(f"- bound for any MLM-head optimisation (HF step / encoder-only step): "
                     f"{ratios['hf_step_vs_encoder_only']:.2f}× (CPU time: {cpu['hf_step_vs_encoder_only']:.2f}×); "
                     f"our mlm step is {ratios['mlm_step_vs_encoder_only']:.2f}× the encoder-only step "
                     f"(CPU time: {cpu['mlm_step_vs_encoder_only']:.2f}×)")
    for name, value in ratios.get("enhanced_collate_vs_random", {}).items():
        lines.append(f"- enhanced-decoding collation ({name}) / random-masking collation (mlm): **{value:.2f}×** "
                     f"(CPU time: {cpu['enhanced_collate_vs_random'][name]:.2f}×)")
    achieved = {name: row["achieved_tflops"] for name, row in result.rows.items() if "achieved_tflops" in row}
    if achieved:
        lines.append("- achieved TFLOP/s (FLOPs counted as scripts/experiments/recipe_costs.py counts them): "
                     + ", ".join(f"{name} **{value:.3g}**" for name, value in achieved.items())
                     + f"; the recipe estimates assume {ASSUMED_TFLOPS:.0f} per H100 in bf16/fp16"
                     + (f" ({BASELINE}: {achieved[BASELINE] / ASSUMED_TFLOPS:.3g}× that)" if BASELINE in achieved
                        else ""))
    lines.append("")
    basis = result.bars[0]["basis"] if result.bars else "wall"
    lines.append(f"| bar | wall-clock medians | CPU-time medians | met ({'CPU time' if basis == 'cpu' else 'wall clock'}) |")
    lines.append("|---|---:|---:|---|")
    for bar in result.bars:
        met = "n/a" if bar["met"] is None else ("**yes**" if bar["met"] else "**no**")
        lines.append(f"| {bar['bar']} | {fmt(bar['value'])} | {fmt(bar['value_cpu'])} | {met} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- packing: real text per second
#: The words of the generated BookCorpus-like stream (short narrative sentences).
_BOOK_WORDS = ("the a he she they man woman door house room night morning back away said looked walked turned "
               "quiet dark slowly never again what why her his").split()


def bookcorpus_like(path: str | Path, books: int = 60, seed: int = 0) -> Path:
    """Write a BookCorpus-like stream to ``path``: one short sentence per line (4–18 words, as BookCorpus's rows
    average ~13 tokens), books of 40–200 sentences one after another with no boundary between them (as the hub's
    ``bookcorpus``)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(books):
        for _ in range(int(rng.integers(40, 201))):
            words = rng.choice(_BOOK_WORDS, size=int(rng.integers(4, 19)))
            lines.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"]))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass
class PackingBenchResult:
    """Per arm (``unpacked``, ``packed``): examples, the share of computed tokens that are real text, and real-text
    tokens per second of one pre-training preset's full step."""

    settings: dict[str, Any]
    arms: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "arms": self.arms}


def bench_packing(config, tokenizer: Any, corpus: str | Path, cache_dir: str | Path,
                  settings: PretrainBenchSettings | None = None, *, across: bool = True, short_seq_prob: float = 0.0,
                  progress: Callable[[str], None] | None = None) -> PackingBenchResult:
    """The same corpus unpacked (each line/document chunked alone) and packed (:mod:`pretrieve.data.packing`;
    ``across``: its documents packed into one another, as BookCorpus), each shuffled (seeded) and fed in
    micro-batches of ``batch_size`` to the first preset's step, padded by its collator to the longest example;
    arms alternate step by step (the protocol of :func:`bench_pretrain`). Real-text tokens are the examples' own
    (their [CLS]/[SEP] and padding excluded); computed tokens are batch × padded length."""
    from pretrieve.train.loop import micro_batch_seed  # lazy: accelerate — bench masking uses this module without it

    settings = settings or PretrainBenchSettings()
    settings.validate()
    packing = Packing(short_seq_prob, (str(corpus),) if across else ())
    corpora = {"unpacked": TokenizedCorpus.build(corpus, tokenizer, settings.max_len, Path(cache_dir) / "unpacked",
                                                 show_progress=False, num_proc=1),
               "packed": TokenizedCorpus.build(corpus, tokenizer, settings.max_len, Path(cache_dir) / "packed",
                                               show_progress=False, num_proc=1, packing=packing)}
    preset = settings.presets[0]
    runners = {arm: PresetRunner(preset, config, tokenizer, settings.max_len, settings.seed, settings.bf16,
                                 device=settings.device) for arm in corpora}
    orders = {arm: np.random.default_rng(settings.seed).permutation(len(data)) for arm, data in corpora.items()}
    measured: dict[str, dict[str, float]] = {arm: defaultdict(float) for arm in corpora}
    total = settings.warmup + settings.steps
    for step in range(total):
        arms = list(corpora) if step % 2 == 0 else list(corpora)[::-1]
        for arm in arms:
            data, order = corpora[arm], orders[arm]
            batch = [data[int(order[(step * settings.batch_size + i) % len(data)])]
                     for i in range(settings.batch_size)]
            generator = torch.Generator().manual_seed(micro_batch_seed(settings.seed, step, 0))
            timing = runners[arm].step(batch, generator)
            if step >= settings.warmup:
                lengths = [len(example["input_ids"]) for example in batch]
                row = measured[arm]
                row["real_tokens"] += sum(length - 2 for length in lengths)
                row["computed_tokens"] += max(lengths) * len(lengths)
                row["step_s"] += timing.step
                row["cpu_step_s"] += timing.cpu_step
        if progress is not None:
            progress(f"step {step + 1}/{total} ({'warm-up' if step < settings.warmup else 'measured'}) done")
    arms_out = {}
    for arm, data in corpora.items():
        row = measured[arm]
        arms_out[arm] = {"examples": len(data), "mean_tokens_per_example": float(data.lengths().mean()),
                         "real_text_share": row["real_tokens"] / row["computed_tokens"],
                         "corpus_real_text_share": _padded_share(data.lengths(), settings.batch_size, settings.seed),
                         "real_tokens_per_s": row["real_tokens"] / row["step_s"],
                         "real_tokens_per_cpu_s": row["real_tokens"] / row["cpu_step_s"]}
    info = {"corpus": str(corpus), "preset": preset, "batch_size": settings.batch_size, "max_len": settings.max_len,
            "steps": settings.steps, "warmup": settings.warmup, "bf16": settings.bf16, "seed": settings.seed,
            "across": across, "short_seq_prob": short_seq_prob, "torch_threads": torch.get_num_threads(),
            "device": settings.device, "device_name": device_name(settings.device)}
    return PackingBenchResult(info, arms_out)


def _padded_share(lengths: np.ndarray, batch_size: int, seed: int) -> float:
    """Real text over computed tokens for a whole epoch of seeded-shuffled micro-batches (special tokens and padding
    not text)."""
    shuffled = lengths[np.random.default_rng(seed).permutation(len(lengths))]
    usable = max(batch_size, len(shuffled) // batch_size * batch_size)
    batches = np.resize(shuffled, usable).reshape(-1, batch_size)
    return float((batches - 2).sum() / (batches.max(axis=1) * batch_size).sum())


def packing_markdown(result: PackingBenchResult) -> str:
    """The packing section: both arms, the share of real text and real-text tokens/s, and the issue's bars."""
    s, arms = result.settings, result.arms
    lines = [f"### Packing — {s['preset']}, batch {s['batch_size']}, max length {s['max_len']}, "
             f"{'bf16 autocast' if s['bf16'] else 'fp32'}, {s['steps']} steps after {s['warmup']} warm-up, "
             f"corpus {s['corpus']}" + (" (documents packed across)" if s["across"] else ""), ""]
    headers = ["arm", "examples", "tokens/example", "real-text share (measured)", "real-text share (epoch)",
               "real tokens/s", "real tokens/CPU-s"]
    rows = [[arm, row["examples"], row["mean_tokens_per_example"], row["real_text_share"],
             row["corpus_real_text_share"], row["real_tokens_per_s"], row["real_tokens_per_cpu_s"]]
            for arm, row in arms.items()]
    lines += [markdown_table(headers, rows, digits=3), ""]
    share = arms["packed"]["real_text_share"] / arms["unpacked"]["real_text_share"]
    speed = arms["packed"]["real_tokens_per_s"] / arms["unpacked"]["real_tokens_per_s"]
    speed_cpu = arms["packed"]["real_tokens_per_cpu_s"] / arms["unpacked"]["real_tokens_per_cpu_s"]
    lines.append(f"- packed / unpacked: real-text share **{share:.2f}×**, real-text tokens/s **{speed:.2f}×** "
                 f"(CPU time {speed_cpu:.2f}×)")
    lines.append(f"- bar: packed real-text share ≥ 0.95: **{'yes' if arms['packed']['real_text_share'] >= 0.95 else 'no'}** "
                 f"({arms['packed']['real_text_share']:.3f}; unpacked {arms['unpacked']['real_text_share']:.3f})")
    return "\n".join(lines)
