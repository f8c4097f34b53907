"""Converter registry: one small converter per torchvision transform type, v1 and v2.

A converter is ``fn(transform, state, alloc) -> Step``. It reads the transform's
parameters, checks them against ``state`` (what torchvision would hold at that point),
raises :class:`~dali_autoproxy.ir.Unsupported` with a precise reason when DALI cannot
match torchvision, and returns the ops plus a drawer that runs in the worker. ``alloc(n)``
reserves n int32 slots in the per-sample params row.

Types are matched exactly (a user's subclass may override ``forward``), as v2 does with
its kernel registry.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from ..ir import ChainState, Step, Unsupported

Converter = Callable[..., Step]
_REGISTRY: Dict[type, Converter] = {}
_NAMED: Dict[str, Converter] = {}  # "module.QualName" of optional libraries' classes (never imported)


def register(*types: type) -> Callable[[Converter], Converter]:
    """Register ``fn`` as the converter of these transform types (exact types; once each)."""
    def deco(fn: Converter) -> Converter:
        for t in types:
            if t in _REGISTRY:
                raise ValueError(f"{t.__module__}.{t.__qualname__} already has a converter")
            _REGISTRY[t] = fn
        return fn
    return deco


def register_named(*names: str) -> Callable[[Converter], Converter]:
    """Register by qualified class name, so that a library (timm) is recognised when a user
    has it and never imported by us when they do not."""
    def deco(fn: Converter) -> Converter:
        for name in names:
            if name in _NAMED:
                raise ValueError(f"{name} already has a converter")
            _NAMED[name] = fn
        return fn
    return deco


def _converter(cls: type):
    return _REGISTRY.get(cls) or _NAMED.get(f"{cls.__module__}.{cls.__qualname__}")


def lookup(transform: object) -> Converter:
    _load_converters()
    conv = _converter(type(transform))
    if conv is None:
        raise Unsupported(f"{type(transform).__module__}.{type(transform).__qualname__} "
                          "has no DALI translation")
    return conv


_loaded = False


def _load_converters() -> None:
    """Import the converter modules (they import torchvision) on first use."""
    global _loaded
    if not _loaded:
        from . import affine, color, compose, filters, geometry, policies, tensor, timm  # noqa: F401  (registration side effects)
        _loaded = True


def flatten(transform: object) -> List[object]:
    """Unroll nested Compose (v1 and v2), and wrappers that only delegate to one, into a flat
    list of transforms."""
    import torchvision.transforms as T
    try:
        import torchvision.transforms.v2 as v2
        composes: Tuple[type, ...] = (T.Compose, v2.Compose)
    except ImportError:  # pragma: no cover - torchvision without v2
        composes = (T.Compose,)
    if type(transform) in composes:
        out: List[object] = []
        for t in transform.transforms:
            out.extend(flatten(t))
        return out
    _load_converters()
    if _converter(type(transform)) is None:  # a Lambda delegates too, but is user code
        inner = delegate_of(transform)
        if inner is not None:
            return flatten(inner)
    return [transform]


_DELEGATING_OPS = {"RESUME", "LOAD_FAST", "LOAD_ATTR", "PUSH_NULL", "PRECALL", "CALL", "RETURN_VALUE",
                   "CACHE", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW", "NOP", "CALL_FUNCTION",
                   "CALL_METHOD", "LOAD_METHOD", "COPY_FREE_VARS"}


def delegate_of(obj: object):
    """The transform inside a wrapper whose ``__call__`` is exactly ``return self.X(img)``
    (torchvision's classification references hold their chain this way:
    ``self.transforms = T.Compose(...)``), else None. Read from the bytecode, so a wrapper
    that does anything more is left alone."""
    import dis
    call = getattr(type(obj), "__call__", None)
    code = getattr(call, "__code__", None)
    if code is None or code.co_argcount != 2 or len(code.co_names) != 1 or code.co_flags & 0x0C:
        return None
    if not all(ins.opname in _DELEGATING_OPS for ins in dis.get_instructions(code)):
        return None
    loads = [ins.argval for ins in dis.get_instructions(code) if ins.opname.startswith("LOAD_FAST")]
    if loads != [code.co_varnames[0], code.co_varnames[1]] and \
            loads != [(code.co_varnames[0], code.co_varnames[1])]:
        return None  # self.X(img): self first, then the argument, nothing else
    inner = getattr(obj, code.co_names[0], None)
    return inner if callable(inner) else None


def coin_drawer(p: float):
    """The draw of every "apply with probability p" transform: one ``torch.rand(1)`` per call,
    as torchvision makes it (v1 applies when it is < p, v2 skips when it is >= p: the same
    outcome); appends the 0/1 decision to the sample's params."""
    import torch

    def draw(g) -> None:
        g.params.append(int(bool(torch.rand(1) < p)))
    return draw


def v2_params(t: object) -> Callable:
    """A v2 transform's parameter method (``make_params`` since torchvision 0.21, ``_get_params``
    before); called with ``[standin]`` it makes the very RNG calls v2's forward makes."""
    return getattr(t, "make_params", None) or getattr(t, "_get_params")


def transform_name(t: object) -> str:
    mod = type(t).__module__
    prefix = "v2." if ".v2" in mod else ""
    return prefix + type(t).__name__


__all__ = ["register", "register_named", "lookup", "flatten", "transform_name", "coin_drawer", "v2_params", "ChainState", "Step", "Unsupported"]
