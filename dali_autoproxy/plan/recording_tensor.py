"""A recording image made a tensor inside a user's class: ``TF.to_tensor(img)``, then
``TF.normalize(t, mean, std)``, recorded as the torchvision transforms they equal.

A class that ends ``return TF.normalize(TF.to_tensor(img), MEAN, STD)`` (or ``pil_to_tensor``,
``convert_image_dtype``, and v2's ``to_image``, ``pil_to_tensor``, ``to_dtype``, ``normalize``)
gets a :class:`RecordingTensor` from these hooks: a tensor on torch's ``meta`` device (its
shape and dtype, no memory) whose ``calls`` end in ``("tensor", ...)`` entries naming the
equivalent transform (``equivalent``), which planning translates like the transform itself.
Anything else done to it (arithmetic, indexing, another function) needs its values: it raises
``NeedsPixels`` and the class runs in the worker, as for a recording image. Only these module
functions, called as attributes of their modules, are recorded (``TENSOR_HOOKS``).
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F1
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as F2
from torchvision import tv_tensors

from dali_autoproxy.plan.recording import NeedsPixels, RecordingImage, _needs_pixels, _user_frame, recording
from dali_autoproxy.plan.tv_internals import v2_pil_kernels

_METADATA = {torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.ndim.__get__,
             torch.Tensor.device.__get__, torch.Tensor.size, torch.Tensor.dim, torch.Tensor.is_floating_point,
             torch.Tensor.__len__, torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__hash__}


class RecordingTensor(torch.Tensor):
    """The tensor a recorded class made of its recording image: shape and dtype, no values."""
    calls: Tuple[Any, ...] = ()
    stands_in_for = torch.Tensor  # what torchvision's exact-type lookups (v2's fills) see

    @staticmethod
    def of(shape: Tuple[int, ...], dtype: torch.dtype, calls: Tuple[Any, ...],
           stands_in_for: type = torch.Tensor) -> "RecordingTensor":
        t = torch.empty(shape, dtype=dtype, device="meta").as_subclass(RecordingTensor)
        t.calls = calls
        t.stands_in_for = stands_in_for  # v2's to_image makes a tv_tensors.Image
        return t

    def then(self, *spec: Any, dtype: Any = None) -> "RecordingTensor":
        return RecordingTensor.of(tuple(self.shape), dtype or self.dtype, self.calls + (("tensor",) + spec,),
                                  self.stands_in_for)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        if not recording.active:
            raise RuntimeError("dali_autoproxy: a tensor recorded for a transform was used after the transform "
                               "returned; enable(record='off') leaves such transforms in the worker")
        if func is torch.Tensor.__getitem__ and len(args) == 2 and not kwargs:
            shuffled = _channels_indexed(args[0], args[1])
            if shuffled is not None:
                return shuffled
        raise NeedsPixels(f"tensor {getattr(func, '__name__', func)}", _user_frame())

    def tail_at(self) -> int:
        """Where the tensor steps begin in ``calls`` (the image's own calls before them)."""
        return next((i for i, call in enumerate(self.calls) if call[0] == "tensor"), len(self.calls))


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
    calls = t.calls[:head] + (("permute",) + tuple(float(k) for k in order),) + t.calls[head:]
    return RecordingTensor.of(tuple(t.shape), t.dtype, calls, t.stands_in_for)


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


def _tensor_crop(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """v2's ``crop`` of a tensor image (RandomIoUCrop, RandomCrop on the tensor backends): outside
    the image zeros, as Pillow's crop. On a recorded tensor whose steps so far map each pixel on
    its own and keep 0 at 0 (the conversions to a tensor and to float), the crop is the same
    before them: recorded as the image's crop, the tensor steps after it."""
    t = _first(args, kwargs, "image")
    if type(t) is not RecordingTensor:
        return wrapped(*args, **kwargs)
    named = dict(zip(("top", "left", "height", "width"), args[1:]),
                 **{k: v for k, v in kwargs.items() if k not in ("image", "inpt")})
    box = [named.get(k) for k in ("top", "left", "height", "width")]
    if set(named) != {"top", "left", "height", "width"} or not all(type(v) is int for v in box):
        raise NeedsPixels("tensor crop", _user_frame())
    top, left, height, width = box
    tail_at = t.tail_at()
    tail = t.calls[tail_at:]
    if height <= 0 or width <= 0 or t.ndim != 3 or any(step[1] not in _ZERO_KEEPING for step in tail):
        raise NeedsPixels("tensor crop", _user_frame())
    calls = t.calls[:tail_at] + (("crop", top, left, height, width),) + tail
    return RecordingTensor.of((t.shape[0], height, width), t.dtype, calls, t.stands_in_for)


def _tensor_flip(name: str):
    """v2's ``horizontal_flip`` / ``vertical_flip`` of a tensor image: a flip commutes with the
    tensor steps (each maps a pixel on its own), so it is recorded as the image's flip before them."""
    def hook(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        t = _first(args, kwargs, "image")
        if type(t) is not RecordingTensor:
            return wrapped(*args, **kwargs)
        if len(args) != 1 or set(kwargs) - {"image"} or t.ndim != 3:
            raise NeedsPixels(f"tensor {name}", _user_frame())
        tail_at = t.tail_at()
        calls = t.calls[:tail_at] + ((name, 0.0, 0.0, 0.0),) + t.calls[tail_at:]
        return RecordingTensor.of(tuple(t.shape), t.dtype, calls, t.stands_in_for)
    return hook


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
                (v2.ToDtype, "transform" if "transform" in vars(v2.ToDtype) else "_transform", _to_dtype_per_type)]
for _functional, _hook in ((F2.to_dtype, _to_float("to_dtype")), (F2.normalize, _normalize("v2")),
                           (F2.crop, _tensor_crop), (F2.horizontal_flip, _tensor_flip("hflip")),
                           (F2.vertical_flip, _tensor_flip("vflip"))):
    _table = v2_pil_kernels(_functional)  # a v2 transform (ToDtype, Normalize) calls the tensor kernel it dispatches to
    if _table is not None and torch.Tensor in _table:
        TENSOR_HOOKS.append((_table, torch.Tensor, _hook))
