"""The main-process half of a user's collate_fn (``worker/collate.py`` says why): its recorded
torch calls replayed on DALI's tensors, or, for a collate that needs the images' values, the
collate itself on DALI's tensors under the random states the worker recorded (with on-device
equivalents of collates that only copy: timm's ``fast_collate``). Also: finding a batch's
ProxyBatches and putting DALI's tensors back in their places.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.data import default_collate

from dali_autoproxy.transport import (
    COLLATES_WITH_EQUIVALENTS,
    InlineTensor,
    ProxyBatch,
    ProxyCollated,
    Slot,
    TracedCollate,
    TraceRef,
    qualified_name,
)
from dali_autoproxy.tree import flatten, map_leaves, unflatten
from dali_autoproxy.worker.collate import rng_states, set_rng_states


def finish(pc: ProxyCollated, outputs: List[List[torch.Tensor]], user_collate: Callable[[List[Any]], Any]) -> Any:
    """In the main process: the collated batch. A recorded collate is replayed on DALI's tensors;
    otherwise the samples, DALI's tensors in place, go through the user's collate under the
    worker's random states (the main process's own are kept)."""
    if pc.traced is not None:
        return replay(pc.traced, [outputs[slot.batch][slot.row] for slot in pc.traced.inputs])

    def put(_: Any, leaf: Any) -> Any:
        return outputs[leaf.batch][leaf.row] if type(leaf) is Slot else leaf.tensor()
    samples = [map_leaves(s, put, lambda x: isinstance(x, (Slot, InlineTensor))) for s in pc.samples]
    own = rng_states()
    set_rng_states(pc.rng)
    try:
        return user_collate(samples)
    finally:
        set_rng_states(own)


def replay(traced: TracedCollate, images: List[torch.Tensor]) -> Any:
    """The recorded collate's result with ``images`` for its stand-ins: every recorded call run
    in order (views and in-place writes alias as they did in the worker). A tensor made for
    the meta device is made on the images' device; a host tensor the collate combined with the
    images goes there too, as a number would."""
    device = images[0].device if images else torch.device("cpu")
    made: List[List[Any]] = []

    def value(x: Any) -> Any:
        if type(x) is TraceRef:
            return images[x.index] if x.step < 0 else made[x.step][x.index]
        if isinstance(x, torch.device) and x.type == "meta":
            return device
        if isinstance(x, torch.Tensor) and x.dim() and x.device != device:
            return x.to(device)
        return x
    for step in traced.steps:
        leaves, spec = tree_flatten(step.call)
        args, kwargs = tree_unflatten([value(x) for x in leaves], spec)
        made.append(flatten(step.func(*args, **kwargs))[0])
    leaves, spec = flatten(traced.output)
    return unflatten(spec, [value(x) if type(x) is TraceRef else x for x in leaves])


def find_proxy_batches(batch: Any) -> List[ProxyBatch]:
    """A batch's ProxyBatches, in order (those a ProxyCollated carries too)."""
    if isinstance(batch, ProxyCollated):
        return list(batch.batches)
    return [x for x in flatten(batch)[0] if isinstance(x, ProxyBatch)]


def put_back(batch: Any, tensors: Dict[int, Any]) -> Any:
    """The batch with each ProxyBatch replaced by its tensor (``tensors`` by the ProxyBatch's id),
    and each small tensor that travelled inline a tensor again."""
    def put(_: Any, leaf: Any) -> Any:
        return tensors[id(leaf)] if type(leaf) is ProxyBatch else leaf.tensor()
    return map_leaves(batch, put, lambda x: isinstance(x, (ProxyBatch, InlineTensor)))


def _timm_fast_collate(original: Callable) -> Callable:
    """timm's fast_collate copies each uint8 image into a CPU batch (for its PrefetchLoader to
    upload again): with DALI's images already on the GPU, the same batch is one stack there."""
    def fast_collate_on_device(batch: List[Any]) -> Any:
        images = [b[0] for b in batch]
        if not (isinstance(batch[0], tuple) and all(isinstance(x, torch.Tensor) and x.dtype == torch.uint8
                                                     for x in images)):
            return original(batch)  # numpy or multi-view inputs: timm's own code
        targets = default_collate([b[1] for b in batch])
        return torch.stack(images), targets.long() if targets.ndim == 1 else targets
    return fast_collate_on_device


# collate functions with a faster equivalent on DALI's device, by qualified name (never imported);
# transport.COLLATES_WITH_EQUIVALENTS names them for the workers' log
ON_DEVICE = dict(zip(COLLATES_WITH_EQUIVALENTS, (_timm_fast_collate,)))


def on_device(collate: Callable) -> Callable:
    """The collate to run in the main process: the user's, or its on-device equivalent."""
    name = qualified_name(collate)
    return ON_DEVICE[name](collate) if name in ON_DEVICE else collate
