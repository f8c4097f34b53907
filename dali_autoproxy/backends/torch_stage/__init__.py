"""The end of a plan run as batched torch ops on DALI's output, on the same device.

Pillow's colour maths (ColorJitter above all) is dozens of small steps: as DALI operators each is
a separate operator with its own scheduling, and a batch pays for all of them (measured on the
H200: the heavy augmentation chain at 1,800 images/s, against 11,800 for DALI's own approximate
color_twist). As torch ops on one [B, C, H, W] batch they take ~3-5 ms of host time per 128
images, and as one Triton kernel per batch (``fused_color``, where Triton runs) ~1 ms. So when a
plan holds a ColorJitter, DALI decodes, crops and resizes, and from the ColorJitter on the ops
run here. Rotations, affine and perspective warps too: Pillow samples them in ways (16.16 fixed
point, float64) that torch ops reproduce exactly and DALI's float warp does not. Here: Pillow's
arithmetic (exact), torchvision's own kernels for blur, tensor jitter and normalisation,
per-sample params from the worker. The stage runs on the pipeline's own thread
(``pipeline.DaliRunner``), right after DALI's output for the batch.

A GPU stage's Triton kernels compile on their first launch (a second or more on a machine whose
Triton cache is empty). So a stage's first batch starts a thread that runs a copy of it through
the Triton kernels, for their compiles alone, and the stage's batches take the torch ops (the same
values) until that thread ends: the first batch does not wait for the compiler. Only a stage of
``SAME_AS_KERNELS`` ops does so, only for batches within ``TORCH_OPS_BYTES``, and only once per
process for the same ops: the next loader's stage launches the compiled kernels at once.

One module per family registers a kernel per IR op type in ``TORCH_KERNELS``; which ops come
here is the ops' ``placement`` (``ir.split_at_takeover``).
"""
from __future__ import annotations

import importlib
import pkgutil
import threading
import time
import weakref
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color, pillow_weights, resample
from dali_autoproxy.backends.torch_stage.color import hue_tables
from dali_autoproxy.backends.torch_stage.geometry import perspective, warp
from dali_autoproxy.backends.torch_stage.policies import augment
from dali_autoproxy.backends.torch_stage.registry import FUSED_PAIRS, FUSED_RUNS, TORCH_KERNELS, Batch, uniform
from dali_autoproxy.backends.torch_stage.tensor_jitter import tensor_color_jitter
from dali_autoproxy.plan.ir import Crop, Flip, Normalize, PillowReduce, PillowResize, TensorResize, ToCHW, ToFloat
from dali_autoproxy.plan.pillow_ops import PillowCall

# every module of this package registers its kernels when imported (the Triton ones load lazily)
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


TAKES_UINT8 = (PillowResize, TensorResize)  # kernels that read DALI's uint8 batch as it is (no float32 copy first)
# ops whose torch ops on a GPU give the Triton kernels' values bit for bit (integer arithmetic, or one
# correctly rounded float step each): only a stage of these takes the torch ops while its kernels
# compile (colour maths as CUDA torch ops may contract a multiply-add the kernels keep apart)
SAME_AS_KERNELS = (PillowResize, PillowReduce, Crop, Flip, ToFloat, Normalize, ToCHW)
# the largest batch those torch ops take while the kernels compile, as the batch in float64 (about
# what the exact resize's sums hold): a batch of large photos waits for the kernels instead of GBs
TORCH_OPS_BYTES = 1 << 30


def _padded(samples: List[torch.Tensor]):
    """Samples [H, W, C] of their own sizes as one zero-padded [B, Hmax, Wmax, C] batch, and their sizes."""
    sizes = np.array([s.shape[:2] for s in samples], dtype=np.int64)
    out = samples[0].new_zeros((len(samples), int(sizes[:, 0].max()), int(sizes[:, 1].max()), samples[0].shape[2]))
    for k, s in enumerate(samples):
        out[k, :s.shape[0], :s.shape[1]] = s
    return out, sizes


