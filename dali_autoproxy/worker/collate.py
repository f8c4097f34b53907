"""Collating in a proxied loader's workers: proxied samples packed for DALI, and a user's
collate_fn called once per batch, here, as plain calls it (its main-process half:
``main/collate.py``).

A user's ``collate_fn`` (MixUp/CutMix on the collated batch, I-JEPA's mask collator, timm's
``fast_collate``, a detection-style ``tuple(zip(*batch))``, one that drops samples) is the
user's code: its side effects and random draws happen once per batch, in the worker, where plain
has them. Its images only exist in the main process once DALI has run, so in a proxied
loader's workers the collate_fn is :class:`CollateInMain`:

1. it packs the proxied images per position into ProxyBatches (as default_collate would);
2. it calls the user's collate once, each proxied image replaced by a tensor of its final shape
   and dtype on torch's ``meta`` device, recording the torch calls made on them
   (``collate_trace.py``): its own values (labels, masks, drawn numbers) are real;
3. it sends the result with the recording; the main process replays the recording on DALI's
   tensors.

A collate that needs the images' values cannot be recorded: the worker then sends the samples
and its random states as they stood before the collate, and the main process calls it on
DALI's tensors under those states (the same draws on the same images); the worker's own
generators are then where the failed attempt left them, and the attempt's side effects before
it failed happen again in the main process (logged once per loader).
"""
from __future__ import annotations

import contextlib
import random
import threading
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

from dali_autoproxy.config import logger
from dali_autoproxy.transport import (
    COLLATES_WITH_EQUIVALENTS,
    ENCODED,
    INLINE_BYTES,
    InlineTensor,
    PoolSlot,
    ProxyBatch,
    ProxyCollated,
    ProxyGroup,
    ProxySample,
    Slot,
    qualified_name,
)
from dali_autoproxy.tree import Path, flatten, map_leaves, unflatten
from dali_autoproxy.worker.collate_trace import NotTraceable, trace_collate
from dali_autoproxy.worker.payload_pool import payload_buffer
from dali_autoproxy.worker.routing import local


def _is_proxy(x: Any) -> bool:
    return isinstance(x, ProxySample)


def rng_states(own: Sequence[Any] = ()) -> tuple:
    """The worker's random states that a collate or a transform may draw from (torch, Python,
    numpy), and those of the generators ``own`` (``own_generators``: a transform's own)."""
    return torch.get_rng_state(), random.getstate(), np.random.get_state(), tuple(_state(g) for g in own), tuple(own)


def set_rng_states(states: tuple) -> None:
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    np.random.set_state(states[2])
    for generator, state in zip(states[4], states[3]):
        _set_state(generator, state)


_GENERATOR_TYPES = (torch.Generator, random.Random, np.random.Generator, np.random.RandomState)


def own_generators(obj: Any, limit: int = 500) -> List[Any]:
    """The random generators a transform holds of its own (its attributes, those of the transforms
    it holds, in lists, tuples, dicts and modules), not the global ones: a draw made again from the
    same states (a replan) must put these back too, or the transform's later draws leave plain's
    sequence. A generator held elsewhere (a closure, a module global) is not found."""
    found, seen, stack = [], set(), [obj]
    while stack and len(seen) < limit:
        item = stack.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, torch.Tensor, np.ndarray, types.ModuleType)):
            continue  # a module: its globals are not the transform's (torch's CUDA generators among them)
        seen.add(id(item))
        if isinstance(item, _GENERATOR_TYPES):
            if item is not random._inst and item is not torch.default_generator:
                found.append(item)
            continue
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack.extend(vars(item).values())
    return found


def _state(generator: Any) -> Any:
    if isinstance(generator, np.random.Generator):
        return generator.bit_generator.state
    return generator.get_state() if isinstance(generator, (torch.Generator, np.random.RandomState)) \
        else generator.getstate()


def _set_state(generator: Any, state: Any) -> None:
    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    elif isinstance(generator, (torch.Generator, np.random.RandomState)):
        generator.set_state(state)
    else:
        generator.setstate(state)


