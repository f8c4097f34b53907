"""Pillow's resize as batched torch ops, exact to the last border pixel; and crops on the stage.

What torchvision's ``resize`` and ``resized_crop`` do to a PIL image is Pillow's
``Image.resize``: ImagingResample for BILINEAR, BICUBIC and BOX, its scale-only affine transform
for NEAREST. ImagingResample is separable: for every output column (then row) Pillow computes
the filter's weights in double precision over the input pixels under the filter's support,
*clipped at the image's edge and renormalised* (which is where DALI's resize and every other
GPU library differ: at the border), rounds them to 22-bit fixed point, sums in integers and
rounds the sum to uint8 after each pass: horizontally first, then vertically on that uint8
result (Pillow 13 swaps the two when the height shrinks far more than the width).

Here the weights are Pillow's own (its ``precompute_coeffs`` and ``normalize_coeffs_8bpc`` in the
C's operation order, ``pillow_weights``), one table per (input size, box, output size, filter),
kept in one store per device (``kept_tables``) that every path here reads. Where Triton runs,
the batch's two passes are two launches in int32 (``fused_resize``, the stage's run from a
PillowResize), the kernel computing each output pixel's weights itself in the same float64 steps
(BILINEAR, BICUBIC, BOX) or reading each sample's table from the store (the other filters), the
flips, ToFloat and Normalize after the resize done by the second; elsewhere each pass reads the
store's tables per sample (each output pixel's first input pixel and its weights) and adds tap
by tap in float64, a gather of every output pixel's k-th input pixel per tap: every product and
partial sum is an integer below 2**53, so the sum is exact in any order, and ``(s + 2**21) >> 22``
clipped to 0..255 is Pillow's ``clip8``. (The work is output x taps per line; a dense [output,
input] matrix's product is output x input: minutes on a CPU for a 12000-pixel-wide photo.) Each
sample has its own input box, output size and filter (timm draws bilinear or bicubic per image).
NEAREST is the same sum with one weight of 2**22 per output pixel, at Pillow's scale-affine
source coordinates.
``Image.reduce`` (what ``reducing_gap`` does first) is here too: block sums in Reduce.c's fixed point.

Batches whose samples differ in size arrive padded to the largest (DALI's ``pad``); each kernel
here reads the valid region of each sample from its own row (or ``Batch.sizes``) and leaves the
padding at 0.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color, fused_resize, pillow_weights
from dali_autoproxy.backends.torch_stage.kept_tables import kept_tables
from dali_autoproxy.backends.torch_stage.pillow_weights import vertical_first
from dali_autoproxy.backends.torch_stage.registry import (
    Batch,
    constant,
    fused_pair,
    fused_run,
    kernel,
    upload,
    valid_sizes,
)
from dali_autoproxy.plan.ir import Crop, PillowReduce, PillowResize
from dali_autoproxy.plan.pillow_ops import PillowCall


def _tables(in_sizes: np.ndarray, boxes: np.ndarray, out_sizes: np.ndarray, kinds: np.ndarray, out_max: int,
            device: torch.device):
    """Each sample's Pillow weights in compact form, on ``device``, read from the device's kept
    tables (the one store the kernels read too): the first input pixel of each output pixel
    (int64 [B, out_max]) and its weights (int32 [B, out_max, K]), zero past each sample's own
    output size and taps."""
    keys = np.stack([np.asarray(in_sizes, dtype=np.float64), boxes[:, 0], boxes[:, 1],
                     np.asarray(out_sizes, dtype=np.float64), np.asarray(kinds, dtype=np.float64)], 1)
    located = kept_tables(device).locate_rows(keys)
    first_at, weights_at, taps, outs = (v.view(-1, 1, 1) for v in upload(located.where, device).unbind(0))
    o = torch.arange(out_max, device=device).view(1, -1, 1)
    k = torch.arange(int(located.where[2].max()), device=device).view(1, 1, -1)
    rows = o < outs  # [B, out_max, 1]
    used = rows & (k < taps)
    last_first, last_weight = len(located.first) - 1, len(located.weights) - 1  # slots of no table
    first = located.first[torch.where(rows, first_at + o, last_first).squeeze(2)].long()
    weights = located.weights[torch.where(used, weights_at + o * taps + k, last_weight)]
    located.hold()  # grown or started over meanwhile, the buffers stay until these reads are done
    return torch.where(rows.squeeze(2), first, 0), torch.where(used, weights, 0)


def _triton_kernel(x: torch.Tensor):
    """The module of the Triton resample kernels where the fused kernels run (CUDA, Triton, not
    switched off)."""
    if not fused_color.usable(x):
        return None
    from dali_autoproxy.backends.torch_stage import _triton_resample
    return _triton_resample


def _triton_failed(e: Exception) -> None:
    """A build or launch failure must not stop training: the torch ops serve from now on."""
    fused_color.disable(f"the Triton resample kernel failed ({type(e).__name__}: {e})")


def _clip8(s: torch.Tensor) -> torch.Tensor:
    """Resample.c's clip8 of a sum that started at 1 << 21: (s >> 22) clipped to 0..255."""
    bits = pillow_weights.PRECISION_BITS
    return s.add_(float(1 << (bits - 1))).mul_(2.0 ** -bits).floor_().clamp_(0, 255)


