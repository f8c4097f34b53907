"""The hooks that record torchvision's functions called on a recording image made a tensor
(``plan/record/tensor.py``): the conversions that make the tensor (to_tensor, pil_to_tensor,
v2's to_image) and the steps after them (normalize, the conversions to float, to_pil_image back),
and the kernels on an image tensor that are recorded as the image's own calls (crops, flips,
torchvision's tensor colour kernels, permute_channels, constant pads, the bilinear resize). Each
passes through untouched for any other input. Installed in a proxied loader's workers through
the patch ledger (worker/install.py), with PILLOW_HOOKS.
"""
from __future__ import annotations

import numbers
from typing import Any

import torch
import torchvision.transforms.functional as F1
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as F2
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode

from dali_autoproxy.plan.record.image import NeedsPixels, RecordingImage, _needs_pixels, _user_frame
from dali_autoproxy.plan.record.tensor import (
    ZERO_KEEPING,
    RecordingTensor,
    before_tail,
    channel_order,
    layout_only,
    settled,
)
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.tv_internals import v2_pil_kernels


def _first(args: tuple, kwargs: dict, name: str) -> Any:
    return args[0] if args else kwargs.get(name, kwargs.get("image"))  # a v2 kernel names it ``image``


def _made_tensor(name: str, dtype: torch.dtype, stands_in_for: type = torch.Tensor):
    """A hook of a function that makes a CHW tensor of a PIL image (to_tensor, pil_to_tensor, to_image)."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        img = args[0] if args else None
        if type(img) is not RecordingImage or len(args) != 1 or kwargs:
            return wrapped(*args, **kwargs)
        if img.mode != "RGB":
            raise _needs_pixels()
        width, height = img.size
        return RecordingTensor.of((3, height, width), dtype, img.calls + (("tensor", name),), stands_in_for)
    return hook


def _normalize(api: str):
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = _first(args, kwargs, "tensor" if api == "v1" else "inpt")
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        named = dict(zip(("mean", "std", "inplace"), args[1:]), **{k: v for k, v in kwargs.items()
                                                                  if k not in ("tensor", "inpt")})
        mean, std = named.get("mean"), named.get("std")
        if t.dtype != torch.float32 or mean is None or std is None or set(named) - {"mean", "std", "inplace"}:
            raise NeedsPixels("tensor normalize", _user_frame())  # torchvision's own error, in the worker
        as_floats = [tuple(float(v) for v in torch.as_tensor(x, dtype=torch.float64).flatten()) for x in (mean, std)]
        return t.then("normalize", as_floats[0], as_floats[1], api)
    return hook


def _to_float(name: str):
    """v1's convert_image_dtype(t, float32) and v2's to_dtype(t, float32, scale) of a uint8 tensor."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = _first(args, kwargs, "image" if name == "convert_image_dtype" else "inpt")
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        dtype = args[1] if len(args) > 1 else kwargs.get("dtype", torch.float)
        scale = args[2] if len(args) > 2 else kwargs.get("scale", False)
        if dtype != torch.float32 or t.dtype != torch.uint8 or (name == "convert_image_dtype" and len(args) > 2):
            raise NeedsPixels(f"tensor {name}", _user_frame())
        return t.then(*((name,) if name == "convert_image_dtype" else (name, bool(scale))), dtype=torch.float32)
    return hook


def _tensor_crop(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's ``crop`` (v1's) of a tensor image (RandomIoUCrop, RandomCrop on the tensor backends): outside
    the image zeros, as Pillow's crop. On a recorded tensor whose steps so far map each pixel on
    its own and keep 0 at 0 (the conversions to a tensor and to float), the crop is the same
    before them: recorded as the image's crop, the tensor steps after it."""
    t = args[0] if args else kwargs.get("image", kwargs.get("img"))
    if type(t) is not RecordingTensor:
        return wrapped(*args, **kwargs)
    named = dict(zip(("top", "left", "height", "width"), args[1:]),
                 **{k: v for k, v in kwargs.items() if k not in ("image", "img")})
    box = [named.get(k) for k in ("top", "left", "height", "width")]
    if set(named) != {"top", "left", "height", "width"} or not all(type(v) is int for v in box):
        raise NeedsPixels("tensor crop", _user_frame())
    top, left, height, width = box
    if height <= 0 or width <= 0 or t.ndim != 3 or any(step[1] not in ZERO_KEEPING for step in t.calls[t.tail_at():]):
        raise NeedsPixels("tensor crop", _user_frame())
    return before_tail(t, ("crop", top, left, height, width), (t.shape[0], height, width))


