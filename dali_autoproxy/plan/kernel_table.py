"""One table shape for every back end: a kernel per IR op type, as torchvision v2 registers
its kernels per input type.

Three back ends execute a plan's ops: the DALI lowering (``pipeline.py``), the torch stage
(``torch_stage/``) and the CPU replay (``cpu_path.py``). Each owns a :class:`KernelTable`;
an op type it deliberately leaves to another back end is registered as ``not_here`` with the
reason, so that every (op, back end) pair is either a kernel or a stated absence.
``tests/test_kernel_tables.py`` checks that, and that each table agrees with the op's
``placement`` (the data planning reads, in ``ir.py``).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, TypeVar

K = TypeVar("K", bound=Callable)


class MissingKernel(LookupError):
    """An op reached a back end that has no kernel for it."""


class KernelTable:
    """Kernels of one back end, keyed by exact IR op type."""

    def __init__(self, backend: str):
        self.backend = backend
        self._kernels: Dict[type, Callable] = {}
        self._absent: Dict[type, str] = {}

    def _claim(self, op_type: type) -> None:
        if op_type in self._kernels or op_type in self._absent:
            raise ValueError(f"{op_type.__name__} is registered twice in the {self.backend} table")

    def register(self, *op_types: type) -> Callable[[K], K]:
        """Decorator: ``fn`` runs ops of these types in this back end."""
        def deco(fn: K) -> K:
            for t in op_types:
                self._claim(t)
                self._kernels[t] = fn
            return fn
        return deco

    def not_here(self, why: str, *op_types: type) -> None:
        """These op types never run in this back end, for the reason ``why``."""
        for t in op_types:
            self._claim(t)
            self._absent[t] = why

    def has(self, op_type: type) -> bool:
        return op_type in self._kernels

    def absence(self, op_type: type) -> Optional[str]:
        return self._absent.get(op_type)

    def __getitem__(self, op: object) -> Callable:
        """The kernel for an op (or op type); MissingKernel names the op and this back end."""
        op_type = op if isinstance(op, type) else type(op)
        fn = self._kernels.get(op_type)
        if fn is None:
            why = self._absent.get(op_type, "no kernel is registered")
            raise MissingKernel(f"{op_type.__name__} has no kernel in the {self.backend}: {why}")
        return fn

    def kernel_types(self) -> Iterable[type]:
        return tuple(self._kernels)

    def absent_types(self) -> Iterable[type]:
        return tuple(self._absent)
