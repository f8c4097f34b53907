"""The small intermediate form between torchvision transforms and DALI operators.

A converter turns one transform into a few of these ops; the back ends run them (the DALI
lowering fusing where it can: decode+crop, flip+normalize+layout). Per-sample values (crop
boxes, sizes, flip flags) are not in the ops: they are drawn in the worker by the converter's
``draw`` and travel as a row of numbers (integers, or floats such as jitter factors). Each op
declares the names of its values (``params``, its schema) and, where one exists, the values
that leave the image unchanged (``neutral``); its ``slot`` is where its values start in the
row. Drawers write them by name (``SampleGeometry.put``), kernels read them by name
(``op.col("height")``, ``op.span("top", "width")``), so no back end knows an offset.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, List, Optional, Sequence, Tuple

import numpy as np


class Unsupported(Exception):
    """A transform, or an argument of it, that has no faithful DALI translation."""


class Op:
    """The base of every IR op (frozen dataclasses): its placement, its named per-sample values
    and the lookups by name that kernels use."""
    placement: ClassVar["Placement"]
    params: ClassVar[Tuple[str, ...]] = ()  # the names of its per-sample values, in row order
    neutral: ClassVar[Optional[Tuple[float, ...]]] = None  # values that leave the image unchanged
    keeps_size: ClassVar[bool] = True  # the op keeps the sample's size
    ragged: ClassVar[bool] = False  # the op takes a batch of samples of different sizes
    # ``slot``, a field of the ops that have values: where they start in the row (None: not here)

    def col(self, name: str) -> int:
        """The column of the value ``name`` in the params row."""
        if getattr(self, "slot", None) is None:
            raise LookupError(f"{type(self).__name__} has no per-sample values here")
        try:
            return self.slot + type(self).params.index(name)
        except ValueError:
            raise KeyError(f"{type(self).__name__} has no value {name!r} (it has {type(self).params})") from None

    def span(self, first: str, last: str) -> slice:
        """The columns from ``first`` to ``last``, both included, as a slice of the row."""
        return slice(self.col(first), self.col(last) + 1)

    def value(self, row, name: str) -> float:
        """The value ``name`` in one sample's row."""
        return row[self.col(name)]

    @classmethod
    def width(cls) -> int:
        """How many values the op takes in the row."""
        return len(cls.params)

    def __init_subclass__(cls, **kwargs) -> None:
        """Every op type is known to the completeness checks as it is defined (``all_ops()``)."""
        super().__init_subclass__(**kwargs)
        _OPS.append(cls)


_OPS: List[type] = []


def all_ops() -> Tuple[type, ...]:
    """Every IR op type defined so far: the built-in ones and those added with ``register_op``."""
    return tuple(_OPS)


class Placement(Enum):
    """Where an op may run. Every op also runs in the CPU replay. The back ends' kernel tables
    must agree with it (tests/test_kernel_tables.py); planning reads only this."""
    DALI = "DALI only"          # crops and resizes: DALI runs them, before any torch stage
    EITHER = "DALI or torch"    # DALI, or the torch stage once it has taken over
    TORCH = "torch stage only"  # exact (or fast) only as torch ops: the torch stage takes over here


@dataclass(frozen=True)
class Crop(Op):
    """Crop [top, left, height, width] from params[slot:slot+4]; outside the image is
    ``fill`` (per channel), which is how Pad and padded crops are expressed too. DALI runs the
    crops before the torch stage takes over (the first one fused into the decode); the stage runs
    those after an exact resize (CenterCrop after Resize)."""
    placement: ClassVar[Placement] = Placement.EITHER
    params: ClassVar[Tuple[str, ...]] = ("top", "left", "height", "width")
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int
    in_bounds: bool = False  # True when the box never leaves the image (lets decode fuse it)
    fill: Tuple[float, ...] = (0.0,)


@dataclass(frozen=True)
class Resize(Op):
    """Resize to the per-sample ``height`` and ``width``, or to the fixed ``size`` (no values)."""
    placement: ClassVar[Placement] = Placement.DALI
    params: ClassVar[Tuple[str, ...]] = ("height", "width")
    keeps_size: ClassVar[bool] = False
    interp: str  # "linear", "cubic", "nn"
    antialias: bool
    slot: Optional[int] = None
    size: Optional[Tuple[int, int]] = None


# PIL.Image.Resampling's values
PILLOW_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


