"""Sparse (SPLADE, paper 004 eq. 4) and hybrid (eq. 6) representations: pooling by hand, special tokens and padding
left out, FLOPS in the loss, save/load, fine-tuning specs, and exact sparse search (top-100 = brute force)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from conftest import tiny_bert_config
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder
from pretrieve.modeling.dual_encoder import DualEncoder, MaskedLMTower
from pretrieve.modeling.representations import representation_from_config
from pretrieve.modeling.representations.sparse import (HybridRepresentation, SparseRepresentation, content_positions,
                                                       parse_spec, representation_from_spec)
from pretrieve.retrieval.index import open_index, save_arrays, writing
from pretrieve.retrieval.index.sparse import SparseSearcher
from pretrieve.modeling.losses import contrastive_loss, flops_regularizer

from test_dual_encoder import make_batch


@pytest.fixture(scope="module")
def tower() -> MaskedLMTower:
    torch.manual_seed(0)
    return MaskedLMTower(Encoder.from_config(tiny_bert_config(initializer_range=0.2))).double().eval()


def hand_splade(tower: MaskedLMTower, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 4 with loops: every token but [CLS]/[SEP]/padding through the MLM head, log(1 + ReLU), max."""
    hidden = tower(ids, mask)
    rows = []
    for b in range(ids.shape[0]):
        real = [l for l in range(ids.shape[1]) if mask[b, l]]
        per_token = [torch.log1p(torch.relu(tower.mlm_logits(hidden[b, l]))) for l in real[1:-1]]
        rows.append(torch.stack(per_token).max(dim=0).values if per_token else torch.zeros(tower.encoder.vocab_size,
                                                                                          dtype=hidden.dtype))
    return torch.stack(rows)


def test_content_positions_leave_out_special_tokens_and_padding():
    right = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1, 1]])
    assert content_positions(right).tolist() == [[False, True, True, False, False], [False] * 5]
    assert content_positions(left).tolist() == [[False, False, True, True, False]]


