"""Objectives: every loss recomputed by hand with plain torch ops from the modules' own weights.

Models run in float64 so that the module (SDPA, fused ops) and the hand computation agree far below the
1e-6 tolerance; ``initializer_range=0.2`` makes the tiny model's predictions peaked enough that a wrong
input, mask or target moves the loss by much more than that.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_bert_config
from pretrieve.errors import ConfigError
from pretrieve.modeling import OBJECTIVES, Encoder, EncoderOutput, PretrainModel, build_objective
from pretrieve.modeling.objectives import bow_cross_entropy, causal_visibility
from pretrieve.modeling.objectives.decoder_layers import DecoderLayer
from pretrieve.train.collator import PretrainCollator
from pretrieve.train.method import MethodConfig, apply_overrides, method_from_mapping, preset, resolve_method

CLS, SEP, PAD, MASK_ID = 101, 102, 0, 103
ORIGINAL = torch.tensor([[CLS, 2023, 2003, 1037, 2023, SEP], [CLS, 7592, 2088, SEP, PAD, PAD]])
ATTENTION = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
SPECIAL = (ORIGINAL == CLS) | (ORIGINAL == SEP) | (ORIGINAL == PAD)


def masked(ids: torch.Tensor, positions: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[MASK] at ``positions``; labels = original id there, -100 elsewhere."""
    corrupted, labels = ids.clone(), torch.full_like(ids, -100)
    for row, col in positions:
        corrupted[row, col] = MASK_ID
        labels[row, col] = ids[row, col]
    return corrupted, labels


ENC_IDS, MLM_LABELS = masked(ORIGINAL, [(0, 2), (1, 1)])
DEC_IDS, DEC_LABELS = masked(ORIGINAL, [(0, 1), (0, 3), (0, 4), (1, 2)])
ORIGINAL_LABELS = torch.where(SPECIAL, -100, ORIGINAL)
# RetroMAE position-specific mask, by hand (True = visible): rows i≠0 see column 0, never themselves
ENHANCED = torch.tensor([
    [[0, 1, 0, 1, 0, 0], [1, 0, 1, 0, 0, 1], [1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 1], [1, 0, 1, 0, 0, 1],
     [1, 1, 0, 1, 0, 0]],
    [[0, 1, 1, 0, 0, 0], [1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0],
     [0, 0, 0, 0, 0, 0]],
], dtype=torch.bool)
BOW_TARGETS = torch.tensor([[1037, 2003, 2023], [2088, 7592, -100]])


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    torch.manual_seed(0)
    return Encoder.from_config(tiny_bert_config(initializer_range=0.2)).double().eval()


def batch() -> dict[str, torch.Tensor]:
    return {"input_ids": ENC_IDS, "attention_mask": ATTENTION, "mlm_labels": MLM_LABELS,
            "decoder_input_ids": DEC_IDS, "decoder_labels": DEC_LABELS, "original_input_ids": ORIGINAL,
            "original_labels": ORIGINAL_LABELS, "enhanced_mask": ENHANCED, "bow_targets": BOW_TARGETS}


# ---------------------------------------------------------------------- plain-torch references
def head(encoder: Encoder, hidden: torch.Tensor) -> torch.Tensor:
    """BERT's MLM head from its raw weights: dense → gelu → LayerNorm → Eᵀ + bias."""
    p = encoder.model.cls.predictions
    x = F.gelu(hidden @ p.transform.dense.weight.T + p.transform.dense.bias)
    x = F.layer_norm(x, (x.shape[-1],), p.transform.LayerNorm.weight, p.transform.LayerNorm.bias, 1e-12)
    return x @ encoder.word_embeddings.weight.T + p.bias


def embed(encoder: Encoder, ids: torch.Tensor) -> torch.Tensor:
    """BERT embeddings from raw weights: word + position + type(0), LayerNorm."""
    e = encoder.model.bert.embeddings
    x = e.word_embeddings.weight[ids] + e.position_embeddings.weight[:ids.shape[1]] + e.token_type_embeddings.weight[0]
    return F.layer_norm(x, (x.shape[-1],), e.LayerNorm.weight, e.LayerNorm.bias, 1e-12)


