"""The plan, executed with torchvision's functional ops on the CPU, for one sample.

Used in the main process when DALI fails on a batch: each sample is decoded by PIL exactly as
torchvision's loader does and replayed through the same ops with the params its worker drew,
so the batch still arrives with PIL-equivalent pixels (or PIL's own exception, for a file PIL
cannot read either) instead of an error from a different decoder.
"""
from __future__ import annotations

import io
import threading
from typing import Any, List

import numpy as np
import torch
import torchvision.transforms.functional as F
import torchvision.transforms.v2.functional as F2
from PIL import Image, ImageEnhance, ImageFilter, ImageOps
from torchvision.transforms import InterpolationMode as M

from dali_autoproxy.backends.torch_stage.tensor_jitter import tensor_color_jitter
from dali_autoproxy.backends.torch_stage.tensor_resize import torchvision_resize
from dali_autoproxy.plan.ir import (
    PERSPECTIVE_IDENTITY,
    Blur,
    ColorJitter,
    Crop,
    DrawnErase,
    Erase,
    FastColorJitter,
    Flip,
    Grayscale,
    Normalize,
    Perspective,
    PillowReduce,
    PillowResize,
    PixelOp,
    Resize,
    TensorColorJitter,
    TensorResize,
    ToCHW,
    ToFloat,
    Warp,
    jitter_order,
)
from dali_autoproxy.plan.kernel_table import KernelTable
from dali_autoproxy.plan.pillow_ops import (
    BUILTIN_KERNELS,
    PILLOW_CALLS,
    TENSOR_COLOR_CALLS,
    PillowBlur,
    PillowCall,
    RaggedPillowCall,
    blur_window_of,
)
from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, Augment, MixAdd, MixBlend, MixStart, TensorAugment
from dali_autoproxy.plan.tv_internals import tensor_policy_operation

# kernel(img, op, row, v2_step) -> img; img a PIL image or a CHW tensor; v2_step: the op comes
# from a v2 transform, whose kernels round differently from v1's (uint8 tensor resize, blur)
CPU_KERNELS = KernelTable("CPU replay")


def decode_like_pil_loader(data: bytes) -> Any:
    img = Image.open(io.BytesIO(data))
    return img.convert("RGB")


def _height(img: Any) -> int:
    return img.size[1] if hasattr(img, "getbands") else int(img.shape[-2])


def _width(img: Any) -> int:
    return img.size[0] if hasattr(img, "getbands") else int(img.shape[-1])


def _pil_fill(fill) -> Any:
    values = tuple(int(v) for v in fill)
    return values if len(values) > 1 else values[0]


