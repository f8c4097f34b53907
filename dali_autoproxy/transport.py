"""Worker-to-main transport: what a worker hands over instead of a processed image.

In the worker, a recognised chain's call returns a :class:`ProxySample` (see ``intercept.py``):
the image's encoded JPEG bytes or its pixels, plus the per-sample params drawn with
torchvision's RNG calls. ``default_collate`` batches those into one :class:`ProxyBatch`, whose
bytes sit in a single shared-memory tensor per group: one file descriptor per batch, no
pickling of image data. The batch then travels through the DataLoader's own result queue, so
ordering, timeouts and worker errors are the DataLoader's.

Samples DALI should not see (PNG, CMYK, a tensor input...) take the original chain on the CPU
right here; they travel as finished tensors and are merged back in place.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from dali_autoproxy.worker.deferred import NOT_DEFERRED, DeferredJpeg, encoded_jpeg
from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.plan.translate import flatten

ENCODED, RAW = "encoded", "raw"  # what a DALI pipeline takes in: JPEG bytes, or HWC uint8 pixels

# why a sample's image was decoded in the worker (counted per loader in the report)
WHY_PREFIX = "partial offload: worker steps need pixels"
WHY_DECODED = "the image reached the transform decoded (the dataset used or made its pixels first)"
WHY_NOT_PLAIN_JPEG = "not an ordinary complete JPEG (DALI decodes those as Pillow does)"
WHY_CPU = "not an RGB image: the whole chain ran in the worker"


class ProxySample:
    """One sample's input to a DALI pipeline, or its finished CPU result (``done``)."""
    __slots__ = ("key", "kind", "payload", "params", "path", "done", "why", "plan", "shape", "dtype")

    def __init__(self, key: str, kind: str = RAW, payload: Optional[np.ndarray] = None,
                 params: Optional[List[float]] = None, path: Optional[str] = None,
                 done: Optional[torch.Tensor] = None, why: Optional[str] = None, plan: Optional[Plan] = None,
                 shape: Optional[Tuple[int, int, int]] = None, dtype: Optional[torch.dtype] = None):
        self.shape = shape  # (C, H, W) and dtype of the tensor DALI will make of it
        self.dtype = dtype
        self.key = key
        self.kind = kind
        self.payload = payload
        self.params = params
        self.path = path
        self.done = done
        self.why = why    # why it was not decoded by DALI (None: it was)
        self.plan = plan  # set when the main process may not know this plan yet

    def __repr__(self) -> str:
        return f"ProxySample(plan={self.key}, {self.kind}, path={self.path!r}, done={self.done is not None})"


def _why_decoded_here(img: Any) -> str:
    if getattr(img, NOT_DEFERRED, False):  # decoded by Pillow in the worker, not being an ordinary JPEG
        return WHY_NOT_PLAIN_JPEG
    if type(img) is not DeferredJpeg and getattr(img, "format", None) is not None and getattr(img, "_im", 1) is None:
        return WHY_NOT_PLAIN_JPEG  # a file Pillow opened, untouched, that is no ordinary JPEG
    return WHY_DECODED


