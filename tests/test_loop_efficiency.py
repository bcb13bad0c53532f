"""The training loop's GPU-efficiency settings: precision (fp16 + GradScaler), schedules with a floor, logs kept on
the device, thread counts per rank, gradient checkpointing, and DDP's unused-parameter search per model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pretrieve.errors import ConfigError, TrainingDiverged
from pretrieve.train import checkpoint as ckpt
from pretrieve.train import loop
from pretrieve.precision import MixedPrecision, precision_settings
from pretrieve.train import accelerator
from pretrieve.train.settings import LoopConfig
from pretrieve.train.loop import build_optimizer, build_scheduler, read_logs, train


# ------------------------------------------------------------------------------------------------ toy parts
class Toy(nn.Module):
    """``loss = mean((w·x − y)²) · factor``; ``nan_at`` makes the loss of that batch value NaN."""

    def __init__(self, factor: float = 1.0, nan_at: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))
        self.factor = factor
        self.nan_at = nan_at

    def forward(self, batch):
        loss = ((batch["x"] @ self.weight - batch["y"]) ** 2).mean() * self.factor
        if self.nan_at is not None and bool((batch["x"][:, 0] == self.nan_at).any()):
            loss = loss * float("nan")
        return loss, {"half": loss.detach() / 2}


class ToyData:
    def __len__(self):
        return 32

    def __getitem__(self, index):
        return {"x": torch.tensor([float(index), 1.0, -1.0]), "y": torch.tensor(float(index % 3))}


def toy_collate(examples, generator=None):
    return {"x": torch.stack([e["x"] for e in examples]), "y": torch.stack([e["y"] for e in examples])}


def toy_config(**overrides) -> LoopConfig:
    values = dict(batch_size=4, lr=1e-2, max_steps=6, warmup_ratio=0.0, log_every=2, save_every=0,
                  show_progress=False, max_grad_norm=0.0)
    values.update(overrides)
    return LoopConfig(**values)


def export_nothing(model, directory):
    directory.mkdir(parents=True, exist_ok=True)


# ------------------------------------------------------------------------------------------------ precision
def test_precision_settings_and_the_deprecated_bf16_alias():
    assert precision_settings("fp32", "cpu") == (None, False)
    assert precision_settings("bf16", "cpu") == (torch.bfloat16, False)
    assert precision_settings("fp16", "cpu") == (torch.float16, True)
    assert LoopConfig(bf16=True).resolved_precision() == "bf16"
    assert LoopConfig(precision="fp16").resolved_precision() == "fp16"
    assert LoopConfig().resolved_precision() == "fp32"
    with pytest.raises(ConfigError, match="contradicts precision: fp16"):
        LoopConfig(bf16=True, precision="fp16").validate()
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        LoopConfig(precision="fp8").validate()


def test_on_a_gpu_fp16_would_use_cuda_autocast_and_a_cuda_grad_scaler(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # the capability check, faked
    amp = MixedPrecision("fp16", "cuda")
    assert amp.dtype == torch.float16 and amp.device_type == "cuda"
    assert isinstance(amp.scaler, torch.amp.GradScaler) and amp.scaler.is_enabled()
    assert MixedPrecision("bf16", "cuda").scaler is None


@pytest.mark.parametrize("factor, overflows", [(1e4, True), (1e-6, False)])
def test_fp16_on_the_cpu_scales_the_loss_and_skips_a_step_whose_gradients_overflow(factor, overflows):
    model = Toy(factor=factor)
    amp = MixedPrecision("fp16", "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = toy_collate([ToyData()[i] for i in range(4)])
    with amp.autocast():
        prediction = batch["x"] @ model.weight
        loss, _ = model(batch)
    assert prediction.dtype == torch.float16 and loss.dtype == torch.float32
    amp.scale(loss).backward()       # × 65536: the fp16 matmul's backward overflows for the large loss
    before, scale = model.weight.detach().clone(), amp.scaler.get_scale()
    amp.unscale_(optimizer)
    assert (not torch.isfinite(model.weight.grad).all()) == overflows
    amp.step(optimizer)
    if overflows:   # the step is skipped and the scale halved
        assert torch.equal(model.weight.detach(), before) and amp.scaler.get_scale() == scale / 2
    else:           # an ordinary step with the unscaled gradient
        expected = before - 1e-3 * model.weight.grad
        assert torch.allclose(model.weight.detach(), expected) and amp.scaler.get_scale() == scale


def test_an_fp16_run_on_the_cpu_checkpoints_its_loss_scale_and_resumes_exactly(tmp_path, monkeypatch):
    full = tmp_path / "full"
    train(Toy(), ToyData(), toy_collate, toy_config(precision="fp16", save_every=2), full, export_nothing, {})
    reference = read_logs(full)
    checkpoint = ckpt.list_checkpoints(full)[-1][1]
    scaler = ckpt.read_state(checkpoint)[ckpt.SCALER_KEY]   # the GradScaler, as JSON numbers (never a pickle)
    assert scaler["scale"] > 0 and not any(path.name.startswith("custom_checkpoint") for path in checkpoint.iterdir())

    original, calls = loop.train_step, {"n": 0}

    def killed_after_3(*args, **kwargs):
        if calls["n"] == 3:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", killed_after_3)
    resumed = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        train(Toy(), ToyData(), toy_collate, toy_config(precision="fp16", save_every=2), resumed, export_nothing, {})
    monkeypatch.setattr(loop, "train_step", original)
    train(Toy(), ToyData(), toy_collate, toy_config(precision="fp16", save_every=2, resume=True), resumed,
          export_nothing, {})
    def losses(logs):
        return [(entry["step"], entry["loss"], entry["lr"]) for entry in logs]

    assert losses(read_logs(resumed)) == losses(reference)


# ------------------------------------------------------------------------------------------------ schedules
def _lrs(config: LoopConfig, total: int) -> list[float]:
    model = Toy()
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total)
    values = []
    for _ in range(total + 1):
        values.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return values


def test_cosine_and_linear_schedules_decay_to_the_floor_after_warmup_steps():
    cosine = _lrs(LoopConfig(lr=1.0, schedule="cosine", warmup_steps=2, min_lr_ratio=0.1), 10)
    assert cosine[:3] == pytest.approx([0.0, 0.5, 1.0])
    # step 6: progress (6-2)/8 = 0.5 → 0.5·(1 + cos(π/2)) = 0.5 → 0.5·0.9 + 0.1 = 0.55
    assert cosine[6] == pytest.approx(0.55)
    assert cosine[10] == pytest.approx(0.1)
    linear = _lrs(LoopConfig(lr=1.0, schedule="linear", warmup_steps=2, min_lr_ratio=0.1), 10)
    assert linear[6] == pytest.approx(0.5 * 0.9 + 0.1) and linear[10] == pytest.approx(0.1)
    # without a floor: transformers' schedules as before; warmup_ratio when warmup_steps is unset
    plain = _lrs(LoopConfig(lr=1.0, schedule="cosine", warmup_ratio=0.2), 10)
    assert plain[2] == pytest.approx(1.0) and plain[6] == pytest.approx(0.5) and plain[10] == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="min_lr_ratio must be in"):
        LoopConfig(min_lr_ratio=1.5).validate()
    with pytest.raises(ConfigError, match="floor of a decaying schedule"):
        LoopConfig(min_lr_ratio=0.1, schedule="constant").validate()


# ------------------------------------------------------------------------------------------- logs and syncs
def test_steps_keep_their_logs_on_the_device_and_the_host_reads_them_once_per_log_line(tmp_path, monkeypatch):
    steps, flushes = [], {"n": 0}
    original_step, original_flush = loop.train_step, loop.LogWindow.flush

    def recording_step(*args, **kwargs):
        logs = original_step(*args, **kwargs)
        steps.append(logs)
        return logs

    def counting_flush(self):
        flushes["n"] += 1
        return original_flush(self)

    monkeypatch.setattr(loop, "train_step", recording_step)
    monkeypatch.setattr(loop.LogWindow, "flush", counting_flush)
    train(Toy(), ToyData(), toy_collate, toy_config(max_steps=6, log_every=3), tmp_path, export_nothing, {})
    assert all(isinstance(value, torch.Tensor) for logs in steps for value in logs.values())
    assert flushes["n"] == 2
    logs = read_logs(tmp_path)
    assert [entry["step"] for entry in logs] == [3, 6]
    # each line is the mean over its steps of what the steps returned
    assert logs[0]["loss"] == pytest.approx(sum(float(s["loss"]) for s in steps[:3]) / 3, rel=1e-6)
    assert logs[0]["half"] == pytest.approx(logs[0]["loss"] / 2, rel=1e-6)


def test_a_non_finite_loss_stops_the_run_before_the_next_checkpoint(tmp_path):
    # examples are visited in a seeded order; x[0] = index, so nan_at picks the example that poisons its step
    order = loop.epoch_order(32, 42, 0)
    poisoned_step = 2                                      # steps 0, 1 fine; step 2 (the third) is NaN
    nan_at = float(order[poisoned_step * 4])
    # the divergence guard sees every step's loss, copied to the host once per log line or checkpoint
    with pytest.raises(TrainingDiverged, match=r"diverged at step 3: the loss is nan"):
        train(Toy(nan_at=nan_at), ToyData(), toy_collate, toy_config(max_steps=8, log_every=5, save_every=3),
              tmp_path, export_nothing, {})
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == []   # step 3's checkpoint was never written
    assert not (tmp_path / "final").exists()


# ------------------------------------------------------------------------------------------------- threads
def test_threads_per_rank_divide_the_cores_unless_omp_num_threads_is_set(monkeypatch):
    threads = accelerator.threads_per_rank
    assert threads(16, 4) == 4 and threads(2, 4) == 1 and threads(8, 1) == 8
    assert accelerator.set_threads_per_rank({"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "3"}) is None
    assert accelerator.set_threads_per_rank({"LOCAL_WORLD_SIZE": "1"}) is None
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    cores = len(__import__("os").sched_getaffinity(0))
    assert accelerator.set_threads_per_rank({"LOCAL_WORLD_SIZE": "2"}) == max(1, cores // 2) == seen[0]
    assert math.isfinite(cores)


# ------------------------------------------------------------------------ DDP's unused-parameter search
def _examples_for(method, tokenizer, spans_dataset, pairs_dataset):
    if method.context is not None and method.context.kind == "pairs":
        return [pairs_dataset[i] for i in range(3)]
    if method.context is not None:
        return [spans_dataset[i] for i in range(3)]
    texts = ["the tumor cells grow fast in the tissue", "viruses infect the membrane of the cell",
             "mutations alter the pathway of the protein"]
    return [{"input_ids": tokenizer(text)["input_ids"]} for text in texts]


def _unused(model, loss) -> list[str]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]


def test_each_preset_says_whether_a_step_leaves_parameters_unused(tokenizer, tmp_path):
    from conftest import tiny_bert_config
    from test_contextual import TEXTS

    from pretrieve.data.spans import PairDataset, SpanCorpus, SpanDataset
    from pretrieve.modeling import Encoder
    from pretrieve.modeling.pretrain_model import PretrainModel
    from pretrieve.train.collator import PretrainCollator
    from pretrieve.train.method import PRESETS, method_from_mapping

    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    spans = SpanDataset(SpanCorpus.build(tmp_path / "docs.txt", tokenizer, 16, tmp_path / "cache"), "mixed")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join('{"passage": "%s", "query": "what about %d"}\n' % (text[:60], i)
                             for i, text in enumerate(TEXTS)))
    pair_data = PairDataset(pairs, tokenizer, max_len=32)
    decisions = {}
    for name in PRESETS:
        if PRESETS[name].trainer is not None:            # trained by its own module (tsdae), not PretrainModel
            continue
        mapping = {"base": name}
        if PRESETS[name].context is not None and PRESETS[name].context.kind == "pairs":
            mapping["context"] = {"pairs": str(pairs)}
        if name == "cdmae":
            mapping["decoder_masker"] = {"kind": "wwm"}          # the masker does not change which parameters learn
        method = method_from_mapping(mapping)
        torch.manual_seed(0)
        model = PretrainModel(Encoder.from_config(tiny_bert_config()), method)
        batch = PretrainCollator(tokenizer, method, model.required_features(), max_len=32, seed=0)(
            _examples_for(method, tokenizer, spans, pair_data), generator=torch.Generator().manual_seed(1))
        unused = _unused(model, model(batch)[0])
        decisions[name] = model.may_leave_parameters_unused()
        assert decisions[name] == bool(unused), (name, unused)
    assert not any(decisions.values())               # every preset lets DDP skip the search
    # a MoTE encoder fed passages only leaves its query experts unused, and says so
    method = method_from_mapping({"base": "bow", "mote": True})
    model = PretrainModel(Encoder.from_config(tiny_bert_config()), method)
    batch = PretrainCollator(tokenizer, method, model.required_features(), max_len=32, seed=0)(
        _examples_for(method, tokenizer, spans, pair_data), generator=torch.Generator().manual_seed(1))
    unused = _unused(model, model(batch)[0])
    assert model.may_leave_parameters_unused() and unused and all(".query." in name for name in unused)
    # an objective with its own vocabulary decoder alone leaves the MLM head unused
    method = method_from_mapping({"objectives": [{"name": "cpdae"}], "encoder_masker": {"kind": "token", "ratio": 0.15}})
    model = PretrainModel(Encoder.from_config(tiny_bert_config()), method)
    batch = PretrainCollator(tokenizer, method, model.required_features(), max_len=32, seed=0)(
        _examples_for(method, tokenizer, spans, pair_data), generator=torch.Generator().manual_seed(1))
    assert model.may_leave_parameters_unused() and _unused(model, model(batch)[0])


def test_dual_encoders_and_rerankers_say_whether_a_step_leaves_parameters_unused(tiny_bert_dir, tiny_mlm_dir,
                                                                                tokenizer, tmp_path):
    from pretrieve.modeling.cross_encoder import CrossEncoder
    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.modeling.encoder import Encoder
    from pretrieve.modeling.mote import enable_mote
    from pretrieve.modeling.representations.sparse import representation_from_spec

    queries = tokenizer(["what is a tumor", "how do viruses spread"], padding=True, return_tensors="pt")
    passages = tokenizer(["tumor cells grow", "a tumor is a mass", "viruses spread by air", "cells divide"],
                         padding=True, return_tensors="pt")
    batch = {**{f"query_{k}": v for k, v in queries.items()}, **{f"passage_{k}": v for k, v in passages.items()}}
    for model in (DualEncoder.from_pretrained(tiny_bert_dir),                              # BertModel: pooler frozen
                  DualEncoder.from_pretrained(tiny_bert_dir, tied=False),
                  DualEncoder.from_pretrained(tiny_mlm_dir, representation=representation_from_spec(
                      "sparse", "", str(tiny_mlm_dir)))):
        assert not model.may_leave_parameters_unused()
        assert _unused(model, model(batch)[0]) == []
    assert all(not p.requires_grad for p in DualEncoder.from_pretrained(tiny_bert_dir).query_tower.model.pooler
               .parameters())
    # a MoTE checkpoint loads a masked-LM tower: under the dense representation its MLM head is unused
    encoder = Encoder.from_pretrained(tiny_mlm_dir)
    enable_mote(encoder.model)
    encoder.save_pretrained(tmp_path / "mote")
    tokenizer.save_pretrained(tmp_path / "mote")
    mote = DualEncoder.from_pretrained(tmp_path / "mote")
    assert mote.may_leave_parameters_unused() and _unused(mote, mote(batch)[0])
    pairs = tokenizer(["what is a tumor"] * 2, ["tumor cells grow", "cells divide"], padding=True, return_tensors="pt")
    reranker = CrossEncoder.from_pretrained(tiny_bert_dir)
    loss, _ = reranker({**pairs, "group_size": torch.tensor(2)})
    assert not reranker.may_leave_parameters_unused() and _unused(reranker, loss) == []


def test_leaves_parameters_unused_defaults_to_searching_for_unknown_models():
    assert accelerator.leaves_parameters_unused(nn.Linear(2, 2))
    assert not accelerator.leaves_parameters_unused(type("M", (nn.Module,), {"may_leave_parameters_unused":
                                                                       lambda self: False})())


# -------------------------------------------------------------------------------- gradient checkpointing
def test_gradient_checkpointing_gives_the_same_gradients_and_refuses_mote(tiny_mlm_dir, tokenizer):
    from pretrieve.modeling import Encoder
    from pretrieve.modeling.pretrain_model import PretrainModel
    from pretrieve.train.collator import PretrainCollator
    from pretrieve.train.method import preset

    method = preset("retromae")
    texts = ["the tumor cells grow fast in the tissue", "viruses infect the membrane of the cell"]
    examples = [{"input_ids": tokenizer(text)["input_ids"]} for text in texts]

    def gradients(checkpointing: bool) -> tuple[float, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        model = PretrainModel(Encoder.from_pretrained(tiny_mlm_dir), method)   # dropout on: RNG must replay
        if checkpointing:
            assert accelerator.enable_gradient_checkpointing(model) == 1
        model.train()
        batch = PretrainCollator(tokenizer, method, max_len=32, seed=0)(examples,
                                                                       generator=torch.Generator().manual_seed(1))
        torch.manual_seed(5)
        loss, _ = model(batch)
        loss.backward()
        return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain_loss, plain = gradients(False)
    checkpointed_loss, checkpointed = gradients(True)
    assert checkpointed_loss == pytest.approx(plain_loss, abs=1e-6)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name

    from pretrieve.modeling.mote import enable_mote

    encoder = Encoder.from_pretrained(tiny_mlm_dir)
    enable_mote(encoder.model)
    with pytest.raises(ConfigError, match="not supported with query/passage experts"):
        accelerator.enable_gradient_checkpointing(encoder)
    with pytest.raises(ConfigError, match="no transformers model"):
        accelerator.enable_gradient_checkpointing(nn.Linear(2, 2))
