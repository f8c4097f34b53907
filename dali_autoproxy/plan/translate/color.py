"""Colour converters: jitter, grayscale, invert, solarize, posterize.

Random decisions and factors are drawn as torchvision draws them (``coin_drawer``, its own
``get_params``/``make_params``); the pixels are computed in DALI with Pillow's arithmetic
(``backends/dali/color.py`` and the torch stage), so on RGB PIL images the results match torchvision's exactly.
"""
from __future__ import annotations

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.plan.ir import ColorJitter as ColorJitterOp
from dali_autoproxy.plan.ir import FastColorJitter, PixelOp, TensorColorJitter, Unsupported
from dali_autoproxy.plan.ir import Grayscale as GrayscaleOp
from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, Augment
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import coin_drawer, register, transform_name, v2_params
from dali_autoproxy.plan.tv_internals import tensor_jitter_module


def _uint8_only(t, state: ChainState) -> None:
    if state.dtype != "uint8":
        raise Unsupported(f"{transform_name(t)} on float tensors is not translated (on uint8 images it is)")


def _apply_with_p(t, state: ChainState, alloc, kind: str, arg: int = 0) -> Step:
    _uint8_only(t, state)
    return Step(transform_name(t), [PixelOp(kind, alloc(PixelOp), arg)], coin_drawer(float(t.p)),
                neutral=list(PixelOp.neutral))


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


def _pil_rgb_only(t, state: ChainState) -> None:
    if state.kind != "pil" or state.channels != 3:
        raise Unsupported(f"{transform_name(t)} on tensors or 1-channel images is not translated "
                          "(on RGB PIL images it is, with Pillow's arithmetic)")


@register(T.ColorJitter, v2.ColorJitter)
def color_jitter(t, state: ChainState, alloc) -> Step:
    """Factors and the order permutation come from torchvision's own draw. On PIL images the
    hue factor becomes the 8-bit shift Pillow adds (``np.int32(hue * 255)`` wrapped to uint8);
    on tensors torchvision's tensor kernels run batched, a factor per sample, in the torch stage."""
    tensor = state.kind == "tensor"
    if tensor:
        if state.channels != 3 or state.dtype not in ("uint8", "float32"):
            raise Unsupported(f"{transform_name(t)} on {state.channels}-channel {state.dtype} tensors")
    else:
        _pil_rgb_only(t, state)
    ranges = (t.brightness, t.contrast, t.saturation, t.hue)
    enabled = tuple(r is not None for r in ranges)
    fast = not tensor and state.fidelity == "fast"
    op_type = FastColorJitter if fast else TensorColorJitter if tensor else ColorJitterOp
    slot = alloc(op_type) if any(enabled) else None
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def drawn(g):
            p = params([g.standin()])
            return (p["fn_idx"], p["brightness_factor"], p["contrast_factor"],
                    p["saturation_factor"], p["hue_factor"])
    else:
        def drawn(g):
            return T.ColorJitter.get_params(*ranges)

    def draw(g) -> None:
        order, b, c, s, h = drawn(g)
        first, second, third, fourth = (int(i) for i in order)
        g.put(op, first=first, second=second, third=third, fourth=fourth,
              brightness=1.0 if b is None else float(b), contrast=1.0 if c is None else float(c),
              saturation=1.0 if s is None else float(s),
              hue=(0.0 if h is None else float(h)) if tensor else (0 if h is None else int(h * 255) % 256))
    if not any(enabled):
        return Step(transform_name(t), [], drawn, neutral=[])  # torchvision still draws the permutation
    if fast:
        op = FastColorJitter(slot)
        adjustments = ("brightness", "contrast", "saturation", "hue")

        def draw_per_position(g) -> None:
            order, *factors = drawn(g)
            values = dict(zip(FastColorJitter.params, FastColorJitter.neutral))
            for k, which in enumerate(int(i) for i in order):
                if factors[which] is not None:
                    values[f"{adjustments[which]}{k}"] = float(factors[which])
            g.put(op, **values)
        return Step(transform_name(t), [op], draw_per_position, neutral=list(FastColorJitter.neutral))
    if tensor:
        api = "v2" if isinstance(t, v2.Transform) else "v1"
        try:
            tensor_jitter_module(api)
        except (ImportError, AttributeError) as exc:  # torchvision moved its private kernels
            raise Unsupported(f"{transform_name(t)} on tensors needs torchvision's tensor kernels, "
                              f"not found in this torchvision ({exc})") from None
        op = TensorColorJitter(slot, enabled, api)
        return Step(transform_name(t), [op], draw, neutral=list(TensorColorJitter.neutral))
    op = ColorJitterOp(slot, enabled)  # its neutral order (JITTER_SKIP) matches no adjustment
    return Step(transform_name(t), [op], draw, neutral=list(ColorJitterOp.neutral))


def _to_gray(t, state: ChainState, channels: int, slot=None) -> Step:
    _pil_rgb_only(t, state)
    if channels not in (1, 3):
        raise Unsupported(f"num_output_channels={channels}; torchvision would raise")
    state.channels = channels

    def draw_channels(g) -> None:
        g.channels = channels
    return Step(transform_name(t), [GrayscaleOp(channels, slot)], None if slot is not None else draw_channels)


@register(T.Grayscale, v2.Grayscale)
def grayscale(t, state: ChainState, alloc) -> Step:
    return _to_gray(t, state, int(t.num_output_channels))


@register(T.RandomGrayscale, v2.RandomGrayscale)
def random_grayscale(t, state: ChainState, alloc) -> Step:
    """Keeps the input's channel count, as torchvision does."""
    step = _to_gray(t, state, state.channels, alloc(GrayscaleOp))
    step.draw, step.neutral = coin_drawer(float(t.p)), list(GrayscaleOp.neutral)
    return step


def _policy_op(t, state: ChainState, alloc, name: str, magnitude: float) -> Step:
    """A single policy operation applied with probability p (the torch stage's exact kernels)."""
    _pil_rgb_only(t, state)
    op = Augment(alloc(Augment), (0.0,) * state.channels)
    p = float(t.p)
    code = AUGMENT_OPS.index(name)

    def draw(g) -> None:
        applied = bool(torch.rand(1) < p)  # coin_drawer's draw
        g.put(op, *((code, magnitude) if applied else Augment.neutral))
    return Step(transform_name(t), [op], draw, neutral=list(Augment.neutral))


@register(T.RandomAdjustSharpness, v2.RandomAdjustSharpness)
def random_adjust_sharpness(t, state: ChainState, alloc) -> Step:
    return _policy_op(t, state, alloc, "Sharpness", float(t.sharpness_factor) - 1.0)


@register(T.RandomAutocontrast, v2.RandomAutocontrast)
def random_autocontrast(t, state: ChainState, alloc) -> Step:
    return _policy_op(t, state, alloc, "AutoContrast", 0.0)


@register(T.RandomEqualize, v2.RandomEqualize)
def random_equalize(t, state: ChainState, alloc) -> Step:
    return _policy_op(t, state, alloc, "Equalize", 0.0)
