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
