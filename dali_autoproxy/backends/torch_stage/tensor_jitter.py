"""ColorJitter on tensor images (the v2 recipe with ToImage first): torchvision's own tensor
kernels, v1 or v2, batched with one factor per sample."""
from __future__ import annotations

import functools

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color
from dali_autoproxy.backends.torch_stage.host_division import cpu_division
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, update_rows, upload
from dali_autoproxy.plan.ir import TensorColorJitter, jitter_order
from dali_autoproxy.plan.tv_internals import tensor_jitter_module


@functools.lru_cache(maxsize=None)
def tensor_jitter_kernels(api: str):
    """torchvision's tensor ColorJitter kernels (v1 or v2) rewritten for a batch with one factor
    per sample: the same torch calls on the same dtypes, the factor a per-sample float32 tensor
    where torchvision passes a Python float (which it casts to float32). Where torchvision
    uses ``add_(other, alpha=...)`` (one fused multiply-add on both CPU and GPU) the product
    and sum are taken in float64 and rounded once, which is that fused result."""
    if api == "v2":
        from torchvision.transforms.v2.functional import to_dtype_image
        C = tensor_jitter_module("v2")

        def gray(img):
            g = C._rgb_to_grayscale_image(img, num_output_channels=1, preserve_dtype=False)
            return g if img.is_floating_point() else g.floor_()

        def mix(img1, img2, ratio):  # v2's _blend: img1 * r + img2 * (1 - r), fused
            out = (img2.double() * (1.0 - ratio).float().double() + img1.mul(ratio.float()).double()).float()
            out = out.clamp_(0, 1.0 if img1.is_floating_point() else 255)
            return out if img1.is_floating_point() else out.to(img1.dtype)

        def brightness(img, f):
            out = img.mul(f.float()).clamp_(0, 1.0 if img.is_floating_point() else 255)
            return out if img.is_floating_point() else out.to(img.dtype)

        def hue(img, f):
            x = to_dtype_image(img, torch.float32, scale=True)
            h, sat, v = C._rgb_to_hsv(x).unbind(dim=-3)
            h = h.add(f.float().view(-1, 1, 1)).remainder_(1.0)
            return to_dtype_image(C._hsv_to_rgb(torch.stack((h, sat, v), dim=-3)), img.dtype, scale=True)
        contrast_gray = gray
    else:
        C = tensor_jitter_module("v1")

        def gray(img):
            return C.rgb_to_grayscale(img)

        def contrast_gray(img):
            return gray(img).to(img.dtype if img.is_floating_point() else torch.float32)

        def mix(img1, img2, ratio):  # v1's _blend: ratio * img1 + (1 - ratio) * img2
            bound = 1.0 if img1.is_floating_point() else 255
            return (img1 * ratio.float() + (1.0 - ratio).float() * img2).clamp(0, bound).to(img1.dtype)

        def brightness(img, f):
            return mix(img, torch.zeros_like(img), f)

        def hue(img, f):
            x = C.convert_image_dtype(img, torch.float32)
            h, sat, v = C._rgb2hsv(x).unbind(dim=-3)
            h = (h + f.float().view(-1, 1, 1)) % 1.0
            return C.convert_image_dtype(C._hsv2rgb(torch.stack((h, sat, v), dim=-3)), img.dtype)

    def contrast(img, f):
        return mix(img, torch.mean(contrast_gray(img), dim=(-3, -2, -1), keepdim=True), f)
    contrast.gray, contrast.mix = contrast_gray, mix  # its two halves, for samples of their own sizes

    def saturation(img, f):
        return mix(img, gray(img), f)
    return brightness, contrast, saturation, hue


def tensor_color_jitter(x: torch.Tensor, op: TensorColorJitter, host, integer: bool) -> torch.Tensor:
    """torchvision's tensor ColorJitter with each sample's own factors and order: at each of the
    four positions of the order, the samples that apply the same adjustment there are computed
    together (torchvision's kernels, batched: tensor_jitter_kernels)."""
    kernels = tensor_jitter_kernels(op.api)
    order = jitter_order(host, op)
    factors = np.asarray(host[:, op.span("brightness", "hue")], dtype=np.float64)
    for k in range(4):
        for which in range(4):
            rows = np.flatnonzero(order[:, k] == which)
            if len(rows):
                f = upload(factors[rows, which], x.device).view(-1, 1, 1, 1)
                x = update_rows(x, rows, lambda sub, _, run=kernels[which], f=f:
                                run(sub.to(torch.uint8) if integer else sub, f))
    return x


@kernel(TensorColorJitter)
def _tensor_color_jitter(x: torch.Tensor, op: TensorColorJitter, batch: Batch) -> torch.Tensor:
    if op.api == "v2" and batch.integer and fused_color.tensor_fits(x) and fused_color.usable(x):
        out = fused_color.tensor_color_jitter_v2(x, jitter_order(batch.host, op),
                                                 batch.host[:, op.span("brightness", "hue")])
        if out is not None:  # one Triton kernel per batch, the same values
            return out
    with cpu_division(x):
        return tensor_color_jitter(x, op, batch.host, batch.integer)
