"""Recording images: what a transform without a translation is called with, in a worker.

A self-supervised recipe's few-line class (``img.filter(ImageFilter.GaussianBlur(r))``,
``ImageOps.solarize(img)``, ``ImageEnhance.Contrast(img).enhance(f)``...) has no converter. Its
drawer (``translate/recorded.py``) calls it with a :class:`RecordingImage`: a real
``PIL.Image.Image`` of the sample's size and mode at that point of the chain, without pixels.
The Pillow calls that have a kernel (``pillow_ops.PILLOW_CALLS``) return a new recording image
with the call appended, holding the arguments the user's code passed; the user's own random
draws run as written, on the same generators, so they are plain's. Pillow's module functions
that read pixels to decide (``ImageOps.equalize`` and ``autocontrast``, ``ImageEnhance``) and
torchvision's PIL functions that go through NumPy (3-channel grayscale, hue) are recorded
through the hooks in ``image_hooks.PILLOW_HOOKS``, which the workers install; torchvision's other functional
calls on PIL images (flips, brightness, contrast, saturation, sharpness, solarize, posterize,
invert, autocontrast, equalize) reach the recorded Pillow calls by themselves.

``crop``, ``resize`` (any of Pillow's six filters, with its ``box``) and ``transform`` (AFFINE,
PERSPECTIVE, to any size: ``rotate`` with or without ``expand``, quarter turns of non-square
images) change the recording image's size and are recorded as ops of their own
(``GEOMETRY_CALLS``), so a class written with ``TF.resize`` / ``TF.crop`` / ``TF.resized_crop`` /
``TF.rotate`` / ``TF.affine`` records too.
Anything that needs the pixels (``load()``, ``im``, ``np.asarray``, ``tobytes``, ``getpixel``,
``paste``, ``resize(box=...)``, an unknown method...) raises :class:`NeedsPixels`: the worker
then restores the random generators, plans the chain again with that class in the worker and
runs the sample that way (exactly plain), and the report names the class and the call.
"""
from __future__ import annotations

import numbers
import os
import sys
import threading
from typing import Any, Optional, Tuple

import numpy as np
from PIL import Image, ImageFilter

from dali_autoproxy.plan.pillow_ops import BUILTIN_KERNELS

Call = Tuple[Any, ...]  # (PILLOW_CALLS name, a, b, c), or a size change: GEOMETRY_CALLS
CallShape = Tuple[Tuple[str, ...], Tuple[int, ...]]  # the size changes in order, and calls planned around them
# calls that change the size, recorded as their own ops (ir.Crop, ir.PillowResize):
#   ("crop", top, left, height, width): Image.crop, outside the image zeros as Pillow's
#   ("resize", height, width, filter, top, left, bottom, right): Image.resize of its box, any of Pillow's
#       six filters
#   ("warp", fill, bilinear, height, width, a, b, c, d, e, f): Image.transform(AFFINE) (Image.rotate, transposes)
#   ("perspective", fill, bilinear, height, width, a, .., h): Image.transform(PERSPECTIVE)
#   ("reduce", height, width, factor_y, factor_x): Image.reduce of the whole image (its box is a crop before)
#   ("pad", fill, top, left, height, width): ImageOps.expand (torchvision's constant pad), a crop with the
#       fill outside the image, ``top`` and ``left`` minus the borders
#   ("tensor_resize", height, width, interpolation, antialias, api): torchvision's own resize of the image
#       made a tensor (plan/record/tensor_hooks.py), ir.TensorResize
GEOMETRY_CALLS = ("crop", "resize", "warp", "perspective", "reduce", "pad", "tensor_resize")


