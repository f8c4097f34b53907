"""timm's transform classes, recognised by qualified name: timm is never imported here.

RandomResizedCropAndInterpolation draws with its own ``get_params`` (Python's ``random``,
seeded per worker by the DataLoader as for any worker code) and then does what torchvision's
resized_crop does; the conversions map onto the torchvision ones they equal. RandomErasing's
boxes are drawn by a copy of its ``_erase``, guarded by the fingerprint of timm's code.
"""
from __future__ import annotations

import functools
import math
import random
import sys

from dali_autoproxy.plan.ir import Crop, DrawnErase, Erase, Resize, ToCHW, ToFloat, Unsupported
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.geometry import exact_resize_step, pillow_kind, resample_mode
from dali_autoproxy.plan.translate.registry import fingerprint, register, transform_name

_M = "timm.data.transforms."


@register(_M + "RandomResizedCropAndInterpolation")
def random_resized_crop_and_interpolation(t, state: ChainState, alloc) -> Step:
    """timm's train crop; ``interpolation='random'`` (its train.py default) draws bilinear or
    bicubic per image with ``random.choice``, after the box, as timm's ``__call__`` does: the
    exact resize takes a filter per sample."""
    import random
    out_h, out_w = (int(v) for v in t.size)
    slot = alloc(Crop)
    scale, ratio, get_params = t.scale, t.ratio, type(t).get_params
    state.fixed_size = (out_h, out_w)
    choices = tuple(t.interpolation) if isinstance(t.interpolation, (tuple, list)) else None
    kinds = [pillow_kind(m, state, dali_can=choices is None) for m in (choices or (t.interpolation,))]

    def box(g):
        return get_params(g.standin(), scale, ratio)
    if all(k is not None for k in kinds):
        if choices is None:
            return exact_resize_step(transform_name(t), lambda: kinds[0], state, alloc, (out_h, out_w), crop=box,
                                     crop_slot=slot)
        by_mode = dict(zip(choices, kinds))
        return exact_resize_step(transform_name(t), lambda: by_mode[random.choice(choices)], state, alloc,
                                 (out_h, out_w), crop=box, crop_slot=slot)
    if choices is not None:
        raise Unsupported(f"{transform_name(t)}(interpolation='random') on a {state.kind} image is not translated")
    interp, antialias = resample_mode(t.interpolation, True, state)

    cropping = Crop(slot, in_bounds=True)

    def draw(g) -> None:
        g.put(cropping, *box(g))
        g.height, g.width = out_h, out_w
    return Step(transform_name(t), [cropping, Resize(interp, antialias, size=(out_h, out_w))], draw)


def _from_pil(t, state: ChainState, dtype: str, ops) -> Step:
    if state.kind != "pil":
        raise Unsupported(f"{transform_name(t)} expects a PIL image here")
    state.kind, state.dtype = "tensor", dtype
    return Step(transform_name(t), ops)


@register(_M + "MaybeToTensor")
def maybe_to_tensor(t, state: ChainState, alloc) -> Step:
    if state.kind == "tensor":
        return Step(transform_name(t), [], neutral=[])  # passes tensors through
    return _from_pil(t, state, "float32", [ToFloat(1.0 / 255.0, divide=True), ToCHW()])


@register(_M + "MaybePILToTensor", _M + "ToNumpy")
def maybe_pil_to_tensor(t, state: ChainState, alloc) -> Step:
    """ToNumpy's CHW uint8 array becomes the same tensor in default_collate."""
    if state.kind == "tensor" and t.__class__.__name__ == "MaybePILToTensor":
        return Step(transform_name(t), [], neutral=[])
    return _from_pil(t, state, "uint8", [ToCHW()])


@register(_M + "ToTensor")
def to_tensor_unscaled(t, state: ChainState, alloc) -> Step:
    import torch
    if t.dtype != torch.float32:
        raise Unsupported(f"{transform_name(t)}(dtype={t.dtype}) is not translated (float32 is)")
    return _from_pil(t, state, "float32", [ToFloat(1.0), ToCHW()])


_ERASING = {"_erase": "b293416531e66728", "_get_pixels": "c0112631401adf7f"}  # timm 1.0's code, copied below


