"""Launching a Triton kernel that is compiled already without the JIT's work on every call.

``kernel[grid](*args)`` binds and specialises every argument on each call: tens of microseconds
of host time per launch, spent on the pipeline's thread under the GIL that the training loop,
the loader and the pin-memory thread share (at 8 workers the main process is GIL-bound: the
stage's host time costs throughput one for one). The stage launches the same kernels batch after
batch with arguments that differ only in value. ``launch`` keeps the compiled kernel that the
JIT returned for one specialisation (each tensor's dtype and 16-byte alignment, each int's
classes: 1, a multiple of 16, 32 or 64 bits; the constexprs and launch options; the device) and
calls it directly (``CompiledKernel[grid]``) for later calls of the same specialisation. The first
call of each goes through the JIT, which compiles the kernel or finds it. Triton's interpreter
returns no compiled kernel: every call goes through it. Should a direct call ever fail (a Triton
whose compiled kernels launch differently), the JIT serves from then on.

No Triton import here: the kernels come from the ``_triton_*`` modules, loaded where Triton is.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Tuple

import torch

log = logging.getLogger("dali_autoproxy")


class _Launcher:
    __slots__ = ("jit_fn", "names", "compiled", "direct", "direct_launches")

    def __init__(self, jit_fn: Any) -> None:
        self.jit_fn = jit_fn
        self.names = list(getattr(jit_fn, "arg_names", None) or ())
        self.compiled: Dict[Tuple, Any] = {}
        self.direct = bool(self.names)
        self.direct_launches = 0  # tests check that the direct path ran

    def __call__(self, grid: Tuple[int, int, int], args: tuple, kwargs: Dict[str, Any]) -> None:
        device = args[0].device if args and isinstance(args[0], torch.Tensor) else None
        if self.direct and device is not None and device.type == "cuda":
            rest = tuple(kwargs[n] for n in self.names[len(args):])  # the constexprs, in signature order
            options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.names[len(args):]))
            key = (device.index, tuple(map(_specialisation, args)), rest, options)
            compiled = self.compiled.get(key)
            if compiled is not None:
                try:
                    compiled[grid](*args, *rest, stream=torch.cuda.current_stream(device).cuda_stream)
                    self.direct_launches += 1
                    return
                except Exception as e:  # noqa: BLE001 - the JIT's own path still works
                    self.direct = False
                    log.info("Triton kernel %s: a direct launch failed (%s: %s); the JIT launches it from now on",
                             getattr(self.jit_fn, "__name__", self.jit_fn), type(e).__name__, e)
            got = self.jit_fn[grid](*args, **kwargs)
            if self.direct and got is not None and callable(getattr(got, "__getitem__", None)):
                self.compiled[key] = got
            return
        self.jit_fn[grid](*args, **kwargs)


def _specialisation(value: Any) -> Any:
    """What Triton specialises a compiled kernel on, for one argument (conservatively: an int's
    classes even where the kernel does not specialise on them)."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return bool, value
    if isinstance(value, int):
        return int, value == 1, value % 16 == 0, -(1 << 31) <= value < (1 << 31)
    return type(value)


_LAUNCHERS: Dict[int, _Launcher] = {}


def launch(kernel: Any, grid: Tuple[int, int, int], *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, through the compiled kernel where one is kept for this
    specialisation (``args[0]``: a tensor on the kernel's device; ``kwargs``: the constexprs, by
    name, and the launch options)."""
    launcher = _LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.jit_fn is not kernel:
        launcher = _LAUNCHERS[id(kernel)] = _Launcher(kernel)
    launcher(grid, args, kwargs)


def direct_launches(kernel: Any) -> int:
    """How many launches of ``kernel`` skipped the JIT (tests)."""
    launcher = _LAUNCHERS.get(id(kernel))
    return launcher.direct_launches if launcher is not None and launcher.jit_fn is kernel else 0
