"""The main-process half of a user's collate_fn: run on DALI's tensors, under the random
states the worker recorded (``worker/collate.py`` says why), and the on-device equivalents of
collates that only copy (timm's ``fast_collate``). Also: finding a batch's ProxyBatches and
putting DALI's tensors back in their places.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
from torch.utils.data import default_collate

from dali_autoproxy.transport import InlineTensor, ProxyBatch, ProxyCollated, Slot
from dali_autoproxy.tree import flatten, map_leaves
from dali_autoproxy.worker.collate import rng_states, set_rng_states


def finish(pc: ProxyCollated, outputs: List[List[torch.Tensor]], user_collate: Callable[[List[Any]], Any]) -> Any:
    """In the main process: the samples with DALI's tensors in place, through the user's
    collate under the worker's random states (the main process's own are kept)."""
    def put(_: Any, leaf: Any) -> Any:
        return outputs[leaf.batch][leaf.row] if type(leaf) is Slot else leaf.tensor()
    samples = [map_leaves(s, put, lambda x: isinstance(x, (Slot, InlineTensor))) for s in pc.samples]
    own = rng_states()
    set_rng_states(pc.rng)
    try:
        return user_collate(samples)
    finally:
        set_rng_states(own)


def find_proxy_batches(batch: Any) -> List[ProxyBatch]:
    """A batch's ProxyBatches, in order (those a ProxyCollated carries too)."""
    if isinstance(batch, ProxyCollated):
        return list(batch.batches)
    return [x for x in flatten(batch)[0] if isinstance(x, ProxyBatch)]


def put_back(batch: Any, tensors: Dict[int, Any]) -> Any:
    """The batch with each ProxyBatch replaced by its tensor (``tensors`` by the ProxyBatch's id)."""
    return map_leaves(batch, lambda _, pb: tensors[id(pb)], lambda x: isinstance(x, ProxyBatch))


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


# collate functions with a faster equivalent on DALI's device, by qualified name (never imported)
ON_DEVICE = {"timm.data.loader.fast_collate": _timm_fast_collate}


def on_device(collate: Callable) -> Callable:
    """The collate to run in the main process: the user's, or its on-device equivalent."""
    name = f"{getattr(collate, '__module__', '')}.{getattr(collate, '__qualname__', '')}"
    return ON_DEVICE[name](collate) if name in ON_DEVICE else collate
