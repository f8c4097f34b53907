"""Pillow's geometric transforms as batched torch ops: its nearest-neighbour affine transform
(16.16 fixed point, or its scale-only path) and its generic perspective transform (float64),
each sample with its own matrix; flips."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.registry import (
    Batch,
    constant,
    kernel,
    uniform,
    update_rows,
    upload,
    valid_sizes,
)
from dali_autoproxy.plan.ir import PERSPECTIVE_IDENTITY, Flip, Perspective, Warp


def _coord(v):
    """Pillow's COORD: -1 below zero, else truncation."""
    return np.where(v < 0, -1, v.astype(np.int64))


def _gather(x: torch.Tensor, yy: torch.Tensor, xx: torch.Tensor, in_h=None, in_w=None) -> torch.Tensor:
    """x[b, :, yy, xx] for per-sample integer coordinate maps [B, H', W'], clamped to each sample's
    image (``in_h``, ``in_w``: [B, 1, 1] in a padded batch; default the batch's size), as Pillow's
    XCLIP / YCLIP clamp its bilinear neighbours."""
    b, c, h, w = x.shape
    oh, ow = yy.shape[1], yy.shape[2]
    zero = torch.zeros((), dtype=yy.dtype, device=yy.device)
    yy = yy.clamp(0, h - 1) if in_h is None else torch.minimum(torch.maximum(yy, zero), in_h - 1)
    xx = xx.clamp(0, w - 1) if in_w is None else torch.minimum(torch.maximum(xx, zero), in_w - 1)
    index = (yy * w + xx).view(b, 1, oh * ow).expand(b, c, oh * ow)
    return x.reshape(b, c, h * w).gather(2, index).view(b, c, oh, ow)


def _extents(x: torch.Tensor, in_hw, out_hw):
    """Each sample's input and output (height, width) as int64 [B, 2] (defaults: the batch's
    size; an output size of 0: the input's), and the output grid's size (the largest)."""
    b, _, h, w = x.shape
    in_hw = np.tile([h, w], (b, 1)) if in_hw is None else np.asarray(in_hw, dtype=np.int64)
    out_hw = in_hw if out_hw is None else np.where(np.asarray(out_hw) > 0, np.asarray(out_hw), in_hw).astype(np.int64)
    return in_hw, out_hw, int(out_hw[:, 0].max()), int(out_hw[:, 1].max())


def _bounds(in_hw: np.ndarray, out_hw: np.ndarray, oh: int, ow: int, dev: torch.device):
    """[B, 1, 1] input heights and widths, and the [B, oh, ow] mask of each sample's own output."""
    n = len(in_hw)
    s = upload(np.concatenate([in_hw, out_hw], 1), dev)
    in_h, in_w, out_h, out_w = (v.view(n, 1, 1) for v in s.unbind(1))
    rows = torch.arange(oh, device=dev).view(1, oh, 1)
    cols = torch.arange(ow, device=dev).view(1, 1, ow)
    return in_h, in_w, (rows < out_h) & (cols < out_w)


def warp(x: torch.Tensor, matrices, fill: Sequence[float], in_hw=None, out_hw=None) -> torch.Tensor:
    """Pillow's nearest-neighbour ImagingTransformAffine with one inverse matrix per sample
    (host float64 [B, 6]): its scale-only path (double accumulation, tabulated on the host)
    or its 16.16 fixed-point path (integers, exact on the device); outside: ``fill``. The host
    part is vectorised over the batch with the C's operation order (accumulate is sequential).
    ``in_hw`` / ``out_hw``: each sample's valid input size (a padded batch) and output size
    (``Image.transform`` to another size; 0 or None: the input's); past it, 0."""
    b, c, h, w = x.shape
    in_hw, out_hw, oh, ow = _extents(x, in_hw, out_hw)
    fixed, is_fixed, xs, ys = affine_tables(matrices, ow, oh, out_hw[:, 1], out_hw[:, 0])
    dev = x.device
    f = upload(fixed, dev).view(b, 6, 1, 1)
    row = torch.arange(oh, device=dev, dtype=torch.int64).view(1, oh, 1)
    col = torch.arange(ow, device=dev, dtype=torch.int64).view(1, 1, ow)
    xin = (f[:, 2] + row * f[:, 1] + col * f[:, 0]) >> 16
    yin = (f[:, 5] + row * f[:, 4] + col * f[:, 3]) >> 16
    if not is_fixed.all():
        scale_only = upload(~is_fixed, dev).view(b, 1, 1)
        xin = torch.where(scale_only, upload(xs, dev).view(b, 1, ow), xin)
        yin = torch.where(scale_only, upload(ys, dev).view(b, oh, 1), yin)
    in_h, in_w, own = _bounds(in_hw, out_hw, oh, ow, dev)
    inside = (xin >= 0) & (xin < in_w) & (yin >= 0) & (yin < in_h)
    out = torch.where(inside.unsqueeze(1), _gather(x, yin, xin), constant(fill, dev, x.dtype))
    return out if bool((out_hw == [oh, ow]).all()) else torch.where(own.unsqueeze(1), out, 0.0)


