"""The resize of tensor images by torchvision's own kernel (ir.TensorResize).

torchvision resizes a uint8 tensor with torch's arithmetic: v2's bilinear antialiased kernel in
16-bit fixed point on the CPU, the others in float32 rounded back (v1 always). DALI's resize
computes otherwise (up to ~16 levels at the borders), so where the chain asks for torchvision's
results (``resize="pillow"``) or for a filter DALI lacks on tensors (bicubic with torch's
a = -0.75, torch's legacy nearest), the stage calls torchvision's own function on the samples,
grouped by input and output size, laid out as torchvision sees an image made a tensor from a
PIL image (channels last): on DALI's CPU backend the very same arithmetic. On a GPU, where
torchvision computes in float32, v2's uint8 resizes that the workers' CPU runs in integers take
the same integer arithmetic as torch ops (``uint8_resize``); the others torch's CUDA kernels.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import uint8_resize
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, upload
from dali_autoproxy.plan.ir import TensorResize


def torchvision_resize(api: str) -> Callable[..., torch.Tensor]:
    """``run(images, [height, width], interpolation value, antialias)``: v1's ``F.resize`` or v2's
    ``resize_image`` on a batch of tensor images."""
    from torchvision.transforms import InterpolationMode
    if api == "v2":
        from torchvision.transforms.v2.functional import resize_image as resize
    else:
        from torchvision.transforms.functional import resize

    def run(images: torch.Tensor, size: List[int], interpolation: str, antialias) -> torch.Tensor:
        return resize(images, size, interpolation=InterpolationMode(interpolation), antialias=antialias)
    return run


@contextlib.contextmanager
def _as_in_a_worker(x: torch.Tensor) -> Iterator[None]:
    """On the CPU, torch's threads as a DataLoader worker has them (one): its float resize
    splits rows between threads, and where the split falls moves a rounding (with OpenMP the
    setting is this thread's own)."""
    if x.is_cuda:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@kernel(TensorResize)
def _tensor_resize(x: torch.Tensor, op: TensorResize, batch: Batch) -> torch.Tensor:
    """Each sample's valid region (a padded batch's top-left corner) resized, its values in the
    dtype torchvision sees (uint8 while the batch holds whole numbers); the outputs as one batch,
    padded where their sizes differ (``batch.sizes``)."""
    sizes = batch.host[:, op.span("in_height", "out_width")].astype(np.int64)
    dtype = torch.uint8 if batch.integer else x.dtype
    integers = (x.is_cuda and op.api == "v2" and dtype == torch.uint8
                and uint8_resize.cpu_resizes_natively(op.interpolation))
    groups: Dict[Tuple[int, ...], List[int]] = {}  # the integer path takes any input sizes together
    for i, key in enumerate(map(tuple, sizes[:, 2:] if integers else sizes)):
        groups.setdefault(key, []).append(i)
    out_hw = sizes[:, 2:]
    oh, ow = int(out_hw[:, 0].max()), int(out_hw[:, 1].max())
    out = torch.zeros((x.shape[0], x.shape[1], oh, ow), dtype=torch.float32, device=x.device)
    for key, rows in groups.items():
        index = upload(np.asarray(rows), x.device)
        h, w = key[-2:]
        if integers:
            resized = uint8_resize.resize(x.index_select(0, index), sizes[rows, :2], [h, w], op.interpolation,
                                          bool(op.antialias))
            out[:, :, :h, :w].index_copy_(0, index, resized.to(torch.float32))
            continue
        ih, iw = key[:2]
        if (ih, iw) == (h, w):  # torchvision returns the image as it is
            out[:, :, :h, :w].index_copy_(0, index, x.index_select(0, index)[:, :, :h, :w].to(torch.float32))
            continue
        # laid out as a PIL image made a tensor is (pil_to_tensor's channels-last strides): torch's
        # float kernels take another path, with other roundings, on a contiguous CHW tensor
        images = x.index_select(0, index)[:, :, :ih, :iw].to(dtype).contiguous(memory_format=torch.channels_last)
        with _as_in_a_worker(x):
            resized = torchvision_resize(op.api)(images, [h, w], op.interpolation, op.antialias)
        out[:, :, :h, :w].index_copy_(0, index, resized.to(torch.float32))
    batch.sizes = None if len(groups) == 1 or bool((out_hw == out_hw[0]).all()) else out_hw
    return out
