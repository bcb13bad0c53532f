"""Mixture of Textual Experts (paper 004 §3.1): equal experts reproduce the plain model, a query batch never
touches P-FFN (and vice versa), mixed batches equal separate ones, checkpoints restore both experts, and the dual
encoder routes queries and passages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, DistilBertConfig, DistilBertForMaskedLM

from conftest import tiny_bert_config
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder
from pretrieve.modeling.dual_encoder import DualEncoder
from pretrieve.modeling.mote import (EXPERTS, enable_mote, expert_parameters, is_mote, is_mote_checkpoint,
                                     route_plan, routed_modules, routed_views)

QUERY, PASSAGE = 0, 1


def tiny_encoder(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder.from_config(tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).double()


def inputs(rows: int = 4, length: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0
    return ids, mask


def perturb(model, expert: str, scale: float = 0.1, seed: int = 2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in expert_parameters(model, expert):
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def test_equal_experts_reproduce_the_plain_model():
    encoder = tiny_encoder().eval()
    ids, mask = inputs()
    with torch.no_grad():
        plain = encoder(ids, mask).last_hidden_state
        enable_mote(encoder.model)
        for types in ([0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], None):
            text_type = None if types is None else torch.tensor(types)
            # equal up to float64 rounding (a mixed batch runs each expert on a row subset)
            assert torch.allclose(encoder(ids, mask, text_type=text_type).last_hidden_state, plain, atol=1e-12, rtol=0)
    layers = tiny_bert_config().num_hidden_layers
    assert len(routed_modules(encoder.model)) == 2 * layers              # intermediate + output per layer
    for name, module in routed_modules(encoder.model):
        assert module.query is not module.passage
        for (key, q), (_, p) in zip(module.query.state_dict().items(), module.passage.state_dict().items()):
            assert torch.equal(q, p) and q.data_ptr() != p.data_ptr(), key   # copies, not shared tensors


@pytest.mark.parametrize("text_type,used,unused", [(QUERY, "query", "passage"), (PASSAGE, "passage", "query")])
def test_a_batch_of_one_type_never_touches_the_other_expert(text_type, used, unused):
    encoder = tiny_encoder()
    enable_mote(encoder.model)
    ids, mask = inputs()
    encoder.zero_grad()
    out = encoder(ids, mask, text_type=torch.full((4,), text_type)).last_hidden_state
    out.pow(2).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in expert_parameters(encoder.model, unused))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in expert_parameters(encoder.model, used))
    attention = [p for name, p in encoder.named_parameters() if ".attention." in name]
    assert attention and all(p.grad is not None for p in attention)  # the shared self-attention learns from both


def test_mixed_batches_equal_separate_batches_and_gradients_split():
    encoder = tiny_encoder().eval()
    enable_mote(encoder.model)
    perturb(encoder.model, "query")
    ids, mask = inputs(rows=5)
    types = torch.tensor([1, 0, 0, 1, 0])
    with torch.no_grad():
        mixed = encoder(ids, mask, text_type=types).last_hidden_state
        as_query = encoder(ids, mask, text_type=torch.zeros(5, dtype=torch.long)).last_hidden_state
        as_passage = encoder(ids, mask, text_type=torch.ones(5, dtype=torch.long)).last_hidden_state
    expected = torch.where(types.bool()[:, None, None], as_passage, as_query)
    assert torch.allclose(mixed, expected, atol=1e-12)
    assert not torch.allclose(as_query, as_passage)
    # gradients of the query rows reach only Q-FFN, those of the passage rows only P-FFN
    encoder.zero_grad()
    out = encoder(ids, mask, text_type=types).last_hidden_state
    out[types == 0].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in expert_parameters(encoder.model, "passage"))


def test_route_plan_and_bad_types():
    plan = route_plan(torch.tensor([1, 0, 1, 0, 0]))
    assert plan.single is None
    assert [rows.tolist() for _, rows in plan.groups] == [[1, 3, 4], [0, 2]]
    order = torch.cat([rows for _, rows in plan.groups])
    assert torch.equal(order[plan.inverse], torch.arange(5))
    assert route_plan(None).single == PASSAGE and route_plan(torch.zeros(3)).single == QUERY
    encoder = tiny_encoder()
    enable_mote(encoder.model)
    ids, mask = inputs()
    with pytest.raises(ValueError):
        encoder(ids, mask, text_type=torch.tensor([0, 1, 2, 0]))


def test_checkpoint_restores_both_experts_and_plain_loaders_get_the_passage_expert(tmp_path):
    encoder = tiny_encoder().float().eval()
    enable_mote(encoder.model)
    perturb(encoder.model, "query")
    ids, mask = inputs()
    types = torch.tensor([0, 1, 0, 1])
    with torch.no_grad():
        expected = encoder(ids, mask, text_type=types).last_hidden_state
    encoder.save_pretrained(tmp_path)
    assert is_mote_checkpoint(tmp_path)
    reloaded = Encoder.from_pretrained(tmp_path).eval()
    assert is_mote(reloaded.model)
    with torch.no_grad():
        assert torch.allclose(reloaded(ids, mask, text_type=types).last_hidden_state, expected, atol=1e-6)
    plain = AutoModel.from_pretrained(tmp_path).eval()                   # passage expert under the usual names
    with torch.no_grad():
        got = plain(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.allclose(got[1::2], expected[1::2], atol=1e-6)
        query_view, passage_view = routed_views(plain, tmp_path)
        assert torch.allclose(query_view(input_ids=ids, attention_mask=mask).last_hidden_state[::2], expected[::2],
                              atol=1e-6)
    # trainer checkpoints (state_dict / load_state_dict) keep the same names as the files
    state = reloaded.state_dict()
    assert any(key.endswith("layer.0.intermediate.dense.weight") for key in state)
    assert any(key.endswith("layer.0.intermediate.query.dense.weight") for key in state)
    fresh = tiny_encoder(seed=5).float()
    enable_mote(fresh.model)
    fresh.load_state_dict(state)
    fresh.eval()
    with torch.no_grad():
        assert torch.allclose(fresh(ids, mask, text_type=types).last_hidden_state, expected, atol=1e-6)


def test_dual_encoder_routes_queries_and_passages(tmp_path, tokenizer):
    encoder = tiny_encoder().float()
    enable_mote(encoder.model)
    perturb(encoder.model, "query")
    encoder.save_pretrained(tmp_path / "mote")
    tokenizer.save_pretrained(tmp_path / "mote")
    model = DualEncoder.from_pretrained(tmp_path / "mote").eval()         # MoTE checkpoint → an "mlm" tower
    assert model.query_tower.kind == "mlm" and model.tied
    ids, mask = inputs()
    with torch.no_grad():
        q = model.encode("query", ids, mask)
        p = model.encode("passage", ids, mask)
        base = model.query_tower.encoder
        assert torch.allclose(q, base(ids, mask, text_type=torch.zeros(4, dtype=torch.long)).cls, atol=1e-6)
        assert torch.allclose(p, base(ids, mask, text_type=torch.ones(4, dtype=torch.long)).cls, atol=1e-6)
        assert not torch.allclose(q, p, atol=1e-4)
    model.save(tmp_path / "tuned")
    again = DualEncoder.load(tmp_path / "tuned").eval()
    with torch.no_grad():
        assert torch.allclose(again.encode("query", ids, mask), q, atol=1e-6)


def test_other_families_and_unsupported_layouts():
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, dropout=0.0,
                              attention_dropout=0.0, max_position_embeddings=64)
    model = DistilBertForMaskedLM(config).eval()
    ids, mask = inputs()
    with torch.no_grad():
        plain = model.distilbert(input_ids=ids, attention_mask=mask).last_hidden_state
        enable_mote(model)
        assert len(routed_modules(model)) == 4 and EXPERTS == ("query", "passage")
        routed = model.distilbert(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(plain, routed, atol=1e-6)
    with pytest.raises(ConfigError):
        enable_mote(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_dense_retrieval_encoders_route_a_mote_export(tmp_path, tokenizer):
    from pretrieve.modeling.export import export_retriever
    from pretrieve.retrieval.load import load_retriever

    encoder = tiny_encoder().float()
    enable_mote(encoder.model)
    perturb(encoder.model, "query")
    encoder.save_pretrained(tmp_path / "mote")
    tokenizer.save_pretrained(tmp_path / "mote")
    model = DualEncoder.from_pretrained(tmp_path / "mote").eval()
    export_retriever(model, tokenizer, tmp_path / "export", max_seq_length=32)
    retriever = load_retriever(tmp_path / "export", device="cpu", precision="fp32")
    query_encoder, passage_encoder = retriever.query_encoder, retriever.passage_encoder
    texts = ["what causes rain", "protein folding"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        q = model.encode("query", batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        p = model.encode("passage", batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert torch.allclose(query_encoder.embed(texts), q, atol=1e-5)
    assert torch.allclose(passage_encoder.embed(texts), p, atol=1e-5)


def test_embedding_divergence_follows_appendix_a1(tmp_path):
    from pretrieve.analysis.divergence import (cosine_distance_matrix, embedding_divergence, js_divergence,
                                               kl_divergence, plot_tsne)

    p, q = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.25, 0.5])
    assert kl_divergence(p, q) == pytest.approx(0.5 * np.log(2) + 0.25 * np.log(0.5), rel=1e-12)
    m = (p + q) / 2
    by_hand = 0.5 * sum(a * np.log(a / b) for a, b in zip(p, m)) + 0.5 * sum(a * np.log(a / b) for a, b in zip(q, m))
    assert js_divergence(p, q) == pytest.approx(by_hand, rel=1e-12) == js_divergence(q, p)
    vectors = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    assert np.allclose(cosine_distance_matrix(vectors), [[0, 1, 1 - 2 ** -0.5], [1, 0, 1 - 2 ** -0.5],
                                                         [1 - 2 ** -0.5, 1 - 2 ** -0.5, 0]])
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(30, 8))
    shared = embedding_divergence(queries, queries + 0.01 * rng.normal(size=(30, 8)), seed=0)
    apart = embedding_divergence(queries + 3.0, -queries - 3.0, seed=0)   # two separate clouds
    assert 0 <= shared.js < apart.js <= np.log(2) + 1e-9 and shared.kl < apart.kl
    path = plot_tsne({"shared": shared, "apart": apart}, tmp_path / "tsne.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_restore_reads_legacy_layernorm_names(tmp_path):
    """transformers writes LayerNorm ``gamma``/``beta`` back for models loaded from such checkpoints (splade-tiny)."""
    from safetensors.torch import load_file, save_file

    encoder = tiny_encoder().float().eval()
    enable_mote(encoder.model)
    perturb(encoder.model, "query")
    encoder.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    renamed = {key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): value
               for key, value in state.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    reloaded = Encoder.from_pretrained(tmp_path).eval()
    ids, mask = inputs()
    types = torch.tensor([0, 1, 0, 1])
    with torch.no_grad():
        assert torch.allclose(reloaded(ids, mask, text_type=types).last_hidden_state,
                              encoder(ids, mask, text_type=types).last_hidden_state, atol=1e-6)
