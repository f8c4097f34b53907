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

import contextlib
import importlib
import logging
import threading
from typing import Optional

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.registry import upload
from dali_autoproxy.config import triton_allowed

log = logging.getLogger("dali_autoproxy")

_STATE = {"usable": None}  # None: not tried yet; then True/False
_KERNELS = None  # the module of Triton kernels, once imported
_AUGMENT: list = [None]  # the policy kernel's module, loaded with them
_SET_UP = {"started": False}  # Triton's once-per-process set-up, begun in the background
_THREAD = threading.local()  # .torch_ops: this thread's batches take the torch ops (torch_ops_only)
# where Triton keeps the key of its own sources (the first compile of a process hashes them all)
_TRITON_KEY_HOMES = ("triton.runtime.cache", "triton.compiler.compiler")


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernels serve this batch: a CUDA tensor, Triton importable and not
    switched off, no earlier failure to build, and not in ``torch_ops_only``."""
    if not x.is_cuda or _STATE["usable"] is False or getattr(_THREAD, "torch_ops", False):
        return False
    if _STATE["usable"] is None:
        _STATE["usable"] = load() is not None
    return bool(_STATE["usable"])


@contextlib.contextmanager
def torch_ops_only():
    """This thread's batches take the torch ops (the same values) while it is open: a stage's
    batches while its kernels compile elsewhere (``TorchStage``)."""
    _THREAD.torch_ops = True
    try:
        yield
    finally:
        _THREAD.torch_ops = False


def load():
    """The kernels' module, imported on first use (each kernel is compiled on its first call);
    None where Triton is missing or switched off."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    if not triton_allowed():
        log.info("DALI_AUTOPROXY_TRITON=0: colour and policy operations run as torch ops")
        return None
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: use the torch ops
        log.info("Triton is not available (%s): colour and policy operations run as torch ops", e)
        return None
    from dali_autoproxy.backends.torch_stage import _triton_augment, _triton_color
    _KERNELS = _triton_color
    _AUGMENT[0] = _triton_augment
    return _KERNELS


def set_up_in_background(device_id: int) -> None:
    """Begin, once per process, what Triton's first kernel of the process pays whatever it is:
    importing the kernels, hashing Triton's own sources for its cache key (``triton_key``) and
    loading its CUDA driver utilities. Started as a pipeline builds, so that work runs beside the
    build and the workers' start instead of in the first batch (a compile itself waits for its
    kernel's arguments). Nothing is compiled or launched here; any failure leaves it to the first
    kernel, which falls back as it always does."""
    if _SET_UP["started"] or not triton_allowed():
        return
    _SET_UP["started"] = True
    threading.Thread(target=_set_up, args=(device_id,), name="dali_autoproxy-triton-set-up", daemon=True).start()


def _set_up(device_id: int) -> None:
    try:
        if load() is None:
            return
        for home in _TRITON_KEY_HOMES:
            key = getattr(importlib.import_module(home), "triton_key", None)
            if key is not None:
                key()
                break
        from triton.runtime import driver
        with torch.cuda.device(device_id):
            driver.active.get_current_device()
    except Exception as e:  # noqa: BLE001 - the first kernel does it again, and falls back if it must
        log.debug("Triton's set-up in the background did not finish (%s: %s)", type(e).__name__, e)


def load_augment():
    """The policy kernel's module (``_triton_augment``), loaded with the others; None without Triton."""
    return _AUGMENT[0] if load() is not None else None


def color_jitter(x: torch.Tensor, order: np.ndarray, factors: torch.Tensor, shift: torch.Tensor,
                 tables) -> Optional[torch.Tensor]:
    """x: [B, 3, H, W] float32 whole numbers (any strides); order: host int [B, 4] of steps
    (0 brightness, 1 contrast, 2 saturation, 3 hue, -1 none); factors: [B, 3] float32; shift:
    [B] int32 hue shifts; tables: ``hue_tables(device)``. Returns a new contiguous batch, or
    None if the kernel failed (the caller then runs the torch ops)."""
    kernel = load().jitter
    b, c, h, w = x.shape
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    order_t = upload(np.ascontiguousarray(order, dtype=np.int32), x.device)
    to_hs, to_rgb = tables
    sb, sc, sh, sw = x.stride()
    return launch(kernel, b, x, out, order_t, factors.contiguous(), shift.contiguous(), to_hs, to_rgb,
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
    kernel = load().tensor_jitter_v2
    b, c, h, w = x.shape
    factors = np.asarray(factors, dtype=np.float64)
    alphas = (1.0 - factors[:, 1:3]).astype(np.float32)  # add_(other, alpha=1.0 - ratio)
    host = [np.ascontiguousarray(order, dtype=np.int32), factors.astype(np.float32), alphas]
    order_t, factors_t, alphas_t = [upload(np.ascontiguousarray(a), x.device) for a in host]
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=x.device)
    sb, sc, sh, sw = x.stride()
    return launch(kernel, b, x, out, order_t, factors_t, alphas_t, w, h * w, sb, sc, sh, sw,
                   MEAN_BY_DIVISION=not x.is_cuda)


def disable(why: str) -> None:
    """A kernel failed: the torch ops serve from now on (logged once)."""
    if _STATE["usable"] is not False:
        log.warning("%s: colour, policy and resize operations run as torch ops", why)
    _STATE["usable"] = False


def launch(kernel, programs: int, *args, **constants) -> Optional[torch.Tensor]:
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