def call_token(call: Call) -> Any:
    """What a size change contributes to a plan's shape: its kind, and for a warp the fill and
    the filter (fixed in its op)."""
    if call[0] == "tensor":  # made a tensor (plan/record/tensor.py): the transform it equals
        return tuple(call)
    if call[0] == "pad":
        return tuple(call[:2])
    if call[0] == "tensor_resize":  # its filter, antialias and API are fixed in its op
        return (call[0],) + tuple(call[3:6])
    return tuple(call[:3]) if call[0] in ("warp", "perspective") else call[0]
RESIZE_FILTERS = (Image.Resampling.NEAREST, Image.Resampling.LANCZOS, Image.Resampling.BILINEAR,
                  Image.Resampling.BICUBIC, Image.Resampling.BOX, Image.Resampling.HAMMING)  # ir.PillowResize's

MAX_CALLS = 16  # calls one transform may record per sample; more: it runs in the worker


class NeedsPixels(BaseException):
    """A recorded transform needed what a recording image does not have. A BaseException, so
    that the user's ``except Exception`` does not swallow it and change what the code does."""

    def __init__(self, what: str, where: Optional[str] = None, calls: Optional[int] = None,
                 transform: Optional[type] = None, shape: Optional[CallShape] = None,
                 instance: Any = None):
        super().__init__(what if where is None else f"{what} at {where}")
        self.what, self.where = what, where
        self.calls = calls          # set when the transform only made more calls than were planned
        self.transform = transform  # the recorded transform's type (set by its drawer)
        self.shape = shape          # set when its calls need another shape of plan (size changes)
        self.instance = instance    # the recorded transform itself, with ``shape``


class _Recording(threading.local):
    active: int = 0  # > 0 while a drawer calls a transform with a recording image


recording = _Recording()

_PACKAGE = os.path.abspath(__file__).rsplit(os.sep + os.path.join("plan", "record", ""), 1)[0]  # dali_autoproxy/
_OURS = tuple(os.path.dirname(m.__file__) + os.sep for m in (Image,)) + (_PACKAGE + os.sep,)
_LIBRARIES = ("numpy", "torchvision", "torch")