def run_plan(plan: Plan, img: Any, params: List[float]) -> torch.Tensor:
    """Apply ``plan`` to a PIL image (or HWC uint8 array) with the given per-sample params."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    for step in plan.steps:
        v2_step = step.name.startswith("v2.")
        for op in step.ops:
            img = CPU_KERNELS[op](img, op, params, v2_step)
    return img


@CPU_KERNELS.register(Crop)
def _crop(img, op: Crop, row, v2_step):
    top, left, h, w = (int(v) for v in row[op.span("top", "width")])
    if any(f != 0 for f in op.fill):  # F.crop pads with zeros: pad with the fill first
        is_pil = isinstance(img, Image.Image)
        pad = [max(0, -left), max(0, -top), max(0, left + w - _width(img)), max(0, top + h - _height(img))]
        img = F.pad(img, pad, fill=_pil_fill(op.fill) if is_pil else list(op.fill) if len(op.fill) > 1 else op.fill[0])
        top, left = top + pad[1], left + pad[0]
    return F.crop(img, top, left, h, w)


@CPU_KERNELS.register(Resize)
def _resize(img, op: Resize, row, v2_step):
    is_pil = isinstance(img, Image.Image)
    size = list(op.size) if op.size is not None else [int(v) for v in row[op.span("height", "width")]]
    mode = {"linear": M.BILINEAR, "cubic": M.BICUBIC, "nn": M.NEAREST if is_pil else M.NEAREST_EXACT}[op.interp]
    resize = (F2 if v2_step and not is_pil else F).resize
    return resize(img, size, interpolation=mode, antialias=op.antialias if not is_pil else True)


@CPU_KERNELS.register(TensorResize)
def _tensor_resize(img, op: TensorResize, row, v2_step):  # torchvision's own resize of a tensor image
    size = [int(v) for v in row[op.span("out_height", "out_width")]]
    if not isinstance(img, Image.Image):
        return torchvision_resize(op.api)(img, size, op.interpolation, op.antialias)
    if [img.height, img.width] == size:  # a recorded one (the image's values made a tensor) not made
        return img
    return F.to_pil_image(torchvision_resize(op.api)(F.pil_to_tensor(img), size, op.interpolation, op.antialias))


@CPU_KERNELS.register(PillowResize)
def _pillow_resize(img, op: PillowResize, row, v2_step):  # what torchvision's resize asks of Pillow
    height, width, kind = (int(op.value(row, name)) for name in ("out_height", "out_width", "filter"))
    top, left, bottom, right = (float(op.value(row, f"box_{side}")) for side in ("top", "left", "bottom", "right"))
    return img.resize((width, height), kind, box=(left, top, right, bottom))


@CPU_KERNELS.register(PillowReduce)
def _pillow_reduce(img, op: PillowReduce, row, v2_step):  # what the user's code asked of Pillow
    factor_y, factor_x = (int(op.value(row, name)) for name in ("factor_y", "factor_x"))
    return img if (factor_y, factor_x) == (1, 1) else img.reduce((factor_x, factor_y))


@CPU_KERNELS.register(Flip)
def _flip(img, op: Flip, row, v2_step):
    if not op.value(row, "apply"):
        return img
    return F.vflip(img) if op.vertical else F.hflip(img)


@CPU_KERNELS.register(PixelOp)
def _pixel_op(img, op: PixelOp, row, v2_step):
    if not op.value(row, "apply"):
        return img
    if op.kind == "invert":
        return F.invert(img)
    if op.kind == "solarize":
        return F.solarize(img, op.arg)
    return F.posterize(img, 8 - (255 - op.arg).bit_length())


@CPU_KERNELS.register(ColorJitter)
def _color_jitter(img, op: ColorJitter, row, v2_step):
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation]
    factors = ("brightness", "contrast", "saturation")
    for which in jitter_order(np.asarray([row]), op)[0]:
        if which < 0:
            continue
        if which < 3:
            img = adjust[which](img, op.value(row, factors[which]))
        else:
            img = F.adjust_hue(img, _hue_factor(int(op.value(row, "hue"))))
    return img


@CPU_KERNELS.register(FastColorJitter)
def _fast_color_jitter(img, op: FastColorJitter, row, v2_step):
    """A failed batch is recomputed exactly: torchvision's adjustments in the drawn order."""
    adjust = {"brightness": F.adjust_brightness, "contrast": F.adjust_contrast, "saturation": F.adjust_saturation}
    for k in range(4):
        for name, fn in adjust.items():
            if op.value(row, f"{name}{k}") != 1.0:
                img = fn(img, float(op.value(row, f"{name}{k}")))
        if op.value(row, f"hue{k}"):
            img = F.adjust_hue(img, float(op.value(row, f"hue{k}")))
    return img


@CPU_KERNELS.register(TensorColorJitter)
def _tensor_color_jitter(img, op: TensorColorJitter, row, v2_step):
    uint8 = img.dtype == torch.uint8
    out = tensor_color_jitter(img.unsqueeze(0).float() if uint8 else img.unsqueeze(0), op, np.asarray([row]), uint8)[0]
    return out.to(torch.uint8) if uint8 else out


@CPU_KERNELS.register(Warp)
def _warp(img, op: Warp, row, v2_step):  # what torchvision's rotate/affine ask of Pillow
    return img.transform(_out_size(img, op, row), Image.AFFINE, list(row[op.span("a", "f")]),
                         Image.BILINEAR if op.bilinear else Image.NEAREST, fillcolor=_pil_fill(op.fill))


def _out_size(img, op, row):
    """(width, height) a Warp or Perspective makes: its own where it asks for one, else the image's."""
    height, width = (int(op.value(row, name)) for name in ("out_height", "out_width"))
    return (width, height) if height > 0 else img.size


@CPU_KERNELS.register(Perspective)
def _perspective(img, op: Perspective, row, v2_step):  # what torchvision's perspective asks of Pillow
    coeffs = [float(v) for v in row[op.span("a", "h")]]
    size = _out_size(img, op, row)
    if tuple(coeffs) == PERSPECTIVE_IDENTITY and size == img.size:
        return img
    return img.transform(size, Image.PERSPECTIVE, coeffs, Image.BILINEAR if op.bilinear else Image.NEAREST,
                         fillcolor=_pil_fill(op.fill))


@CPU_KERNELS.register(Augment)
def _augment(img, op: Augment, row, v2_step):  # torchvision's own policy operation, v1 units
    from torchvision.transforms.autoaugment import _apply_op
    return _apply_op(img, AUGMENT_OPS[int(op.value(row, "operation"))], float(op.value(row, "magnitude")),
                     interpolation=M.BILINEAR if op.bilinear else M.NEAREST, fill=[float(v) for v in op.fill])


