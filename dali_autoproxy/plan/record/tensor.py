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
the worker, as for a recording image. Only the module functions that
``plan/record/tensor_hooks.py`` wraps, called as attributes of their modules, are recorded.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.plan.record.image import NeedsPixels, _user_frame, recording

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
    if t.pad_border is None or fill is None or not layout_only(t) or t.calls[t.tail_at() - 1][0] != "pad":
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


def before_tail(t: "RecordingTensor", call: Tuple[Any, ...], shape: Any = None) -> "RecordingTensor":
    """``t`` with ``call`` recorded as the image's, after its calls so far and before the tensor
    steps (which the caller has checked it commutes with); ``shape``: the tensor's new shape."""
    settled(t)
    head = t.tail_at()
    return RecordingTensor.of(tuple(shape or t.shape), t.dtype, t.calls[:head] + (call,) + t.calls[head:],
                              t.stands_in_for)


def layout_only(t: "RecordingTensor") -> bool:
    """The tensor steps so far only lay the image's uint8 values out as a CHW tensor of three
    channels (pil_to_tensor, to_image): a uint8 kernel on the tensor is that kernel on the image."""
    return (t.dtype == torch.uint8 and t.ndim == 3 and t.shape[0] == 3
            and all(step[1] in _LAYOUT for step in t.calls[t.tail_at():]))


def channel_order(index: Any) -> Any:
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
    order = channel_order(index[0])
    head = t.tail_at()
    if order is None or sorted(order) != [0, 1, 2] or any(step[1] not in ZERO_KEEPING for step in t.calls[head:]):
        return None
    return before_tail(t, ("permute",) + tuple(float(k) for k in order))


def equivalent(spec: Tuple[Any, ...]) -> Any:
    """The torchvision transform a recorded ``("tensor", ...)`` call equals."""
    name = spec[0]
    if name == "normalize":
        return (T.Normalize if spec[3] == "v1" else v2.Normalize)(list(spec[1]), list(spec[2]))
    if name == "to_dtype":
        return v2.ToDtype(torch.float32, scale=spec[1])
    return {"to_tensor": T.ToTensor, "pil_to_tensor": T.PILToTensor, "to_image": v2.ToImage,
            "convert_image_dtype": lambda: T.ConvertImageDtype(torch.float32)}[name]()


ZERO_KEEPING = frozenset(("to_tensor", "pil_to_tensor", "to_image", "convert_image_dtype", "to_dtype"))  # 0 -> 0
_LAYOUT = frozenset(("pil_to_tensor", "to_image"))  # the uint8 values as they are
