"""What a recognised chain's call does in a worker: hand the image over to DALI.

The image's encoded JPEG (when nothing has touched its pixels) or its pixels, with the params
the plan's drawers make for it (torchvision's own RNG calls, in the worker, so the draws are
plain's), become a :class:`~dali_autoproxy.transport.ProxySample`. A partial offload runs the
chain's head here first; an input DALI should not see runs the whole chain here.

A plan with recorded steps may learn, drawing a sample, that a recorded transform needs pixels
(``NeedsPixels``): the random generators go back to where they stood before the sample, the
chain is planned again with that transform in the worker, the new plan travels with the samples,
and the sample is drawn again. An image handed on by another chain (``worker/handover.py``)
continues that chain's draws under the plan of both chains joined.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

from dali_autoproxy.config import logger
from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import Plan, build_joined_plan, build_plan
from dali_autoproxy.plan.record.image import NeedsPixels, call_token
from dali_autoproxy.plan.record.learnt import LEARNT
from dali_autoproxy.plan.steps import SampleGeometry
from dali_autoproxy.plan.translate import flatten
from dali_autoproxy.transport import (
    ENCODED,
    RAW,
    WHY_CPU,
    WHY_DECODED,
    WHY_NOT_PLAIN_JPEG,
    WHY_PREFIX,
    WHY_RECORDING,
    ProxySample,
)
from dali_autoproxy.worker.collate import own_generators, rng_states, set_rng_states
from dali_autoproxy.worker.deferred import NOT_DEFERRED, DeferredJpeg, ResizedJpeg, encoded_jpeg
from dali_autoproxy.worker.handover import HandedImage

MAX_REPLANS = 8  # plans tried for one sample before its chain runs as the last one says
_UNPLANNED = object()  # a plan not made yet


def _why_decoded_here(img: Any) -> str:
    if getattr(img, NOT_DEFERRED, False):  # decoded by Pillow in the worker, not being an ordinary JPEG
        return WHY_NOT_PLAIN_JPEG
    if type(img) is not DeferredJpeg and getattr(img, "format", None) is not None and getattr(img, "_im", 1) is None:
        return WHY_NOT_PLAIN_JPEG  # a file Pillow opened, untouched, that is no ordinary JPEG
    return WHY_DECODED


class DatasetResize:
    """The crops and resizes a dataset's code made on a still-encoded JPEG (``ResizedJpeg``),
    made again on the recording image a plan's drawer passes: a recorded step at the head of the
    chain that takes the image. ``calls`` is set per sample."""

    def __init__(self) -> None:
        self.calls: tuple = ()

    def __call__(self, img: Any) -> Any:
        for method, args, kwargs in self.calls:
            img = getattr(img, method)(*args, **kwargs)
        return img

    def before(self, chain: Any) -> Any:
        """What to plan: these calls, then the chain's own transforms."""
        return T.Compose([self] + flatten(chain))


def _join(head: Any, head_plan: Plan, tail: Any) -> Optional[Plan]:
    """The plan of ``tail`` taking ``head``'s image, when the head's steps open it unchanged."""
    try:
        plan = build_joined_plan(head, tail)
    except Unsupported:
        return None
    except Exception:  # pragma: no cover - a converter tripped: the image gets its pixels
        logger.debug("joining two chains failed", exc_info=True)
        return None
    if plan.worker_prefix:  # the head's steps would run in the worker: its draws do not fit
        return None
    opening = [(s.name, s.ops) for s in plan.steps[:len(head_plan.steps)]]
    return plan if opening == [(s.name, s.ops) for s in head_plan.steps] else None


