"""Encoding throughput: pretrieve's batch encoder at each precision vs sentence-transformers fp32.

All variants run in one process on the same texts, batch size and maximum length. Each is warmed up on one
batch, then the variants are timed **interleaved** — round 1 runs every variant once, round 2 again, … — so a
change of load on a shared machine hits all of them alike; the median passages/second over ``repeats`` rounds
is reported, with the ratio to sentence-transformers and to pretrieve fp32 — both as the ratio of the medians and as
the median of the per-round ratios (``*_paired``: each ratio compares two runs made seconds apart) — and the same
on the process's **CPU time** (``cpu_*``, ``*_cpu``): on a shared machine a run with one torch thread waits for the
core now and then, which wall-clock time counts and CPU time does not (the tokenizer thread's work is counted
for every variant alike). The vectors of every variant are
compared with sentence-transformers' fp32 vectors (max |Δ| and the smallest cosine), so a speed-up can never
hide a change of output. ``auto`` is the precision :func:`pretrieve.precision.resolve_precision` picks
on this machine (reported as ``auto→bf16`` or ``auto→fp32``).

``device="cuda"`` runs every variant, sentence-transformers included, on the GPU: each timed run ends with a
``torch.cuda.synchronize``, and each variant's peak ``torch.cuda.max_memory_allocated`` over its runs is reported
(``peak_memory_mib``); ``int8`` (dynamic quantisation) is CPU-only. :func:`random_st_checkpoint` writes a
random-init sentence-transformers checkpoint of a BERT shape (``L12-H768`` = bert-base), so the throughput of a
shape can be measured without its weights (speed does not depend on them).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from transformers import BertModel

from pretrieve.bench.report import device_name, peak_memory_mib, reset_peak_memory, synchronize
from pretrieve.retrieval.batches import encode_all
from pretrieve.retrieval.load import load_retriever


def encoding_throughput(model_path: str | Path, texts: Sequence[str], batch_size: int = 64,
                        max_length: int | None = 256, repeats: int = 3,
                        precisions: Sequence[str] = ("fp32", "auto", "bf16", "int8"),
                        include_sentence_transformers: bool = True, device: str = "cpu") -> dict[str, Any]:
    """Passages/second (median of ``repeats`` interleaved rounds) of each variant, ratios and agreement.

    Returns ``{"passages", "batch_size", "max_length", "threads", "repeats", "variants": {name: {"median_s",
    "passages_per_s", "runs_s", "vs_st", "vs_fp32", "max_abs_diff_vs_st", "min_cosine_vs_st"}}}``.
    """
    texts = list(texts)
    variants: dict[str, Callable[[], np.ndarray]] = {}
    warmups: dict[str, Callable[[], Any]] = {}
    resolved_auto = None
    for precision in dict.fromkeys(precisions):
        retriever = load_retriever(model_path, device=device, precision=precision, max_length=max_length)
        name = f"pretrieve_{precision}"
        if precision == "auto":
            resolved_auto = retriever.precision
            name = f"pretrieve_auto({retriever.precision})"
        side = retriever.passage
        variants[name] = (lambda side=side: encode_all(side, texts, batch_size)["embeddings"])
        warmups[name] = (lambda side=side: encode_all(side, texts[:batch_size], batch_size))
    st_model = _sentence_transformer(model_path, max_length, device) if include_sentence_transformers else None
    if st_model is not None:
        st_name = "sentence_transformers_fp32"
        variants[st_name] = lambda: st_model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                                    show_progress_bar=False)
        warmups[st_name] = lambda: st_model.encode(texts[:batch_size], batch_size=batch_size,
                                                   show_progress_bar=False)
    for warm in warmups.values():
        warm()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    peaks: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, run in variants.items():
            synchronize(device)
            reset_peak_memory(device)
            began, began_cpu = time.perf_counter(), time.process_time()
            outputs[name] = run()
            synchronize(device)
            seconds[name].append(time.perf_counter() - began)
            cpu[name].append(time.process_time() - began_cpu)
            peak = peak_memory_mib(device)
            if peak is not None:
                peaks[name].append(peak)
    results: dict[str, Any] = {"model": str(model_path), "passages": len(texts), "batch_size": batch_size,
                               "max_length": max_length, "repeats": repeats, "threads": torch.get_num_threads(),
                               "auto": resolved_auto, "device": device, "device_name": device_name(device),
                               "variants": {}}
    reference = outputs.get("sentence_transformers_fp32")
    for name, runs in seconds.items():
        median = statistics.median(runs)
        entry = {"median_s": round(median, 3), "passages_per_s": round(len(texts) / median, 2),
                 "runs_s": [round(s, 3) for s in runs], "cpu_median_s": round(statistics.median(cpu[name]), 3),
                 "cpu_runs_s": [round(s, 3) for s in cpu[name]]}
        if peaks[name]:
            entry["peak_memory_mib"] = round(max(peaks[name]), 1)
        if reference is not None:
            entry["max_abs_diff_vs_st"] = float(np.abs(outputs[name] - reference).max())
            entry["min_cosine_vs_st"] = float(_cosines(outputs[name], reference).min())
        results["variants"][name] = entry
    for base, key in (("sentence_transformers_fp32", "vs_st"), ("pretrieve_fp32", "vs_fp32")):
        if base in results["variants"]:
            for name, entry in results["variants"].items():
                entry[key] = round(results["variants"][base]["median_s"] / entry["median_s"], 3)
                entry[f"{key}_paired"] = round(statistics.median(
                    b / s for b, s in zip(seconds[base], seconds[name])), 3)
                entry[f"{key}_cpu"] = round(results["variants"][base]["cpu_median_s"] / entry["cpu_median_s"], 3)
    return results


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def _sentence_transformer(model_path: str | Path, max_length: int | None, device: str = "cpu"):
    try:
        from sentence_transformers import SentenceTransformer  # lazy: sentence_transformers
    except ImportError:
        return None
    if not (Path(model_path) / "modules.json").exists():
        return None
    model = SentenceTransformer(str(model_path), device=device)
    if max_length is not None:
        model.max_seq_length = max_length
    return model


def random_st_checkpoint(config, tokenizer: Any, out: str | Path, max_seq_length: int = 512) -> Path:
    """A sentence-transformers checkpoint at ``out``: a random-init ``BertModel`` of ``config`` (seed 0), the
    ``tokenizer``, mean pooling and normalisation, written by hand (``modules.json`` and the module folders) so that
    it loads in every sentence-transformers version pretrieve reads."""
    out = Path(out)
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                               "do_lower_case": False}))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": int(config.hidden_size), "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return out
