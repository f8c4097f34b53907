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

from .ir import (AUGMENT_OPS, PERSPECTIVE_IDENTITY, Augment, Blur, ColorJitter, Crop, Erase, Flip, Grayscale,
                 Normalize, Perspective, PixelOp, Resize, TensorColorJitter, ToCHW, ToFloat, Warp)
from .planning import Plan


def decode_like_pil_loader(data: bytes) -> Any:
    from PIL import Image
    img = Image.open(io.BytesIO(data))
    return img.convert("RGB")


def _height(img: Any) -> int:
    return img.size[1] if hasattr(img, "getbands") else int(img.shape[-2])


def _width(img: Any) -> int:
    return img.size[0] if hasattr(img, "getbands") else int(img.shape[-1])


def _jitter(img: Any, op: ColorJitter, row: List[float]) -> Any:
    import torchvision.transforms.functional as F
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation]
    for which in (int(v) for v in row[op.slot:op.slot + 4]):
        if which > 3 or not op.enabled[which]:  # 4: the "skip" row of a RandomApply
            continue
        if which < 3:
            img = adjust[which](img, row[op.slot + 4 + which])
        else:  # a factor that gives the same 8-bit shift: int(factor * 255) == k
            shift = int(row[op.slot + 7])
            k = shift - 256 if shift > 127 else shift
            img = F.adjust_hue(img, (k + (0.5 if k >= 0 else -0.5)) / 255)
    return img


def run_plan(plan: Plan, img: Any, params: List[float]) -> torch.Tensor:
    """Apply ``plan`` to a PIL image (or HWC uint8 array) with the given per-sample params."""
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode as M
    from PIL import Image
    import torchvision.transforms.v2.functional as F2
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    for step, op in ((s, o) for s in plan.steps for o in s.ops):
        is_pil = isinstance(img, Image.Image)
        # v2's kernels round differently from v1's (resize of uint8 tensors, blur): replay the step's own
        v2_step = step.name.startswith("v2.")
        if isinstance(op, Crop):
            top, left, h, w = (int(v) for v in params[op.slot:op.slot + 4])
            if any(f != 0 for f in op.fill):  # F.crop pads with zeros: pad with the fill first
                pad = [max(0, -left), max(0, -top), max(0, left + w - _width(img)), max(0, top + h - _height(img))]
                fill = [int(f) for f in op.fill] if is_pil else list(op.fill)
                img = F.pad(img, pad, fill=tuple(fill) if is_pil and len(fill) > 1 else fill[0] if len(fill) == 1 else fill)
                top, left = top + pad[1], left + pad[0]
            img = F.crop(img, top, left, h, w)
        elif isinstance(op, Resize):
            size = list(op.size) if op.size is not None else [int(v) for v in params[op.slot:op.slot + 2]]
            mode = {"linear": M.BILINEAR, "cubic": M.BICUBIC,
                    "nn": M.NEAREST if is_pil else M.NEAREST_EXACT}[op.interp]
            resize = (F2 if v2_step and not is_pil else F).resize
            img = resize(img, size, interpolation=mode, antialias=op.antialias if not is_pil else True)
        elif isinstance(op, Flip):
            if params[op.slot]:
                img = F.vflip(img) if op.vertical else F.hflip(img)
        elif isinstance(op, PixelOp):
            if params[op.slot]:
                img = {"invert": lambda: F.invert(img), "solarize": lambda: F.solarize(img, op.arg),
                       "posterize": lambda: F.posterize(img, 8 - (255 - op.arg).bit_length())}[op.kind]()
        elif isinstance(op, ColorJitter):
            img = _jitter(img, op, params)
        elif isinstance(op, TensorColorJitter):
            from .torch_stage import tensor_color_jitter
            uint8 = img.dtype == torch.uint8
            img = tensor_color_jitter(img.unsqueeze(0).float() if uint8 else img.unsqueeze(0), op,
                                      np.asarray([params]), uint8)[0]
            img = img.to(torch.uint8) if uint8 else img
        elif isinstance(op, Warp):  # what torchvision's rotate/affine ask of Pillow
            fill = tuple(int(v) for v in op.fill)
            img = img.transform(img.size, Image.AFFINE, list(params[op.slot:op.slot + 6]), Image.NEAREST,
                                fillcolor=fill if len(fill) > 1 else fill[0])
        elif isinstance(op, Perspective):  # what torchvision's perspective asks of Pillow
            coeffs = [float(v) for v in params[op.slot:op.slot + 8]]
            if tuple(coeffs) != PERSPECTIVE_IDENTITY:
                fill = tuple(int(v) for v in op.fill)
                img = img.transform(img.size, Image.PERSPECTIVE, coeffs, Image.BILINEAR if op.bilinear else
                                    Image.NEAREST, fillcolor=fill if len(fill) > 1 else fill[0])
        elif isinstance(op, Augment):  # torchvision's own policy operation, v1 units
            from torchvision.transforms.autoaugment import _apply_op
            fill = [float(v) for v in op.fill]
            img = _apply_op(img, AUGMENT_OPS[int(params[op.slot])], float(params[op.slot + 1]),
                            interpolation=M.NEAREST, fill=fill)
        elif isinstance(op, Grayscale):
            if op.slot is None or params[op.slot]:
                img = F.rgb_to_grayscale(img, op.channels)
        elif isinstance(op, Blur):
            sigma_y, sigma_x = params[op.slot], params[op.slot + 1]
            img = (F2 if v2_step else F).gaussian_blur(img, [op.kernel[1], op.kernel[0]], [sigma_x, sigma_y])
        elif isinstance(op, Erase):
            top, left, h, w = (int(v) for v in params[op.slot:op.slot + 4])
            if h and w:
                chw = img if not is_pil else F.pil_to_tensor(img)
                img = F.erase(chw, top, left, h, w, torch.tensor(op.value)[:, None, None])
        elif isinstance(op, ToFloat):
            t = F.pil_to_tensor(img) if is_pil else img
            img = t.float().div(round(1 / op.scale)) if op.divide else t.float() * op.scale
        elif isinstance(op, ToCHW):
            if is_pil:
                img = F.pil_to_tensor(img)
        elif isinstance(op, Normalize):
            img = F.normalize(img, list(op.mean), list(op.std))
    return img
