"""ColorJitter as one Triton kernel per batch, where Triton runs (CUDA): on PIL images
(Pillow's maths, ``color.py``) and on uint8 tensor images (torchvision v2's, ``tensor_jitter.py``).

The torch-op versions are exact but launch ~100 small kernels per batch, and their host time
(~3-10 ms per batch of 128) limited augmentation-heavy loaders. Here one program per sample
walks that sample's own drawn order: brightness, contrast (a mean pass, then the blend),
saturation and hue, each a pass over the sample in place. The same arithmetic step for step:
float32 without contracted multiply-adds (``enable_fp_fusion=False``) where torch rounds each
step, ATen's fused multiply-add where it fuses (``add_(x, alpha=)``), integers where Pillow uses
integers, correctly rounded divisions. tests/test_fused_color.py compares both kernels with
torchvision, in Triton's interpreter on the CPU and compiled on the GPU.

Where Triton is missing or a kernel fails to build, the torch ops run instead (logged once);
``DALI_AUTOPROXY_TRITON=0`` asks for them.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import numpy as np
import torch

log = logging.getLogger("dali_autoproxy")

_STATE = {"usable": None}  # None: not tried yet; then True/False
_KERNELS = None  # the module of Triton kernels, once imported


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernels serve this batch: a CUDA tensor, Triton importable and not
    switched off, and no earlier failure to build."""
    if not x.is_cuda or _STATE["usable"] is False:
        return False
    if _STATE["usable"] is None:
        _STATE["usable"] = _load() is not None
    return bool(_STATE["usable"])


