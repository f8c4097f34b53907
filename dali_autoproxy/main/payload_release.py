"""The workers' pooled payload buffers (``worker/payload_pool.py``) on the main process's side:
kept mapped, found again by their slot, and handed back.

A buffer's first trip brings its tensor (its file descriptor or shared-memory file, mapped as
the batch is unpickled); the iterator keeps the whole buffer mapped, so a later trip of the same
buffer brings only its ``PoolSlot`` and costs no mapping. It unmaps the buffers its workers have
retired, and all of them with the iterator.

The main process clears a buffer's in-flight byte when its last reference to the payload tensor
is gone: after DALI has read the bytes (the pipeline keeps the payload until its outputs are
out), after a CPU replay of the batch, and after the batch's groups are dropped, whichever path
the batch took. Until then the worker does not write into the buffer again.
"""
from __future__ import annotations

import os
import weakref
from typing import Dict, Iterable, Optional, Tuple

import numpy as np
import torch

from dali_autoproxy.transport import FREE, POOL_HEADER, RETIRED, RETIRED_AT, PoolSlot, ProxyBatch


def _mark_free(flags: np.ndarray, pid: int) -> None:
    """Free the buffer, in the process that holds the payload only: a worker forked while the
    main process held it inherits the reference (a pipeline thread's frame, which the fork frees in
    the child) and must not free the buffer the main process is still reading."""
    if os.getpid() == pid:
        flags[0] = FREE


class _Mapped:
    __slots__ = ("buffer", "flags")

    def __init__(self, storage: torch.UntypedStorage):
        self.buffer = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
        self.flags = self.buffer[:POOL_HEADER].numpy()


class PooledPayloads:
    """One iterator's view of its workers' pools: the buffers it was sent, by (pid, serial)."""

    def __init__(self) -> None:
        self.mapped: Dict[Tuple[int, int], _Mapped] = {}

    def receive(self, proxies: Iterable[ProxyBatch]) -> None:
        """Give each pooled group of the batches its payload (a payload several groups share:
        one tensor), and free each payload's buffer when that tensor is freed (the callback
        holds the buffer's header, as a numpy view: mapped until the byte is written)."""
        payloads: Dict[int, torch.Tensor] = {}  # id(slot): the payload (views of one image share a slot)
        for pb in proxies:
            for group in pb.groups:
                slot = group.pool
                if slot is None:
                    continue
                payload = payloads.get(id(slot))
                if payload is None:
                    payload, mapped = self._payload(group.payload, slot)
                    payloads[id(slot)] = payload
                    weakref.finalize(payload, _mark_free, mapped.flags, os.getpid())
                group.payload = payload

    def _payload(self, sent: Optional[torch.Tensor], slot: PoolSlot) -> Tuple[torch.Tensor, _Mapped]:
        key = (slot.pid, slot.serial)
        if sent is not None:  # the buffer's first trip: kept mapped unless its worker keeps it no more
            mapped = _Mapped(sent.untyped_storage())
            if mapped.flags[RETIRED_AT] != RETIRED:
                self._unmap_retired(slot.pid)  # a worker retires a buffer as it makes a new one
                self.mapped[key] = mapped
            return sent, mapped
        mapped = self.mapped.get(key)
        if mapped is None:
            raise RuntimeError(f"dali_autoproxy: worker {slot.pid} sent buffer {slot.serial} by its slot, "
                               "but it never arrived here")
        return mapped.buffer[POOL_HEADER:POOL_HEADER + slot.nbytes], mapped

    def _unmap_retired(self, pid: int) -> None:
        """Unmap the worker's retired buffers. Only that worker's: its batches reach the iterator
        in the order it sent them, so a batch still to come that uses one of its buffers by slot
        was sent before the buffer was retired, and before this buffer's first trip."""
        for key in [k for k, m in self.mapped.items() if k[0] == pid and m.flags[RETIRED_AT] == RETIRED]:
            del self.mapped[key]
