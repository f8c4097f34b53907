"""timm's transform classes, recognised by qualified name: timm is never imported here.

RandomResizedCropAndInterpolation draws with its own ``get_params`` (Python's ``random``,
seeded per worker by the DataLoader as for any worker code) and then does what torchvision's
resized_crop does; the conversions map onto the torchvision ones they equal.
"""
from __future__ import annotations

from dali_autoproxy.plan.ir import Crop, Resize, ToCHW, ToFloat, Unsupported
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.geometry import exact_resize_step, pillow_kind, resample_mode
from dali_autoproxy.plan.translate.registry import register, transform_name

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


@register(_M + "ResizeKeepRatio", _M + "CenterCropOrPad", _M + "RandomCropOrPad", _M + "RandomPad",
                _M + "TrimBorder", "timm.data.random_erasing.RandomErasing")
def timm_untranslated(t, state: ChainState, alloc) -> Step:
    raise Unsupported(f"timm's {type(t).__name__} is not translated")