def _tensor_flip(name: str):
    """v2's ``horizontal_flip`` / ``vertical_flip`` (v1's ``hflip`` / ``vflip``) of a tensor image:
    a flip commutes with the tensor steps (each maps a pixel on its own), so it is recorded as the
    image's flip before them."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0] if args else kwargs.get("image", kwargs.get("img"))
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        if len(args) + len(kwargs) != 1 or t.ndim != 3:
            raise NeedsPixels(f"tensor {name}", _user_frame())
        return before_tail(t, (name, 0.0, 0.0, 0.0))
    return hook


def _tensor_color(name: str, api: str):
    """torchvision's tensor ``adjust_brightness`` / ``contrast`` / ``saturation`` / ``hue`` (v1's
    functional, v2's tensor kernel: RandomPhotometricDistort and ColorJitter on the tensor
    backends) of a tensor that is the image's uint8 values: recorded as the image's call
    ``tv_<name>``, which runs torchvision's tensor arithmetic on them, in chain order."""
    factor_name = f"{name}_factor"

    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0] if args else kwargs.get("image", kwargs.get("img"))
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        named = dict(zip(("image", factor_name), args), **{k: v for k, v in kwargs.items() if k != "img"})
        factor = named.get(factor_name)
        valid = (isinstance(factor, numbers.Real) and not isinstance(factor, bool)
                 and set(named) == {"image", factor_name}
                 and (-0.5 <= factor <= 0.5 if name == "hue" else factor >= 0))
        if not valid or not layout_only(t):  # torchvision's own error, or float values: in the worker
            raise NeedsPixels(f"tensor adjust_{name}", _user_frame())
        return before_tail(t, (f"tv_{name}", float(factor), 1.0 if api == "v2" else 0.0, 0.0))
    return hook


