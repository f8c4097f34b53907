"""The patch ledger, in the manner of OpenTelemetry's ``BaseInstrumentor``: every attribute the
package patches, in any process, is wrapped here, once, with wrapt, and recorded, so that
``disable()`` undoes exactly what was done; and the library versions the patches were written
against, declared and checked before anything is patched.

Attributes are wrapped in place, on the class itself, so a class imported with ``from ...
import`` before enable() is patched too and ``isinstance`` is unchanged. Generic: it knows no
DataLoader, no chain, no option.
"""
from __future__ import annotations

import re
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import wrapt

# the oldest versions the patches and the plans are written against (module: (major, minor))
SUPPORTED: Dict[str, Tuple[int, int]] = {"torch": (2, 0), "torchvision": (0, 15), "nvidia.dali": (1, 40)}

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
    return None


class PatchLedger:
    """What was patched, and how to undo it. Thread-safe; wrapping twice is a no-op."""

    def __init__(self) -> None:
        # (owner, attribute, original or _MISSING, the wrapper installed)
        self._patched: List[Tuple[Any, Any, Any, Any]] = []
        self._lock = threading.RLock()

    def _ours(self, owner: Any, name: Any, current: Any) -> bool:
        """Whether ``current`` is a wrapper this ledger installed there (another library's wrapt
        wrapper on the same attribute is not: it gets ours around it, and keeps it on undo)."""
        return any(o is owner and n == name and w is current for o, n, _, w in self._patched)

    def wrap(self, owner: Any, name: Any, wrapper: Callable) -> None:
        """Wrap ``owner.name`` in place with a wrapt wrapper (once), recording the original; an
        inherited attribute gets the wrapper on ``owner`` itself, removed again on undo. An
        ``owner`` that is a dict (a kernel table) has its item ``name`` wrapped."""
        with self._lock:
            if isinstance(owner, dict):
                own = owner.get(name, _MISSING)
                if own is not _MISSING and not self._ours(owner, name, own):
                    owner[name] = wrapt.FunctionWrapper(own, wrapper)
                    self._patched.append((owner, name, own, owner[name]))
                return
            own = owner.__dict__.get(name, _MISSING)
            if own is not _MISSING and self._ours(owner, name, own):
                return
            wrapt.wrap_function_wrapper(owner, name, wrapper)
            self._patched.append((owner, name, own, owner.__dict__.get(name)))

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

    def patched(self) -> List[str]:
        """'module.Class.attribute' of each patch in place."""
        with self._lock:
            return [f"kernel table[{getattr(n, '__qualname__', n)}]" if isinstance(o, dict) else
                    f"{getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', o)}.{n}"
                    for o, n, _, _ in self._patched]


ledger = PatchLedger()
