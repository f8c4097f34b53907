"""Augmentation policies on PIL images: TrivialAugmentWide, RandAugment, AutoAugment (v1, v2).

The worker makes torchvision's own draws, in its order (which operation, which magnitude bin,
which sign), reading the magnitudes from the transform's own augmentation space; each chosen
operation travels as (index, magnitude) and runs in the torch stage with Pillow's arithmetic,
one group of samples per operation. v2's Solarize magnitude (a fraction of 255) is stored in
v1's units (levels), so one kernel serves both.
"""
from __future__ import annotations

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode

from ..ir import AUGMENT_OPS, Augment, ChainState, Step, Unsupported
from . import register, transform_name
from .affine import pil_fill, pil_resample


def _policy_fill(t, state: ChainState):
    """(fill, bilinear) of a policy on a PIL image: its geometric operations go through Pillow's
    affine transform, nearest (16.16 fixed point) or bilinear (its generic transform), both
    reproduced exactly in the torch stage."""
    mode = pil_resample(t, state, (InterpolationMode.NEAREST, InterpolationMode.BILINEAR))
    fill = t.fill
    if isinstance(fill, dict):  # v2 keeps a per-type dict; PIL images get the PIL entry
        import PIL.Image
        fill = fill.get(PIL.Image.Image, fill.get("others")) if fill else None
    return pil_fill(fill, state.channels), mode == InterpolationMode.BILINEAR


def _v1_draw(space, signed_rng=True):
    """v1's draw from an ``_augmentation_space`` dict: op, magnitude bin (or fixed), sign."""
    names = list(space.keys())
    name = names[int(torch.randint(len(names), (1,)).item())]
    magnitudes, signed = space[name]
    return name, magnitudes, signed


def _record(g, name: str, magnitude: float) -> None:
    g.params += [AUGMENT_OPS.index(name), float(magnitude)]


@register(T.TrivialAugmentWide)
def trivial_augment_v1(t, state: ChainState, alloc) -> Step:
    fill, bilinear = _policy_fill(t, state)
    slot = alloc(2)
    bins = t.num_magnitude_bins

    def draw(g) -> None:
        name, magnitudes, signed = _v1_draw(t._augmentation_space(bins))
        magnitude = (float(magnitudes[torch.randint(len(magnitudes), (1,), dtype=torch.long)].item())
                     if magnitudes.ndim > 0 else 0.0)
        if signed and torch.randint(2, (1,)):
            magnitude *= -1.0
        _record(g, name, magnitude)
    return Step(transform_name(t), [Augment(slot, fill, bilinear)], draw)


@register(T.RandAugment)
def rand_augment_v1(t, state: ChainState, alloc) -> Step:
    fill, bilinear = _policy_fill(t, state)
    slots = [alloc(2) for _ in range(t.num_ops)]
    bins, level = t.num_magnitude_bins, t.magnitude

    def draw(g) -> None:
        space = t._augmentation_space(bins, (g.height, g.width))
        for _ in slots:
            name, magnitudes, signed = _v1_draw(space)
            magnitude = float(magnitudes[level].item()) if magnitudes.ndim > 0 else 0.0
            if signed and torch.randint(2, (1,)):
                magnitude *= -1.0
            _record(g, name, magnitude)
    return Step(transform_name(t), [Augment(s, fill, bilinear) for s in slots], draw)


def _v2_magnitude(t, name, magnitudes_fn, signed, g, pick, bins=None) -> float:
    magnitudes = magnitudes_fn(bins or t.num_magnitude_bins, g.height, g.width)
    if magnitudes is None:
        return 0.0
    magnitude = float(magnitudes[pick()])
    if signed and torch.rand(()) <= 0.5:
        magnitude *= -1
    return magnitude * 255.0 if name == "Solarize" else magnitude  # v2: a fraction of the range


def _v2_item(space):
    keys = tuple(space.keys())
    key = keys[int(torch.randint(len(keys), ()))]
    return key, space[key]


@register(v2.TrivialAugmentWide)
def trivial_augment_v2(t, state: ChainState, alloc) -> Step:
    fill, bilinear = _policy_fill(t, state)
    slot = alloc(2)

    def draw(g) -> None:
        name, (fn, signed) = _v2_item(t._AUGMENTATION_SPACE)
        _record(g, name, _v2_magnitude(t, name, fn, signed, g,
                                       lambda: int(torch.randint(t.num_magnitude_bins, ()))))
    return Step(transform_name(t), [Augment(slot, fill, bilinear)], draw)


@register(v2.RandAugment)
def rand_augment_v2(t, state: ChainState, alloc) -> Step:
    fill, bilinear = _policy_fill(t, state)
    slots = [alloc(2) for _ in range(t.num_ops)]

    def draw(g) -> None:
        for _ in slots:
            name, (fn, signed) = _v2_item(t._AUGMENTATION_SPACE)
            _record(g, name, _v2_magnitude(t, name, fn, signed, g, lambda: t.magnitude))
    return Step(transform_name(t), [Augment(s, fill, bilinear) for s in slots], draw)


@register(T.AutoAugment)
def auto_augment_v1(t, state: ChainState, alloc) -> Step:
    """A sub-policy per sample, each of its two operations applied with its probability
    (Identity where not): torchvision's get_params, then its loop."""
    fill, bilinear = _policy_fill(t, state)
    slots = [alloc(2) for _ in range(2)]

    def draw(g) -> None:
        policy_id, probs, signs = t.get_params(len(t.policies))
        space = t._augmentation_space(10, (g.height, g.width))
        for i, (name, p, magnitude_id) in enumerate(t.policies[policy_id]):
            if probs[i] <= p:
                magnitudes, signed = space[name]
                magnitude = float(magnitudes[magnitude_id].item()) if magnitude_id is not None else 0.0
                if signed and signs[i] == 0:
                    magnitude *= -1.0
                _record(g, name, magnitude)
            else:
                _record(g, "Identity", 0.0)
    return Step(transform_name(t), [Augment(s, fill, bilinear) for s in slots], draw)


@register(v2.AutoAugment)
def auto_augment_v2(t, state: ChainState, alloc) -> Step:
    fill, bilinear = _policy_fill(t, state)
    policies = t._policies
    if any(len(p) != 2 for p in policies):
        raise Unsupported(f"{transform_name(t)} with sub-policies of other than two operations")
    slots = [alloc(2) for _ in range(2)]

    def draw(g) -> None:
        policy = policies[int(torch.randint(len(policies), ()))]
        for name, probability, magnitude_idx in policy:
            if not torch.rand(()) <= probability:
                _record(g, "Identity", 0.0)
                continue
            fn, signed = t._AUGMENTATION_SPACE[name]
            _record(g, name, _v2_magnitude(t, name, fn, signed, g, lambda: magnitude_idx, bins=10))
    return Step(transform_name(t), [Augment(s, fill, bilinear) for s in slots], draw)


@register(T.AugMix, v2.AugMix)
def aug_mix(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"{transform_name(t)} mixes chains of torchvision's *tensor* kernels (bilinear "
                      "warps, float mixing) drawn per sample; replayed per sample on the main thread "
                      "they would be slower than in the workers, so it runs there (TrivialAugmentWide, "
                      "RandAugment and AutoAugment are translated)")
