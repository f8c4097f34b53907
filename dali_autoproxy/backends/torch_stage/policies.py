"""Augmentation policies (TrivialAugmentWide, RandAugment, AutoAugment and the single-op
Random* transforms): each sample's drawn operation, with Pillow's maths from the sibling
modules."""
from __future__ import annotations

import math
from typing import List

import numpy as np
import torch

from dali_autoproxy.plan.ir import AUGMENT_OPS, Augment
from dali_autoproxy.backends.torch_stage.color import autocontrast, blend, blend_step, equalize
from dali_autoproxy.backends.torch_stage.filters import smooth
from dali_autoproxy.backends.torch_stage.geometry import perspective, warp
from dali_autoproxy.plan.tv_internals import rotation_matrix
from dali_autoproxy.backends.torch_stage import fused_color
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, update_rows, upload


GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


_BLENDS = {"Brightness": 0, "Contrast": 1, "Color": 2}  # blend_step's codes


def policy_matrix(name: str, v: float, w: int, h: int) -> List[float]:
    """The inverse matrix torchvision's _apply_op hands to Pillow for a geometric operation."""
    from torchvision.transforms.functional import _get_inverse_affine_matrix
    if name == "Rotate":
        return rotation_matrix(v, w, h, None)
    shear = [math.degrees(math.atan(v)), 0.0] if name == "ShearX" else \
        [0.0, math.degrees(math.atan(v))] if name == "ShearY" else [0.0, 0.0]
    translate = [int(v), 0] if name == "TranslateX" else [0, int(v)] if name == "TranslateY" else [0, 0]
    center = [0, 0] if name.startswith("Shear") else [w * 0.5, h * 0.5]
    return list(_get_inverse_affine_matrix(center, 0.0, translate, 1.0, shear))


def augment(x: torch.Tensor, op: Augment, host) -> torch.Tensor:
    """One policy operation per sample (torchvision's _apply_op on PIL images). Samples are
    grouped by kernel: every geometric operation is one warp (a matrix per sample), the three
    blends one blend pass, the others a group each; a group is gathered, computed and written
    back. Few groups matter: each costs launches, and the stage's thread pays for them (where Triton
    runs, fused_color.augment_pil does the whole batch in one kernel)."""
    codes = host[:, op.slot].astype(np.int64)
    mags = host[:, op.slot + 1].astype(np.float64)
    names = [AUGMENT_OPS[c] for c in codes]
    groups: dict = {}
    for i, name in enumerate(names):
        if name != "Identity":
            key = "warp" if name in GEOMETRIC else "blend" if name in _BLENDS else name
            groups.setdefault(key, []).append(i)
    for key, rows in groups.items():
        x = update_rows(x, rows, lambda sub, _, key=key, rows=rows: _operation(sub, key, rows, names, mags, op))
    return x


def _operation(sub: torch.Tensor, key: str, rows: List[int], names: List[str], mags, op: Augment) -> torch.Tensor:
    """One group of ``augment``: the samples ``rows`` (gathered in ``sub``), which drew ``key``."""
    h, w, dev = sub.shape[2], sub.shape[3], sub.device
    m = mags[rows]
    if key == "warp":
        matrices = [policy_matrix(names[i], mags[i], w, h) for i in rows]
        if op.bilinear:  # Pillow's generic transform: an affine one is a perspective one with g = h = 0
            return perspective(sub, [m + [0.0, 0.0] for m in matrices], op.fill, True)
        return warp(sub, matrices, op.fill)
    if key == "blend":
        which = np.array([_BLENDS[names[i]] for i in rows])
        factors = np.ones((len(rows), 3), dtype=np.float32)
        factors[np.arange(len(rows)), which] = 1.0 + m
        return blend_step(sub, which, upload(factors, dev))
    if key == "Sharpness":
        return blend(smooth(sub), sub, upload(1.0 + m, dev, torch.float32).view(-1, 1, 1, 1))
    if key == "Posterize":
        masks = upload([(0xFF << (8 - int(v))) & 0xFF for v in m], dev).view(-1, 1, 1, 1)
        return (sub.to(torch.int64) & masks).to(sub.dtype)
    if key == "Solarize":
        return torch.where(sub.to(torch.float64) >= upload(m, dev).view(-1, 1, 1, 1), 255 - sub, sub)
    if key == "AutoContrast":
        return autocontrast(sub)
    if key == "Equalize":
        return equalize(sub)
    assert key == "Invert", key
    return 255 - sub


@kernel(Augment)
def _augment(x: torch.Tensor, op: Augment, batch: Batch) -> torch.Tensor:
    if x.shape[1] == 3 and fused_color.usable(x):
        out = fused_color.augment_pil(x, op, batch.host)  # one Triton kernel, the same values
        if out is not None:
            return out
    return augment(x, op, batch.host)