@dataclass(frozen=True)
class PillowResize(Op):
    """Pillow's ``Image.resize`` of a PIL image, as torchvision's resize and resized_crop call it:
    each sample from its size params[slot:slot+2] = [height, width] to params[slot+2:slot+4],
    with Pillow's filter params[slot+4] (any of Pillow's six: NEAREST 0, LANCZOS 1, BILINEAR 2,
    BICUBIC 3, BOX 4, HAMMING 5), so one batch may mix filters (timm draws one per image); the
    region resized is Pillow's ``box`` (top, left, bottom, right: C floats; the whole image
    unless the user's code passed one). Exact, border included: Pillow's clipped and
    renormalised weights in its fixed point (torch_stage/resample.py); DALI's resize differs at
    the edges, so it is used only with ``fidelity="fast"``. Accepts samples of different sizes.
    ``size``: the output size when it is the same for every sample (it names the plan, so that
    chains resizing to different sizes get pipelines whose batches stay of one size)."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("in_height", "in_width", "out_height", "out_width", "filter",
                                         "box_top", "box_left", "box_bottom", "box_right")
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int
    size: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class PillowReduce(Op):
    """Pillow's ``Image.reduce`` (what ``resize(..., reducing_gap=...)`` does first): each output
    pixel the integer mean of a ``factor_y`` x ``factor_x`` block of the sample's
    ``in_height`` x ``in_width`` pixels, in Reduce.c's fixed point (fewer pixels at the right and
    bottom edges); factors 1, 1: the image as it is. Accepts samples of different sizes."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("in_height", "in_width", "factor_y", "factor_x")
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int


@dataclass(frozen=True)
class TensorResize(Op):
    """torchvision's own resize of a tensor image (``api`` "v1": ``F.resize``, "v2":
    ``resize_image``), each sample from ``in_height`` x ``in_width`` to ``out_height`` x
    ``out_width``, with ``interpolation`` (an InterpolationMode's value) and ``antialias`` as the
    transform passes them, on the chain's values as torchvision sees them (uint8 or float): the
    same arithmetic where the stage runs on the CPU, torch's CUDA kernels on a GPU. Accepts
    samples of different sizes. ``size``: the output size when it is the same for every sample."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("in_height", "in_width", "out_height", "out_width")
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int
    interpolation: str
    antialias: Optional[bool]
    api: str
    size: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class Flip(Op):
    """Horizontal (or vertical) flip when ``apply`` is 1 (each sample within its own size)."""
    placement: ClassVar[Placement] = Placement.EITHER
    ragged: ClassVar[bool] = True
    params: ClassVar[Tuple[str, ...]] = ("apply",)
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0,)
    slot: int
    vertical: bool = False


@dataclass(frozen=True)
class PixelOp(Op):
    """A per-pixel uint8 operation applied when ``apply`` is 1: "invert" (255 - x),
    "solarize" (255 - x where x >= arg) or "posterize" (x & arg, arg the bit mask)."""
    placement: ClassVar[Placement] = Placement.EITHER
    params: ClassVar[Tuple[str, ...]] = ("apply",)
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0,)
    kind: str
    slot: int
    arg: int = 0


@dataclass(frozen=True)
class ColorJitter(Op):
    """torchvision's ColorJitter on a PIL image: its four adjustments in the per-sample order
    ``first`` .. ``fourth`` (0 brightness, 1 contrast, 2 saturation, 3 hue; JITTER_SKIP: none),
    with the factors and the hue shift (in 1/256 turns, as PIL applies it); an adjustment that is
    not ``enabled`` is skipped, as torchvision skips a None factor."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("first", "second", "third", "fourth",
                                         "brightness", "contrast", "saturation", "hue")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (4, 4, 4, 4, 1.0, 1.0, 1.0, 0)
    slot: int
    enabled: Tuple[bool, bool, bool, bool]


@dataclass(frozen=True)
class FastColorJitter(Op):
    """ColorJitter by DALI's fused ``color_twist`` (the ``fidelity="fast"`` opt-in), torchvision's
    draw, in each sample's order: four passes, pass k with the factors ``brightness<k>``,
    ``contrast<k>``, ``saturation<k>``, ``hue<k>`` (in turns), all neutral but the one drawn k-th.
    Approximate: DALI's contrast pivots on mid-grey (Pillow's on the image's mean luma) and its
    hue is a linear rotation (Pillow's an HSV shift); PSNR per adjustment in docs/benchmarks.md."""
    placement: ClassVar[Placement] = Placement.DALI
    params: ClassVar[Tuple[str, ...]] = tuple(f"{a}{k}" for k in range(4)
                                              for a in ("brightness", "contrast", "saturation", "hue"))
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (1.0, 1.0, 1.0, 0.0) * 4
    slot: int


