"""A recording image made a tensor inside a user's class: ``TF.to_tensor(img)``, then
``TF.normalize(t, mean, std)``, recorded as the torchvision transforms they equal.

A class that ends ``return TF.normalize(TF.to_tensor(img), MEAN, STD)`` (or ``pil_to_tensor``,
``convert_image_dtype``, and v2's ``to_image``, ``pil_to_tensor``, ``to_dtype``, ``normalize``)
gets a :class:`RecordingTensor` from these hooks: a tensor on torch's ``meta`` device (its
shape and dtype, no memory) whose ``calls`` end in ``("tensor", ...)`` entries naming the
equivalent transform (``equivalent``), which planning translates like the transform itself.
Kernels that commute with those steps (crops, flips, a channel permutation) and, while the
tensor holds the image's uint8 values as they are, torchvision's tensor colour kernels, pads and
bilinear resizes are recorded as the image's own calls, before the tensor steps, in chain
order: what the detection presets' tensor backends do. Its ``device`` reads as the CPU, so that a
fill the user's code makes "on the image's device" holds real values; writing such a fill into
the whole border of a pad is that pad's fill. Anything else done to it (arithmetic, other
indexing, another function) needs its values: it raises ``NeedsPixels`` and the class runs in
the worker, as for a recording image. Only these module functions, called as attributes of
their modules, are recorded (``TENSOR_HOOKS``).
"""
from __future__ import annotations

import numbers
from typing import Any, Tuple

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F1
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as F2
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode

from dali_autoproxy.plan.recording import NeedsPixels, RecordingImage, _needs_pixels, _user_frame, recording
from dali_autoproxy.plan.tv_internals import v2_pil_kernels

_METADATA = {torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.ndim.__get__,
             torch.Tensor.size, torch.Tensor.dim, torch.Tensor.is_floating_point,
             torch.Tensor.__len__, torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__hash__}


_DEVICE = torch.Tensor.device.__get__


class RecordingTensor(torch.Tensor):
    """The tensor a recorded class made of its recording image: shape and dtype, no values."""
    calls: Tuple[Any, ...] = ()
    stands_in_for = torch.Tensor  # what torchvision's exact-type lookups (v2's fills) see
    pad_border: Any = None  # made by a pad: (top, left, height, width) of the image inside it
    border_written: Any = None  # the pad's border strips written since (``_write_border``), by name

    @staticmethod
    def of(shape: Tuple[int, ...], dtype: torch.dtype, calls: Tuple[Any, ...],
           stands_in_for: type = torch.Tensor) -> "RecordingTensor":
        t = torch.empty(shape, dtype=dtype, device="meta").as_subclass(RecordingTensor)
        t.calls = calls
        t.stands_in_for = stands_in_for  # v2's to_image makes a tv_tensors.Image
        return t

    def then(self, *spec: Any, dtype: Any = None) -> "RecordingTensor":
        settled(self)
        return RecordingTensor.of(tuple(self.shape), dtype or self.dtype, self.calls + (("tensor",) + spec,),
                                  self.stands_in_for)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        if func == _DEVICE:  # what code makes for it (a fill tensor) holds real values
            return torch.device("cpu")
        if not recording.active:
            raise RuntimeError("dali_autoproxy: a tensor recorded for a transform was used after the transform "
                               "returned; enable(record='off') leaves such transforms in the worker")
        if func is torch.Tensor.__getitem__ and len(args) == 2 and not kwargs:
            shuffled = _channels_indexed(args[0], args[1])
            if shuffled is not None:
                return shuffled
        if func is torch.Tensor.__setitem__ and len(args) == 3 and not kwargs and _write_border(*args):
            return None
        raise NeedsPixels(f"tensor {getattr(func, '__name__', func)}", _user_frame())

    def tail_at(self) -> int:
        """Where the tensor steps begin in ``calls`` (the image's own calls before them)."""
        return next((i for i, call in enumerate(self.calls) if call[0] == "tensor"), len(self.calls))


def settled(t: "RecordingTensor") -> None:
    """NeedsPixels where some of the strips of a pad's border have been written and others not:
    no recorded call is that image."""
    if t.border_written:
        raise NeedsPixels("tensor __setitem__", _user_frame())


_STRIPS = ("top", "bottom", "left", "right")


