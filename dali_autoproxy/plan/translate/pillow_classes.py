"""The few-line Pillow classes of self-supervised recipes, translated where their code is known.

MoCo v2/v3 (``moco/loader.py``), DINO (``utils.py``) and lightly (``lightly.transforms``) blur
with ``img.filter(ImageFilter.GaussianBlur(radius))`` at a random radius and solarize with
``ImageOps.solarize``. A class is taken by its qualified name *and* its code: the converter runs
only when the class's ``__call__`` is, statement for statement, the one written here
(``fingerprint``: its syntax tree, docstrings and formatting aside), so a class of the same name
that does something else, or a later version, stays in the worker. The random draws are the
class's own calls, made in the same order on the same generator (Python's ``random`` or NumPy's);
the pixels are Pillow's (``PillowBlur``, exact; solarize, exact).
"""
from __future__ import annotations

import random
from typing import Callable, Dict

import numpy as np

from dali_autoproxy.plan.ir import PixelOp, Unsupported
from dali_autoproxy.plan.pillow_ops import PillowBlur
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import call_fingerprint, register, transform_name

KNOWN: Dict[str, str] = {  # qualified name: fingerprint of the __call__ translated here
    "moco.loader.GaussianBlur": "c01026973d6d61b0",
    "moco.loader.Solarize": "8a94c959dfa43cb4",
    "utils.GaussianBlur": "3b2483b179ec744f",  # DINO's utils.py
    "utils.Solarization": "b7f55dec8c3b6418",
    "lightly.transforms.gaussian_blur.GaussianBlur": "5eaed77e22f38cd8",
    "lightly.transforms.solarize.RandomSolarization": "3cc9540cf9381cf7",
    "lightly.transforms.rotation.RandomRotate": "078a83a086a3ba8e",
}


def _known_code(t, state: ChainState) -> None:
    cls = type(t)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if call_fingerprint(cls) != KNOWN[name]:
        raise Unsupported(f"{name}.__call__ is not the code translated here (another version, or another "
                          "class of that name): it runs as written")
    if state.kind != "pil" or state.channels not in (1, 3):
        raise Unsupported(f"{transform_name(t)} on {state.kind} images is not translated (on PIL images it is)")


def _blur_step(t, alloc, radius: Callable[[], float], applied: Callable[[], bool]) -> Step:
    blur = PillowBlur(alloc(PillowBlur))

    def draw(g) -> None:
        if applied():
            r = float(radius())
            g.put(blur, x_radius=r, y_radius=r)
        else:
            g.put(blur, *PillowBlur.neutral)
    return Step(transform_name(t), [blur], draw, neutral=list(PillowBlur.neutral))


def _solarize_step(t, alloc, threshold: float, applied: Callable[[], bool]) -> Step:
    op = PixelOp("solarize", alloc(PixelOp), int(-(-float(threshold) // 1)))  # x >= t, t whole

    def draw(g) -> None:
        g.put(op, apply=int(bool(applied())))
    return Step(transform_name(t), [op], draw, neutral=list(PixelOp.neutral))


@register("moco.loader.GaussianBlur")
def moco_gaussian_blur(t, state: ChainState, alloc) -> Step:
    """``sigma = random.uniform(self.sigma[0], self.sigma[1]); x.filter(GaussianBlur(radius=sigma))``."""
    _known_code(t, state)
    return _blur_step(t, alloc, lambda: random.uniform(t.sigma[0], t.sigma[1]), lambda: True)


@register("moco.loader.Solarize")
def moco_solarize(t, state: ChainState, alloc) -> Step:
    """``ImageOps.solarize(x)``: threshold 128, always."""
    _known_code(t, state)
    return _solarize_step(t, alloc, 128, lambda: True)


@register("utils.GaussianBlur")
def dino_gaussian_blur(t, state: ChainState, alloc) -> Step:
    """``if random.random() <= self.prob: img.filter(GaussianBlur(radius=random.uniform(min, max)))``."""
    _known_code(t, state)
    return _blur_step(t, alloc, lambda: random.uniform(t.radius_min, t.radius_max),
                      lambda: random.random() <= t.prob)


@register("utils.Solarization")
def dino_solarization(t, state: ChainState, alloc) -> Step:
    """``if random.random() < self.p: ImageOps.solarize(img)``."""
    _known_code(t, state)
    return _solarize_step(t, alloc, 128, lambda: random.random() < t.p)


@register("lightly.transforms.gaussian_blur.GaussianBlur")
def lightly_gaussian_blur(t, state: ChainState, alloc) -> Step:
    """``prob = np.random.random_sample(); if prob < self.prob: sigma = np.random.uniform(*sigmas)``."""
    _known_code(t, state)
    return _blur_step(t, alloc, lambda: np.random.uniform(t.sigmas[0], t.sigmas[1]),
                      lambda: np.random.random_sample() < t.prob)


@register("lightly.transforms.solarize.RandomSolarization")
def lightly_random_solarization(t, state: ChainState, alloc) -> Step:
    """``prob = np.random.random_sample(); if prob < self.prob: ImageOps.solarize(sample, threshold)``."""
    _known_code(t, state)
    return _solarize_step(t, alloc, t.threshold, lambda: np.random.random_sample() < t.prob)


@register("lightly.transforms.rotation.RandomRotate")
def lightly_random_rotate(t, state: ChainState, alloc) -> Step:
    """``prob = np.random.random_sample(); if prob < self.prob: F.rotate(image, self.angle)``: with
    ``prob`` 0 (lightly's default ``rr_prob``) only the draw is made, as the class makes it."""
    _known_code(t, state)
    if float(t.prob) > 0.0:
        raise Unsupported(f"{transform_name(t)} with prob > 0 (a fixed-angle rotation, which Pillow turns "
                          "into a transpose on square images) is not translated; prob 0 is")

    def draw(g) -> None:
        np.random.random_sample()
    return Step(transform_name(t), [], draw, neutral=[])
