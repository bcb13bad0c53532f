"""``bench pretrain`` / ``bench encode --device``: the option's plumbing, proved on the CPU.

``--device cpu`` (the default) gives the report it always gave; ``--device cuda`` where torch sees no GPU is
one ``error:`` line and exit 2; with the capability check faked, the CUDA path names the device, synchronises
every phase boundary and reports peak GPU memory. The real CUDA runs are in tests/test_gpu.py (marker ``gpu``).
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from pretrieve.errors import InputError

TINY_PRETRAIN = ["bench", "pretrain", "--model", "L1-H32-A2", "--presets", "mlm,bow", "--batch-size", "2",
                 "--max-len", "16", "--steps", "1", "--warmup", "0"]


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """``pretrieve ARGS`` in this process: (exit code, stdout, stderr)."""
    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def _numbers_masked(markdown: str) -> str:
    # the MLM-head line is there only when the mlm step measures slower than the encoder-only step, and a bar's
    # verdict compares two timings: on a tiny model run for one step on a loaded machine both are noise, like the
    # numbers (CI once saw a bar flip from **yes** to **no** between the two runs)
    lines = [line for line in markdown.splitlines()
             if not line.startswith(("- command:", "- date:", "- MLM head alone"))]
    masked = re.sub(r"\*\*(yes|no)\*\*", "VERDICT", "\n".join(lines))
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", masked)   # a tiny ratio may print as 5e-05


@pytest.mark.parametrize("command", [["bench", "pretrain", "--model", "L1-H32-A2"],
                                     ["bench", "encode", "--data", "scifact"]])
def test_cuda_without_a_gpu_is_one_error_line(command, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = _main(capsys, monkeypatch, *command, "--device", "cuda")
    assert code == 2 and out == ""
    assert err.startswith("error: --device cuda: torch sees no CUDA device") and len(err.strip().splitlines()) == 1
    code, _, err = _main(capsys, monkeypatch, *command, "--device", "tpu")
    assert code == 2 and err.startswith("error: unknown device 'tpu'") and len(err.strip().splitlines()) == 1


def test_bench_device_checks_what_torch_sees(monkeypatch):
    from pretrieve.bench.report import bench_device, device_name

    assert bench_device("cpu") == "cpu" and bench_device(" CPU ") == "cpu"
    assert device_name("cpu").startswith("cpu (")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)      # the capability check, faked
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert bench_device("cuda") == "cuda" and bench_device("cuda:0") == "cuda:0"
    with pytest.raises(InputError, match="sees 1 CUDA device"):
        bench_device("cuda:1")
    with pytest.raises(InputError, match="unknown device"):
        bench_device("cpu:0")


def test_explicit_cpu_is_the_default_report(tmp_path, capsys, monkeypatch):
    reports = {}
    for name, extra in (("default", []), ("cpu", ["--device", "cpu"])):
        code, out, err = _main(capsys, monkeypatch, *TINY_PRETRAIN, *extra, "--out", str(tmp_path / f"{name}.md"))
        assert code == 0, err
        reports[name] = (out, json.loads((tmp_path / f"{name}.json").read_text()))
    assert _numbers_masked(reports["default"][0]) == _numbers_masked(reports["cpu"][0])
    assert "peak GPU MiB" not in reports["cpu"][0] and " — on " not in reports["cpu"][0]
    settings = [data["results"][0]["settings"] for _, data in reports.values()]
    assert settings[0] == settings[1] and settings[0]["device"] == "cpu"
    assert settings[0]["bars_judged_on"] == ("cpu" if torch.get_num_threads() == 1 else "wall")


def test_a_runner_on_a_faked_gpu_synchronises_each_phase_and_reports_its_peak(monkeypatch, tokenizer):
    """The step's CUDA calls, recorded: a synchronize before every timestamp, a peak-memory window per step."""
    from conftest import tiny_bert_config
    from pretrieve.bench import pretrain_speed

    calls = []
    monkeypatch.setattr(pretrain_speed, "synchronize", lambda device: calls.append(("sync", device)))
    monkeypatch.setattr(pretrain_speed, "reset_peak_memory", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(pretrain_speed, "peak_memory_mib", lambda device: 123.0 if device == "cuda" else None)
    monkeypatch.setattr(pretrain_speed, "_to_device", lambda batch, device: calls.append(("copy", device)) or batch)
    runner = pretrain_speed.PresetRunner("mlm", tiny_bert_config(), tokenizer, max_len=16, seed=0, bf16=False)
    runner.device = runner.timer.device = "cuda"                  # the model stays on the CPU; the calls are faked
    examples = pretrain_speed.tokenize_examples(tokenizer, ["a few words of text", "and some more"], 16)
    timing = runner.step(examples, torch.Generator().manual_seed(0))
    assert timing.peak_memory_mib == 123.0
    kinds = [kind for kind, _ in calls]
    assert kinds[:2] == ["sync", "reset"] and "copy" in kinds and kinds[-1] == "sync"
    assert kinds.count("sync") >= 4 + 2                             # step start, fwd, bwd, AdamW + encoder hooks
    assert {device for _, device in calls} == {"cuda"}
    row = pretrain_speed._summarise([timing], batch_size=2)
    assert row["peak_memory_mib"] == 123.0


def test_a_cuda_report_names_the_device_and_its_peak_memory(tmp_path, capsys, monkeypatch):
    """The CLI on a faked GPU: the settings carry the device, the report names it and has the peak column."""
    from pretrieve.bench import pretrain_speed, report
    from pretrieve.cli import bench as bench_cli

    real_bench = pretrain_speed.bench_pretrain
    seen = {}

    def on_fake_gpu(config, tokenizer, texts, settings, **kwargs):
        seen["device"] = settings.device
        settings.device = "cpu"                                     # measure here, then label as the fake GPU
        result = real_bench(config, tokenizer, texts, settings, **kwargs)
        result.settings.update(device="cuda", device_name="cuda:0 (Fake GPU, 80.0 GiB, CUDA 13.0)")
        for row in result.rows.values():
            row["peak_memory_mib"] = 512.0
        return result

    for module in (report, pretrain_speed, bench_cli):              # the capability check, faked
        monkeypatch.setattr(module, "bench_device", lambda device: device)
    monkeypatch.setattr(pretrain_speed, "bench_pretrain", on_fake_gpu)
    code, out, err = _main(capsys, monkeypatch, *TINY_PRETRAIN, "--device", "cuda", "--bf16")
    assert code == 0, err
    assert seen["device"] == "cuda"
    assert "bf16 autocast" in out and "— on cuda:0 (Fake GPU, 80.0 GiB, CUDA 13.0)" in out
    assert "| peak GPU MiB |" in out and "| 512.00 |" in out


def test_bench_encode_on_a_faked_gpu(tmp_path, capsys, monkeypatch, scifact):
    """The CUDA defaults (no int8), the device line and the peak column; the CPU report has neither."""
    from pretrieve.bench import encode_speed, report
    from pretrieve.cli import bench as bench_cli

    seen = {}

    def fake_throughput(path, texts, batch_size, max_length, repeats, precisions, device):
        seen.update(precisions=list(precisions), device=device)
        variant = {"passages_per_s": 10.0, "median_s": 0.1, "cpu_median_s": 0.1, "vs_st": 1.0, "vs_fp32": 1.0,
                   "peak_memory_mib": 300.0}
        return {"passages": len(texts), "max_length": max_length, "auto": "bf16", "device": device,
                "device_name": "cuda:0 (Fake GPU)" if device != "cpu" else "cpu (x)",
                "variants": {"pretrieve_fp32": variant, "sentence_transformers_fp32": variant}}

    for module in (report, bench_cli):                               # the capability check, faked
        monkeypatch.setattr(module, "bench_device", lambda device: device)
    monkeypatch.setattr(encode_speed, "encoding_throughput", fake_throughput)
    code, out, err = _main(capsys, monkeypatch, "bench", "encode", "--data", str(scifact), "--num-texts", "2",
                           "--device", "cuda")
    assert code == 0, err
    assert seen == {"precisions": ["fp32", "auto", "bf16", "fp16"], "device": "cuda"}
    assert "- device: cuda:0 (Fake GPU)" in out and "| peak GPU MiB |" in out
    code, out, err = _main(capsys, monkeypatch, "bench", "encode", "--data", str(scifact), "--num-texts", "2")
    assert code == 0, err
    assert seen == {"precisions": ["fp32", "auto", "bf16", "int8"], "device": "cpu"}
    assert "- device:" not in out and "peak GPU MiB" not in out


def test_random_shape_checkpoint_loads_in_sentence_transformers_and_pretrieve(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from transformers import AutoTokenizer

    from pretrieve.bench.encode_speed import random_st_checkpoint
    from pretrieve.bench.pretrain_speed import parse_shape
    from pretrieve.models import resolve_model
    from pretrieve.retrieval.batches import encode_all
    from pretrieve.retrieval.load import load_retriever

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("splade-tiny"))
    path = random_st_checkpoint(parse_shape("L1-H32-A2").config(len(tokenizer), 512), tokenizer,
                                tmp_path / "L1-H32", max_seq_length=32)
    texts = ["a passage about proteins", "another one, about markets"]
    ours = encode_all(load_retriever(path, device="cpu", precision="fp32").passage, texts, 2)["embeddings"]
    theirs = st.SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)
    assert ours.shape == (2, 32)
    assert abs(ours - theirs).max() < 1e-5