def _write_border(t: "RecordingTensor", index: Any, value: Any) -> bool:
    """``t[..., rows, cols] = value`` where ``t`` holds the image's uint8 values as a pad made
    them and the region is one whole strip of the pad's border (the detection references' v1
    RandomZoomOut writes its fill into the four strips of a pad with zeros, one assignment each)
    or is empty: True, and once every strip of the border holds the same value, the pad's fill is
    that value. Else False (it needs the pixels)."""
    region = _rows_and_cols(t, index)
    if region is None:
        return False
    (r0, r1), (c0, c1) = region
    if r0 >= r1 or c0 >= c1:
        return True  # nothing written
    fill = _written_fill(value)
    if t.pad_border is None or fill is None or not _layout_only(t) or t.calls[t.tail_at() - 1][0] != "pad":
        return False
    top, left, h, w = t.pad_border
    height, width = int(t.shape[1]), int(t.shape[2])
    strips = {"top": ((0, top), (0, width)), "bottom": ((top + h, height), (0, width)),
              "left": ((0, height), (0, left)), "right": ((0, height), (left + w, width))}
    name = next((k for k, box in strips.items() if box == ((r0, r1), (c0, c1))), None)
    written = dict(t.border_written or {})
    if name is None or any(v != fill for v in written.values()):
        return False
    written[name] = fill
    needed = [k for k, ((a, b), (c, d)) in strips.items() if a < b and c < d]
    if all(k in written for k in needed):  # the whole border: a pad with this fill
        head = t.tail_at()
        pad = t.calls[head - 1]
        t.calls = t.calls[:head - 1] + (("pad", fill) + tuple(pad[2:]),) + t.calls[head:]
        written = None
    t.border_written = written
    return True


def _rows_and_cols(t: "RecordingTensor", index: Any) -> Any:
    """The rows and columns ``(start, stop)`` of ``t[..., rows, cols]`` with plain slices (no step), else None."""
    index = index if isinstance(index, tuple) else (index,)
    if index and index[0] is Ellipsis:
        index = index[1:]
    if t.ndim != 3 or len(index) != 2 or not all(isinstance(k, slice) and k.step is None for k in index):
        return None
    try:
        (r0, r1, _), (c0, c1, _) = index[0].indices(int(t.shape[1])), index[1].indices(int(t.shape[2]))
    except TypeError:
        return None
    return (r0, r1), (c0, c1)


def _written_fill(value: Any) -> Any:
    """The three uint8 values an assignment writes into a uint8 image tensor: a uint8 tensor of
    one or three values shaped to broadcast over the rows and columns, or an int 0..255; else None."""
    if type(value) is int and 0 <= value <= 255:
        return (float(value),) * 3
    if type(value) is not torch.Tensor or value.dtype != torch.uint8 or value.device.type != "cpu":
        return None
    if tuple(value.shape) not in ((3, 1, 1), (1, 1, 1), (1,), ()):
        return None
    values = [float(v) for v in value.flatten().tolist()]
    return tuple(values * 3)[:3] if len(values) == 1 else tuple(values)


def _before_tail(t: "RecordingTensor", call: Tuple[Any, ...], shape: Any = None) -> "RecordingTensor":
    """``t`` with ``call`` recorded as the image's, after its calls so far and before the tensor
    steps (which the caller has checked it commutes with); ``shape``: the tensor's new shape."""
    settled(t)
    head = t.tail_at()
    return RecordingTensor.of(tuple(shape or t.shape), t.dtype, t.calls[:head] + (call,) + t.calls[head:],
                              t.stands_in_for)


def _layout_only(t: "RecordingTensor") -> bool:
    """The tensor steps so far only lay the image's uint8 values out as a CHW tensor of three
    channels (pil_to_tensor, to_image): a uint8 kernel on the tensor is that kernel on the image."""
    return (t.dtype == torch.uint8 and t.ndim == 3 and t.shape[0] == 3
            and all(step[1] in _LAYOUT for step in t.calls[t.tail_at():]))


def _channel_order(index: Any) -> Any:
    """An index of whole numbers as a list (an integer tensor, a list or tuple of ints), else
    None: a float or bool index, a slice, anything torch would read otherwise."""
    if isinstance(index, torch.Tensor):
        if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8) or index.ndim != 1:
            return None
        return [int(k) for k in index.tolist()]
    if isinstance(index, (list, tuple)) and all(type(k) is int for k in index):
        return list(index)
    return None


def _channels_indexed(t: "RecordingTensor", index: Any) -> Any:
    """``t[..., order, :, :]`` with ``order`` a permutation of the three channels (the detection
    references' v1 RandomPhotometricDistort): after tensor steps that map each value on its own,
    alike in every channel, it is the image's channel permutation before them; else None."""
    index = index if isinstance(index, tuple) else (index,)
    if index and index[0] is Ellipsis:
        index = index[1:]
    if t.ndim != 3 or not index or len(index) > 3 or any(
            not (isinstance(k, slice) and k == slice(None)) for k in index[1:]):
        return None
    order = _channel_order(index[0])
    head = t.tail_at()
    if order is None or sorted(order) != [0, 1, 2] or any(step[1] not in _ZERO_KEEPING for step in t.calls[head:]):
        return None
    return _before_tail(t, ("permute",) + tuple(float(k) for k in order))


