"""The small intermediate form between torchvision transforms and DALI operators.

A converter turns one transform into a few of these ops; the pipeline builder lowers the
whole list to DALI, fusing where it can (decode+crop, flip+normalize+layout). Per-sample
values (crop boxes, sizes, flip flags) are not in the ops: they are drawn in the worker by
the converter's ``draw`` and travel as a row of numbers ``params`` (integers, or floats such as
jitter factors); an op names its ``slot``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, ClassVar, List, Optional, Sequence, Tuple, Union

import numpy as np


class Unsupported(Exception):
    """A transform, or an argument of it, that has no faithful DALI translation."""


class Placement(Enum):
    """Where an op may run. Every op also runs in the CPU replay. The back ends' kernel tables
    must agree with it (tests/test_kernel_tables.py); planning reads only this."""
    DALI = "DALI only"          # crops and resizes: DALI runs them, before any torch stage
    EITHER = "DALI or torch"    # DALI, or the torch stage once it has taken over
    TORCH = "torch stage only"  # exact (or fast) only as torch ops: the torch stage takes over here


@dataclass(frozen=True)
class Crop:
    """Crop [top, left, height, width] from params[slot:slot+4]; outside the image is
    ``fill`` (per channel), which is how Pad and padded crops are expressed too. DALI runs the
    crops before the torch stage takes over (the first one fused into the decode); the stage runs
    those after an exact resize (CenterCrop after Resize)."""
    placement: ClassVar[Placement] = Placement.EITHER
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int
    in_bounds: bool = False  # True when the box never leaves the image (lets decode fuse it)
    fill: Tuple[float, ...] = (0.0,)


@dataclass(frozen=True)
class Resize:
    """Resize to params[slot:slot+2] = [height, width], or to the fixed ``size``."""
    placement: ClassVar[Placement] = Placement.DALI
    interp: str  # "linear", "cubic", "nn"
    antialias: bool
    slot: Optional[int] = None
    size: Optional[Tuple[int, int]] = None


PILLOW_FILTERS = {"nearest": 0, "bilinear": 2, "bicubic": 3, "box": 4}  # PIL.Image.Resampling values


@dataclass(frozen=True)
class PillowResize:
    """Pillow's ``Image.resize`` of a PIL image, as torchvision's resize and resized_crop call it:
    each sample from its size params[slot:slot+2] = [height, width] to params[slot+2:slot+4],
    with Pillow's filter params[slot+4] (its NEAREST 0, BILINEAR 2, BICUBIC 3 or BOX 4), so one
    batch may mix filters (timm draws one per image). Exact, border included: Pillow's clipped and
    renormalised weights in its fixed point (torch_stage/resample.py); DALI's resize differs at
    the edges, so it is used only with ``fidelity="fast"``. Accepts samples of different sizes.
    ``size``: the output size when it is the same for every sample (it names the plan, so that
    chains resizing to different sizes get pipelines whose batches stay of one size)."""
    placement: ClassVar[Placement] = Placement.TORCH
    keeps_size: ClassVar[bool] = False
    ragged: ClassVar[bool] = True
    slot: int
    size: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class Flip:
    """Horizontal (or vertical) flip when params[slot] is 1."""
    placement: ClassVar[Placement] = Placement.EITHER
    slot: int
    vertical: bool = False


@dataclass(frozen=True)
class PixelOp:
    """A per-pixel uint8 operation applied when params[slot] is 1: "invert" (255 - x),
    "solarize" (255 - x where x >= arg) or "posterize" (x & arg, arg the bit mask)."""
    placement: ClassVar[Placement] = Placement.EITHER
    kind: str
    slot: int
    arg: int = 0


@dataclass(frozen=True)
class ColorJitter:
    """torchvision's ColorJitter on a PIL image: its four adjustments in the per-sample order
    params[slot:slot+4] (0 brightness, 1 contrast, 2 saturation, 3 hue), with the factors
    params[slot+4:slot+7] and the hue shift params[slot+7] (in 1/256 turns, as PIL applies it);
    an adjustment that is not ``enabled`` is skipped, as torchvision skips a None factor."""
    placement: ClassVar[Placement] = Placement.TORCH
    slot: int
    enabled: Tuple[bool, bool, bool, bool]


@dataclass(frozen=True)
class FastColorJitter:
    """ColorJitter by DALI's fused ``color_twist`` (the ``fidelity="fast"`` opt-in), torchvision's
    draw, in each sample's order: four passes, pass k with the factors params[slot+4k:slot+4k+4]
    (brightness, contrast, saturation, hue in turns), all neutral but the one drawn k-th.
    Approximate: DALI's contrast pivots on mid-grey (Pillow's on the image's mean luma) and its
    hue is a linear rotation (Pillow's an HSV shift); PSNR per adjustment in docs/benchmarks.md."""
    placement: ClassVar[Placement] = Placement.DALI
    slot: int


JITTER_SKIP = 4  # an order entry RandomApply writes when it skips the whole ColorJitter


def jitter_order(host: np.ndarray, op) -> np.ndarray:
    """The per-sample order of a (Tensor)ColorJitter, decoded once for every back end: rows of
    params -> int64 [B, 4] of adjustments (0 brightness, 1 contrast, 2 saturation, 3 hue), with
    -1 where nothing is applied (RandomApply's skip, or an adjustment that is not enabled)."""
    order = np.asarray(host, dtype=np.float64)[:, op.slot:op.slot + 4].astype(np.int64)
    enabled = np.append(np.asarray(op.enabled, dtype=bool), False)
    order = np.minimum(order, JITTER_SKIP)
    return np.where(enabled[order], order, -1)


@dataclass(frozen=True)
class TensorColorJitter:
    """ColorJitter on a tensor image: torchvision's own tensor kernels (``api`` "v1" or "v2"),
    batched with a factor per sample, in each sample's drawn order params[slot:slot+4] with factors
    params[slot+4:slot+8]
    (brightness, contrast, saturation, hue as torchvision's hue factor)."""
    placement: ClassVar[Placement] = Placement.TORCH
    slot: int
    enabled: Tuple[bool, bool, bool, bool]
    api: str


@dataclass(frozen=True)
class Grayscale:
    """PIL's luma (ITU-R 601-2 in integers) to ``channels`` channels; applied where
    params[slot] is 1, or always when ``slot`` is None."""
    placement: ClassVar[Placement] = Placement.EITHER
    channels: int
    slot: Optional[int] = None


@dataclass(frozen=True)
class Blur:
    """torchvision's gaussian_blur: window ``kernel`` = (height, width), reflected borders,
    per-sample sigma params[slot] (y) and params[slot+1] (x)."""
    placement: ClassVar[Placement] = Placement.EITHER
    kernel: Tuple[int, int]
    slot: int


@dataclass(frozen=True)
class Erase:
    """RandomErasing on the final tensor: the box params[slot:slot+4] = [top, left, height,
    width] (height 0: nothing erased) is set to ``value`` (one per channel)."""
    placement: ClassVar[Placement] = Placement.EITHER
    slot: int
    value: Tuple[float, ...]


@dataclass(frozen=True)
class Warp:
    """Pillow's affine transform (what torchvision's rotate and affine do to PIL images), nearest
    or ``bilinear``: the inverse matrix in params[slot:slot+6], ``fill`` outside the image."""
    placement: ClassVar[Placement] = Placement.TORCH
    slot: int
    fill: Tuple[float, ...]
    bilinear: bool = False


PERSPECTIVE_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Perspective:
    """Pillow's perspective transform (what torchvision's perspective does to PIL images): its 8
    coefficients in params[slot:slot+8] (PERSPECTIVE_IDENTITY: not applied), nearest or
    bilinear sampling, ``fill`` outside the image."""
    placement: ClassVar[Placement] = Placement.TORCH
    slot: int
    fill: Tuple[float, ...]
    bilinear: bool


AUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
               "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")  # the policy operations that move pixels