class ProxyNode:
    """What a recognised chain's call does in a worker: hand the image over to DALI."""

    def __init__(self, plan: Plan, original: Any, announce: bool):
        self.plan = plan
        self.key = plan.key
        self.dtype = torch.uint8 if plan.state.dtype == "uint8" else torch.float32
        self.original = original
        self.announce = plan if announce else None  # sent with each sample: the main process lacks it
        flat = flatten(original) if plan.worker_prefix else []
        self.prefix = flat[:plan.worker_prefix]  # partial offload: these run here
        self.rest = flat[plan.worker_prefix:]

    def __call__(self, img: Any) -> Any:
        if not self.prefix:
            enc = encoded_jpeg(img)
            if enc is not None:
                data, (width, height), path = enc
                params, shape = self.plan.draw_sample(height, width)
                return ProxySample(self.key, ENCODED, np.frombuffer(data, dtype=np.uint8), params, path,
                                   plan=self.announce, shape=shape, dtype=self.dtype)
            why = _why_decoded_here(img) if isinstance(img, Image.Image) else WHY_CPU
        else:
            why = WHY_PREFIX
            for t in self.prefix:
                img = t(img)
        if isinstance(img, Image.Image) and img.mode == "RGB":
            pixels = np.asarray(img)
            params, shape = self.plan.draw_sample(*pixels.shape[:2])
            return ProxySample(self.key, RAW, pixels, params, why=why, plan=self.announce, shape=shape,
                               dtype=self.dtype)
        return self._on_cpu(img)

    def _on_cpu(self, img: Any) -> Any:
        """The rest of the original chain (all of it, or what follows a worker prefix)."""
        if self.prefix:
            out = img
            for t in self.rest:
                out = t(out)
        else:
            out = self.original(img)
        if isinstance(out, np.ndarray):  # timm's ToNumpy: default_collate would make it this tensor
            out = torch.from_numpy(out)
        if not isinstance(out, torch.Tensor):
            return out  # not what a batch of this chain holds: handed back as the chain made it
        return ProxySample(self.key, done=out.as_subclass(torch.Tensor), why=WHY_CPU)


class ProxyGroup:
    """The samples of one batch that share a plan and an input kind (and so a DALI pipeline)."""

    def __init__(self, key: str, kind: str, indices: List[int], payload: torch.Tensor,
                 offsets: np.ndarray, shapes: Optional[np.ndarray], params: np.ndarray,
                 paths: List[Optional[str]], plan: Optional[Plan] = None):
        self.key = key
        self.kind = kind
        self.plan = plan            # the plan, when the main process may not know it
        self.indices = indices
        self.payload = payload      # uint8, all samples' bytes back to back (shared memory)
        self.offsets = offsets      # int64 [n + 1]
        self.shapes = shapes        # int64 [n, 3] for raw pixels, None for encoded files
        self.params = params        # float64 [n, n_params] (whole numbers are exact)
        self.paths = paths

    def payload_views(self) -> List[np.ndarray]:
        flat = self.payload.numpy()
        views = [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(len(self.indices))]
        if self.shapes is not None:
            views = [v.reshape(tuple(s)) for v, s in zip(views, self.shapes)]
        return views


class ProxyBatch:
    """What the training loop would see as an image batch, before DALI has run."""

    def __init__(self, size: int, groups: List[ProxyGroup], done_indices: List[int],
                 done: List[torch.Tensor], why: Optional[Dict[str, int]] = None):
        self.size = size
        self.groups = groups
        self.done_indices = done_indices
        self.done = done  # CPU-path results, one tensor each, or one stacked tensor
        self.why = why or {}  # samples not decoded by DALI, by reason

    def done_tensors(self) -> List[torch.Tensor]:
        if len(self.done) == 1 and len(self.done_indices) > 1:
            return list(self.done[0].unbind(0))
        return self.done

    def __repr__(self) -> str:
        return (f"ProxyBatch(size={self.size}, dali={[len(g.indices) for g in self.groups]}, "
                f"cpu={len(self.done_indices)})")


def _uint8_buffer(nbytes: int) -> torch.Tensor:
    """In a worker, allocate straight in shared memory, so sending it copies nothing."""
    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,))
    return torch.empty(nbytes, dtype=torch.uint8)


def _pack(key: str, kind: str, indices: List[int], samples: List[ProxySample]) -> ProxyGroup:
    payloads = [s.payload for s in samples]
    sizes = np.fromiter((p.nbytes for p in payloads), dtype=np.int64, count=len(payloads))
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    buf = _uint8_buffer(int(offsets[-1]))
    flat = buf.numpy()
    for p, start, end in zip(payloads, offsets[:-1], offsets[1:]):
        flat[start:end] = p.reshape(-1)
    shapes = None
    if payloads and payloads[0].ndim == 3:
        shapes = np.array([p.shape for p in payloads], dtype=np.int64)
    params = np.array([s.params for s in samples], dtype=np.float64).reshape(len(samples), -1)
    plan = next((s.plan for s in samples if s.plan is not None), None)
    return ProxyGroup(key, kind, indices, buf, offsets, shapes, params, [s.path for s in samples], plan)


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
