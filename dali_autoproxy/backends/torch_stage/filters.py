"""Filters: torchvision's Gaussian blur (its 2-D kernel, a sigma per sample), Pillow's SMOOTH
filter (for RandomAdjustSharpness) and Pillow's 3 x 3 and 5 x 5 kernels (recorded ``filter`` calls)."""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as nnf
from PIL import ImageFilter

from dali_autoproxy.backends.torch_stage.registry import Batch, kernel
from dali_autoproxy.plan.ir import Blur


def gaussian_blur(x: torch.Tensor, kernel: Tuple[int, int], sigma_y: torch.Tensor, sigma_x: torch.Tensor,
                  v2: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """torchvision's gaussian_blur with a per-sample sigma: its 2-D kernel (v1's normalised
    exponentials or v2's softmax, in float32 as torchvision computes it), reflect padding, the
    convolution in ``dtype`` (float64: no TF32 and no summation order to speak of)."""
    b, c, h, w = x.shape
    kh, kw = kernel

    def kernel1d(size: int, sigma: torch.Tensor) -> torch.Tensor:
        sigma = sigma.to(device=x.device, dtype=torch.float32)[:, None]
        if v2:
            lim = (size - 1) / (2.0 * math.sqrt(2.0))
            pts = torch.linspace(-lim, lim, steps=size, device=x.device)
            return torch.softmax((pts[None, :] / sigma).pow(2).neg(), dim=1)
        half = (size - 1) * 0.5
        pts = torch.linspace(-half, half, steps=size, device=x.device)
        pdf = torch.exp(-0.5 * (pts[None, :] / sigma).pow(2))
        return pdf / pdf.sum(1, keepdim=True)
    ky, kx = kernel1d(kh, sigma_y), kernel1d(kw, sigma_x)
    weight = (ky[:, :, None] * kx[:, None, :]).repeat_interleave(c, 0).unsqueeze(1).to(dtype)
    padded = nnf.pad(x.reshape(1, b * c, h, w).to(dtype), [kw // 2, kw // 2, kh // 2, kh // 2], mode="reflect")
    return nnf.conv2d(padded, weight, groups=b * c).reshape(b, c, h, w)


def smooth(x: torch.Tensor) -> torch.Tensor:
    """Pillow's ImageFilter.SMOOTH (what ImageEnhance.Sharpness blends with): ``pillow_kernel``
    with SMOOTH's weights (1 1 1 / 1 5 1 / 1 1 1, divided by 13), the border copied."""
    size, scale, offset, weights = ImageFilter.SMOOTH.filterargs
    return pillow_kernel(x, size[0], np.asarray(weights, dtype=np.float32) / np.float32(scale), offset)


def pillow_kernel(x: torch.Tensor, size: int, weights, offset: float) -> torch.Tensor:
    """Pillow's 3 x 3 and 5 x 5 convolutions (``ImagingFilter3x3/5x5``, every ``BuiltinFilter``):
    ``weights`` the kernel already divided by its scale in float32, row 0 applied to the line
    below (Pillow flips the kernel); per pixel a float32 sum started at ``offset + 0.5``, each
    row's products summed left to right, then clamped and truncated; the border of ``size // 2``
    pixels copied. An image smaller than the kernel is returned as it is."""
    b, c, h, w = x.shape
    r = size // 2
    if h < size or w < size:
        return x
    k = [float(v) for v in np.asarray(weights, dtype=np.float32)]
    ss = torch.full((b, c, h - 2 * r, w - 2 * r), float(np.float32(offset) + np.float32(0.5)),
                    dtype=torch.float32, device=x.device)
    for j in range(size):
        line = x[:, :, 2 * r - j:h - j, :]  # row y + r - j of each output row y
        term = line[..., 0:w - 2 * r] * k[j * size]
        for i in range(1, size):
            term = term + line[..., i:w - 2 * r + i] * k[j * size + i]
        ss = ss + term
    out = x.clone()
    out[:, :, r:h - r, r:w - r] = torch.trunc(ss.clamp(0.0, 255.0))
    return out


@kernel(Blur)
def _blur(x: torch.Tensor, op: Blur, batch: Batch) -> torch.Tensor:
    x = gaussian_blur(x, op.kernel, batch.params[:, op.col("sigma_y")], batch.params[:, op.col("sigma_x")])
    return torch.round(x) if batch.integer else x
