"""Fine-tuning stages 1–3: group collation, BM25 / dense mining, loss going down, exact resume, stage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import TrainingGroup, read_groups, write_groups
from pretrieve.data.trec import ranked_ids, read_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.train import checkpoint as ckpt
from pretrieve.train import loop
from pretrieve.train.collator import GroupCollator
from pretrieve.train.finetuner import BM25_GROUPS_FILE, FinetuneConfig, finetune
from pretrieve.train.loop import read_logs

TOPICS = ["protein folding", "solar energy", "stock market", "river flooding", "coffee farming", "chess opening",
          "volcano eruption", "honey bees", "jazz music", "glacier melting", "vaccine trial", "desert climate",
          "bridge engineering", "ocean tides", "wheat harvest", "comet orbit", "forest fire", "bird migration",
          "salt mining", "wind turbine"]


def write_collection(root: Path) -> Path:
    """A tiny BEIR collection: 40 documents, 20 train queries (query i → document di), 4 test queries.

    Documents d20–d39 are distractors that share one word with two topics, so BM25 ranks them as hard negatives.
    """
    root.mkdir(parents=True, exist_ok=True)
    docs = []
    for i, topic in enumerate(TOPICS):
        docs.append({"_id": f"d{i}", "title": topic.title(),
                     "text": f"{topic} is studied in detail. the {topic} report explains the causes of {topic}."})
    for i in range(20):
        first, second = TOPICS[i].split()[0], TOPICS[(i + 7) % 20].split()[1]
        docs.append({"_id": f"d{20 + i}", "title": "",
                     "text": f"{first} and {second} appear together in this general survey of many things."})
    queries = [{"_id": f"q{i}", "text": f"what is known about {topic}?"} for i, topic in enumerate(TOPICS)]
    queries += [{"_id": f"t{i}", "text": f"report on {TOPICS[i]}"} for i in range(4)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir(exist_ok=True)
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                              "".join(f"q{i}\td{i}\t1\n" for i in range(20)))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"t{i}\td{i}\t1\n" for i in range(4)))
    return root


@pytest.fixture(scope="module")
def tiny_collection(tmp_path_factory) -> Path:
    return write_collection(tmp_path_factory.mktemp("beir") / "tiny")


def make_config(model, data, out, **overrides) -> FinetuneConfig:
    values = dict(model=str(model), data=str(data), out=str(out), batch_size=4, num_negatives=3, lr=5e-4,
                  max_steps=10, warmup_ratio=0.0, log_every=1, save_every=0, show_progress=False,
                  query_max_len=16, passage_max_len=32, bm25_depth=20)
    values.update(overrides)
    return FinetuneConfig(**values)


# ------------------------------------------------------------------------------------------- collation
def test_collator_puts_the_positive_first_and_samples_from_the_generator(tokenizer, tiny_collection):
    corpus = BeirCollection(tiny_collection).load_corpus()
    groups = [TrainingGroup("q0", "protein?", ["d0"], ["d20", "d21", "d22", "d23"], [5.0], [1.0, 2.0, 3.0, 4.0]),
              TrainingGroup("q1", "solar?", ["d1", "d2"], ["d24", "d25"], [6.0, 7.0], [0.5, 0.25])]
    collator = GroupCollator(tokenizer, corpus, num_negatives=3, query_max_len=8, passage_max_len=24,
                             teacher_scores=True)
    batch = collator(groups, torch.Generator().manual_seed(1))
    assert batch["query_input_ids"].shape[0] == 2 and batch["query_input_ids"].shape[1] <= 8
    assert batch["passage_input_ids"].shape[0] == 8 and batch["passage_input_ids"].shape[1] <= 24
    assert batch["teacher_scores"].shape == (2, 4)
    texts = tokenizer.batch_decode(batch["passage_input_ids"], skip_special_tokens=True)
    assert texts[0].startswith("protein folding")  # group 0's positive is d0, first
    assert texts[4].startswith("solar energy") or texts[4].startswith("stock market")
    # teacher scores follow the sampled documents: the positive's score first, then each negative's
    by_text = {corpus.full_text(corpus.row(d)).lower()[:40]: s for g in groups
               for d, s in zip(g.positives + g.negatives, g.positive_scores + g.negative_scores)}
    for row, text in enumerate(texts):
        assert batch["teacher_scores"].view(-1)[row].item() == by_text[text[:40]]
    # the second group has 2 negatives for 3 slots: both are used (cycled), never a positive
    assert {texts[5][:20], texts[6][:20], texts[7][:20]} <= {t[:20] for t in by_text if "appear together" in t}
    again = collator(groups, torch.Generator().manual_seed(1))
    assert all(torch.equal(batch[key], again[key]) for key in batch)
    other = collator([groups[0]] * 6, torch.Generator().manual_seed(2))
    assert other["passage_input_ids"].shape[0] == 24


# ------------------------------------------------------------------------------------------------ mining
def test_bm25_negatives_exclude_positives_keep_rank_order_and_depth(tiny_collection, tmp_path):
    from pretrieve.retrieval.runs import bm25_negatives
    from pretrieve.retrieval.mining import meta_path

    out = bm25_negatives(tiny_collection, "train", tmp_path / "bm25.jsonl", depth=6, run_out=tmp_path / "bm25.trec")
    run = read_run(tmp_path / "bm25.trec")
    groups = read_groups(out)
    assert len(groups) == 20
    for group in groups:
        top = ranked_ids(run, group.query_id)[:6]
        assert group.negatives == [d for d in top if d not in group.positives]
        assert group.positives == [f"d{group.query_id[1:]}"]
    assert json.loads(meta_path(out).read_text())["settings"]["depth"] == 6
    mtime = out.stat().st_mtime_ns
    bm25_negatives(tiny_collection, "train", out, depth=6)  # up to date: not rewritten
    assert out.stat().st_mtime_ns == mtime
    bm25_negatives(tiny_collection, "train", out, depth=4)  # other settings: recomputed
    assert all(len(g.negatives) <= 4 for g in read_groups(out))


def test_dense_mining_excludes_positives_keeps_rank_order_and_depth(tiny_bert_dir, tokenizer, tiny_collection,
                                                                    tmp_path, monkeypatch):
    from pretrieve.modeling.dual_encoder import DualEncoder
    from pretrieve.modeling.export import export_retriever
    from pretrieve.retrieval.mining import mine_negatives

    from pretrieve.retrieval import search as search_module   # runs.search_split takes scratch_index from it

    model_dir = export_retriever(DualEncoder.from_pretrained(tiny_bert_dir), tokenizer, tmp_path / "model", 48,
                                 training={"query_max_len": 16})
    scratch_parents = []
    real_scratch = search_module.scratch_index

    def recording_scratch(parent=None):
        scratch_parents.append(parent)
        return real_scratch(parent)

    monkeypatch.setattr(search_module, "scratch_index", recording_scratch)
    out = mine_negatives(model_dir, tiny_collection, "train", tmp_path / "mined.jsonl", depth=5,
                         run_out=tmp_path / "mined.trec", show_progress=False, device="cpu")
    # without a cache the corpus index is a scratch folder beside the output (not in the system's temp), removed after
    assert scratch_parents == [tmp_path] and not list(tmp_path.glob(".pretrieve-index*"))
    run = read_run(tmp_path / "mined.trec")
    groups = read_groups(out)
    assert all(len(docs) == 5 for docs in run.values())
    for group in groups:
        top = ranked_ids(run, group.query_id)
        assert group.negatives == [d for d in top if d not in group.positives]
        assert not set(group.negatives) & set(group.positives)
    from pretrieve.retrieval.mining import mine_negatives as again

    mtime = out.stat().st_mtime_ns
    again(model_dir, tiny_collection, "train", out, depth=5, show_progress=False, device="cpu")
    assert out.stat().st_mtime_ns == mtime
    # results held 3 queries at a time (within blocks of 7): the same groups, in the same order
    from pretrieve.retrieval import mining

    monkeypatch.setattr(mining, "RUN_QUERIES", 3)
    small = again(model_dir, tiny_collection, "train", tmp_path / "small.jsonl", depth=5, show_progress=False,
                  device="cpu", query_block=7, run_out=tmp_path / "small.trec")
    assert small.read_text() == out.read_text()
    assert read_run(tmp_path / "small.trec") == run


# ------------------------------------------------------------------------------------------------ stages
def test_stage1_builds_bm25_groups_and_lowers_the_loss(tiny_bert_dir, tiny_collection, tmp_path):
    out = tmp_path / "stage1"
    # mean pooling: a random tiny BERT's [CLS] vectors barely differ between texts, so [CLS] needs ~100 steps here
    final = finetune(make_config(tiny_bert_dir, tiny_collection, out, max_steps=15, lr=1e-3, pooling="mean"))
    groups = read_groups(out / BM25_GROUPS_FILE)
    assert len(groups) == 20 and all(not set(g.negatives) & set(g.positives) for g in groups)
    logs = read_logs(out)
    assert [row["step"] for row in logs] == list(range(1, 16))
    first = sum(row["loss"] for row in logs[:3]) / 3
    last = sum(row["loss"] for row in logs[-3:]) / 3
    assert last < 0.7 * first, (first, last)
    assert "loss/contrastive" in logs[0] and "accuracy" in logs[0] and "loss/kl" not in logs[0]
    info = json.loads((final / "dual_encoder.json").read_text())
    assert info["tied"] and info["representation"]["pooling"] == "mean" and info["training"]["stage"] == 1
    assert (final / "modules.json").exists() and (final / "finetune_config.json").exists()
    # a finished run is not trained again; the same --out with other settings is refused
    mtime = (final / "model.safetensors").stat().st_mtime_ns
    assert finetune(make_config(tiny_bert_dir, tiny_collection, out, max_steps=15, lr=1e-3, pooling="mean")) == final
    assert (final / "model.safetensors").stat().st_mtime_ns == mtime
    with pytest.raises(ConfigError, match="different settings.*lr"):
        finetune(make_config(tiny_bert_dir, tiny_collection, out, max_steps=15, lr=2e-3, pooling="mean"))


def test_a_finished_stage_whose_groups_file_changed_is_not_taken_as_finished(tiny_bert_dir, tiny_collection,
                                                                              tmp_path):
    from pretrieve.retrieval.runs import bm25_negatives

    groups = tmp_path / "groups.jsonl"
    bm25_negatives(tiny_collection, "train", groups, depth=10)
    config = dict(groups=str(groups), max_steps=2, lr=1e-3, pooling="mean")
    finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "out", **config))
    lines = groups.read_text().splitlines()
    groups.write_text("\n".join(lines[1:]) + "\n")   # e.g. re-scored or re-mined: same path, other content
    with pytest.raises(ConfigError, match="different inputs \\(groups changed\\)"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "out", **config))


def test_resume_after_interruption_gives_the_same_losses(tiny_bert_dir, tiny_collection, tmp_path, monkeypatch):
    groups = tmp_path / "groups.jsonl"
    from pretrieve.retrieval.runs import bm25_negatives

    bm25_negatives(tiny_collection, "train", groups, depth=10)
    finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "full", groups=str(groups), save_every=3,
                         max_steps=6))
    reference = read_logs(tmp_path / "full")

    original = loop.train_step
    calls = {"n": 0}

    def killed_after_4(*args, **kwargs):
        if calls["n"] == 4:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", killed_after_4)
    config = make_config(tiny_bert_dir, tiny_collection, tmp_path / "resumed", groups=str(groups), save_every=3,
                         max_steps=6)
    with pytest.raises(KeyboardInterrupt):
        finetune(config)
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path / "resumed")] == [3]
    monkeypatch.setattr(loop, "train_step", original)
    config.resume = True
    finetune(config)
    resumed = read_logs(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == list(range(1, 7))
    for a, b in zip(reference, resumed):
        for key in a:
            if key != "samples_per_s":
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)


def test_stage2_and_stage3_without_groups_say_which_command_makes_them(tiny_bert_dir, tiny_collection, tmp_path):
    with pytest.raises(ConfigError, match="pretrieve mine --model STAGE1_OUT/final"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "s2", stage=2))
    with pytest.raises(ConfigError, match="pretrieve reranker teacher"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "s3", stage=3))
    unscored = tmp_path / "unscored.jsonl"
    write_groups([TrainingGroup("q0", "protein?", ["d0"], ["d20", "d21"])], unscored)
    with pytest.raises(InputError, match="teacher scores"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "s3b", stage=3, groups=str(unscored)))
    with pytest.raises(InputError, match="not found"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "s2b", stage=2, groups=str(tmp_path / "no")))
    with pytest.raises(ConfigError, match="stage must be"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "s4", stage=4))


def test_unknown_document_ids_are_a_located_error(tiny_bert_dir, tiny_collection, tmp_path):
    path = tmp_path / "bad.jsonl"
    write_groups([TrainingGroup("q0", "protein?", ["d0"], ["d20"]),
                  TrainingGroup("q1", "solar?", ["d1"], ["d21", "nope"])], path)
    with pytest.raises(InputError, match=r"bad.jsonl:2: field 'negatives\[1\]': unknown document id 'nope'"):
        finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "out", stage=2, groups=str(path)))


def test_stage3_trains_on_teacher_scores_with_kl(tiny_bert_dir, tiny_collection, tmp_path):
    groups = [TrainingGroup(f"q{i}", f"what is known about {TOPICS[i]}?", [f"d{i}"],
                            [f"d{20 + (i + k) % 20}" for k in range(4)], [8.0], [4.0, 3.0, 2.0, 1.0])
              for i in range(20)]
    path = tmp_path / "teacher.jsonl"
    write_groups(groups, path)
    out = tmp_path / "stage3"
    finetune(make_config(tiny_bert_dir, tiny_collection, out, stage=3, groups=str(path), alpha=0.2, max_steps=4))
    logs = read_logs(out)
    for row in logs:
        assert row["loss"] == pytest.approx(row["loss/kl"] + 0.2 * row["loss/contrastive"], rel=1e-5)
        assert row["loss/kl"] > 0


def test_separate_towers_fine_tune_and_export_both_sides(tiny_bert_dir, tiny_collection, tmp_path):
    final = finetune(make_config(tiny_bert_dir, tiny_collection, tmp_path / "sep", tied=False, max_steps=3))
    info = json.loads((final / "dual_encoder.json").read_text())
    assert info["tied"] is False
    # one sentence-transformers model whose Router sends queries and passages to the two towers' folders
    from pretrieve.modeling.dual_encoder import TOWER_FOLDERS

    assert (final / "modules.json").exists() and (final / "router_config.json").exists()
    for folder in TOWER_FOLDERS.values():
        assert (final / folder / "config.json").exists() and (final / folder / "sentence_bert_config.json").exists()


def test_cli_help_shows_defaults_and_cli_runs_a_stage(tiny_bert_dir, tiny_collection, tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "default: (7)" in result.output and "default: (2e-05)" in result.output
    result = runner.invoke(app, ["mine", "--bm25", "--data", str(tiny_collection), "--out",
                                 str(tmp_path / "g.jsonl"), "--depth", "8"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["finetune", "--model", str(tiny_bert_dir), "--data", str(tiny_collection), "--out",
                                 str(tmp_path / "cli"), "--stage", "2", "--groups", str(tmp_path / "g.jsonl"),
                                 "--steps", "2", "--batch-size", "4", "--num-negatives", "2",
                                 "--passage-max-len", "32"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "final" / "dual_encoder.json").exists()
    config_file = tmp_path / "ft.yaml"
    config_file.write_text("stage: 2\nnum_negatvies: 3\n")
    result = runner.invoke(app, ["finetune", "--config", str(config_file), "--model", str(tiny_bert_dir)])
    assert result.exit_code != 0 and "num_negatvies" in str(result.exception)


# ------------------------------------------------------------------------------------------------ prompts
def test_the_collator_puts_each_sides_prompt_before_its_texts(tokenizer, tiny_collection):
    corpus = BeirCollection(tiny_collection).load_corpus()
    groups = [TrainingGroup("q0", "protein?", ["d0"], ["d20", "d21", "d22"])]
    collator = GroupCollator(tokenizer, corpus, num_negatives=3, query_max_len=12, passage_max_len=24,
                             query_prompt="query: ", passage_prompt="passage: ")
    batch = collator(groups, torch.Generator().manual_seed(1))
    queries = tokenizer.batch_decode(batch["query_input_ids"], skip_special_tokens=True)
    passages = tokenizer.batch_decode(batch["passage_input_ids"], skip_special_tokens=True)
    assert queries[0].startswith("query : protein"), queries
    assert all(text.startswith("passage :") for text in passages) and passages[0].startswith("passage : protein")
    plain = GroupCollator(tokenizer, corpus, num_negatives=3, query_max_len=12, passage_max_len=24)(
        groups, torch.Generator().manual_seed(1))
    assert tokenizer.batch_decode(plain["query_input_ids"], skip_special_tokens=True)[0].startswith("protein")


def test_a_checkpoints_saved_prompts_are_trained_with_and_saved_with_the_fine_tuned_model(tiny_bert_dir,
                                                                                         tiny_collection, tmp_path):
    """An E5/BGE-style checkpoint's prompts: used in training by default, saved with the model (so mining, search
    and export use them); given as '' they are dropped; a run without prompts keeps the settings it had before."""
    from test_dense import LEGACY_MEAN, make_st_checkpoint

    from pretrieve.retrieval.load import load_retriever

    checkpoint = make_st_checkpoint(tmp_path / "st", tiny_bert_dir, pooling=LEGACY_MEAN, normalize=False)
    (checkpoint / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "document": "passage: "}, "default_prompt_name": None}))
    final = finetune(make_config(checkpoint, tiny_collection, tmp_path / "prompted", max_steps=2))
    record = json.loads((final / "finetune_config.json").read_text())
    assert record["settings"]["query_prompt"] == "query: " and record["settings"]["passage_prompt"] == "passage: "
    retriever = load_retriever(final)
    assert (retriever.query.prompt, retriever.passage.prompt) == ("query: ", "passage: ")
    none = finetune(make_config(checkpoint, tiny_collection, tmp_path / "none", max_steps=2, query_prompt="",
                                passage_prompt=""))
    settings = json.loads((none / "finetune_config.json").read_text())["settings"]
    assert "query_prompt" not in settings and "passage_prompt" not in settings
    assert (load_retriever(none).query.prompt, load_retriever(none).passage.prompt) == (None, None)
