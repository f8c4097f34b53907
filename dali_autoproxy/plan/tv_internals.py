"""What torchvision and Pillow compute that both sides of the package need: the translation
(drawing per-sample params in the worker, checking what can be moved) and the back ends
(running the ops). Kept here so neither side imports the other."""
from __future__ import annotations

import functools
import importlib
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

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


@functools.lru_cache(maxsize=None)
def tensor_policy_operation(api: str) -> Callable[..., Any]:
    """torchvision's own policy operation on tensors for ``api`` ("v1"/"v2"), as
    ``run(image, name, magnitude, interpolation, fill)``: v1's ``autoaugment._apply_op`` (fill a
    list of floats or None) or v2's ``_AutoAugmentBase._apply_image_or_video_transform`` (fill as
    v2 resolves it for the image's type). AttributeError now if torchvision renamed them."""
    from torchvision.transforms import InterpolationMode
    if api == "v1":
        from torchvision.transforms.autoaugment import _apply_op

        def run(image, name, magnitude, interpolation, fill):
            return _apply_op(image, name, magnitude, InterpolationMode(interpolation),
                             None if fill is None else list(fill))
        return run
    from torchvision.transforms.v2 import TrivialAugmentWide
    apply = TrivialAugmentWide()._apply_image_or_video_transform  # uses no state of the instance

    def run(image, name, magnitude, interpolation, fill):
        fill = list(fill) if isinstance(fill, tuple) else fill
        return apply(image, name, magnitude, interpolation=InterpolationMode(interpolation), fill={"others": fill})
    return run


def v2_grid_functions() -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """(v2's ``_affine_grid``, torchvision's ``_get_inverse_affine_matrix``): how v2's affine and
    rotate kernels build their sampling grid on tensors."""
    from torchvision.transforms.functional import _get_inverse_affine_matrix
    from torchvision.transforms.v2.functional._geometry import _affine_grid
    return _affine_grid, _get_inverse_affine_matrix


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


def v2_pil_kernels(functional: Callable[..., Any]) -> Optional[dict]:
    """v2's kernel table of one functional (by input type: PIL.Image.Image -> its PIL kernel),
    where torchvision dispatches through one (0.16 and later); None elsewhere. A hook on the
    functional's module attribute misses v2's dispatch, which calls the registered kernel."""
    try:
        from torchvision.transforms.v2.functional._utils import _KERNEL_REGISTRY
    except ImportError:  # pragma: no cover - torchvision 0.15
        return None
    table = _KERNEL_REGISTRY.get(functional)
    return table if isinstance(table, dict) else None


def calls_transforms_with_targets(owner: Any) -> bool:
    """Whether ``owner.transforms`` is called with the sample's image and its target: the datasets
    of torchvision (``VisionDataset``: VOC, COCO, Cityscapes, ... call ``self.transforms(image,
    target)``; one given ``transform=`` holds it in a ``StandardTransform`` there, which calls it
    with the image alone) and the wrapper ``wrap_dataset_for_transforms_v2`` puts around them
    (``self.transforms(*sample)``)."""
    from torchvision.datasets import VisionDataset
    try:
        from torchvision.tv_tensors._dataset_wrapper import VisionDatasetTVTensorWrapper
    except ImportError:  # pragma: no cover - torchvision before 0.16, or the wrapper moved
        VisionDatasetTVTensorWrapper = ()
    return isinstance(owner, (VisionDataset, VisionDatasetTVTensorWrapper))


def uses_pil_file_loader(ds: Any) -> bool:
    """A DatasetFolder/ImageFolder reading files with torchvision's PIL loader, unmodified."""
    try:
        from torchvision import get_image_backend
        from torchvision.datasets.folder import DatasetFolder, default_loader, pil_loader
    except ImportError:  # pragma: no cover
        return False
    return (isinstance(ds, DatasetFolder)
            and type(ds).__getitem__ is DatasetFolder.__getitem__
            and getattr(ds, "loader", None) in (default_loader, pil_loader)
            and get_image_backend() == "PIL")
