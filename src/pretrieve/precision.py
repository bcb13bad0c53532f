"""One precision vocabulary for every model pretrieve runs: encoders, cross-encoders and the training loop.

:data:`PRECISIONS` names them all: ``fp32``; ``bf16`` / ``fp16`` — ``torch.autocast`` (inference outputs are
stored as float32; training with fp16 adds a ``torch.amp.GradScaler``, :class:`MixedPrecision`); ``int8`` —
dynamic quantisation of the linear layers, for inference on the CPU only; ``auto`` — ``bf16`` where the hardware
computes it natively (a CUDA device with bf16 support; a CPU with AVX512-BF16 or AMX-BF16, read from
``/proc/cpuinfo``), else ``fp32``. On a CPU without native bf16 autocast emulates bf16 and runs several times
*slower* than fp32, which is why ``auto`` never picks it there.

:func:`resolve_precision` turns a name into the one to run on a device (refusing ``int8`` off the CPU and, with
``training=True``, at all: a quantised model has no gradients); :func:`autocast` is its context;
:func:`full_precision` upcasts half-precision values for the losses (softmax, scores at a small temperature).

TF32 (:func:`set_tf32`, the training setting ``tf32``): on CUDA devices of compute capability 8.0 and later
(A100, H100) the float32 matrix products run on the tensor cores with TF32's 10-bit mantissa
(``torch.set_float32_matmul_precision("high")``): an fp32 run then computes at several times the fp32 rate (H100
SXM: 67 TFLOP/s fp32, 495 dense TF32, 989 dense bf16). Off by default, as in torch: it changes fp32 results in the
fourth significant digit. A no-op on the CPU and on older GPUs (with a warning when asked there). Convolutions
follow cuDNN's own setting (BERT has none).
"""

from __future__ import annotations

import contextlib
import logging
from functools import lru_cache

import torch

from pretrieve.errors import ConfigError

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
#: The first CUDA compute capability with TF32 tensor cores (Ampere).
TF32_CAPABILITY = (8, 0)
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (so bf16 autocast is faster than fp32, not emulated)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return any(flag in cpu_flags() for flag in NATIVE_BF16_CPU_FLAGS)
    return False


def check_precision(precision: str, training: bool = False) -> None:
    """A :class:`ConfigError` unless ``precision`` is one of :data:`PRECISIONS` (and, for training, not ``int8``)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
    if training and precision == "int8":
        raise ConfigError("precision int8 (dynamic quantisation) is for inference only; train with auto, fp32, "
                          "bf16 or fp16")


def resolve_precision(precision: str, device: torch.device, training: bool = False) -> str:
    """``auto`` → ``bf16`` or ``fp32`` by :func:`native_bf16`; checks the others against the device (and use)."""
    check_precision(precision, training)
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "int8" and device.type != "cpu":
        raise ConfigError("precision int8 (dynamic quantisation) runs on the CPU only; use bf16 or fp16 on "
                          f"{device.type}")
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (None: no autocast, fp32 and int8)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(device: torch.device, precision: str):
    """The autocast context of a resolved ``precision`` on ``device`` (a no-op for fp32 and int8)."""
    dtype = autocast_dtype(precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=device.type, dtype=dtype)


def precision_settings(precision: str, device_type: str) -> tuple[torch.dtype | None, bool]:
    """``(autocast dtype or None, use a GradScaler)`` of a resolved training ``precision`` on ``device_type``.

    fp16 always gets a GradScaler (its gradients underflow without loss scaling); bf16 has fp32's range and
    needs none. The same settings on every device: torch supports fp16 autocast and GradScaler on the CPU too.
    """
    check_precision(precision, training=True)
    if precision == "auto":
        raise ConfigError("precision auto must be resolved for a device first (resolve_precision)")
    return autocast_dtype(precision), precision == "fp16"


class MixedPrecision:
    """Training autocast and (fp16) dynamic loss scaling for one device type, with ``torch.amp``."""

    def __init__(self, precision: str = "fp32", device_type: str = "cpu"):
        self.precision = precision
        self.device_type = device_type
        self.dtype, scaled = precision_settings(precision, device_type)
        self.scaler = torch.amp.GradScaler(device_type) if scaled else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        """``optimizer.step()``; with a GradScaler, skipped when the gradients overflowed, and the scale updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


def set_tf32(enabled: bool, device: torch.device) -> bool:
    """TF32 for float32 matrix products on ``device`` for this run (module docstring): on when ``enabled`` and the
    device is CUDA of compute capability ≥ 8.0, else torch's default (``highest``), so a setting does not leak
    from one run into the next of the same process; returns whether it is on."""
    on = False
    if enabled and device.type != "cuda":
        logger.warning("tf32: true has no effect on %s (TF32 is a CUDA tensor-core format)", device.type)
    elif enabled:
        on = tuple(torch.cuda.get_device_capability(device)) >= TF32_CAPABILITY
        if not on:
            logger.warning("tf32: true has no effect on %s (compute capability below %d.%d)",
                           torch.cuda.get_device_name(device), *TF32_CAPABILITY)
    torch.set_float32_matmul_precision("high" if on else "highest")
    return on


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 values to float32 for softmax-based losses (float32/float64 are kept)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
