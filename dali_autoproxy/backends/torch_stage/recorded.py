"""The Pillow calls recorded from transforms without a translation (``PillowCall``): each call's
samples gathered and computed together with Pillow's arithmetic (the kernels of the sibling
modules: Pillow's box blur, its fixed 3 x 3 and 5 x 5 convolutions, luma, blends, look-up
tables, equalize, autocontrast), written back in place. A position where no sample made a call
costs nothing."""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch
from PIL import ImageFilter

from dali_autoproxy.backends.torch_stage.color import autocontrast, blend, blend_step, equalize, luma, shift_hue
from dali_autoproxy.backends.torch_stage.filters import gaussian_blur, pillow_kernel, smooth
from dali_autoproxy.backends.torch_stage.host_division import cpu_division
from dali_autoproxy.backends.torch_stage.pillow_filters import pillow_blur
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, uniform, update_rows, upload
from dali_autoproxy.backends.torch_stage.tensor_jitter import tensor_jitter_kernels
from dali_autoproxy.plan.pillow_ops import (
    BUILTIN_KERNELS,
    PILLOW_CALLS,
    TENSOR_COLOR_CALLS,
    PillowCall,
    RaggedPillowCall,
    blur_window_of,
)

Call = Callable[..., torch.Tensor]  # (samples, a, b, c) -> samples, a b c the calls' values