@dataclass(frozen=True)
class Augment:
    """One operation of an augmentation policy per sample, as torchvision's ``_apply_op`` does it
    on a PIL image: AUGMENT_OPS[params[slot]] with magnitude params[slot+1] (v1's units); the
    geometric operations sample nearest, or ``bilinear``."""
    placement: ClassVar[Placement] = Placement.TORCH
    slot: int
    fill: Tuple[float, ...]
    bilinear: bool = False


@dataclass(frozen=True)
class TensorAugment:
    """One policy operation per sample on a tensor image, by torchvision's own tensor kernel for
    the API (v1's ``_apply_op``, v2's ``_apply_image_or_video_transform``): AUGMENT_OPS[params[slot]]
    with magnitude params[slot+1] in that API's units; ``fill`` as the transform hands it over."""
    placement: ClassVar[Placement] = Placement.TORCH
    slot: int
    fill: Optional[Union[float, Tuple[float, ...]]]
    interpolation: str  # "nearest" or "bilinear" (torch's grid_sample)
    api: str


@dataclass(frozen=True)
class ToFloat:
    """uint8 -> float32, multiplied by ``scale`` (1/255 for ToTensor-like conversions);
    ``divide``: computed as x / (1/scale), as v1's ToTensor does (v2's ToDtype multiplies)."""
    placement: ClassVar[Placement] = Placement.EITHER
    scale: float
    divide: bool = False


