"""Gradient caching: the same loss and gradients as the plain step (1e-5), dropout replayed exactly, activation
memory of one sub-batch instead of the whole batch, and the loop/fine-tuning wiring."""

from __future__ import annotations

import weakref

import pytest
import torch

from conftest import tiny_bert_config
from pretrieve.modeling.dual_encoder import DualEncoder, RetrievalLoss
from pretrieve.train.grad_cache import RandContext, grad_cached_step, sub_batches
from pretrieve.precision import MixedPrecision

WORDS = ("tumor cell growth virus membrane enzyme protein pathway tissue repair blood signal gene immune kinase "
         "receptor mutation infection vessel factor").split()


class SavedActivations:
    """Bytes of non-parameter tensors autograd keeps for backward: live now and at the peak (each storage once)."""

    def __init__(self, model: torch.nn.Module):
        self.parameters = {p.data_ptr() for p in model.parameters()}
        self.counts: dict[int, int] = {}
        self.live = self.peak = 0

    def __enter__(self) -> "SavedActivations":
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda held: held.tensor)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)

    def pack(self, tensor: torch.Tensor):
        held = type("Held", (), {})()
        held.tensor = tensor
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in self.parameters:
            return held
        if self.counts.get(pointer, 0) == 0:
            self.live += tensor.untyped_storage().nbytes()
            self.peak = max(self.peak, self.live)
        self.counts[pointer] = self.counts.get(pointer, 0) + 1
        weakref.finalize(held, self.release, pointer, tensor.untyped_storage().nbytes())
        return held

    def release(self, pointer: int, nbytes: int) -> None:
        self.counts[pointer] -= 1
        if self.counts[pointer] == 0:
            self.live -= nbytes


def make_model(tmp_path, tokenizer, dropout: float = 0.0, tied: bool = True, **loss) -> DualEncoder:
    from transformers import BertModel

    torch.manual_seed(0)
    directory = tmp_path / f"tiny-{dropout}"
    BertModel(tiny_bert_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)).save_pretrained(
        directory)
    tokenizer.save_pretrained(directory)
    return DualEncoder.from_pretrained(directory, tied=tied, loss=RetrievalLoss(**loss))


def make_batch(tokenizer, queries: int, group: int, seed: int = 0, teacher: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)

    def text(length: int) -> str:
        return " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (length,), generator=generator))

    q = tokenizer([text(5) for _ in range(queries)], padding=True, return_tensors="pt")
    p = tokenizer([text(12) for _ in range(queries * group)], padding=True, return_tensors="pt")
    batch = {**{f"query_{k}": v for k, v in q.items()}, **{f"passage_{k}": v for k, v in p.items()}}
    if teacher:
        batch["teacher_scores"] = torch.randn(queries, group, generator=generator)
    return batch


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied, teacher, chunk", [(True, False, 3), (False, False, 5), (True, True, 4)])
def test_a_grad_cached_step_gives_the_plain_steps_loss_and_gradients(tmp_path, tokenizer, tied, teacher, chunk):
    model = make_model(tmp_path, tokenizer, tied=tied)
    batch = make_batch(tokenizer, queries=4, group=4, teacher=teacher)
    loss, logs = model(batch)
    loss.backward()
    plain = gradients(model)
    model.zero_grad(set_to_none=True)
    cached_loss, cached_logs = grad_cached_step(model, batch, chunk, MixedPrecision(), scale=1.0)
    cached = gradients(model)
    assert float(cached_loss) == pytest.approx(float(loss), abs=1e-5)
    assert cached_logs.keys() == logs.keys()
    assert plain.keys() == cached.keys() and plain
    for name in plain:
        assert torch.allclose(plain[name], cached[name], atol=1e-5), (name, (plain[name] - cached[name]).abs().max())


