"""The shared-memory buffers a worker packs its batches' JPEG bytes into, used again once the
main process is done with them.

A fresh shared-memory buffer costs its worker twice: PyTorch reserves the whole file as it
allocates it, and the first copy into it faults in every page. Copying into a buffer that is
already mapped costs neither, so each worker keeps the buffers it has sent (``POOL_BUFFERS`` at
most) and packs into one again once the main process has let it go. Each buffer starts with a
``POOL_HEADER``-byte header whose first byte says whether the buffer is in flight: the worker
sets it as it packs, and the main process clears it when its last reference to the payload is
gone (``main/payload_release.py``), which is after DALI has read it and after any CPU replay of
its batch. A buffer the main process never clears (its batch was dropped unread, the loop still
holds it) is simply not used again: the worker allocates another one, as it would without the
pool.

A buffer's first trip passes it to the main process (a file descriptor, or a shared-memory
file's name, which the main process maps); the main process keeps it mapped, so the later trips
of a buffer it has let go of carry only its ``PoolSlot``. A buffer the worker drops from its pool
is marked ``RETIRED`` in its header's second byte, and the main process unmaps it.
"""
from __future__ import annotations

import itertools
import os
from typing import List, Optional, Tuple

import torch

from dali_autoproxy.transport import IN_FLIGHT, POOL_HEADER, RETIRED, RETIRED_AT, PoolSlot

POOL_BUFFERS = 32  # buffers a worker keeps (those in flight included): more than its batches in flight; 0: none
POOL_BYTES = 1 << 30  # past this, a worker keeps no free buffer (what is in flight is in flight anyway)
MIN_CAPACITY = 256 << 10  # a buffer's smallest size: small batches' bytes vary more than an eighth


_serials = itertools.count()


class _Buffer:
    __slots__ = ("storage", "flags", "capacity", "serial", "sent")

    def __init__(self, capacity: int) -> None:
        self.storage = torch.UntypedStorage._new_shared(POOL_HEADER + capacity)
        self.flags = torch.empty(0, dtype=torch.uint8).set_(self.storage, 0, (POOL_HEADER,)).numpy()
        self.capacity = capacity
        self.serial = next(_serials)
        self.sent = False  # packed into before: the main process has it mapped once it is free again

    @property
    def free(self) -> bool:
        return self.flags[0] != IN_FLIGHT

    def retire(self) -> None:
        self.flags[RETIRED_AT] = RETIRED


class PayloadPool:
    """One worker's buffers: ``take(n)`` gives an ``n``-byte uint8 tensor in shared memory, marked
    in flight, in a free buffer where one is large enough, else in a new one."""

    def __init__(self) -> None:
        self.buffers: List[_Buffer] = []
        self.taken = 0  # payloads packed

    def take(self, nbytes: int) -> Tuple[torch.Tensor, PoolSlot]:
        self.taken += 1
        if POOL_BUFFERS <= 0:  # every batch a new buffer (benchmarks compare it), kept by no pool
            buffer = _Buffer(nbytes)
            buffer.retire()
        else:
            buffer = self._free_buffer(nbytes) or self._new_buffer(nbytes)
        buffer.flags[0] = IN_FLIGHT
        slot = PoolSlot(os.getpid(), buffer.serial, nbytes, known=buffer.sent)
        buffer.sent = True
        return torch.empty(0, dtype=torch.uint8).set_(buffer.storage, POOL_HEADER, (nbytes,)), slot

    def _free_buffer(self, nbytes: int) -> Optional[_Buffer]:
        fits = [b for b in self.buffers if b.capacity >= nbytes and b.free]
        return min(fits, key=lambda b: b.capacity) if fits else None

    def _new_buffer(self, nbytes: int) -> _Buffer:
        """A new buffer with an eighth more room; to stay within the limits, free buffers leave
        the pool first (the smallest first), then the oldest of those in flight."""
        capacity = -(-max(nbytes + nbytes // 8, MIN_CAPACITY) // 4096) * 4096
        while self.buffers and (len(self.buffers) >= POOL_BUFFERS
                                or sum(b.capacity for b in self.buffers) + capacity > POOL_BYTES):
            free = [b for b in self.buffers if b.free]
            if not free and len(self.buffers) < POOL_BUFFERS:
                break  # only buffers in flight: their memory is in use whatever the pool keeps
            dropped = min(free, key=lambda b: b.capacity) if free else self.buffers[0]
            self.buffers.remove(dropped)
            dropped.retire()
        buffer = _Buffer(capacity)
        self.buffers.append(buffer)
        return buffer


_pool: Optional[PayloadPool] = None  # made in the worker that packs (the main process never has one)


def payload_buffer(nbytes: int) -> Tuple[torch.Tensor, PoolSlot]:
    """``nbytes`` of the worker's pooled shared memory, in flight until the main process lets go,
    and where it lies."""
    global _pool
    if _pool is None:
        _pool = PayloadPool()
    return _pool.take(nbytes)