@functools.lru_cache(maxsize=None)
def _erasing_code_known(module_name: str) -> bool:
    module = sys.modules[module_name]
    try:
        return {name: fingerprint(getattr(module.RandomErasing, name, None) or getattr(module, name))
                for name in _ERASING} == _ERASING
    except (AttributeError, OSError, TypeError, SyntaxError):
        return False


@register("timm.data.random_erasing.RandomErasing")
def random_erasing(t, state: ChainState, alloc) -> Step:
    """timm's RandomErasing of one normalised CHW tensor (its place in timm's non-prefetcher
    chains): ``max_count`` boxes at most, each drawn by the copy of ``_erase`` below with
    Python's ``random`` as timm draws. Its fill: ``const``, zeros (on DALI); ``rand``, each box's
    values from timm's own ``_get_pixels`` in the worker (timm's values); ``pixel``, timm's
    ``_get_pixels`` is still called (the worker's torch generator moves as plain's), and the box
    is filled with standard normal noise where the op runs (``ir.DrawnErase``: the distribution,
    not the values)."""
    import torch
    module = sys.modules[type(t).__module__]
    if not _erasing_code_known(module.__name__):
        raise Unsupported(f"{transform_name(t)}: timm's erasing code is not the one translated here (another "
                          "version): it runs as written")
    if state.kind != "tensor" or state.dtype != "float32" or state.channels not in (1, 3):
        raise Unsupported(f"{transform_name(t)} is translated on float CHW tensors of 1 or 3 channels only")
    if str(t.device) != "cpu":
        raise Unsupported(f"{transform_name(t)}(device={t.device!r}) in a worker: it runs as written")
    mode = "pixel" if t.per_pixel else "rand" if t.rand_color else "const"
    count = max(int(t.max_count), 1)
    if mode == "const":
        ops = [Erase(alloc(Erase), (0.0,) * state.channels) for _ in range(count)]
    else:
        ops = [DrawnErase(alloc(DrawnErase), per_pixel=mode == "pixel") for _ in range(count)]
    neutral = [v for op in ops for v in type(op).neutral]
    channels, probability, min_area, max_area = state.channels, t.probability, t.min_area, t.max_area
    min_count, max_count, log_aspect_ratio = t.min_count, t.max_count, t.log_aspect_ratio

    def boxes(img_h: int, img_w: int) -> list:
        """timm's ``_erase``, drawing in its order; each box with its ``_get_pixels`` fill."""
        found: list = []
        if random.random() > probability:
            return found
        area = img_h * img_w
        n = min_count if min_count == max_count else random.randint(min_count, max_count)
        for _ in range(n):
            for _attempt in range(10):
                target_area = random.uniform(min_area, max_area) * area / n
                aspect_ratio = math.exp(random.uniform(*log_aspect_ratio))
                h = int(round(math.sqrt(target_area * aspect_ratio)))
                w = int(round(math.sqrt(target_area / aspect_ratio)))
                if w < img_w and h < img_h:
                    top = random.randint(0, img_h - h)
                    left = random.randint(0, img_w - w)
                    fill = None if mode == "const" else module._get_pixels(
                        t.per_pixel, t.rand_color, (channels, h, w), dtype=torch.float32, device="cpu")
                    found.append((top, left, h, w, fill))
                    break
        return found

    def draw(g) -> None:
        found = boxes(g.height, g.width)
        for k, op in enumerate(ops):
            if k >= len(found):
                g.put(op, *type(op).neutral)
                continue
            top, left, h, w, fill = found[k]
            if mode == "const":
                g.put(op, top, left, h, w)
            elif mode == "rand":
                values = [float(v) for v in fill.view(-1)] + [0.0] * (3 - channels)
                g.put(op, top, left, h, w, *values, 0)
            else:  # the seed: the low 24 bits of the first noise value's float32 bits
                seed = int(fill.view(-1)[:1].view(torch.int32)) & 0xFFFFFF
                g.put(op, top, left, h, w, 0.0, 0.0, 0.0, seed)
    return Step(transform_name(t), ops, draw, neutral=neutral)


@register(_M + "ResizeKeepRatio", _M + "CenterCropOrPad", _M + "RandomCropOrPad", _M + "RandomPad",
                _M + "TrimBorder")
def timm_untranslated(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"timm's {type(t).__name__} is not translated")
