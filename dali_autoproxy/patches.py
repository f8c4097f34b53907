"""The patch ledger, in the manner of OpenTelemetry's ``BaseInstrumentor``: every attribute the
package patches, in any process, is wrapped here, once, with wrapt, and recorded, so that
``disable()`` undoes exactly what was done; and the library versions the patches were written
against, declared and checked before anything is patched.

Attributes are wrapped in place, on the class itself, so a class imported with ``from ...
import`` before enable() is patched too and ``isinstance`` is unchanged. Generic: it knows no
DataLoader, no chain, no option.
"""
from __future__ import annotations

import logging
import re
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import wrapt

# per library (module: (major, minor)): the oldest version the patches and plans are written
# against, and the newest the tests ran on. Older: not patched. Newer: patched where the private
# internals below are still there, with one warning that it is untested.
SUPPORTED: Dict[str, Tuple[int, int]] = {"torch": (2, 0), "torchvision": (0, 15), "nvidia.dali": (1, 40),
                                         "PIL": (9, 1), "timm": (0, 9)}
TESTED: Dict[str, Tuple[int, int]] = {"torch": (2, 14), "torchvision": (0, 29), "nvidia.dali": (2, 4),
                                      "PIL": (13, 0), "timm": (1, 0)}
# the private internals of a library that every proxied loader stands on, by dotted name: a
# release that moved one is not patched (plain torchvision runs, with the reason), whatever its
# version says. (torchvision's, which single transforms use, are looked up when a chain is
# translated: plan/tv_internals.py; a chain whose internals moved runs as written.)
PRIVATE_INTERNALS: Dict[str, List[str]] = {
    "torch": ["torch.utils.data._utils.fetch._MapDatasetFetcher.fetch",
              "torch.utils.data.dataloader.DataLoader._get_iterator",
              "torch.utils.data._utils.pin_memory.pin_memory"],
}

_MISSING = object()


def version_tuple(text: str) -> Tuple[int, int]:
    """'2.11.0+cu130' -> (2, 11); unreadable -> (0, 0)."""
    m = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def unsupported(module_name: str, version: Optional[str] = None) -> Optional[str]:
    """Why the loaded (or given) version of a declared library is not supported; None when it is
    (or the module is not loaded: it is checked when it is)."""
    if version is None:
        module = sys.modules.get(module_name)
        if module is None:
            return None
        version = getattr(module, "__version__", "0.0")
    least = SUPPORTED[module_name]
    if version_tuple(version) < least:
        return f"{module_name} {version} is older than the oldest supported, {least[0]}.{least[1]}"
    moved = [name for name in PRIVATE_INTERNALS.get(module_name, ()) if _resolve(name) is _MISSING]
    if moved:
        return f"{module_name} {version} has no {moved[0]}, which the package relies on"
    newest = TESTED[module_name]
    if version_tuple(version) > newest and module_name not in _warned_untested:
        _warned_untested.add(module_name)
        logging.getLogger("dali_autoproxy").warning(
            "%s %s is newer than the newest tested, %d.%d; it runs, its internals being where they "
            "were: compare with `python -m dali_autoproxy ab`", module_name, version, *newest)
    return None


_warned_untested: set = set()


def _resolve(dotted: str) -> Any:
    """The object a dotted name names (a module's attribute, nested), or _MISSING."""
    import importlib
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, _MISSING)
            if obj is _MISSING:
                break
        return obj
    return _MISSING


class PatchLedger:
    """What was patched, and how to undo it. Thread-safe; wrapping twice is a no-op."""

    def __init__(self) -> None:
        # (owner, attribute, original or _MISSING, the wrapper installed)
        self._patched: List[Tuple[Any, Any, Any, Any]] = []
        # (id(owner), attribute) -> the wrappers installed there: whether a wrapper is ours is looked
        # up, not searched for among every patch (the stage's graph captures ask on the pipeline
        # thread); the owners are held by ``_patched`` until undone, so their ids stay theirs
        self._installed: Dict[Tuple[int, Any], List[Any]] = {}
        self._lock = threading.RLock()

    def _ours(self, owner: Any, name: Any, current: Any) -> bool:
        """Whether ``current`` is a wrapper this ledger installed there (another library's wrapt
        wrapper on the same attribute is not: it gets ours around it, and keeps it on undo)."""
        return any(w is current for w in self._installed.get((id(owner), name), ()))

    def wrap(self, owner: Any, name: Any, wrapper: Callable) -> None:
        """Wrap ``owner.name`` in place with a wrapt wrapper (once), recording the original; an
        inherited attribute gets the wrapper on ``owner`` itself, removed again on undo. An
        ``owner`` that is a dict (a kernel table) has its item ``name`` wrapped."""
        with self._lock:
            if isinstance(owner, dict):
                own = owner.get(name, _MISSING)
                if own is not _MISSING and not self._ours(owner, name, own):
                    owner[name] = wrapt.FunctionWrapper(own, wrapper)
                    self._record(owner, name, own, owner[name])
                return
            own = owner.__dict__.get(name, _MISSING)
            if own is not _MISSING and self._ours(owner, name, own):
                return
            wrapt.wrap_function_wrapper(owner, name, wrapper)
            self._record(owner, name, own, owner.__dict__.get(name))

    def _record(self, owner: Any, name: Any, original: Any, installed: Any) -> None:
        self._patched.append((owner, name, original, installed))
        self._installed.setdefault((id(owner), name), []).append(installed)

    def undo_all(self) -> None:
        """Restore every patched attribute, newest first."""
        with self._lock:
            for owner, name, original, _ in reversed(self._patched):
                if isinstance(owner, dict):
                    owner[name] = original
                elif original is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            self._patched.clear()
            self._installed.clear()

    def patched(self) -> List[str]:
        """'module.Class.attribute' of each patch in place."""
        with self._lock:
            return [f"kernel table[{getattr(n, '__qualname__', n)}]" if isinstance(o, dict) else
                    f"{getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', o)}.{n}"
                    for o, n, _, _ in self._patched]


ledger = PatchLedger()
