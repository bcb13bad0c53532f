"""Cross-encoder reranker: listwise loss by hand, training lowers the loss, re-ranking and teacher groups."""

from __future__ import annotations

from pathlib import Path

import math
import pytest
import torch

from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import TrainingGroup, read_groups, write_groups
from pretrieve.data.trec import ranked_ids, read_run, write_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.cross_encoder import CrossEncoder
from pretrieve.train.loop import read_logs
from pretrieve.retrieval.rerank import PairScorer, rerank_run_file, teacher_groups
from pretrieve.train.reranker import PairGroupCollator, RerankerConfig, train_reranker

from test_finetune import write_collection


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_collection(tmp_path_factory.mktemp("rr") / "beir")


@pytest.fixture(scope="module")
def groups_file(data, tmp_path_factory) -> Path:
    from pretrieve.retrieval.runs import bm25_negatives

    return bm25_negatives(data, "train", tmp_path_factory.mktemp("rrg") / "bm25.jsonl", depth=10)


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, data, groups_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reranker")
    config = RerankerConfig(model=str(tiny_bert_dir), data=str(data), groups=str(groups_file), out=str(out),
                            num_negatives=3, max_len=48, batch_size=4, lr=1e-2, max_steps=12, warmup_ratio=0.0,
                            schedule="constant",
                            log_every=1, save_every=0, show_progress=False)
    return train_reranker(config)


def test_listwise_loss_equals_hand_computation(tiny_bert_dir, tokenizer, data):
    corpus = BeirCollection(data).load_corpus()
    groups = [TrainingGroup("q0", "protein folding?", ["d0"], ["d20", "d21", "d22"]),
              TrainingGroup("q1", "solar energy?", ["d1"], ["d23", "d24", "d25", "d26"])]
    batch = PairGroupCollator(tokenizer, corpus, num_negatives=3, max_len=48)(groups, torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape[0] == 8 and int(batch["group_size"]) == 4
    first = tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True)
    assert first.startswith("protein folding? protein folding")  # [CLS] query [SEP] positive (title + text)
    assert (batch["token_type_ids"][0] == 1).any()  # the passage segment
    model = CrossEncoder.from_pretrained(tiny_bert_dir).eval()
    loss, logs = model(batch)
    with torch.no_grad():
        scores = torch.stack([model.model(input_ids=batch["input_ids"][i:i + 1],
                                          attention_mask=batch["attention_mask"][i:i + 1],
                                          token_type_ids=batch["token_type_ids"][i:i + 1]).logits[0, 0]
                              for i in range(8)]).view(2, 4)
    expected = -torch.log_softmax(scores, dim=1)[:, 0].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-5)
    assert logs["accuracy"].item() == pytest.approx((scores.argmax(1) == 0).float().mean().item())


def test_training_lowers_the_loss_and_exports(trained):
    logs = read_logs(trained.parent)
    first = sum(row["loss"] for row in logs[:3]) / 3
    last = sum(row["loss"] for row in logs[-3:]) / 3
    assert last < 0.5 * first, (first, last)  # a random tiny model: lr 1e-2 learns in ~10 steps
    assert (trained / "config.json").exists() and (trained / "reranker_config.json").exists()
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(trained).config.num_labels == 1


def test_scoring_writes_a_run_reranked_by_the_model(trained, data, tmp_path):
    run = {f"t{i}": {f"d{j}": float(40 - j) for j in range(0, 40, 3)} for i in range(4)}
    write_run(run, tmp_path / "first.trec")
    out = rerank_run_file(trained, data, "test", tmp_path / "first.trec", tmp_path / "reranked.trec", depth=6,
                          show_progress=False, device="cpu")
    reranked = read_run(out)
    scorer = PairScorer(trained, device="cpu")
    corpus = BeirCollection(data).load_corpus()
    queries = BeirCollection(data).load_queries("test")
    for qid, docs in run.items():
        top = ranked_ids(run, qid)[:6]
        assert set(reranked[qid]) == set(top)  # depth respected, the rest dropped
        scores = scorer.score([queries[qid]] * 6, [corpus.full_text(corpus.row(d)) for d in top], show_progress=False)
        expected = [top[i] for i in sorted(range(6), key=lambda i: -scores[i])]
        assert ranked_ids(reranked, qid) == expected
        assert [reranked[qid][d] for d in top] == pytest.approx(scores.tolist(), abs=1e-5)
    mtime = out.stat().st_mtime_ns
    rerank_run_file(trained, data, "test", tmp_path / "first.trec", out, depth=6, show_progress=False, device="cpu")
    assert out.stat().st_mtime_ns == mtime  # up to date: skipped