def test_sparse_pooling_by_hand(tower, tokenizer):
    batch = tokenizer(["protein folding prediction", "rain", ""], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rep = SparseRepresentation()
    with torch.no_grad():
        got = rep.encode(tower(ids, mask), mask, ids, tower)
        expected = hand_splade(tower, ids, mask)
    assert got.shape == (3, tower.encoder.vocab_size)
    assert torch.allclose(got, expected, atol=1e-12)
    assert (got >= 0).all() and not got[2].any()                   # "[CLS] [SEP]": no content token → zeros
    assert got[0].count_nonzero() > 0
    with torch.no_grad():                                           # what [CLS]/[SEP]/padding hold does not matter
        changed = ids.clone()
        changed[1, 3:] = 2000                                        # padding positions of row 1
        assert torch.equal(rep.encode(tower(changed, mask), mask, changed, tower)[1], got[1])


def test_hybrid_score_and_flops_in_the_loss(tiny_mlm_dir, tokenizer):
    representation = HybridRepresentation(hidden_size=32, query_flops=0.01, passage_flops=0.002)
    model = DualEncoder.from_pretrained(tiny_mlm_dir, representation=representation).double()
    assert isinstance(model.query_tower, MaskedLMTower)
    batch = make_batch(tokenizer)
    loss, logs = model(batch)
    q, p = model.encode_batch(batch, "query"), model.encode_batch(batch, "passage")
    tower = model.query_tower
    with torch.no_grad():
        for reps, text_type in ((q, "query"), (p, "passage")):
            ids, mask = batch[f"{text_type}_input_ids"], batch[f"{text_type}_attention_mask"]
            hidden = tower(ids, mask)
            assert torch.allclose(reps[:, :32], hidden[:, 0], atol=1e-12)
            assert torch.allclose(reps[:, 32:], hand_splade(tower, ids, mask), atol=1e-12)
    scores = representation.score(q, p)
    by_hand = q[:, :32] @ p[:, :32].T + q[:, 32:] @ p[:, 32:].T
    assert torch.allclose(scores, by_hand, atol=1e-9)
    with torch.no_grad():
        flops_q = 0.01 * flops_regularizer(q[:, 32:])
        flops_p = 0.002 * flops_regularizer(p[:, 32:])
        contrastive = contrastive_loss(q, p, temperature=1.0, similarity="dot")
    assert float(logs["loss/flops_query"]) == pytest.approx(float(flops_q), rel=1e-6)
    assert float(logs["loss/flops_passage"]) == pytest.approx(float(flops_p), rel=1e-6)
    assert float(loss.detach()) == pytest.approx(float(contrastive + flops_q + flops_p), rel=1e-6)
    loss.backward()
    assert model.query_tower.encoder.word_embeddings.weight.grad is not None


def test_weighted_hybrid_and_save_load(tiny_mlm_dir, tokenizer, tmp_path):
    representation = HybridRepresentation(hidden_size=32, dense_weight=0.5, sparse_weight=2.0)
    assert "score_fn" in representation.loss_options()
    model = DualEncoder.from_pretrained(tiny_mlm_dir, representation=representation).eval()
    batch = make_batch(tokenizer)
    with torch.no_grad():
        q, p = model.encode_batch(batch, "query"), model.encode_batch(batch, "passage")
        expected = 0.5 * q[:, :32] @ p[:, :32].T + 2.0 * q[:, 32:] @ p[:, 32:].T
        assert torch.allclose(model.score(q, p), expected, atol=1e-5)
    model.save(tmp_path / "saved")
    loaded = DualEncoder.load(tmp_path / "saved").eval()
    assert loaded.representation.config() == representation.config()
    with torch.no_grad():
        assert torch.allclose(loaded.encode_batch(batch, "query"), q, atol=1e-6)
    assert isinstance(representation_from_config({"type": "sparse"}), SparseRepresentation)


def test_specs_for_fine_tuning(tiny_mlm_dir):
    assert parse_spec("dense=1, sparse=0.5,lq=3e-4") == {"dense_weight": 1.0, "sparse_weight": 0.5,
                                                          "query_flops": 3e-4}
    hybrid = representation_from_spec("hybrid", "ld=0", str(tiny_mlm_dir))
    assert hybrid.hidden_size == 32 and hybrid.passage_flops == 0.0
    assert isinstance(representation_from_spec("sparse", "", str(tiny_mlm_dir)), SparseRepresentation)
    for kind, spec in (("hybrid", "alpha=1"), ("sparse", "dense=1"), ("hybrid", "lq=x"), ("hybrid", "dense=0,sparse=0")):
        with pytest.raises(ConfigError):
            representation_from_spec(kind, spec, str(tiny_mlm_dir))
    from pretrieve.train.finetuner import FinetuneConfig, build_representation

    config = FinetuneConfig(model=str(tiny_mlm_dir), data="x", out="y", representation="hybrid:lq=1e-3")
    assert build_representation(config, str(tiny_mlm_dir)).query_flops == 1e-3


def test_sparse_search_returns_the_brute_force_top_100(tower, tokenizer, tmp_path):
    generator = torch.Generator().manual_seed(4)
    rep = SparseRepresentation()
    passages = torch.randint(1000, 8000, (400, 12), generator=generator)
    queries = torch.randint(1000, 8000, (6, 6), generator=generator)
    with torch.no_grad():
        p = rep.encode(tower(passages, torch.ones_like(passages)), torch.ones_like(passages), passages, tower)
        q = rep.encode(tower(queries, torch.ones_like(queries)), torch.ones_like(queries), queries, tower)
    with writing(tmp_path / "index", "sparse", [str(i) for i in range(400)], {}, {"test": 1}) as tmp:
        save_arrays(tmp, {"sparse": sp.csr_matrix(p.float().numpy())})
    index = SparseSearcher(open_index(tmp_path / "index"))
    assert index.matrix.nnz < p.numel()                              # stored sparsely
    scores, rows = index.search({"sparse": sp.csr_matrix(q.float().numpy())}, k=100)
    brute = rep.score(q, p).numpy()
    for row in range(q.shape[0]):
        order = np.lexsort((np.arange(brute.shape[1]), -brute[row]))[:100]
        assert rows[row].tolist() == order.tolist()
        assert np.allclose(scores[row], brute[row, order], rtol=1e-5)
