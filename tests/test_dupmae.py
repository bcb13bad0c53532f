"""DupMAE (paper 001): the OT-BoW loss by hand, the preset, the [CLS]+OT representation (eq. 10–12) by hand,
fine-tuning and saving it, and the exact two-index search (eq. 12) against brute force.

Hand computations run the tiny model in float64 (as tests/test_objectives.py), so module and hand agree far
below the 1e-6 tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import BertForMaskedLM

from conftest import tiny_bert_config
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder, PretrainModel, build_objective
from pretrieve.modeling.dual_encoder import DualEncoder, MaskedLMTower
from pretrieve.modeling.representations.dupmae import PAPER_INDEX_BITS, DupMAERepresentation, parse_spec
from pretrieve.modeling.objectives.ot_bow import max_pool_logits, ordinary_token_mask
from pretrieve.retrieval.batches import encode_all
from pretrieve.retrieval.index import SearchOptions, backend, open_index, save_arrays, writing
from pretrieve.retrieval.index.dupmae import DupMAESearcher, storage
from pretrieve.retrieval.index.sparse import topk_matrix
from pretrieve.retrieval.load import load_retriever, retriever_kind
from pretrieve.retrieval.search import search
from pretrieve.train.collator import PretrainCollator, unique_token_ids
from pretrieve.train.method import preset

from test_finetune import write_collection

CLS, SEP, PAD, MASK_ID = 101, 102, 0, 103
ORIGINAL = torch.tensor([[CLS, 2023, 2003, 1037, 2023, SEP], [CLS, 7592, 2088, SEP, PAD, PAD]])
ATTENTION = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
MASKED_AT = [(0, 2), (1, 1)]


def encoder_batch() -> dict[str, torch.Tensor]:
    ids, labels = ORIGINAL.clone(), torch.full_like(ORIGINAL, -100)
    for row, col in MASKED_AT:
        ids[row, col], labels[row, col] = MASK_ID, ORIGINAL[row, col]
    special = (ORIGINAL == CLS) | (ORIGINAL == SEP) | (ORIGINAL == PAD)
    return {"input_ids": ids, "attention_mask": ATTENTION, "mlm_labels": labels,
            "original_input_ids": ORIGINAL, "original_labels": torch.where(special, -100, ORIGINAL),
            "bow_targets": unique_token_ids(ORIGINAL, ATTENTION.bool() & ~special)}


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    torch.manual_seed(0)
    return Encoder.from_config(tiny_bert_config(initializer_range=0.2)).double().eval()


def hand_ot_bow(encoder: Encoder, batch, include_masked: bool, per_token_weights: bool) -> torch.Tensor:
    """Eq. 6–8 with Python loops: per-position logits, max, log-softmax, mean over the unique original tokens."""
    hidden = encoder(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    losses = []
    for b, row in enumerate(ORIGINAL.tolist()):
        positions = [l for l in range(len(row)) if ATTENTION[b, l] and l != 0
                     and (include_masked or (b, l) not in MASKED_AT)]
        mu = torch.stack([encoder.mlm_logits(hidden[b, l]) for l in positions]).max(dim=0).values
        log_probs = torch.log_softmax(mu, dim=-1)
        ordinary = [t for t in row if t not in (CLS, SEP, PAD)]
        bag = sorted(set(ordinary))
        denominator = len(ordinary) if per_token_weights else len(bag)
        losses.append(-sum(log_probs[t] for t in bag) / denominator)
    return torch.stack(losses).mean()


# ------------------------------------------------------------------------------------------ OT-BoW loss
def test_targets_are_the_unique_original_tokens_and_pooling_skips_cls_masked_and_padding():
    batch = encoder_batch()
    assert batch["bow_targets"].tolist() == [[1037, 2003, 2023], [2088, 7592, -100]]   # 2023 twice → once
    keep = ordinary_token_mask(batch["attention_mask"], batch["mlm_labels"])
    assert keep.tolist() == [[False, True, False, True, True, True], [False, False, True, True, False, False]]
    assert ordinary_token_mask(batch["attention_mask"]).tolist() == [
        [False, True, True, True, True, True], [False, True, True, True, False, False]]


@pytest.mark.parametrize("chunk_elements", [1, 1 << 24])
def test_ot_bow_paper_variant_matches_hand_computation(encoder, chunk_elements):
    batch = encoder_batch()
    objective = build_objective("ot_bow", encoder, chunk_elements=chunk_elements)
    out = objective(batch, encoder(batch["input_ids"], batch["attention_mask"]), encoder)
    expected = hand_ot_bow(encoder, batch, include_masked=False, per_token_weights=False)
    assert abs(out.loss.item() - expected.item()) < 1e-6
    assert out.logs["pooled_tokens"].item() == 6


def test_ot_bow_code_variant_pools_masked_positions_and_weights_by_length(encoder):
    batch = encoder_batch()
    objective = build_objective("ot_bow", encoder, variant="code")
    out = objective(batch, encoder(batch["input_ids"], batch["attention_mask"]), encoder)
    expected = hand_ot_bow(encoder, batch, include_masked=True, per_token_weights=True)
    assert abs(out.loss.item() - expected.item()) < 1e-6
    paper = build_objective("ot_bow", encoder)(batch, encoder(batch["input_ids"], batch["attention_mask"]), encoder)
    assert abs(out.loss.item() - paper.loss.item()) > 1e-3
    with pytest.raises(ConfigError, match="variant"):
        build_objective("ot_bow", encoder, variant="authors")


def test_chunked_max_pool_gives_the_one_shot_values_and_gradients(encoder):
    batch = encoder_batch()
    hidden = encoder(batch["input_ids"], batch["attention_mask"]).last_hidden_state.detach()
    keep = ordinary_token_mask(batch["attention_mask"], batch["mlm_labels"])
    results = []
    for chunk_elements in (1, 2 * 2 * 30522, 1 << 30):   # 1 position per chunk, 2 (B = 2), all at once
        leaf = hidden.clone().requires_grad_()
        pooled = max_pool_logits(encoder.mlm_logits, leaf, keep, chunk_elements)
        (pooled * torch.linspace(-1, 1, pooled.shape[-1], dtype=pooled.dtype)).sum().backward()
        results.append((pooled.detach(), leaf.grad))
    naive = encoder.mlm_logits(hidden).masked_fill(~keep.unsqueeze(-1), float("-inf")).max(dim=1).values
    for pooled, grad in results:
        assert torch.allclose(pooled, naive, atol=1e-12, rtol=0)
        assert torch.allclose(grad, results[-1][1], atol=1e-12)
    assert results[0][1][~keep].abs().sum() == 0          # [CLS], masked and padding positions get no gradient


def test_dupmae_preset_is_eq9_with_the_paper_masks_and_trains_end_to_end(tokenizer):
    method = preset("dupmae")
    assert [(s.name, s.weight) for s in method.objectives] == [("mlm", 1.0), ("enhanced", 1.0), ("ot_bow", 1.0)]
    assert (method.encoder_masker.ratio, method.decoder_masker.ratio) == (0.3, 0.5)
    code = preset("dupmae-code")
    assert [(s.name, s.weight, s.params) for s in code.objectives][-1] == ("ot_bow", 0.1, {"variant": "code"})
    torch.manual_seed(0)
    model = PretrainModel(Encoder.from_config(tiny_bert_config()), method)
    collator = PretrainCollator(tokenizer, method, max_len=32, seed=1)
    texts = ["dense retrieval with a duplex masked auto-encoder", "ordinary tokens carry a bag of words"]
    batch = collator([{"input_ids": tokenizer(t)["input_ids"]} for t in texts])
    loss, logs = model(batch)
    assert torch.isclose(loss, logs["loss/mlm"] + logs["loss/enhanced"] + logs["loss/ot_bow"])
    loss.backward()
    head = model.encoder.model.cls.predictions.transform.dense.weight
    assert head.grad is not None and head.grad.abs().sum() > 0


# ----------------------------------------------------------------------------------------- representation
def test_spec_strings_cover_the_table_3_variants_and_reject_mistakes():
    assert parse_spec("cls:384,ot:260", 768) == parse_spec(" CLS:384, OT:260 ", 768)
    assert (parse_spec("", 768).cls_dim, parse_spec("", 768).ot_k) == (384, 384)
    assert (parse_spec("cls:full", 768).cls_dim, parse_spec("cls:full", 768).ot_k) == (768, None)
    assert (parse_spec("ot:768", 768).cls_dim, parse_spec("ot:768", 768).ot_k) == (None, 768)
    assert str(parse_spec("cls:192,ot:130,act:log1p", 384)) == "cls:192,ot:130,act:log1p"
    for bad in ("cls:0", "cls:800", "dim:4", "cls:4,cls:8", "act:relu", "ot:-1", "ot:x", "act:tanh,ot:4"):
        with pytest.raises(ConfigError):
            parse_spec(bad, 768)


def test_paper_storage_accounting_matches_cls768_at_cls384_ot260():
    full, joint = DupMAERepresentation(768, "cls:768"), DupMAERepresentation(768, "cls:384,ot:260")
    assert full.reduction is None and full.storage_bytes() == 3072
    assert joint.storage_bytes(index_bytes=PAPER_INDEX_BITS / 8) <= full.storage_bytes() < joint.storage_bytes()
    assert joint.storage_bytes() == 384 * 4 + 260 * 8


def _hand_rep(encoder: Encoder, rep: DupMAERepresentation, ids, mask, sparsify: bool):
    """ĥ = W h_[CLS] (eq. 10) and μ = max of the MLM logits over non-[CLS] real tokens (eq. 7/11), by loops."""
    hidden = encoder(ids, mask).last_hidden_state
    dense = hidden[:, 0] @ rep.reduction.weight.T
    ots = []
    for b in range(ids.shape[0]):
        mu = torch.stack([encoder.mlm_logits(hidden[b, l]) for l in range(1, ids.shape[1]) if mask[b, l]]).max(0).values
        if sparsify:
            top = set(mu.topk(rep.ot_k).indices.tolist())
            mu = torch.tensor([v if i in top else 0.0 for i, v in enumerate(mu.tolist())], dtype=mu.dtype)
        ots.append(mu)
    return dense, torch.stack(ots)


def test_representation_scores_eq12_by_hand(encoder):
    rep = DupMAERepresentation(32, "cls:8,ot:5").double()
    tower = MaskedLMTower(encoder)
    queries = ORIGINAL[:, :4].clone(), torch.ones(2, 4, dtype=torch.long)
    passages = ORIGINAL, ATTENTION
    q = rep.encode(tower(*queries), queries[1], queries[0], tower)
    p = rep.encode(tower(*passages), passages[1], passages[0], tower)
    assert q.shape == (2, 8 + 30522) and rep.needs_mlm_head
    q_dense, q_ot = _hand_rep(encoder, rep, *queries, sparsify=False)          # queries keep the full μ_q
    p_dense, p_ot = _hand_rep(encoder, rep, *passages, sparsify=True)          # passages: top-k only
    expected = q_dense @ p_dense.T + q_ot @ p_ot.T
    assert torch.allclose(rep.score(q, p), expected, atol=1e-6, rtol=0)
    assert (rep.sparsified_ot(rep.split(p)[1]) != 0).sum(dim=1).tolist() == [5, 5]


def test_one_part_variants_and_the_unreduced_cls(encoder):
    tower = MaskedLMTower(encoder)
    hidden = tower(ORIGINAL, ATTENTION)
    full = DupMAERepresentation(32, "cls:full")
    assert full.reduction is None and not full.needs_mlm_head and not full.state_dict()
    assert torch.equal(full.encode(hidden, ATTENTION), hidden[:, 0])
    ot_only = DupMAERepresentation(32, "ot:7,act:relu")
    ot = ot_only.encode(hidden, ATTENTION, ORIGINAL, tower)
    assert ot.shape == (2, 30522) and (ot >= 0).all()
    assert torch.allclose(ot_only.score(ot, ot), ot @ ot_only.sparsified_ot(ot).T)


def test_dual_encoder_save_load_restores_spec_and_reduction(tiny_mlm_dir, tmp_path):
    rep = DupMAERepresentation(32, "cls:16,ot:8", seed=3)
    model = DualEncoder.from_pretrained(tiny_mlm_dir, representation=rep)
    assert model.query_tower.kind == "mlm"
    with torch.no_grad():
        rep.reduction.weight.add_(0.5)              # as if fine-tuned: the saved weights must be these
    model.save(tmp_path / "m")
    loaded = DualEncoder.load(tmp_path / "m")
    assert isinstance(loaded.representation, DupMAERepresentation) and str(loaded.representation.spec) == "cls:16,ot:8"
    assert torch.equal(loaded.representation.reduction.weight, rep.reduction.weight)
    ids, mask = ORIGINAL, ATTENTION
    model.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.allclose(model.encode("passage", ids, mask), loaded.encode("passage", ids, mask))


# ------------------------------------------------------------------------------------------------ search
def _assert_exact(scores: np.ndarray, rows: np.ndarray, reference: np.ndarray, k: int, tol: float = 1e-4) -> None:
    """``rows`` is the brute-force top-k of ``reference`` (float64) up to swaps among scores within ``tol``."""
    for q in range(reference.shape[0]):
        kth = np.sort(reference[q])[::-1][k - 1]
        assert np.allclose(scores[q], reference[q, rows[q]], atol=tol)
        assert np.all(np.diff(scores[q]) <= tol)
        assert len(set(rows[q].tolist())) == k
        assert np.all(reference[q, rows[q]] >= kth - tol)                     # nothing better was left out


def dupmae_index(path: Path, dense: np.ndarray, indices: np.ndarray, values: np.ndarray, vocab: int) -> Path:
    """A DupMAE index directory of ``ĥ_d`` and the top-k OT pairs, written by the index writer."""
    with writing(path, "dupmae", [f"d{i}" for i in range(len(dense))], {}, {"test": 1}) as tmp:
        save_arrays(tmp, {"embeddings": dense, "ot": topk_matrix(indices, values, vocab)})
    return path


def test_two_index_search_equals_brute_force_eq12_on_random_vectors(tmp_path):
    rng = np.random.default_rng(0)
    n, dim, vocab, top, count, k = 3000, 24, 2000, 40, 25, 100
    dense = rng.standard_normal((n, dim)).astype(np.float32)
    indices = np.stack([rng.choice(vocab, top, replace=False) for _ in range(n)])
    values = np.abs(rng.standard_normal((n, top))).astype(np.float32) * 2
    query_dense = rng.standard_normal((count, dim)).astype(np.float32)
    query_ot = rng.standard_normal((count, vocab)).astype(np.float32)
    doc_ot = np.zeros((n, vocab))
    np.put_along_axis(doc_ot, indices, values, axis=1)
    reference = query_dense.astype(np.float64) @ dense.T + query_ot.astype(np.float64) @ doc_ot.T
    index = open_index(dupmae_index(tmp_path / "index", dense, indices, values, vocab))
    searcher = DupMAESearcher(index, SearchOptions())
    queries = {"embeddings": query_dense, "ot": query_ot}
    for depth in (None, k):                                  # default start (2k) and the smallest one
        scores, rows = searcher.search(queries, k, initial_depth=depth)
        _assert_exact(scores, rows, reference, k)
        assert np.array_equal(rows[:, :10], np.argsort(-reference, axis=1)[:, :10])
    sharded = backend("dupmae").open_searcher([index], SearchOptions()).search(queries, k)   # the search path's
    assert all(np.array_equal(got, expected) for got, expected in zip(sharded, searcher.search(queries, k)))
    stored = storage(index)
    assert stored["dense_bytes"] == dim * 4 and stored["ot_entries"] == top
    assert stored["sparse_bytes"] == pytest.approx(top * (4 + 2) + 4 * (n + 1) / n)       # uint16 term ids
    assert stored["paper_bytes"] == pytest.approx(dim * 4 + top * (4 + 15 / 8))


def test_uint16_storage_of_cls384_ot260_is_close_to_the_paper_and_search_is_exact(tmp_path):
    """The paper's Table 3 configuration: 1536 + 260·6 + 4 = 3100 bytes per passage (was 3620 with int32 ids)
    against 3063.5 by the paper's accounting and 3072 for cls:768; the stored index is searched exactly."""
    rng = np.random.default_rng(3)
    n, vocab = 200, 30522
    indices = np.stack([rng.choice(vocab, 260, replace=False) for _ in range(n)])
    dense, values = rng.standard_normal((n, 384)).astype(np.float32), rng.uniform(0.1, 3, (n, 260)).astype(np.float32)
    index = open_index(dupmae_index(tmp_path / "index", dense, indices, values, vocab))
    stored = storage(index)
    assert np.load(tmp_path / "index" / "ot.indices.npy").dtype == np.uint16
    assert stored["total_bytes"] == pytest.approx(384 * 4 + 260 * 6 + 4 * (n + 1) / n)
    assert abs(stored["total_bytes"] - 3072) / 3072 < 0.01 and stored["paper_bytes"] == pytest.approx(3063.5)
    query_dense, query_ot = rng.standard_normal((5, 384)).astype(np.float32), rng.standard_normal((5, vocab))
    doc_ot = np.zeros((n, vocab))
    np.put_along_axis(doc_ot, indices, values, axis=1)
    reference = query_dense.astype(np.float64) @ dense.T + query_ot @ doc_ot.T
    scores, rows = DupMAESearcher(index, SearchOptions()).search({"embeddings": query_dense, "ot": query_ot}, 20)
    _assert_exact(scores, rows, reference, 20)