def _user_frame() -> Optional[str]:
    """``file:line`` of the innermost caller outside Pillow, NumPy, torch and torchvision
    between here and the drawer that called the transform (where the user's code asked for
    pixels), else of the innermost outside Pillow (a torchvision transform's own line)."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_OURS[1]) and path != __file__:
            break  # the drawer: what is further out is not the transform's code
        if not path.startswith(_OURS[0]) and path != __file__:
            where = f"{path.split('site-packages' + os.sep)[-1]}:{frame.f_lineno}"  # a library by its module path
            fallback = fallback or where
            if not any(f"{os.sep}{lib}{os.sep}" in path for lib in _LIBRARIES):
                return where
        frame = frame.f_back
    return fallback


def _pil_caller() -> str:
    """The outermost Pillow method on the stack (what the user called), e.g. ``crop``; the
    recording image's own methods count as Pillow's."""
    frame, name = sys._getframe(2), "load"
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_OURS[0]) or path == __file__:
            name = frame.f_code.co_name
        frame = frame.f_back
    return name


def _needs_pixels() -> NeedsPixels:
    if not recording.active:  # a recording image kept by the user's code and used later
        raise RuntimeError("dali_autoproxy: an image recorded for a transform was used after the transform "
                           "returned; enable(record='off') (DALI_AUTOPROXY_RECORD=off) leaves such transforms "
                           "in the worker")
    return NeedsPixels(f"Image.{_pil_caller()}", _user_frame())


def _resize_box(box: Any, size: Tuple[int, int]) -> Optional[Tuple[float, float, float, float]]:
    """``Image.resize``'s box as Pillow's C code reads it (four C floats), or None where Pillow
    would refuse it (outside the image, empty) or it is not four numbers."""
    if box is None:
        return (0.0, 0.0, float(size[0]), float(size[1]))
    try:
        left, top, right, bottom = (float(np.float32(v)) for v in box)
    except (TypeError, ValueError):
        return None
    if not (0 <= left < right <= size[0] and 0 <= top < bottom <= size[1]):
        return None
    return left, top, right, bottom


class RecordingImage(Image.Image):
    """A PIL image of known size and mode whose pixels are not here: each recorded call returns
    a new one with the call appended to ``calls``; anything else needs the pixels."""
    stands_in_for = Image.Image  # what torchvision's exact-type lookups (v2's fills) see

    def __init__(self, size: Tuple[int, int], mode: str, calls: Tuple[Call, ...] = ()):
        super().__init__()
        self._size = (int(size[0]), int(size[1]))
        self._mode = mode
        self.calls = calls

    def then(self, name: str, a: float = 0.0, b: float = 0.0, c: float = 0.0,
             mode: Optional[str] = None) -> "RecordingImage":
        return RecordingImage(self._size, mode or self._mode, self.calls + ((name, float(a), float(b), float(c)),))

    def _same(self, mode: Optional[str] = None) -> "RecordingImage":
        return RecordingImage(self._size, mode or self._mode, self.calls)

    def _sized(self, size: Tuple[int, int], call: Call) -> "RecordingImage":
        return RecordingImage(size, self._mode, self.calls + (call,))

    # ----------------------------------------------------------------- no pixels here
    @property
    def im(self) -> Any:
        raise _needs_pixels()

    @im.setter
    def im(self, value: Any) -> None:
        raise _needs_pixels()

    def load(self) -> Any:
        raise _needs_pixels()

    # ----------------------------------------------------------------- recorded calls
    def copy(self) -> "RecordingImage":
        return self._same()

    __copy__ = copy

    def convert(self, mode: Optional[str] = None, *args: Any, **kwargs: Any) -> Image.Image:
        if args or kwargs or mode not in (None, "RGB", "L"):
            raise _needs_pixels()
        if mode is None or mode == self._mode:
            return self._same()
        if mode == "L":
            return self.then("grayscale", mode="L")
        return self._same(mode="RGB")  # L -> RGB: the luma is in every channel already

    def filter(self, filter: Any) -> Image.Image:
        if isinstance(filter, type):  # Pillow instantiates a filter class (``img.filter(SMOOTH)``)
            filter = filter()
        kind = type(filter)
        if kind.__name__ in BUILTIN_KERNELS and kind is getattr(ImageFilter, kind.__name__):
            return self.then("kernel", BUILTIN_KERNELS.index(kind.__name__))
        if kind is ImageFilter.UnsharpMask:
            radius, percent, threshold = filter.radius, filter.percent, filter.threshold
            if not (isinstance(radius, numbers.Real) and radius >= 0 and type(percent) is int
                    and type(threshold) is int):
                raise _needs_pixels()
            return self.then("unsharp_mask", radius, percent, threshold)
        if kind not in (ImageFilter.GaussianBlur, ImageFilter.BoxBlur):
            raise _needs_pixels()
        radius = filter.radius
        if isinstance(radius, (int, float)):  # as Pillow reads it; anything else goes to Pillow as it is
            radius = (radius, radius)
        if not (isinstance(radius, (tuple, list)) and len(radius) == 2
                and all(isinstance(r, numbers.Real) for r in radius)):
            raise _needs_pixels()  # what Pillow makes of it (a TypeError for a tensor) on the real image
        x, y = radius
        if x < 0 or y < 0:
            raise _needs_pixels()
        if (x, y) == (0, 0):
            return self._same()  # Pillow returns a copy
        return self.then("gaussian_blur" if kind is ImageFilter.GaussianBlur else "box_blur", x, y)

    def point(self, lut: Any, mode: Optional[str] = None) -> Image.Image:
        if mode is not None or isinstance(lut, Image.ImagePointHandler):
            raise _needs_pixels()
        bands = len(self.getbands())
        table = [lut(i) for i in range(256)] * bands if callable(lut) else list(lut)
        if len(table) != 256 * bands:
            raise _needs_pixels()
        table = [round(v) for v in table]
        if any(table[k * 256:(k + 1) * 256] != table[:256] for k in range(1, bands)):
            raise _needs_pixels()  # a table per band
        call = classify_table(table[:256])
        if call is None:
            raise _needs_pixels()
        return self._same() if call[0] == "none" else self.then(*call)

    def crop(self, box: Any = None) -> Image.Image:
        if box is None or box == (0, 0, *self.size):
            return self._same()
        try:
            x0, y0, x1, y1 = map(int, map(round, box))
        except (TypeError, ValueError):
            raise _needs_pixels() from None
        if not (box[2] >= box[0] and box[3] >= box[1]) or x1 == x0 or y1 == y0:
            raise _needs_pixels()  # Pillow's error, or an empty image: as plain runs it
        return self._sized((x1 - x0, y1 - y0), ("crop", y0, x0, y1 - y0, x1 - x0))

    def resize(self, size: Any, resample: Any = None, box: Any = None, reducing_gap: Any = None) -> Image.Image:
        resample = Image.Resampling.BICUBIC if resample is None else resample
        try:
            width, height = (int(v) for v in size)
            exact = (width, height) == tuple(size) and width > 0 and height > 0
        except (TypeError, ValueError):
            exact = False
        region = _resize_box(box, self.size)
        if not (exact and region is not None and resample in RESIZE_FILTERS) or (
                reducing_gap is not None and reducing_gap < 1):
            raise _needs_pixels()  # another filter, an odd size or box: as Pillow does it (or raises), in the worker
        left, top, right, bottom = region
        if (width, height) == self.size and region == (0, 0, *self.size):
            return self._same()
        if reducing_gap is not None and resample != Image.Resampling.NEAREST:  # Image.resize's two steps
            given = (0, 0, *self.size) if box is None else tuple(float(v) for v in box)
            factor_x = int((given[2] - given[0]) / width / reducing_gap) or 1
            factor_y = int((given[3] - given[1]) / height / reducing_gap) or 1
            if factor_x > 1 or factor_y > 1:
                safe = Image.Image._get_safe_box(self, (width, height), resample, given)
                reduced = self.reduce((factor_x, factor_y), box=safe)
                return reduced.resize((width, height), resample, (
                    (given[0] - safe[0]) / factor_x, (given[1] - safe[1]) / factor_y,
                    (given[2] - safe[0]) / factor_x, (given[3] - safe[1]) / factor_y))
        return self._sized((width, height), ("resize", height, width, int(resample), top, left, bottom, right))

    def reduce(self, factor: Any, box: Any = None) -> Image.Image:
        """Pillow's ``Image.reduce``: its box a crop, then the block means (``ir.PillowReduce``)."""
        try:
            fx, fy = factor if isinstance(factor, (list, tuple)) else (factor, factor)
            left, top, right, bottom = (0, 0, *self.size) if box is None else box
            ok = (all(type(v) is int and v >= 1 for v in (fx, fy))
                  and all(type(v) is int for v in (left, top, right, bottom))
                  and 0 <= left < right <= self.width and 0 <= top < bottom <= self.height)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise _needs_pixels()  # as Pillow does it, or raises, in the worker
        whole = (left, top, right, bottom) == (0, 0, *self.size)
        if (fx, fy) == (1, 1) and whole:
            return self._same()
        out = self if whole else self._sized((right - left, bottom - top), ("crop", top, left, bottom - top,
                                                                               right - left))
        if (fx, fy) == (1, 1):
            return out
        h, w = bottom - top, right - left
        return out._sized(((w + fx - 1) // fx, (h + fy - 1) // fy), ("reduce", h, w, fy, fx))

    def transform(self, size: Any, method: Any, data: Any = None, resample: Any = Image.Resampling.NEAREST,
                  fill: int = 1, fillcolor: Any = None) -> Image.Image:
        """Pillow's affine or perspective transform (what ``Image.rotate``, with or without
        ``expand``, and torchvision's ``rotate`` / ``affine`` / ``perspective`` on PIL images end
        in), nearest or bilinear, to any size."""
        colour = (0, 0, 0) if fillcolor is None else fillcolor
        kind, n = {Image.Transform.AFFINE: ("warp", 6), Image.Transform.PERSPECTIVE: ("perspective", 8)}.get(
            method, (None, 0))
        try:
            width, height = (int(v) for v in size)
            whole = (width, height) == tuple(size) and width > 0 and height > 0
        except (TypeError, ValueError):
            whole = False
        if (kind is None or data is None or len(data) < n or not whole
                or resample not in (Image.Resampling.NEAREST, Image.Resampling.BILINEAR)
                or not (isinstance(colour, tuple) and len(colour) == 3 and all(type(v) is int for v in colour))):
            raise _needs_pixels()
        return self._sized((width, height), (kind, tuple(float(v) for v in colour),
                                             resample == Image.Resampling.BILINEAR, height, width)
                           + tuple(float(v) for v in data[:n]))

    def padded(self, left: int, top: int, right: int, bottom: int, fill: Tuple[int, int, int]) -> Image.Image:
        """``ImageOps.expand`` (what torchvision's constant pad of a PIL image calls): a new image
        of ``fill`` with this one pasted at (left, top); negative borders cut it."""
        width, height = left + self.width + right, top + self.height + bottom
        if width <= 0 or height <= 0:
            raise _needs_pixels()  # Pillow's own error, in the worker
        if (left, top, right, bottom) == (0, 0, 0, 0):
            return self._same()
        return self._sized((width, height), ("pad", tuple(float(v) for v in fill), -top, -left, height, width))

    def transpose(self, method: Any) -> Image.Image:
        if method == Image.Transpose.FLIP_LEFT_RIGHT:
            return self.then("hflip")
        if method == Image.Transpose.FLIP_TOP_BOTTOM:
            return self.then("vflip")
        if method == Image.Transpose.ROTATE_180:
            return self.then("hflip").then("vflip")
        turns = {Image.Transpose.TRANSPOSE: (), Image.Transpose.ROTATE_90: ("vflip",),
                 Image.Transpose.ROTATE_270: ("hflip",), Image.Transpose.TRANSVERSE: ("hflip", "vflip")}
        if method not in turns:
            raise _needs_pixels()
        if self.width == self.height:
            out = self.then("transpose")
        else:  # the size changes: the transpose as Pillow's nearest affine transform (x, y) <- (y, x), exact
            out = self._sized((self.height, self.width), ("warp", (0.0, 0.0, 0.0), False, self.width, self.height,
                                                          0.0, 1.0, 0.0, 1.0, 0.0, 0.0))
        for flip in turns[method]:
            out = out.then(flip)
        return out


def classify_table(table: list) -> Optional[Tuple[Any, ...]]:
    """The recorded call a 256-entry look-up table is (identity, invert, solarize, posterize,
    timm's solarize_add), or None."""
    levels = range(256)
    if table == list(levels):
        return ("none",)
    if table == [255 - i for i in levels]:
        return ("invert",)
    threshold = next(i for i in levels if table[i] != i)
    if table == [i if i < threshold else 255 - i for i in levels]:
        return ("solarize", threshold)
    for bits in range(8):
        mask = ~(2 ** (8 - bits) - 1) & 0xFF
        if table == [i & mask for i in levels]:
            return ("posterize", mask)
    add = table[0]
    if add > 0 and table == [min(255, i + add) if i < threshold_of_add(table) else i for i in levels]:
        return ("solarize_add", add, threshold_of_add(table))
    return None


def threshold_of_add(table: list) -> int:
    """Where a solarize_add table starts to leave values as they are (256: nowhere)."""
    return next((i for i in range(256) if table[i] == i), 256)
