"""Custom collate functions, with their semantics unchanged: they run on DALI's tensors.

A user's ``collate_fn`` (MixUp/CutMix on the collated batch, timm's ``fast_collate``, a
detection-style ``tuple(zip(*batch))``, one that drops samples) needs real images, which only
exist in the main process once DALI has run. So in a proxied loader's workers the collate_fn
is :class:`CollateInMain`:

1. it records the worker's random states (torch, Python, numpy) as they stand before the
   collate would run;
2. it runs the user's collate once on stand-ins: each proxied image replaced by a tensor of
   its final shape and dtype on torch's ``meta`` device (no memory, no compute), so the
   worker's generators advance exactly as they would have, and the next batches draw what
   plain torchvision draws;
3. it sends the samples, their proxied images packed per position into ProxyBatches (as
   default_collate would pack them), and the recorded states.

The main process runs DALI, puts each sample's tensor back in its place, and calls the user's
collate on those samples under the recorded states: the same draws on the same images.
A collate that cannot take meta tensors (it reads pixel values) still gets its real call in
the main process; only its random draws, if it makes any, may then differ from plain's for
the batches after (logged once per worker).
"""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from dali_autoproxy.config import logger
from dali_autoproxy.transport import ProxyBatch, ProxySample, collate_proxy_samples

Path = Tuple[Any, ...]


class Slot:
    """Where a proxied image goes back: row ``row`` of the ``batch``-th ProxyBatch."""
    __slots__ = ("batch", "row")

    def __init__(self, batch: int, row: int):
        self.batch, self.row = batch, row


class ProxyCollated:
    """What a worker sends in place of the user's collated batch."""

    def __init__(self, samples: List[Any], batches: List[ProxyBatch], rng: tuple):
        self.samples = samples   # the dataset's samples, proxied images replaced by Slots
        self.batches = batches   # one ProxyBatch per position holding proxied images
        self.rng = rng           # the worker's (torch, random, numpy) states before the collate

    def __repr__(self) -> str:
        return f"ProxyCollated({len(self.samples)} samples, {self.batches!r})"