def _two_passes(x: torch.Tensor, in_hw: np.ndarray, out_hw: np.ndarray, kinds: np.ndarray, boxes: np.ndarray,
                columns_first: bool, window: Optional[np.ndarray] = None) -> torch.Tensor:
    out = _two_passes_whole(x, in_hw, out_hw, kinds, boxes, columns_first)
    if window is None:
        return out
    cropped = out.new_zeros((out.shape[0], out.shape[1], int(window[:, 2].max()), int(window[:, 3].max())))
    for i, (top, left, height, width) in enumerate(window.tolist()):
        cropped[i, :, :height, :width] = out[i, :, top:top + height, left:left + width]
    return cropped


def _two_passes_whole(x: torch.Tensor, in_hw: np.ndarray, out_hw: np.ndarray, kinds: np.ndarray,
                      boxes: np.ndarray, columns_first: bool) -> torch.Tensor:
    out_h, out_w = int(out_hw[:, 0].max()), int(out_hw[:, 1].max())
    horizontal = _tables(in_hw[:, 1], boxes[:, 1::2], out_hw[:, 1], kinds, out_w, x.device)
    vertical = _tables(in_hw[:, 0], boxes[:, 0::2], out_hw[:, 0], kinds, out_h, x.device)
    if columns_first:  # the horizontal pass, then the vertical one on its uint8 result
        return _clip8(_one_pass(_clip8(_one_pass(x, 3, *horizontal)), 2, *vertical))
    return _clip8(_one_pass(_clip8(_one_pass(x, 2, *vertical)), 3, *horizontal))


