"""What torchvision and Pillow compute that both sides of the package need: the translation
(drawing per-sample params in the worker, checking what can be moved) and the back ends
(running the ops). Kept here so neither side imports the other."""
from __future__ import annotations

import importlib
import math
from typing import Any, List, Optional, Sequence

# torchvision's private tensor ColorJitter kernels, per API: the torch stage batches them
TENSOR_JITTER_KERNELS = {
    "v2": ("torchvision.transforms.v2.functional._color", ("_rgb_to_grayscale_image", "_rgb_to_hsv", "_hsv_to_rgb")),
    "v1": ("torchvision.transforms._functional_tensor", ("rgb_to_grayscale", "convert_image_dtype", "_rgb2hsv",
                                                        "_hsv2rgb")),
}


def tensor_jitter_module(api: str) -> Any:
    """The module holding torchvision's tensor ColorJitter kernels for ``api`` ("v1"/"v2");
    ImportError or AttributeError now, at translation, if torchvision moved or renamed one."""
    module_name, names = TENSOR_JITTER_KERNELS[api]
    module = importlib.import_module(module_name)
    for name in names:
        getattr(module, name)
    return module


def rotation_matrix(angle: float, width: int, height: int, center: Optional[Sequence[float]]) -> List[float]:
    """Pillow's Image.rotate (expand=False): the inverse matrix it hands to its affine transform."""
    if center is None:
        center = (width / 2, height / 2)
    a = -math.radians(angle % 360.0)
    m = [round(math.cos(a), 15), round(math.sin(a), 15), 0.0, round(-math.sin(a), 15), round(math.cos(a), 15), 0.0]
    m[2] = m[0] * -center[0] + m[1] * -center[1] + m[2]
    m[5] = m[3] * -center[0] + m[4] * -center[1] + m[5]
    m[2] += center[0]
    m[5] += center[1]
    return m