JITTER_SKIP = 4  # an order entry RandomApply writes when it skips the whole ColorJitter


def jitter_order(host: np.ndarray, op) -> np.ndarray:
    """The per-sample order of a (Tensor)ColorJitter, decoded once for every back end: rows of
    params -> int64 [B, 4] of adjustments (0 brightness, 1 contrast, 2 saturation, 3 hue), with
    -1 where nothing is applied (RandomApply's skip, or an adjustment that is not enabled)."""
    order = np.asarray(host, dtype=np.float64)[:, op.span("first", "fourth")].astype(np.int64)
    enabled = np.append(np.asarray(op.enabled, dtype=bool), False)
    order = np.minimum(order, JITTER_SKIP)
    return np.where(enabled[order], order, -1)


@dataclass(frozen=True)
class TensorColorJitter(Op):
    """ColorJitter on a tensor image: torchvision's own tensor kernels (``api`` "v1" or "v2"),
    batched with a factor per sample, in each sample's drawn order (as ColorJitter's) with its
    factors (brightness, contrast, saturation, hue as torchvision's hue factor)."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ColorJitter.params
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (4, 4, 4, 4, 1.0, 1.0, 1.0, 0.0)
    slot: int
    enabled: Tuple[bool, bool, bool, bool]
    api: str


@dataclass(frozen=True)
class Grayscale(Op):
    """PIL's luma (ITU-R 601-2 in integers) to ``channels`` channels; applied where ``apply``
    is 1, or always when ``slot`` is None."""
    placement: ClassVar[Placement] = Placement.EITHER
    params: ClassVar[Tuple[str, ...]] = ("apply",)
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0,)
    channels: int
    slot: Optional[int] = None


@dataclass(frozen=True)
class Blur(Op):
    """torchvision's gaussian_blur: window ``kernel`` = (height, width), reflected borders,
    per-sample ``sigma_y`` and ``sigma_x`` (neutral: a sigma so small the window is 1, 0, 0)."""
    placement: ClassVar[Placement] = Placement.EITHER
    params: ClassVar[Tuple[str, ...]] = ("sigma_y", "sigma_x")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (1e-3, 1e-3)
    kernel: Tuple[int, int]
    slot: int


@dataclass(frozen=True)
class Erase(Op):
    """RandomErasing on the final tensor: the box ``top``, ``left``, ``height``, ``width``
    (height 0: nothing erased) is set to ``value`` (one per channel)."""
    placement: ClassVar[Placement] = Placement.EITHER
    params: ClassVar[Tuple[str, ...]] = ("top", "left", "height", "width")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0, 0, 0, 0)
    slot: int
    value: Tuple[float, ...]


@dataclass(frozen=True)
class DrawnErase(Op):
    """timm's RandomErasing box ``top``, ``left``, ``height``, ``width`` (height 0: nothing erased)
    filled with random values: ``per_pixel`` False, each box's own per-channel values ``c0`` ..
    ``c2``, which the worker drew with timm's own ``normal_()`` (timm's values); True, standard
    normal noise drawn where the op runs, from a generator seeded by the batch's ``seed``s (the
    bits of each worker's own first noise value): timm's distribution, not its values."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("top", "left", "height", "width", "c0", "c1", "c2", "seed")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0, 0, 0, 0, 0.0, 0.0, 0.0, 0)
    slot: int
    per_pixel: bool = False


