"""Whether this thread is inside a proxied loader's fetch, and the chains it routes.

One small piece of state per thread: the :class:`~dali_autoproxy.worker.chains.ChainRouter` of
the fetch in progress (a DataLoader worker's, or the main process's own when
``num_workers=0``), and how deep inside a chain that runs for real the thread is (the calls
inside such a chain are left alone). Everything that patches behaviour in a worker reads it,
so it imports nothing of the package.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional


class _Local(threading.local):
    router: Optional[Any] = None  # a ChainRouter while a proxied fetch runs in this thread
    depth: int = 0  # > 0 while a chain runs for real: the calls inside it are not taken
    declined: Optional[str] = None  # why the joint call this one runs inside was left as written


local = _Local()


def routing_active() -> bool:
    """Whether this thread is inside a proxied loader's fetch (a worker, or num_workers=0)."""
    return local.router is not None


@contextlib.contextmanager
def routing(router: Any) -> Iterator[None]:
    """Chains called in this thread go through ``router`` (the num_workers=0 fetch)."""
    previous, local.router = local.router, router
    try:
        yield
    finally:
        local.router = previous
