"""Pillow's ColorJitter as one Triton kernel per batch, where Triton runs (CUDA).

The torch-op version in ``color.py`` is exact but launches ~100 small kernels per batch, and
its ~4 ms of host time on the main thread limited heavy-augmentation loaders. Here one program
per sample walks that sample's own drawn order: brightness, contrast (a mean-luma pass, then
the blend), saturation and hue (the two lookup tables of ``color.hue_tables``), each a pass
over the sample in place. Same arithmetic as ``color.py`` step for step, float32 without
fused multiply-adds (``enable_fp_fusion=False``), integers where Pillow uses integers, so the
values are equal (tests/test_fused_color.py runs the kernel in Triton's interpreter on the CPU
and on the GPU against the torch ops).

Where Triton is missing or the kernel fails to build, ``color.py``'s torch ops run instead
(logged once); ``DALI_AUTOPROXY_TRITON=0`` asks for them.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import numpy as np
import torch

log = logging.getLogger("dali_autoproxy")

_STATE = {"usable": None}  # None: not tried yet; then True/False
_KERNEL = None


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernel serves this batch: a CUDA tensor, Triton importable and not
    switched off, and no earlier failure to build."""
    if not x.is_cuda or _STATE["usable"] is False:
        return False
    if _STATE["usable"] is None:
        _STATE["usable"] = _load() is not None
    return bool(_STATE["usable"])


def _load():
    """The Triton kernel, built on first use (None where Triton is missing or switched off)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    if os.environ.get("DALI_AUTOPROXY_TRITON", "1").strip().lower() in ("0", "false", "no", "off"):
        log.info("DALI_AUTOPROXY_TRITON=0: ColorJitter runs as torch ops")
        return None
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: use the torch ops
        log.info("Triton is not available (%s): ColorJitter runs as torch ops", e)
        return None
    from ._triton_color import jitter
    _KERNEL = jitter
    return _KERNEL


def color_jitter(x: torch.Tensor, order: np.ndarray, factors: torch.Tensor, shift: torch.Tensor,
                 tables) -> Optional[torch.Tensor]:
    """x: [B, 3, H, W] float32 whole numbers (any strides); order: host int [B, 4] of steps
    (0 brightness, 1 contrast, 2 saturation, 3 hue, -1 none); factors: [B, 3] float32; shift:
    [B] int32 hue shifts; tables: ``hue_tables(device)``. Returns a new contiguous batch, or
    None if the kernel failed (the caller then runs the torch ops)."""
    kernel = _load()
    b, c, h, w = x.shape
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    order_t = torch.as_tensor(np.ascontiguousarray(order, dtype=np.int32))
    if x.is_cuda:
        order_t = order_t.pin_memory().to(x.device, non_blocking=True)
    to_hs, to_rgb = tables
    sb, sc, sh, sw = x.stride()
    try:
        kernel[(b,)](x, out, order_t, factors.contiguous(), shift.contiguous(), to_hs, to_rgb,
                     w, h * w, sb, sc, sh, sw, BLOCK=1024, num_warps=8, enable_fp_fusion=False)
    except Exception as e:  # noqa: BLE001 - a build or launch failure must not stop training
        _STATE["usable"] = False
        log.warning("the fused ColorJitter kernel failed (%s: %s): ColorJitter runs as torch ops",
                    type(e).__name__, e)
        return None
    return out
