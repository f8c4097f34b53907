"""Pillow's resize of a batch in two Triton launches (a graph replay), the chain's end in the second.

The stage runs on the pipeline's thread, in the main process, under the GIL that the training
loop, the loader and the pin-memory thread share: every host microsecond it spends is taken
from them (at 8 workers the main process is GIL-bound, and the resize's host time costs
throughput one for one). So a batch costs the host a fixed few steps, whatever its samples:

- each sample's two passes in the order Pillow runs them for that image (``ORDERS_PASSES``),
  one launch per pass for the whole batch: the kernel reads per sample which axis it resamples;
- the stage's run (``ResizeRun``: the resize, the crop after it, the tail) prepared once per
  stage and position: a batch reads every column it needs with one index of its params rows;
- for BILINEAR, BICUBIC and BOX (``computed``), those columns are all the kernel reads: it
  derives each sample's extents, axes, window and flips from them and computes Pillow's
  weights for each output pixel itself, so the host only sizes the outputs and sends the
  columns; for the other filters (``passes``) both passes' rows are built by whole-array numpy
  calls and their tables located (``KeptTables.locate_whole``: a sorted search of codes);
- everything that changes between batches (those values, the tensors' addresses and strides)
  goes in one block, one copy: the two launches are one replay of a CUDA graph for every batch
  of a shape after its first (``launch_graphs``);
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
from dali_autoproxy.backends.torch_stage.kept_tables import Located, kept_tables
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
# the params columns that _triton_resample.resample_computed reads per sample (float64), in this
# order, after both passes' META values: then the window's (left, top, width, height) where the
# resize has one, then the flips' coins (along the width, then the height)
COMPUTED_COLUMNS = ("in_width", "in_height", "out_width", "out_height", "filter",
                    "box_left", "box_top", "box_right", "box_bottom")
IN_W, IN_H, OUT_W, OUT_H, FILTER = range(5)
BOX, WINDOW = 5, 9


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


def window_inside(start: np.ndarray, extent: np.ndarray, bounds: np.ndarray) -> bool:
    """Whether a crop is a window of the resize before it: every sample's box (its start and
    extent, [B, 2], in the axis order of ``bounds``) inside its resized image (``bounds``). A
    crop that pads is the crop's own kernel's."""
    return bool((start >= 0).all() and (start + extent <= bounds).all())


class ResizeRun:
    """The stage's run from a PillowResize at ops[k]: the resize, the Crop right after it as its
    window (CenterCrop after Resize: only the crop's pixels are resampled) and the ``Tail`` its
    second pass does, prepared once for the stage (``Batch.prepared``): a batch reads its
    columns (``COMPUTED_COLUMNS``, the window's, the flips') with one index of its params rows."""

    def __init__(self, ops: Sequence[object], k: int, integer: bool) -> None:
        op: PillowResize = ops[k]
        j = k + 1
        self.crop: Optional[Crop] = ops[j] if j < len(ops) and type(ops[j]) is Crop else None
        j += self.crop is not None
        self.tail, self.end = Tail.of(ops, j, integer)
        cols = [op.col(n) for n in COMPUTED_COLUMNS]
        if self.crop is not None:
            cols += [self.crop.col(n) for n in ("left", "top", "width", "height")]
        self.cols = np.array(cols + list(self.tail.flip_x) + list(self.tail.flip_y))
        self._constants: Dict[torch.device, Tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, kernels, x: torch.Tensor, batch: Batch, out_dtype: torch.dtype
                 ) -> Optional[Tuple[torch.Tensor, np.ndarray]]:
        """The batch resized (and windowed, and its tail done), and each sample's (height,
        width); None where the window leaves a resized image (the crop pads: its own kernel's).
        ``kernels``: the module of the Triton kernels."""
        g = batch.host[:, self.cols]
        hi, lo = g.max(0), g.min(0)
        windowed = self.crop is not None
        if windowed and not window_inside(g[:, WINDOW:WINDOW + 2], g[:, WINDOW + 2:WINDOW + 4], g[:, OUT_W:OUT_H + 1]):
            return None
        if x.device not in self._constants:
            self._constants[x.device] = _normalize_constants(self.tail, x.shape[1], x.device)
        constants = self._constants[x.device]
        if _computable(kernels, lo, hi):
            return computed(kernels.resample_computed, x, g, hi, lo, windowed, self.tail, out_dtype, constants)
        v = g[:, list(range(BOX)) + list(range(WINDOW, WINDOW + 4 * windowed))].astype(np.int64)
        return passes(kernels.resample_pass, x, v, g[:, BOX:BOX + 4].astype(np.float32), self.tail,
                      self.tail.flips(batch.host), out_dtype, constants)


def _computable(kernels, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether every sample's filter is one whose weights the kernel computes."""
    return kernels.FIRST_COMPUTED <= lo[FILTER] and hi[FILTER] <= kernels.LAST_COMPUTED


def two_passes(kernels, x: torch.Tensor, in_hw: np.ndarray, out_hw: np.ndarray, kinds: np.ndarray,
               boxes: np.ndarray, window: Optional[np.ndarray] = None, out_dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """Pillow's resize of each sample of x [B, C, H, W] (uint8 as DALI made it, any strides, or
    float32 whole numbers): as ``resample.pillow_resize``, ``window`` (top, left, height, width)
    the part of each resized image computed. [B, C, max height, max width] of ``out_dtype``,
    zero past each sample's size. ``kernels``: the module of the Triton kernels."""
    v = [in_hw[:, ::-1], out_hw[:, ::-1], np.reshape(kinds, (-1, 1)), boxes[:, [1, 0, 3, 2]]]
    v += [] if window is None else [window[:, [1, 0, 3, 2]]]
    g = np.concatenate(v, 1).astype(np.float64)
    constants = _normalize_constants(NO_TAIL, x.shape[1], x.device)
    hi, lo = g.max(0), g.min(0)
    if _computable(kernels, lo, hi):
        return computed(kernels.resample_computed, x, g, hi, lo, window is not None, NO_TAIL, out_dtype, constants)[0]
    v = g[:, [k for k in range(g.shape[1]) if not BOX <= k < BOX + 4]].astype(np.int64)
    return passes(kernels.resample_pass, x, v, g[:, BOX:BOX + 4], NO_TAIL,
                  np.zeros((2, x.shape[0]), dtype=np.int64), out_dtype, constants)[0]


def computed(kernel, x: torch.Tensor, g: np.ndarray, hi: np.ndarray, lo: np.ndarray, windowed: bool, tail: Tail,
             out_dtype: torch.dtype, constants: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, np.ndarray]:
    """The two passes of each sample, the kernel computing its weights (``resample_computed``),
    and each sample's (height, width) computed. ``g``: [B, K], each sample's columns
    (any numbers: params rows) in the kernel's order (``COMPUTED_COLUMNS``; the window's, where
    ``windowed``; the tail's flips), ``hi`` and ``lo`` their maxima and minima. The host only sizes the outputs."""
    b, c = x.shape[0], x.shape[1]
    sw, sh = (WINDOW + 2, WINDOW + 3) if windowed else (OUT_W, OUT_H)
    size_w, size_h, in_w, in_h = (int(hi[k]) for k in (sw, sh, IN_W, IN_H))
    order = pw.vertical_first(g[:, [IN_H, IN_W]], g[:, [OUT_H, OUT_W]]) if pw.ORDERS_PASSES else None
    if order is None or not order.any():  # each pass's (outputs, lines across them), and the middle's (h, w)
        extents, middle_hw = ((size_w, in_h), (size_h, size_w)), (in_h, size_w)
    elif order.all():
        extents, middle_hw = ((size_h, in_w), (size_w, size_h)), (size_h, in_w)
    else:
        def most(first, second) -> int:
            return int(np.where(order, g[:, first], g[:, second]).max())
        extents = ((most(sh, sw), most(IN_W, IN_H)), (most(sw, sh), most(sh, sw)))
        middle_hw = (most(sh, IN_H), most(IN_W, sw))
    middle = torch.empty((b, c, *middle_hw), dtype=torch.uint8, device=x.device)
    one_size = lo[sw] == size_w and lo[sh] == size_h  # else the padding is zeroed
    out = (torch.empty if one_size else torch.zeros)((b, c, size_h, size_w), dtype=out_dtype, device=x.device)
    block = np.empty(2 * META + g.size, dtype=np.int64)
    block[:META] = (x.data_ptr(), middle.data_ptr(), 0, 0, *x.stride(), *middle.stride())
    block[META:2 * META] = (middle.data_ptr(), out.data_ptr(), 0, 0, *middle.stride(), *out.stride())
    block[2 * META:] = np.ascontiguousarray(g, dtype=np.float64).reshape(-1).view(np.int64)  # as the kernel reads them
    mean_t, std_t = constants
    floats = (_FLOATS[x.dtype], _FLOATS[out_dtype])
    flips = (len(tail.flip_x), len(tail.flip_y))

    def launches(on_device: torch.Tensor, grids) -> None:
        for p in (0, 1):
            last = p == 1
            kernel[grids[p]](on_device, mean_t, std_t, c, b, tail.scale if last else 1.0, PASS=p, K=g.shape[1],
                             WINDOWED=windowed, ORDERS=pw.ORDERS_PASSES, N_FLIP_X=flips[0], N_FLIP_Y=flips[1],
                             SRC_FLOAT=floats[0] and not last, DST_FLOAT=floats[1] and last,
                             AFFINE=tail.affine if last else NO_AFFINE, NORMALIZE=tail.mean is not None and last,
                             META=META, BLOCK_O=BLOCK, BLOCK_A=BLOCK, num_warps=4, enable_fp_fusion=False)

    _replayed_or_launched(launches, x, block, extents, ("computed", g.shape[1], windowed, pw.ORDERS_PASSES, flips,
                                                       floats, tail, mean_t.data_ptr(), std_t.data_ptr()))
    return out, g[:, [sh, sw]].astype(np.int64)


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
    kept = kept_tables(x.device)
    tables = kept.locate_whole(vt[0:2], vt[2:4], vt[4]) if keys is None else kept.locate_rows(keys)
    block = pass_blocks(tables.where, vt[0:2], size, start, axes, flips)
    hw = size.T if first_axes == (0,) else size[::-1].T  # each sample's (height, width)
    if len(first_axes) == 2:
        hw = np.where(order[:, None], size.T, hw)
    return launch(kernel, x, block, tables, first_axes, tail, out_dtype, constants), np.ascontiguousarray(hw)


def pass_blocks(where: np.ndarray, ins: np.ndarray, size: np.ndarray, start: Optional[np.ndarray], axes,
                flips: np.ndarray) -> np.ndarray:
    """Both passes' blocks, int64 [2, META + ROWS * B]: room for the addresses and strides
    (``launch`` writes them), then the rows [ROWS, B], from per-pass [2, B] arrays (first pass,
    second): the tables' offsets, taps and output sizes (``where``: [4, 2 * B] or [4, 2, B], as
    ``KeptTables`` locates them), input extents, the extents computed (``size``: the window's, or
    the outputs) and where they start (None: at 0), each pass's image axis (1: the width; a
    number, or one per sample), the second pass's flips [2, B]."""
    b = ins.shape[1]
    block = np.empty((2, META + ROWS * b), dtype=np.int64)
    t = block[:, META:].reshape(2, ROWS, b)
    t[:, :4] = where.reshape(4, 2, b).transpose(1, 0, 2)
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


def with_tables(kernel, x: torch.Tensor, tables: Located, ins: np.ndarray, size: np.ndarray) -> torch.Tensor:
    """Both passes, the width first, from tables a caller made in Pillow's form (int32 weights
    at 22 bits, ``tables.where`` [4, 2, B] into its own buffers), nothing after: float32 whole
    numbers [B, C, height, width]. ``ins`` and ``size``: each pass's input and output extents [2, B]."""
    block = pass_blocks(tables.where, ins, size, None, _WIDTH_FIRST, np.zeros((2, ins.shape[1]), dtype=np.int64))
    return launch(kernel, x, block, tables, (1,), NO_TAIL, torch.float32,
                  _normalize_constants(NO_TAIL, x.shape[1], x.device))


GRAPHS = LaunchGraphs("exact resize")
_FLOATS = {torch.uint8: False, torch.float32: True}  # the element types the kernel reads and writes


def launch(kernel, x: torch.Tensor, block: np.ndarray, tables: Located, first_axes: Tuple[int, ...], tail: Tail,
           out_dtype: torch.dtype, constants: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The two launches on the blocks of ``pass_blocks`` (replayed as a CUDA graph where one was
    captured for this shape: ``launch_graphs``), reading ``tables``' buffers; ``first_axes``: the
    image axes the samples' first passes run along (one of them, or both)."""
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
    first, weights = tables.first.data_ptr(), tables.weights.data_ptr()
    block[0, :META] = (x.data_ptr(), middle.data_ptr(), first, weights, *x.stride(), *middle.stride())
    block[1, :META] = (middle.data_ptr(), out.data_ptr(), first, weights, *middle.stride(), *out.stride())
    mean_t, std_t = constants
    floats = (_FLOATS[x.dtype], _FLOATS[out_dtype])

    def launches(on_device: torch.Tensor, grids) -> None:
        for p in (0, 1):
            last = p == 1
            kernel[grids[p]](on_device[p], mean_t, std_t, c, b, tail.scale if last else 1.0,
                             SRC_FLOAT=floats[0] and not last, DST_FLOAT=floats[1] and last,
                             AFFINE=tail.affine if last else NO_AFFINE, NORMALIZE=tail.mean is not None and last,
                             META=META, BLOCK_O=BLOCK, BLOCK_A=BLOCK, num_warps=4, enable_fp_fusion=False)

    _replayed_or_launched(launches, x, block, ((out1, across1), (out2, across2)),
                          ("tables", floats, tail, mean_t.data_ptr(), std_t.data_ptr()))
    tables.hold()
    return out


def _replayed_or_launched(launches, x: torch.Tensor, block: np.ndarray, extents, shape: tuple) -> None:
    """``launches(block on the device, grids)`` of a batch, by a replay of the graph for its
    launch shape (``shape``: what the launches take besides the block and the grids) where one
    was captured (``launch_graphs``), else directly. ``extents``: each pass's (outputs, lines
    across them) at most; a graph's grid has room up to the next multiple of GRID_STEP blocks."""
    b, c, dev = x.shape[0], x.shape[1], x.device
    blocks = [[-(-e // BLOCK) for e in pair] for pair in extents]
    spare = [tuple([b * c] + [-(-n // GRID_STEP) * GRID_STEP for n in pair]) for pair in blocks]
    key = (dev.index, b, c, *spare, *shape)  # a graph is per device
    if not GRAPHS.run(key, block, dev, lambda on_device: launches(on_device, spare)):
        launches(upload(block, dev), [(b * c, *pair) for pair in blocks])


GRID_STEP = 4  # a graph's grid has room for extents up to the next multiple of this many blocks


def _normalize_constants(tail: Tail, channels: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Normalize's mean and std for every channel (one value broadcasts, as in torch), on the device."""
    normalize = tail.mean is not None
    return (constant(_per_channel(tail.mean if normalize else (0.0,), channels), device).view(-1),
            constant(_per_channel(tail.std if normalize else (1.0,), channels), device).view(-1))


def _per_channel(values: Tuple[float, ...], channels: int) -> Tuple[float, ...]:
    values = tuple(float(v) for v in values)
    return values * channels if len(values) == 1 else values
