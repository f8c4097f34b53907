"""Pillow's resampling weights, computed exactly as Resample.c computes them (``coefficients``,
on the host or the GPU): one table per (input size, box, output size, filter) along one axis.

``precompute_coeffs`` and ``normalize_coeffs_8bpc`` in the C's operation order: the box is single
precision (Pillow parses it as C floats and subtracts in float), everything after it double
precision, one torch operation per C operation (elementwise ops never contract a multiply and
an add), the weights of one output pixel summed left to right, LANCZOS' and HAMMING's ``sin``/``cos`` from
Python's ``math`` (the C library's, as Pillow calls them). NEAREST is Pillow's scale-only affine
transform (ImagingScaleAffine): one weight of 2**22 at ``COORD`` of a running sum of the scale.

Nothing is kept here: ``kept_tables`` keeps every table a process uses, one store per device, which
the Triton kernels and the torch ops both read; it computes new ones with ``coefficients`` (on a
CUDA device there, for BILINEAR, BICUBIC and BOX) or with ``tables`` on the host.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.registry import upload
from dali_autoproxy.plan.ir import PILLOW_FILTERS

NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING = (
    PILLOW_FILTERS[k] for k in ("nearest", "lanczos", "bilinear", "bicubic", "box", "hamming"))
SUPPORT = {BOX: 0.5, BILINEAR: 1.0, HAMMING: 1.0, BICUBIC: 2.0, LANCZOS: 3.0}
PRECISION_BITS = 22  # Resample.c: 32 - 8 bits of result - 2 bits of overflow
_M_PI = 3.14159265358979323846
_HAMMING_A, _HAMMING_B = float(np.float32(0.54)), float(np.float32(0.46))  # the C's 0.54f and 0.46f


def _pillow_orders_passes() -> bool:
    """Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
    pixels as the width (python-pillow/Pillow#9549); before, always the horizontal one. The
    intermediate is rounded to uint8, so the order changes the result."""
    try:
        import PIL
        return int(PIL.__version__.split(".")[0]) >= 13
    except Exception:  # pragma: no cover - no Pillow: torchvision's PIL path is not in use either
        return True


ORDERS_PASSES = _pillow_orders_passes()


def vertical_first(in_hw: np.ndarray, out_hw: np.ndarray) -> np.ndarray:
    """Per sample, whether this Pillow resizes vertically first (ImagingResampleInner): from the
    image's size, not the box's (a box does not change the order)."""
    if not ORDERS_PASSES:
        return np.zeros(len(in_hw), dtype=bool)
    shrink_y = in_hw[:, 0] - out_hw[:, 0]
    return (shrink_y > 0) & (shrink_y > (in_hw[:, 1] - out_hw[:, 1]) * 2)


def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x = x * _M_PI
    return math.sin(x) / x


def _scalar(kind: int, x: float) -> float:
    if kind == LANCZOS:
        return _sinc(x) * _sinc(x / 3) if -3.0 <= x < 3.0 else 0.0
    x = -x if x < 0.0 else x  # HAMMING
    if x == 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    x = x * _M_PI
    return math.sin(x) / x * (_HAMMING_A + _HAMMING_B * math.cos(x))


def _filter(kind: int, x: torch.Tensor) -> torch.Tensor:
    """Resample.c's filters on a float64 tensor, one torch op per C operation (nothing contracted
    into a multiply-add); LANCZOS and HAMMING value by value with the C library's sin and cos."""
    if kind in (LANCZOS, HAMMING):
        values = [_scalar(kind, float(v)) for v in x.detach().cpu().numpy().ravel()]
        return torch.tensor(values, dtype=torch.float64).view(x.shape).to(x.device)
    if kind == BOX:
        return ((x > -0.5) & (x <= 0.5)).to(torch.float64)
    x = x.abs()
    if kind == BILINEAR:
        return torch.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    near = (((x * (a + 2.0)) - (a + 3.0)) * x) * x + 1
    far = ((((x - 5) * x) + 8) * x - 4) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, 0.0))


Key = Tuple[int, float, float, int, int]  # (input size, box start, box end, output size, filter)
Table = Tuple[np.ndarray, np.ndarray]


def axis_weights(in_size: int, in0: float, in1: float, out_size: int, kind: int) -> Table:
    """Pillow's weights for resampling ``in_size`` pixels, box ``in0..in1`` (C floats), to
    ``out_size`` with filter ``kind``: the first input pixel of each output pixel (int32
    [out_size]) and its fixed-point weights (int32 [out_size, taps]), zero past the pixels
    Pillow uses."""
    return tables((in_size, in0, in1, out_size, kind))[0]


def tables(*keys: Key) -> List[Table]:
    """``axis_weights`` of each key, computed together per filter (read-only arrays)."""
    found: Dict[Key, Table] = {}
    for kind in sorted({k[4] for k in keys}):
        group = list(dict.fromkeys(k for k in keys if k[4] == kind))
        made = [_nearest(*k[:4]) for k in group] if kind == NEAREST else _resampled(group)
        found.update(zip(group, made))
    return [found[k] for k in keys]