def layer(block: DecoderLayer, query_in: torch.Tensor, kv_in: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """One post-LN block by hand: explicit multi-head attention with a boolean visibility mask."""
    batch_size, length, hidden = query_in.shape
    heads, dim = block.num_heads, hidden // block.num_heads

    def split(x):
        return x.view(batch_size, -1, heads, dim).transpose(1, 2)

    q = split(query_in @ block.query.weight.T + block.query.bias)
    k = split(kv_in @ block.key.weight.T + block.key.bias)
    v = split(kv_in @ block.value.weight.T + block.value.bias)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
    scores = scores.masked_fill(~visible.unsqueeze(1), torch.finfo(scores.dtype).min)
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch_size, length, hidden)
    a = F.layer_norm(context @ block.attention_output.weight.T + block.attention_output.bias + query_in, (hidden,),
                     block.attention_norm.weight, block.attention_norm.bias, 1e-12)
    f = F.gelu(a @ block.intermediate.weight.T + block.intermediate.bias) @ block.output.weight.T + block.output.bias
    return F.layer_norm(f + a, (hidden,), block.output_norm.weight, block.output_norm.bias, 1e-12)


def ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -(logits.log_softmax(-1)[torch.arange(len(targets)), targets]).mean()


def run(encoder: Encoder, name: str, **params):
    objective = build_objective(name, encoder, **params).double().eval()
    enc = encoder(ENC_IDS, ATTENTION)
    return objective, enc, objective(batch(), enc, encoder)


# ---------------------------------------------------------------------- hand computations
def test_mlm_by_hand(encoder):
    _, enc, out = run(encoder, "mlm")
    with torch.no_grad():
        hidden = enc.last_hidden_state
        expected = ce(head(encoder, torch.stack([hidden[0, 2], hidden[1, 1]])), torch.tensor([2003, 7592]))
    assert abs(out.loss.item() - expected.item()) < 1e-6
    assert int(out.logs["tokens"]) == 2


def test_bow_by_hand(encoder):
    _, enc, out = run(encoder, "bow")
    with torch.no_grad():
        log_p = head(encoder, enc.cls).log_softmax(-1)
        target = torch.zeros_like(log_p)
        target[0, [2023, 2003, 1037]] = 1 / 3          # 2023 appears twice in the text: counted once
        target[1, [7592, 2088]] = 1 / 2
        expected = -(target * log_p).sum(-1).mean()
    assert abs(out.loss.item() - expected.item()) < 1e-6


def test_bow_cross_entropy_on_a_small_vocabulary_slice():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 2.0, 3.0, 4.0]])
    targets = torch.tensor([[0, 2], [3, -100], [-100, -100]])  # third row: nothing to predict (skipped)
    z0 = math.log(math.exp(2) + 1 + math.exp(1) + math.exp(-1))
    row0 = -((2 - z0) + (1 - z0)) / 2
    row1 = math.log(4)
    loss, examples = bow_cross_entropy(logits, targets)
    assert abs(loss.item() - (row0 + row1) / 2) < 1e-6 and int(examples) == 2


def test_ae_by_hand(encoder):
    objective, enc, out = run(encoder, "ae", num_layers=2)
    with torch.no_grad():
        hidden = torch.cat([enc.cls.unsqueeze(1), embed(encoder, DEC_IDS)[:, 1:]], dim=1)
        visible = ATTENTION.bool().unsqueeze(1).expand(2, 6, 6)
        for block in objective.decoder.layers:
            hidden = layer(block, hidden, hidden, visible)
        selected = DEC_LABELS != -100
        expected = ce(head(encoder, hidden[selected]), DEC_LABELS[selected])
    assert abs(out.loss.item() - expected.item()) < 1e-6
    assert int(out.logs["tokens"]) == 4


def test_ar_by_hand(encoder):
    objective, enc, out = run(encoder, "ar")
    with torch.no_grad():
        hidden = torch.cat([enc.cls.unsqueeze(1), embed(encoder, ORIGINAL)[:, 1:]], dim=1)
        causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))
        visible = causal & ATTENTION.bool().unsqueeze(1)
        hidden = layer(objective.decoder.layers[0], hidden, hidden, visible)
        # position t predicts the token at t+1; targets t_1..t_n (no [SEP], no padding)
        rows, cols = [0, 0, 0, 0, 1, 1], [0, 1, 2, 3, 0, 1]
        targets = torch.tensor([2023, 2003, 1037, 2023, 7592, 2088])
        expected = ce(head(encoder, hidden[rows, cols]), targets)
    assert abs(out.loss.item() - expected.item()) < 1e-6
    assert int(out.logs["tokens"]) == 6


