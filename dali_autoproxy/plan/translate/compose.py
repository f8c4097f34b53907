"""Composition converters: RandomApply, Identity, and precise reasons for the rest.

RandomApply draws its coin as torchvision does; when it says "skip", the inner transforms
draw nothing (torchvision does not call them) and their ops get their ``neutral`` params,
which leave the image unchanged. Only transforms that keep the image's shape and type can be
skipped this way, because a batch must keep one shape.
"""
from __future__ import annotations

import dataclasses

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import flatten, lookup, register, transform_name


@register(T.RandomApply, v2.RandomApply)
def random_apply(t, state: ChainState, alloc) -> Step:
    before = dataclasses.replace(state)
    inner = []
    for child in (x for tr in t.transforms for x in flatten(tr)):
        step = lookup(child)(child, state, alloc)
        if step.neutral is None:
            raise Unsupported(f"{transform_name(t)} of {step.name}: it cannot be skipped per sample "
                              "inside one batch")
        inner.append(step)
    if state != before:
        raise Unsupported(f"{transform_name(t)} of transforms that change the image's type or size")
    p = float(t.p)
    v1 = not isinstance(t, v2.Transform)

    def draw(g) -> None:
        r = torch.rand(1)
        if (not p < r) if v1 else bool(r < p):  # v1 skips when p < r, v2 when r >= p
            for step in inner:
                if step.draw is not None:
                    step.draw(g)
        else:
            for step in inner:
                g.params += step.neutral
    ops = [op for step in inner for op in step.ops]
    neutral = [v for step in inner for v in step.neutral]
    return Step(transform_name(t), ops, draw, neutral=neutral)


@register(v2.Identity)
def identity(t, state: ChainState, alloc) -> Step:
    return Step(transform_name(t), [], neutral=[])


@register(T.RandomChoice, v2.RandomChoice, T.RandomOrder, v2.RandomOrder)
def random_choice_or_order(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"{transform_name(t)} picks or orders transforms per call, which one static "
                      "DALI graph does not express; it runs in the worker")


@register(T.Lambda, v2.Lambda)
def user_lambda(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"{transform_name(t)} runs user code; it runs in the worker")


@register(T.FiveCrop, v2.FiveCrop, T.TenCrop, v2.TenCrop)
def multi_crop(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"{transform_name(t)} returns a tuple of crops, which the user's next step stacks; "
                      "it runs in the worker")


@register(v2.RandomShortestSize, v2.ScaleJitter, v2.RandomResize)
def random_size(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"{transform_name(t)} gives every image its own size (a batch DALI cannot form "
                      "before a crop); it runs in the worker")
