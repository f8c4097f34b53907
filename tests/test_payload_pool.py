"""A worker packs its batches' JPEG bytes into shared-memory buffers it uses again once the main
process has let go of them (worker/payload_pool.py, main/payload_release.py): a buffer the main
process still holds is never written into, a buffer's later trips carry only its slot, and the
batches stay plain torchvision's."""
from __future__ import annotations

import functools
import gc
import multiprocessing.util
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (its reductions: tensors share their storage)
import torchvision.transforms as T
from helpers import image_folder, load_all

from dali_autoproxy.main import iterator as main_iterator
from dali_autoproxy.main.payload_release import PooledPayloads
from dali_autoproxy.transport import FREE, IN_FLIGHT, POOL_HEADER, PoolSlot, ProxyBatch, ProxyGroup
from dali_autoproxy.worker import payload_pool
from dali_autoproxy.worker.payload_pool import PayloadPool


def _batch_of(taken) -> ProxyBatch:
    """A batch of one group holding ``pool.take``'s payload, as the worker sends it (pickled)."""
    payload, slot = taken if isinstance(taken, tuple) else (taken, PoolSlot(os.getpid(), -1, taken.numel(), False))
    group = ProxyGroup("plan", "encoded", [0], payload, np.array([0, payload.numel()]), None,
                       np.zeros((1, 1)), [None], pool=slot)
    return ProxyBatch(1, [group], [], [])


def release_when_gone(batches) -> None:
    PooledPayloads().receive(batches)


def _flag(payload: torch.Tensor) -> int:
    return int(torch.empty(0, dtype=torch.uint8).set_(payload.untyped_storage(), 0, (POOL_HEADER,))[0])


def test_a_buffer_is_used_again_only_once_the_main_process_let_go_of_it():
    pool = PayloadPool()
    first, _ = pool.take(1000)
    first_address = first.untyped_storage().data_ptr()
    assert first.storage_offset() == POOL_HEADER and first.untyped_storage().is_shared()
    assert _flag(first) == IN_FLIGHT
    second, _ = pool.take(1000)  # the first is in flight: another buffer
    assert second.untyped_storage().data_ptr() != first_address
    batch = _batch_of(first)
    release_when_gone([batch, batch])  # a payload seen twice is released once
    assert _flag(first) == IN_FLIGHT  # still held
    header = torch.empty(0, dtype=torch.uint8).set_(first.untyped_storage(), 0, (POOL_HEADER,))
    del batch, first
    gc.collect()
    assert header[0] == FREE
    again, _ = pool.take(900)
    assert again.untyped_storage().data_ptr() == first_address and header[0] == IN_FLIGHT
    bigger, _ = pool.take(payload_pool.MIN_CAPACITY * 2)  # nothing free is large enough: a new buffer
    assert bigger.untyped_storage().data_ptr() not in (first_address, second.untyped_storage().data_ptr())
    assert len(pool.buffers) == 3


def test_a_forked_child_that_drops_the_payload_does_not_free_it():
    """A worker forked while the main process holds a payload inherits the reference; the child
    letting go of it must leave the buffer in flight for the main process."""
    pool = PayloadPool()
    payload, _ = pool.take(1000)
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
    held = [pool.take(100)[0] for _ in range(5)]  # all in flight: the oldest leave the pool, not the memory
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


def test_a_buffers_later_trips_carry_its_slot_alone_and_find_its_bytes():
    """The worker's pickle of a group whose buffer the main process has mapped leaves the bytes
    out; the main process finds them in the buffer it kept, and frees the buffer as before. The
    buffers the worker retires are unmapped, so the main process holds no more than the pool."""
    pool, main = PayloadPool(), PooledPayloads()

    def trip(data: bytes):
        payload, slot = pool.take(len(data))
        payload.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
        sent = bytes(ForkingPickler.dumps(_batch_of((payload, slot))))  # as the worker's queue does
        del payload
        batch = pickle.loads(sent)
        arrived_with_payload = batch.groups[0].payload is not None
        main.receive([batch])
        got = bytes(batch.groups[0].payload.numpy())
        del batch
        gc.collect()
        return got, arrived_with_payload, b"rebuild_storage" in sent  # a storage passed (fd or file)

    first = trip(b"a" * 5000)
    later = [trip(bytes([i]) * (4000 + i)) for i in range(5)]
    assert first == (b"a" * 5000, True, True)
    for i, (got, with_payload, storage_passed) in enumerate(later):  # the same buffer, by its slot
        assert got == bytes([i]) * (4000 + i) and not with_payload and not storage_passed
    assert len(pool.buffers) == 1 and len(main.mapped) == 1 and all(b.free for b in pool.buffers)