@CPU_KERNELS.register(TensorAugment)
def _tensor_augment(img, op: TensorAugment, row, v2_step):  # torchvision's own tensor policy operation
    name = AUGMENT_OPS[int(op.value(row, "operation"))]
    if name == "Identity":
        return img
    return tensor_policy_operation(op.api)(img, name, float(op.value(row, "magnitude")), op.interpolation, op.fill)


class _Mixing(threading.local):
    source: Any = None  # AugMix's source image, its float32 mix (CHW), and whether the image was a PIL one
    mix: Any = None
    pil: bool = False


_mixing = _Mixing()


def _float_chw(img) -> torch.Tensor:
    """A PIL image's or a tensor's values as a float32 CHW tensor (what NumPy's float32 view holds)."""
    if isinstance(img, Image.Image):
        values = np.asarray(img, dtype=np.float32).reshape(img.size[1], img.size[0], -1)
        return torch.from_numpy(values).permute(2, 0, 1)
    return img.to(torch.float32)


@CPU_KERNELS.register(MixStart)
def _mix_start(img, op: MixStart, row, v2_step):  # AugMix's forward, one sample at a time
    _mixing.pil = isinstance(img, Image.Image)
    _mixing.source = F.pil_to_tensor(img) if _mixing.pil and op.tensors else img
    _mixing.mix = torch.tensor(op.value(row, "weight"), dtype=torch.float32) * _float_chw(_mixing.source)
    return _mixing.source


@CPU_KERNELS.register(MixAdd)
def _mix_add(img, op: MixAdd, row, v2_step):
    _mixing.mix.add_(torch.tensor(op.value(row, "weight"), dtype=torch.float32) * _float_chw(img))
    if not op.last:
        return _mixing.source
    out, _mixing.mix = _mixing.mix.to(torch.uint8), None
    return F.to_pil_image(out) if _mixing.pil else out


@CPU_KERNELS.register(MixBlend)
def _mix_blend(img, op: MixBlend, row, v2_step):  # timm's Image.blend(img, mixed, m)
    source, _mixing.source = _mixing.source, None
    return Image.blend(source, img, float(op.value(row, "alpha")))


@CPU_KERNELS.register(Grayscale)
def _grayscale(img, op: Grayscale, row, v2_step):
    return F.rgb_to_grayscale(img, op.channels) if op.slot is None or op.value(row, "apply") else img


@CPU_KERNELS.register(Blur)
def _blur(img, op: Blur, row, v2_step):
    sigma_y, sigma_x = op.value(row, "sigma_y"), op.value(row, "sigma_x")
    return (F2 if v2_step else F).gaussian_blur(img, [op.kernel[1], op.kernel[0]], [sigma_x, sigma_y])


@CPU_KERNELS.register(Erase)
def _erase(img, op: Erase, row, v2_step):
    top, left, h, w = (int(v) for v in row[op.span("top", "width")])
    if not (h and w):
        return img
    chw = F.pil_to_tensor(img) if isinstance(img, Image.Image) else img
    return F.erase(chw, top, left, h, w, torch.tensor(op.value)[:, None, None])


@CPU_KERNELS.register(DrawnErase)
def _drawn_erase(img, op: DrawnErase, row, v2_step):
    """The drawn values, or noise from a generator seeded by the sample's seed (torch_stage/tensor.py)."""
    top, left, h, w = (int(v) for v in row[op.span("top", "width")])
    if not (h and w):
        return img
    channels = img.shape[0]
    if op.per_pixel:
        fill = torch.randn((channels, h, w), generator=torch.Generator().manual_seed(int(op.value(row, "seed"))),
                           dtype=img.dtype)
    else:
        fill = torch.tensor([float(v) for v in row[op.span("c0", "c2")]][:channels], dtype=img.dtype)[:, None, None]
    return F.erase(img, top, left, h, w, fill)


@CPU_KERNELS.register(ToFloat)
def _to_float(img, op: ToFloat, row, v2_step):
    t = F.pil_to_tensor(img) if isinstance(img, Image.Image) else img
    return t.float().div(round(1 / op.scale)) if op.divide else t.float() * op.scale


@CPU_KERNELS.register(ToCHW)
def _to_chw(img, op: ToCHW, row, v2_step):
    return F.pil_to_tensor(img) if isinstance(img, Image.Image) else img


@CPU_KERNELS.register(Normalize)
def _normalize(img, op: Normalize, row, v2_step):
    return F.normalize(img, list(op.mean), list(op.std))


