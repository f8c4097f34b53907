"""The converter registry: one small converter per torchvision transform type, v1 and v2
(the converter modules of this package register themselves; ``__init__`` imports them all).

A converter is ``fn(transform, state, alloc) -> Step``. It reads the transform's
parameters, checks them against ``state`` (what torchvision would hold at that point),
raises :class:`~dali_autoproxy.plan.ir.Unsupported` with a precise reason when DALI cannot
match torchvision, and returns the ops plus a drawer that runs in the worker. ``alloc(Op)``
reserves the op's values in the per-sample params row and returns its slot; the drawer writes
them by name (``g.put(op, name=value, ...)``).

Types are matched exactly, as v2 does with its kernel registry; a subclass that overrides no
method of the call path (``CALL_PATH``) is its parent, one that does stays as written.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.steps import ChainState, Step

Converter = Callable[..., Step]
_REGISTRY: Dict[type, Converter] = {}
_NAMED: Dict[str, Converter] = {}  # "module.QualName" of optional libraries' classes (never imported)


def register(*types: Union[type, str]) -> Callable[[Converter], Converter]:
    """Register ``fn`` as the converter of these transform types (exact types; once each). A
    type may be given by its qualified name ("timm.data.transforms.ToNumpy"), so that an optional
    library is recognised when a user has it and never imported by us when they do not."""
    def deco(fn: Converter) -> Converter:
        for t in types:
            table, key = (_NAMED, t) if isinstance(t, str) else (_REGISTRY, t)
            if key in table:
                name = key if isinstance(key, str) else f"{key.__module__}.{key.__qualname__}"
                raise ValueError(f"{name} already has a converter")
            table[key] = fn
        return fn
    return deco


_BY_CODE: Dict[str, Converter] = {}  # fingerprint of a class's __call__: its converter
_FINGERPRINTS: Dict[type, Optional[str]] = {}


def fingerprint(fn: Callable) -> str:
    """A short hash of a function's syntax tree, docstrings left out: equal for the same code
    however it is formatted or commented, and on every Python version (the tree is written out
    without the fields a version adds empty, such as 3.12's ``type_params``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha1(_canonical(tree).encode()).hexdigest()[:16]


def _canonical(node) -> str:
    """The tree as text: node types and their non-empty fields, nothing version-specific."""
    if isinstance(node, ast.AST):
        fields = [(name, getattr(node, name, None)) for name in node._fields if name != "type_comment"]
        parts = [f"{name}={_canonical(value)}" for name, value in fields if value not in (None, [])]
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(x) for x in node) + "]"
    return repr(node)


def call_fingerprint(cls: type) -> Optional[str]:
    """The fingerprint of a class's own Python ``__call__`` (None: none, or no source), cached."""
    if cls not in _FINGERPRINTS:
        call = vars(cls).get("__call__")
        if not inspect.isfunction(call) or (call.__module__ or "").startswith("dali_autoproxy."):
            _FINGERPRINTS[cls] = None  # no Python call of its own, or ours (a joint call's adapter)
            return None
        try:
            _FINGERPRINTS[cls] = fingerprint(call)
        except (OSError, TypeError, SyntaxError):
            _FINGERPRINTS[cls] = None
        except (SystemError, RecursionError):  # CPython's parser called deep in a worker's stack: on a fresh one
            _FINGERPRINTS[cls] = _on_fresh_stack(fingerprint, call)
    return _FINGERPRINTS[cls]


