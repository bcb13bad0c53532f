"""Benchmarks run end to end on tiny shapes and return well-formed results (no timing assertions)."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_bert_config
from pretrieve.bench.pretrain_speed import (DEFAULT_PRESETS, FLOOR, REFERENCE, PretrainBenchResult,
                                            PretrainBenchSettings, _bars, _ratios, bench_pretrain, load_texts,
                                            parse_shape, result_markdown, synthetic_texts)
from pretrieve.bench.report import markdown_table, write_report
from pretrieve.errors import ConfigError, InputError


def test_bench_pretrain_all_presets_tiny(tokenizer):
    texts = synthetic_texts(tokenizer, 6, words_per_text=40, seed=3)
    settings = PretrainBenchSettings(batch_size=3, max_len=24, steps=2, warmup=1)
    result = bench_pretrain(tiny_bert_config(), tokenizer, texts, settings)
    assert list(result.rows) == [*DEFAULT_PRESETS, REFERENCE, FLOOR]
    for name, row in result.rows.items():
        assert row["step_s"] > 0 and row["collate_s"] > 0 and row["samples_per_s"] > 0
        assert row["cpu_step_s"] > 0 and row["cpu_collate_s"] >= 0
        assert row["step_s"] >= row["forward_s"] and row["encoder_forward_s"] > 0
        assert len(result.samples[name]["step_s"]) == 2
    assert set(result.rows["retromae"]["objective_forward_s"]) == {"mlm", "enhanced"}
    assert "enhanced_mask" in result.rows["retromae"]["features"]
    assert result.rows[REFERENCE]["head_loss_forward_s"] > 0
    ratios = result.ratios
    assert ratios["throughput_vs_mlm"]["mlm"] == pytest.approx(1.0)
    assert set(ratios["enhanced_collate_vs_random"]) == {"retromae"}
    assert ratios["mlm_step_speedup_vs_hf"] > 0 and ratios["hf_step_vs_encoder_only"] > 0
    assert set(ratios["cpu"]["throughput_vs_mlm"]) == set(DEFAULT_PRESETS)
    assert FLOOR not in ratios["throughput_vs_mlm"] and REFERENCE not in ratios["collate_vs_mlm"]
    assert [bar["threshold"] for bar in result.bars] == [2.0, 0.95, 2.0]
    assert result.bars[1]["met"] is None        # the bow bar applies from L6-H384 on
    assert all(isinstance(bar["met"], bool) for bar in (result.bars[0], result.bars[2]))
    assert all(bar["value_cpu"] is not None for bar in result.bars)
    markdown = result_markdown(result)
    assert all(f"| {name} |" in markdown for name in result.rows)
    saved = json.loads(json.dumps(result.to_dict()))      # serialisable as is
    again = PretrainBenchResult.from_dict(saved)
    assert again.ratios == result.ratios and again.bars == result.bars   # JSON floats round-trip exactly


def test_bars_judged_on_cpu_time_with_one_thread():
    rows = {"mlm": {"step_s": 1.0, "cpu_step_s": 1.0, "collate_s": 1.0, "cpu_collate_s": 1.0, "features": []},
            "bow": {"step_s": 2.0, "cpu_step_s": 1.02, "collate_s": 1.1, "cpu_collate_s": 1.1, "features": []},
            "retromae": {"step_s": 3.0, "cpu_step_s": 2.0, "collate_s": 2.5, "cpu_collate_s": 1.5,
                         "features": ["enhanced_mask"]},
            REFERENCE: {"step_s": 3.0, "cpu_step_s": 1.8, "collate_s": 4.0, "cpu_collate_s": 4.0, "features": []},
            FLOOR: {"step_s": 0.5, "cpu_step_s": 0.6, "collate_s": 1.0, "cpu_collate_s": 1.0, "features": []}}
    ratios = _ratios(rows)
    assert ratios["mlm_step_speedup_vs_hf"] == pytest.approx(3.0) and ratios["cpu"]["mlm_step_speedup_vs_hf"] == pytest.approx(1.8)
    assert ratios["mlm_head_speedup_vs_hf"] == pytest.approx(2.5 / 0.5)
    assert ratios["cpu"]["mlm_head_speedup_vs_hf"] == pytest.approx(1.2 / 0.4)
    big = parse_shape("L6-H384")
    wall = _bars(ratios, big, "wall")
    cpu = _bars(ratios, big, "cpu")
    assert [b["met"] for b in wall] == [True, False, False]      # bow 0.5×, enhanced collation 2.5×
    assert [b["met"] for b in cpu] == [False, True, True]        # CPU time: 1.8×, 0.98×, 1.5×
    assert wall[1]["value"] == cpu[1]["value"] == pytest.approx(0.5) and cpu[1]["value_cpu"] == pytest.approx(1 / 1.02)
    assert _bars(ratios, parse_shape("L2-H128"), "cpu")[1]["met"] is None   # bow bar: L6-H384 or larger


def test_bench_pretrain_without_reference_or_retromae(tokenizer):
    texts = synthetic_texts(tokenizer, 2, words_per_text=20)
    settings = PretrainBenchSettings(presets=("mlm", "bow"), batch_size=2, max_len=16, steps=1, warmup=0,
                                     reference=False, floor=False)
    result = bench_pretrain(tiny_bert_config(), tokenizer, texts, settings)
    assert list(result.rows) == ["mlm", "bow"]
    assert "mlm_step_speedup_vs_hf" not in result.ratios and "enhanced_collate_vs_random" not in result.ratios
    assert result.bars[0]["met"] is None and result.bars[2]["met"] is None
    with pytest.raises(ConfigError):
        bench_pretrain(tiny_bert_config(), tokenizer, texts, PretrainBenchSettings(presets=()))


def test_parse_shape():
    assert parse_shape("L6-H384") == parse_shape("l6-h384-a12")
    minilm = parse_shape("L6-H384")
    assert (minilm.layers, minilm.hidden, minilm.heads, minilm.ffn) == (6, 384, 12, 1536)
    assert parse_shape("L2-H128").heads == 2 and parse_shape("L12-H768").ffn == 3072
    custom = parse_shape("L3-H96-A3")
    assert (custom.heads, custom.ffn, custom.name) == (3, 384, "L3-H96")
    config = minilm.config(30522, 128)
    assert (config.num_attention_heads, config.intermediate_size, config.vocab_size) == (12, 1536, 30522)
    for bad in ("bert", "L6", "L2-H100-A3"):
        with pytest.raises(InputError):
            parse_shape(bad)


def test_texts_are_deterministic(tmp_path, tokenizer):
    assert synthetic_texts(tokenizer, 3, seed=1) == synthetic_texts(tokenizer, 3, seed=1)
    assert synthetic_texts(tokenizer, 3, seed=1) != synthetic_texts(tokenizer, 3, seed=2)
    corpus = tmp_path / "texts.txt"
    corpus.write_text("first passage\n\nsecond passage\n")
    assert load_texts(corpus, 3, tokenizer) == ["first passage", "second passage", "first passage"]
    with pytest.raises(InputError):
        load_texts(tmp_path / "missing.txt", 1, tokenizer)


def test_report_writing(tmp_path):
    table = markdown_table(["name", "value"], [["a", 1.23456], ["b", None]])
    assert table.splitlines()[1] == "|---|---:|" and "1.23" in table and "—" in table
    md, js = write_report("# title", {"x": 1}, tmp_path / "out" / "bench.md")
    assert md.read_text() == "# title\n" and json.loads(js.read_text()) == {"x": 1}


def _tiny_collection(root):
    root.mkdir()
    lines = [json.dumps({"_id": f"d{i}", "title": "", "text": f"passage number {i} about dense retrieval"})
             for i in range(6)]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_cli_bench_pretrain_and_masking(tmp_path, tiny_mlm_dir):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    runner = CliRunner()
    out = tmp_path / "pretrain.md"
    result = runner.invoke(app, ["bench", "pretrain", "--model", "L1-H32-A2", "--presets", "mlm,retromae",
                                 "--batch-size", "2", "--max-len", "16", "--steps", "1", "--warmup", "0",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| retromae |" in result.output and "| hf_reference |" in result.output
    assert "| encoder_only |" in result.output
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["results"][0]["shape"] == "L1-H32" and "environment" in data

    masking = runner.invoke(app, ["bench", "masking", "--batch-size", "4", "--max-len", "16", "--repeats", "1",
                                  "--corpus", str(_tiny_collection(tmp_path / "toy"))])
    assert masking.exit_code == 0, masking.output
    assert "| whole_word |" in masking.output and "| enhanced |" in masking.output

    checkpoint = runner.invoke(app, ["bench", "pretrain", "--model", str(tiny_mlm_dir), "--presets", "bow",
                                     "--no-reference", "--no-floor", "--batch-size", "2", "--max-len", "16",
                                     "--steps", "1", "--warmup", "0"])
    assert checkpoint.exit_code == 0, checkpoint.output
    assert "(L2-H32)" in checkpoint.output and "| bow |" in checkpoint.output

    bad = runner.invoke(app, ["bench", "pretrain", "--model", "L1-H30-A4", "--steps", "1"])
    assert bad.exit_code != 0 and isinstance(bad.exception, InputError)


def test_cli_bench_encode(tmp_path, minilm):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    result = CliRunner().invoke(app, ["bench", "encode", "--model", str(minilm), "--data",
                                      str(_tiny_collection(tmp_path / "toy")), "--num-texts", "4",
                                      "--batch-size", "4", "--max-length", "32", "--repeats", "2",
                                      "--precisions", "fp32,auto,int8", "--out", str(tmp_path / "encode.md")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "encode.json").read_text())
    auto = f"pretrieve_auto({data['auto']})"
    assert set(data["variants"]) == {"pretrieve_fp32", auto, "pretrieve_int8", "sentence_transformers_fp32"}
    variants = data["variants"]
    assert variants["pretrieve_fp32"]["max_abs_diff_vs_st"] < 1e-4 and len(variants["pretrieve_int8"]["runs_s"]) == 2
    assert variants["pretrieve_int8"]["min_cosine_vs_st"] > 0.95 and variants["sentence_transformers_fp32"]["vs_st"] == 1
    assert variants["pretrieve_fp32"]["vs_fp32"] == 1 and "min cos vs ST" in (tmp_path / "encode.md").read_text()


def test_cli_bench_ann_and_search_memory(tmp_path, minilm):
    """Approximate vs exact on a synthetic collection grown from a real one: exact search and an IVF index that
    probes every cell find the exact top-k (recall 1); the synthetic vectors are reused while current."""
    from typer.testing import CliRunner

    from pretrieve.cli import app
    from test_finetune import write_collection

    data = write_collection(tmp_path / "toy")
    runner = CliRunner()
    args = ["bench", "ann", "--work", str(tmp_path / "work"), "--model", str(minilm), "--data", str(data),
            "--size", "3000", "--factories", "IVF8,Flat@nprobe=8;IVF8,Flat@nprobe=1", "--k", "100", "--repeats", "1",
            "--train-size", "1000", "--out", str(tmp_path / "ann.md")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "ann.json").read_text())
    factories = report["factories"]
    assert report["vectors"] == 3000 and report["real_vectors"] == 40 and report["queries"] == 4
    assert factories["Flat (exact)"]["recall@100_vs_exact"] == 1.0 and factories["Flat (exact)"]["speedup"] == 1.0
    assert factories["IVF8,Flat@nprobe=8"]["recall@100_vs_exact"] == 1.0          # every cell probed: exhaustive
    assert factories["IVF8,Flat@nprobe=1"]["recall@100_vs_exact"] <= 1.0
    assert 0.0 <= factories["IVF8,Flat@nprobe=8"]["nDCG@10"] <= 1.0
    vectors = tmp_path / "work" / "synthetic-3000" / "embeddings.npy"
    stamp = vectors.stat().st_mtime_ns
    assert runner.invoke(app, args).exit_code == 0 and vectors.stat().st_mtime_ns == stamp

    result = runner.invoke(app, ["bench", "search-memory", "--work", str(tmp_path / "mem"), "--size", "3000",
                                 "--dim", "16", "--shards", "3", "--queries", "5", "--k", "10",
                                 "--out", str(tmp_path / "mem.md")])
    assert result.exit_code == 0, result.output
    memory = json.loads((tmp_path / "mem.json").read_text())
    assert memory["shards"] == 3 and memory["vectors"] == 3000 and memory["peak_rss_mib"] > 0
