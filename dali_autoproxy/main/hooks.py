"""The DataLoader hooks, in the main process: what enable() and disable() turn on and off.

``DataLoader.__init__`` decides per loader (``decision.py``) and ``_get_iterator`` hands back
the proxied iterator (``iterator.py``); both through the patch ledger (``patches.py``), which
records and undoes them. If torch is not imported yet, a post-import hook patches it when it
is, so enabling at interpreter start-up imports neither torch nor DALI: this module imports
only the ledger and the options, and the loader side (which imports torch) when a hook first
runs. torch's and torchvision's versions are checked before patching.
"""
from __future__ import annotations

import importlib
import sys
import threading
import weakref
from typing import Any, List, Optional

import wrapt

from dali_autoproxy.config import Options, logger
from dali_autoproxy.patches import ledger, unsupported
from dali_autoproxy.plan import settings

_DATALOADER_MODULE = "torch.utils.data.dataloader"
ARM_A_REASON = "the plain arm (A) of dali-autoproxy ab: torchvision as the script wrote it, measured"


def _loader_side():
    """The main-process loader modules (they import torch and torchvision): loaded when a hook
    first runs, which is after torch is imported, so that ``import dali_autoproxy`` stays light."""
    return importlib.import_module("dali_autoproxy.main.iterator")


class DataLoaderHooks:
    """An idempotent instrument()/uninstrument() pair for torch's DataLoader, the per-loader
    state and report rows, and the A/B command's switches (arm A measures only)."""

    def __init__(self) -> None:
        self.options: Optional[Options] = None
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
            settings.configure(fidelity=options.fidelity, resize=options.resize, record=options.record,
                               strict=options.strict, augmix=options.augmix)
            if not self._hook_registered:
                wrapt.register_post_import_hook(self._patch_dataloader, _DATALOADER_MODULE)
                self._hook_registered = True
            else:
                module = sys.modules.get(_DATALOADER_MODULE)
                if module is not None:
                    self._patch_dataloader(module)

    def uninstrument(self) -> None:
        with self._lock:
            ledger.undo_all()
            for state in list(self.states.values()):  # idle pipelines hold GPU memory: free them now
                state.close()
            loader_state = sys.modules.get("dali_autoproxy.main.state")  # loaded once a loader was planned
            if loader_state is not None:
                loader_state.kept_runners.close()
            self.options = None
            settings.reset()
            self.proxy, self.recorder = True, None

    def _patch_dataloader(self, module: Any) -> None:
        with self._lock:
            if not self.active:  # hook fired after disable()
                return
            why = unsupported("torch") or unsupported("torchvision") or unsupported("PIL") or unsupported("timm")
            if why:
                logger.warning("not enabled: %s", why)
                return
            ledger.wrap(module.DataLoader, "__init__", self._on_init)
            ledger.wrap(module.DataLoader, "_get_iterator", self._on_get_iterator)

    def state_for(self, loader: Any):
        state = self.states.get(loader)
        if state is None:
            state = _loader_side().LoaderState(loader)
            self.states[loader] = state
            self.records.append(state.record)
        return state

    def _on_init(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        try:
            if self.active and not self.proxy:
                self.state_for(instance).record.update(reason=ARM_A_REASON)
            elif self.active:
                self.state_for(instance).update(_loader_side().decide(instance, self.options), self.options,
                                                announce=False)
        except Exception as exc:  # the shim must never break the user's script; planned again when iterated
            logger.warning("planning at DataLoader creation failed (%s: %s); the loader is "
                           "planned again when it is iterated", type(exc).__name__, exc)
            logger.debug("the planning traceback", exc_info=True)
        return result

    def _on_get_iterator(self, wrapped, instance, args, kwargs):
        options = self.options
        if options is None:
            return wrapped(*args, **kwargs)
        side = _loader_side()
        state = self.state_for(instance)
        state.record["iterated"] = True
        if self.proxy:
            iterator = side.make_iterator(wrapped, instance, state, options)
        else:
            iterator = side.CountedIterator(wrapped(*args, **kwargs), state.record, instance._auto_collation)
        if self.recorder is not None:
            iterator = self.recorder.wrap(iterator, state.record)
        return iterator


instrumentor = DataLoaderHooks()