def test_under_bf16_autocast_the_scores_and_loss_are_float32(tmp_path, tokenizer):
    """Autocast would run the score matmul in bf16 (a bf16 score matrix is coarse at τ = 0.05); the loss must
    score the representations in fp32, i.e. equal the loss of the same representations without autocast."""
    model = make_model(tmp_path, tokenizer)
    batch = make_batch(tokenizer, queries=4, group=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, p = model.encode_batch(batch, "query"), model.encode_batch(batch, "passage")
        loss, _ = model.loss(q, p, batch)
    assert loss.dtype == torch.float32
    reference, _ = model.loss(q.detach().float(), p.detach().float(), batch)
    assert float(loss) == pytest.approx(float(reference), abs=1e-6)   # bf16 scores: off by 3e-5 here


def test_the_re_forward_replays_each_sub_batchs_dropout(tmp_path, tokenizer):
    model = make_model(tmp_path, tokenizer, dropout=0.3)
    model.train()
    batch = make_batch(tokenizer, queries=3, group=3)
    torch.manual_seed(11)
    model.zero_grad(set_to_none=True)
    cached_loss, _ = grad_cached_step(model, batch, 4, MixedPrecision())
    cached = gradients(model)
    # the reference: the same sub-batches, each under its recorded random state, in one graph
    torch.manual_seed(11)
    model.zero_grad(set_to_none=True)
    reps = {}
    for text_type in ("query", "passage"):
        states = []
        for part in sub_batches(batch, text_type, 4):    # record the states exactly as the cached pass does
            states.append((part, RandContext()))
            with torch.no_grad():
                model.encode_batch(part, text_type)
        pieces = []
        for part, state in states:
            with state:
                pieces.append(model.encode_batch(part, text_type))
        reps[text_type] = torch.cat(pieces)
    loss, _ = model.loss(reps["query"], reps["passage"], batch)
    loss.backward()
    assert float(loss) == pytest.approx(float(cached_loss), abs=1e-6)
    for name, value in gradients(model).items():
        assert torch.allclose(value, cached[name], atol=1e-5), name
    # and without replay the masks differ (the test would notice a broken RandContext)
    with torch.no_grad():
        part = sub_batches(batch, "passage", 4)[0]
        state = RandContext()
        first = model.encode_batch(part, "passage")
        second = model.encode_batch(part, "passage")
        with state:
            replayed = model.encode_batch(part, "passage")
    assert not torch.allclose(first, second) and torch.equal(first, replayed)


def test_activation_memory_is_one_sub_batchs_not_the_batchs(tmp_path, tokenizer):
    model = make_model(tmp_path, tokenizer)
    big = make_batch(tokenizer, queries=16, group=16)          # 256 passages
    one_chunk = make_batch(tokenizer, queries=2, group=16)     # 32 passages: one sub-batch of the cached step
    with SavedActivations(model) as plain_big:
        model(big)[0].backward()
    with SavedActivations(model) as plain_chunk:
        model(one_chunk)[0].backward()
    with SavedActivations(model) as cached:
        grad_cached_step(model, big, 32, MixedPrecision())
    assert cached.peak <= 1.25 * plain_chunk.peak, (cached.peak, plain_chunk.peak)
    assert plain_big.peak >= 6 * cached.peak, (plain_big.peak, cached.peak)


def test_fine_tuning_with_grad_cache_matches_plain_fine_tuning(tmp_path, tokenizer):
    """The option reaches the loop: the same losses step by step with and without gradient caching."""
    from test_finetune import make_config, write_collection

    from pretrieve.train.finetuner import finetune
    from pretrieve.train.loop import read_logs

    model = make_model(tmp_path, tokenizer)     # dropout 0: the two runs draw their masks differently otherwise
    directory = tmp_path / "tiny-0.0"
    data = write_collection(tmp_path / "data")
    logs = {}
    for name, chunk in (("plain", None), ("cached", 5)):
        finetune(make_config(directory, data, tmp_path / name, max_steps=4, grad_cache_chunk=chunk))
        logs[name] = read_logs(tmp_path / name)
    for plain, cached in zip(logs["plain"], logs["cached"], strict=True):
        assert cached["loss"] == pytest.approx(plain["loss"], abs=1e-5)
    del model


@pytest.mark.ddp
def test_two_processes_plain_and_grad_cached_match_one_process(tmp_path, tokenizer):
    """DDP without the unused-parameter search (dense towers, pooler frozen) and gradient caching with its
    hand-made gradient averaging, each under 2 gloo processes, give the 1-process losses (cross-device negatives
    make the 2-process batch the 1-process batch). A MoTE pre-training fed passages only leaves its query
    experts unused: DDP searches for them and the run goes through."""
    from test_finetune import write_collection
    from test_pretrain import _run_cli

    from pretrieve.train.loop import read_logs

    make_model(tmp_path, tokenizer)
    model = tmp_path / "tiny-0.0"
    data = write_collection(tmp_path / "data")
    common = ["finetune", "--model", str(model), "--data", str(data), "--batch-size", "4", "--num-negatives", "3",
              "--steps", "3", "--lr", "5e-4", "--warmup-ratio", "0", "--log-every", "1", "--save-every", "0",
              "--query-max-len", "16", "--passage-max-len", "32", "--bm25-depth", "20"]
    _run_cli([*common, "--out", str(tmp_path / "one")])
    _run_cli([*common, "--out", str(tmp_path / "two")], nproc=2)
    _run_cli([*common, "--grad-cache-chunk", "3", "--out", str(tmp_path / "two-cached")], nproc=2)
    one, two, cached = (read_logs(tmp_path / name) for name in ("one", "two", "two-cached"))
    assert len(one) == len(two) == len(cached) == 3
    for a, b, c in zip(one, two, cached):   # float32 sums in another order: relative 1e-5 (a loss of ~2.8)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5) and c["loss"] == pytest.approx(a["loss"], rel=1e-5)

    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(f"passage {i} about tumor cells and protein {i % 7} growth.\n" for i in range(40)))
    (tmp_path / "mote.yaml").write_text("base: bow\nmote: true\n")
    _run_cli(["pretrain", "--model", str(model.parent / "tiny-0.0"), "--corpus", str(corpus), "--method",
              str(tmp_path / "mote.yaml"), "--max-len", "24", "--batch-size", "4", "--steps", "2", "--save-every",
              "0", "--log-every", "1", "--out", str(tmp_path / "mote")], nproc=2)
    assert len(read_logs(tmp_path / "mote")) == 2
