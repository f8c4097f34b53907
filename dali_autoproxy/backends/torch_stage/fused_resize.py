"""Pillow's resize of a batch in two Triton launches (a graph replay), the chain's end in the second.

The stage runs on the pipeline's thread, in the main process, under the GIL that the training
loop, the loader and the pin-memory thread share: every host microsecond it spends is taken
from them (at 8 workers the main process is GIL-bound, and the resize's host time cost
throughput one for one). So a batch costs the host a fixed few steps, whatever its samples:

- each sample's two passes in the order Pillow runs them for that image (``ORDERS_PASSES``),
  one launch per pass for the whole batch: the kernel reads per sample which axis it resamples;
- the stage's run (``ResizeRun``: the resize, the crop after it, the tail) prepared once per
  stage and position: a batch reads every column it needs with one index of its params rows
  and builds both passes' rows with a few whole-array numpy calls, none per sample;
- both passes' tables located together (``KeptTables.locate_whole``: a sorted search of codes)
  and sent in one copy, with each sample's extents, pass axis and flips, and the tensors'
  addresses and strides: the kernel reads everything that changes between batches from that
  block, so the two launches are one replay of a CUDA graph for every batch of a shape after
  its first (``launch_graphs``);
- the pass between them in uint8 (Pillow rounds it to 8 bits anyway);
- the flips, ToFloat and Normalize that follow (RandomHorizontalFlip, ToTensor, Normalize: the
  classification recipes' end) done by the second pass as it stores, in torch's float32 steps.

``resample.pillow_resize`` and the stage's fused run of (PillowResize [, Crop], tail) call it;
tests/test_resample.py compares it with Pillow and with the unfused kernels, in Triton's
interpreter on the CPU and compiled on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import pillow_weights as pw
from dali_autoproxy.backends.torch_stage.kept_tables import KeptTables, kept_tables
from dali_autoproxy.backends.torch_stage.launch_graphs import LaunchGraphs
from dali_autoproxy.backends.torch_stage.registry import Batch, constant, upload
from dali_autoproxy.plan.ir import Crop, Flip, Normalize, PillowResize, ToCHW, ToFloat

# a pass's block (int64) that _triton_resample.resample_pass reads: META addresses and strides, then
# the rows [ROWS, B], a column per sample
META = 12
FIRST, WEIGHTS, TAPS, N_OUT, N_ACROSS, ALONG_WIDTH, N_IN, FLIP_X, FLIP_Y = range(9)
ROWS = 9
BLOCK = 32
NO_AFFINE, DIVIDE, MULTIPLY = 0, 1, 2


@dataclass(frozen=True)
class Tail:
    """The ops after a resize that its second pass does as it stores: per-sample flips (the
    params columns of the Flips along the width and along the height: a sample is mirrored
    where an odd number of them apply), one ToFloat, one Normalize after it."""
    flip_x: Tuple[int, ...] = ()
    flip_y: Tuple[int, ...] = ()
    affine: int = NO_AFFINE
    scale: float = 1.0
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None
    integer: bool = True  # whether the values are still whole numbers 0..255 after it

    @classmethod
    def of(cls, ops: Sequence[object], start: int, integer: bool) -> Tuple["Tail", int]:
        """The longest run of ``ops`` from ``start`` that a store can do, and the index after it
        (``integer``: whether the values are whole numbers as the run starts)."""
        flips: Dict[bool, Tuple[int, ...]] = {False: (), True: ()}
        affine, scale, mean, std = NO_AFFINE, 1.0, None, None
        j = start
        while j < len(ops):
            op, kind = ops[j], type(ops[j])
            if kind is Flip:
                flips[op.vertical] += (op.col("apply"),)
            elif kind is ToFloat and integer:
                affine, integer = (DIVIDE if op.divide else MULTIPLY), False
                scale = float(round(1 / op.scale)) if op.divide else float(op.scale)
            elif kind is Normalize and not integer and mean is None:
                mean, std = tuple(op.mean), tuple(op.std)
            elif kind is not ToCHW:
                break
            j += 1
        return cls(flips[False], flips[True], affine, scale, mean, std, integer), j

    def flips(self, host: np.ndarray) -> np.ndarray:
        """int64 [2, B]: per sample, whether it is mirrored along the width, along the height."""
        out = np.zeros((2, len(host)), dtype=np.int64)
        for axis, cols in enumerate((self.flip_x, self.flip_y)):
            if len(cols) == 1:
                out[axis] = host[:, cols[0]] > 0
            elif cols:
                out[axis] = (host[:, list(cols)] > 0).sum(1) & 1
        return out


NO_TAIL = Tail()


class ResizeRun:
    """The stage's run from a PillowResize at ops[k]: the resize, the Crop right after it as its
    window (CenterCrop after Resize: only the crop's pixels are resampled) and the ``Tail`` its
    second pass does, prepared once for the stage (``Batch.prepared``), so that a batch costs a
    fixed few numpy calls (``passes``)."""

    def __init__(self, ops: Sequence[object], k: int, integer: bool) -> None:
        op: PillowResize = ops[k]
        j = k + 1
        self.crop: Optional[Crop] = ops[j] if j < len(ops) and type(ops[j]) is Crop else None
        j += self.crop is not None
        self.tail, self.end = Tail.of(ops, j, integer)
        cols = [op.col(n) for n in ("in_width", "in_height", "out_width", "out_height", "filter")]
        if self.crop is not None:
            cols += [self.crop.col(n) for n in ("left", "top", "width", "height")]
        self.cols = np.array(cols)
        self.box = np.array([op.col(n) for n in ("box_left", "box_top", "box_right", "box_bottom")])
        self._constants: Dict[torch.device, Tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, kernel, x: torch.Tensor, batch: Batch, out_dtype: torch.dtype
                 ) -> Optional[Tuple[torch.Tensor, np.ndarray]]:
        """The batch resized (and windowed, and its tail done), and each sample's (height,
        width); None where the window leaves a resized image (the crop pads: its own kernel's)."""
        v = batch.host[:, self.cols].astype(np.int64)
        if self.crop is not None:
            if (v[:, 5:7] < 0).any() or (v[:, 5:7] + v[:, 7:9] > v[:, 2:4]).any():
                return None
        if x.device not in self._constants:
            self._constants[x.device] = _normalize_constants(self.tail, x.shape[1], x.device)
        return passes(kernel, x, v, batch.host[:, self.box].astype(np.float32), self.tail, self.tail.flips(batch.host),
                      out_dtype, self._constants[x.device])


def two_passes(kernel, x: torch.Tensor, in_hw: np.ndarray, out_hw: np.ndarray, kinds: np.ndarray,
               boxes: np.ndarray, window: Optional[np.ndarray] = None, out_dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """Pillow's resize of each sample of x [B, C, H, W] (uint8 as DALI made it, any strides, or
    float32 whole numbers): as ``resample.pillow_resize``, ``window`` (top, left, height, width)
    the part of each resized image computed. [B, C, max height, max width] of ``out_dtype``,
    zero past each sample's size."""
    v = [in_hw[:, ::-1], out_hw[:, ::-1], np.reshape(kinds, (-1, 1))]
    v += [] if window is None else [window[:, [1, 0, 3, 2]]]
    return passes(kernel, x, np.concatenate(v, 1).astype(np.int64), boxes[:, [1, 0, 3, 2]], NO_TAIL,
                  np.zeros((2, x.shape[0]), dtype=np.int64), out_dtype,
                  _normalize_constants(NO_TAIL, x.shape[1], x.device))[0]


_ACROSS = [1, 0, 3, 2, 4, 6, 5, 8, 7]  # the columns of ``passes``'s v for the other axis first
_WIDTH_FIRST, _HEIGHT_FIRST = (1, 0), (0, 1)  # each pass's image axis (1: the width), every sample


def passes(kernel, x: torch.Tensor, v: np.ndarray, boxes: np.ndarray, tail: Tail, flips: np.ndarray,
           out_dtype: torch.dtype, constants: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, np.ndarray]:
    """The two passes of each sample in the order Pillow runs them for that image, and each
    sample's (height, width) computed. ``v``: int64 [B, 5 or 9] per sample, (width, height) of
    the input, of the output, the filter, and of a window (left, top, width, height); ``boxes``
    [B, 4] (left, top, right, bottom), C floats; ``flips`` [2, B] (along the width, the height)."""
    first_axes, axes, order = (1,), _WIDTH_FIRST, None  # the image axis of the first passes (1: the width)
    if pw.ORDERS_PASSES:
        order = pw.vertical_first(v[:, 1::-1], v[:, 3:1:-1])
        if order.all():
            v, boxes, first_axes, axes = v[:, _ACROSS[:v.shape[1]]], boxes[:, [1, 0, 3, 2]], (0,), _HEIGHT_FIRST
        elif order.any():  # both orders: each sample's columns in its own
            swap = order[:, None]
            v = np.where(swap, v[:, _ACROSS[:v.shape[1]]], v)
            boxes = np.where(swap, boxes[:, [1, 0, 3, 2]], boxes)
            first_axes, axes = (0, 1), (~order, order)
    vt = v.T  # per pass from here: [first pass, second pass] rows of a column per sample
    windowed = v.shape[1] > 5
    size, start = (vt[7:9], vt[5:7]) if windowed else (vt[2:4], None)
    keys = None
    if boxes[:, :2].any() or (boxes[:, 2:] != v[:, 0:2]).any():  # a box inside the image (the user's)
        bt = boxes.T.astype(np.float64)
        keys = np.stack([vt[0:2], bt[0:2], bt[2:4], vt[2:4], np.broadcast_to(vt[4], (2, len(v)))], 2).reshape(-1, 5)
    block = _table(kept_tables(x.device), vt[0:2], vt[2:4], vt[4], keys, size, start, axes, flips)
    hw = size.T if first_axes == (0,) else size[::-1].T  # each sample's (height, width)
    if len(first_axes) == 2:
        hw = np.where(order[:, None], size.T, hw)
    return _launch(kernel, x, block, first_axes, tail, out_dtype, constants), np.ascontiguousarray(hw)


def _table(kept: KeptTables, ins: np.ndarray, outs: np.ndarray, kinds: np.ndarray, keys: Optional[np.ndarray],
           size: np.ndarray, start: Optional[np.ndarray], axes, flips: np.ndarray) -> np.ndarray:
    """Both passes' blocks, int64 [2, META + ROWS * B]: room for the addresses and strides
    (``_launch`` writes them), then the rows [ROWS, B], from per-pass [2, B] arrays (first pass,
    second): input and output extents, the extents computed (``size``: the window's, or the
    outputs) and where they start (None: at 0), each pass's image axis (1: the width; a number,
    or one per sample), the second pass's flips [2, B]; the tables' keys as rows
    (``KeptTables.locate_rows``; None: whole images, located by ``ins``, ``outs``, ``kinds``)."""
    b = ins.shape[1]
    block = np.empty((2, META + ROWS * b), dtype=np.int64)
    t = block[:, META:].reshape(2, ROWS, b)
    where = kept.locate_whole(ins, outs, kinds) if keys is None else kept.locate_rows(keys).reshape(4, 2, b)
    t[:, :4] = where.transpose(1, 0, 2)
    if start is not None:  # the window's first output pixel: an offset into the tables
        t[:, FIRST] += start
        t[:, WEIGHTS] += start * t[:, TAPS]
    t[:, N_OUT] = size
    t[0, N_ACROSS] = ins[1]  # the first pass: every line of the image across it
    t[1, N_ACROSS] = size[0]  # the second: the first one's outputs
    t[0, ALONG_WIDTH], t[1, ALONG_WIDTH] = axes
    t[:, N_IN] = ins
    t[0, FLIP_X:] = 0
    t[1, FLIP_X:] = flips
    return block


GRAPHS = LaunchGraphs("exact resize")
_FLOATS = {torch.uint8: False, torch.float32: True}  # the element types the kernel reads and writes


def _launch(kernel, x: torch.Tensor, block: np.ndarray, first_axes: Tuple[int, ...], tail: Tail,
            out_dtype: torch.dtype, constants: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The two launches on the blocks of ``_table`` (replayed as a CUDA graph where one was
    captured for this shape: ``launch_graphs``); ``first_axes``: the image axes the samples'
    first passes run along (one of them, or both)."""
    b, c, dev = x.shape[0], x.shape[1], x.device
    t = block[:, META:].reshape(2, ROWS, b)
    extents = t[:, N_OUT:N_ACROSS + 1]
    (out1, across1), (out2, across2) = extents.max(2).tolist()
    if len(first_axes) == 1:  # every sample in one order: the extents are the passes' own
        middle_hw = (across1, out1) if first_axes[0] == 1 else (out1, across1)
        out_hw = (out2, across2) if first_axes[0] == 1 else (across2, out2)
    else:  # a pass's extents are an image axis for some samples and the other for the rest
        along_width = t[0, ALONG_WIDTH] == 1
        middle = np.where(along_width, t[0, [N_ACROSS, N_OUT]], t[0, [N_OUT, N_ACROSS]])
        done = np.where(along_width, t[1, [N_OUT, N_ACROSS]], t[1, [N_ACROSS, N_OUT]])
        middle_hw, out_hw = tuple(middle.max(1).tolist()), tuple(done.max(1).tolist())
    middle = torch.empty((b, c, *middle_hw), dtype=torch.uint8, device=dev)
    one_size = extents[1].min(1).tolist() == [out2, across2]  # else the padding is zeroed
    out = (torch.empty if one_size else torch.zeros)((b, c, *out_hw), dtype=out_dtype, device=dev)
    kept = kept_tables(dev)
    block[0, :META] = (x.data_ptr(), middle.data_ptr(), kept.first.data_ptr(), kept.weights.data_ptr(),
                       *x.stride(), *middle.stride())
    block[1, :META] = (middle.data_ptr(), out.data_ptr(), kept.first.data_ptr(), kept.weights.data_ptr(),
                       *middle.stride(), *out.stride())
    mean_t, std_t = constants
    floats = (_FLOATS[x.dtype], _FLOATS[out_dtype])

    def launches(on_device: torch.Tensor, grids) -> None:
        for p in (0, 1):
            last = p == 1
            kernel[grids[p]](on_device[p], mean_t, std_t, c, b, tail.scale if last else 1.0,
                             SRC_FLOAT=floats[0] and not last, DST_FLOAT=floats[1] and last,
                             AFFINE=tail.affine if last else NO_AFFINE, NORMALIZE=tail.mean is not None and last,
                             META=META, BLOCK_O=BLOCK, BLOCK_A=BLOCK, num_warps=4, enable_fp_fusion=False)

    blocks = [[-(-e // BLOCK) for e in pair] for pair in ((out1, across1), (out2, across2))]
    spare = [tuple([b * c] + [-(-n // GRID_STEP) * GRID_STEP for n in pair]) for pair in blocks]  # a graph's grid
    key = (dev.index, b, c, *spare, floats, tail.affine, tail.mean is not None, tail.scale,  # a graph is per device
           mean_t.data_ptr(), std_t.data_ptr())
    if not GRAPHS.run(key, block, dev, lambda on_device: launches(on_device, spare)):
        launches(upload(block, dev), [(b * c, *pair) for pair in blocks])
    return out


GRID_STEP = 4  # a graph's grid has room for extents up to the next multiple of this many blocks


def _normalize_constants(tail: Tail, channels: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Normalize's mean and std for every channel (one value broadcasts, as in torch), on the device."""
    normalize = tail.mean is not None
    return (constant(_per_channel(tail.mean if normalize else (0.0,), channels), device).view(-1),
            constant(_per_channel(tail.std if normalize else (1.0,), channels), device).view(-1))


def _per_channel(values: Tuple[float, ...], channels: int) -> Tuple[float, ...]:
    values = tuple(float(v) for v in values)
    return values * channels if len(values) == 1 else values
