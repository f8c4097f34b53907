"""IR ops that replay Pillow's own filters, as the few-line classes of self-supervised recipes
call them on PIL images (``img.filter(ImageFilter.GaussianBlur(radius))``). Their kernels
reproduce Pillow's C arithmetic (``libImaging/BoxBlur.c``), not a textbook Gaussian."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Tuple

from dali_autoproxy.plan.ir import Op, Placement


@dataclass(frozen=True)
class PillowBlur(Op):
    """Pillow's ``ImageFilter.GaussianBlur`` (``gaussian``: three extended box passes whose
    radius Pillow derives from the Gaussian's) or ``ImageFilter.BoxBlur`` (one box pass), with
    each sample's ``x_radius`` and ``y_radius`` as the user's code passed them: every pass along
    x, then every pass along y, each in 8-bit fixed point, the edges replicated. (0, 0) leaves
    the image as it is, as Pillow returns a copy."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("x_radius", "y_radius")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0.0, 0.0)
    slot: int
    gaussian: bool = True

    @property
    def passes(self) -> int:
        return 3 if self.gaussian else 1


# what a recorded Pillow call did (``PillowCall``'s ``call``), and what its values ``a``, ``b`` hold
PILLOW_CALLS = (
    "none",            # no call at this position
    "gaussian_blur",   # filter(GaussianBlur): a, b = x, y radius
    "box_blur",        # filter(BoxBlur): a, b = x, y radius
    "kernel",          # filter(BLUR, DETAIL, SHARPEN, SMOOTH, ...): a = the filter's index in BUILTIN_KERNELS
    "hflip",           # transpose(FLIP_LEFT_RIGHT), ImageOps.mirror
    "vflip",           # transpose(FLIP_TOP_BOTTOM), ImageOps.flip
    "grayscale",       # convert("L"): Pillow's luma, kept in every channel
    "invert",          # point(255 - x), ImageOps.invert
    "solarize",        # point(solarize): a = threshold (x >= a is inverted)
    "posterize",       # point(x & mask): a = mask
    "equalize",        # ImageOps.equalize
    "autocontrast",    # ImageOps.autocontrast, cutoff 0
    "brightness",      # ImageEnhance.Brightness(img).enhance(a)
    "contrast",        # ImageEnhance.Contrast(img).enhance(a)
    "color",           # ImageEnhance.Color(img).enhance(a)
    "sharpness",       # ImageEnhance.Sharpness(img).enhance(a)
    "hue",             # torchvision's adjust_hue on PIL: a = the 8-bit shift of Pillow's HSV hue
    "unsharp_mask",    # filter(UnsharpMask): a = radius, b = percent, c = threshold
    "transpose",       # transpose(TRANSPOSE) of a square image (with the flips: ROTATE_90 / 270, TRANSVERSE)
    "keep",            # Image.blend's first branch point: the image as it is here, kept for "blend_kept"
    "blend_kept",      # Image.blend(kept, image, a) (b = 0) or Image.blend(image, kept, a) (b = 1)
    "tv_blur",         # torchvision's gaussian_blur on PIL: a = blur_window(v2, kx, ky), b, c = sigma x, y
    "permute",         # v2's permute_channels on PIL (RandomPhotometricDistort): a, b, c = the channel order
    # torchvision's tensor kernels on a uint8 tensor of the image (the detection presets' tensor
    # backends, plan/record/tensor_hooks.py): a = the factor, b = 0 for v1's, 1 for v2's
    "tv_brightness",   # adjust_brightness
    "tv_contrast",     # adjust_contrast
    "tv_saturation",   # adjust_saturation
    "tv_hue",          # adjust_hue
    "solarize_add",    # point(x + a where x < b, clipped at 255): timm's solarize_add table
)
TENSOR_COLOR_CALLS = ("tv_brightness", "tv_contrast", "tv_saturation", "tv_hue")  # in tensor_jitter_kernels' order


def blur_window(v2: bool, kernel_x: int, kernel_y: int) -> int:
    """torchvision's gaussian_blur window and version as one value (``tv_blur``'s ``a``)."""
    return (int(v2) << 24) | (kernel_x << 12) | kernel_y


def blur_window_of(code: int) -> Tuple[bool, int, int]:
    code = int(code)
    return bool(code >> 24), (code >> 12) & 0xFFF, code & 0xFFF
CALL_CODE = {name: code for code, name in enumerate(PILLOW_CALLS)}
# Pillow's fixed convolutions (ImageFilter's BuiltinFilter classes), by name
BUILTIN_KERNELS = ("BLUR", "CONTOUR", "DETAIL", "EDGE_ENHANCE", "EDGE_ENHANCE_MORE", "EMBOSS", "FIND_EDGES",
                   "SHARPEN", "SMOOTH", "SMOOTH_MORE")


@dataclass(frozen=True)
class PillowCall(Op):
    """One Pillow call that a transform without a translation made on a recording image
    (``plan/record/image.py``), per sample: ``call`` indexes PILLOW_CALLS, ``a``, ``b`` and ``c`` are
    its arguments as the user's code passed them. A recorded transform gets a few of these in a row,
    one per call it made; positions it did not use hold "none". Every call keeps the size and the
    channels (an image converted to "L" keeps its luma in every channel, which every recorded
    call treats as Pillow treats the "L" image). Samples of a batch may record different calls:
    the kernels take each call's samples together."""
    placement: ClassVar[Placement] = Placement.TORCH
    params: ClassVar[Tuple[str, ...]] = ("call", "a", "b", "c")
    neutral: ClassVar[Optional[Tuple[float, ...]]] = (0, 0.0, 0.0, 0.0)
    slot: int


@dataclass(frozen=True)
class RaggedPillowCall(PillowCall):
    """A PillowCall of a plan whose samples keep sizes of their own (a joint transform's): its
    kernel takes the padded batch, computing the per-pixel calls on all samples at once and each
    other call (a mean, a histogram, a neighbourhood) on each sample's own region."""
    ragged: ClassVar[bool] = True
