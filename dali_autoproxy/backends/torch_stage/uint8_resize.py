"""torch's CPU resize of uint8 images, in the same integer arithmetic on any device.

torchvision v2 resizes a uint8 tensor natively on the CPU (bilinear where the CPU has AVX2,
AVX-512 or is ARM; bicubic always) and through float32 elsewhere, a GPU included: the two differ
by a level on about one value in eight. The native kernel (ATen's ``UpSampleKernel.cpp``,
``_compute_index_ranges_int16_weights``) computes each axis's weights in float64 as Pillow
does (antialiased: the filter's support scaled; not: torch's own source index and edge folding),
scales them to int16 at the largest precision under which the axis's largest weight fits, and
runs the width pass, then the height pass, each an integer sum from half a unit, shifted down
and clamped to 0..255. Here the weights are computed the same way on the host (one axis's table
per size pair, kept); where Triton runs, the sums are those of the exact resize's kernel
(``fused_resize``, Pillow's form: a weight of b bits times 2 ** (22 - b), so that
(S * 2 ** (22 - b) + 2 ** 21) >> 22 is (S + 2 ** (b - 1)) >> b), elsewhere int32 torch ops: the
same values on the CPU and on a GPU. tests/test_tensor_resize.py compares them with torchvision's
CPU kernel, every value.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, List, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color, fused_resize
from dali_autoproxy.backends.torch_stage.kept_tables import Located
from dali_autoproxy.backends.torch_stage.pillow_weights import PRECISION_BITS
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


_GATHER_LIMIT = 1 << 25  # int32 taps gathered at once: a batch is resampled in chunks of samples under it


def _tables(n_in: np.ndarray, n_out: int, interpolation: str, antialias: bool, device: torch.device):
    """The batch's tables for one axis, each sample its own input size: taps' indices (int64
    [B, n_out * K], clamped to the sample's last pixel), weights (int32 [B, n_out, K], zeros
    past a sample's own K), the rounding's half unit and the shift (int32 [B]), and K."""
    tables = [axis_table(int(n), n_out, interpolation, antialias) for n in n_in]
    k = max(t[1].shape[1] for t in tables)
    index = np.empty((len(tables), n_out * k), dtype=np.int64)
    weights = np.zeros((len(tables), n_out, k), dtype=np.int32)
    bits = np.array([t[2] for t in tables], dtype=np.int32)
    for b, ((first, w, _), n) in enumerate(zip(tables, n_in)):
        weights[b, :, :w.shape[1]] = w
        index[b] = np.minimum(first[:, None] + np.arange(k)[None, :], int(n) - 1).reshape(-1)
    half = (np.int32(1) << (bits - 1)).astype(np.int32)
    return upload(index, device), upload(weights, device), upload(half, device), upload(bits, device), k


def _pass(x: torch.Tensor, n_in: np.ndarray, n_out: int, dim: int, interpolation: str,
          antialias: bool) -> torch.Tensor:
    """One axis of int32 images [B, C, H, W] resampled, each sample from its own ``n_in``
    pixels at the start of the axis (``dim`` 3: the width, 2: the height)."""
    index, weights, half, bits, k = _tables(n_in, n_out, interpolation, antialias, x.device)
    b, c, h, w = x.shape
    if dim == 3:
        taps = x.gather(3, index.view(b, 1, 1, -1).expand(b, c, h, n_out * k)).view(b, c, h, n_out, k)
        summed = (taps * weights.view(b, 1, 1, n_out, k)).sum(-1, dtype=torch.int32)
    else:
        taps = x.gather(2, index.view(b, 1, -1, 1).expand(b, c, n_out * k, w)).view(b, c, n_out, k, w)
        summed = (taps * weights.view(b, 1, n_out, k, 1)).sum(3, dtype=torch.int32)
    return summed.add_(half.view(b, 1, 1, 1)).bitwise_right_shift_(bits.view(b, 1, 1, 1)).clamp_(0, 255)


def resize(images: torch.Tensor, in_hw: np.ndarray, size: List[int], interpolation: str,
           antialias: bool) -> torch.Tensor:
    """Images holding whole numbers 0..255 ([B, C, H, W], any dtype), each sample its own
    (height, width) ``in_hw`` in the top-left corner, to one ``size``, as torchvision v2 gives
    them on a CPU that resizes uint8 natively: the width pass, then the height pass (an axis of
    the same size comes through unchanged, as torch skips it). [B, C, *size], whole numbers."""
    in_hw = np.asarray(in_hw, dtype=np.int64).reshape(-1, 2)
    if images.dtype in (torch.uint8, torch.float32) and fused_color.usable(images):
        try:
            from dali_autoproxy.backends.torch_stage import _triton_resample
            return _by_kernel(_triton_resample.resample_pass, images, in_hw, size, interpolation, antialias)
        except Exception as e:  # a build or launch failure must not stop training: the torch ops serve
            fused_color.disable(f"the Triton resample kernel failed ({type(e).__name__}: {e})")
    return _by_torch_ops(images, in_hw, size, interpolation, antialias)


def _by_kernel(kernel, images: torch.Tensor, in_hw: np.ndarray, size: List[int], interpolation: str,
               antialias: bool) -> torch.Tensor:
    """The batch's axis tables (each size pair once, in Pillow's 22-bit form) in two buffers, and
    the exact resize's two passes on them."""
    height, width = size
    b = len(in_hw)
    ins = np.stack([in_hw[:, 1], in_hw[:, 0]])  # the width pass, then the height pass
    where = np.empty((4, 2, b), dtype=np.int64)
    placed: dict = {}
    firsts: List[np.ndarray] = []
    weights: List[np.ndarray] = []
    n_first = n_weights = 0
    for p, n_out in enumerate((width, height)):
        for i, n in enumerate(ins[p].tolist()):
            key = (n, n_out)
            if key not in placed:
                first, w, bits = axis_table(n, n_out, interpolation, antialias)
                placed[key] = (n_first, n_weights, w.shape[1], n_out)
                firsts.append(first)
                weights.append((w.astype(np.int64) << (PRECISION_BITS - bits)).ravel())
                n_first, n_weights = n_first + n_out, n_weights + w.size
            where[:, p, i] = placed[key]
    tables = Located(where, upload(np.concatenate(firsts + [[0]]).astype(np.int32), images.device),
                     upload(np.concatenate(weights + [[0]]).astype(np.int32), images.device))
    size_rows = np.array([[width] * b, [height] * b], dtype=np.int64)
    return fused_resize.with_tables(kernel, images, tables, ins, size_rows)


def _by_torch_ops(images: torch.Tensor, in_hw: np.ndarray, size: List[int], interpolation: str,
                  antialias: bool) -> torch.Tensor:
    """``resize`` by int32 torch ops (gather, multiply, sum), in chunks of samples."""
    height, width = size
    per_sample = images.shape[1] * int(in_hw[:, 0].max()) * width * (int(math.ceil(in_hw[:, 1].max() / width)) * 4 + 5)
    step = max(1, _GATHER_LIMIT // max(per_sample, 1))
    out = []
    for start in range(0, images.shape[0], step):
        rows = in_hw[start:start + step]
        x = images[start:start + step, :, :int(rows[:, 0].max()), :int(rows[:, 1].max())].to(torch.int32)
        x = _pass(x, rows[:, 1], width, 3, interpolation, antialias)
        out.append(_pass(x, rows[:, 0], height, 2, interpolation, antialias))
    return out[0] if len(out) == 1 else torch.cat(out)
