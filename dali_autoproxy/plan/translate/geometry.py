"""Geometry converters: crops, resizes and flips.

Random parameters are drawn in the worker by torchvision's *own* parameter code, called on
a zero-cost stand-in tensor of the sample's size (see ``SampleGeometry.standin``): the same
torch RNG calls in the same order, so a fixed ``torch.manual_seed`` gives the very crop
boxes and flips plain torchvision would give.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode

from dali_autoproxy.plan.ir import PILLOW_FILTERS, Crop, Flip, Op, PillowResize, Resize, TensorResize, Unsupported
from dali_autoproxy.plan.steps import ChainState, SampleGeometry, Step
from dali_autoproxy.plan.translate.crop_draws import copies_hold, log_ratio, resized_crop_box
from dali_autoproxy.plan.translate.registry import coin_drawer, register, transform_name, v2_params


def as_mode(interpolation) -> InterpolationMode:
    if isinstance(interpolation, InterpolationMode):
        return interpolation
    if isinstance(interpolation, str):
        return InterpolationMode(interpolation)
    if isinstance(interpolation, int):  # PIL constants, accepted by torchvision
        from torchvision.transforms.functional import _interpolation_modes_from_int
        return _interpolation_modes_from_int(interpolation)
    raise Unsupported(f"interpolation {interpolation!r} is not understood")


def resample_mode(interpolation, antialias: Optional[bool], state: ChainState) -> Tuple[str, bool]:
    """DALI's filter for torchvision's mode, or Unsupported where the two would differ."""
    mode = as_mode(interpolation)
    if state.kind == "pil":  # PIL always antialiases bilinear and bicubic
        table = {InterpolationMode.BILINEAR: ("linear", True), InterpolationMode.BICUBIC: ("cubic", True),
                 InterpolationMode.NEAREST: ("nn", False), InterpolationMode.NEAREST_EXACT: ("nn", False)}
        if mode in table:
            return table[mode]
    else:
        if mode == InterpolationMode.BILINEAR:
            return "linear", bool(antialias)
        if mode == InterpolationMode.NEAREST_EXACT:
            return "nn", False
        if mode == InterpolationMode.NEAREST:
            raise Unsupported("interpolation NEAREST on tensors uses torch's legacy floor rounding, "
                              "which DALI does not reproduce (NEAREST_EXACT is supported)")
        if mode == InterpolationMode.BICUBIC:
            raise Unsupported("interpolation BICUBIC on tensors uses torch's a=-0.75 kernel, "
                              "which DALI does not reproduce (bicubic on PIL images is supported)")
    raise Unsupported(f"interpolation {mode.value} is not translated yet")


_PILLOW_KIND = {InterpolationMode.NEAREST: PILLOW_FILTERS["nearest"],
                InterpolationMode.NEAREST_EXACT: PILLOW_FILTERS["nearest"],  # torchvision's mapping for PIL
                InterpolationMode.BILINEAR: PILLOW_FILTERS["bilinear"],
                InterpolationMode.BICUBIC: PILLOW_FILTERS["bicubic"], InterpolationMode.BOX: PILLOW_FILTERS["box"],
                InterpolationMode.LANCZOS: PILLOW_FILTERS["lanczos"],
                InterpolationMode.HAMMING: PILLOW_FILTERS["hamming"]}


_DALI_RESIZES_PIL = (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC, InterpolationMode.NEAREST,
                     InterpolationMode.NEAREST_EXACT)


def pillow_kind(interpolation, state: ChainState, dali_can: bool = True) -> Optional[int]:
    """Pillow's filter for an exact resize of a PIL image (ir.PillowResize), or None where DALI's
    resize is used: tensors (torch's maths), and PIL images with ``resize="dali"``
    where DALI has the filter. BOX, LANCZOS, HAMMING, and a filter drawn per image
    (``dali_can=False``), take the exact resize either way."""
    if state.kind != "pil":
        return None
    mode = as_mode(interpolation)
    if not state.exact_resize and dali_can and mode in _DALI_RESIZES_PIL:
        return None
    return _PILLOW_KIND.get(mode)


def exact_resize_step(name: str, kinds, state: ChainState, alloc, out_size: Optional[Tuple[int, int]],
                      size=None, max_size: Optional[int] = None, crop: Optional[Callable] = None,
                      crop_slot: Optional[int] = None, tensor: Optional[Tuple[str, Optional[bool], str]] = None
                      ) -> Step:
    """A Pillow-exact resize (after an optional random crop ``crop(g) -> (top, left, h, w)``):
    ``kinds()`` gives each sample's Pillow filter (one fixed filter, or timm's per-image draw).
    ``tensor``: (interpolation, antialias, api) of torchvision's own resize of a tensor image
    (ir.TensorResize) instead."""
    cropping = Crop(crop_slot, in_bounds=True) if crop is not None else None
    if tensor is None:
        resizing: Op = PillowResize(alloc(PillowResize), out_size)

        def values(h: int, w: int, out_h: int, out_w: int) -> tuple:
            return h, w, out_h, out_w, kinds(), 0, 0, h, w  # in, out, filter, box: the whole image
    else:
        resizing = TensorResize(alloc(TensorResize), *tensor, out_size)

        def values(h: int, w: int, out_h: int, out_w: int) -> tuple:
            return h, w, out_h, out_w

    def draw(g: SampleGeometry) -> None:  # per sample, in the worker: values in the schemas' order
        if cropping is not None:
            top, left, height, width = (int(v) for v in crop(g))
            g.put(cropping, top, left, height, width)
            g.height, g.width = height, width
        h, w = g.height, g.width
        out_h, out_w = out_size if out_size is not None else resized_output_size(h, w, size, max_size)
        g.put(resizing, *values(h, w, out_h, out_w))
        g.height, g.width = out_h, out_w
    return Step(name, ([cropping] if cropping is not None else []) + [resizing], draw)


_TENSOR_MODES = (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC, InterpolationMode.NEAREST,
                 InterpolationMode.NEAREST_EXACT)
_DALI_RESIZES_TENSOR = (InterpolationMode.BILINEAR, InterpolationMode.NEAREST_EXACT)


def tensor_resize(t, state: ChainState) -> Optional[Tuple[str, Optional[bool], str]]:
    """(interpolation, antialias, api) of torchvision's own resize of a tensor image
    (ir.TensorResize): with ``resize="pillow"`` (torchvision's results), and for the filters DALI
    lacks on tensors (torch's bicubic, its legacy nearest); None: DALI's resize, or a PIL image."""
    mode = as_mode(t.interpolation)
    if state.kind == "pil" or mode not in _TENSOR_MODES:
        return None
    if not state.exact_resize and mode in _DALI_RESIZES_TENSOR:
        return None
    return mode.value, getattr(t, "antialias", True), "v2" if isinstance(t, v2.Transform) else "v1"


def _size_pair(size) -> Tuple[int, int]:
    if isinstance(size, int):
        return size, size
    size = list(size)
    return (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))


def resized_output_size(height: int, width: int, size, max_size: Optional[int]) -> Tuple[int, int]:
    """torchvision's _compute_resized_output_size (v1 and v2), for one sample."""
    if size is None:
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = int(max_size * short / long), max_size
    elif isinstance(size, int) or len(size) == 1:
        requested = size if isinstance(size, int) else size[0]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = requested, int(requested * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    else:
        return int(size[0]), int(size[1])
    return (new_long, new_short) if width <= height else (new_short, new_long)



_V2_RRC = v2.RandomResizedCrop(8)  # whose parameter method a v2 subclass may have replaced


@register(T.RandomResizedCrop, v2.RandomResizedCrop)
def random_resized_crop(t, state: ChainState, alloc) -> Step:
    out_h, out_w = _size_pair(t.size)
    kind, tensor = pillow_kind(t.interpolation, state), tensor_resize(t, state)
    if kind is None and tensor is None:
        interp, antialias = resample_mode(t.interpolation, getattr(t, "antialias", True), state)
    slot = alloc(Crop)
    v2_own = isinstance(t, v2.RandomResizedCrop) and v2_params(t).__func__ is v2_params(_V2_RRC).__func__
    if isinstance(t, v2.Transform) and not (v2_own and copies_hold()):  # a subclass's own draws, or changed ones
        params = v2_params(t)

        def box(g: SampleGeometry):
            p = params([g.standin()])
            return p["top"], p["left"], p["height"], p["width"]
    elif type(t).get_params is not T.RandomResizedCrop.get_params or not copies_hold():
        get_params, scale, ratio = type(t).get_params, t.scale, t.ratio  # a subclass's own, or a changed one

        def box(g: SampleGeometry):
            return tuple(int(v) for v in get_params(g.standin(), scale, ratio))
    else:  # torchvision's own draws, on reused tensors (crop_draws.py)
        scale, ratio = t.scale, t.ratio
        logs = log_ratio(ratio)

        def box(g: SampleGeometry):
            return resized_crop_box(g.height, g.width, scale, ratio, logs)
    state.fixed_size = (out_h, out_w)
    if kind is not None or tensor is not None:
        return exact_resize_step(transform_name(t), lambda: kind, state, alloc, (out_h, out_w), crop=box,
                                 crop_slot=slot, tensor=tensor)

    cropping = Crop(slot, in_bounds=True)

    def draw(g: SampleGeometry) -> None:
        g.put(cropping, *box(g))
        g.height, g.width = out_h, out_w
    return Step(transform_name(t), [cropping, Resize(interp, antialias, size=(out_h, out_w))], draw)


@register(T.Resize, v2.Resize)
def resize(t, state: ChainState, alloc) -> Step:
    size: Optional[Sequence[int]] = t.size
    max_size = getattr(t, "max_size", None)
    fixed = (int(size[0]), int(size[1])) if size is not None and not isinstance(size, int) and len(size) == 2 else None
    kind, tensor = pillow_kind(t.interpolation, state), tensor_resize(t, state)
    if kind is not None or tensor is not None:
        state.fixed_size = fixed
        return exact_resize_step(transform_name(t), lambda: kind, state, alloc, fixed, size, max_size,
                                 tensor=tensor)
    interp, antialias = resample_mode(t.interpolation, getattr(t, "antialias", True), state)
    if fixed is not None:
        state.fixed_size = fixed

        def draw(g: SampleGeometry) -> None:
            g.height, g.width = fixed
        return Step(transform_name(t), [Resize(interp, antialias, size=fixed)], draw)
    resizing = Resize(interp, antialias, slot=alloc(Resize))
    state.fixed_size = None

    def draw_var(g: SampleGeometry) -> None:
        g.height, g.width = resized_output_size(g.height, g.width, size, max_size)
        g.put(resizing, height=g.height, width=g.width)
    return Step(transform_name(t), [resizing], draw_var)


def center_crop_box(height: int, width: int, crop_h: int, crop_w: int) -> Tuple[int, int]:
    """(top, left) of torchvision's center_crop, negative where it pads with zeros first."""
    pad_top = (crop_h - height) // 2 if crop_h > height else 0
    pad_left = (crop_w - width) // 2 if crop_w > width else 0
    padded_h, padded_w = max(height, crop_h), max(width, crop_w)
    top = int(round((padded_h - crop_h) / 2.0)) - pad_top
    left = int(round((padded_w - crop_w) / 2.0)) - pad_left
    return top, left


@register(T.CenterCrop, v2.CenterCrop)
def center_crop(t, state: ChainState, alloc) -> Step:
    crop_h, crop_w = _size_pair(t.size)
    cropping = Crop(alloc(Crop), in_bounds=False)
    state.fixed_size = (crop_h, crop_w)

    def draw(g: SampleGeometry) -> None:
        top, left = center_crop_box(g.height, g.width, crop_h, crop_w)
        g.put(cropping, top=top, left=left, height=crop_h, width=crop_w)
        g.height, g.width = crop_h, crop_w
    return Step(transform_name(t), [cropping], draw)


@register(T.RandomHorizontalFlip, v2.RandomHorizontalFlip)
def random_horizontal_flip(t, state: ChainState, alloc) -> Step:
    return Step(transform_name(t), [Flip(alloc(Flip))], coin_drawer(float(t.p)), neutral=list(Flip.neutral))


def _padding_ltrb(padding) -> Tuple[int, int, int, int]:
    """torchvision's padding forms: int, [all], [left/right, top/bottom], [l, t, r, b]."""
    if isinstance(padding, int):
        p = [padding] * 4
    else:
        padding = list(padding)
        if len(padding) == 1:
            p = padding * 4
        elif len(padding) == 2:
            p = [padding[0], padding[1], padding[0], padding[1]]
        elif len(padding) == 4:
            p = padding
        else:
            raise Unsupported(f"padding {padding!r} is not understood")
    if any(int(v) != v or v < 0 for v in p):
        raise Unsupported("negative or fractional padding is not translated")
    return int(p[0]), int(p[1]), int(p[2]), int(p[3])


def _constant_fill(t, state: ChainState) -> Tuple[float, ...]:
    if getattr(t, "padding_mode", "constant") != "constant":
        raise Unsupported(f"padding_mode={t.padding_mode!r} is not translated (constant is)")
    fill = t.fill
    if isinstance(fill, dict):
        raise Unsupported("a per-type fill dict is not translated")
    if fill is None:
        fill = 0
    values = [float(fill)] if isinstance(fill, (int, float)) else [float(f) for f in fill]
    if state.dtype == "uint8" and any(v != int(v) or not 0 <= v <= 255 for v in values):
        raise Unsupported("a fill outside 0..255 on uint8 pixels is not translated")
    if len(values) not in (1, state.channels):
        raise Unsupported(f"a fill of {len(values)} values for {state.channels} channels")
    return tuple(values) if len(values) > 1 else (values[0],) * state.channels


@register(T.Pad, v2.Pad)
def pad(t, state: ChainState, alloc) -> Step:
    left, top, right, bottom = _padding_ltrb(t.padding)
    fill = _constant_fill(t, state)
    cropping = Crop(alloc(Crop), in_bounds=False, fill=fill)
    state.fixed_size = None

    def draw(g: SampleGeometry) -> None:
        height, width = g.height + top + bottom, g.width + left + right
        g.put(cropping, top=-top, left=-left, height=height, width=width)
        g.height, g.width = height, width
    return Step(transform_name(t), [cropping], draw)


@register(T.RandomCrop, v2.RandomCrop)
def random_crop(t, state: ChainState, alloc) -> Step:
    """Optional padding, then a random crop: one crop box relative to the unpadded image
    (negative or past the edge where the padding is), filled with the constant."""
    fill = _constant_fill(t, state)
    crop_h, crop_w = _size_pair(t.size)
    cropping = Crop(alloc(Crop), in_bounds=False, fill=fill)
    state.fixed_size = (crop_h, crop_w)
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def draw(g: SampleGeometry) -> None:
            p = params([g.standin()])
            pad_l, pad_t = (p["padding"][0], p["padding"][1]) if p.get("needs_pad") else (0, 0)
            if p.get("needs_crop", True):
                top, left = p["top"] - pad_t, p["left"] - pad_l
            else:
                top, left = -pad_t, -pad_l
            g.put(cropping, top=top, left=left, height=crop_h, width=crop_w)
            g.height, g.width = crop_h, crop_w
        return Step(transform_name(t), [cropping], draw)

    pad_l, pad_t, pad_r, pad_b = _padding_ltrb(t.padding) if t.padding is not None else (0, 0, 0, 0)

    def draw_v1(g: SampleGeometry) -> None:
        off_t, off_l = pad_t, pad_l
        h, w = g.height + pad_t + pad_b, g.width + pad_l + pad_r
        if t.pad_if_needed and w < crop_w:  # torchvision pads both sides by the difference
            off_l, w = off_l + (crop_w - w), w + 2 * (crop_w - w)
        if t.pad_if_needed and h < crop_h:
            off_t, h = off_t + (crop_h - h), h + 2 * (crop_h - h)
        g.height, g.width = h, w
        i, j, _, _ = T.RandomCrop.get_params(g.standin(), (crop_h, crop_w))
        g.put(cropping, top=i - off_t, left=j - off_l, height=crop_h, width=crop_w)
        g.height, g.width = crop_h, crop_w
    return Step(transform_name(t), [cropping], draw_v1)


@register(T.RandomVerticalFlip, v2.RandomVerticalFlip)
def random_vertical_flip(t, state: ChainState, alloc) -> Step:
    return Step(transform_name(t), [Flip(alloc(Flip), vertical=True)], coin_drawer(float(t.p)),
                neutral=list(Flip.neutral))
