"""Adding an operation of one's own, in one place: its IR op, the converter of the transform
class that makes it, and its kernel in each back end, checked as the built-in ops are.

The op is a frozen dataclass deriving from ``dali_autoproxy.plan.ir.Op`` with a ``placement``
and named per-sample ``params``; the converter ``fn(transform, state, alloc) -> Step`` draws its
values in the worker as the transform would and writes them by name (``g.put(op, ...)``); the
kernels read them by name (``op.col("name")``). Call it at import time of the module defining
the transform class, so that spawned workers (which import that module to unpickle the
dataset) know the op too.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Union

from dali_autoproxy.backends.cpu_replay import CPU_KERNELS
from dali_autoproxy.backends.dali.lowering import DALI_KERNELS
from dali_autoproxy.backends.torch_stage import TORCH_KERNELS
from dali_autoproxy.plan.ir import Op, Placement
from dali_autoproxy.plan.translate import register


def register_op(op_type: type, *, transforms: Iterable[Union[type, str]] = (), converter: Optional[Callable] = None,
                torch: Optional[Callable] = None, cpu: Optional[Callable] = None,
                dali: Optional[Callable] = None) -> type:
    """Register ``op_type`` with its kernels (``torch(x, op, batch) -> x`` on a [B, C, H, W] float
    batch; ``cpu(img, op, row, v2_step) -> img`` on one PIL image or tensor; ``dali(lowering, op,
    img) -> img`` on a DALI graph node) and, for ``transforms`` (classes, or qualified names), its
    ``converter``. The kernels the op's placement needs are required: the CPU replay always (it
    recomputes a batch DALI failed on), the torch stage unless the op is DALI-only, DALI unless it
    is torch-only. Returns ``op_type``."""
    if not (isinstance(op_type, type) and issubclass(op_type, Op) and dataclasses.is_dataclass(op_type)):
        raise TypeError(f"{op_type!r} is not a dataclass deriving from dali_autoproxy.plan.ir.Op")
    placement = getattr(op_type, "placement", None)
    if not isinstance(placement, Placement):
        raise TypeError(f"{op_type.__name__} declares no placement (Placement.DALI, EITHER or TORCH)")
    needs = {"cpu": True, "torch": placement is not Placement.DALI, "dali": placement is not Placement.TORCH}
    given = {"cpu": cpu, "torch": torch, "dali": dali}
    for backend, needed in needs.items():
        if needed and not callable(given[backend]):
            raise TypeError(f"{op_type.__name__} ({placement.value}) needs a {backend} kernel")
        if not needed and given[backend] is not None:
            raise TypeError(f"{op_type.__name__} ({placement.value}) never runs in {backend}: give no kernel")
    transforms = list(transforms)
    if transforms and converter is None:
        raise TypeError("transforms were given without their converter")
    CPU_KERNELS.register(op_type)(cpu)
    if torch is not None:
        TORCH_KERNELS.register(op_type)(torch)
    else:
        TORCH_KERNELS.not_here("DALI runs it, before the torch stage", op_type)
    if dali is not None:
        DALI_KERNELS.register(op_type)(dali)
    if transforms:
        register(*transforms)(converter)
    return op_type