@dataclass(frozen=True)
class Normalize:
    placement: ClassVar[Placement] = Placement.EITHER
    mean: Tuple[float, ...]
    std: Tuple[float, ...]


def compose_affine(ops: Sequence[object], channels: int) -> Tuple[np.ndarray, np.ndarray]:
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
class ToCHW:
    """Marks the PIL -> tensor layout change; the builder emits CHW once, at the end."""
    placement: ClassVar[Placement] = Placement.EITHER


Op = object  # one of the dataclasses above
ALL_OPS: Tuple[type, ...] = (Crop, Resize, PillowResize, Flip, PixelOp, ColorJitter, FastColorJitter, TensorColorJitter,
                             Grayscale, Blur, Erase,
                             Warp, Perspective, Augment, TensorAugment, ToFloat, Normalize, ToCHW)


for _op in ALL_OPS:  # the defaults: an op keeps the sample's size and needs one size per batch
    if "keeps_size" not in vars(_op):
        _op.keeps_size = _op is not Resize
    if "ragged" not in vars(_op):
        _op.ragged = False


def split_at_takeover(ops: Sequence[object]) -> Tuple[List[object], List[object]]:
    """(DALI's ops, the torch stage's ops): the stage takes over at the first TORCH op when it
    can run everything from there on. Where that op needs one size for the whole batch, the stage
    also takes the size-keeping EITHER ops just before it, so that DALI hands over uint8 pixels of
    its last crop or resize; where it takes samples of any size (``ragged``: the exact resize),
    DALI hands over its crops padded to one size and keeps the ops before. Without such an op,
    with a DALI-only op after it, or with a crop or resize after an op that needs one size while
    DALI has not cropped yet (a ColorJitter before a crop), all ops stay with DALI (planning then
    refuses a TORCH op left there, and the worker runs the chain's head)."""
    for k, op in enumerate(ops):
        if op.placement is Placement.TORCH:
            if (not op.ragged and all(o.keeps_size for o in ops[:k])
                    and not all(o.keeps_size for o in ops[k:])):
                break  # DALI would hand over every image at its own size to an op that needs one size
            if all(o.placement is not Placement.DALI for o in ops[k:]):
                while (k > 0 and not op.ragged and ops[k - 1].placement is Placement.EITHER
                       and ops[k - 1].keeps_size):
                    k -= 1
                return list(ops[:k]), list(ops[k:])
            break
    return list(ops), []


@dataclass
class ChainState:
    """What torchvision would be holding at this point of the chain (types, not pixels)."""
    kind: str = "pil"        # "pil" (HWC uint8) or "tensor" (CHW)
    dtype: str = "uint8"     # "uint8" or "float32"
    channels: int = 3
    fixed_size: Optional[Tuple[int, int]] = None  # output size when it is the same for all
    fidelity: str = "exact"  # "fast": approximate DALI operators where they are much faster (ColorJitter)
    exact_resize: bool = True  # False: DALI's resize for PIL images too (planning's second try)


class SampleGeometry:
    """One sample's size as it moves through the chain, and the params drawn for it."""
    __slots__ = ("height", "width", "channels", "params")

    def __init__(self, height: int, width: int, channels: int = 3):
        self.height = height
        self.width = width
        self.channels = channels
        self.params: List[float] = []

    def standin(self):
        """A zero-cost tensor of the current size, for torchvision's own get_params code."""
        import torch
        return torch.empty(1, dtype=torch.uint8).expand(self.channels, self.height, self.width)


Drawer = Callable[[SampleGeometry], None]


@dataclass
class Step:
    """One transform, translated: its name, its ops and its per-sample drawer. ``neutral``:
    the params row that makes its ops leave the image unchanged, where one exists (what lets
    RandomApply skip it per sample)."""
    name: str
    ops: List[Op] = field(default_factory=list)
    draw: Optional[Drawer] = None
    neutral: Optional[List[float]] = None
