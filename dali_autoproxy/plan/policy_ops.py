"""IR ops of the augmentation policies: one policy operation per sample (``Augment`` on PIL
images with Pillow's arithmetic, ``TensorAugment`` with torchvision's tensor kernels), and
AugMix's mixing of its augmented copies (``MixStart``, ``MixAdd``; timm's ends in ``MixBlend``).
All run in the torch stage."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Tuple, Union

from dali_autoproxy.plan.ir import Op, Placement

AUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
               "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")  # the policy operations that move pixels


@dataclass(frozen=True)
class Augment(Op):
    """One operation of an augmentation policy per sample, as torchvision's ``_apply_op`` does it
    on a PIL image: AUGMENT_OPS[``operation``] with its ``magnitude`` (v1's units); the
    geometric operations sample nearest, or ``bilinear``."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("operation", "magnitude")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0, 0.0)
    slot: int
    fill: Tuple[float, ...]
    bilinear: bool = False


@dataclass(frozen=True)
class TensorAugment(Op):
    """One policy operation per sample on a tensor image, by torchvision's own tensor kernel for
    the API (v1's ``_apply_op``, v2's ``_apply_image_or_video_transform``): AUGMENT_OPS[``operation``]
    with its ``magnitude`` in that API's units; ``fill`` as the transform hands it over."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("operation", "magnitude")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0, 0.0)
    slot: int
    fill: Optional[Union[float, Tuple[float, ...]]]
    interpolation: str  # "nearest" or "bilinear" (torch's grid_sample)
    api: str


@dataclass(frozen=True)
class MixStart(Op):
    """AugMix's start: the image as it is becomes the source of every augmented copy, and the
    mix starts as ``weight`` (float32) times it, in float32 as torchvision computes it (timm's
    starts from zeros: weight 0). ``tensors``: the copies are uint8 tensors (torchvision's AugMix
    converts a PIL image); False: images as they come (timm's, PIL images)."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("weight",)
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (1.0,)
    slot: int
    tensors: bool = True


@dataclass(frozen=True)
class MixAdd(Op):
    """AugMix's end of one augmented copy: the mix gains ``weight`` (float32) times the copy, and
    the next copy starts from the source again; after the ``last`` copy the image is the mix
    converted back to uint8 (truncated, as ``Tensor.to`` does)."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("weight",)
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0.0,)
    slot: int
    last: bool = False


@dataclass(frozen=True)
class MixBlend(Op):
    """timm's AugMix end: Pillow's ``Image.blend(source, mixed, alpha)`` of the source its
    MixStart kept and the mix its last MixAdd made."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("alpha",)
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (1.0,)
    slot: int
