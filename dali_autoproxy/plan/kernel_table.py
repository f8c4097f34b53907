"""One table shape for every back end: a kernel per (IR op type, kind of sample piece), as
torchvision v2 registers its kernels per (dispatcher, input type). Every kernel registered takes
the ``"image"`` piece; a box or mask kernel of the same op would sit beside it under its own piece.

Three back ends execute a plan's ops: the DALI lowering (``backends/dali/lowering.py``), the
torch stage (``backends/torch_stage/``) and the CPU replay (``backends/cpu_replay.py``). Each
owns a :class:`KernelTable`; an op type it deliberately leaves to another back end is registered
as ``not_here`` with the reason (or derived from its placement), so that every (op, back end)
pair is either a kernel or a stated absence. ``tests/test_kernel_tables.py`` checks that, and
that each table agrees with the op's ``placement`` (the data planning reads, in ``plan/ir.py``).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Tuple, TypeVar

K = TypeVar("K", bound=Callable)


class MissingKernel(LookupError):
    """An op reached a back end that has no kernel for it."""


PIECES = ("image", "boxes", "mask", "keypoints")  # the kinds of sample pieces a kernel may take


class KernelTable:
    """Kernels of one back end, keyed by (exact IR op type, piece)."""

    def __init__(self, backend: str, absent_by_default: Optional[Callable[[type], Optional[str]]] = None):
        self.backend = backend
        self._kernels: Dict[Tuple[type, str], Callable] = {}
        self._absent: Dict[Tuple[type, str], str] = {}
        # why an op type never runs here, decided from its declaration (its placement) when the
        # table has no entry of its own: the op needs nothing in this back end
        self._absent_by_default = absent_by_default

    def _claim(self, op_type: type, piece: str) -> Tuple[type, str]:
        if piece not in PIECES:
            raise ValueError(f"unknown sample piece {piece!r} (known: {', '.join(PIECES)})")
        key = (op_type, piece)
        if key in self._kernels or key in self._absent:
            where = "" if piece == "image" else f" for {piece}"
            raise ValueError(f"{op_type.__name__} is registered twice in the {self.backend} table{where}")
        return key

    def register(self, *op_types: type, piece: str = "image") -> Callable[[K], K]:
        """Decorator: ``fn`` runs ops of these types on this piece in this back end."""
        def deco(fn: K) -> K:
            for t in op_types:
                self._kernels[self._claim(t, piece)] = fn
            return fn
        return deco

    def not_here(self, why: str, *op_types: type, piece: str = "image") -> None:
        """These op types never run on this piece in this back end, for the reason ``why``."""
        for t in op_types:
            self._absent[self._claim(t, piece)] = why

    def has(self, op_type: type, piece: str = "image") -> bool:
        return (op_type, piece) in self._kernels

    def absence(self, op_type: type, piece: str = "image") -> Optional[str]:
        why = self._absent.get((op_type, piece))
        if why is None and (op_type, piece) not in self._kernels and self._absent_by_default is not None:
            why = self._absent_by_default(op_type)
        return why

    def kernel(self, op: object, piece: str = "image") -> Callable:
        """The kernel for an op (or op type) on a piece; MissingKernel names the op and this back end."""
        op_type = op if isinstance(op, type) else type(op)
        fn = self._kernels.get((op_type, piece))
        if fn is None:
            why = self.absence(op_type, piece) or "no kernel is registered"
            where = "" if piece == "image" else f" for {piece}"
            raise MissingKernel(f"{op_type.__name__} has no kernel{where} in the {self.backend}: {why}")
        return fn

    def __getitem__(self, op: object) -> Callable:
        """The image kernel for an op (or op type)."""
        return self.kernel(op)

    def kernel_types(self, piece: str = "image") -> Iterable[type]:
        return tuple(t for t, p in self._kernels if p == piece)

    def absent_types(self, piece: str = "image") -> Iterable[type]:
        return tuple(t for t, p in self._absent if p == piece)