class CollateInMain:
    """The collate_fn of a proxied loader whose user collate_fn is not default_collate, in
    its workers. Picklable (for spawn workers) when the user's collate is."""

    def __init__(self, user_collate: Callable[[List[Any]], Any]):
        self.user_collate = user_collate
        self._warned = False

    def __call__(self, samples: List[Any]) -> Any:
        rng = rng_states()
        positions: Dict[Path, List[ProxySample]] = {}
        order: List[Path] = []
        slot_of: Dict[int, Slot] = {}  # id(ProxySample): where its image comes back

        def slot(path: Path, s: ProxySample) -> Slot:
            if id(s) not in slot_of:
                if path not in positions:
                    positions[path] = []
                    order.append(path)
                positions[path].append(s)
                slot_of[id(s)] = Slot(order.index(path), len(positions[path]) - 1)
            return slot_of[id(s)]

        inputs: List[torch.Tensor] = []
        slots: List[Slot] = []

        def standin(path: Path, s: ProxySample) -> torch.Tensor:
            if s.done is not None:
                return s.done  # finished in the worker: the real tensor
            slots.append(slot(path, s))
            inputs.append(torch.empty(s.shape, dtype=s.dtype, device="meta"))
            return inputs[-1]
        with_standins = [map_leaves(sample, standin, _is_proxy) for sample in samples]
        if not positions:  # nothing proxied in this batch: the user's collate, as plain
            return _done(self.user_collate(with_standins))
        with packing_once():
            batches = [collate_proxy_samples(positions[p]) for p in order]
        try:
            _, traced = trace_collate(self.user_collate, with_standins, inputs)
        except NotTraceable as exc:  # it needs the values: the real call in the main process
            self._say_once(exc)
        else:
            traced.inputs = slots
            return _done(ProxyCollated(None, batches, None, traced))

        def collect(path: Path, s: Any) -> Any:
            if not isinstance(s, ProxySample):  # a small tensor of the sample: inline (transport.InlineTensor)
                return InlineTensor(s)
            return s.done if s.done is not None else slot(path, s)
        skeleton = [map_leaves(sample, collect, lambda x: _is_proxy(x) or InlineTensor.fits(x)) for sample in samples]
        return _done(ProxyCollated(skeleton, batches, rng))

    def _say_once(self, exc: Exception) -> None:
        info = get_worker_info()
        if not self._warned and (info is None or info.id == 0):  # once per loader, not per worker
            self._warned = True
            name = getattr(self.user_collate, "__name__", self.user_collate)
            if qualified_name(self.user_collate) in COLLATES_WITH_EQUIVALENTS:
                logger.info("collate_fn %s copies the images into a batch: the main process "
                            "runs its equivalent on DALI's tensors (the images stacked where DALI made them)", name)
                return
            logger.info("collate_fn %s needs the images' values (%s); it runs in the main "
                        "process on DALI's tensors, under the worker's random states, and what it did "
                        "before that point in the worker happens again there", name, exc)


def mixed_to_samples(data: List[Any]) -> List[Any]:
    """Where some samples hold a ProxySample and others a plain tensor at the same place (a
    chain taken over for some samples only), the tensors become finished ProxySamples so that
    default_collate batches them together. Samples of different shapes are left as they are."""
    if not data:
        return data
    flat = [flatten(x) for x in data]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        return data
    columns = list(zip(*[leaves for leaves, _ in flat])) if flat[0][0] else []
    mixed = [any(isinstance(x, ProxySample) for x in col) for col in columns]
    if not any(mixed):
        return data
    out = []
    for leaves, s in flat:
        leaves = [ProxySample("", done=x) if m and isinstance(x, torch.Tensor) else x for x, m in zip(leaves, mixed)]
        out.append(unflatten(s, leaves))
    return out


class DefaultCollate:
    """default_collate in a proxied loader's workers, able to batch a mix of proxied and finished
    samples at one place (default_collate picks its handler from the first sample only). In a
    worker the batch's small tensors (labels, a small batch's masks) travel inside its pickle
    (``InlineTensor``), so that a batch crosses to the main process without a shared-memory file
    per tensor; the main process makes them tensors again (``main/collate.put_back``, or the pin
    thread pins them as it would have)."""

    def __call__(self, data: List[Any]) -> Any:
        in_worker = get_worker_info() is not None
        with packing_once():
            try:
                batch = _collate(data, in_worker)
            except TypeError:
                batch = _collate(mixed_to_samples(data), in_worker)
        if in_worker:
            batch = map_leaves(batch, lambda _, t: InlineTensor(t), InlineTensor.fits)
        return _done(batch)