def _tensor_permute_channels(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's ``permute_channels`` of a tensor image: the image's channel permutation, before tensor
    steps that treat every channel alike."""
    t = args[0] if args else kwargs.get("image")
    if type(t) is not RecordingTensor:
        return wrapped(*args, **kwargs)
    named = dict(zip(("image", "permutation"), args), **kwargs)
    order = channel_order(named.get("permutation"))
    if (set(named) != {"image", "permutation"} or order is None or sorted(order) != [0, 1, 2] or t.ndim != 3
            or any(step[1] not in ZERO_KEEPING for step in t.calls[t.tail_at():])):
        raise NeedsPixels("tensor permute_channels", _user_frame())
    return before_tail(t, ("permute",) + tuple(float(k) for k in order))


def _tensor_resize(api: str):
    """The resize of a tensor that is the image's uint8 values (v2's tensor kernel:
    RandomShortestSize, ScaleJitter, RandomResize; v1's ``resize``), at the size torchvision
    computes. With ``resize="pillow"``, and for any filter but bilinear antialiased, recorded as
    torchvision's own resize of the image (``tensor_resize``: ir.TensorResize, the same values on
    the CPU); else as the image's resize with Pillow's bilinear filter: torch's uint8 arithmetic
    is not Pillow's fixed point, the two differ by at most a level here and there
    (``tests/test_joint.py``'s TENSOR_RESIZE_LEVELS; docs/how-it-works.md)."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0] if args else kwargs.get("image", kwargs.get("img"))
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        named = dict(zip(("image", "size", "interpolation", "max_size", "antialias"), args),
                     **{k: v for k, v in kwargs.items() if k != "img"})
        try:
            mode = _mode(named.get("interpolation", InterpolationMode.BILINEAR))
        except (TypeError, ValueError):
            mode = None
        antialias = named.get("antialias", True)
        if (mode not in _TENSOR_RESIZES or antialias not in (True, False, None)
                or set(named) - {"image", "size", "interpolation", "max_size", "antialias"} or not layout_only(t)):
            raise NeedsPixels("tensor resize", _user_frame())
        height, width = int(t.shape[1]), int(t.shape[2])
        size, max_size = named.get("size"), named.get("max_size")
        try:
            size = [size] if isinstance(size, int) else list(size)
            if api == "v1" and max_size is not None and len(size) != 1:
                raise ValueError("v1's resize refuses max_size with two sizes")
            new_h, new_w = (int(v) for v in _resized_size(api)((height, width), size, max_size))
        except (TypeError, ValueError):
            raise NeedsPixels("tensor resize", _user_frame()) from None  # torchvision's own error, in the worker
        if (new_h, new_w) == (height, width):
            return t
        if new_h <= 0 or new_w <= 0:
            raise NeedsPixels("tensor resize", _user_frame())
        if SETTINGS["resize"] == "pillow" or mode is not InterpolationMode.BILINEAR or antialias is not True:
            call = ("tensor_resize", new_h, new_w, mode.value, antialias, api)
        else:
            call = ("resize", new_h, new_w, int(Image.Resampling.BILINEAR), 0.0, 0.0, float(height), float(width))
        return before_tail(t, call, (3, new_h, new_w))
    return hook


_TENSOR_RESIZES = (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC, InterpolationMode.NEAREST,
                   InterpolationMode.NEAREST_EXACT)


def _mode(interpolation: Any) -> InterpolationMode:
    """torchvision's InterpolationMode for what a resize was passed (a mode, its value, a PIL filter)."""
    if isinstance(interpolation, InterpolationMode):
        return interpolation
    if type(interpolation) is int:
        return F1._interpolation_modes_from_int(interpolation)
    return InterpolationMode(interpolation)


def _resized_size(api: str) -> Any:
    """torchvision's own output-size rule of its resize (v1's or v2's)."""
    if api == "v1":
        return F1._compute_resized_output_size
    from torchvision.transforms.v2.functional import _geometry
    return _geometry._compute_resized_output_size


def _tensor_pad(api: str):
    """A constant pad of a tensor that is the image's uint8 values (v2's tensor kernel:
    RandomZoomOut, Pad; v1's ``pad``) with a fill torchvision turns into the same uint8 values
    every time: recorded as the image's pad with that fill."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0] if args else kwargs.get("image", kwargs.get("img"))
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        named = dict(zip(("image", "padding", "fill", "padding_mode"), args),
                     **{k: v for k, v in kwargs.items() if k != "img"})
        borders, fill = _pad_borders(named.get("padding")), _uint8_fill(named.get("fill"), api)
        if (borders is None or fill is None or named.get("padding_mode", "constant") != "constant"
                or set(named) - {"image", "padding", "fill", "padding_mode"} or not layout_only(t)):
            raise NeedsPixels("tensor pad", _user_frame())
        left, top, right, bottom = borders
        if borders == (0, 0, 0, 0):
            return t
        height, width = int(t.shape[1]) + top + bottom, int(t.shape[2]) + left + right
        out = before_tail(t, ("pad", fill, -top, -left, height, width), (3, height, width))
        out.pad_border = (top, left, int(t.shape[1]), int(t.shape[2]))
        return out
    return hook


def _pad_borders(padding: Any) -> Any:
    """(left, top, right, bottom) of torchvision's padding argument (an int, or 1, 2 or 4 of
    them), all at least 0; else None (a negative border crops: in the worker)."""
    if type(padding) is int:
        padding = [padding]
    if not isinstance(padding, (list, tuple)) or not all(type(v) is int and v >= 0 for v in padding):
        return None
    if len(padding) == 1:
        return (padding[0],) * 4
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return tuple(padding) if len(padding) == 4 else None


def _uint8_fill(fill: Any, api: str) -> Any:
    """The three uint8 values torchvision pads a uint8 tensor with, as floats: a scalar fill
    (v1's only kind) given to torch's pad, a list of three made a tensor and cast (v2's); None
    where the cast would not be well defined (outside 0..255, a fraction given to torch's pad)."""
    if fill is None and api == "v2":
        fill = 0
    if api == "v2" and isinstance(fill, (list, tuple)) and len(fill) == 1:
        fill = fill[0]
    if isinstance(fill, numbers.Real) and not isinstance(fill, bool):
        return (float(fill),) * 3 if float(fill).is_integer() and 0 <= fill <= 255 else None
    if api == "v2" and isinstance(fill, (list, tuple)) and len(fill) == 3 and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 <= v < 256 for v in fill):
        return tuple(float(v) for v in torch.tensor(fill).to(torch.uint8).tolist())
    return None


_BACK_TO_THE_SAME_IMAGE = {("pil_to_tensor",), ("to_tensor",), ("pil_to_tensor", "convert_image_dtype")}


def _to_pil_image(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v1's ``to_pil_image`` of a recorded tensor made of the image by ``pil_to_tensor`` (and
    ``convert_image_dtype`` to float) or ``to_tensor``: every one of the 256 values comes back as
    it was (``round(v / 255 * 255)`` truncated is ``v`` in float32), so the image is the
    recording image of the calls before the tensor steps."""
    pic = args[0] if args else kwargs.get("pic")
    if type(pic) is not RecordingTensor:
        return wrapped(*args, **kwargs)
    mode = args[1] if len(args) > 1 else kwargs.get("mode")
    settled(pic)
    head = pic.tail_at()
    steps = tuple(step[1] for step in pic.calls[head:])
    if (len(args) > 2 or set(kwargs) - {"pic", "mode"} or mode not in (None, "RGB") or pic.ndim != 3
            or pic.shape[0] != 3 or steps not in _BACK_TO_THE_SAME_IMAGE):
        raise NeedsPixels("tensor to_pil_image", _user_frame())
    return RecordingImage((int(pic.shape[2]), int(pic.shape[1])), "RGB", pic.calls[:head])


def _to_dtype_per_type(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's ``ToDtype`` given a dtype per type (the segmentation references' ``{tv_tensors.Image
    or torch.Tensor: float32, Mask: int64, "others": None}``) looks the input's exact type up: a
    recorded tensor gets the dtype of the type it stands in for, as plain's tensor would."""
    inpt = args[0] if args else kwargs.get("inpt")
    dtypes = getattr(instance, "dtype", None)
    if type(inpt) is not RecordingTensor or not isinstance(dtypes, dict) or inpt.stands_in_for not in dtypes:
        return wrapped(*args, **kwargs)  # its "others" entry, or torchvision's own error
    dtype = dtypes[inpt.stands_in_for]
    if dtype is None:
        return inpt
    return instance._call_kernel(F2.to_dtype, inpt, dtype=dtype, scale=instance.scale)


# (owner, attribute, wrapt wrapper): installed in a proxied loader's workers with PILLOW_HOOKS
TENSOR_HOOKS = [(F1, "to_tensor", _made_tensor("to_tensor", torch.float32)),
                (F1, "pil_to_tensor", _made_tensor("pil_to_tensor", torch.uint8)),
                (F2, "to_image", _made_tensor("to_image", torch.uint8, tv_tensors.Image)),
                (F2, "pil_to_tensor", _made_tensor("pil_to_tensor", torch.uint8)),
                (F1, "normalize", _normalize("v1")), (F2, "normalize", _normalize("v2")),
                (F1, "convert_image_dtype", _to_float("convert_image_dtype")), (F2, "to_dtype", _to_float("to_dtype")),
                (F1, "to_pil_image", _to_pil_image),
                (F1, "crop", _tensor_crop), (F1, "hflip", _tensor_flip("hflip")), (F1, "vflip", _tensor_flip("vflip")),
                (F1, "resize", _tensor_resize("v1")), (F1, "pad", _tensor_pad("v1"))] + [
                (F1, f"adjust_{name}", _tensor_color(name, "v1"))
                for name in ("brightness", "contrast", "saturation", "hue")] + [
                (v2.ToDtype, "transform" if "transform" in vars(v2.ToDtype) else "_transform", _to_dtype_per_type)]
for _functional, _hook in ((F2.to_dtype, _to_float("to_dtype")), (F2.normalize, _normalize("v2")),
                           (F2.crop, _tensor_crop), (F2.horizontal_flip, _tensor_flip("hflip")),
                           (F2.vertical_flip, _tensor_flip("vflip")), (F2.resize, _tensor_resize("v2")),
                           (F2.pad, _tensor_pad("v2")), (F2.permute_channels, _tensor_permute_channels),
                           (F2.adjust_brightness, _tensor_color("brightness", "v2")),
                           (F2.adjust_contrast, _tensor_color("contrast", "v2")),
                           (F2.adjust_saturation, _tensor_color("saturation", "v2")),
                           (F2.adjust_hue, _tensor_color("hue", "v2"))):
    _table = v2_pil_kernels(_functional)  # a v2 transform (ToDtype, Normalize) calls the tensor kernel it dispatches to
    if _table is not None and torch.Tensor in _table:
        TENSOR_HOOKS.append((_table, torch.Tensor, _hook))