def test_threshold_search_widens_until_the_bound_certifies_the_answer(tmp_path):
    """Document 0 is 11th in both lists but first in total: a depth-2 union misses it, the bound must not."""
    n = 21
    dense = np.zeros((n, 1), np.float32)
    sparse = np.zeros((n, 1), np.float32)
    dense[1:11, 0] = 1.0 + np.arange(10) / 100
    sparse[11:21, 0] = 1.0 + np.arange(10) / 100
    dense[0, 0] = sparse[0, 0] = 0.95
    index = open_index(dupmae_index(tmp_path / "index", dense, np.zeros((n, 1), np.int64), sparse, 1))
    scores, rows = DupMAESearcher(index, SearchOptions()).search(
        {"embeddings": np.ones((1, 1), np.float32), "ot": np.ones((1, 1), np.float32)}, 1, initial_depth=2)
    assert rows.tolist() == [[0]] and np.isclose(scores[0, 0], 1.9)


@pytest.fixture(scope="module")
def tiny_collection(tmp_path_factory) -> Path:
    return write_collection(tmp_path_factory.mktemp("dupmae_data") / "tiny")


@pytest.fixture(scope="module")
def dupmae_pretrained(tiny_mlm_dir, tiny_collection, tmp_path_factory) -> Path:
    """``pretrieve pretrain --method dupmae`` through the CLI (3 steps)."""
    from typer.testing import CliRunner

    from pretrieve.cli import app

    out = tmp_path_factory.mktemp("dupmae_pretrain")
    result = CliRunner().invoke(app, ["pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(tiny_collection),
                                      "--out", str(out), "--method", "dupmae", "--steps", "3", "--batch-size", "4",
                                      "--max-len", "32", "--warmup-ratio", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "final" / "method.json").read_text())["name"] == "dupmae"
    logs = [json.loads(line) for line in (out / "logs.jsonl").read_text().splitlines()]
    assert all(np.isfinite(entry["loss/ot_bow"]) for entry in logs)
    return out / "final"


