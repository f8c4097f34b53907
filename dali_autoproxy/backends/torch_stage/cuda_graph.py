"""A CUDA graph captured and replayed through the CUDA driver itself, not ``torch.cuda.CUDAGraph``.

The stage captures on its pipeline's thread while the training loop runs on another, in the same
process. ``torch.cuda.CUDAGraph`` is made for the capturing process's own model: it puts torch's
default CUDA generator into capture mode for the capture's duration (a loop's dropout drawn
meanwhile reads the graph's offsets, and every later replay of our graph would advance the
loop's generator), and a capture that CUDA invalidates leaves that generator in capture mode for
good (every later CUDA random draw of the process raises "Offset increment outside graph capture").
The stage's launches need neither torch's generator nor its memory pool (they allocate nothing:
the graph reads a block and writes outputs that exist before the capture), so the driver's
capture is all they need, and a capture that fails costs nothing but the graph.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable

import torch

_THREAD_LOCAL = 1  # CUstreamCaptureMode: only the capturing thread is barred from unsafe calls


@functools.lru_cache(maxsize=None)
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")  # the driver torch itself runs on


def _check(status: int, call: str) -> None:
    if status != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(status, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {(name.value or b'CUDA error %d' % status).decode()}")


class DriverGraph:
    """The work ``record()`` queues on ``stream``, captured once; ``replay(stream)`` queues it again."""

    def __init__(self, stream: torch.cuda.Stream, record: Callable[[], None]) -> None:
        driver = _driver()
        handle = ctypes.c_void_p(stream.cuda_stream)
        graph, self._exec = ctypes.c_void_p(), ctypes.c_void_p()
        _check(driver.cuStreamBeginCapture_v2(handle, _THREAD_LOCAL), "cuStreamBeginCapture")
        try:
            record()
        finally:  # the capture ends whatever happened, so the stream is usable again
            ended = driver.cuStreamEndCapture(handle, ctypes.byref(graph))
        _check(ended, "cuStreamEndCapture")
        try:
            _check(driver.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), graph, ctypes.c_ulonglong(0)),
                   "cuGraphInstantiateWithFlags")
        finally:
            driver.cuGraphDestroy(graph)  # the instantiated graph keeps what it needs

    def replay(self, stream: torch.cuda.Stream) -> None:
        _check(_driver().cuGraphLaunch(self._exec, ctypes.c_void_p(stream.cuda_stream)), "cuGraphLaunch")

    def __del__(self) -> None:
        if self._exec.value:
            try:
                _driver().cuGraphExecDestroy(self._exec)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