class TorchStage:
    """Runs ``ops`` on a batch DALI produced: uint8 [B, H, W, C] (or a list of [H, W, C]). A batch
    whose samples differ in size (after an exact resize to each image's own size) stays one
    batch through the kernels that take any size (``ragged``: resizes, crops) and is split into
    samples before any other kernel, which needs one size."""

    def __init__(self, ops: Sequence[object], compile_behind: bool = False):
        self.ops = list(ops)
        # ``compile_behind``: the first batch's Triton kernels compile in a thread (``compiling``)
        # while the batches take the torch ops; off, the batches' launches compile them
        self.compiling: Optional[threading.Thread] = None
        self.compile_behind = compile_behind and all(type(op) in SAME_AS_KERNELS for op in self.ops)
        self.kernels = [TORCH_KERNELS[op] for op in self.ops]
        self.pairs = {k: FUSED_PAIRS[pair] for k, pair in enumerate(zip(map(type, self.ops), map(type, self.ops[1:])))
                      if pair in FUSED_PAIRS}  # op k and k + 1 in one kernel where the batch allows
        self.prepared: dict = {}  # what the kernels prepare once for this stage (Batch.prepared)
        # a recorded transform's call positions hold "none" where its samples made fewer calls (a
        # joint transform's plan has a few per transform): a position no sample of the batch used
        # is skipped on one look at its column, not taken through its kernel
        self.call_columns = {k: op.col("call") for k, op in enumerate(self.ops) if isinstance(op, PillowCall)}

    def __call__(self, out: Union[torch.Tensor, List[torch.Tensor]], params) -> Union[torch.Tensor, List[torch.Tensor]]:
        if self.compile_behind and fused_color.usable(_first(out)):
            self.compile_behind = False  # decided once, on the stage's first batch
            if _compiled_key(self.ops, out) not in _COMPILED:
                self.compiling = _compile_behind(self.ops, out, params)
        if self.compiling is not None and self.compiling.is_alive() and torch_ops_fit(out):
            with fused_color.torch_ops_only():
                return self._call(out, params)
        return self._call(out, params)

    def _call(self, out: Union[torch.Tensor, List[torch.Tensor]], params) -> Union[torch.Tensor, List[torch.Tensor]]:
        host = np.asarray(params)
        sizes = None
        if isinstance(out, list):  # sizes differ
            if not (self.ops and self.ops[0].ragged):  # one sample at a time
                return [self._call(o.unsqueeze(0), params[k:k + 1]).squeeze(0) for k, o in enumerate(out)]
            out, sizes = _padded(out)  # one batch, each sample in its top-left corner
        batch = Batch(host, device=out.device, prepared=self.prepared)
        batch.sizes = sizes
        x = out.permute(0, 3, 1, 2)  # whole numbers 0..255 until a ToFloat
        if not (self.ops and type(self.ops[0]) in TAKES_UINT8):
            x = x.to(torch.float32)
        return self._run(x, batch, 0)

    def _run(self, x: torch.Tensor, batch: Batch, start: int) -> Union[torch.Tensor, List[torch.Tensor]]:
        k = start
        while k < len(self.ops):
            op = self.ops[k]
            column = self.call_columns.get(k)
            if column is not None and not batch.host[:, column].any():
                k += 1
                continue
            if not op.ragged and not uniform(batch.sizes):
                return [self._run(*self._sample(x, batch, i), k).squeeze(0) for i in range(x.shape[0])]
            run = FUSED_RUNS.get(type(op))  # a run of ops from here as one (fewer launches and passes)
            done = run(x, self.ops, k, batch) if run is not None else None
            if done is not None:
                x, k = done
                continue
            pair = self.pairs.get(k)
            both = pair(x, op, self.ops[k + 1], batch) if pair is not None else None
            if both is not None:
                x, k = both, k + 2
                continue
            x = self.kernels[k](x, op, batch)
            k += 1
        if not uniform(batch.sizes):
            return [self._finish(x[i:i + 1, :, :h, :w], batch)[0] for i, (h, w) in enumerate(batch.sizes)]
        return self._finish(x, batch)

    @staticmethod
    def _sample(x: torch.Tensor, batch: Batch, i: int):
        """Sample i of a padded batch as a batch of its own size."""
        h, w = (int(v) for v in batch.sizes[i])
        return x[i:i + 1, :, :h, :w], batch.sample(i)

    @staticmethod
    def _finish(x: torch.Tensor, batch: Batch) -> torch.Tensor:
        return x.to(torch.uint8).contiguous() if batch.integer else x.contiguous()