def _load():
    """The kernels' module, imported on first use (each kernel is compiled on its first call);
    None where Triton is missing or switched off."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    if os.environ.get("DALI_AUTOPROXY_TRITON", "1").strip() == "0":  # validated by enable() (config)
        log.info("DALI_AUTOPROXY_TRITON=0: colour and policy operations run as torch ops")
        return None
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: use the torch ops
        log.info("Triton is not available (%s): colour and policy operations run as torch ops", e)
        return None
    from dali_autoproxy.backends.torch_stage import _triton_color
    _KERNELS = _triton_color
    return _KERNELS


def color_jitter(x: torch.Tensor, order: np.ndarray, factors: torch.Tensor, shift: torch.Tensor,
                 tables) -> Optional[torch.Tensor]:
    """x: [B, 3, H, W] float32 whole numbers (any strides); order: host int [B, 4] of steps
    (0 brightness, 1 contrast, 2 saturation, 3 hue, -1 none); factors: [B, 3] float32; shift:
    [B] int32 hue shifts; tables: ``hue_tables(device)``. Returns a new contiguous batch, or
    None if the kernel failed (the caller then runs the torch ops)."""
    kernel = _load().jitter
    b, c, h, w = x.shape
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    order_t = _to_device(torch.from_numpy(np.ascontiguousarray(order, dtype=np.int32)), x)
    to_hs, to_rgb = tables
    sb, sc, sh, sw = x.stride()
    return _launch(kernel, b, x, out, order_t, factors.contiguous(), shift.contiguous(), to_hs, to_rgb,
                   w, h * w, sb, sc, sh, sw)


def tensor_fits(x: torch.Tensor) -> bool:
    """Whether torchvision v2's tensor ColorJitter on this batch is what the fused kernel
    computes: RGB, and few enough pixels that the mean of the grey (whole numbers) is an exact
    float32 sum, whatever order torch sums in."""
    h, w = x.shape[2], x.shape[3]
    return x.shape[1] == 3 and 2 <= h * w and h * w * 255 < 2 ** 24


def tensor_color_jitter_v2(x: torch.Tensor, order: np.ndarray, factors: np.ndarray) -> Optional[torch.Tensor]:
    """x: [B, 3, H, W] float32 holding uint8 values (``tensor_fits``); order: host int [B, 4];
    factors: host float64 [B, 4] (brightness, contrast, saturation, hue factor as drawn).
    torchvision v2's adjust_*_image on uint8 images, each sample in its order. None if the
    kernel failed (the caller then runs the torch ops)."""
    kernel = _load().tensor_jitter_v2
    b, c, h, w = x.shape
    factors = np.asarray(factors, dtype=np.float64)
    alphas = (1.0 - factors[:, 1:3]).astype(np.float32)  # add_(other, alpha=1.0 - ratio)
    host = [np.ascontiguousarray(order, dtype=np.int32), factors.astype(np.float32), alphas]
    order_t, factors_t, alphas_t = [_to_device(torch.from_numpy(np.ascontiguousarray(a)), x) for a in host]
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    sb, sc, sh, sw = x.stride()
    return _launch(kernel, b, x, out, order_t, factors_t, alphas_t, w, h * w, sb, sc, sh, sw,
                   MEAN_BY_DIVISION=not x.is_cuda)


def disable(why: str) -> None:
    """A kernel failed: the torch ops serve from now on (logged once)."""
    if _STATE["usable"] is not False:
        log.warning("%s: colour, policy and resize operations run as torch ops", why)
    _STATE["usable"] = False


def _to_device(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.pin_memory().to(like.device, non_blocking=True) if like.is_cuda else t


def _launch(kernel, programs: int, *args, **constants) -> Optional[torch.Tensor]:
    """One program per sample; the output (args[1]), or None after a failure (logged once;
    the torch ops serve from then on)."""
    try:
        kernel[(programs,)](*args, BLOCK=1024, num_warps=8, enable_fp_fusion=False, **constants)
    except Exception as e:  # noqa: BLE001 - a build or launch failure must not stop training
        _STATE["usable"] = False
        log.warning("a fused Triton kernel failed (%s: %s): colour and policy operations run as torch ops",
                    type(e).__name__, e)
        return None
    return args[1]


def augment_pil(x: torch.Tensor, op, host: np.ndarray) -> Optional[torch.Tensor]:
    """One policy operation per sample on PIL-image values (``policies.augment``'s arithmetic),
    one program per sample. x: [B, 3, H, W] float32 whole numbers; op: ir.Augment;
    host: the params rows. None if the kernel failed (the caller then runs the torch ops)."""
    from dali_autoproxy.plan.ir import AUGMENT_OPS
    from dali_autoproxy.backends.torch_stage.geometry import affine_tables
    from dali_autoproxy.backends.torch_stage.policies import GEOMETRIC, policy_matrix
    module = _load()
    kinds = {name: k for k, name in enumerate(module.AUG_KINDS)}
    b, c, h, w = x.shape
    codes = host[:, op.slot].astype(np.int64)
    mags = np.asarray(host[:, op.slot + 1], dtype=np.float64)
    names = [AUGMENT_OPS[k] for k in codes]
    kind = np.zeros(b, dtype=np.int32)
    fparam = np.zeros(b, dtype=np.float32)
    iparam = np.full(b, 255, dtype=np.int32)
    simple = {"Brightness": "brightness", "Contrast": "contrast", "Color": "color", "Sharpness": "sharpness",
              "Posterize": "posterize", "Solarize": "solarize", "AutoContrast": "autocontrast",
              "Equalize": "equalize", "Invert": "invert", "Identity": "copy"}
    geometric = []
    for i, (name, v) in enumerate(zip(names, mags)):
        if name in GEOMETRIC:
            geometric.append(i)
            continue
        kind[i] = kinds[simple[name]]
        if name in ("Brightness", "Contrast", "Color", "Sharpness"):
            fparam[i] = 1.0 + v  # float32, as the torch ops take the factor
        elif name == "Posterize":
            iparam[i] = (0xFF << (8 - int(v))) & 0xFF
        elif name == "Solarize":  # x >= v for whole numbers x
            fparam[i] = min(max(np.ceil(v), -1.0), 256.0)
    fixed = np.zeros((b, 6), dtype=np.int64)
    coef = np.zeros((b, 6), dtype=np.float64)
    xs, ys = np.zeros((b, w), dtype=np.int32), np.zeros((b, h), dtype=np.int32)
    if geometric:
        rows = np.asarray(geometric)
        matrices = np.array([policy_matrix(names[i], mags[i], w, h) for i in rows], dtype=np.float64)
        if op.bilinear:  # Pillow's generic transform; the identity leaves the image as it is
            coef[rows] = matrices
            identity = np.all(matrices == np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]), axis=1)
            kind[rows] = np.where(identity, kinds["copy"], kinds["warp_bilinear"])
        else:
            f, is_fixed, gx, gy = affine_tables(matrices, w, h)
            fixed[rows], xs[rows], ys[rows] = f, gx, gy
            kind[rows] = np.where(is_fixed, kinds["warp_fixed"], kinds["warp_scale"])
    fill = [float(v) for v in op.fill] * (3 if len(op.fill) == 1 else 1)
    k1, k5 = float(torch.tensor(1.0) / 13.0), float(torch.tensor(5.0) / 13.0)  # as filters.smooth
    args = [_to_device(torch.from_numpy(a), x) for a in (kind, fparam, iparam, fixed, xs, ys, coef,
                                                          np.asarray(fill[:3], dtype=np.float32))]
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    lut = torch.empty((b, 3, 256), dtype=torch.int32, device=x.device)
    sb, sc, sh, sw = x.stride()
    return _launch(module.augment_pil, b, x, out, *args[:7], lut, args[7], w, h, h * w, sb, sc, sh, sw, k1, k5)