def affine_tables(matrices, w: int, h: int, out_w=None, out_h=None):
    """The host part of ``warp`` for [B, 6] inverse matrices on a ``w`` x ``h`` output grid:
    Pillow's 16.16 fixed-point matrices (int64 [B, 6]), which samples take that path (else the
    scale-only one), and the scale-only path's column and row tables (int64 [B, W], [B, H]).
    Raises ValueError where Pillow's fixed-point range is exceeded at the corners of a sample's
    output (``out_w`` x ``out_h`` per sample, default the grid) (PIL then replays the batch)."""
    a = np.asarray(matrices, dtype=np.float64).reshape(-1, 6)
    a0, a1, a2, a3, a4, a5 = (a[:, k:k + 1] for k in range(6))
    is_fixed = ~((a[:, 1] == 0) & (a[:, 3] == 0))  # else ImagingScaleAffine
    xs = _coord(np.add.accumulate(np.concatenate([a2 + a0 * 0.5, np.repeat(a0, w - 1, 1)], 1), axis=1))
    ys = _coord(np.add.accumulate(np.concatenate([a5 + a4 * 0.5, np.repeat(a4, h - 1, 1)], 1), axis=1))
    ow = np.broadcast_to(np.asarray(w if out_w is None else out_w, dtype=np.float64), (len(a),))[:, None]
    oh = np.broadcast_to(np.asarray(h if out_h is None else out_h, dtype=np.float64), (len(a),))[:, None]
    zero = np.zeros_like(ow)
    px, py = np.concatenate([zero, ow, zero, ow], 1), np.concatenate([zero, oh, oh, zero], 1)  # Pillow's corners
    in_range = (np.abs(px * a0 + py * a1 + a2) < 32768.0) & (np.abs(px * a3 + py * a4 + a5) < 32768.0)
    if not in_range[is_fixed].all():
        raise ValueError("affine matrix outside Pillow's fixed-point range")  # replayed by PIL
    fixed = np.floor(np.concatenate([a0, a1, a2 + a0 * 0.5 + a1 * 0.5, a3, a4, a5 + a3 * 0.5 + a4 * 0.5], 1)
                     * 65536.0 + 0.5)
    fixed = np.where(is_fixed[:, None], fixed, 0).astype(np.int64)
    return fixed, is_fixed, xs, ys


def perspective(x: torch.Tensor, coeffs, fill: Sequence[float], bilinear: bool, in_hw=None,
                out_hw=None) -> torch.Tensor:
    """Pillow's ImagingGenericTransform with perspective_transform (host float64 [B, 8]) and its
    nearest (COORD) or bilinear_filter32RGB sampler, in float64 with the C's operation order:
    every product and sum is its own torch op, so nothing is fused and each rounds as the C's
    does. Samples whose coefficients are the identity (not drawn) to their own size are left
    alone. ``in_hw`` / ``out_hw`` as for ``warp``."""
    coeffs = np.asarray(coeffs, dtype=np.float64)
    in_hw, out_hw, oh, ow = _extents(x, in_hw, out_hw)
    if not (out_hw == list(x.shape[2:])).all():  # to other sizes: every sample
        return _perspective_rows(x.to(torch.float64), coeffs, fill, bilinear, in_hw, out_hw).to(x.dtype)
    todo = np.flatnonzero(~np.all(coeffs == np.asarray(PERSPECTIVE_IDENTITY), axis=1))
    if not len(todo):
        return x
    return update_rows(x, todo, lambda sub, _: _perspective_rows(sub.to(torch.float64), coeffs[todo], fill, bilinear,
                                                                 in_hw[todo], out_hw[todo]))