@dataclass(frozen=True)
class Warp(Op):
    """Pillow's affine transform (what torchvision's rotate and affine do to PIL images), nearest
    or ``bilinear``: the inverse matrix ``a`` .. ``f`` (Pillow's order), ``fill`` outside the image;
    from the sample's ``in_height`` x ``in_width`` to ``out_height`` x ``out_width`` (another size where
    a recorded ``Image.transform`` asks: ``rotate(expand=True)``, a quarter turn of a non-square
    image). Samples of different sizes in one batch (padded) are fine."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("a", "b", "c", "d", "e", "f", "in_height", "in_width", "out_height",
                                         "out_width")
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int
    fill: Tuple[float, ...]
    bilinear: bool = False


PERSPECTIVE_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
SAME_SIZE = (0, 0)  # Perspective's out_height, out_width: the image's own size


@dataclass(frozen=True)
class Perspective(Op):
    """Pillow's perspective transform (what torchvision's perspective does to PIL images): its 8
    coefficients ``a`` .. ``h`` (PERSPECTIVE_IDENTITY: not applied), nearest or bilinear
    sampling, ``fill`` outside the image; to ``out_height`` x ``out_width`` where a recorded
    ``Image.transform`` asks for another size (0: the image's own). It takes a batch of one size
    (or one sample at a time); the samples it makes may differ in size."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("a", "b", "c", "d", "e", "f", "g", "h", "out_height", "out_width")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = PERSPECTIVE_IDENTITY + SAME_SIZE
    slot: int
    fill: Tuple[float, ...]
    bilinear: bool


@dataclass(frozen=True)
class ToFloat(Op):
    """uint8 -> float32, multiplied by ``scale`` (1/255 for ToTensor-like conversions);
    ``divide``: computed as x / (1/scale), as v1's ToTensor does (v2's ToDtype multiplies)."""
    placement: ClassVar[Placement] = Placement.EITHER
    ragged: ClassVar[bool] = True  # per value: a padded batch's padding changes nothing
    scale: float
    divide: bool = False


@dataclass(frozen=True)
class Normalize(Op):
    placement: ClassVar[Placement] = Placement.EITHER
    ragged: ClassVar[bool] = True
    mean: Tuple[float, ...]
    std: Tuple[float, ...]


def compose_affine(ops: Sequence[Op], channels: int) -> Tuple[np.ndarray, np.ndarray]:
    """A run of ToFloat/Normalize ops as one y = a * x + b per channel (other ops: ignored)."""
    a, b = np.ones(channels), np.zeros(channels)
    for op in ops:
        if type(op) is ToFloat:
            a, b = a * op.scale, b * op.scale
        elif type(op) is Normalize:
            mean, std = np.asarray(op.mean), np.asarray(op.std)
            a, b = a / std, (b - mean) / std
    return a, b


@dataclass(frozen=True)
class ToCHW(Op):
    """Marks the PIL -> tensor layout change; the builder emits CHW once, at the end."""
    placement: ClassVar[Placement] = Placement.EITHER
    ragged: ClassVar[bool] = True


ALL_OPS: Tuple[type, ...] = tuple(_OPS)  # the built-in ops


def split_at_takeover(ops: Sequence[Op], any_size: bool = False) -> Tuple[List[Op], List[Op]]:
    """(DALI's ops, the torch stage's ops): the stage takes over at the first TORCH op when it
    can run everything from there on. Where that op needs one size for the whole batch, the stage
    also takes the size-keeping EITHER ops just before it, so that DALI hands over uint8 pixels of
    its last crop or resize; where it takes samples of any size (``ragged``: the exact resize),
    DALI hands over its crops padded to one size and keeps the ops before. DALI hands the stage
    uint8 pixels: where values became floats before the takeover (ToFloat, Normalize), the stage
    takes the ops from there on, if none of them is DALI's. Without such an op,
    with a DALI-only op after it, or with a crop or resize after an op that needs one size while
    DALI has not cropped yet (a ColorJitter before a crop), all ops stay with DALI (planning then
    refuses a TORCH op left there, and the worker runs the chain's head). ``any_size``: the plan's
    images end at sizes of their own anyway (a joint transform's), so the stage takes them as they
    come, one sample at a time where an op needs one size."""
    for k, op in enumerate(ops):
        if op.placement is Placement.TORCH:
            if (not any_size and not op.ragged and all(o.keeps_size for o in ops[:k])
                    and not all(o.keeps_size for o in ops[k:])):
                break  # DALI would hand over every image at its own size to an op that needs one size
            if all(o.placement is not Placement.DALI for o in ops[k:]):
                while (k > 0 and not op.ragged and ops[k - 1].placement is Placement.EITHER
                       and ops[k - 1].keeps_size):
                    k -= 1
                floats = next((j for j, o in enumerate(ops[:k]) if type(o) in (ToFloat, Normalize)), k)
                if any(o.placement is Placement.DALI for o in ops[floats:k]):
                    break  # DALI would hand over floats
                return list(ops[:floats]), list(ops[floats:])
            break
    return list(ops), []
