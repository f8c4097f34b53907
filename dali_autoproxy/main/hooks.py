"""Patching, in the manner of OpenTelemetry's BaseInstrumentor: an idempotent
instrument()/uninstrument() pair and a record of every attribute patched.

Attributes are wrapped in place with wrapt, on the class itself, so a DataLoader imported
with ``from torch.utils.data import DataLoader`` before enable() is patched too and
``isinstance`` is unchanged. If torch is not imported yet, a post-import hook patches it
when it is, so enabling at interpreter start-up does not import torch.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, List, Optional, Tuple

import wrapt

from dali_autoproxy.config import Options, logger

_DATALOADER_MODULE = "torch.utils.data.dataloader"


_MISSING = object()


class Instrumentor:
    def __init__(self) -> None:
        self.options: Optional[Options] = None
        self._patched: List[Tuple[Any, str, Any]] = []  # (owner, attribute, original or _MISSING)
        self._hook_registered = False
        self._lock = threading.RLock()
        self.states: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        self.records: List[dict] = []
        self.proxy = True      # False: arm A of an A/B run, which only measures
        self.recorder = None   # a measure.Recorder during A/B runs

    @property
    def active(self) -> bool:
        return self.options is not None

    def instrument(self, options: Options, *, proxy: bool = True, recorder: Any = None) -> None:
        """Patch (once) and set the options; ``proxy=False`` and ``recorder`` are the A/B
        command's: arm A measures plain loaders, and the recorder times every loader."""
        with self._lock:
            self.options = options  # a second enable() only updates the options
            self.proxy, self.recorder = proxy, recorder
            from dali_autoproxy.plan.planning import SETTINGS
            SETTINGS.update(fidelity=options.fidelity, resize=options.resize)
            if not self._hook_registered:
                wrapt.register_post_import_hook(self._patch_dataloader, _DATALOADER_MODULE)
                self._hook_registered = True
            else:
                import sys
                module = sys.modules.get(_DATALOADER_MODULE)
                if module is not None:
                    self._patch_dataloader(module)

    def uninstrument(self) -> None:
        with self._lock:
            for owner, name, original in reversed(self._patched):
                if original is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            self._patched.clear()
            self.options = None
            from dali_autoproxy.plan.planning import DEFAULT_SETTINGS, SETTINGS
            SETTINGS.update(DEFAULT_SETTINGS)
            self.proxy, self.recorder = True, None

    def wrap(self, owner: Any, name: str, wrapper: Callable) -> None:
        """Wrap ``owner.name`` in place with a wrapt wrapper (once), recording the original; an
        inherited attribute gets the wrapper on ``owner`` itself, removed again on undo."""
        with self._lock:
            own = owner.__dict__.get(name, _MISSING)
            if isinstance(own, wrapt.FunctionWrapper):  # already ours
                return
            wrapt.wrap_function_wrapper(owner, name, wrapper)
            self._patched.append((owner, name, own))

    # -- patches
    def _patch_dataloader(self, module: Any) -> None:
        with self._lock:
            if not self.active:  # hook fired after disable()
                return
            self.wrap(module.DataLoader, "__init__", self._on_init)
            self.wrap(module.DataLoader, "_get_iterator", self._on_get_iterator)

    def state_for(self, loader: Any):
        from dali_autoproxy.main.loader import LoaderState
        state = self.states.get(loader)
        if state is None:
            state = LoaderState(loader)
            self.states[loader] = state
            self.records.append(state.record)
        return state

    def _on_init(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        try:
            from dali_autoproxy.main.loader import decide
            if self.active and not self.proxy:
                self.state_for(instance).record.update(
                    reason="the plain arm (A) of dali-autoproxy ab: torchvision as the script wrote it, measured")
            elif self.active:
                self.state_for(instance).update(decide(instance, self.options), self.options)
        except Exception:  # the shim must never break the user's script
            logger.debug("planning at DataLoader creation failed", exc_info=True)
        return result

    def _on_get_iterator(self, wrapped, instance, args, kwargs):
        options = self.options
        if options is None:
            return wrapped(*args, **kwargs)
        from dali_autoproxy.main.loader import CountedIterator, make_iterator
        state = self.state_for(instance)
        state.record["iterated"] = True
        if self.proxy:
            iterator = make_iterator(wrapped, instance, state, options)
        else:
            iterator = CountedIterator(wrapped(*args, **kwargs), state.record, instance._auto_collation)
        if self.recorder is not None:
            iterator = self.recorder.wrap(iterator, state.record)
        return iterator


instrumentor = Instrumentor()
