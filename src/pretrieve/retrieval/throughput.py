"""Encoding-throughput benchmark: pretrieve's ``encode_texts`` (fp32 and bf16) vs sentence-transformers.

All variants run in one process on the same texts, batch size and maximum length; each is warmed up
on one batch, then timed ``repeats`` times, and the median passages/second is reported. The
sentence-transformers variant is skipped (``None``) when the package is not installed or the model
is not a sentence-transformers checkpoint. The fp32 vectors of both are compared (max |Δ|) so a
speed-up can never hide a change of output.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from pretrieve.retrieval.encode import encode_texts
from pretrieve.retrieval.encoder import DenseEncoder


def _timed(function: Callable[[], np.ndarray], repeats: int) -> tuple[list[float], np.ndarray]:
    seconds, output = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        output = function()
        seconds.append(time.perf_counter() - began)
    return seconds, output


def encoding_throughput(model_path: str | Path, texts: Sequence[str], batch_size: int = 64,
                        max_length: int | None = 256, repeats: int = 3, include_bf16: bool = True,
                        include_sentence_transformers: bool = True) -> dict[str, Any]:
    """Passages/second (median of ``repeats``) of each variant, plus ratios and agreement.

    Returns ``{"passages": n, "batch_size", "max_length", "threads", "variants": {name: {"median_s",
    "passages_per_s", "runs_s"}}, "ratio_fp32_vs_st", "ratio_bf16_vs_st", "max_abs_diff_fp32_vs_st"}``.
    """
    texts = list(texts)
    encoder = DenseEncoder.load(model_path, max_length=max_length)
    variants: dict[str, Callable[[], np.ndarray]] = {
        "pretrieve_fp32": lambda: encode_texts(encoder, texts, batch_size=batch_size, show_progress=False),
    }
    if include_bf16:
        variants["pretrieve_bf16"] = lambda: encode_texts(encoder, texts, batch_size=batch_size, bf16=True,
                                                          show_progress=False)
    st_model = _sentence_transformer(model_path, max_length) if include_sentence_transformers else None
    if st_model is not None:
        variants["sentence_transformers_fp32"] = lambda: st_model.encode(
            texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

    results: dict[str, Any] = {"model": str(model_path), "passages": len(texts), "batch_size": batch_size,
                               "max_length": encoder.max_length, "repeats": repeats,
                               "threads": torch.get_num_threads(), "variants": {}}
    outputs: dict[str, np.ndarray] = {}
    warmup = texts[:batch_size]
    for name, run in variants.items():
        _warm_up(name, encoder, st_model, warmup, batch_size)
        seconds, outputs[name] = _timed(run, repeats)
        median = statistics.median(seconds)
        results["variants"][name] = {"median_s": round(median, 3), "passages_per_s": round(len(texts) / median, 2),
                                     "runs_s": [round(s, 3) for s in seconds]}
    rates = {name: v["passages_per_s"] for name, v in results["variants"].items()}
    if "sentence_transformers_fp32" in rates:
        st_rate = rates["sentence_transformers_fp32"]
        results["ratio_fp32_vs_st"] = round(rates["pretrieve_fp32"] / st_rate, 3)
        if "pretrieve_bf16" in rates:
            results["ratio_bf16_vs_st"] = round(rates["pretrieve_bf16"] / st_rate, 3)
        results["max_abs_diff_fp32_vs_st"] = float(np.abs(outputs["pretrieve_fp32"]
                                                          - outputs["sentence_transformers_fp32"]).max())
    if "pretrieve_bf16" in outputs:
        results["max_abs_diff_bf16_vs_fp32"] = float(np.abs(outputs["pretrieve_bf16"]
                                                            - outputs["pretrieve_fp32"]).max())
    return results


def _warm_up(name: str, encoder: DenseEncoder, st_model, texts: list[str], batch_size: int) -> None:
    if name.startswith("sentence_transformers"):
        st_model.encode(texts, batch_size=batch_size, show_progress_bar=False)
    else:
        encode_texts(encoder, texts, batch_size=batch_size, bf16=name.endswith("bf16"), show_progress=False)


def _sentence_transformer(model_path: str | Path, max_length: int | None):
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    if not (Path(model_path) / "modules.json").exists():
        return None
    model = SentenceTransformer(str(model_path), device="cpu")
    if max_length is not None:
        model.max_seq_length = max_length
    return model
