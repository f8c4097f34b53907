"""CUDA graphs of a batch's kernel launches, replayed for every batch of the same launch shape.

The stage's kernels run on the pipeline's thread under the GIL the training loop shares, and
a Triton launch costs that thread tens of microseconds of Python (binding and specialising its
arguments) however small the batch. A kernel that reads everything that changes from batch to
batch (tensor addresses, strides, per-sample rows) from one int64 block in device memory
launches identically for every batch of one shape (grid, compile-time constants, scalars): so
its launches are captured once as a CUDA graph, with the copy of the block before them, and
replayed: one call for the whole sequence. Per batch the host writes the block into the graph's
own pinned buffer and replays; the graph copies it to its device block and launches.

Each shape keeps ``DEPTH`` graphs used in turn, each with its own buffers: a buffer is written
again only once the replay that read it has run (its event), so the host never waits for the
GPU unless it is that many batches ahead (several pipeline threads share them: one at a time,
under a lock, picks a graph, fills its buffers and queues its replay). A shape's first batch is launched directly (its
kernels compile there, which a capture may not do); a capture that fails switches the graphs
off for good (logged once) and the direct launches serve.

CUDA forbids synchronizing a device while one of its streams captures, and the capture is then
lost too; the training loop may call ``torch.cuda.synchronize`` (or ``empty_cache``, whose frees
synchronize) on its own thread at any moment. So from the first capture until disable() those
two wait for a capture in progress (``CAPTURING``; a capture takes milliseconds), through the
patch ledger. A reference bound before that (``from torch.cuda import synchronize``) is not
covered.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Dict, Hashable, List, Set

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage.cuda_graph import DriverGraph

log = logging.getLogger("dali_autoproxy")

Launches = Callable[[torch.Tensor], None]  # launches(block on the device): the kernels of one batch

CAPTURING = threading.RLock()  # held by a capture, and by a device-wide synchronize of any thread
DEVICE_WIDE_SYNCS = ("synchronize", "empty_cache")  # torch.cuda's functions that synchronize the device


def _fresh_lock_in_a_forked_child() -> None:
    """A worker forked while a capture held the lock would otherwise inherit it held for good."""
    global CAPTURING
    CAPTURING = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock_in_a_forked_child)


def _after_captures(wrapped, instance, args, kwargs):
    with CAPTURING:
        return wrapped(*args, **kwargs)


def hold_device_syncs_during_captures() -> None:
    """Make torch.cuda's device-wide synchronizing functions wait for a capture (idempotent;
    undone by disable())."""
    from dali_autoproxy.patches import ledger
    for name in DEVICE_WIDE_SYNCS:
        ledger.wrap(torch.cuda, name, _after_captures)


class _Graph:
    """One captured sequence of launches and the buffers it reads (captured by the driver:
    ``cuda_graph`` says why not by ``torch.cuda.CUDAGraph``)."""

    def __init__(self, shape, device: torch.device, launches: Launches) -> None:
        self.host = torch.zeros(shape, dtype=torch.int64).pin_memory()
        self.host_view = self.host.numpy()
        self.block = torch.zeros(shape, dtype=torch.int64, device=device)
        self.done = torch.cuda.Event()
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        current = torch.cuda.current_stream(self.device_index)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)

        def record() -> None:
            self.block.copy_(self.host, non_blocking=True)  # a node of the graph: pinned memory to the device
            launches(self.block)
        with CAPTURING, torch.cuda.stream(side):  # other threads launch freely (thread-local capture)
            self.graph = DriverGraph(side, record)
        current.wait_stream(side)

    def replay(self, block: np.ndarray) -> None:
        self.done.synchronize()  # the replay that last read this graph's buffers has run
        self.host_view[...] = block
        stream = torch.cuda.current_stream(self.device_index)  # (by index: no device lookup)
        self.graph.replay(stream)
        self.done.record(stream)


class LaunchGraphs:
    """The graphs of one kind of launch sequence, by shape (see the module's docstring)."""

    DEPTH = 4
    SHAPES = 32  # shapes kept; past them, batches of new shapes are launched directly

    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled = True
        self._seen: Set[Hashable] = set()
        self._graphs: Dict[Hashable, List[_Graph]] = {}
        self._turn: Dict[Hashable, int] = {}
        self.replays = 0  # batches served by a replay (tests and benchmarks read it)
        self._lock = threading.Lock()

    def run(self, key: Hashable, block: np.ndarray, device: torch.device, launches: Launches) -> bool:
        """The batch's launches (``launches`` of the device block that holds ``block``) by a
        replay of the graph for ``key``, a shape of launch (everything the launches take
        besides the block); False where the caller is to launch them itself, directly."""
        if not self.enabled or device.type != "cuda":
            return False
        with self._lock:
            return self._run(key, block, device, launches)

    def _run(self, key: Hashable, block: np.ndarray, device: torch.device, launches: Launches) -> bool:
        ring = self._graphs.get(key)
        if ring is None:
            if key not in self._seen or len(self._graphs) >= self.SHAPES:
                if len(self._seen) >= 64 * self.SHAPES:  # a stream of shapes never seen twice
                    self._seen.clear()
                self._seen.add(key)
                return False
            ring = self._graphs[key] = []
            self._turn[key] = 0
        turn = self._turn[key]
        self._turn[key] = (turn + 1) % self.DEPTH
        if turn == len(ring):
            hold_device_syncs_during_captures()
            try:
                ring.append(_Graph(block.shape, device, launches))
            except Exception as e:  # noqa: BLE001 - a capture that fails must not stop training
                log.warning("CUDA graphs of the %s launches are off (%s: %s): they are launched directly",
                            self.name, type(e).__name__, e)
                self.enabled = False
                return False
        ring[turn].replay(block)
        self.replays += 1
        return True