@pytest.fixture(scope="module")
def dupmae_finetuned(dupmae_pretrained, tiny_collection, tmp_path_factory) -> Path:
    """``pretrieve finetune`` with the DupMAE representation through the CLI (3 steps)."""
    from typer.testing import CliRunner

    from pretrieve.cli import app

    tmp_path = tmp_path_factory.mktemp("dupmae_ft")
    config = tmp_path / "ft.yaml"
    config.write_text(yaml.safe_dump({"representation": "dupmae:cls:16,ot:8", "lr": 1e-3}))
    out = tmp_path / "ft"
    result = CliRunner().invoke(app, ["finetune", "--config", str(config), "--model", str(dupmae_pretrained),
                                      "--data", str(tiny_collection), "--out", str(out), "--steps", "3",
                                      "--batch-size", "4", "--num-negatives", "2", "--passage-max-len", "32",
                                      "--query-max-len", "16", "--bm25-depth", "10"])
    assert result.exit_code == 0, result.output
    return out / "final"


def test_finetuned_model_is_searched_exactly_through_the_one_search_path(dupmae_finetuned, tiny_collection,
                                                                         tmp_path):
    from pretrieve.data.collection import BeirCollection

    final = dupmae_finetuned
    assert retriever_kind(final) == "dupmae" and (final / "representation.safetensors").exists()

    collection = BeirCollection(tiny_collection)
    corpus, queries = collection.load_corpus(), collection.load_queries("train")
    retriever = load_retriever(final, device="cpu", precision="fp32")
    run = search(retriever, queries, corpus, k=len(corpus), cache_dir=tmp_path / "cache", show_progress=False)
    assert json.loads((tmp_path / "cache" / "shard-0-of-1" / "meta.json").read_text())["kind"] == "dupmae"

    model, tokenizer = retriever.model, retriever.passage.tokenizer
    passage_len, query_len = retriever.passage.max_length, retriever.query.max_length
    assert (passage_len, query_len) == (32, 16)
    texts = corpus.full_texts()
    with torch.no_grad():
        def reps(items, side, length):
            batch = tokenizer(items, padding=True, truncation=True, max_length=length, return_tensors="pt")
            return model.encode(side, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        query_ids = list(queries)
        reference = model.score(reps([queries[q] for q in query_ids], "query", 16),
                                reps(texts, "passage", 32)).double().numpy()
    got_rows = np.array([[corpus.row(d) for d in sorted(run[q], key=lambda d: -run[q][d])] for q in query_ids])
    got_scores = np.array([sorted(run[q].values(), reverse=True) for q in query_ids])
    _assert_exact(got_scores, got_rows, reference, len(corpus))
    # the threshold algorithm (not brute force) on the real model's vectors: shallow start, top 5
    index = open_index(tmp_path / "cache" / "shard-0-of-1")
    encoded = encode_all(retriever.query, [queries[q] for q in query_ids])
    scores, rows = DupMAESearcher(index, SearchOptions()).search(encoded, 5, initial_depth=5)
    _assert_exact(scores, rows, reference, 5)
    stored = storage(index)                        # cls:16 floats + 8 OT entries with uint16 term ids
    assert stored["dense_bytes"] == 16 * 4 and stored["ot_entries"] <= 8
    assert stored["sparse_bytes"] == pytest.approx(stored["ot_entries"] * (4 + 2) + 4 * (len(corpus) + 1) / len(corpus))


def test_cli_dense_gives_the_mining_run_of_a_dupmae_model(dupmae_finetuned, tiny_collection, tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app
    from pretrieve.data.collection import BeirCollection
    from pretrieve.data.trec import read_run
    from pretrieve.errors import ConfigError

    collection = BeirCollection(tiny_collection)
    corpus, queries = collection.load_corpus(), collection.load_queries("train")
    expected = search(load_retriever(dupmae_finetuned, device="cpu"), queries, corpus, k=25, show_progress=False)
    out = tmp_path / "run.trec"
    runner = CliRunner()
    result = runner.invoke(app, ["dense", "--model", str(dupmae_finetuned), "--data", str(tiny_collection),
                                 "--split", "train", "--out", str(out), "--k", "25", "--device", "cpu",
                                 "--cache", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "cache" / "shard-0-of-1" / "meta.json").read_text())["kind"] == "dupmae"
    got = read_run(out)
    assert set(got) == set(expected) == set(queries)
    for qid in expected:
        assert sorted(got[qid], key=lambda d: -got[qid][d]) == sorted(expected[qid], key=lambda d: -expected[qid][d])
        assert all(got[qid][doc] == pytest.approx(expected[qid][doc], abs=1e-6) for doc in expected[qid])
    refused = runner.invoke(app, ["dense", "--model", str(dupmae_finetuned), "--data", str(tiny_collection),
                                  "--out", str(tmp_path / "x.trec"), "--mode", "sparse"])
    assert refused.exit_code != 0 and isinstance(refused.exception, ConfigError)


def test_recipe_pretrains_finetunes_and_evaluates_with_the_dupmae_representation(tiny_mlm_dir, tiny_collection,
                                                                                tmp_path):
    from pretrieve.recipe import run_recipe

    fast = {"max_steps": 2, "batch_size": 4, "warmup_ratio": 0.0, "save_every": 0}
    recipe = {"name": "dupmae", "out": str(tmp_path / "out"), "model": str(tiny_mlm_dir),
              "data": str(tiny_collection), "seed": 3,
              "finetune": {**fast, "num_negatives": 2, "query_max_len": 16, "passage_max_len": 32,
                           "bm25_depth": 10, "representation": "dupmae:cls:8,ot:6"},
              "stages": [{"pretrain": {**fast, "method": "dupmae", "max_len": 32}}, {"finetune": {"stage": 1}},
                         {"evaluate": {"split": "test", "depth": 20}}]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    rows = run_recipe(path, show_progress=False)["rows"]
    assert [row["retriever"] for row in rows] == ["finetune-s1"] and 0.0 <= rows[0]["nDCG@10"] <= 1.0
    saved = json.loads((tmp_path / "out" / "finetune-s1" / "final" / "dual_encoder.json").read_text())
    assert saved["representation"]["spec"] == "cls:8,ot:6"


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_the_representation_runs_on_any_checkpoint_with_an_mlm_head(family, tokenizer, tmp_path):
    """No DupMAE pre-training needed: a plain masked-LM checkpoint (BERT, or DistilBERT with its own head names)
    gives eq. 10's reduced [CLS] of its hidden states and eq. 7's μ from its *own* MLM head."""
    from transformers import AutoModelForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

    from pretrieve.modeling.representations import from_spec

    torch.manual_seed(0)
    model = (BertForMaskedLM(tiny_bert_config()) if family == "bert" else DistilBertForMaskedLM(
        DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=64)))
    model.save_pretrained(tmp_path / family)
    tokenizer.save_pretrained(tmp_path / family)
    representation = from_spec("dupmae:cls:16,ot:8", str(tmp_path / family))
    assert isinstance(representation, DupMAERepresentation) and representation.needs_mlm_head
    dual = DualEncoder.from_pretrained(tmp_path / family, representation=representation).eval()
    batch = tokenizer(["the cat sat on the mat", "dogs"], padding=True, return_tensors="pt")
    with torch.no_grad():
        rows = dual.encode("passage", batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        dense, ot = representation.split(rows)
        reference = AutoModelForMaskedLM.from_pretrained(tmp_path / family).eval()
        inputs = {key: value for key, value in batch.items() if key != "token_type_ids" or family == "bert"}
        out = reference(**inputs, output_hidden_states=True)
    ordinary = batch["attention_mask"].bool().clone()
    ordinary[:, 0] = False                                # every attended position but [CLS]
    expected_ot = out.logits.masked_fill(~ordinary.unsqueeze(-1), float("-inf")).max(dim=1).values
    assert torch.allclose(ot, expected_ot, atol=1e-5)
    assert torch.allclose(dense, representation.reduction(out.hidden_states[-1][:, 0]), atol=1e-5)
    query = dual.encode("query", batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    by_hand = dense @ dense.T + query[:, 16:] @ representation.sparsified_ot(ot).T     # eq. 12
    assert torch.allclose(dual.score(query, rows), by_hand, atol=1e-4)


def test_a_plain_mlm_checkpoint_fine_tunes_and_searches_with_the_dupmae_representation(tiny_mlm_dir, tiny_collection,
                                                                                       tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app
    from pretrieve.data.collection import BeirCollection

    config = tmp_path / "ft.yaml"
    config.write_text(yaml.safe_dump({"representation": "dupmae:cls:16,ot:8", "lr": 1e-3}))
    result = CliRunner().invoke(app, ["finetune", "--config", str(config), "--model", str(tiny_mlm_dir),
                                      "--data", str(tiny_collection), "--out", str(tmp_path / "ft"), "--steps", "2",
                                      "--batch-size", "4", "--num-negatives", "2", "--passage-max-len", "32",
                                      "--query-max-len", "16", "--bm25-depth", "10"])
    assert result.exit_code == 0, result.output
    final = tmp_path / "ft" / "final"
    assert retriever_kind(final) == "dupmae"
    collection = BeirCollection(tiny_collection)
    corpus, queries = collection.load_corpus(), collection.load_queries("train")
    run = search(load_retriever(final, device="cpu", precision="fp32"), queries, corpus, k=5, show_progress=False)
    assert set(run) == set(queries) and all(len(docs) == 5 for docs in run.values())
    assert all(np.isfinite(score) for docs in run.values() for score in docs.values())