def _per_sample(values: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    return upload(np.asarray(values, dtype=np.float32), x.device).view(-1, 1, 1, 1)


def _grayscale(x: torch.Tensor, a, b, c) -> torch.Tensor:
    return luma(x).unsqueeze(1).expand(-1, x.shape[1], -1, -1)


def _blend(which: int) -> Call:
    """Brightness (0), Contrast (1) or Color (2): Pillow's blend with its degenerate image."""
    def run(x: torch.Tensor, a, b, c) -> torch.Tensor:
        factors = np.ones((len(a), 3), dtype=np.float32)
        factors[:, which] = a  # float32, as Pillow's blend takes the factor
        return blend_step(x, np.full(len(a), which), upload(factors, x.device))
    return run


def _builtin_kernel(x: torch.Tensor, a) -> torch.Tensor:
    """One of Pillow's fixed convolutions; the samples of one call position may differ in which."""
    which = np.asarray(a, dtype=np.int64)
    for k in np.unique(which):
        size, scale, offset, weights = getattr(ImageFilter, BUILTIN_KERNELS[k]).filterargs
        scaled = np.asarray(weights, dtype=np.float32) / np.float32(scale)  # as Pillow divides, in float32
        x = update_rows(x, np.flatnonzero(which == k), lambda sub, _: pillow_kernel(sub, size[0], scaled, offset))
    return x


def _unsharp_mask(x: torch.Tensor, radius, percent, threshold) -> torch.Tensor:
    """``ImagingUnsharpMask``: Pillow's Gaussian blur of the radius, then where |in - blurred| >
    threshold, in + (in - blurred) * percent / 100 in C's integers (truncated), clipped."""
    blurred = pillow_blur(x, radius, radius, 3, True)
    xi = x.to(torch.int64)
    diff = xi - blurred.to(torch.int64)
    pct = upload(np.asarray(percent, dtype=np.int64), x.device).view(-1, 1, 1, 1)
    thr = upload(np.asarray(threshold, dtype=np.int64), x.device).view(-1, 1, 1, 1)
    sharp = (xi + torch.div(diff * pct, 100, rounding_mode="trunc")).clamp(0, 255)
    return torch.where(diff.abs() > thr, sharp, xi).to(x.dtype)


def _torchvision_blur(x: torch.Tensor, window, sigma_x, sigma_y) -> torch.Tensor:
    """torchvision's gaussian_blur of a PIL image (pil_to_tensor, the float32 kernel, to_pil_image
    of the rounded result); the samples of one call position may differ in window and version.
    The convolution in float64: within one level of torchvision's float32 one (docs/transforms.md)."""
    codes = np.asarray(window, dtype=np.int64)
    sx, sy = np.asarray(sigma_x, dtype=np.float32), np.asarray(sigma_y, dtype=np.float32)
    for code in np.unique(codes):
        v2, kx, ky = blur_window_of(code)
        rows = np.flatnonzero(codes == code)
        x = update_rows(x, rows, lambda sub, _, rows=rows, v2=v2, kx=kx, ky=ky: torch.round(gaussian_blur(
            sub, (ky, kx), torch.from_numpy(sy[rows]), torch.from_numpy(sx[rows]), v2, torch.float64)))
    return x


def _posterize(x: torch.Tensor, a, b, c) -> torch.Tensor:
    masks = upload(np.asarray(a, dtype=np.int64), x.device).view(-1, 1, 1, 1)
    return (x.to(torch.int64) & masks).to(x.dtype)


def _permute(x: torch.Tensor, a, b, c) -> torch.Tensor:
    """Each sample's channels in its own order (v2's permute_channels: output channel k is input ``order[k]``)."""
    order = upload(np.stack([a, b, c], axis=1).astype(np.int64), x.device).view(-1, 3, 1, 1)
    return torch.gather(x, 1, order.expand(-1, -1, x.shape[2], x.shape[3]))


def _by_api(x: torch.Tensor, api, run: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``run(samples, rows, index, kernels)`` for the samples of each API (``api`` 0: v1's tensor
    kernels, 1: v2's), written back into a copy of ``x``."""
    out = x.clone()
    for v2 in (0.0, 1.0):
        rows = np.flatnonzero(np.asarray(api) == v2)
        if len(rows):
            index = upload(rows, x.device)
            with cpu_division(x):
                out[index] = run(x.index_select(0, index), rows, index, tensor_jitter_kernels("v2" if v2 else "v1"))
    return out


def _tensor_contrast_in_regions(x: torch.Tensor, factor: np.ndarray, api: np.ndarray,
                                sizes: np.ndarray) -> torch.Tensor:
    """torchvision's tensor adjust_contrast on each sample of a padded batch at once: the mean of
    its grayscale (whole numbers) over its own region (an exact integer sum divided in float64,
    then float32, where torchvision sums in float32), the blend inside the region."""
    hw = upload(np.asarray(sizes, dtype=np.int64), x.device)
    ys = torch.arange(x.shape[2], device=x.device).view(1, -1, 1)
    xs = torch.arange(x.shape[3], device=x.device).view(1, 1, -1)
    region = ((ys < hw[:, 0].view(-1, 1, 1)) & (xs < hw[:, 1].view(-1, 1, 1))).unsqueeze(1)  # [B, 1, H, W]

    def run(sub, rows, index, kernels):
        contrast, img, inside = kernels[1], sub.to(torch.uint8), region.index_select(0, index)
        total = torch.where(inside, contrast.gray(img).to(torch.float64), 0.0).sum(dim=(1, 2, 3))
        mean = (total / (hw[index, 0] * hw[index, 1]).to(torch.float64)).to(torch.float32).view(-1, 1, 1, 1)
        f = upload(np.asarray(factor, dtype=np.float64)[rows], x.device).view(-1, 1, 1, 1)
        return torch.where(inside, contrast.mix(img, mean, f).to(x.dtype), sub)
    return _by_api(x, api, run)


def _tensor_color(which: int) -> Call:
    """torchvision's tensor adjust_brightness / contrast / saturation / hue (v1's where ``b`` is 0,
    v2's where 1) on the samples as uint8 tensors, each with its own factor ``a``."""
    def call(x: torch.Tensor, a, b, c) -> torch.Tensor:
        def run(sub, rows, index, kernels):
            f = upload(np.asarray(a, dtype=np.float64)[rows], x.device).view(-1, 1, 1, 1)
            return kernels[which](sub.to(torch.uint8), f).to(x.dtype)
        return _by_api(x, b, run)
    return call


CALLS: Dict[str, Call] = {
    "gaussian_blur": lambda x, a, b, c: pillow_blur(x, a, b, 3, True),
    "box_blur": lambda x, a, b, c: pillow_blur(x, a, b, 1, False),
    "kernel": lambda x, a, b, c: _builtin_kernel(x, a),
    "hflip": lambda x, a, b, c: x.flip(3),
    "vflip": lambda x, a, b, c: x.flip(2),
    "transpose": lambda x, a, b, c: x.transpose(2, 3),  # square images only (record/image.py)
    "grayscale": _grayscale,
    "invert": lambda x, a, b, c: 255 - x,
    "solarize": lambda x, a, b, c: torch.where(x >= _per_sample(a, x), 255 - x, x),
    "posterize": _posterize,
    "solarize_add": lambda x, a, b, c: torch.where(x < _per_sample(b, x), (x + _per_sample(a, x)).clamp(max=255), x),
    "equalize": lambda x, a, b, c: equalize(x),
    "autocontrast": lambda x, a, b, c: autocontrast(x),
    "brightness": _blend(0),
    "contrast": _blend(1),
    "color": _blend(2),
    "sharpness": lambda x, a, b, c: blend(smooth(x), x, _per_sample(a, x)),
    "hue": lambda x, a, b, c: shift_hue(x, upload(np.asarray(a, dtype=np.int32), x.device)),
    "unsharp_mask": lambda x, a, b, c: _unsharp_mask(x, a, b, c),
    "tv_blur": _torchvision_blur,
    "permute": _permute,
    **{name: _tensor_color(which) for which, name in enumerate(TENSOR_COLOR_CALLS)},
}


# calls computed pixel by pixel: on a padded batch (samples of their own sizes) the padding changes nothing
PER_PIXEL = frozenset(("brightness", "color", "hue", "permute", "invert", "solarize", "solarize_add", "posterize",
                       "grayscale", "keep", "blend_kept", "tv_brightness", "tv_saturation", "tv_hue"))


def _each_in_its_region(x: torch.Tensor, rows: np.ndarray, sizes: np.ndarray, run: Call, a, b, c) -> torch.Tensor:
    """A call that reads more than its pixel (a mean, a histogram, a neighbourhood, a flip) on
    each sample of a padded batch, over that sample's own region alone."""
    x = x.contiguous()
    for i in rows:
        h, w = (int(v) for v in sizes[i])
        region = x[i:i + 1, :, :h, :w].contiguous()
        x[i:i + 1, :, :h, :w] = run(region, a[[i]], b[[i]], c[[i]]).to(x.dtype)
    return x


def _contrast_in_regions(x: torch.Tensor, factor: np.ndarray, sizes: np.ndarray) -> torch.Tensor:
    """ImageEnhance.Contrast on each sample of a padded batch at once: the mean luma of its own
    region alone (exact integer sums), the blend inside the region, the padding left as it is."""
    hw = upload(np.asarray(sizes, dtype=np.int64), x.device)
    ys = torch.arange(x.shape[2], device=x.device).view(1, -1, 1)
    xs = torch.arange(x.shape[3], device=x.device).view(1, 1, -1)
    region = (ys < hw[:, 0].view(-1, 1, 1)) & (xs < hw[:, 1].view(-1, 1, 1))  # [B, H, W]
    total = torch.where(region, luma(x), 0.0).to(torch.int64).sum(dim=(1, 2))
    count = hw[:, 0] * hw[:, 1]
    mean = ((total * 2 + count) // (count * 2)).to(torch.float32).view(-1, 1, 1, 1)  # int(mean + 0.5)
    return torch.where(region.unsqueeze(1), blend(mean, x, _per_sample(factor, x)), x)


@kernel(PillowCall, RaggedPillowCall)
def _pillow_call(x: torch.Tensor, op: PillowCall, batch: Batch) -> torch.Tensor:
    host = batch.host
    codes = host[:, op.col("call")].astype(np.int64)
    a, b, c = host[:, op.col("a")], host[:, op.col("b")], host[:, op.col("c")]
    ragged = not uniform(batch.sizes)  # only a RaggedPillowCall is given a padded batch
    for code in np.unique(codes[codes > 0]):
        rows = np.flatnonzero(codes == code)
        name = PILLOW_CALLS[code]
        if ragged and name == "contrast":  # the one mean of a region: all samples together
            x = update_rows(x, rows, lambda sub, _, rows=rows: _contrast_in_regions(sub, a[rows], batch.sizes[rows]))
            continue
        if ragged and name == "tv_contrast":
            x = update_rows(x, rows, lambda sub, _, rows=rows: _tensor_contrast_in_regions(
                sub, a[rows], b[rows], batch.sizes[rows]))
            continue
        if ragged and name not in PER_PIXEL:
            x = _each_in_its_region(x, rows, batch.sizes, CALLS[name], a, b, c)
            continue
        if name == "keep":  # a branch point of Image.blend: these samples' images, kept as they are
            if batch.kept is None or batch.kept.shape != x.shape:
                batch.kept = torch.zeros_like(x)
            index = upload(rows, x.device)
            batch.kept[index] = x.index_select(0, index)
            continue
        if name == "blend_kept":
            x = update_rows(x, rows, lambda sub, _, rows=rows: _blend_kept(sub, batch.kept, rows, a[rows], b[rows]))
            continue
        run = CALLS[name]
        x = update_rows(x, rows, lambda sub, _, run=run, rows=rows: run(sub, a[rows], b[rows], c[rows]))
    return x


def _blend_kept(x: torch.Tensor, kept: torch.Tensor, rows: np.ndarray, alpha, order) -> torch.Tensor:
    """Image.blend(kept, image, alpha) where ``order`` is 0, Image.blend(image, kept, alpha) where 1."""
    first = kept.index_select(0, upload(rows, x.device)).to(x.dtype)
    swap = _per_sample(order, x) != 0
    in1, in2 = torch.where(swap, x, first), torch.where(swap, first, x)
    return blend(in1, in2, _per_sample(alpha, x))