def test_retired_buffers_are_unmapped(monkeypatch):
    monkeypatch.setattr(payload_pool, "POOL_BUFFERS", 2)
    pool, main = PayloadPool(), PooledPayloads()
    held = []
    for k in range(6):  # each kept in flight: every new buffer retires the oldest
        batch = pickle.loads(ForkingPickler.dumps(_batch_of(pool.take(100 + k))))
        main.receive([batch])
        held.append(batch)
    assert len(pool.buffers) == 2 and len(main.mapped) == 2
    assert {(os.getpid(), b.serial) for b in pool.buffers} == set(main.mapped)
    monkeypatch.setattr(payload_pool, "POOL_BUFFERS", 0)  # no pool: nothing stays mapped
    main.receive([pickle.loads(ForkingPickler.dumps(_batch_of(pool.take(100))))])
    assert len(main.mapped) == 2


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
    kept, by_slot = [], []
    real_receive = PooledPayloads.receive

    def keep_some(self, proxies):
        groups = [g for pb in proxies for g in pb.groups]
        by_slot.extend(g.payload is None for g in groups)
        real_receive(self, proxies)
        for group in groups:
            assert group.pooled
            if len(kept) < 6:
                kept.append((group.payload, group.payload.clone()))
    monkeypatch.setattr(main_iterator.PooledPayloads, "receive", keep_some)
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
    assert sum(by_slot) == len(by_slot) - sum(buffers for _, buffers in counts)  # every trip after a buffer's first


class _WithTargets(torch.utils.data.Dataset):
    """An image with its label, a small mask and a large tensor (past ``INLINE_BYTES`` once stacked)."""

    def __init__(self, root, chain):
        self.folder = image_folder(root, chain)

    def __len__(self):
        return len(self.folder)

    def __getitem__(self, i):
        image, label = self.folder[i]
        g = torch.Generator().manual_seed(i)
        return {"image": image, "label": label, "mask": torch.randint(0, 255, (32, 32), dtype=torch.uint8, generator=g),
                "large": torch.rand(200, 200, generator=g)}


def test_a_batchs_small_tensors_travel_inline_and_come_back_as_plains(photo_root):
    """Labels and small masks cross inside the batch's pickle (no shared-memory file each), a
    large tensor as plain sends it; the batches are plain's over two epochs."""
    import dali_autoproxy
    chain = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = _WithTargets(photo_root, chain)
    ref = load_all(ds, autoproxy=False, batch_size=2, shuffle=True, epochs=2)
    out = load_all(ds, autoproxy=True, batch_size=2, shuffle=True, epochs=2, strict=True)
    assert len(ref) == len(out)
    for a, b in zip(ref, out):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    dali_autoproxy.enable(device="cpu", strict=True, log_level="WARNING")
    try:
        shared = [(b["label"].is_shared(), b["mask"].is_shared(), b["large"].is_shared())
                  for b in torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)]
    finally:
        dali_autoproxy.disable()
    assert shared and all(s == (False, False, True) for s in shared), shared


class _WithSparse(_WithTargets):
    def __getitem__(self, i):
        sample = super().__getitem__(i)
        return {"image": sample["image"], "sparse": torch.eye(3).to_sparse()}


def test_what_default_collate_refuses_it_still_refuses_with_plains_error(photo_root):
    """The small-tensor path leaves default_collate's refusals alone: a batch of sparse tensors
    raises plain's error, through the DataLoader's worker error, proxied or not."""
    import pytest
    chain = T.Compose([T.RandomResizedCrop(48), T.PILToTensor()])
    ds = _WithSparse(photo_root, chain)
    errors = []
    for autoproxy in (False, True):
        with pytest.raises(RuntimeError) as raised:
            load_all(ds, autoproxy=autoproxy, batch_size=2, epochs=1)
        errors.append(str(raised.value).strip().splitlines()[-1])
    assert errors[0] == errors[1] and "sparse" in errors[0], errors
