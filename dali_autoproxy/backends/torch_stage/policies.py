"""Augmentation policies (TrivialAugmentWide, RandAugment, AutoAugment and the single-op
Random* transforms): each sample's drawn operation, with Pillow's maths from the sibling
modules."""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color
from dali_autoproxy.backends.torch_stage.color import autocontrast, blend, blend_step, equalize
from dali_autoproxy.backends.torch_stage.filters import smooth
from dali_autoproxy.backends.torch_stage.geometry import affine_tables, perspective, warp
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, update_rows, upload
from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, GEOMETRIC_OPS, Augment
from dali_autoproxy.plan.tv_internals import rotation_matrix

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
    runs, augment_fused does the whole batch in one kernel)."""
    codes = host[:, op.col("operation")].astype(np.int64)
    mags = host[:, op.col("magnitude")].astype(np.float64)
    names = [AUGMENT_OPS[c] for c in codes]
    groups: dict = {}
    for i, name in enumerate(names):
        if name != "Identity":
            key = "warp" if name in GEOMETRIC_OPS else "blend" if name in _BLENDS else name
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
        out = augment_fused(x, op, batch.host)  # one Triton kernel, the same values
        if out is not None:
            return out
    return augment(x, op, batch.host)


def augment_fused(x: torch.Tensor, op, host: np.ndarray) -> Optional[torch.Tensor]:
    """One policy operation per sample on PIL-image values (``policies.augment``'s arithmetic),
    one program per sample. x: [B, 3, H, W] float32 whole numbers; op: ir.Augment;
    host: the params rows. None if the kernel failed (the caller then runs the torch ops)."""
    module = fused_color.load_augment()
    kinds = {name: k for k, name in enumerate(module.AUG_KINDS)}
    b, c, h, w = x.shape
    codes = host[:, op.col("operation")].astype(np.int64)
    mags = np.asarray(host[:, op.col("magnitude")], dtype=np.float64)
    names = [AUGMENT_OPS[k] for k in codes]
    kind = np.zeros(b, dtype=np.int32)
    fparam = np.zeros(b, dtype=np.float32)
    iparam = np.full(b, 255, dtype=np.int32)
    simple = {"Brightness": "brightness", "Contrast": "contrast", "Color": "color", "Sharpness": "sharpness",
              "Posterize": "posterize", "Solarize": "solarize", "AutoContrast": "autocontrast",
              "Equalize": "equalize", "Invert": "invert", "Identity": "copy"}
    geometric = []
    for i, (name, v) in enumerate(zip(names, mags)):
        if name in GEOMETRIC_OPS:
            geometric.append(i)
            continue
        kind[i] = kinds[simple[name]]
        if name in ("Brightness", "Contrast", "Color", "Sharpness"):
            fparam[i] = 1.0 + v  # float32, as the torch ops take the factor
        elif name == "Posterize":
            iparam[i] = (0xFF << (8 - int(v))) & 0xFF
        elif name == "Solarize":  # x >= v for whole numbers x
            fparam[i] = min(max(np.ceil(v), -1.0), 256.0)
    fixed = np.zeros((b, 6), dtype=np.int64)
    coef = np.zeros((b, 6), dtype=np.float64)
    xs, ys = np.zeros((b, w), dtype=np.int32), np.zeros((b, h), dtype=np.int32)
    if geometric:
        rows = np.asarray(geometric)
        matrices = np.array([policy_matrix(names[i], mags[i], w, h) for i in rows], dtype=np.float64)
        if op.bilinear:  # Pillow's generic transform; the identity leaves the image as it is
            coef[rows] = matrices
            identity = np.all(matrices == np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]), axis=1)
            kind[rows] = np.where(identity, kinds["copy"], kinds["warp_bilinear"])
        else:
            f, is_fixed, gx, gy = affine_tables(matrices, w, h)
            fixed[rows], xs[rows], ys[rows] = f, gx, gy
            kind[rows] = np.where(is_fixed, kinds["warp_fixed"], kinds["warp_scale"])
    fill = [float(v) for v in op.fill] * (3 if len(op.fill) == 1 else 1)
    k1, k5 = float(torch.tensor(1.0) / 13.0), float(torch.tensor(5.0) / 13.0)  # as filters.smooth
    args = [upload(a, x.device) for a in (kind, fparam, iparam, fixed, xs, ys, coef,
                                                          np.asarray(fill[:3], dtype=np.float32))]
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    lut = torch.empty((b, 3, 256), dtype=torch.int32, device=x.device)
    sb, sc, sh, sw = x.stride()
    return fused_color.launch(module.augment_pil, b, x, out, *args[:7], lut, args[7], w, h, h * w, sb, sc, sh, sw,
                              k1, k5)
