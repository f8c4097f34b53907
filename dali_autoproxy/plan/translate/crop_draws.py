"""RandomResizedCrop's box (and a coin), drawn with torchvision's RNG calls at a fraction of their cost.

torchvision's ``get_params`` (v1) and ``make_params`` (v2) make, per attempt, two
``torch.empty(1).uniform_`` draws, a ``torch.exp`` and, on success, two ``torch.randint``; v1
also takes ``torch.log(torch.tensor(ratio))`` on every call. Each is a new tensor: about half a
train chain's per-sample cost in a worker. Here the same calls run on two reused one-element
tensors (``uniform_``, ``exp_``, ``random_``: the operations those functions are made of, on the
same default generator), so every value and every generator step is torchvision's
(``tests/test_crop_draws.py`` compares them over many draws and image sizes); the logarithms of
the ratio are taken once, as float32, as torchvision takes them.

A copy is only as good as the original it copies: ``same_as_torchvision()`` draws with both, from
the same generator states, once per process, and where the installed torchvision draws otherwise
(a release changed its code) the drawers call torchvision's own functions instead, with a warning.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Sequence, Tuple

import torch

from dali_autoproxy.config import logger


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


# image sizes and settings that take every branch: a box found, the central crop on either side
_PROBES = [((375, 500), (0.08, 1.0), (3 / 4, 4 / 3)), ((2, 900), (0.08, 1.0), (3 / 4, 4 / 3)),
           ((900, 3), (0.9, 1.0), (1.0, 1.0)), ((17, 31), (0.05, 0.4), (0.5, 2.0)),
           ((1, 1), (0.08, 1.0), (3 / 4, 4 / 3))]


@functools.lru_cache(maxsize=None)
def same_as_torchvision() -> bool:
    """Whether these draws are still the installed torchvision's: v1's ``get_params``, v2's
    parameter method and a ``torch.rand(1)`` coin, from the same seeds, give the same values and
    leave the generator in the same state. The caller's generator state is kept. Seeded through
    the CPU generator itself (these draws' only one): ``torch.manual_seed`` also queues CUDA's
    seeding, with a stack trace each, a fifth of a second over these 240 seeds."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    saved = torch.get_rng_state()
    seed_cpu = torch.default_generator.manual_seed
    try:
        for seed in range(8):
            for (height, width), scale, ratio in _PROBES:
                image = torch.empty(1, dtype=torch.uint8).expand(3, height, width)
                t2 = v2.RandomResizedCrop(8, scale=scale, ratio=ratio)
                v2_params = getattr(t2, "make_params", None) or getattr(t2, "_get_params")
                ours = []
                for theirs in (lambda: T.RandomResizedCrop.get_params(image, scale, ratio),
                               lambda: _box_of(v2_params([image]))):
                    seed_cpu(seed)
                    want = tuple(int(v) for v in theirs())
                    want_next = torch.rand(1)
                    seed_cpu(seed)
                    got = resized_crop_box(height, width, scale, ratio, log_ratio(ratio))
                    ours.append(got == want and torch.equal(torch.rand(1), want_next))
                seed_cpu(seed)
                coins = [float(torch.rand(1)) for _ in range(4)]
                seed_cpu(seed)
                if not all(ours) or coins != [uniform() for _ in range(4)]:
                    return False
        return True
    except Exception:  # a signature that moved is a change too
        return False
    finally:
        torch.set_rng_state(saved)


def _box_of(params: dict) -> tuple:
    return params["top"], params["left"], params["height"], params["width"]


def copies_hold() -> bool:
    """``same_as_torchvision()``, said once at WARNING where it is not."""
    same = same_as_torchvision()
    if not same and not _warned:
        _warned.append(True)
        logger.warning("this torchvision draws RandomResizedCrop's box or a coin otherwise than "
                       "the copies made for speed; its own functions make every draw (slower, the same values)")
    return same


_warned: list = []