@CPU_KERNELS.register(PillowBlur)
def _pillow_blur(img, op: PillowBlur, row, v2_step):  # what the user's class asked of Pillow
    radius = (float(op.value(row, "x_radius")), float(op.value(row, "y_radius")))
    if radius == (0.0, 0.0):
        return img
    return img.filter(ImageFilter.GaussianBlur(radius) if op.gaussian else ImageFilter.BoxBlur(radius))


_PILLOW_CALLS = {  # what the user's code called, called again with the same arguments
    "gaussian_blur": lambda img, a, b, c: img.filter(ImageFilter.GaussianBlur((a, b))),
    "box_blur": lambda img, a, b, c: img.filter(ImageFilter.BoxBlur((a, b))),
    "kernel": lambda img, a, b, c: img.filter(getattr(ImageFilter, BUILTIN_KERNELS[int(a)])),
    "hflip": lambda img, a, b, c: img.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
    "vflip": lambda img, a, b, c: img.transpose(Image.Transpose.FLIP_TOP_BOTTOM),
    "transpose": lambda img, a, b, c: img.transpose(Image.Transpose.TRANSPOSE),
    "grayscale": lambda img, a, b, c: img.convert("L").convert(img.mode),  # the luma in every channel
    "invert": lambda img, a, b, c: ImageOps.invert(img),
    "solarize": lambda img, a, b, c: ImageOps.solarize(img, a),
    "posterize": lambda img, a, b, c: img.point([i & int(a) for i in range(256)] * len(img.getbands())),
    "solarize_add": lambda img, a, b, c: img.point([min(255, i + int(a)) if i < b else i for i in range(256)]
                                                   * len(img.getbands())),
    "equalize": lambda img, a, b, c: ImageOps.equalize(img),
    "autocontrast": lambda img, a, b, c: ImageOps.autocontrast(img),
    "brightness": lambda img, a, b, c: ImageEnhance.Brightness(img).enhance(a),
    "contrast": lambda img, a, b, c: ImageEnhance.Contrast(img).enhance(a),
    "color": lambda img, a, b, c: ImageEnhance.Color(img).enhance(a),
    "sharpness": lambda img, a, b, c: ImageEnhance.Sharpness(img).enhance(a),
    "hue": lambda img, a, b, c: F.adjust_hue(img, _hue_factor(int(a))),
    "unsharp_mask": lambda img, a, b, c: img.filter(ImageFilter.UnsharpMask(a, int(b), int(c))),
    "tv_blur": lambda img, a, b, c: _torchvision_blur(img, int(a), b, c),
    "permute": lambda img, a, b, c: Image.merge(img.mode, [img.getchannel(int(k)) for k in (a, b, c)]),
    **{name: lambda img, a, b, c, name=name: _tensor_color(img, name, a, b) for name in TENSOR_COLOR_CALLS},
}


def _tensor_color(img, name: str, factor: float, v2: float):
    """torchvision's own tensor kernel (v1's or v2's adjust_*) on the image as a uint8 tensor:
    the image's values are that tensor's, both ways."""
    functional = F2 if v2 else F
    out = getattr(functional, "adjust_" + name[3:])(F.pil_to_tensor(img), factor)
    return F.to_pil_image(out, img.mode)


def _torchvision_blur(img, window: int, sigma_x: float, sigma_y: float):
    v2, kx, ky = blur_window_of(window)
    return (F2 if v2 else F).gaussian_blur(img, [kx, ky], [sigma_x, sigma_y])


def _hue_factor(shift: int) -> float:
    """A hue factor whose 8-bit shift, as torchvision computes it (int(factor * 255)), is ``shift``."""
    k = shift - 256 if shift > 127 else shift
    return (k + (0.5 if k >= 0 else -0.5)) / 255


class _Kept(threading.local):
    image: Any = None  # what a replayed "keep" kept for the "blend_kept" after it (one sample at a time)


_kept = _Kept()


@CPU_KERNELS.register(PillowCall, RaggedPillowCall)
def _pillow_call(img, op: PillowCall, row, v2_step):  # what a recorded transform asked of Pillow
    call = PILLOW_CALLS[int(op.value(row, "call"))]
    if call == "none":
        return img
    a, b, c = (float(op.value(row, name)) for name in ("a", "b", "c"))
    if call == "keep":
        _kept.image = img
        return img
    if call == "blend_kept":
        kept, _kept.image = _kept.image, None
        return Image.blend(kept, img, a) if b == 0 else Image.blend(img, kept, a)
    return _PILLOW_CALLS[call](img, a, b, c)
