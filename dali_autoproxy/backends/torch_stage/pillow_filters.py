"""Pillow's box and Gaussian blur (``ImageFilter.BoxBlur`` / ``GaussianBlur``) as batched torch
ops, exact: ``libImaging/BoxBlur.c`` step for step. Per pass along one axis, output pixel x is
``(acc * ww + (in[x - r - 1] + in[x + r + 1]) * fw + 2**23) >> 24`` with ``acc`` the sum of the
``2r + 1`` pixels around x, the indices clamped to the line (Pillow replicates the edge pixel),
``r`` the radius's integer part and the weights ``ww``, ``fw`` Pillow's 24-bit fixed point of the
fractional radius. Each sample has its own radius; the sums are int64, exact."""
from __future__ import annotations

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, upload
from dali_autoproxy.plan.pillow_ops import PillowBlur


def gaussian_box_radius(radius: np.ndarray, passes: int) -> np.ndarray:
    """``_gaussian_blur_radius``: the extended box radius of each pass, in C's float and double
    steps (``radius`` as Pillow receives it, a C float)."""
    f32 = np.float32
    radius = np.asarray(radius, dtype=f32)
    sigma2 = (radius * radius / f32(passes)).astype(f32)
    big = np.sqrt(12.0 * sigma2.astype(np.float64) + 1.0).astype(f32)  # L = sqrt(double)
    low = np.floor((big.astype(np.float64) - 1.0) / 2.0).astype(f32)  # l = floor(double)
    a = ((f32(2) * low + f32(1)) * (low * (low + f32(1)) - f32(3) * sigma2)).astype(f32)
    a = (a / (f32(6) * (sigma2 - (low + f32(1)) * (low + f32(1))))).astype(f32)
    return (low + a).astype(f32)


def box_weights(radius: np.ndarray):
    """``ImagingHorizontalBoxBlur``'s integer radius and fixed-point weights per sample."""
    radius = np.asarray(radius, dtype=np.float32)
    whole = radius.astype(np.int64)  # (int)floatRadius
    ww = (np.float32(1 << 24) / (radius * np.float32(2) + np.float32(1))).astype(np.float32).astype(np.uint32)
    fw = ((np.uint32(1 << 24) - (whole * 2 + 1).astype(np.uint32) * ww) // np.uint32(2)).astype(np.uint32)
    return whole, ww.astype(np.int64), fw.astype(np.int64)


def box_pass(x: torch.Tensor, whole: np.ndarray, ww: np.ndarray, fw: np.ndarray) -> torch.Tensor:
    """One box pass along the last axis of int64 [B, C, H, W], each sample's own radius."""
    b, _, _, w = x.shape
    reach = int(whole.max()) + 1 if len(whole) else 1
    line = torch.arange(-reach, w + reach, device=x.device).clamp_(0, w - 1)
    padded = x.index_select(3, line)  # the edge pixel repeated, as Pillow clamps
    sums = torch.nn.functional.pad(padded.cumsum(3), (1, 0))  # sums[k] = padded[:k].sum()
    r = upload(whole, x.device).view(b, 1, 1, 1)
    at = torch.arange(w, device=x.device).view(1, 1, 1, w) + reach  # x's place in padded
    shape = (b, x.shape[1], x.shape[2], w)
    acc = sums.gather(3, (at + r + 1).expand(shape)) - sums.gather(3, (at - r).expand(shape))
    far = padded.gather(3, (at - r - 1).expand(shape)) + padded.gather(3, (at + r + 1).expand(shape))
    ww_t, fw_t = (upload(v, x.device).view(b, 1, 1, 1) for v in (ww, fw))
    return (acc * ww_t + far * fw_t + (1 << 23)) >> 24


def _triton_pass(kernel, x: torch.Tensor, weights: torch.Tensor, along: int) -> torch.Tensor:
    """One box pass along axis ``along`` (3: along rows, 2: along columns) of float32 x [B, C, H, W];
    ``weights``: int64 [3, B] on x's device, each sample's integer radius and two weights."""
    b, c = x.shape[0], x.shape[1]
    n, n_across = x.shape[along], x.shape[5 - along]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    s, d = x.stride(), out.stride()
    grid = (b * c, (n + 31) // 32, (n_across + 31) // 32)
    kernel[grid](x, out, weights[0], weights[1], weights[2], n, n_across, c, s[0], s[1], s[along], s[5 - along],
                 d[0], d[1], d[along], d[5 - along], BLOCK_O=32, BLOCK_A=32, num_warps=4)
    return out


def triton_blur(kernel, x: torch.Tensor, rx: np.ndarray, ry: np.ndarray, passes: int) -> torch.Tensor:
    """float32 x [B, C, H, W] blurred by ``passes`` box passes along the rows (each sample's box
    radius ``rx``), then as many along the columns (``ry``), one kernel launch per pass."""
    # both axes' radii and weights in one copy to the device (a copy costs more host time than a
    # pass's launch): [axis, (radius, inner weight, edge weight), sample]
    weights = upload(np.stack([np.stack(box_weights(r)) for r in (rx, ry)]), x.device)
    for axis_weights, along in zip(weights, (3, 2)):
        for _ in range(passes):
            x = _triton_pass(kernel, x, axis_weights, along)
    return x


def _triton_kernel(x: torch.Tensor):
    """The Triton box-pass kernel where the fused kernels run (CUDA, Triton, not switched off)."""
    if _FORCE_TORCH_OPS or not fused_color.usable(x):
        return None
    from dali_autoproxy.backends.torch_stage import _triton_blur
    return _triton_blur.box_pass_axis


_FORCE_TORCH_OPS = False  # tests: the int64 torch ops even where Triton runs


def pillow_blur(x: torch.Tensor, x_radius: np.ndarray, y_radius: np.ndarray, passes: int,
                gaussian: bool) -> torch.Tensor:
    """[B, C, H, W] whole numbers -> the same, blurred as Pillow blurs each sample: one Triton
    kernel per pass where Triton runs (the window summed from cache: each pass reads and writes
    the batch once), else int64 torch ops (prefix sums and gathers)."""
    rx = np.asarray(x_radius, dtype=np.float32)
    ry = np.asarray(y_radius, dtype=np.float32)
    if gaussian:
        rx, ry = gaussian_box_radius(rx, passes), gaussian_box_radius(ry, passes)
    kernel = _triton_kernel(x)
    if kernel is not None:
        try:
            return triton_blur(kernel, x.to(torch.float32), rx, ry, passes).to(x.dtype)
        except Exception as e:  # noqa: BLE001 - a build or launch failure must not stop training
                    fused_color.disable(f"the Triton blur kernel failed ({type(e).__name__}: {e})")
    out = x.to(torch.int64)
    weights = box_weights(rx)
    for _ in range(passes):
        out = box_pass(out, *weights)
    weights = box_weights(ry)
    out = out.transpose(2, 3)
    for _ in range(passes):
        out = box_pass(out, *weights)
    return out.transpose(2, 3).to(x.dtype)


@kernel(PillowBlur)
def _pillow_blur(x: torch.Tensor, op: PillowBlur, batch: Batch) -> torch.Tensor:
    host = batch.host
    return pillow_blur(x, host[:, op.col("x_radius")], host[:, op.col("y_radius")], op.passes, op.gaussian)
