"""Handing a worker's pooled payload buffer back (``worker/payload_pool.py``).

The main process clears the buffer's in-flight byte when its last reference to the payload
tensor is gone: after DALI has read the bytes (the pipeline keeps the payload until its
outputs are out), after a CPU replay of the batch, and after the batch's groups are dropped,
whichever path the batch took. Until then the worker does not write into the buffer again.
"""
from __future__ import annotations

import os
import weakref
from typing import Iterable

import numpy as np
import torch

from dali_autoproxy.transport import FREE, POOL_HEADER, ProxyBatch


def _mark_free(flags: np.ndarray, pid: int) -> None:
    """Free the buffer, in the process that holds the payload only: a worker forked while the
    main process held it inherits the reference (a pipeline thread's frame, which the fork frees in
    the child) and must not free the buffer the main process is still reading."""
    if os.getpid() == pid:
        flags[0] = FREE


def release_when_gone(proxies: Iterable[ProxyBatch]) -> None:
    """For each pooled payload of the batches' groups (a payload several groups share, once):
    free its buffer when the payload tensor is freed. The callback holds a view of the header
    alone, so the buffer stays mapped until the byte is written, and is not kept beyond."""
    seen = set()
    for pb in proxies:
        for group in pb.groups:
            payload = group.payload
            if not group.pooled or id(payload) in seen:
                continue
            seen.add(id(payload))
            header = torch.empty(0, dtype=torch.uint8).set_(payload.untyped_storage(), 0, (POOL_HEADER,))
            weakref.finalize(payload, _mark_free, header.numpy(), os.getpid())
