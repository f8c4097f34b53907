"""Policy operations on tensor images (TrivialAugmentWide, RandAugment, AutoAugment after
ToImage; AugMix on any image): torchvision's own tensor arithmetic, batched, and AugMix's mixing.

Samples that drew the same operation and magnitude could simply share one call of
torchvision's kernel (what v1 tensors get). That is a group per magnitude, and each group costs
its launches on the stage's thread. For v2 the stage goes further, keeping v2's arithmetic:
- every geometric operation (shears, translations, rotations) is one ``grid_sample`` over all
  the samples that drew one, each with the grid v2's own ``_affine_grid`` builds for its matrix
  (grids cached by operation, magnitude and size);
- the blends (Brightness, Color, Contrast, Sharpness), Posterize and Solarize run once per
  operation with a per-sample factor, mask or threshold, in v2's dtypes and order.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.color import blend
from dali_autoproxy.backends.torch_stage.host_division import cpu_division
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, update_rows, upload
from dali_autoproxy.backends.torch_stage.tensor_jitter import tensor_jitter_kernels
from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, GEOMETRIC_OPS, MixAdd, MixBlend, MixStart, TensorAugment
from dali_autoproxy.plan.tv_internals import tensor_policy_operation, v2_grid_functions

_PER_SAMPLE = ("Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize")


def _grid(name: str, magnitude: float, h: int, w: int, x: torch.Tensor) -> Optional[torch.Tensor]:
    """``_v2_grid`` for a batch ``x`` on its device and the current stream."""
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
    return _v2_grid(name, magnitude, h, w, str(x.device), stream)


@functools.lru_cache(maxsize=32)
def _v2_grid(name: str, magnitude: float, h: int, w: int, device: str, stream: int) -> Optional[torch.Tensor]:
    """The sampling grid v2's affine_image / rotate_image builds for this operation on an h x w
    image, or None where rotate_image takes a fast path (a multiple of 90 degrees). Kept per
    stream: each pipeline's stage runs on its own, and a grid made on one is read there only."""
    affine_grid, inverse_matrix = v2_grid_functions()
    if name == "Rotate":
        angle = magnitude % 360
        if angle in (0, 180) or (h == w and angle in (90, 270)):
            return None
        matrix = inverse_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    else:
        shear = [0.0, 0.0]
        if name.startswith("Shear"):
            shear[name == "ShearY"] = math.degrees(math.atan(magnitude))
        translate = [0.0, 0.0]
        if name.startswith("Translate"):
            translate[name == "TranslateY"] = float(int(magnitude))
        # shears pass center=[0, 0], which affine_image moves to the image's corner
        center = [0.0 - w * 0.5, 0.0 - h * 0.5] if name.startswith("Shear") else [0.0, 0.0]
        matrix = inverse_matrix(center, 0.0, translate, 1.0, shear)
    theta = torch.tensor(matrix, dtype=torch.float32, device=device).reshape(1, 2, 3)
    return affine_grid(theta, w=w, h=h, ow=w, oh=h)


def release_grids() -> None:
    """Free the cached grids (device memory) once no pipeline is left to use them."""
    _v2_grid.cache_clear()


def _geometric(sub: torch.Tensor, keys: List[tuple], op: TensorAugment) -> torch.Tensor:
    """v2's _apply_grid_transform over the group, one grid per sample."""
    from torchvision.transforms.v2.functional._geometry import _apply_grid_transform
    h, w = sub.shape[-2:]
    grids = torch.cat([_grid(name, m, h, w, sub) for name, m in keys])
    fill = list(op.fill) if isinstance(op.fill, tuple) else op.fill
    return _apply_grid_transform(sub, grids, op.interpolation, fill)


def _per_sample(sub: torch.Tensor, name: str, magnitudes: np.ndarray) -> torch.Tensor:
    """One v2 operation with a per-sample magnitude, as v2's kernel computes it for each."""
    dev = sub.device
    if name in ("Brightness", "Color", "Contrast"):
        brightness, contrast, saturation, _ = tensor_jitter_kernels("v2")
        run = {"Brightness": brightness, "Color": saturation, "Contrast": contrast}[name]
        return run(sub, upload(1.0 + magnitudes, dev).view(-1, 1, 1, 1))
    if name == "Sharpness":
        return _sharpness(sub, 1.0 + magnitudes)
    if name == "Posterize":
        bits = magnitudes.astype(np.int64)
        masks = ((1 << bits) - 1) << (8 - bits)
        return sub & upload(masks, dev, torch.uint8).view(-1, 1, 1, 1)
    assert name == "Solarize", name
    threshold = upload(255.0 * magnitudes, dev, torch.float32).view(-1, 1, 1, 1)  # v2: bound * magnitude
    return torch.where(sub >= threshold, sub.bitwise_not(), sub)