def _perspective_rows(src: torch.Tensor, coeffs: np.ndarray, fill: Sequence[float], bilinear: bool,
                      in_hw: np.ndarray, out_hw: np.ndarray) -> torch.Tensor:
    n, c, h, w = src.shape
    oh, ow = int(out_hw[:, 0].max()), int(out_hw[:, 1].max())
    dev = src.device
    a = upload(coeffs, dev).view(n, 8, 1, 1).unbind(1)
    col = (torch.arange(ow, device=dev, dtype=torch.float64) + 0.5).view(1, 1, ow)
    row = (torch.arange(oh, device=dev, dtype=torch.float64) + 0.5).view(1, oh, 1)
    den = a[6] * col + a[7] * row + 1
    xin = (a[0] * col + a[1] * row + a[2]) / den
    yin = (a[3] * col + a[4] * row + a[5]) / den
    in_h, in_w, own = _bounds(in_hw, out_hw, oh, ow, dev)
    inside = (xin >= 0) & (xin < in_w) & (yin >= 0) & (yin < in_h)  # also false for NaN
    xin, yin = torch.where(inside, xin, 0.5), torch.where(inside, yin, 0.5)
    if not bilinear:
        out = _gather(src, yin.to(torch.int64), xin.to(torch.int64), in_h, in_w)  # COORD: truncation (>= 0 here)
    else:
        xs, ys = xin - 0.5, yin - 0.5
        fx, fy = torch.floor(xs), torch.floor(ys)
        dx, dy = (xs - fx).unsqueeze(1), (ys - fy).unsqueeze(1)
        ix, iy = fx.to(torch.int64), fy.to(torch.int64)
        top_l, top_r = _gather(src, iy, ix, in_h, in_w), _gather(src, iy, ix + 1, in_h, in_w)
        v1 = top_l + (top_r - top_l) * dx
        bot_l, bot_r = _gather(src, iy + 1, ix, in_h, in_w), _gather(src, iy + 1, ix + 1, in_h, in_w)
        v2 = torch.where(((iy + 1) < in_h).unsqueeze(1), bot_l + (bot_r - bot_l) * dx, v1)
        out = torch.trunc(v1 + (v2 - v1) * dy)
    out = torch.where(inside.unsqueeze(1), out, constant(fill, dev, torch.float64))
    return torch.where(own.unsqueeze(1), out, 0.0)


@kernel(Warp)
def _warp(x: torch.Tensor, op: Warp, batch: Batch) -> torch.Tensor:
    matrices = batch.host[:, op.span("a", "f")]
    in_hw, out_hw = _sizes(x, op, batch)
    if op.bilinear:  # Pillow's generic transform: an affine one is a perspective one with g = h = 0
        return perspective(x, np.concatenate([matrices, np.zeros((len(matrices), 2))], 1), op.fill, True,
                           in_hw, out_hw)
    return warp(x, matrices, op.fill, in_hw, out_hw)


@kernel(Perspective)
def _perspective(x: torch.Tensor, op: Perspective, batch: Batch) -> torch.Tensor:
    in_hw, out_hw = _sizes(x, op, batch)
    return perspective(x, batch.host[:, op.span("a", "h")], op.fill, op.bilinear, in_hw, out_hw)


def _sizes(x: torch.Tensor, op, batch: Batch):
    """Each sample's input size (a Warp's own; a Perspective takes one size) and its output size
    (0: the same), which become the batch's."""
    in_hw = (batch.host[:, op.span("in_height", "in_width")].astype(np.int64) if type(op) is Warp
             else valid_sizes(x, batch))
    asked = batch.host[:, op.span("out_height", "out_width")].astype(np.int64)
    out_hw = np.where(asked > 0, asked, in_hw)
    batch.sizes = out_hw
    return in_hw, out_hw


@kernel(Flip)
def _flip(x: torch.Tensor, op: Flip, batch: Batch) -> torch.Tensor:
    if uniform(batch.sizes):
        return torch.where(batch.flag(op.col("apply")), x.flip(2 if op.vertical else 3), x)
    return flip_within(x, batch.host[:, op.col("apply")] > 0, batch.sizes, op.vertical)


def flip_within(x: torch.Tensor, flipped: np.ndarray, sizes: np.ndarray, vertical: bool) -> torch.Tensor:
    """The flagged samples of a padded batch flipped within their own height or width (the
    padding stays where it is): one gather, the index ``size - 1 - i`` inside each sample."""
    axis = 2 if vertical else 3
    n = x.shape[axis]
    extent = sizes[:, 0 if vertical else 1].astype(np.int64)
    index = np.tile(np.arange(n, dtype=np.int64), (x.shape[0], 1))
    inside = index < extent[:, None]
    index = np.where(flipped[:, None] & inside, extent[:, None] - 1 - index, index)
    shape = (x.shape[0], 1, 1, n) if not vertical else (x.shape[0], 1, n, 1)
    return torch.gather(x, axis, upload(index, x.device).view(shape).expand_as(x))