def _nearest(in_size: int, in0: float, in1: float, out_size: int) -> Table:
    """ImagingScaleAffine: xo = a[2] + a[0] * 0.5, then xo += a[0]; COORD(xo)."""
    f0, f1 = np.float32(in0), np.float32(in1)
    scale = float(np.float32(f1 - f0)) / out_size  # (double)(box[2] - box[0]) / xsize: a float subtraction
    pos = np.add.accumulate(np.concatenate([[float(f0) + scale * 0.5], np.repeat(scale, out_size - 1)]))
    start = np.where(pos < 0, -1, pos.astype(np.int64))
    inside = (start >= 0) & (start < in_size)
    first = np.where(inside, start, 0).astype(np.int32)
    return _frozen(first), _frozen(np.where(inside, 1 << PRECISION_BITS, 0).astype(np.int32)[:, None])


def taps_of(keys: List[Key]) -> np.ndarray:
    """ksize = (int)ceil(support) * 2 + 1 of each key (NEAREST: 1), as precompute_coeffs sizes it."""
    f0 = np.array([k[1] for k in keys], dtype=np.float32)
    f1 = np.array([k[2] for k in keys], dtype=np.float32)
    scale = (f1 - f0).astype(np.float64) / np.array([k[3] for k in keys], dtype=np.int64)
    support = np.array([SUPPORT.get(k[4], 0.0) for k in keys]) * np.maximum(scale, 1.0)
    taps = np.ceil(support).astype(np.int64) * 2 + 1
    return np.where(np.array([k[4] for k in keys]) == NEAREST, 1, taps)


def coefficients(keys: List[Key], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """precompute_coeffs + normalize_coeffs_8bpc for keys of one filter (not NEAREST), together,
    on ``device``: first (int64 [n, out_max]) and weights (int64 [n, out_max, taps_max]), zero past
    each key's own output size and taps. Each row is the C's computation for its key: every
    operation elementwise and IEEE on the host and on the GPU alike, so batching the keys or the
    device changes no value."""
    kind = keys[0][4]
    f0 = np.array([k[1] for k in keys], dtype=np.float32)
    f1 = np.array([k[2] for k in keys], dtype=np.float32)
    outs = np.array([k[3] for k in keys], dtype=np.int64)
    scale = (f1 - f0).astype(np.float64) / outs  # (double)(in1 - in0) / outSize: a float subtraction
    filterscale = np.maximum(scale, 1.0)
    support = SUPPORT[kind] * filterscale
    out_max, taps = int(outs.max()), int(taps_of(keys).max())
    per_key = upload(np.stack([scale, support, 1.0 / filterscale, f0.astype(np.float64),
                               np.array([k[0] for k in keys], dtype=np.float64), outs.astype(np.float64)], 1), device)
    sc, sup, inv, start, in_size, out = (v.view(-1, 1) for v in per_key.unbind(1))
    xx = torch.arange(out_max, device=device, dtype=torch.float64).view(1, -1)
    center = start + (xx + 0.5) * sc
    xmin = torch.clamp((center - sup + 0.5).to(torch.int64), min=0)  # (int) truncates toward zero
    xmax = torch.minimum((center + sup + 0.5).to(torch.int64), in_size.to(torch.int64)) - xmin
    t = torch.arange(taps, device=device).view(1, 1, -1)
    used = (t < xmax.unsqueeze(2)) & (xx < out).unsqueeze(2)
    arg = (((t + xmin.unsqueeze(2)).to(torch.float64) - center.unsqueeze(2)) + 0.5) * inv.unsqueeze(2)
    w = torch.where(used, _filter(kind, torch.where(used, arg, 0.0)), 0.0)
    ww = torch.zeros_like(center)
    for k in range(taps):  # the C's sequential sum
        ww = torch.where(used[:, :, k], ww + w[:, :, k], ww)
    nonzero = (ww != 0.0).unsqueeze(2)
    k_norm = torch.where(nonzero, w / torch.where(nonzero, ww.unsqueeze(2), 1.0), w)
    fixed = k_norm * float(1 << PRECISION_BITS)
    weights = torch.where(used, torch.where(k_norm < 0, -0.5 + fixed, 0.5 + fixed).to(torch.int64), 0)
    return torch.where(xx < out, xmin, 0), weights


def _resampled(keys: List[Key]) -> List[Table]:
    """``coefficients`` on the host, cut into each key's own table."""
    first, weights = (v.numpy() for v in coefficients(keys, torch.device("cpu")))
    return [(_frozen(first[i, :k[3]].astype(np.int32)), _frozen(weights[i, :k[3], :n].astype(np.int32)))
            for i, (k, n) in enumerate(zip(keys, taps_of(keys)))]


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
