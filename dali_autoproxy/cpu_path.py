"""The plan, executed with torchvision's functional ops on the CPU, for one sample.

Used in the main process when DALI fails on a batch: each sample is decoded by PIL exactly as
torchvision's loader does and replayed through the same ops with the params its worker drew,
so the batch still arrives with PIL-equivalent pixels (or PIL's own exception, for a file PIL
cannot read either) instead of an error from a different decoder.
"""
from __future__ import annotations

import io
from typing import Any, List

import numpy as np
import torch

from .ir import Crop, Flip, Normalize, PixelOp, Resize, ToCHW, ToFloat
from .planning import Plan


def decode_like_pil_loader(data: bytes) -> Any:
    from PIL import Image
    img = Image.open(io.BytesIO(data))
    return img.convert("RGB")


def _height(img: Any) -> int:
    return img.size[1] if hasattr(img, "getbands") else int(img.shape[-2])


def _width(img: Any) -> int:
    return img.size[0] if hasattr(img, "getbands") else int(img.shape[-1])


def run_plan(plan: Plan, img: Any, params: List[int]) -> torch.Tensor:
    """Apply ``plan`` to a PIL image (or HWC uint8 array) with the given per-sample params."""
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode as M
    from PIL import Image
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    for op in plan.ops:
        is_pil = isinstance(img, Image.Image)
        if isinstance(op, Crop):
            top, left, h, w = params[op.slot:op.slot + 4]
            if any(f != 0 for f in op.fill):  # F.crop pads with zeros: pad with the fill first
                pad = [max(0, -left), max(0, -top), max(0, left + w - _width(img)), max(0, top + h - _height(img))]
                fill = [int(f) for f in op.fill] if is_pil else list(op.fill)
                img = F.pad(img, pad, fill=tuple(fill) if is_pil and len(fill) > 1 else fill[0] if len(fill) == 1 else fill)
                top, left = top + pad[1], left + pad[0]
            img = F.crop(img, top, left, h, w)
        elif isinstance(op, Resize):
            size = list(op.size) if op.size is not None else list(params[op.slot:op.slot + 2])
            mode = {"linear": M.BILINEAR, "cubic": M.BICUBIC,
                    "nn": M.NEAREST if is_pil else M.NEAREST_EXACT}[op.interp]
            img = F.resize(img, size, interpolation=mode, antialias=op.antialias if not is_pil else True)
        elif isinstance(op, Flip):
            if params[op.slot]:
                img = F.vflip(img) if op.vertical else F.hflip(img)
        elif isinstance(op, PixelOp):
            if params[op.slot]:
                img = {"invert": lambda: F.invert(img), "solarize": lambda: F.solarize(img, op.arg),
                       "posterize": lambda: F.posterize(img, 8 - (255 - op.arg).bit_length())}[op.kind]()
        elif isinstance(op, ToFloat):
            t = F.pil_to_tensor(img) if is_pil else img
            img = t.float().div(255) if abs(op.scale - 1 / 255) < 1e-12 else t.float() * op.scale
        elif isinstance(op, ToCHW):
            if is_pil:
                img = F.pil_to_tensor(img)
        elif isinstance(op, Normalize):
            img = F.normalize(img, list(op.mean), list(op.std))
    return img
