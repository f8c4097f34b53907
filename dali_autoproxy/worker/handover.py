"""Chains that hand their PIL image to other chains: one plan per sample.

DINOv2 writes ``colour(geometric(image))``: the geometric chain (crop, flip) ends in a PIL
image, which no pipeline can return, and the colour chain starts from it. In a worker, the
geometric chain's call (a :class:`HeadNode`) draws its params and returns a
:class:`HandedImage`: a real PIL image of the size the draws give, still holding the encoded
JPEG it came from. A chain that takes it joins the two into one plan (``build_joined_plan``),
continues the draws and sends the JPEG to DALI: the decode, the crop and the colour all run
there, with the draws plain would have made (the head's at the head's call, the tail's at the
tail's). Every chain that takes the same handed image continues the same head draws, as every
chain takes the same pixels in plain.

Anything else that touches its pixels gets exactly plain's: the head chain runs as written on
the source image, under the random states it was called with (its draws replayed), and the
generators are put back where they stood.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.worker.collate import rng_states, set_rng_states
from dali_autoproxy.worker.deferred import LazyPixels, encoded_jpeg
from dali_autoproxy.worker.routing import local


class HandedImage(LazyPixels):
    """A head chain's result before its pixels exist: its size and mode as the head's draws
    make them; its pixels, on demand, plain's."""

    def __init__(self, source: Any, head: Any, plan: Plan, rng: tuple, params: List[float],
                 shape: Tuple[int, int, int], jpeg: Tuple[bytes, Tuple[int, int], Optional[str]]):
        super().__init__()
        self._mode = "RGB" if shape[0] == 3 else "L"
        self._size = (shape[2], shape[1])
        self.source, self.head, self.plan, self.rng = source, head, plan, rng
        self.params, self.shape, self.jpeg = params, shape, jpeg

    @property
    def handed(self) -> bool:
        """True until something has needed the pixels."""
        return self._im is None

    def _make_pixels(self) -> None:
        now = rng_states()
        set_rng_states(self.rng)
        local.depth += 1  # the head runs as written: the chain calls inside it are not taken
        try:
            real = self.head(self.source)
        finally:
            local.depth -= 1
            set_rng_states(now)
        real.load()
        self._im, self._mode, self._size = real.im, real.mode, real.size
        self.info = dict(real.info)


class HeadNode:
    """A chain that ends in a PIL image, called in a worker: its draws, and a HandedImage."""

    def __init__(self, plan: Plan, original: Any):
        self.plan = plan
        self.original = original

    def __call__(self, img: Any) -> Any:
        jpeg = encoded_jpeg(img)
        if jpeg is None:  # decoded already: nothing to hand on that DALI would decode
            return self.original(img)
        rng = rng_states()
        width, height = jpeg[1]
        params, shape = self.plan.draw_sample(height, width)
        return HandedImage(img, self.original, self.plan, rng, params, shape, jpeg)
