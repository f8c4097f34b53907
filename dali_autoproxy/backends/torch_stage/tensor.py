"""The tail of a chain on tensors: conversion to float, normalisation, erasing, layout."""
from __future__ import annotations

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.registry import Batch, constant, kernel
from dali_autoproxy.plan.ir import DrawnErase, Erase, Normalize, ToCHW, ToFloat


def _inside(x: torch.Tensor, op, params: torch.Tensor) -> torch.Tensor:
    """Each sample's box of ``op`` as a [B, 1, H, W] mask."""
    top, left, hh, ww = (params[:, op.col(name)].view(-1, 1, 1, 1) for name in ("top", "left", "height", "width"))
    rows = torch.arange(x.shape[2], device=x.device, dtype=params.dtype).view(1, 1, -1, 1)
    cols = torch.arange(x.shape[3], device=x.device, dtype=params.dtype).view(1, 1, 1, -1)
    return (rows >= top) & (rows < top + hh) & (cols >= left) & (cols < left + ww)


def erase(x: torch.Tensor, op: Erase, params: torch.Tensor) -> torch.Tensor:
    return torch.where(_inside(x, op, params), constant(op.value, x.device, x.dtype), x)


@kernel(Erase)
def _erase(x: torch.Tensor, op: Erase, batch: Batch) -> torch.Tensor:
    return erase(x, op, batch.params)


@kernel(DrawnErase)
def _drawn_erase(x: torch.Tensor, op: DrawnErase, batch: Batch) -> torch.Tensor:
    """Every sample's box at once; a batch without a box costs one look at its rows."""
    host = batch.host
    if not host[:, op.col("height")].any():
        return x
    if op.per_pixel:
        generator = torch.Generator(device=x.device)
        generator.manual_seed(int(host[:, op.col("seed")].astype(np.int64).sum()))
        fill = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    else:
        fill = batch.params[:, op.span("c0", "c2")][:, :x.shape[1]].to(x.dtype).view(x.shape[0], -1, 1, 1)
    return torch.where(_inside(x, op, batch.params), fill, x)


@kernel(ToFloat)
def _to_float(x: torch.Tensor, op: ToFloat, batch: Batch) -> torch.Tensor:
    """v1's ToTensor divides (by a tensor on the batch's device: CUDA computes ``x / scalar`` as
    ``x * (1 / scalar)``, a rounding away from the CPU's division); v2's ToDtype multiplies."""
    batch.integer = False
    if op.divide:
        return x / constant([float(round(1 / op.scale))], x.device, x.dtype)
    return x * op.scale


@kernel(Normalize)
def _normalize(x: torch.Tensor, op: Normalize, batch: Batch) -> torch.Tensor:
    return (x - constant(op.mean, x.device)) / constant(op.std, x.device)


@kernel(ToCHW)
def _to_chw(x: torch.Tensor, op: ToCHW, batch: Batch) -> torch.Tensor:
    return x  # the stage works in [B, C, H, W] throughout
