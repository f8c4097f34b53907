"""The hooks that record Pillow's and torchvision's functions called on a recording image
(``plan/record/image.py``): functions that measure the pixels before they act (ImageOps.equalize /
autocontrast, ImageEnhance's enhancers), torchvision's PIL functions that go through NumPy or
tensors (3-channel grayscale, hue, gaussian_blur), and ``Image.blend`` of an image and a branch
made from it. Each passes through untouched for any other image. Installed in a proxied loader's
workers through the patch ledger (worker/install.py)."""
from __future__ import annotations

import numbers
import sys
from typing import Any, Optional, Tuple

import numpy as np
import torchvision.transforms._functional_pil as F_pil
import torchvision.transforms.functional as F1
import torchvision.transforms.v2.functional as F2
from PIL import Image, ImageEnhance, ImageOps

from dali_autoproxy.plan.pillow_ops import blur_window
from dali_autoproxy.plan.record.image import GEOMETRY_CALLS, RecordingImage, _needs_pixels
from dali_autoproxy.plan.tv_internals import v2_pil_kernels


def _is_recording(img: Any) -> bool:
    return type(img) is RecordingImage


def _equalize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if args and _is_recording(args[0]) and len(args) == 1 and kwargs.get("mask") is None:
        return args[0].then("equalize")
    return wrapped(*args, **kwargs)


_AUTOCONTRAST_DEFAULTS = {"cutoff": 0, "ignore": None, "mask": None, "preserve_tone": False}