def _map(obj: Any, fn: Callable[[Path, Any], Any], path: Path = ()) -> Any:
    """``obj`` rebuilt with ``fn(path, leaf)`` for each ProxySample leaf (tuples, lists, dicts,
    namedtuples followed as default_collate follows them)."""
    if isinstance(obj, ProxySample):
        return fn(path, obj)
    if isinstance(obj, tuple):
        items = [_map(x, fn, path + (i,)) for i, x in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return [_map(x, fn, path + (i,)) for i, x in enumerate(obj)]
    if isinstance(obj, dict):
        return _same_mapping(obj, {k: _map(v, fn, path + (k,)) for k, v in obj.items()})
    return obj


def _same_mapping(like: dict, items: dict) -> dict:
    if type(like) is dict:
        return items
    try:
        return type(like)(items)
    except TypeError:  # a mapping type that cannot be built from a dict: as default_collate, a dict
        return items


def _standin(path: Path, s: ProxySample) -> torch.Tensor:
    if s.done is not None:
        return s.done
    return torch.empty(s.shape, dtype=s.dtype, device="meta")


def _rng_states() -> tuple:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _set_rng_states(states: tuple) -> None:
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    np.random.set_state(states[2])


class CollateInMain:
    """The collate_fn of a proxied loader whose user collate_fn is not default_collate, in
    its workers. Picklable (for spawn workers) when the user's collate is."""

    def __init__(self, user_collate: Callable[[List[Any]], Any]):
        self.user_collate = user_collate
        self._warned = False

    def __call__(self, samples: List[Any]) -> Any:
        rng = _rng_states()
        positions: Dict[Path, List[ProxySample]] = {}
        order: List[Path] = []

        def collect(path: Path, s: ProxySample) -> Any:
            if s.done is not None:
                return s.done  # finished in the worker: the real tensor
            if path not in positions:
                positions[path] = []
                order.append(path)
            positions[path].append(s)
            return Slot(order.index(path), len(positions[path]) - 1)
        skeleton = [_map(sample, collect) for sample in samples]
        if not positions:  # nothing proxied in this batch: the user's collate, as plain
            return self.user_collate([_map(sample, _standin) for sample in samples])
        try:
            self.user_collate([_map(sample, _standin) for sample in samples])
        except Exception as exc:  # it reads pixel values: the real call in the main process stays
            info = torch.utils.data.get_worker_info()
            if not self._warned and (info is None or info.id == 0):  # once per loader, not per worker
                self._warned = True
                logger.info("dali_autoproxy: collate_fn %s cannot run on shape-only stand-ins (%s: %s); it "
                            "runs in the main process, and if it draws random numbers after that point the "
                            "next batches' draws may differ from plain torchvision's",
                            getattr(self.user_collate, "__name__", self.user_collate), type(exc).__name__, exc)
        batches = [collate_proxy_samples(positions[p]) for p in order]
        return ProxyCollated(skeleton, batches, rng)


def finish(pc: ProxyCollated, outputs: List[List[torch.Tensor]], user_collate: Callable[[List[Any]], Any]) -> Any:
    """In the main process: the samples with DALI's tensors in place, through the user's
    collate under the worker's random states (the main process's own are kept)."""
    def fill(obj: Any) -> Any:
        if isinstance(obj, Slot):
            return outputs[obj.batch][obj.row]
        if isinstance(obj, tuple):
            items = [fill(x) for x in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        if isinstance(obj, list):
            return [fill(x) for x in obj]
        if isinstance(obj, dict):
            return _same_mapping(obj, {k: fill(v) for k, v in obj.items()})
        return obj
    samples = [fill(s) for s in pc.samples]
    own = _rng_states()
    _set_rng_states(pc.rng)
    try:
        return user_collate(samples)
    finally:
        _set_rng_states(own)


def _timm_fast_collate(original: Callable) -> Callable:
    """timm's fast_collate copies each uint8 image into a CPU batch (for its PrefetchLoader to
    upload again): with DALI's images already on the GPU, the same batch is one stack there."""
    from torch.utils.data import default_collate

    def fast_collate_on_device(batch: List[Any]) -> Any:
        images = [b[0] for b in batch]
        if not (isinstance(batch[0], tuple) and all(isinstance(x, torch.Tensor) and x.dtype == torch.uint8
                                                     for x in images)):
            return original(batch)  # numpy or multi-view inputs: timm's own code
        targets = default_collate([b[1] for b in batch])
        return torch.stack(images), targets.long() if targets.ndim == 1 else targets
    return fast_collate_on_device


# collate functions with a faster equivalent on DALI's device, by qualified name (never imported)
ON_DEVICE = {"timm.data.loader.fast_collate": _timm_fast_collate}


def on_device(collate: Callable) -> Callable:
    """The collate to run in the main process: the user's, or its on-device equivalent."""
    name = f"{getattr(collate, '__module__', '')}.{getattr(collate, '__qualname__', '')}"
    return ON_DEVICE[name](collate) if name in ON_DEVICE else collate


def mixed_to_samples(data: List[Any]) -> List[Any]:
    """Where some samples hold a ProxySample and others a plain tensor at the same place (a
    chain taken over for some samples only), the tensors become finished ProxySamples so that
    default_collate batches them together."""
    def fix(items: List[Any]) -> List[Any]:
        first = items[0]
        if any(isinstance(x, ProxySample) for x in items):
            return [ProxySample("", done=x) if isinstance(x, torch.Tensor) else x for x in items]
        if isinstance(first, dict):
            columns = {k: fix([x[k] for x in items]) for k in first}
            return [_same_mapping(x, {k: columns[k][i] for k in first}) for i, x in enumerate(items)]
        if isinstance(first, (list, tuple)) and all(len(x) == len(first) for x in items):
            columns = [fix([x[j] for x in items]) for j in range(len(first))]
            rows = [[c[i] for c in columns] for i in range(len(items))]
            return [type(x)(*r) if hasattr(x, "_fields") else type(x)(r) for x, r in zip(items, rows)]
        return items
    return fix(data) if data else data


class DefaultCollate:
    """default_collate in a proxied loader's workers, able to batch a mix of proxied and finished
    samples at one place (default_collate picks its handler from the first sample only)."""

    def __call__(self, data: List[Any]) -> Any:
        from torch.utils.data import default_collate
        try:
            return default_collate(data)
        except TypeError:
            return default_collate(mixed_to_samples(data))


def find_proxy_batches(obj: Any, found: List[ProxyBatch]) -> Optional[ProxyCollated]:
    """Collect a batch's ProxyBatches (those of a ProxyCollated too)."""
    if isinstance(obj, ProxyCollated):
        found.extend(obj.batches)
        return obj
    if isinstance(obj, ProxyBatch):
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            find_proxy_batches(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            find_proxy_batches(item, found)
    return None