def _one_pass(x: torch.Tensor, dim: int, first: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One pass along ``dim`` (2: down the columns, 3: along the rows) of x [B, C, H, W] (whole
    numbers 0..255, any dtype): float64 sums of each output pixel's taps, ``first`` [B, O] its
    first input pixel and ``weights`` [B, O, K] (zero past its own taps and output size). The
    pass's axis is made the outermost of each sample, so that a tap's input lines are one
    ``index_select`` of whole slabs: on a GPU for the whole batch (K launches a pass), on a CPU
    per sample (its sums stay in the caches while every tap adds to them)."""
    b, outs, taps = weights.shape
    lines = x.movedim(dim, 1).contiguous()  # [B, S, the other two axes]
    size, rest = lines.shape[1], lines.shape[2:]
    out = torch.zeros((b, outs, *rest), dtype=torch.float64, device=x.device)
    weights = weights.to(torch.float64)
    group = b if x.is_cuda else 1
    for lo in range(0, b, group):
        n = min(group, b - lo)
        slabs, sums = lines[lo:lo + n].reshape(n * size, -1), out[lo:lo + n].view(n * outs, -1)
        start = torch.arange(n, device=x.device).mul_(size).view(n, 1)  # each sample's first slab
        for k in range(taps):
            at = (first[lo:lo + n] + k).clamp_(max=size - 1).add_(start).view(-1)  # a zero weight may point anywhere
            sums.addcmul_(slabs.index_select(0, at), weights[lo:lo + n, :, k].reshape(-1, 1))
    return out.movedim(1, dim).contiguous()


def pillow_resize(x: torch.Tensor, in_hw: np.ndarray, out_hw: np.ndarray, kinds: np.ndarray,
                  boxes: Optional[np.ndarray] = None, window: Optional[np.ndarray] = None) -> torch.Tensor:
    """``Image.resize`` of each sample: x [B, C, H, W] of whole numbers 0..255, sample b valid in
    its top-left in_hw[b] = (height, width), its box boxes[b] = (top, left, bottom, right) (C
    floats; None: the whole image) resized to out_hw[b] with Pillow's filter kinds[b];
    out [B, C, max height, max width] (float32, zero past each sample's size). ``window``
    (top, left, height, width) per sample, inside its resized image: that crop of it only."""
    in_hw, out_hw = np.asarray(in_hw, dtype=np.int64), np.asarray(out_hw, dtype=np.int64)
    kinds = np.asarray(kinds, dtype=np.int64)
    if boxes is None:
        boxes = np.concatenate([np.zeros_like(in_hw), in_hw], 1)
    boxes = np.asarray(boxes, dtype=np.float32).astype(np.float64)
    order = vertical_first(in_hw, out_hw)
    kernel = _triton_kernel(x) if not _FORCE_TORCH_OPS else None
    if kernel is not None:
        try:
            return fused_resize.two_passes(kernel, x, in_hw, out_hw, kinds, boxes, window)
        except Exception as e:  # noqa: BLE001 - see _triton_failed
            _triton_failed(e)
    return _by_order(_two_passes, x, in_hw, out_hw, kinds, boxes, order, window)


_FORCE_TORCH_OPS = False  # tests: the float64 products even where Triton runs


def _by_order(two_passes, x, in_hw, out_hw, kinds, boxes, order, window=None) -> torch.Tensor:
    """``two_passes`` on the samples Pillow resizes columns first, then on the others."""
    if not order.any() or order.all():
        return two_passes(x, in_hw, out_hw, kinds, boxes, not order[0], window).to(torch.float32)
    size = out_hw if window is None else window[:, 2:4]
    out = torch.zeros((x.shape[0], x.shape[1], int(size[:, 0].max()), int(size[:, 1].max())),
                      dtype=torch.float32, device=x.device)
    for rows_first in (False, True):
        idx = np.flatnonzero(order == rows_first)
        part = two_passes(x.index_select(0, upload(idx, x.device)), in_hw[idx], out_hw[idx], kinds[idx],
                          boxes[idx], not rows_first, None if window is None else window[idx])
        out[upload(idx, x.device), :, :part.shape[2], :part.shape[3]] = part.to(out.dtype)
    return out


@kernel(PillowResize)
def _pillow_resize(x: torch.Tensor, op: PillowResize, batch: Batch) -> torch.Tensor:
    p = batch.host[:, op.span("in_height", "filter")].astype(np.int64)
    out = pillow_resize(x, p[:, 0:2], p[:, 2:4], p[:, 4], batch.host[:, op.span("box_top", "box_right")])
    batch.sizes = p[:, 2:4]
    return out


def _window(op: PillowResize, crop: Crop, batch: Batch) -> Optional[np.ndarray]:
    """The crop's boxes (top, left, height, width) as the resize's window, where every box lies
    inside its resized image (a crop that pads is the crop's own kernel's)."""
    out_hw = batch.host[:, op.span("out_height", "out_width")].astype(np.int64)
    window = batch.host[:, crop.span("top", "width")].astype(np.int64)
    return window if fused_resize.window_inside(window[:, :2], window[:, 2:], out_hw) else None


@fused_run(PillowResize)
def _resize_and_tail(x: torch.Tensor, ops: list, k: int, batch: Batch) -> Optional[Tuple[torch.Tensor, int]]:
    """Where Triton runs: the resize (with the crop after it as its window) and the flips,
    ToFloat and Normalize that follow, in two launches (``fused_resize``)."""
    kernel = _triton_kernel(x) if not _FORCE_TORCH_OPS else None
    if kernel is None:
        return None
    key = (_resize_and_tail, k, batch.integer)
    run = batch.prepared.get(key)
    if run is None:
        run = batch.prepared[key] = fused_resize.ResizeRun(ops, k, batch.integer)
    out_dtype = torch.uint8 if run.tail.integer and run.end == len(ops) else torch.float32
    try:
        done = run(kernel, x, batch, out_dtype)
    except Exception as e:  # noqa: BLE001 - see _triton_failed
        _triton_failed(e)
        return None
    if done is None:
        return None
    out, batch.sizes = done
    batch.integer = run.tail.integer
    return out, run.end


@fused_pair(PillowResize, Crop)
def _pillow_resize_then_crop(x: torch.Tensor, op: PillowResize, crop: Crop, batch: Batch) -> Optional[torch.Tensor]:
    """A crop inside every resized image (CenterCrop after Resize) as the resize's window: only
    the crop's pixels are resampled. A crop that reaches past an image (padding) is left to
    the crop's own kernel."""
    p = batch.host[:, op.span("in_height", "filter")].astype(np.int64)
    window = _window(op, crop, batch)
    if window is None:
        return None
    out = pillow_resize(x, p[:, 0:2], p[:, 2:4], p[:, 4], batch.host[:, op.span("box_top", "box_right")], window)
    batch.sizes = window[:, 2:4]
    return out


def _reduce_multipliers(largest: int) -> np.ndarray:
    """Reduce.c's division_UINT32(n, 8) for n = 0..largest: (UINT32)(2**32 as a float / (256 n) as a
    float), in single precision as the C computes it (n = 0 unused)."""
    n = np.arange(largest + 1, dtype=np.float32)
    with np.errstate(divide="ignore"):
        return np.where(n > 0, np.float32(2.0 ** 32) / (np.float32(256) * n), 0).astype(np.int64)


def pillow_reduce(x: torch.Tensor, in_hw: np.ndarray, factors: np.ndarray) -> torch.Tensor:
    """``Image.reduce`` of each sample: x [B, C, H, W] of whole numbers, sample b valid in its
    top-left in_hw[b], reduced by factors[b] = (y, x): out pixel = ((sum + n // 2) * m(n)) >> 24 in
    32-bit unsigned arithmetic over the n pixels of its block (whole blocks, then the last column,
    row and corner with fewer); [B, C, max height, max width], zero past each sample's size."""
    b, c = x.shape[0], x.shape[1]
    out_hw = (in_hw + factors - 1) // factors
    out = torch.zeros((b, c, int(out_hw[:, 0].max()), int(out_hw[:, 1].max())), dtype=torch.float32,
                      device=x.device)
    for fy, fx in {(int(a), int(d)) for a, d in factors}:
        rows = np.flatnonzero((factors[:, 0] == fy) & (factors[:, 1] == fx))
        sub, hw = x.index_select(0, upload(rows, x.device)), in_hw[rows]
        oh, ow = int(out_hw[rows, 0].max()), int(out_hw[rows, 1].max())
        dev = sub.device
        size = upload(hw, dev)
        ys = torch.arange(oh * fy, device=dev).view(1, -1, 1)
        xs = torch.arange(ow * fx, device=dev).view(1, 1, -1)
        valid = (ys < size[:, 0].view(-1, 1, 1)) & (xs < size[:, 1].view(-1, 1, 1))
        padded = torch.zeros((len(rows), c, oh * fy, ow * fx), dtype=torch.float32, device=dev)
        h, w = min(oh * fy, sub.shape[2]), min(ow * fx, sub.shape[3])
        padded[:, :, :h, :w] = sub[:, :, :h, :w].to(torch.float32)
        padded = torch.where(valid.unsqueeze(1), padded, 0.0)
        sums = padded.view(len(rows), c, oh, fy, ow, fx).sum((3, 5)).to(torch.int64)  # exact: integers < 2**24
        counts = valid.to(torch.int64).view(len(rows), oh, fy, ow, fx).sum((2, 4)).unsqueeze(1)
        mult = upload(_reduce_multipliers(fy * fx), dev)[counts]
        reduced = ((((sums + counts // 2) * mult) & 0xFFFFFFFF) >> 24).to(torch.float32)
        reduced = torch.where(counts > 0, reduced, 0.0)
        out[upload(rows, x.device), :, :oh, :ow] = reduced
    return out


@kernel(PillowReduce)
def _pillow_reduce(x: torch.Tensor, op: PillowReduce, batch: Batch) -> torch.Tensor:
    p = batch.host[:, op.span("in_height", "factor_x")].astype(np.int64)
    in_hw, factors = p[:, 0:2], p[:, 2:4]
    if (factors == 1).all():
        return x
    out = pillow_reduce(x, in_hw, factors)
    batch.sizes = (in_hw + factors - 1) // factors
    return out


@kernel(Crop)
def _crop(x: torch.Tensor, op: Crop, batch: Batch) -> torch.Tensor:
    """Each sample's box [top, left, height, width] of its valid region; outside it ``op.fill``
    (how Pad and padded crops are expressed), past the box's own size (samples of other sizes) 0."""
    return crop_boxes(x, batch.host[:, op.span("top", "width")].astype(np.int64), op.fill, batch)


SLICED_CROP_PIXELS = 1 << 20  # crops to boxes this large (a canvas) are copied sample by sample: the
# per-sample launches are small beside the copies, and the gather's index tensors and passes are not
SLICED_CROP_SAMPLES = 4  # so are batches this small: two copies per sample launch fewer kernels, and
# cost the stage's thread less host time, than the gather's dozen ops and its copy of the boxes


def crop_boxes(x: torch.Tensor, boxes: np.ndarray, fill: Tuple[float, ...], batch: Batch) -> torch.Tensor:
    """The crop of each sample's box (int64 [B, 4]: top, left, height, width) of its valid region,
    ``fill`` outside the region, 0 past the box; ``batch.sizes`` becomes the boxes' sizes."""
    sizes = valid_sizes(x, batch)
    n, c = x.shape[0], x.shape[1]
    out_h, out_w = int(boxes[:, 2].max()), int(boxes[:, 3].max())
    dev = x.device
    values = [float(v) for v in fill]
    fill = constant(values if len(values) == c else values[:1] * c, dev, x.dtype).view(-1)
    batch.sizes = boxes[:, 2:4]
    if out_h * out_w >= SLICED_CROP_PIXELS or n <= SLICED_CROP_SAMPLES:  # a canvas (RandomZoomOut), a few
        # samples (detection and segmentation train at 2-8 per GPU): copies, not a gather
        return _crop_by_slices(x, boxes, sizes, fill, out_h, out_w)
    top, left, height, width, valid_h, valid_w = (v.view(n, 1) for v in upload(
        np.concatenate([boxes, sizes], 1), dev).unbind(1))  # the masks are made on the device from these
    rows, cols = torch.arange(out_h, device=dev).view(1, -1), torch.arange(out_w, device=dev).view(1, -1)
    ys, xs = top + rows, left + cols  # [B, out_h], [B, out_w]
    in_box = ((rows < height).unsqueeze(2) & (cols < width).unsqueeze(1)).unsqueeze(-1)
    inside = (((ys >= 0) & (ys < valid_h)).unsqueeze(2) & ((xs >= 0) & (xs < valid_w)).unsqueeze(1)).unsqueeze(-1)
    yi, xi = ys.clamp(0, x.shape[2] - 1), xs.clamp(0, x.shape[3] - 1)
    bi = torch.arange(n, device=dev).view(n, 1, 1)
    picked = x.permute(0, 2, 3, 1)[bi, yi[:, :, None], xi[:, None, :]]  # [B, out_h, out_w, C]
    out = torch.where(inside, picked, torch.where(in_box, fill, torch.zeros((), dtype=x.dtype, device=dev)))
    return out.permute(0, 3, 1, 2).contiguous()


def _crop_by_slices(x: torch.Tensor, boxes: np.ndarray, sizes: np.ndarray, fill: torch.Tensor,
                    out_h: int, out_w: int) -> torch.Tensor:
    """The same crop as two copies per sample: the fill over its box, then the part of its image
    inside the box. One pass over the output, where the gather makes several."""
    out = x.new_zeros((x.shape[0], x.shape[1], out_h, out_w))
    for i, ((top, left, height, width), (valid_h, valid_w)) in enumerate(zip(boxes.tolist(), sizes.tolist())):
        y0, x0 = max(top, 0), max(left, 0)
        y1, x1 = min(top + height, valid_h), min(left + width, valid_w)
        if y0 > top or x0 > left or y1 < top + height or x1 < left + width:  # part of the box is outside
            out[i, :, :height, :width] = fill.view(-1, 1, 1)
        if y1 > y0 and x1 > x0:
            out[i, :, y0 - top:y1 - top, x0 - left:x1 - left] = x[i, :, y0:y1, x0:x1]
    return out


def _idle(op: object, batch: Batch) -> bool:
    """A recorded-call position that no sample of this batch used (its kernel changes nothing)."""
    return isinstance(op, PillowCall) and not (batch.host[:, op.col("call")] > 0).any()


@fused_run(Crop)
def crop_through_crop(x: torch.Tensor, ops: list, k: int, batch: Batch) -> Optional[Tuple[torch.Tensor, int]]:
    """Op k, a Crop, and the next Crop after positions no sample used, as one crop where every
    second box lies inside the first (RandomZoomOut's canvas, then RandomIoUCrop inside it): the
    pixels are the first box's at the offset of the second, its fill outside the image, the
    canvas never made. Returns the batch and the index of the op after the second crop, or None."""
    j = k + 1
    while j < len(ops) and _idle(ops[j], batch):
        j += 1
    if j >= len(ops) or type(ops[j]) is not Crop or type(ops[k]) is not Crop:
        return None
    first = batch.host[:, ops[k].span("top", "width")].astype(np.int64)
    second = batch.host[:, ops[j].span("top", "width")].astype(np.int64)
    inside = ((second[:, :2] >= 0) & (second[:, :2] + second[:, 2:] <= first[:, 2:])).all()
    if not inside or (second[:, 2:] <= 0).any():
        return None
    boxes = np.concatenate([first[:, :2] + second[:, :2], second[:, 2:]], 1)
    return crop_boxes(x, boxes, ops[k].fill, batch), j + 1

