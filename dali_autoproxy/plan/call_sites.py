"""How a dataset's own code calls a chain it holds, read from the source of its class.

A chain a dataset calls with the image and its target (``self.transforms(image, mask)``, the
segmentation and detection references' convention) is planned in the workers, per call: a
pipeline of the image alone, built before the first batch, would never run. torchvision's own
datasets say it by their class (``tv_internals.calls_transforms_with_targets``); a user's dataset
says it in its methods. Reading them is a hint, never a condition of correctness: where the
source is not there or the calls disagree, the chain is taken for the image's and its pipeline
is built up front, as for any chain of the image.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Optional, Set

_LIBRARY_PREFIXES = ("torch.", "torchvision.", "builtins")


def called_with_targets(owner: object, attribute: str) -> bool:
    """Whether every call of ``self.<attribute>(...)`` in the methods of ``owner``'s class (those
    of the user's code) passes two or more arguments, and there is at least one such call."""
    counts = _argument_counts(type(owner), attribute)
    return bool(counts) and min(counts) >= 2


@functools.lru_cache(maxsize=256)
def _argument_counts(cls: type, attribute: str) -> frozenset:
    """The argument counts of the calls ``self.<attribute>(...)`` in ``cls``'s own methods (its
    bases' too, up to the libraries'); -1 for a call with ``*args`` or ``**kwargs`` (any count)."""
    counts: Set[int] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith(_LIBRARY_PREFIXES):
            continue
        for member in vars(klass).values():
            fn = getattr(member, "__func__", member)
            if inspect.isfunction(fn):
                found = _calls_in(fn, attribute)
                if found is None:
                    return frozenset()  # a method without source: nothing can be said
                counts |= found
    return frozenset(counts)


def _calls_in(fn, attribute: str) -> Optional[Set[int]]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.args.args:
        return set()
    self_name = node.args.args[0].arg
    counts = set()
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == attribute
                and isinstance(call.func.value, ast.Name) and call.func.value.id == self_name):
            starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
            counts.add(-1 if starred else len(call.args) + len(call.keywords))
    return counts