def _stack_small_in_private_memory(batch: List[torch.Tensor], *,
                                   collate_fn_map: Optional[Dict] = None) -> torch.Tensor:
    """default_collate's tensor handler, but a stack small enough to travel inline is made in the
    worker's own memory, not in a shared-memory file it would not use (anything else, nested and
    sparse tensors with their errors included, as default_collate does it)."""
    elem = batch[0]
    if InlineTensor.fits(elem) and elem.numel() * elem.element_size() * len(batch) <= INLINE_BYTES:
        return torch.stack(batch, 0)
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def _collate(data: List[Any], in_worker: bool) -> Any:
    if not in_worker:
        return default_collate(data)
    handlers = dict(default_collate_fn_map)  # read at each call: handlers registered later count
    handlers[torch.Tensor] = _stack_small_in_private_memory
    return collate(data, collate_fn_map=handlers)


def _done(batch: Any) -> Any:
    """The batch as it leaves the worker: marked :class:`Unrouted` (with why) where the chains
    were called but no call was taken (``ChainRouter.batch_done``)."""
    router = local.router
    return router.batch_done(batch) if router is not None else batch


# ----------------------------------------------------------------------------- packing
def _uint8_buffer(nbytes: int) -> Tuple[torch.Tensor, Optional[PoolSlot]]:
    """In a worker, straight in its pooled shared memory, so sending it copies nothing (and where
    in the pool: the main process frees it)."""
    if get_worker_info() is not None:
        return payload_buffer(nbytes)
    return torch.empty(nbytes, dtype=torch.uint8), None


class _Packed(threading.local):
    """The encoded payloads packed so far in the collate call in progress, by the sources of
    their rows: a later position whose rows are the same JPEGs in the same order (another view
    of each image) takes the same shared-memory tensor, so the bytes travel, and are decoded,
    once. Only inside ``packing_once()``: buffer ids are unique only while one batch is alive."""
    memo: Optional[Dict[tuple, Tuple[torch.Tensor, np.ndarray, Optional[PoolSlot]]]] = None


_packed = _Packed()


@contextlib.contextmanager
def packing_once():
    """Around one batch's collate: positions holding the same images share their payload."""
    outer, _packed.memo = _packed.memo, {}
    try:
        yield
    finally:
        _packed.memo = outer


def _pack(key: str, kind: str, indices: List[int], samples: List[ProxySample]) -> ProxyGroup:
    payloads = [s.payload for s in samples]
    memo = _packed.memo
    sources = None
    if memo is not None and kind == ENCODED and all(s.source is not None for s in samples):
        sources = tuple((s.source, p.nbytes) for s, p in zip(samples, payloads))
    if sources is not None and sources in memo:
        buf, offsets, place = memo[sources]
    else:
        sizes = np.fromiter((p.nbytes for p in payloads), dtype=np.int64, count=len(payloads))
        offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        buf, place = _uint8_buffer(int(offsets[-1]))
        flat = buf.numpy()
        for p, start, end in zip(payloads, offsets[:-1], offsets[1:]):
            flat[start:end] = p.reshape(-1)
        if sources is not None:
            memo[sources] = (buf, offsets, place)
    shapes = None
    if payloads and payloads[0].ndim == 3:
        shapes = np.array([p.shape for p in payloads], dtype=np.int64)
    params = np.array([s.params for s in samples], dtype=np.float64).reshape(len(samples), -1)
    plan = next((s.plan for s in samples if s.plan is not None), None)
    return ProxyGroup(key, kind, indices, buf, offsets, shapes, params, [s.path for s in samples], plan, place)


def collate_proxy_samples(batch: List[Any], *, collate_fn_map: Optional[Dict] = None) -> ProxyBatch:
    """default_collate's handler for ProxySample (registered below, in every process). A plain
    tensor among them (a sample whose chain was not taken over) joins as a finished result."""
    by_plan: Dict[Tuple[str, str], List[int]] = {}
    done_indices: List[int] = []
    done: List[torch.Tensor] = []
    why: Dict[str, int] = {}
    for i, s in enumerate(batch):
        if isinstance(s, torch.Tensor):
            done_indices.append(i)
            done.append(s)
            continue
        if not isinstance(s, ProxySample):
            raise TypeError(f"dali_autoproxy: cannot batch a proxied sample with {type(s).__name__}")
        if s.why is not None:
            why[s.why] = why.get(s.why, 0) + 1
        if s.done is not None:
            done_indices.append(i)
            done.append(s.done)
        else:
            by_plan.setdefault((s.key, s.kind), []).append(i)
    groups = [_pack(key, kind, idx, [batch[i] for i in idx]) for (key, kind), idx in by_plan.items()]
    if len(done) > 1 and all(d.shape == done[0].shape for d in done):
        done = [torch.stack(done)]  # one tensor, one file descriptor
    return ProxyBatch(len(batch), groups, done_indices, done, why)


default_collate_fn_map[ProxySample] = collate_proxy_samples