def _autocontrast(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if (args and _is_recording(args[0]) and len(args) == 1
            and all(_AUTOCONTRAST_DEFAULTS.get(k, object()) == v for k, v in kwargs.items())):
        return args[0].then("autocontrast")
    return wrapped(*args, **kwargs)


_ENHANCERS = {ImageEnhance.Brightness: "brightness", ImageEnhance.Contrast: "contrast",
              ImageEnhance.Color: "color", ImageEnhance.Sharpness: "sharpness"}


def _enhancer_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Pillow's enhancers measure the image as they are made (Contrast its mean): on a recording
    image, only remember it; ``enhance`` records the call."""
    image = args[0] if args else kwargs.get("image")
    if _is_recording(image) and type(instance) in _ENHANCERS:
        instance.image = image
        return None
    return wrapped(*args, **kwargs)


def _enhance(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    image = getattr(instance, "image", None)
    if _is_recording(image) and type(instance) in _ENHANCERS and len(args) + len(kwargs) == 1:
        factor = args[0] if args else kwargs["factor"]
        return image.then(_ENHANCERS[type(instance)], float(factor))
    return wrapped(*args, **kwargs)


def _to_grayscale(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """torchvision's PIL grayscale with 3 output channels (luma through NumPy, stacked)."""
    image = args[0] if args else kwargs.get("img")
    channels = args[1] if len(args) > 1 else kwargs.get("num_output_channels")
    if _is_recording(image) and image.mode == "RGB" and channels == 3:
        return image.then("grayscale")
    return wrapped(*args, **kwargs)


def _adjust_hue(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """torchvision's PIL adjust_hue (Pillow's HSV, the hue shifted in NumPy's uint8)."""
    image = args[0] if args else kwargs.get("img")
    factor = args[1] if len(args) > 1 else kwargs.get("hue_factor")
    if _is_recording(image) and isinstance(factor, (int, float)) and -0.5 <= factor <= 0.5:
        if image.mode != "RGB":
            return image  # as torchvision returns an "L" image
        return image.then("hue", int(np.int32(factor * 255).astype(np.uint8)))
    return wrapped(*args, **kwargs)


def _blur_arguments(kernel_size: Any, sigma: Any) -> Optional[Tuple[int, int, float, float]]:
    """torchvision's gaussian_blur arguments as it completes them (v1 and v2 alike): window x, y
    and sigma x, y; None where it would raise (its error comes from the plain run)."""
    try:
        kx, ky = (kernel_size, kernel_size) if type(kernel_size) is int else kernel_size
        if sigma is None:
            sigma = [kx * 0.15 + 0.35, ky * 0.15 + 0.35]
        elif isinstance(sigma, (int, float)):
            sigma = [float(sigma), float(sigma)]
        elif isinstance(sigma, (list, tuple)) and len(sigma) == 1:
            sigma = [sigma[0], sigma[0]]
        sx, sy = sigma
    except (TypeError, ValueError):
        return None
    if not (all(type(k) is int and k > 0 and k % 2 == 1 and k < 4096 for k in (kx, ky))
            and all(isinstance(s, (int, float)) and s > 0 for s in (sx, sy))):
        return None
    return kx, ky, float(sx), float(sy)


def _gaussian_blur(v2: bool):
    """torchvision's gaussian_blur of a PIL image: pil_to_tensor, its float32 kernel, reflect
    padding, to_pil_image of the rounded result (``tv_blur``)."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        named = dict(zip(("img" if not v2 else "image", "kernel_size", "sigma"), args), **kwargs)
        image = named.get("img", named.get("image"))
        if not _is_recording(image):
            return wrapped(*args, **kwargs)
        found = _blur_arguments(named.get("kernel_size"), named.get("sigma"))
        if found is None or len(named) > 3 or found[0] // 2 >= image.width or found[1] // 2 >= image.height:
            raise _needs_pixels()
        kx, ky, sx, sy = found
        return image.then("tv_blur", blur_window(v2, kx, ky), sx, sy)
    return hook


def _blend(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``Image.blend(im1, im2, alpha)`` of two recording images one of which was made from the
    other by size-keeping calls (``Image.blend(img, img.filter(...), a)``): the common image kept
    ("keep"), the other branch's calls, then the blend of the two ("blend_kept")."""
    named = dict(zip(("im1", "im2", "alpha"), args), **kwargs)
    im1, im2, alpha = named.get("im1"), named.get("im2"), named.get("alpha")
    if not (_is_recording(im1) and _is_recording(im2)) or len(named) != 3:
        return wrapped(*args, **kwargs)
    base, other, order = (im1, im2, 0) if im2.calls[:len(im1.calls)] == im1.calls else (im2, im1, 1)
    branch = other.calls[len(base.calls):]
    if (other.calls[:len(base.calls)] != base.calls or im1.size != im2.size or im1.mode != im2.mode
            or not isinstance(alpha, numbers.Real)
            or any(call[0] in GEOMETRY_CALLS + ("tensor", "keep", "blend_kept") for call in branch)):
        raise _needs_pixels()
    out = base.then("keep")
    for call in branch:
        out = out.then(*call)
    return out.then("blend_kept", float(np.float32(alpha)), order)


def _expand(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``ImageOps.expand`` of a recording image with an RGB colour (torchvision's constant pad
    passes one): recorded as a pad (``RecordingImage.padded``)."""
    named = dict(zip(("image", "border", "fill"), args), **kwargs)
    image = named.get("image")
    if not _is_recording(image):
        return wrapped(*args, **kwargs)
    fill = named.get("fill", 0)
    try:
        left, top, right, bottom = (int(v) for v in ImageOps._border(named.get("border", 0)))
    except (AttributeError, TypeError, ValueError):
        raise _needs_pixels() from None
    if (image.mode != "RGB" or len(named) > 3 or not isinstance(fill, tuple) or len(fill) != 3
            or not all(type(v) is int and 0 <= v <= 255 for v in fill)):
        raise _needs_pixels()
    return image.padded(left, top, right, bottom, fill)


def _permute_channels(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's permute_channels of a PIL image (RandomPhotometricDistort's channel shuffle), which goes
    through a tensor: a call with the order as its values."""
    named = dict(zip(("image", "permutation"), args), **kwargs)
    image = named.get("image")
    if not _is_recording(image):
        return wrapped(*args, **kwargs)
    order = named.get("permutation")
    try:
        order = [int(k) for k in order]
    except (TypeError, ValueError):
        raise _needs_pixels() from None
    if image.mode != "RGB" or sorted(order) != [0, 1, 2] or len(named) != 2:
        raise _needs_pixels()
    return image.then("permute", *order)


def _fill_for(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's ``_get_fill(fill_dict, type(inpt))`` looks the input's exact type up: a stand-in (a
    recording image, a deferred JPEG) gets the fill of the type it stands in for."""
    if len(args) == 2 and not kwargs:
        return wrapped(args[0], getattr(args[1], "stands_in_for", args[1]))
    return wrapped(*args, **kwargs)


# (owner, attribute, wrapt wrapper): installed in a proxied loader's workers (worker/install.py)
PILLOW_HOOKS = [(Image, "blend", _blend), (ImageOps, "equalize", _equalize), (ImageOps, "autocontrast", _autocontrast),
                (ImageEnhance._Enhance, "enhance", _enhance),
                (F_pil, "to_grayscale", _to_grayscale), (F_pil, "adjust_hue", _adjust_hue),
                (F1, "gaussian_blur", _gaussian_blur(False)), (ImageOps, "expand", _expand)] + [
    (cls, "__init__", _enhancer_init) for cls in _ENHANCERS]
for _module in ("_geometry", "_auto_augment"):  # the v2 modules that resolve a fill per input type
    _owner = sys.modules.get(f"torchvision.transforms.v2.{_module}")
    if _owner is not None and hasattr(_owner, "_get_fill"):
        PILLOW_HOOKS.append((_owner, "_get_fill", _fill_for))
for _functional, _hook in ((F2.adjust_hue, _adjust_hue), (F2.gaussian_blur, _gaussian_blur(True)),
                          (F2.permute_channels, _permute_channels)):
    _table = v2_pil_kernels(_functional)  # v2 dispatches PIL images to its registered kernel, not an attribute
    if _table is not None and Image.Image in _table:
        PILLOW_HOOKS.append((_table, Image.Image, _hook))
