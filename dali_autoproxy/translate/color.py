"""Colour and per-pixel converters on uint8 images: invert, solarize, posterize.

Each is applied with probability p, drawn as torchvision draws it (``coin_drawer``), and
computed with integer arithmetic in DALI, so the result is exact.
"""
from __future__ import annotations

import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from ..ir import ChainState, PixelOp, Step, Unsupported
from . import coin_drawer, register, transform_name


def _uint8_only(t, state: ChainState) -> None:
    if state.dtype != "uint8":
        raise Unsupported(f"{transform_name(t)} on float tensors is not translated (on uint8 images it is)")


def _apply_with_p(t, state: ChainState, alloc, kind: str, arg: int = 0) -> Step:
    _uint8_only(t, state)
    slot = alloc(1)
    return Step(transform_name(t), [PixelOp(kind, slot, arg)], coin_drawer(float(t.p)))


@register(T.RandomInvert, v2.RandomInvert)
def random_invert(t, state: ChainState, alloc) -> Step:
    return _apply_with_p(t, state, alloc, "invert")


@register(T.RandomSolarize, v2.RandomSolarize)
def random_solarize(t, state: ChainState, alloc) -> Step:
    threshold = float(t.threshold)
    # x >= threshold for integer x is x >= ceil(threshold)
    return _apply_with_p(t, state, alloc, "solarize", int(-(-threshold // 1)))


@register(T.RandomPosterize, v2.RandomPosterize)
def random_posterize(t, state: ChainState, alloc) -> Step:
    bits = int(t.bits)
    if not 0 <= bits <= 8:
        raise Unsupported(f"posterize with bits={bits}")
    return _apply_with_p(t, state, alloc, "posterize", (0xFF << (8 - bits)) & 0xFF)