def equivalent(spec: Tuple[Any, ...]) -> Any:
    """The torchvision transform a recorded ``("tensor", ...)`` call equals."""
    name = spec[0]
    if name == "normalize":
        return (T.Normalize if spec[3] == "v1" else v2.Normalize)(list(spec[1]), list(spec[2]))
    if name == "to_dtype":
        return v2.ToDtype(torch.float32, scale=spec[1])
    return {"to_tensor": T.ToTensor, "pil_to_tensor": T.PILToTensor, "to_image": v2.ToImage,
            "convert_image_dtype": lambda: T.ConvertImageDtype(torch.float32)}[name]()


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


_ZERO_KEEPING = frozenset(("to_tensor", "pil_to_tensor", "to_image", "convert_image_dtype", "to_dtype"))  # 0 -> 0
_LAYOUT = frozenset(("pil_to_tensor", "to_image"))  # the uint8 values as they are


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
    if height <= 0 or width <= 0 or t.ndim != 3 or any(step[1] not in _ZERO_KEEPING for step in t.calls[t.tail_at():]):
        raise NeedsPixels("tensor crop", _user_frame())
    return _before_tail(t, ("crop", top, left, height, width), (t.shape[0], height, width))


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
        return _before_tail(t, (name, 0.0, 0.0, 0.0))
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
        if not valid or not _layout_only(t):  # torchvision's own error, or float values: in the worker
            raise NeedsPixels(f"tensor adjust_{name}", _user_frame())
        return _before_tail(t, (f"tv_{name}", float(factor), 1.0 if api == "v2" else 0.0, 0.0))
    return hook


def _tensor_permute_channels(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's ``permute_channels`` of a tensor image: the image's channel permutation, before tensor
    steps that treat every channel alike."""
    t = args[0] if args else kwargs.get("image")
    if type(t) is not RecordingTensor:
        return wrapped(*args, **kwargs)
    named = dict(zip(("image", "permutation"), args), **kwargs)
    order = _channel_order(named.get("permutation"))
    if (set(named) != {"image", "permutation"} or order is None or sorted(order) != [0, 1, 2] or t.ndim != 3
            or any(step[1] not in _ZERO_KEEPING for step in t.calls[t.tail_at():])):
        raise NeedsPixels("tensor permute_channels", _user_frame())
    return _before_tail(t, ("permute",) + tuple(float(k) for k in order))


def _tensor_resize(api: str):
    """The bilinear, antialiased resize of a tensor that is the image's uint8 values (v2's tensor
    kernel: RandomShortestSize, ScaleJitter, RandomResize; v1's ``resize``), at the size
    torchvision computes: recorded as the image's resize with Pillow's bilinear filter. torch's
    uint8 arithmetic is not Pillow's fixed point: the two differ by at most a level here and
    there (``tests/test_joint.py``'s TENSOR_RESIZE_LEVELS; docs/how-it-works.md)."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0] if args else kwargs.get("image", kwargs.get("img"))
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        named = dict(zip(("image", "size", "interpolation", "max_size", "antialias"), args),
                     **{k: v for k, v in kwargs.items() if k != "img"})
        interpolation = named.get("interpolation", InterpolationMode.BILINEAR)
        bilinear = (interpolation is InterpolationMode.BILINEAR or (api == "v2" and interpolation == "bilinear")
                    or (type(interpolation) is int and interpolation == Image.Resampling.BILINEAR))
        if (not bilinear or named.get("antialias", True) is not True
                or set(named) - {"image", "size", "interpolation", "max_size", "antialias"} or not _layout_only(t)):
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
        top, left, bottom, right = 0.0, 0.0, float(height), float(width)
        return _before_tail(t, ("resize", new_h, new_w, int(Image.Resampling.BILINEAR), top, left, bottom, right),
                            (3, new_h, new_w))
    return hook


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
                or set(named) - {"image", "padding", "fill", "padding_mode"} or not _layout_only(t)):
            raise NeedsPixels("tensor pad", _user_frame())
        left, top, right, bottom = borders
        if borders == (0, 0, 0, 0):
            return t
        height, width = int(t.shape[1]) + top + bottom, int(t.shape[2]) + left + right
        out = _before_tail(t, ("pad", fill, -top, -left, height, width), (3, height, width))
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
