"""What every kernel of the torch stage shares: the registry of kernels by op type, the batch
context they see, and the host-to-device transfers that never stop the host."""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Deque, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from dali_autoproxy.backends import fork_guard
from dali_autoproxy.plan.ir import FastColorJitter, Resize
from dali_autoproxy.plan.kernel_table import KernelTable


class Batch:
    """The context of one batch: its params rows on the host (float64, for planning on the
    host) and on the device (``params``: copied there when a kernel first asks, so a stage
    whose kernels read the host rows alone makes no copy), and whether the pixel values are
    still whole numbers 0..255 (uint8 semantics; ToFloat ends that). ``sizes``: set by the
    kernels that change sizes (resample.py); samples smaller than the batch sit in its top-left
    corner, zero-padded (int64 [B, 2], each sample's (height, width), when they differ).
    ``kept``: the images a recorded Image.blend keeps ("keep" / "blend_kept"). ``mixing``: AugMix's
    (source, mix) between its MixStart and its last MixAdd. ``prepared``: what
    kernels prepare once for their stage (by their own keys, such as their op's position) and
    find again in every later batch of it."""

    def __init__(self, host: np.ndarray, params: Optional[torch.Tensor] = None, integer: bool = True,
                 sizes: Optional[np.ndarray] = None, kept: Optional[torch.Tensor] = None,
                 device: Optional[torch.device] = None, prepared: Optional[dict] = None) -> None:
        self.host = host
        self._params = params
        self._device = device if params is None else params.device
        self.integer = integer
        self.sizes = sizes
        self.kept = kept
        self.mixing: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self.prepared = {} if prepared is None else prepared

    @property
    def params(self) -> torch.Tensor:
        if self._params is None:
            self._params = upload(self.host, self._device)
        return self._params

    def sample(self, i: int) -> "Batch":
        """The context of sample i alone (its rows; its device rows where they were copied)."""
        params = None if self._params is None else self._params[i:i + 1]
        return Batch(self.host[i:i + 1], params, self.integer, device=self._device, prepared=self.prepared)

    def flag(self, slot: int) -> torch.Tensor:
        """params[:, slot] != 0 as a [B, 1, 1, 1] mask (a per-sample coin)."""
        return (self.params[:, slot] != 0).view(-1, 1, 1, 1)


Kernel = Callable[[torch.Tensor, object, Batch], torch.Tensor]
# kernel(x, op, batch) -> x, on a [B, C, H, W] float batch
TORCH_KERNELS = KernelTable("torch stage")
TORCH_KERNELS.not_here("DALI runs tensor resizes (torch's own maths) before the stage takes over", Resize)
TORCH_KERNELS.not_here("fidelity='fast' asks for DALI's own operator", FastColorJitter)
kernel = TORCH_KERNELS.register

PairKernel = Callable[[torch.Tensor, object, object, Batch], Optional[torch.Tensor]]
FUSED_PAIRS: Dict[Tuple[type, type], PairKernel] = {}


def fused_pair(first: type, second: type) -> Callable[[PairKernel], PairKernel]:
    """Registers ``kernel(x, first_op, second_op, batch)``: the two ops in one, cheaper (fewer
    launches and passes); it returns None for a batch it cannot take (each op's own kernel runs)."""
    def register(fn: PairKernel) -> PairKernel:
        FUSED_PAIRS[(first, second)] = fn
        return fn
    return register


RunKernel = Callable[[torch.Tensor, list, int, Batch], Optional[Tuple[torch.Tensor, int]]]
FUSED_RUNS: Dict[type, RunKernel] = {}


def fused_run(first: type) -> Callable[[RunKernel], RunKernel]:
    """Registers ``kernel(x, ops, k, batch)`` for a run of ops starting with one of type
    ``first`` at ops[k]: it returns the batch and the index of the first op it did not do, or
    None where it takes nothing (then the pairs and each op's own kernel run)."""
    def register(fn: RunKernel) -> RunKernel:
        FUSED_RUNS[first] = fn
        return fn
    return register


def upload(values, device: torch.device, dtype=None) -> torch.Tensor:
    """Host numbers onto ``device`` without stopping the host: through pinned memory, queued on
    the current stream. (A pageable copy waits for all queued GPU work, and the stage makes a
    few per batch: every one of them would serialise the stage's thread with the GPU.) Small
    arrays go through the thread's pinned staging ring: pinning a new tensor for each would
    cost more than the copy."""
    t = torch.as_tensor(np.asarray(values), dtype=dtype)
    if device.type != "cuda":
        return t
    staging = getattr(_THREAD, "staging", None)
    if staging is None:  # the thread-local only points at it: a forked worker must not free it
        staging = _THREAD.staging = fork_guard.keep(_Staging())
    return staging.copy(t.contiguous(), device)


class _Staging:
    """A thread's pinned ring for small host-to-device copies: each copy's region is reused
    only once the copy that read it has completed (its CUDA event)."""

    SIZE = 4 << 20

    def __init__(self) -> None:
        self.ring: Optional[torch.Tensor] = None
        self.at = 0
        self.pending: Deque[Tuple[int, int, torch.cuda.Event]] = deque()

    def copy(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        n = t.numel() * t.element_size()
        if n == 0 or n > self.SIZE // 8:
            return t.pin_memory().to(device, non_blocking=True)
        if self.ring is None:
            self.ring = torch.empty(self.SIZE, dtype=torch.uint8).pin_memory()
        start = (self.at + 63) // 64 * 64
        if start + n > self.SIZE:
            start = 0
        end = start + n
        while self.pending and self.pending[0][2].query():
            self.pending.popleft()
        for a, b, done in self.pending:
            if a < end and start < b:
                done.synchronize()
        staged = self.ring[start:end].view(t.dtype).view(t.shape)
        staged.copy_(t)
        out = staged.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        self.pending.append((start, end, done))
        self.at = end
        return out


_THREAD = threading.local()  # .staging: the thread's _Staging


def uniform(sizes: Optional[np.ndarray]) -> bool:
    """Whether every sample of the batch has the same (height, width)."""
    return sizes is None or bool((sizes == sizes[0]).all())


def valid_sizes(x: torch.Tensor, batch: Batch) -> np.ndarray:
    """Each sample's (height, width) in a batch that may be padded (``Batch.sizes``), int64 [B, 2]."""
    if batch.sizes is not None:
        return batch.sizes
    return np.tile(np.asarray([x.shape[2], x.shape[3]], dtype=np.int64), (x.shape[0], 1))


def shared(t: torch.Tensor) -> torch.Tensor:
    """``t``, computed: a tensor cached for every pipeline thread (each stage runs on its own
    stream) is complete before another stream can read it."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return t


_CONSTANTS: dict = {}


def constant(values: Sequence[float], device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """A small per-channel constant (mean, std, fill) as [1, C, 1, 1], uploaded once per device."""
    key = (tuple(values), str(device), dtype)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = shared(torch.tensor(list(values), dtype=dtype).view(1, -1, 1, 1).to(device))
    return _CONSTANTS[key]


def update_rows(x: torch.Tensor, rows, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``x`` with ``fn(samples, index)`` applied to the samples ``rows`` (host indices): gathered,
    computed together, written back in place. The stage owns ``x``; a broadcast view (after a
    Grayscale) is copied once first."""
    x = x.contiguous()
    idx = upload(rows, x.device)
    x.index_copy_(0, idx, fn(x.index_select(0, idx), idx).to(x.dtype))
    return x