def test_teacher_groups_score_positives_and_negatives(trained, data, groups_file, tmp_path, tiny_bert_dir):
    out = teacher_groups(trained, data, groups_file, tmp_path / "teacher.jsonl", max_negatives=4,
                         show_progress=False, device="cpu")
    mined, scored = read_groups(groups_file), read_groups(out)
    assert [g.query_id for g in scored] == [g.query_id for g in mined]
    scorer = PairScorer(trained, device="cpu")
    corpus = BeirCollection(data).load_corpus()
    for before, after in zip(mined, scored):
        assert after.positives == before.positives and after.negatives == before.negatives[:4]
        assert after.has_scores
        ids = after.positives + after.negatives
        expected = scorer.score([after.query] * len(ids), [corpus.full_text(corpus.row(d)) for d in ids],
                                show_progress=False)
        assert after.positive_scores + after.negative_scores == pytest.approx(expected.tolist(), abs=1e-5)
    # the stage-3 retriever trains on them
    from pretrieve.train.finetuner import FinetuneConfig, finetune

    config = FinetuneConfig(model=str(tiny_bert_dir), data=str(data), out=str(tmp_path / "s3"), stage=3,
                            groups=str(out), batch_size=4, num_negatives=3, max_steps=2, log_every=1, save_every=0,
                            show_progress=False, passage_max_len=32)
    finetune(config)
    assert all("loss/kl" in row for row in read_logs(tmp_path / "s3"))


def test_bad_reranker_inputs(tiny_bert_dir, data, tmp_path):
    with pytest.raises(ConfigError, match="--groups"):
        train_reranker(RerankerConfig(model=str(tiny_bert_dir), data=str(data), out=str(tmp_path / "x")))
    with pytest.raises(ConfigError, match="num_negatives"):
        train_reranker(RerankerConfig(model=str(tiny_bert_dir), data=str(data), groups="g", out="o", num_negatives=0))
    bad = tmp_path / "bad.jsonl"
    write_groups([TrainingGroup("q0", "x", ["d0"], ["zzz"])], bad)
    with pytest.raises(InputError, match="unknown document id 'zzz'"):
        train_reranker(RerankerConfig(model=str(tiny_bert_dir), data=str(data), groups=str(bad),
                                      out=str(tmp_path / "y"), show_progress=False))


