"""torch's CPU resize of uint8 images, in the same integer arithmetic on any device.

torchvision v2 resizes a uint8 tensor natively on the CPU (bilinear where the CPU has AVX2,
AVX-512 or is ARM; bicubic always) and through float32 elsewhere, a GPU included: the two differ
by a level on about one value in eight. The native kernel (ATen's ``UpSampleKernel.cpp``,
``_compute_index_ranges_int16_weights``) computes each axis's weights in float64 as Pillow
does (antialiased: the filter's support scaled; not: torch's own source index and edge folding),
scales them to int16 at the largest precision under which the axis's largest weight fits, and
runs the width pass, then the height pass, each an integer sum from half a unit, shifted down
and clamped to 0..255. Here the weights are computed the same way on the host (one axis's table
per size pair, kept) and the sums are int32 torch ops: the same values on the CPU and on a GPU.
tests/test_tensor_resize.py compares them with torchvision's CPU kernel, every value.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, List, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.registry import upload

NATIVE_MODES = ("bilinear", "bicubic")
_MOST_BITS = 22  # the native kernel's precision loop stops there


@functools.lru_cache(maxsize=None)
def cpu_resizes_natively(interpolation: str) -> bool:
    """Whether torchvision v2 resizes a uint8 image on this machine's CPU in integers (the
    workers run on this machine's CPU): its own test where it has one."""
    if interpolation not in NATIVE_MODES:
        return False
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2.functional import _geometry
    native = getattr(_geometry, "_do_native_uint8_resize_on_cpu", None)
    if native is not None:
        return bool(native(InterpolationMode(interpolation)))
    return interpolation == "bicubic" or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _linear(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _cubic(a: float) -> Callable[[float], float]:
    def weight(x: float) -> float:  # UpSample.h's cubic_convolution1 / 2, in their order of operations
        x = abs(x)
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2.0:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0
    return weight


def _antialiased_rows(n_in: int, n_out: int, taps: int, weight: Callable[[float], float]):
    """Pillow's support and centring (``_compute_indices_min_size_weights_aa``)."""
    scale = n_in / n_out
    support = taps * 0.5 * scale if scale >= 1.0 else taps * 0.5
    width = int(math.ceil(support)) * 2 + 1
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    for i in range(n_out):
        center = scale * (i + 0.5)
        first = max(int(center - support + 0.5), 0)
        size = min(max(min(int(center + support + 0.5), n_in) - first, 0), width)
        row = [weight((j + first - center + 0.5) * inverse) for j in range(size)]
        total = 0.0
        for w in row:
            total += w
        if total != 0.0:
            row = [w / total for w in row]
        yield first, row + [0.0] * (width - size)


def _folded_rows(n_in: int, n_out: int, taps: int, weight: Callable[[float], float]):
    """torch's own source index, the taps beyond either edge folded onto it
    (``_compute_indices_min_size_weights``)."""
    scale = n_in / n_out
    half = taps // 2
    for i in range(n_out):
        real = scale * (i + 0.5) - 0.5
        if taps == 2:
            real = max(real, 0.0)
        index = min(int(math.floor(np.float32(real))), n_in - 1)  # floorf: the index in float32
        lam = min(max(real - index, 0.0), 1.0)
        lowest = index - half + 1
        first = max(lowest, 0)
        size = min(max(min(index + half + 1, n_in) - first, 0), taps)
        row, k = [0.0] * taps, 0
        for j in range(taps):
            if lowest + j <= 0:
                k = 0
            elif lowest + j >= n_in - 1:
                k = size - 1
            row[k] += weight(float(j + 1 - half) - lam)
            k += 1
        yield first, row


@functools.lru_cache(maxsize=4096)
def axis_table(n_in: int, n_out: int, interpolation: str, antialias: bool) -> Tuple[np.ndarray, np.ndarray, int]:
    """One axis: each output's first input (int64 [n_out]), its int16-valued weights (int32
    [n_out, K]) and the axis's precision in bits."""
    taps = 2 if interpolation == "bilinear" else 4
    weight = _linear if taps == 2 else _cubic(-0.5 if antialias else -0.75)
    rows = list((_antialiased_rows if antialias else _folded_rows)(n_in, n_out, taps, weight))
    first = np.array([r[0] for r in rows], dtype=np.int64)
    real = np.array([r[1] for r in rows], dtype=np.float64)
    largest = float(real.max(initial=0.0))
    bits = 0
    while bits < _MOST_BITS and int(0.5 + largest * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    scaled = real * (1 << bits)
    weights = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    return first, weights, bits


def _pass(x: torch.Tensor, n_out: int, dim: int, interpolation: str, antialias: bool) -> torch.Tensor:
    """One axis of int32 images [N, C, H, W] resampled (``dim`` 3: the width, 2: the height)."""
    n_in = x.shape[dim]
    first, weights, bits = axis_table(n_in, n_out, interpolation, antialias)
    k = weights.shape[1]
    index = np.minimum(first[:, None] + np.arange(k)[None, :], n_in - 1).reshape(-1)
    taps = x.index_select(dim, upload(index, x.device))  # the axis becomes n_out * K
    w = upload(weights, x.device)
    if dim == 3:
        summed = (taps.view(*x.shape[:3], n_out, k) * w).sum(-1, dtype=torch.int32)
    else:
        summed = (taps.view(*x.shape[:2], n_out, k, x.shape[3]) * w.view(n_out, k, 1)).sum(3, dtype=torch.int32)
    return summed.add_(1 << (bits - 1)).bitwise_right_shift_(bits).clamp_(0, 255)


def resize(images: torch.Tensor, size: List[int], interpolation: str, antialias: bool) -> torch.Tensor:
    """uint8 images [N, C, H, W] to ``size`` as torchvision v2 gives them on a CPU that
    resizes uint8 natively: the width first, then the height, an axis of equal size skipped."""
    x = images.to(torch.int32)
    height, width = size
    if x.shape[3] != width:
        x = _pass(x, width, 3, interpolation, antialias)
    if x.shape[2] != height:
        x = _pass(x, height, 2, interpolation, antialias)
    return x.to(torch.uint8)
