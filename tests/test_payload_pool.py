"""A worker packs its batches' JPEG bytes into shared-memory buffers it uses again once the main
process has let go of them (worker/payload_pool.py, main/payload_release.py): a buffer the main
process still holds is never written into, and the batches stay plain torchvision's."""
from __future__ import annotations

import functools
import gc
import multiprocessing.util
import os

import numpy as np
import torch
import torchvision.transforms as T
from helpers import image_folder, load_all

from dali_autoproxy.main import iterator as main_iterator
from dali_autoproxy.main.payload_release import release_when_gone
from dali_autoproxy.transport import FREE, IN_FLIGHT, POOL_HEADER, ProxyBatch, ProxyGroup
from dali_autoproxy.worker import payload_pool
from dali_autoproxy.worker.payload_pool import PayloadPool


def _batch_of(payload: torch.Tensor) -> ProxyBatch:
    group = ProxyGroup("plan", "encoded", [0], payload, np.array([0, payload.numel()]), None,
                       np.zeros((1, 1)), [None], pooled=True)
    return ProxyBatch(1, [group], [], [])


def _flag(payload: torch.Tensor) -> int:
    return int(torch.empty(0, dtype=torch.uint8).set_(payload.untyped_storage(), 0, (POOL_HEADER,))[0])


def test_a_buffer_is_used_again_only_once_the_main_process_let_go_of_it():
    pool = PayloadPool()
    first = pool.take(1000)
    first_address = first.untyped_storage().data_ptr()
    assert first.storage_offset() == POOL_HEADER and first.untyped_storage().is_shared()
    assert _flag(first) == IN_FLIGHT
    second = pool.take(1000)  # the first is in flight: another buffer
    assert second.untyped_storage().data_ptr() != first_address
    batch = _batch_of(first)
    release_when_gone([batch, batch])  # a payload seen twice is released once
    assert _flag(first) == IN_FLIGHT  # still held
    header = torch.empty(0, dtype=torch.uint8).set_(first.untyped_storage(), 0, (POOL_HEADER,))
    del batch, first
    gc.collect()
    assert header[0] == FREE
    again = pool.take(900)
    assert again.untyped_storage().data_ptr() == first_address and header[0] == IN_FLIGHT
    bigger = pool.take(payload_pool.MIN_CAPACITY * 2)  # nothing free is large enough: a new buffer
    assert bigger.untyped_storage().data_ptr() not in (first_address, second.untyped_storage().data_ptr())
    assert len(pool.buffers) == 3


def test_a_forked_child_that_drops_the_payload_does_not_free_it():
    """A worker forked while the main process holds a payload inherits the reference; the child
    letting go of it must leave the buffer in flight for the main process."""
    pool = PayloadPool()
    payload = pool.take(1000)
    batch = _batch_of(payload)
    release_when_gone([batch])
    pid = os.fork()
    if pid == 0:  # the child: drops its copy of every reference, as a fork drops other threads' frames
        del batch, payload
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    assert _flag(payload) == IN_FLIGHT
    del batch
    header = torch.empty(0, dtype=torch.uint8).set_(payload.untyped_storage(), 0, (POOL_HEADER,))
    del payload
    gc.collect()
    assert header[0] == FREE


def test_the_pool_keeps_within_its_limits(monkeypatch):
    monkeypatch.setattr(payload_pool, "POOL_BUFFERS", 3)
    pool = PayloadPool()
    held = [pool.take(100) for _ in range(5)]  # all in flight: the oldest leave the pool, not the memory
    assert len(pool.buffers) == 3
    assert all(h.untyped_storage().nbytes() >= POOL_HEADER + 100 for h in held)
    monkeypatch.setattr(payload_pool, "POOL_BUFFERS", 32)
    monkeypatch.setattr(payload_pool, "POOL_BYTES", 5 * payload_pool.MIN_CAPACITY)
    pool = PayloadPool()
    for k in (1, 2, 3):  # each batch larger than any free buffer, let go of at once
        batch = _batch_of(pool.take(k * payload_pool.MIN_CAPACITY))
        release_when_gone([batch])
        del batch
        gc.collect()
        assert sum(b.capacity for b in pool.buffers) <= 5 * payload_pool.MIN_CAPACITY
    assert len(pool.buffers) == 1  # the two smaller free ones left to make room


def _count_at_exit(folder: str, worker_id: int) -> None:
    """worker_init_fn: at the worker's exit, how many payloads it packed into how many buffers."""
    def write() -> None:
        pool = payload_pool._pool
        with open(os.path.join(folder, f"{os.getpid()}"), "w") as f:
            f.write(f"{pool.taken if pool else 0} {len(pool.buffers) if pool else 0}")
    multiprocessing.util.Finalize(None, write, exitpriority=100)


def test_buffers_the_main_process_holds_are_never_written_into(photo_root, monkeypatch, tmp_path):
    """Real workers, batches of 2 over two epochs: the main process keeps the payloads of the
    first batches for the whole run (as a loop holding on would keep them in flight), and their
    bytes are unchanged at the end; every batch is plain torchvision's; the workers did pack
    into buffers they had used before."""
    kept = []

    def keep_some(proxies):
        for pb in proxies:
            for group in pb.groups:
                assert group.pooled
                if len(kept) < 6:
                    kept.append((group.payload, group.payload.clone()))
        release_when_gone(proxies)
    monkeypatch.setattr(main_iterator, "release_when_gone", keep_some)
    monkeypatch.setenv("DALI_AUTOPROXY_LOOKAHEAD", "2")  # few batches in flight: each worker's buffers come back
    chain = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = torch.utils.data.ConcatDataset([image_folder(photo_root, chain)] * 3)  # a dozen batches a worker
    ref = load_all(ds, autoproxy=False, batch_size=2, shuffle=True, epochs=2)
    out = load_all(ds, autoproxy=True, batch_size=2, shuffle=True, epochs=2, strict=True,
                   worker_init_fn=functools.partial(_count_at_exit, str(tmp_path)))
    assert len(ref) == len(out) and len(kept) == 6
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb) and torch.equal(a, b)
    for payload, original in kept:
        assert torch.equal(payload, original)

    counts = [tuple(map(int, open(p).read().split())) for p in tmp_path.iterdir()]
    assert len(counts) == 4  # two workers, two epochs
    assert sum(taken for taken, _ in counts) == 2 * len(ds) // 2
    assert all(buffers < taken for taken, buffers in counts), counts
