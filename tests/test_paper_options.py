"""The objective-level options taken from the authors' released code, each checked against a hand computation:
the BoW weight's cosine decay, CoT-MoTE's direction weights and attention window, DupMAE's query stream through the
embedding layer, contexts re-drawn per epoch, and DupMAE's stage-1 / stage-3 fine-tuning variants."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import tiny_bert_config
from test_contextual import TEXTS, mean_ce, pairs_file, setup, spans  # noqa: F401 (fixtures)
from pretrieve.data.spans import PairDataset
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder
from pretrieve.modeling.objectives.autoregression import causal_visibility
from pretrieve.modeling.objectives.bow import PROGRESS, bow_cross_entropy
from pretrieve.modeling.pretrain_model import PretrainModel
from pretrieve.train.collator import PretrainCollator
from pretrieve.train.loop import PROGRESS_KEY
from pretrieve.train.method import method_from_mapping, preset


# ------------------------------------------------------------------------------------------------ BoW decay
def test_the_bow_weight_follows_a_cosine_from_1_to_the_floor(tokenizer):
    assert PROGRESS == PROGRESS_KEY
    assert preset("bow").objectives[1].params == {"cosine_decay_to": 0.1}
    method = preset("bow")
    texts = ["the tumor cells grow fast in the tissue", "viruses infect the membrane of the cell"]
    torch.manual_seed(0)
    model = PretrainModel(Encoder.from_config(tiny_bert_config()), method).eval()
    batch = PretrainCollator(tokenizer, method, max_len=32, seed=0)(
        [{"input_ids": tokenizer(t)["input_ids"]} for t in texts], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = float(bow_cross_entropy(model.encoder.mlm_logits(model.encode(batch).cls), batch["bow_targets"])[0])
        assert float(model(batch)[1]["loss/bow"]) == pytest.approx(plain, rel=1e-6)   # no progress: weight 1
        for progress, factor in ((0.0, 1.0), (0.5, 0.55), (1.0, 0.1), (0.25, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))):
            _, logs = model({**batch, PROGRESS: torch.tensor(progress)})
            assert float(logs["factor/bow"]) == pytest.approx(factor, rel=1e-6)
            assert float(logs["loss/bow"]) == pytest.approx(plain * factor, rel=1e-5)
            assert float(logs["cross_entropy/bow"]) == pytest.approx(plain, rel=1e-6)
    with pytest.raises(ConfigError, match="cosine_decay_to must be a number in"):
        PretrainModel(Encoder.from_config(tiny_bert_config()),
                      method_from_mapping({"objectives": ["mlm", {"name": "bow", "params": {"cosine_decay_to": 2}}]}))


def test_the_loop_hands_the_training_progress_to_every_micro_batch():
    from pretrieve.train.loop import StepBatches

    seen = []

    def collate(examples, generator=None):
        return {"x": torch.tensor(examples, dtype=torch.float32)}

    batches = StepBatches(list(range(8)), collate, batch_size=4, micro_batch_size=2, seed=0, start_step=0,
                          total_steps=4, rank=0, world_size=1)
    for step, micro in batches:
        seen.append([float(m[PROGRESS_KEY]) for m in micro])
    assert seen == [[0.0, 0.0], [0.25, 0.25], [0.5, 0.5], [0.75, 0.75]]


# ----------------------------------------------------------------------------------- CoT-MoTE's decoder
def test_the_authors_attention_window_mask():
    """CoT-MAE-qc's build_ar_dec_head: a lower-triangular mask, then for rows i ≥ w + 1 the columns 1 … i − w
    hidden (the bottleneck at column 0 always visible)."""
    length, window = 9, 3
    theirs = torch.tril(torch.ones(length, length, dtype=torch.bool))
    for i in range(window + 1, length):
        for j in range(1, i - window + 1):
            theirs[i, j] = False
    assert torch.equal(causal_visibility(length, window), theirs)


def _pair_batch(tokenizer, pairs_file, params):
    method = method_from_mapping({"base": "cotmote", "context": {"pairs": str(pairs_file)},
                                  "objectives": ["mlm_spans", {"name": "context_ar", "params": params}]})
    dataset = PairDataset(pairs_file, tokenizer, max_len=48)
    model, batch = setup(tokenizer, method, [dataset[i] for i in range(3)])
    return model.eval(), batch


def _direction_means(model, batch, window):
    encoder, decoder = model.encoder, model.objectives["context_ar"].decoder
    passage = encoder(batch["input_ids"], batch["attention_mask"], text_type=torch.ones(3, dtype=torch.long))
    query = encoder(batch["context_input_ids"], batch["context_attention_mask"], text_type=torch.zeros(3, dtype=torch.long))
    means = {}
    for name, cls, ids, labels, mask in (
            ("to_context", passage.cls, batch["context_original_ids"], batch["context_original_labels"],
             batch["context_attention_mask"]),
            ("to_anchor", query.cls, batch["original_input_ids"], batch["original_labels"], batch["attention_mask"])):
        hidden = torch.cat([cls.unsqueeze(1), encoder.embed_tokens(ids)[:, 1:]], dim=1)
        visible = causal_visibility(ids.shape[1], window).unsqueeze(0) & mask.bool().unsqueeze(1)
        summed, n = mean_ce(encoder, decoder(hidden, visible)[:, :-1], labels[:, 1:])
        means[name] = float(summed / n)
    return means


def test_the_cotmote_preset_generates_the_query_from_the_passage_with_window_3_by_hand(tokenizer, pairs_file):
    assert preset("cotmote").objectives[1].params == {"num_layers": 1, "direction_weights": [1.0, 0.0],
                                                      "attention_window": 3}
    method = method_from_mapping({"base": "cotmote", "context": {"pairs": str(pairs_file)}})
    dataset = PairDataset(pairs_file, tokenizer, max_len=48)
    model, batch = setup(tokenizer, method, [dataset[i] for i in range(3)])
    model.eval()
    with torch.no_grad():
        _, logs = model(batch)
        means = _direction_means(model, batch, window=3)
    assert float(logs["loss/context_ar"]) == pytest.approx(means["to_context"], rel=1e-9)
    assert "loss_to_anchor/context_ar" not in logs           # the passage is not reconstructed at all
    # the window matters: with full attention the same rows give another loss
    with torch.no_grad():
        assert _direction_means(model, batch, window=None)["to_context"] != pytest.approx(means["to_context"],
                                                                                          rel=1e-6)


def test_direction_weights_weigh_each_directions_own_mean(tokenizer, pairs_file):
    model, batch = _pair_batch(tokenizer, pairs_file, {"direction_weights": [2.0, 0.5]})
    with torch.no_grad():
        _, logs = model(batch)
        means = _direction_means(model, batch, window=None)
    assert float(logs["loss/context_ar"]) == pytest.approx(2.0 * means["to_context"] + 0.5 * means["to_anchor"],
                                                           rel=1e-9)
    assert float(logs["loss_to_anchor/context_ar"]) == pytest.approx(means["to_anchor"], rel=1e-9)
    model, batch = _pair_batch(tokenizer, pairs_file, {"direction_weights": [0, 1]})
    with torch.no_grad():
        _, logs = model(batch)
    assert float(logs["loss/context_ar"]) == pytest.approx(means["to_anchor"], rel=1e-9)
    for bad in ([0, 0], [1], [-1, 1], "both"):
        with pytest.raises(ConfigError, match="direction_weights must be"):
            _pair_batch(tokenizer, pairs_file, {"direction_weights": bad})


# ------------------------------------------------------------------------------------ DupMAE's query stream
def test_dupmae_passes_the_decoder_query_stream_through_the_embedding_layer(tokenizer):
    assert preset("dupmae").objectives[1].params == {"query_stream": "embeddings"}
    assert preset("retromae").objectives[1].params == {}
    texts = ["the tumor cells grow fast in the tissue", "viruses infect the membrane of the cell"]
    losses = {}
    for stream in ("raw", "embeddings"):
        method = method_from_mapping({"base": "retromae",
                                      "objectives": ["mlm", {"name": "enhanced", "params": {"query_stream": stream}}]})
        torch.manual_seed(0)
        model = PretrainModel(Encoder.from_config(tiny_bert_config(initializer_range=0.2)), method).eval()
        batch = PretrainCollator(tokenizer, method, max_len=32, seed=0)(
            [{"input_ids": tokenizer(t)["input_ids"]} for t in texts], generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            _, logs = model(batch)
            encoder, layer = model.encoder, model.objectives["enhanced"].layer
            cls = model.encode(batch).cls.unsqueeze(1)
            ids = batch["original_input_ids"]
            positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
            embeddings = encoder.embeddings
            if stream == "embeddings":   # LN(h_CLS + p + t₀), as modeling_duplex.py's decoder_embeddings(inputs_embeds=…)
                query = embeddings.LayerNorm(cls + embeddings.position_embeddings(positions)
                                             + embeddings.token_type_embeddings(torch.zeros_like(ids)))
            else:                        # h_CLS + p, RetroMAE's modeling.py
                query = cls + embeddings.position_embeddings(positions)
            content = torch.cat([cls, encoder.embed_tokens(ids)[:, 1:]], dim=1)
            visible = batch["enhanced_mask"].bool() & batch["attention_mask"].bool().unsqueeze(1)
            summed, n = mean_ce(encoder, layer(query, content, visible), batch["original_labels"])
        assert float(logs["loss/enhanced"]) == pytest.approx(float(summed / n), rel=1e-5)
        losses[stream] = float(logs["loss/enhanced"])
    assert losses["raw"] != pytest.approx(losses["embeddings"], rel=1e-4)
    with pytest.raises(ConfigError, match="query_stream must be one of raw, embeddings"):
        PretrainModel(Encoder.from_config(tiny_bert_config()), method_from_mapping(
            {"objectives": ["mlm", {"name": "enhanced", "params": {"query_stream": "ln"}}], "decoder_mask": 0.5}))


# -------------------------------------------------------------------------------------- context re-drawing
def test_contexts_and_pseudo_queries_are_drawn_again_every_epoch_unless_fixed(tokenizer, spans, tmp_path):
    from pretrieve.data.spans import ContextSpec, SpanDataset

    assert preset("cotmae").context.redraw and preset("cotmote").context.redraw
    fixed = SpanDataset(spans.corpus, "mixed", seed=0, redraw=False, anchors="span")
    for index in range(len(spans)):
        assert spans.draw(index, 0) == spans[index] == fixed.draw(index, 5)   # epoch 0 = dataset[i] = fixed draw
    epochs = [[spans.draw(i, epoch)["context_range"] for i in range(len(spans))] for epoch in range(4)]
    assert len({tuple(ranges) for ranges in epochs}) > 1                     # re-drawn: some context changes
    kinds = {spans.draw(0, epoch)["context_kind"] for epoch in range(30)}
    assert kinds == {"nearby", "overlap", "random"}                         # mixed: the kind is re-drawn too
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"passage": TEXTS[0], "queries": [f"question number {i}" for i in range(5)]}) + "\n")
    pairs = PairDataset(path, tokenizer, max_len=48, redraw=True)
    drawn = {tuple(pairs.draw(0, epoch)["context_input_ids"]) for epoch in range(20)}
    assert len(drawn) > 1 and pairs.draw(0, 0) == pairs[0]
    kept = PairDataset(path, tokenizer, max_len=48, redraw=False)
    assert {tuple(kept.draw(0, epoch)["context_input_ids"]) for epoch in range(20)} == {tuple(kept[0]["context_input_ids"])}
    assert ContextSpec.from_dict({"kind": "mixed", "redraw": False}).redraw is False
    with pytest.raises(ConfigError, match="context.redraw must be true or false"):
        ContextSpec.from_dict({"kind": "mixed", "redraw": "yes"})


def test_the_loop_draws_examples_with_their_epoch():
    from pretrieve.train.loop import StepBatches

    class Recording:
        def __init__(self):
            self.calls = []

        def __len__(self):
            return 4

        def __getitem__(self, index):
            raise AssertionError("draw() must be used")

        def draw(self, index, epoch):
            self.calls.append(epoch)
            return index

    data = Recording()
    batches = StepBatches(data, lambda e, generator=None: {"x": torch.tensor(e)}, batch_size=2, micro_batch_size=2,
                          seed=0, start_step=0, total_steps=6, rank=0, world_size=1)
    list(batches)
    assert data.calls == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]


# ------------------------------------------------------------------------------- DupMAE's fine-tuning stages
def test_dupmae_stage1_in_batch_only_and_stage3_soft_labels_only(tiny_bert_dir, tmp_path):
    from test_finetune import make_config, write_collection

    from pretrieve.data.groups import read_groups
    from pretrieve.modeling.losses import combined_distillation_loss
    from pretrieve.train.finetuner import BM25_GROUPS_FILE, QRELS_GROUPS_FILE, finetune

    data = write_collection(tmp_path / "data")
    out = tmp_path / "s1"
    finetune(make_config(tiny_bert_dir, data, out, num_negatives=0, max_steps=2))
    assert not (out / BM25_GROUPS_FILE).exists()                   # no BM25 run at all
    groups = read_groups(out / QRELS_GROUPS_FILE)
    assert len(groups) == 20 and all(g.positives == [f"d{g.query_id[1:]}"] and not g.negatives for g in groups)
    # stage 3 with alpha 0: the loss is the KL term alone, whatever the in-batch contrast would add
    q, p, teacher = torch.randn(3, 8), torch.randn(12, 8), torch.randn(3, 4)
    soft = combined_distillation_loss(q, p, teacher, alpha=0.0)
    assert float(soft.loss) == pytest.approx(float(soft.kl)) and float(soft.contrastive) > 0
    student = torch.log_softmax((q.unsqueeze(1) * p.view(3, 4, 8)).sum(-1), dim=1)
    target = torch.softmax(teacher, dim=1)
    assert float(soft.kl) == pytest.approx(float((target * (target.log() - student)).sum(1).mean()), rel=1e-5)