def test_ar_attention_window_visibility():
    visible = causal_visibility(5, window=2)
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]],
                            dtype=torch.bool)
    assert torch.equal(visible, expected)
    assert torch.equal(causal_visibility(4, None), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_enhanced_by_hand(encoder):
    objective, enc, out = run(encoder, "enhanced")
    with torch.no_grad():
        positions = encoder.model.bert.embeddings.position_embeddings.weight[:6]
        query = enc.cls.unsqueeze(1) + positions                                     # H1 = h_CLS + p
        content = torch.cat([enc.cls.unsqueeze(1), embed(encoder, ORIGINAL)[:, 1:]], dim=1)   # H2, original text
        visible = ENHANCED & ATTENTION.bool().unsqueeze(1)
        hidden = layer(objective.layer, query, content, visible)
        selected = ORIGINAL_LABELS != -100                                           # all non-special tokens
        expected = ce(head(encoder, hidden[selected]), ORIGINAL[selected])
    assert abs(out.loss.item() - expected.item()) < 1e-6
    assert int(out.logs["tokens"]) == 6


@pytest.mark.parametrize("name", ["bow", "ae", "ar", "enhanced"])
def test_bottleneck_objectives_reach_the_encoder_only_through_cls(encoder, name):
    objective = build_objective(name, encoder).double().eval()
    enc = encoder(ENC_IDS, ATTENTION)
    grad = torch.autograd.grad(objective(batch(), enc, encoder).loss, enc.last_hidden_state)[0]
    assert grad[:, 0].abs().sum() > 0
    assert torch.count_nonzero(grad[:, 1:]) == 0


def mean_bottleneck_run(encoder: Encoder, name: str):
    """Objective ``name`` inside a ``bottleneck: mean`` pre-training model: (objective, encoding, output)."""
    model = PretrainModel(encoder, {"objectives": [{"name": name}], "bottleneck": "mean"}).double().eval()
    enc = model.encode(batch())
    return model.objectives[name], enc, model.objectives[name](batch(), enc, encoder)


def hand_mean(hidden: torch.Tensor) -> torch.Tensor:
    """Mean of the last hidden states over each text's real tokens ([CLS] and [SEP] included, padding not)."""
    mask = ATTENTION.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


@pytest.mark.parametrize("name", ["bow", "ae", "ar", "enhanced"])
def test_mean_bottleneck_feeds_the_masked_mean(encoder, name):
    objective, enc, out = mean_bottleneck_run(encoder, name)
    with torch.no_grad():
        mean = hand_mean(enc.last_hidden_state)
        assert not torch.allclose(mean, enc.last_hidden_state[:, 0])        # the two bottlenecks differ
        # the objective's own by-hand-checked [CLS] path, handed the masked mean as its sentence vector
        expected = objective(batch(), EncoderOutput(enc.last_hidden_state, cls=mean), encoder).loss
        with_cls = objective(batch(), EncoderOutput(enc.last_hidden_state, cls=enc.cls), encoder).loss
    assert abs(out.loss.item() - expected.item()) < 1e-9
    assert abs(out.loss.item() - with_cls.item()) > 1e-4


def test_mean_bottleneck_bow_by_hand(encoder):
    _, enc, out = mean_bottleneck_run(encoder, "bow")
    with torch.no_grad():
        log_p = head(encoder, hand_mean(enc.last_hidden_state)).log_softmax(-1)
        target = torch.zeros_like(log_p)
        target[0, [2023, 2003, 1037]] = 1 / 3
        target[1, [7592, 2088]] = 1 / 2
        expected = -(target * log_p).sum(-1).mean()
    assert abs(out.loss.item() - expected.item()) < 1e-6


@pytest.mark.parametrize("name", ["bow", "ae", "ar", "enhanced"])
def test_mean_bottleneck_reaches_every_real_token(encoder, name):
    _, enc, out = mean_bottleneck_run(encoder, name)
    grad = torch.autograd.grad(out.loss, enc.last_hidden_state)[0]
    per_position = grad.abs().sum(-1)
    assert bool((per_position[ATTENTION.bool()] > 0).all())             # [CLS], words and [SEP] of both texts
    assert torch.count_nonzero(per_position[~ATTENTION.bool()]) == 0    # never the padding


def test_bottleneck_is_validated_and_recorded(tokenizer):
    assert "bottleneck" not in preset("bow").to_dict()                   # cls: earlier runs' settings unchanged
    mean = method_from_mapping({"base": "bow", "bottleneck": "mean"})
    assert mean.to_dict() == {**preset("bow").to_dict(), "bottleneck": "mean"}
    assert MethodConfig.from_dict(mean.to_dict()) == mean
    assert apply_overrides(preset("retromae"), bottleneck="mean").bottleneck == "mean"
    assert resolve_method("bow", bottleneck="mean") == mean
    with pytest.raises(ConfigError, match="bottleneck must be one of cls, mean"):
        method_from_mapping({"base": "bow", "bottleneck": "max"})
    with pytest.raises(ConfigError, match="bottleneck must be one of cls, mean"):
        PretrainModel(Encoder.from_config(tiny_bert_config()), {"objectives": ["bow"], "bottleneck": "first"})


def test_mean_bottleneck_pretrain_model_trains_and_round_trips(tokenizer, tmp_path):
    torch.manual_seed(0)
    method = resolve_method("retromae", bottleneck="mean")
    model = PretrainModel(Encoder.from_config(tiny_bert_config(hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0)), method)
    collator = PretrainCollator(tokenizer, method, model.required_features(), max_len=32, seed=0)
    examples = collator([{"input_ids": tokenizer(text)["input_ids"]} for text in PRETRAIN_TEXTS])
    model.eval()
    with torch.no_grad():
        loss = model(examples)[0]
    model.save(tmp_path)
    reloaded = PretrainModel.load(tmp_path).eval()
    assert reloaded.bottleneck == "mean" and reloaded.method["bottleneck"] == "mean"
    with torch.no_grad():
        assert reloaded(examples)[0].item() == loss.item()


def test_mlm_without_masked_tokens_is_an_exact_zero_with_a_graph(encoder):
    objective = build_objective("mlm", encoder)
    enc = encoder(ENC_IDS, ATTENTION)
    out = objective({"mlm_labels": torch.full_like(ENC_IDS, -100)}, enc, encoder)
    assert out.loss.item() == 0.0 and out.loss.requires_grad


# ---------------------------------------------------------------------- registry and ownership
def test_registry_and_parameter_validation(encoder):
    assert set(OBJECTIVES) >= {"mlm", "bow", "ae", "ar", "enhanced"}
    with pytest.raises(ConfigError, match="known objectives: .*ae.*bow"):
        build_objective("nope", encoder)
    with pytest.raises(ConfigError, match="accepts: num_layers"):
        build_objective("ae", encoder, layers=2)
    with pytest.raises(ConfigError, match="num_layers"):
        build_objective("ae", encoder, num_layers=0)
    with pytest.raises(ConfigError, match="attention_window"):
        build_objective("ar", encoder, attention_window=0)


def test_objectives_own_only_their_fresh_layers(encoder):
    encoder_ids = {id(p) for p in encoder.parameters()}
    assert build_objective("mlm", encoder).head_state_dict() == {}
    assert build_objective("bow", encoder).head_state_dict() == {}
    for name in ("ae", "ar", "enhanced"):
        objective = build_objective(name, encoder)
        assert objective.head_state_dict()
        assert not any(id(p) in encoder_ids for p in objective.parameters())
    assert len(build_objective("ae", encoder, num_layers=2).decoder.layers) == 2


# ---------------------------------------------------------------------- PretrainModel

PRETRAIN_TEXTS = ["dense retrieval encodes queries and passages as vectors",
                  "masked auto encoders add a shallow decoder to the encoder",
                  "bag of words prediction needs no decoder at all",
                  "the cls vector is the bottleneck of the model"]


def pretrain_setup(tokenizer, name: str, seed: int = 0):
    torch.manual_seed(seed)
    encoder = Encoder.from_config(tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model = PretrainModel(encoder, preset(name))
    collator = PretrainCollator(tokenizer, preset(name), model.required_features(), max_len=32, seed=seed)
    examples = [{"input_ids": tokenizer(text)["input_ids"]} for text in PRETRAIN_TEXTS]
    return model, collator(examples)


PAPER_000_PRESETS = ["mlm", "bow", "ae", "ar", "retromae"]  # later methods have their own test files


@pytest.mark.parametrize("name", PAPER_000_PRESETS)
def test_pretrain_model_trains_every_objective(tokenizer, name):
    model, batch = pretrain_setup(tokenizer, name)
    objectives = preset(name).objective_names
    assert model.required_features() | {"mlm_labels"} == preset(name).required_features()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        loss, logs = model(batch)
        if first is None:
            first = logs
            assert {f"loss/{o}" for o in objectives} <= set(logs) and "loss" in logs
            assert float(logs["loss"]) == pytest.approx(sum(float(logs[f"loss/{o}"]) for o in objectives), rel=1e-6)
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
        optimizer.step()
    _, last = model(batch)
    for objective in objectives:
        assert float(last[f"loss/{objective}"]) < 0.9 * float(first[f"loss/{objective}"]), objective


@pytest.mark.parametrize("name", ["bow", "ae", "retromae", "ar"])
def test_pretrain_model_save_load_round_trip(tokenizer, name, tmp_path):
    model, batch = pretrain_setup(tokenizer, name)
    with torch.no_grad():  # move the heads away from their initialisation so the reload is meaningful
        for parameter in model.objectives.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    model.eval()
    with torch.no_grad():
        loss, logs = model(batch)
    model.save(tmp_path)
    assert {"config.json", "model.safetensors", "heads.safetensors", "method.json"} <= {p.name for p in tmp_path.iterdir()}
    reloaded = PretrainModel.load(tmp_path).eval()
    assert reloaded.method == preset(name).to_dict()
    with torch.no_grad():
        loss2, logs2 = reloaded(batch)
    assert loss2.item() == loss.item()
    assert {k: float(v) for k, v in logs.items()} == {k: float(v) for k, v in logs2.items()}


def test_pretrain_model_registers_each_parameter_once(tokenizer):
    model, _ = pretrain_setup(tokenizer, "retromae")
    encoder_names = {f"encoder.{n}" for n, _ in model.encoder.named_parameters()}
    head_names = {f"objectives.{n}" for n in model.head_state_dict()}
    assert {n for n, _ in model.named_parameters()} == encoder_names | head_names
    assert sum(p.numel() for p in model.parameters()) == (
        sum(p.numel() for p in model.encoder.parameters()) + sum(v.numel() for v in model.head_state_dict().values()))


def test_pretrain_model_rejects_bad_methods(tokenizer):
    encoder = Encoder.from_config(tiny_bert_config())
    with pytest.raises(ConfigError, match="unknown objective"):
        PretrainModel(encoder, {"objectives": [{"name": "nope"}]})
    with pytest.raises(ConfigError, match="listed twice"):
        PretrainModel(encoder, {"objectives": ["mlm", "mlm"]})
    with pytest.raises(ConfigError, match="'objectives' list"):
        PretrainModel(encoder, {"name": "x"})
    with pytest.raises(ConfigError, match="is not a pre-training checkpoint"):
        PretrainModel.load("/nonexistent-dir")


@pytest.mark.parametrize("name", ["ae", "ar", "retromae", "bow"])
def test_pretrain_model_under_bf16_autocast(tokenizer, name):
    model, batch = pretrain_setup(tokenizer, name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, logs = model(batch)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in logs.values())


def test_every_objective_cites_its_paper():
    from pretrieve.modeling.objectives.base import OBJECTIVES, Citation

    assert OBJECTIVES
    for name, cls in OBJECTIVES.items():
        citation = cls.citation
        assert isinstance(citation, Citation), name
        assert 2018 <= citation.year <= 2024 and citation.first_author and citation.title, name
        assert str(citation).startswith(f"{citation.paper} ({citation.first_author} et al. {citation.year})")
