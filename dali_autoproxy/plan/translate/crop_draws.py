"""RandomResizedCrop's box (and a coin), drawn with torchvision's RNG calls at a fraction of their cost.

torchvision's ``get_params`` (v1) and ``make_params`` (v2) make, per attempt, two
``torch.empty(1).uniform_`` draws, a ``torch.exp`` and, on success, two ``torch.randint``; v1
also takes ``torch.log(torch.tensor(ratio))`` on every call. Each is a new tensor: about half a
train chain's per-sample cost in a worker. Here the same calls run on two reused one-element
tensors (``uniform_``, ``exp_``, ``random_``: the operations those functions are made of, on the
same default generator), so every value and every generator step is torchvision's
(``tests/test_crop_draws.py`` compares them over many draws and image sizes); the logarithms of
the ratio are taken once, as float32, as torchvision takes them.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence, Tuple

import torch


class _Buffers(threading.local):
    def __init__(self) -> None:
        self.real = torch.empty(1)
        self.whole = torch.empty(1, dtype=torch.int64)


_buffers = _Buffers()


def uniform() -> float:
    """``torch.rand(1).item()``: one float32 draw in [0, 1) from the default generator."""
    return _buffers.real.uniform_(0.0, 1.0).item()


def log_ratio(ratio: Sequence[float]) -> Tuple[float, float]:
    """torchvision's ``torch.log(torch.tensor(ratio))``, as the two float32 values it passes on."""
    logs = torch.log(torch.tensor(ratio))
    return float(logs[0]), float(logs[1])


def resized_crop_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                     logs: Tuple[float, float]) -> Tuple[int, int, int, int]:
    """(top, left, height, width) as RandomResizedCrop draws it for an image of this size."""
    real, whole = _buffers.real, _buffers.whole
    area = height * width
    lo, hi = float(scale[0]), float(scale[1])
    for _ in range(10):
        target_area = area * real.uniform_(lo, hi).item()
        aspect_ratio = real.uniform_(logs[0], logs[1]).exp_().item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = whole.random_(0, height - h + 1).item()
            j = whole.random_(0, width - w + 1).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)  # torchvision's fallback: the central crop
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
