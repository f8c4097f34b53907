"""Filters: torchvision's Gaussian blur (its 2-D kernel, a sigma per sample) and Pillow's
SMOOTH filter (for RandomAdjustSharpness)."""
from __future__ import annotations

import torch
import torch.nn.functional as nnf

from dali_autoproxy.backends.torch_stage.registry import Batch, kernel
from dali_autoproxy.plan.ir import Blur


def gaussian_blur(x: torch.Tensor, op: Blur, params: torch.Tensor) -> torch.Tensor:
    """torchvision's gaussian_blur with a per-sample sigma: its 2-D kernel, reflect padding,
    float32 convolution, rounding for integer images."""
    b, c, h, w = x.shape
    kh, kw = op.kernel

    def kernel1d(size: int, sigma: torch.Tensor) -> torch.Tensor:
        half = (size - 1) * 0.5
        pts = torch.linspace(-half, half, steps=size, device=x.device)
        pdf = torch.exp(-0.5 * (pts[None, :] / sigma[:, None].to(torch.float32)).pow(2))
        return pdf / pdf.sum(1, keepdim=True)
    ky, kx = kernel1d(kh, params[:, op.col("sigma_y")]), kernel1d(kw, params[:, op.col("sigma_x")])
    weight = (ky[:, :, None] * kx[:, None, :]).repeat_interleave(c, 0).unsqueeze(1)
    padded = nnf.pad(x.reshape(1, b * c, h, w), [kw // 2, kw // 2, kh // 2, kh // 2], mode="reflect")
    return nnf.conv2d(padded, weight, groups=b * c).reshape(b, c, h, w)


def smooth(x: torch.Tensor) -> torch.Tensor:
    """Pillow's ImageFilter.SMOOTH (3x3, 1 1 1 / 1 5 1 / 1 1 1, divided by 13 in float32,
    rows summed bottom to top, rounded half up; the border pixels are copied)."""
    k1, k5 = float(torch.tensor(1.0) / 13.0), float(torch.tensor(5.0) / 13.0)  # float32, as Pillow's normkernel

    def row(r, weight_mid):
        return (r[..., :-2] * k1 + r[..., 1:-1] * weight_mid) + r[..., 2:] * k1
    below, mid, above = x[:, :, 2:, :], x[:, :, 1:-1, :], x[:, :, :-2, :]
    ss = torch.zeros_like(mid[..., 1:-1])
    ss = ss + row(below, k1)
    ss = ss + row(mid, k5)
    ss = ss + row(above, k1)
    inner = torch.where(ss <= 0, 0.0, torch.where(ss >= 255, 255.0, torch.floor(ss + 0.5)))
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = inner
    return out


@kernel(Blur)
def _blur(x: torch.Tensor, op: Blur, batch: Batch) -> torch.Tensor:
    x = gaussian_blur(x, op, batch.params)
    return torch.round(x) if batch.integer else x