def _on_fresh_stack(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a short-lived thread (its own, shallow stack); None if it fails there too.
    Python 3.11's AST constructor can fail ("recursion depth mismatch") when called deep in a stack."""
    import threading
    result: list = [None]

    def run() -> None:
        try:
            result[0] = fn(*args)
        except Exception:
            pass
    thread = threading.Thread(target=run, name="dali_autoproxy-fingerprint")
    thread.start()
    thread.join()
    return result[0]


def register_by_code(*fingerprints: str) -> Callable[[Converter], Converter]:
    """Register ``fn`` for any class whose own ``__call__`` has one of these fingerprints: a class
    recognised by its code (a wrapper that only calls ``self.transform``), whatever its name."""
    def deco(fn: Converter) -> Converter:
        for f in fingerprints:
            if f in _BY_CODE:
                raise ValueError(f"code {f} already has a converter")
            _BY_CODE[f] = fn
        return fn
    return deco


# the methods a transform's call goes through (v1 and v2): a subclass overriding none is its parent
CALL_PATH = ("__call__", "forward", "_transform", "transform", "make_params", "_get_params", "get_params",
             "_needs_transform_list", "_call_kernel", "_extract_params_for_v1_transform")


def _own_converter(cls: type):
    found = _REGISTRY.get(cls) or _NAMED.get(f"{cls.__module__}.{cls.__qualname__}")
    if found is None and _BY_CODE and "__call__" in vars(cls):
        found = _BY_CODE.get(call_fingerprint(cls) or "")
    return found


def _converter(cls: type):
    """The converter of ``cls``: its own, else that of the nearest base class with one when no
    class between them defines a method of the call path (a subclass that only sets arguments in
    ``__init__``, as DINOv2's ``GaussianBlur(RandomApply)`` does, is its parent)."""
    found = _own_converter(cls)
    if found is not None:
        return found
    for klass in cls.__mro__[1:]:
        if klass is object:
            return None
        between = cls.__mro__[:cls.__mro__.index(klass)]
        if any(name in vars(k) for k in between for name in CALL_PATH):
            return None
        found = _own_converter(klass)
        if found is not None:
            return found
    return None


def lookup(transform: object) -> Converter:
    conv = _converter(type(transform))
    if conv is None:
        raise Unsupported(f"{type(transform).__module__}.{type(transform).__qualname__} "
                          "has no DALI translation")
    return conv


def compose_types() -> Tuple[type, ...]:
    """torchvision's Compose classes (v1, and v2 where this torchvision has it)."""
    import torchvision.transforms as T
    try:
        import torchvision.transforms.v2 as v2
        return (T.Compose, v2.Compose)
    except ImportError:  # pragma: no cover - torchvision without v2
        return (T.Compose,)


def is_chain(obj: object) -> bool:
    """A transform chain autoproxy may take over where it is called: a torchvision Compose or a
    transform it has a converter for (a user's registered equivalent included)."""
    if type(obj) in compose_types():
        return True
    return _converter(type(obj)) is not None


def flatten(transform: object) -> List[object]:
    """Unroll nested Compose (v1 and v2) into a flat list of transforms."""
    if type(transform) in compose_types():
        out: List[object] = []
        for t in transform.transforms:
            out.extend(flatten(t))
        return out
    return [transform]


def register_equivalent(cls: type, to_torchvision: Optional[Callable[[object], object]] = None):
    """Declare a transform class of your own equivalent to torchvision transforms, so a chain
    holding it moves to DALI whole. ``to_torchvision(instance)`` returns the torchvision
    transform (or Compose) to translate in its place; its random draws are torchvision's.
    Usable as a decorator: ``@register_equivalent(MyBlur)`` on ``def f(t): return T.GaussianBlur(...)``.
    Register at import time of the module that defines the class, so spawned workers have it too."""
    if to_torchvision is None:
        return lambda fn: register_equivalent(cls, fn)

    def convert(t, state: ChainState, alloc) -> Step:
        return translate_as(t, to_torchvision(t), state, alloc)
    register(cls)(convert)
    return to_torchvision


def translate_as(t: object, equivalent: object, state: ChainState, alloc) -> Step:
    """One Step for ``t`` made of the translation of ``equivalent`` (a transform or a Compose):
    its ops, its drawers in order, its neutral row where every part has one."""
    steps = [lookup(x)(x, state, alloc) for x in flatten(equivalent)]
    draws = [s.draw for s in steps if s.draw is not None]

    def draw(g) -> None:
        for d in draws:
            d(g)
    neutral = None if any(s.neutral is None for s in steps) else [v for s in steps for v in s.neutral]
    return Step(transform_name(t), [op for s in steps for op in s.ops], draw if draws else None, neutral)


def coin_drawer(p: float):
    """The draw of every "apply with probability p" transform: one ``torch.rand(1)`` per call,
    as torchvision makes it (v1 applies when it is < p, v2 skips when it is >= p: the same
    outcome); appends the 0/1 decision to the sample's params. The draw is ``uniform_(0, 1)`` on
    a reused tensor (what ``torch.rand`` is made of) and the comparison torch's: the float32
    value against ``p`` rounded to float32, as a tensor compared with a Python number is."""
    from dali_autoproxy.plan.translate.crop_draws import copies_hold, uniform

    threshold = float(np.float32(p))
    if not copies_hold():  # torch draws otherwise than the copy: its own call
        def draw_own(g) -> None:
            g.params.append(int(bool(torch.rand(1) < p)))
        return draw_own

    def draw(g) -> None:
        g.params.append(int(uniform() < threshold))  # the op's "apply", the next value in the row
    return draw


def v2_params(t: object) -> Callable:
    """A v2 transform's parameter method (``make_params`` since torchvision 0.21, ``_get_params``
    before); called with ``[standin]`` it makes the very RNG calls v2's forward makes."""
    return getattr(t, "make_params", None) or getattr(t, "_get_params")


def transform_name(t: object) -> str:
    mod = type(t).__module__
    prefix = "v2." if ".v2" in mod else ""
    return prefix + type(t).__name__


def chain_of(transform: Any) -> str:
    """Tells chains apart in every process (spawned workers too), for the report: each step's
    class and settings."""
    steps = [(type(t).__qualname__, sorted((k, repr(v)[:120]) for k, v in vars(t).items()) if hasattr(t, "__dict__")
              else repr(t)[:120]) for t in flatten(transform)]
    return hashlib.sha1(repr(steps).encode()).hexdigest()[:12]
