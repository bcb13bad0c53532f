"""Dual encoder: loss = the shared losses on hand-computed representations, siamese vs separate towers,
pooling, text_type routing, save/load."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.dual_encoder import (TOWERS, DualEncoder, RetrievalLoss, TransformerTower,
                                             register_tower)
from pretrieve.modeling.representations import (DenseRepresentation, Representation, register_representation,
                                                representation_from_config)
from pretrieve.modeling.losses import combined_distillation_loss, contrastive_loss

QUERIES = ["what causes rain", "protein folding prediction"]
PASSAGES = ["Rain forms when water vapour condenses.", "Stocks fell on Monday.", "Cats sleep a lot.",
            "Deep networks predict protein structures from sequences.", "The weather was sunny and dry.",
            "Bread is baked from flour."]  # 2 queries × groups of 3, positive first


def make_batch(tokenizer, with_teacher: bool = False) -> dict[str, torch.Tensor]:
    q = tokenizer(QUERIES, padding=True, return_tensors="pt")
    p = tokenizer(PASSAGES, padding=True, return_tensors="pt")
    batch = {f"query_{k}": v for k, v in q.items()} | {f"passage_{k}": v for k, v in p.items()}
    if with_teacher:
        batch["teacher_scores"] = torch.tensor([[3.0, 1.0, 0.5], [2.0, 2.5, -1.0]])
    return batch


def hand_pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    rows = []
    for h, m in zip(hidden, mask):
        real = h[m.bool()]
        rows.append(real[0] if pooling == "cls" else real.mean(0))
    return torch.stack(rows)


def hand_reps(model: DualEncoder, batch, text_type: str, pooling: str, normalize: bool) -> torch.Tensor:
    tower = model.tower(text_type).model
    hidden = tower(input_ids=batch[f"{text_type}_input_ids"], attention_mask=batch[f"{text_type}_attention_mask"],
                   token_type_ids=batch[f"{text_type}_token_type_ids"]).last_hidden_state
    reps = hand_pool(hidden, batch[f"{text_type}_attention_mask"], pooling)
    return F.normalize(reps, dim=-1) if normalize else reps


@pytest.mark.parametrize("pooling,normalize,similarity,temperature",
                         [("cls", False, "dot", 1.0), ("mean", False, "dot", 1.0), ("mean", True, "dot", 0.05),
                          ("cls", False, "cos", 0.05)])
def test_forward_equals_contrastive_loss_on_hand_computed_representations(tiny_bert_dir, tokenizer, pooling,
                                                                         normalize, similarity, temperature):
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation(pooling, normalize, similarity,
                                                                           temperature)).eval()
    batch = make_batch(tokenizer)
    loss, logs = model(batch)
    q, p = hand_reps(model, batch, "query", pooling, normalize), hand_reps(model, batch, "passage", pooling, normalize)
    expected = contrastive_loss(q, p, temperature=temperature, similarity=similarity)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert logs["loss/contrastive"].item() == pytest.approx(loss.item())
    scores = q @ p.T if similarity == "dot" else F.normalize(q, dim=-1) @ F.normalize(p, dim=-1).T
    own = torch.stack([scores[0, 0:3], scores[1, 3:6]])
    assert logs["accuracy"].item() == pytest.approx((own.argmax(1) == 0).float().mean().item())
    # by hand: cross-entropy of each query's row against its positive column (0 and 3)
    manual = -(torch.log_softmax(scores / temperature, dim=1)[[0, 1], [0, 3]]).mean()
    assert loss.item() == pytest.approx(manual.item(), rel=1e-5)
    # without in-batch negatives only the own group counts
    model.loss_config.in_batch = False
    own_only, _ = model(batch)
    assert own_only.item() == pytest.approx(F.cross_entropy(own / temperature, torch.zeros(2, dtype=torch.long)).item(),
                                            rel=1e-5)


def test_distillation_forward_equals_combined_loss(tiny_bert_dir, tokenizer):
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("cls"),
                                        loss=RetrievalLoss(alpha=0.2)).eval()
    batch = make_batch(tokenizer, with_teacher=True)
    loss, logs = model(batch)
    q, p = hand_reps(model, batch, "query", "cls", False), hand_reps(model, batch, "passage", "cls", False)
    expected = combined_distillation_loss(q, p, batch["teacher_scores"], alpha=0.2)
    assert loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    assert logs["loss/kl"].item() == pytest.approx(expected.kl.item(), rel=1e-5)
    assert loss.item() == pytest.approx(logs["loss/kl"].item() + 0.2 * logs["loss/contrastive"].item(), rel=1e-5)


def test_siamese_shares_one_tower_and_separate_towers_diverge_after_a_step(tiny_bert_dir, tokenizer):
    tied = DualEncoder.from_pretrained(tiny_bert_dir)
    separate = DualEncoder.from_pretrained(tiny_bert_dir, tied=False)
    assert tied.tied and tied.tower("query") is tied.tower("passage")
    assert not separate.tied and separate.tower("query") is not separate.tower("passage")
    n_tied = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in separate.parameters()) == 2 * n_tied
    assert all(k.startswith("query_tower.") for k in tied.state_dict())  # no duplicated (shared) tensors

    def flat(tower):
        return torch.cat([p.detach().flatten() for p in tower.parameters()])

    assert torch.equal(flat(separate.tower("query")), flat(separate.tower("passage")))  # same initialisation
    optimizer = torch.optim.SGD(separate.parameters(), lr=0.1)
    loss, _ = separate(make_batch(tokenizer))
    loss.backward()
    optimizer.step()
    assert not torch.equal(flat(separate.tower("query")), flat(separate.tower("passage")))


def test_text_type_reaches_the_tower(tiny_bert_dir, tokenizer):
    seen: list[str] = []

    @register_tower
    class RecordingTower(TransformerTower):
        kind = "recording-test"

        def forward(self, input_ids, attention_mask, token_type_ids=None, text_type="passage"):
            seen.append(text_type)
            return super().forward(input_ids, attention_mask, token_type_ids, text_type)

    try:
        model = DualEncoder.from_pretrained(tiny_bert_dir, tower="recording-test")
        model(make_batch(tokenizer))
        assert seen == ["query", "passage"]
    finally:
        TOWERS.pop("recording-test")
    with pytest.raises(ConfigError, match="unknown tower kind"):
        DualEncoder.from_pretrained(tiny_bert_dir, tower="nope")


def test_representation_needing_the_mlm_head_gets_masked_lm_towers(tiny_mlm_dir, tokenizer):
    @register_representation
    class VocabMax(Representation):
        """Max-pooled MLM logits (a SPLADE-like toy that only needs the head)."""

        kind = "vocab-max-test"
        needs_mlm_head = True

        def encode(self, hidden_states, attention_mask, input_ids, tower):
            logits = tower.mlm_logits(hidden_states)
            return torch.relu(logits).masked_fill(~attention_mask.bool()[..., None], 0).amax(dim=1)

        def score(self, q_rep, p_rep):
            return q_rep @ p_rep.T

        def config(self):
            return {"type": self.kind}

    try:
        model = DualEncoder.from_pretrained(tiny_mlm_dir, VocabMax())
        assert model.query_tower.kind == "mlm"
        loss, logs = model(make_batch(tokenizer))
        assert torch.isfinite(loss) and logs["accuracy"] >= 0
        assert representation_from_config({"type": "vocab-max-test"}).kind == "vocab-max-test"
    finally:
        from pretrieve.modeling.representations import REPRESENTATIONS

        REPRESENTATIONS.pop("vocab-max-test")


@pytest.mark.parametrize("tied", [True, False])
def test_save_and_load_round_trip(tiny_bert_dir, tokenizer, tmp_path, tied):
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean", True, temperature=0.05),
                                        tied=tied, loss=RetrievalLoss(alpha=0.5)).eval()
    if not tied:
        with torch.no_grad():
            next(model.tower("passage").parameters()).add_(0.01)
    model.save(tmp_path / "m", training={"query_max_len": 16})
    info = json.loads((tmp_path / "m" / "dual_encoder.json").read_text())
    assert info["tied"] is tied and info["representation"] == {"type": "dense", "pooling": "mean", "normalize": True,
                                                              "similarity": "dot", "temperature": 0.05}
    assert info["loss"]["alpha"] == 0.5 and info["training"] == {"query_max_len": 16}
    loaded = DualEncoder.load(tmp_path / "m").eval()
    assert loaded.tied is tied and loaded.loss_config.alpha == 0.5
    batch = make_batch(tokenizer)
    for text_type in ("query", "passage"):
        with torch.no_grad():
            assert torch.allclose(model.encode_batch(batch, text_type), loaded.encode_batch(batch, text_type),
                                  atol=1e-6)
    if not tied:
        with pytest.raises(InputError, match="DualEncoder.load"):
            DualEncoder.from_pretrained(tmp_path / "m")
    with pytest.raises(InputError, match="not a pretrieve dual encoder"):
        DualEncoder.load(tiny_bert_dir)


def test_representation_settings_are_validated():
    with pytest.raises(ConfigError, match="pooling"):
        DenseRepresentation("max")
    with pytest.raises(ConfigError, match="similarity"):
        DenseRepresentation("cls", similarity="l2")
    with pytest.raises(ConfigError, match="temperature"):
        DenseRepresentation("cls", temperature=0)
    with pytest.warns(UserWarning, match="temperature"):
        DenseRepresentation("mean", normalize=True, temperature=1.0)
    with pytest.raises(ConfigError, match="unknown representation"):
        representation_from_config({"type": "nope"})
    rep = representation_from_config(DenseRepresentation("mean", False, "cos", 0.02).config())
    assert (rep.pooling, rep.similarity, rep.temperature, rep.unit_vectors) == ("mean", "cos", 0.02, True)
