"""The end of a plan run as batched torch ops on DALI's output, on the same device.

Pillow's colour maths (ColorJitter above all) is dozens of small steps: as DALI operators each is
a separate operator with its own scheduling, and a batch pays for all of them (measured on the
H200: the heavy augmentation chain at 1,800 images/s, against 11,800 for DALI's own approximate
color_twist). As torch ops on one [B, C, H, W] batch they take ~5 ms per 128 images. So when a
plan holds a ColorJitter, DALI decodes, crops and resizes, and from the ColorJitter on the ops
run here. Rotations, affine and perspective warps too: Pillow samples them in ways (16.16 fixed
point, float64) that torch ops reproduce exactly and DALI's float warp does not. Here: Pillow's
arithmetic (exact), torchvision's own kernels for blur, tensor jitter and normalisation,
per-sample params from the worker.

One module per family registers a kernel per IR op type (``registry.kernel``); what has a
kernel is what the stage can run (TORCH_OPS).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import numpy as np
import torch

from ..ir import Augment, ColorJitter, Perspective, TensorColorJitter, Warp
from . import color, filters, geometry, policies, tensor, tensor_jitter  # noqa: F401  (register kernels)
from .color import hue_tables
from .geometry import perspective, warp
from .policies import augment
from .registry import KERNELS, Batch, upload
from .tensor_jitter import tensor_jitter_kernels, tensor_color_jitter

TORCH_OPS = tuple(KERNELS)
# what DALI does slowly (jitter) or not exactly (warps, policies, torchvision's tensor kernels)
TAKES_OVER_AT = (ColorJitter, TensorColorJitter, Warp, Perspective, Augment)
ONLY_HERE = TAKES_OVER_AT  # needed in DALI: the plan stays in the worker


def split(ops: Sequence[object]) -> Tuple[List[object], List[object]]:
    """(DALI's ops, torch's ops): torch takes over at the first op of TAKES_OVER_AT when it can
    run everything from there on (and the per-pixel ops just before it)."""
    for k, op in enumerate(ops):
        if isinstance(op, TAKES_OVER_AT):
            if all(isinstance(o, TORCH_OPS) for o in ops[k:]):
                while k > 0 and isinstance(ops[k - 1], TORCH_OPS):
                    k -= 1  # the stage also takes what precedes it, so DALI hands over uint8 pixels
                return list(ops[:k]), list(ops[k:])
            break
    return list(ops), []


class TorchStage:
    """Runs ``ops`` on a batch DALI produced: uint8 [B, H, W, C] (or a list of [H, W, C])."""

    def __init__(self, ops: Sequence[object]):
        self.ops = list(ops)
        self.kernels = [KERNELS[type(op)] for op in self.ops]

    def __call__(self, out: Union[torch.Tensor, List[torch.Tensor]], params) -> Union[torch.Tensor, List[torch.Tensor]]:
        if isinstance(out, list):  # sizes differ: one sample at a time
            return [self(o.unsqueeze(0), params[k:k + 1]).squeeze(0) for k, o in enumerate(out)]
        host = np.asarray(params)
        batch = Batch(host, upload(host, out.device))
        x = out.permute(0, 3, 1, 2).to(torch.float32)  # whole numbers 0..255 until a ToFloat
        for op, run in zip(self.ops, self.kernels):
            x = run(x, op, batch)
        return x.to(torch.uint8).contiguous() if batch.integer else x.contiguous()


__all__ = ["TORCH_OPS", "TAKES_OVER_AT", "ONLY_HERE", "split", "TorchStage", "augment", "warp", "perspective",
           "tensor_color_jitter", "hue_tables", "tensor_jitter_kernels"]
