"""What a forked DataLoader worker inherits from the main process and must never free.

A worker made by ``fork`` starts with a copy of the main process's whole heap: the DALI
pipelines, their threads' objects, the torch stage's device memory, pinned buffers, CUDA events
and graphs. Their teardown talks to threads or a CUDA context that exist only in the parent; run
in the child it hangs or aborts the worker ("CUDA error: initialization error" in
``~TensorImpl``), which the DataLoader reports as a worker that exited unexpectedly, at the
start of the next epoch. The worker's own code never touches them, but the child frees objects
in three ways by itself:

1. **Thread-local storage of the parent's other threads.** CPython clears the states of every
   thread but the forking one in the child, and with them each thread's ``threading.local``
   values. So a ``threading.local`` may point at main-process state but never own it: the owner
   registers it here (``keep``).
2. **The cycle collector.** Garbage in a reference cycle that the parent had not collected yet
   (an exception's traceback holding a loader, say) would be collected by the child. So every
   collection is held off around the fork, and the child freezes what it inherited
   (``gc.freeze``: never collected there; Python's documented recipe for forking servers).
3. **Code run in the worker that drops a reference**: a transform, plan or dataset attribute
   replaced in the worker. So nothing a worker reaches (the dataset, its transforms, plans,
   recorded ops, the collate and worker_init_fn) holds main-process state: GPU state belongs to
   the runners and stages of ``backends`` and is created there (tests/test_fork_safety.py scans
   a loader's worker inputs for it).

``keep(obj)`` registers an object of the first kind; just before each fork every registered
object gets a strong reference that the child holds until it exits (the parent drops it right
after the fork).
"""
from __future__ import annotations

import gc
import os
import weakref
from typing import List, TypeVar

T = TypeVar("T")

_kept: "weakref.WeakSet" = weakref.WeakSet()
_held: List[object] = []  # strong references across a fork: in a child, for its whole life
_gc_was_enabled: List[bool] = []


def keep(obj: T) -> T:
    """Register ``obj`` as main-process state that a forked child must never free; returns it."""
    _kept.add(obj)
    return obj


def holding() -> bool:
    """Whether this process holds inherited state (a forked child, or the parent mid-fork):
    nothing here may tear down main-process state then."""
    return bool(_held)


def _before_fork() -> None:
    _held[:] = list(_kept)
    _gc_was_enabled[:] = [gc.isenabled()]
    gc.disable()  # no collection between here and the child's freeze


def _after_fork_in_parent() -> None:
    _held.clear()
    if _gc_was_enabled and _gc_was_enabled[0]:
        gc.enable()


def _after_fork_in_child() -> None:
    gc.freeze()  # what the parent left, garbage cycles included, is never collected here
    if _gc_was_enabled and _gc_was_enabled[0]:
        gc.enable()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
