"""The one walker over nested samples and batches, as torchvision v2 flattens a sample once.

A sample (what ``__getitem__`` returns) and a batch (what a collate returns) nest images in
tuples, lists, dicts and namedtuples, the containers ``default_collate`` follows. Every place
that looks for images in them (a worker's collate, the main process putting DALI's tensors
back) flattens once into leaves and a :class:`Spec`, works on the leaves, and rebuilds with
:func:`unflatten`. Anything else is a leaf. A mapping type that cannot be built from a dict
comes back as a dict, as ``default_collate`` makes it.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

Path = Tuple[Any, ...]  # the keys and indices from the root to a leaf


class Spec:
    """The shape of a nested value: its containers, with the leaves left out."""
    __slots__ = ("kind", "like", "keys", "children")

    def __init__(self, kind: str, like: Any = None, keys: tuple = (), children: tuple = ()):
        self.kind = kind          # "leaf", "tuple", "namedtuple", "list" or "dict"
        self.like = like          # the container's type (dict: the original, to rebuild its type)
        self.keys = keys          # a dict's keys, in order
        self.children = children  # one Spec per item

    def __eq__(self, other: object) -> bool:
        """Same containers, same types, same keys (the leaves may differ)."""
        if not isinstance(other, Spec) or self.kind != other.kind:
            return False
        if self.kind == "leaf":
            return True
        same_type = type(self.like) is type(other.like) if self.kind == "dict" else self.like is other.like
        return same_type and self.keys == other.keys and self.children == other.children

    __hash__ = None  # type: ignore[assignment]


LEAF = Spec("leaf")


def flatten(obj: Any) -> Tuple[List[Any], Spec]:
    """The leaves of ``obj`` in depth-first order, and its Spec."""
    leaves: List[Any] = []
    return leaves, _flatten(obj, leaves)


def _flatten(obj: Any, leaves: List[Any]) -> Spec:
    if isinstance(obj, tuple):
        kind = "namedtuple" if hasattr(obj, "_fields") else "tuple"
        return Spec(kind, type(obj), (), tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, list):
        return Spec("list", list, (), tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        keys = tuple(obj)
        return Spec("dict", obj, keys, tuple(_flatten(obj[k], leaves) for k in keys))
    leaves.append(obj)
    return LEAF


def unflatten(spec: Spec, leaves: List[Any]) -> Any:
    """``obj`` rebuilt from its Spec and (new) leaves, in flatten's order."""
    it = iter(leaves)
    return _unflatten(spec, it)


def _unflatten(spec: Spec, it) -> Any:
    if spec.kind == "leaf":
        return next(it)
    items = [_unflatten(c, it) for c in spec.children]
    if spec.kind == "namedtuple":
        return spec.like(*items)
    if spec.kind == "tuple":
        return spec.like(items)
    if spec.kind == "list":
        return items
    return same_mapping(spec.like, dict(zip(spec.keys, items)))


def same_mapping(like: dict, items: dict) -> dict:
    """``items`` in the mapping type of ``like`` (as default_collate rebuilds a mapping)."""
    if type(like) is dict:
        return items
    try:
        return type(like)(items)
    except TypeError:  # a mapping type that cannot be built from a dict: as default_collate, a dict
        return items


def paths(spec: Spec, prefix: Path = ()) -> List[Path]:
    """The path of each leaf, in flatten's order."""
    if spec.kind == "leaf":
        return [prefix]
    keys = spec.keys if spec.kind == "dict" else range(len(spec.children))
    return [p for k, c in zip(keys, spec.children) for p in paths(c, prefix + (k,))]


def map_leaves(obj: Any, fn: Callable[[Path, Any], Any], select: Optional[Callable[[Any], bool]] = None) -> Any:
    """``obj`` rebuilt with ``fn(path, leaf)`` in place of each leaf ``select`` picks (all by
    default); a value with no such leaf comes back as it is, not rebuilt."""
    leaves, spec = flatten(obj)
    picked = [select is None or select(x) for x in leaves]
    if not any(picked):
        return obj
    new = [fn(p, x) if keep else x for p, x, keep in zip(paths(spec), leaves, picked)]
    return unflatten(spec, new)


def batch_length(batch: Any) -> int:
    """Samples in a collated batch: the first dimension of its first tensor (0 when none)."""
    import torch  # the walker itself needs no torch; this count does
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_length(item)
            if n:
                return n
    return 0