def _sharpness(image: torch.Tensor, factors: np.ndarray) -> torch.Tensor:
    """v2's adjust_sharpness_image on uint8 with a factor per sample: its 3x3 blur rounded,
    blended into the interior with alpha = 1 - factor (add_ with alpha: one fused
    multiply-add, taken here in float64 and rounded once)."""
    if image.shape[-1] <= 2 or image.shape[-2] <= 2:
        return image
    channels = image.shape[-3]
    a, b = 1.0 / 13.0, 5.0 / 13.0
    k = torch.tensor([[a, a, a], [a, b, a], [a, a, a]], dtype=torch.float32, device=image.device)
    output = image.to(dtype=torch.float32, copy=True)
    blurred = torch.nn.functional.conv2d(output, k.expand(channels, 1, 3, 3), groups=channels).round_()
    view = output[..., 1:-1, 1:-1]
    alpha = upload((1.0 - factors).astype(np.float32).astype(np.float64), image.device).view(-1, 1, 1, 1)
    view.copy_((view.double() + alpha * blurred.sub_(view).double()).float())
    return output.clamp_(0, 255).to(image.dtype)


def tensor_augment(x: torch.Tensor, op: TensorAugment, host, integer: bool) -> torch.Tensor:
    """One policy operation per sample on tensor images (module docstring)."""
    codes = host[:, op.col("operation")].astype(np.int64)
    magnitudes = host[:, op.col("magnitude")].astype(np.float64)
    batched = op.api == "v2" and integer
    groups: Dict[tuple, List[int]] = {}
    for i, (code, m) in enumerate(zip(codes, magnitudes)):
        name = AUGMENT_OPS[code]
        if name == "Identity":
            continue
        geometric = batched and name in GEOMETRIC_OPS
        if geometric and _grid(name, float(m), x.shape[-2], x.shape[-1], x) is not None:
            key = ("geometric",)
        elif batched and name in _PER_SAMPLE:
            key = (name,)
        else:
            key = (name, float(m))
        groups.setdefault(key, []).append(i)
    run = tensor_policy_operation(op.api)
    for key, rows in groups.items():
        if key == ("geometric",):
            keys = [(AUGMENT_OPS[codes[i]], float(magnitudes[i])) for i in rows]
            fn = lambda sub, _, keys=keys: _geometric(sub.to(torch.uint8), keys, op)  # noqa: E731
        elif len(key) == 1:
            fn = lambda sub, _, name=key[0], m=magnitudes[rows]: _per_sample(sub.to(torch.uint8), name, m)  # noqa: E731
        else:
            fn = lambda sub, _, name=key[0], m=key[1]: run(  # noqa: E731
                sub.to(torch.uint8) if integer else sub, name, m, op.interpolation, op.fill)
        x = update_rows(x, rows, fn)
    return x


@kernel(TensorAugment)
def _tensor_augment(x: torch.Tensor, op: TensorAugment, batch: Batch) -> torch.Tensor:
    with cpu_division(x):
        return tensor_augment(x, op, batch.host, batch.integer)


def _weights(x: torch.Tensor, op, batch: Batch, name: str = "weight") -> torch.Tensor:
    """The op's per-sample float32 value ``name`` as a [B, 1, 1, 1] factor on ``x``'s device."""
    return upload(batch.host[:, op.col(name)].astype(np.float32), x.device).view(-1, 1, 1, 1)


@kernel(MixStart)
def _mix_start(x: torch.Tensor, op: MixStart, batch: Batch) -> torch.Tensor:
    """AugMix's source kept, its mix started (float32 weight times the whole-number pixels, as
    torchvision's float32 weight times its uint8 image); the first copy starts from a copy of it
    (the policy kernels write in place)."""
    batch.mixing = (x, _weights(x, op, batch) * x)
    return x.clone()


@kernel(MixAdd)
def _mix_add(x: torch.Tensor, op: MixAdd, batch: Batch) -> torch.Tensor:
    """One copy added to the mix (torchvision's ``mix.add_(weight * aug)``); then the next copy
    starts from the source, or, after the last, the image is the mix truncated (``.to(uint8)``)."""
    source, mix = batch.mixing
    mix.add_(_weights(x, op, batch) * x)
    if not op.last:
        return source.clone()
    return mix.trunc_()  # the source stays kept for a MixBlend


@kernel(MixBlend)
def _mix_blend(x: torch.Tensor, op: MixBlend, batch: Batch) -> torch.Tensor:
    """Pillow's Image.blend(source, mixed, alpha), per sample."""
    source, _ = batch.mixing
    batch.mixing = None
    return blend(source, x, _weights(x, op, batch, "alpha"))
