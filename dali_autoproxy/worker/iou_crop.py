"""v2's ``RandomIoUCrop.make_params``, the same draws and the same float32 arithmetic, in numpy.

In a worker of a detection loader the images go to DALI, and what is left is torchvision's own
work on the targets. RandomIoUCrop's trial loop is most of it (the ``ssd`` preset: about 70% of
the worker's time): up to 40 trials per drawn overlap, each some forty small tensor operations
(``box_iou`` among them) that cost microseconds apiece for a handful of boxes. Here each trial
draws from torch's generator exactly as torchvision does (``torch.randint``, ``torch.rand(2)``,
in the same order) and computes the same IEEE float32 operations on numpy scalars and arrays:
the same crop, or the same exception, for every sample. Only the code this was written from
(``TORCHVISION_SOURCE``: torchvision 0.26's and 0.29's, compared with the installed one's source
at import) is replaced, for one sample's float32 boxes; a subclass, another torchvision's code
or other boxes run torchvision's own method.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List

import numpy as np
import torch
import torchvision.transforms.v2 as v2
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

TORCHVISION_SOURCE = '''
    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        orig_h, orig_w = query_size(flat_inputs)
        bboxes = get_bounding_boxes(flat_inputs)

        while True:
            # sample an option
            idx = int(torch.randint(low=0, high=len(self.options), size=(1,)))
            min_jaccard_overlap = self.options[idx]
            if min_jaccard_overlap >= 1.0:  # a value larger than 1 encodes the leave as-is option
                return dict()

            for _ in range(self.trials):
                # check the aspect ratio limitations
                r = self.min_scale + (self.max_scale - self.min_scale) * torch.rand(2)
                new_w = int(orig_w * r[0])
                new_h = int(orig_h * r[1])
                aspect_ratio = new_w / new_h
                if not (self.min_aspect_ratio <= aspect_ratio <= self.max_aspect_ratio):
                    continue

                # check for 0 area crops
                r = torch.rand(2)
                left = int((orig_w - new_w) * r[0])
                top = int((orig_h - new_h) * r[1])
                right = left + new_w
                bottom = top + new_h
                if left == right or top == bottom:
                    continue

                # check for any valid boxes with centers within the crop area
                xyxy_bboxes = F.convert_bounding_box_format(
                    bboxes.as_subclass(torch.Tensor),
                    bboxes.format,
                    tv_tensors.BoundingBoxFormat.XYXY,
                )
                cx = 0.5 * (xyxy_bboxes[..., 0] + xyxy_bboxes[..., 2])
                cy = 0.5 * (xyxy_bboxes[..., 1] + xyxy_bboxes[..., 3])
                is_within_crop_area = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                if not is_within_crop_area.any():
                    continue

                # check at least 1 box with jaccard limitations
                xyxy_bboxes = xyxy_bboxes[is_within_crop_area]
                ious = box_iou(
                    xyxy_bboxes,
                    torch.tensor([[left, top, right, bottom]], dtype=xyxy_bboxes.dtype, device=xyxy_bboxes.device),
                )
                if ious.max() < min_jaccard_overlap:
                    continue

                return dict(top=top, left=left, height=new_h, width=new_w, is_within_crop_area=is_within_crop_area)
'''


def _normalised(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip("\n").splitlines())


def _same_code() -> bool:
    try:
        return _normalised(inspect.getsource(v2.RandomIoUCrop.make_params)) == _normalised(TORCHVISION_SOURCE)
    except (OSError, TypeError, AttributeError):  # no source to read (a frozen install): torchvision's own
        return False


SAME_CODE = _same_code()
F32 = np.float32


def _xyxy_boxes(flat_inputs: List[Any]):
    """The sample's boxes as float32 [N, 4] XYXY (torchvision's own conversion), or None where
    they are not one sample's float32 boxes on the CPU."""
    boxes = [x for x in flat_inputs if isinstance(x, tv_tensors.BoundingBoxes)]
    if len(boxes) != 1 or boxes[0].dtype != torch.float32 or boxes[0].ndim != 2 or boxes[0].device.type != "cpu":
        return None
    b = boxes[0]
    return F.convert_bounding_box_format(b.as_subclass(torch.Tensor), b.format, tv_tensors.BoundingBoxFormat.XYXY)


def _max_iou(boxes: np.ndarray, left: int, top: int, right: int, bottom: int) -> np.float32:
    """``box_iou(boxes, [[left, top, right, bottom]]).max()`` in float32, as torchvision's ops."""
    crop = np.array([left, top, right, bottom], dtype=F32)
    area1 = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    area2 = (crop[2] - crop[0]) * (crop[3] - crop[1])
    lt = np.maximum(boxes[:, :2], crop[:2])
    rb = np.minimum(boxes[:, 2:], crop[2:])
    wh = np.maximum(rb - lt, F32(0))
    inter = wh[:, 0] * wh[:, 1]
    union = area1 + area2 - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.max(inter / union)  # NaN (0 / 0) as torch's: it passes the threshold test


def iou_crop_params(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of ``RandomIoUCrop.make_params`` in a proxied loader's workers."""
    flat_inputs = args[0] if args else kwargs.get("flat_inputs")
    if type(instance) is not v2.RandomIoUCrop or not SAME_CODE or flat_inputs is None:
        return wrapped(*args, **kwargs)
    xyxy = _xyxy_boxes(flat_inputs)
    if xyxy is None:
        return wrapped(*args, **kwargs)
    orig_h, orig_w = v2.query_size(flat_inputs)  # as torchvision's method asks (0.26 and 0.29 export it)
    return _draw(instance, int(orig_h), int(orig_w), xyxy)


def _draw(t: Any, orig_h: int, orig_w: int, xyxy: torch.Tensor) -> Dict[str, Any]:
    boxes = xyxy.numpy()
    cx = F32(0.5) * (boxes[:, 0] + boxes[:, 2])
    cy = F32(0.5) * (boxes[:, 1] + boxes[:, 3])
    span, low = F32(t.max_scale - t.min_scale), F32(t.min_scale)
    w32, h32 = F32(orig_w), F32(orig_h)
    while True:
        idx = int(torch.randint(low=0, high=len(t.options), size=(1,)))
        min_jaccard_overlap = t.options[idx]
        if min_jaccard_overlap >= 1.0:
            return dict()
        threshold = F32(min_jaccard_overlap)
        for _ in range(t.trials):
            r = low + span * torch.rand(2).numpy()
            new_w = int(w32 * r[0])
            new_h = int(h32 * r[1])
            aspect_ratio = new_w / new_h  # torchvision's ZeroDivisionError for an image under a pixel
            if not (t.min_aspect_ratio <= aspect_ratio <= t.max_aspect_ratio):
                continue
            r = torch.rand(2).numpy()
            left = int(F32(orig_w - new_w) * r[0])
            top = int(F32(orig_h - new_h) * r[1])
            right, bottom = left + new_w, top + new_h
            if left == right or top == bottom:
                continue
            within = (F32(left) < cx) & (cx < F32(right)) & (F32(top) < cy) & (cy < F32(bottom))
            if not within.any():
                continue
            if _max_iou(boxes[within], left, top, right, bottom) < threshold:
                continue
            return dict(top=top, left=left, height=new_h, width=new_w, is_within_crop_area=torch.from_numpy(within))
