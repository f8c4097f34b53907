"""Pillow's resize of a batch as two Triton launches, the end of the chain folded into the second.

The stage runs on the pipeline's thread, in the main process, under the GIL that the training
loop, the loader and the pin-memory thread share: every host microsecond it spends is taken
from them (at 8 workers the main process is GIL-bound, and the resize's host time cost
throughput one for one). So a batch costs the host a fixed few steps, whatever its samples:

- each sample's two passes in the order Pillow runs them for that image (``ORDERS_PASSES``),
  one launch per pass for the whole batch: the kernel reads per sample which axis it resamples;
- both passes' tables located together (``KeptTables.locate_rows``, vectorised) and sent in one
  copy, with each sample's extents, pass axis and flips;
- the pass between them in uint8 (Pillow rounds it to 8 bits anyway);
- the flips, ToFloat and Normalize that follow (RandomHorizontalFlip, ToTensor, Normalize: the
  classification recipes' end) done by the second pass as it stores, in torch's float32 steps.

``resample.pillow_resize`` and the stage's fused run of (PillowResize [, Crop], tail) call it;
tests/test_resample.py compares it with Pillow and with the unfused kernels, in Triton's
interpreter on the CPU and compiled on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.kept_tables import kept_tables
from dali_autoproxy.backends.torch_stage.registry import Batch, constant, upload
from dali_autoproxy.plan.ir import Flip, Normalize, ToCHW, ToFloat

# the rows of a pass's table (int64 [ROWS, B], a column per sample) that _triton_resample.resample_pass reads
FIRST, WEIGHTS, TAPS, N_OUT, N_ACROSS, ALONG_WIDTH, N_IN, FLIP_X, FLIP_Y = range(9)
ROWS = 9
BLOCK = 32
NO_AFFINE, DIVIDE, MULTIPLY = 0, 1, 2


@dataclass
class Tail:
    """The ops after a resize that its second pass does as it stores: per-sample flips (bool
    [B, 2]: along the width, along the height), one ToFloat, one Normalize after it."""
    flips: np.ndarray
    affine: int = NO_AFFINE
    scale: float = 1.0
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None
    integer: bool = True  # whether the values are still whole numbers 0..255 after it

    @classmethod
    def of(cls, ops: Sequence[object], start: int, batch: Batch) -> Tuple["Tail", int]:
        """The longest run of ``ops`` from ``start`` that a store can do, and the index after it."""
        tail = cls(np.zeros((len(batch.host), 2), dtype=bool), integer=batch.integer)
        j = start
        while j < len(ops):
            op, kind = ops[j], type(ops[j])
            if kind is Flip:
                tail.flips[:, 1 if op.vertical else 0] ^= batch.host[:, op.col("apply")] > 0
            elif kind is ToFloat and tail.integer:
                tail.affine, tail.integer = (DIVIDE if op.divide else MULTIPLY), False
                tail.scale = float(round(1 / op.scale)) if op.divide else float(op.scale)
            elif kind is Normalize and not tail.integer and tail.mean is None:
                tail.mean, tail.std = tuple(op.mean), tuple(op.std)
            elif kind is not ToCHW:
                break
            j += 1
        return tail, j


def two_passes(kernel, x: torch.Tensor, in_hw: np.ndarray, out_hw: np.ndarray, kinds: np.ndarray,
               boxes: np.ndarray, vertical_first: np.ndarray, window: Optional[np.ndarray] = None,
               tail: Optional[Tail] = None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Pillow's resize of each sample of x [B, C, H, W] (uint8 as DALI made it, any strides, or
    float32 whole numbers): as ``resample.pillow_resize``, each sample's passes in its own order
    (``vertical_first``), ``window`` (top, left, height, width) the part of each resized image
    computed, ``tail`` done on the way out. [B, C, max height, max width] of ``out_dtype``, zero
    past each sample's size."""
    b, c, dev = x.shape[0], x.shape[1], x.device
    rows = np.arange(b)
    axis1 = np.where(vertical_first, 0, 1)  # image axis of each sample's first pass (1: width)
    axis2 = 1 - axis1
    size = out_hw if window is None else window[:, 2:4]
    keys = np.concatenate([np.stack([in_hw[rows, a], boxes[rows, a], boxes[rows, a + 2], out_hw[rows, a], kinds], 1)
                           for a in (axis1, axis2)])
    kept = kept_tables(dev)
    t = np.zeros((2, ROWS, b), dtype=np.int64)
    t[:, :4] = kept.locate_rows(keys).reshape(4, 2, b).transpose(1, 0, 2)
    for p, axis in enumerate((axis1, axis2)):
        if window is not None:  # the window's first output pixel: an offset into the tables
            start = window[rows, axis]
            t[p, FIRST] += start
            t[p, WEIGHTS] += start * t[p, TAPS]
        t[p, N_OUT] = size[rows, axis]
        t[p, ALONG_WIDTH] = axis
        t[p, N_IN] = in_hw[rows, axis]
    t[0, N_ACROSS] = in_hw[rows, axis2]  # the first pass: every line of the image across it
    t[1, N_ACROSS] = size[rows, axis1]  # the second: the first one's outputs
    if tail is not None:
        t[1, FLIP_X], t[1, FLIP_Y] = tail.flips[:, 0], tail.flips[:, 1]
    tables = upload(t, dev)
    wide = axis1 == 1
    middle = torch.empty((b, c, int(np.where(wide, in_hw[:, 0], size[:, 0]).max()),
                          int(np.where(wide, size[:, 1], in_hw[:, 1]).max())), dtype=torch.uint8, device=dev)
    make = torch.empty if bool((size == size[0]).all()) else torch.zeros
    out = make((b, c, int(size[:, 0].max()), int(size[:, 1].max())), dtype=out_dtype, device=dev)
    affine, scale, mean, std = NO_AFFINE, 1.0, None, None
    if tail is not None:
        affine, scale, mean, std = tail.affine, tail.scale, tail.mean, tail.std
    normalize = mean is not None
    mean_t = constant(_per_channel(mean if normalize else (0.0,), c), dev).view(-1)
    std_t = constant(_per_channel(std if normalize else (1.0,), c), dev).view(-1)
    for p, (src, dst) in enumerate(((x, middle), (middle, out))):
        last = p == 1
        grid = (b * c, _blocks(t[p, N_OUT]), _blocks(t[p, N_ACROSS]))
        kernel[grid](src, dst, kept.first, kept.weights, tables[p], mean_t, std_t, c, b,
                     *src.stride(), *dst.stride(), scale if last else 1.0,
                     AFFINE=affine if last else NO_AFFINE, NORMALIZE=normalize and last,
                     BLOCK_O=BLOCK, BLOCK_A=BLOCK, num_warps=4, enable_fp_fusion=False)
    return out


def _blocks(extents: np.ndarray) -> int:
    return (int(extents.max()) + BLOCK - 1) // BLOCK


def _per_channel(values: Tuple[float, ...], channels: int) -> Tuple[float, ...]:
    """Normalize's mean or std for every channel (one value broadcasts, as in torch)."""
    values = tuple(float(v) for v in values)
    return values * channels if len(values) == 1 else values