class ProxyNode:
    """What a recognised chain's call does in a worker: hand the image over to DALI."""

    def __init__(self, plan: Plan, original: Any, announce: bool):
        self._use(plan, original, announce)

    def _use(self, plan: Plan, original: Any, announce: bool) -> None:
        self.joined: Dict[int, Tuple[Any, Optional[Plan]]] = {}  # head chain id: (head, joined plan)
        self.kept: Optional[DatasetResize] = None  # the dataset's own crops and resizes, replayed (_resized)
        self.kept_plan: Any = _UNPLANNED
        self.plan: Optional[Plan] = plan
        self.plain_reason = WHY_RECORDING
        self.key = plan.key
        self.dtype = torch.uint8 if plan.state.dtype == "uint8" else torch.float32
        self.original = original
        self.generators = own_generators(original)  # a draw made again puts these back too
        self.announce = plan if announce else None  # sent with each sample: the main process lacks it
        flat = flatten(original) if plan.worker_prefix else []
        self.prefix = flat[:plan.worker_prefix]  # partial offload: these run here
        self.rest = flat[plan.worker_prefix:]

    def __call__(self, img: Any) -> Any:
        if type(img) is HandedImage and img.handed:
            out = self._joined(img)
            if out is not None:
                return out
        if type(img) is ResizedJpeg and img.deferred:
            out = self._resized(img)
            if out is not None:
                return out
        for _ in range(MAX_REPLANS):
            if self.plan is None:  # nothing worth moving is left: the chain runs as written
                return self._as_written(img)
            if not self.plan.records:
                return self._call(img)
            states = rng_states(self.generators)
            try:
                return self._call(img)
            except NeedsPixels as exc:  # a recorded transform needs pixels: replan, draw again
                set_rng_states(states)
                self._replan(exc)
        self.plan = None
        return self._as_written(img)

    def _joined(self, img: HandedImage) -> Optional[ProxySample]:
        """The handed image's JPEG, with the head's draws and this chain's after them, under the
        plan of both chains in one (None: they do not join; the image then gets its pixels)."""
        head = id(img.head)
        if head not in self.joined or self.joined[head][0] is not img.head:
            self.joined[head] = (img.head, _join(img.head, img.plan, self.original))
        plan = self.joined[head][1]
        if plan is None:
            return None
        states = rng_states(self.generators)
        g = SampleGeometry(img.shape[1], img.shape[2], img.shape[0])
        g.params = list(img.params)
        try:
            params, shape = plan.draw_from(g, len(img.plan.steps))
        except NeedsPixels as exc:  # a recorded step of this chain: the image gets its pixels
            set_rng_states(states)
            LEARNT.learn(exc)
            del self.joined[head]
            return None
        data, _, path = img.jpeg
        dtype = torch.uint8 if plan.state.dtype == "uint8" else torch.float32
        return ProxySample(plan.key, ENCODED, np.frombuffer(data, dtype=np.uint8), params, path, plan=plan,
                           shape=shape, dtype=dtype, source=id(data))

    def _resized(self, img: ResizedJpeg) -> Optional[ProxySample]:
        """The JPEG of an image the dataset's code cropped or resized, under the plan of those
        calls (replayed on a recording image, ``DatasetResize``) followed by this chain (None: no
        such plan; the image then gets its pixels)."""
        if self.kept is None:  # planned with the first image's calls: a crop or resize, no call around it
            self.kept = DatasetResize()
            tokens = tuple(call_token(call) for call in img.recorded)
            LEARNT.set_shape(self.kept, (tokens, (0,) * (len(tokens) + 1)))
        for _ in range(MAX_REPLANS):
            if self.kept_plan is _UNPLANNED:
                try:
                    self.kept_plan = build_plan(self.kept.before(self.original))
                except Unsupported:
                    self.kept_plan = None
            plan = self.kept_plan
            if plan is None or plan.worker_prefix:
                return None
            self.kept.calls = img.calls
            states = rng_states(self.generators)
            width, height = img.source.size
            try:
                params, shape = plan.draw_sample(height, width)
            except NeedsPixels as exc:
                set_rng_states(states)
                LEARNT.learn(exc)
                self.kept_plan = _UNPLANNED  # planned again, knowing more
                continue
            data, path = img.source.data, img.source.path
            dtype = torch.uint8 if plan.state.dtype == "uint8" else torch.float32
            return ProxySample(plan.key, ENCODED, np.frombuffer(data, dtype=np.uint8), params, path, plan=plan,
                               shape=shape, dtype=dtype, source=id(data))
        return None

    def _as_written(self, img: Any) -> Any:
        """The chain as written, its tensor marked with why (for the report)."""
        out = self.original(img)
        if isinstance(out, torch.Tensor):
            return ProxySample(self.key, done=out.as_subclass(torch.Tensor), why=self.plain_reason)
        return out

    def _replan(self, exc: NeedsPixels) -> None:
        """Plan the chain again, knowing what ``exc`` says of the recorded transform: it made more
        calls than planned (plan more), or it needs pixels (it runs in the worker, and the report
        says why). The new plan travels with the samples."""
        LEARNT.learn(exc)
        try:
            plan = build_plan(self.original)
        except Unsupported:
            self.plan, self.plain_reason = None, f"{WHY_RECORDING}: {exc}"
            return
        self._use(plan, self.original, announce=True)

    def _call(self, img: Any) -> Any:
        if not self.prefix:
            enc = encoded_jpeg(img)
            if enc is not None:
                data, (width, height), path = enc
                params, shape = self.plan.draw_sample(height, width)
                return ProxySample(self.key, ENCODED, np.frombuffer(data, dtype=np.uint8), params, path,
                                   plan=self.announce, shape=shape, dtype=self.dtype, source=id(data))
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
