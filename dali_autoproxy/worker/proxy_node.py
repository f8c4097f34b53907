"""What a recognised chain's call does in a worker: hand the image over to DALI.

The image's encoded JPEG (when nothing has touched its pixels) or its pixels, with the params
the plan's drawers make for it (torchvision's own RNG calls, in the worker, so the draws are
plain's), become a :class:`~dali_autoproxy.transport.ProxySample`. A partial offload runs the
chain's head here first; an input DALI should not see runs the whole chain here.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.plan.translate import flatten
from dali_autoproxy.transport import ENCODED, RAW, WHY_CPU, WHY_DECODED, WHY_NOT_PLAIN_JPEG, WHY_PREFIX, ProxySample
from dali_autoproxy.worker.deferred import NOT_DEFERRED, DeferredJpeg, encoded_jpeg


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