def test_reranker_cli(trained, data, groups_file, tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    runner = CliRunner()
    write_run({"t0": {"d0": 1.0, "d1": 2.0, "d2": 3.0}}, tmp_path / "r.trec")
    result = runner.invoke(app, ["reranker", "score", "--model", str(trained), "--data", str(data), "--run",
                                 str(tmp_path / "r.trec"), "--out", str(tmp_path / "rr.trec"), "--depth", "2",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert set(read_run(tmp_path / "rr.trec")["t0"]) == {"d2", "d1"}
    result = runner.invoke(app, ["reranker", "teacher", "--model", str(trained), "--data", str(data), "--groups",
                                 str(groups_file), "--out", str(tmp_path / "t.jsonl"), "--max-negatives", "2",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert all(len(g.negative_scores) <= 2 for g in read_groups(tmp_path / "t.jsonl"))


def test_a_reranker_left_at_chance_level_is_reported(tmp_path, caplog):
    from pretrieve.train.reranker import warn_if_not_learning

    chance = math.log(8)
    with caplog.at_level("WARNING"):
        assert warn_if_not_learning([{"loss": 2.5}, {"loss": chance - 0.01}], 8, tmp_path)
    assert "chance level" in caplog.text and str(tmp_path) in caplog.text
    assert not warn_if_not_learning([{"loss": 2.5}, {"loss": 0.9 * chance}], 8, tmp_path)
    assert not warn_if_not_learning([], 8, tmp_path)


# ------------------------------------------------------------------------------------------- streaming
def test_teacher_scores_do_not_depend_on_how_pairs_are_chunked_and_batched(trained, data, groups_file, tmp_path,
                                                                          monkeypatch):
    import pretrieve.retrieval.rerank as reranker

    whole = read_groups(teacher_groups(trained, data, groups_file, tmp_path / "whole.jsonl", max_negatives=5,
                                       batch_size=64, show_progress=False, device="cpu"))
    monkeypatch.setattr(reranker, "CHUNK_BATCHES", 1)  # chunks of 3 pairs: groups (6 pairs each) span chunks
    pieces = read_groups(teacher_groups(trained, data, groups_file, tmp_path / "pieces.jsonl", max_negatives=5,
                                        batch_size=3, show_progress=False, device="cpu"))
    assert [g.query_id for g in pieces] == [g.query_id for g in whole]
    for a, b in zip(whole, pieces):
        assert (a.positives, a.negatives) == (b.positives, b.negatives)
        assert a.positive_scores + a.negative_scores == pytest.approx(b.positive_scores + b.negative_scores,
                                                                      abs=1e-5)


def test_rerank_streams_query_by_query_and_skips_queries_without_text(trained, data, tmp_path, monkeypatch):
    import pretrieve.retrieval.rerank as reranker

    run = {"t1": {"d1": 3.0, "d2": 2.0, "d9": 1.0}, "nope": {"d1": 1.0}, "t2": {"d3": 1.0, "d4": 0.5}}
    write_run(run, tmp_path / "first.trec")
    monkeypatch.setattr(reranker, "CHUNK_BATCHES", 1)
    out = rerank_run_file(trained, data, "test", tmp_path / "first.trec", tmp_path / "rr.trec", depth=2,
                          batch_size=1, show_progress=False, device="cpu")
    reranked = read_run(out)
    assert set(reranked) == {"t1", "t2"} and set(reranked["t1"]) == {"d1", "d2"}
    whole = rerank_run_file(trained, data, "test", tmp_path / "first.trec", tmp_path / "rr2.trec", depth=2,
                            batch_size=64, show_progress=False, device="cpu", overwrite=True)
    assert all(read_run(whole)[q] == pytest.approx(reranked[q], abs=1e-5) for q in reranked)
    (tmp_path / "split.trec").write_text("t1 Q0 d1 1 2.0 x\nt2 Q0 d3 1 1.0 x\nt1 Q0 d2 2 1.0 x\n")
    with pytest.raises(InputError, match="not contiguous"):
        rerank_run_file(trained, data, "test", tmp_path / "split.trec", tmp_path / "rr3.trec", show_progress=False,
                        device="cpu")
    assert not (tmp_path / "rr3.trec").exists()


def test_precision_auto_is_bf16_only_with_native_support(trained, monkeypatch):
    import pretrieve.precision as precision   # the one vocabulary every scorer and trainer resolves with

    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    assert precision.resolve_precision("auto", cpu) == "fp32"
    assert precision.resolve_precision("bf16", cpu) == "bf16"  # asked for: given, even if emulated
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    assert precision.resolve_precision("auto", cpu) == "bf16"
    with pytest.raises(ConfigError, match="precision"):
        precision.resolve_precision("fp8", cpu)
    fp32 = PairScorer(trained, device="cpu", precision="fp32").score(["solar energy"] * 2, ["sun power", "rocks"],
                                                                      show_progress=False)
    bf16 = PairScorer(trained, device="cpu", precision="bf16").score(["solar energy"] * 2, ["sun power", "rocks"],
                                                                      show_progress=False)
    assert bf16 == pytest.approx(fp32, abs=0.1)


def test_one_precision_vocabulary_for_scoring_and_training(trained, monkeypatch):
    """Issue 25: `reranker train` refused the `--precision auto` the README shows, and scoring refused fp16."""
    import pretrieve.precision as precision
    from pretrieve.train.settings import LoopConfig

    pairs = (["solar energy"] * 2, ["sun power", "rocks"])
    fp32 = PairScorer(trained, device="cpu", precision="fp32").score(*pairs, show_progress=False)
    for name in ("fp16", "int8"):
        assert PairScorer(trained, device="cpu", precision=name).score(*pairs, show_progress=False) == \
            pytest.approx(fp32, abs=0.1), name
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    config = LoopConfig(precision="auto")
    config.validate()
    assert config.resolved_precision(torch.device("cpu")) == "fp32"
    RerankerConfig(model="m", data="d", groups="g", out="o", precision="auto").validate()
    with pytest.raises(ConfigError, match="int8 .* inference only"):
        LoopConfig(precision="int8").validate()