_TORCH_OPS_WARMED: list = []  # the process's exact resize torch ops have run once (set_up_in_background)


def set_up_in_background(device_id: int) -> None:
    """As a GPU pipeline with a torch stage builds: Triton's once-per-process set-up
    (``fused_color``), and, once per process, the exact resize's torch ops run on a tiny batch,
    so the libraries and kernels they load (cuBLAS's float64 products above all, a few tenths of a
    second) are loaded before the first batch takes those ops while its Triton kernels compile."""
    fused_color.set_up_in_background(device_id)
    if _TORCH_OPS_WARMED:
        return
    _TORCH_OPS_WARMED.append(True)

    def warm() -> None:
        try:
            with torch.cuda.device(device_id), torch.cuda.stream(torch.cuda.Stream()), fused_color.torch_ops_only():
                x = torch.zeros((2, 3, 8, 8), dtype=torch.uint8, device=f"cuda:{device_id}")
                resample.pillow_resize(x, [[8, 8], [6, 8]], [[5, 3], [8, 4]], [pillow_weights.BILINEAR] * 2)
                torch.cuda.current_stream().synchronize()
        except Exception:  # noqa: BLE001 - the first batch then loads them itself
            pass

    threading.Thread(target=warm, name="dali_autoproxy-torch-ops-warm-up", daemon=True).start()


def torch_ops_fit(out: Union[torch.Tensor, List[torch.Tensor]]) -> bool:
    """Whether the batch in float64 (padded to its largest sample) is within
    ``TORCH_OPS_BYTES``."""
    if isinstance(out, list):
        numel = len(out) * max(o.shape[0] for o in out) * max(o.shape[1] for o in out) * out[0].shape[2]
    else:
        numel = out.numel()
    return numel * 8 <= TORCH_OPS_BYTES


def _first(out: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
    return out[0] if isinstance(out, list) else out


def _compile_behind(ops: Sequence[object], out: Union[torch.Tensor, List[torch.Tensor]], params) -> threading.Thread:
    """A thread running a copy of this batch through a stage of the same ops on its own stream,
    for the Triton compiles its launches make; its result is dropped. A failure there is a kernel
    that does not build: the torch ops serve from then on (``fused_color.disable``)."""
    key = _compiled_key(ops, out)
    copy = [o.clone() for o in out] if isinstance(out, list) else out.clone()
    copied = torch.cuda.Event()
    copied.record()
    device = _first(out).device

    def compile_all() -> None:
        try:
            with torch.cuda.device(device):
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    stream.wait_event(copied)
                    TorchStage(ops)(copy, params)
                stream.synchronize()
            _COMPILED.add(key)
        except Exception as e:  # noqa: BLE001 - the batches go on with the torch ops
            fused_color.disable(f"compiling the torch stage's Triton kernels failed ({type(e).__name__}: {e})")

    thread = threading.Thread(target=compile_all, name="dali_autoproxy-triton-compile", daemon=True)
    thread.start()
    _COMPILING.add(thread)
    return thread


_COMPILING: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
# stages whose kernels this process has compiled behind a first batch: a later stage of the same ops
# (the next loader, epoch or pipeline) launches them at once, with no copy, thread or side stream
_COMPILED: set = set()


def _compiled_key(ops: Sequence[object], out: Union[torch.Tensor, List[torch.Tensor]]) -> tuple:
    first = _first(out)
    return first.device, first.dtype, isinstance(out, list), tuple(type(op) for op in ops)


def stop_compiling(wait: float) -> None:
    """Wait up to ``wait`` seconds in all for the compiling threads (interpreter exit: a thread
    left inside Triton's compiler is unwound there, which can abort the process)."""
    deadline = time.monotonic() + wait
    for thread in list(_COMPILING):
        thread.join(max(0.0, deadline - time.monotonic()))


__all__ = ["TORCH_KERNELS", "TorchStage", "augment", "warp", "perspective", "tensor_color_jitter", "hue_tables"]
