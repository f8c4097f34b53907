"""Pillow's grayscale written as DALI arithmetic, for a Grayscale that comes before a resize.

Luma is ITU-R 601-2 in Pillow's 16-bit fixed point; carried as float32 holding whole numbers it
is exact (every intermediate stays below 2**24). The rest of Pillow's colour maths (ColorJitter,
the policies) lives in ``torch_stage``: as DALI operators it took ~100 separate operators and
ran the heavy chain at 1,800 images/s, so a ColorJitter that DALI would have to run stays in
the worker instead.
"""
from __future__ import annotations

import nvidia.dali.math as dmath
from nvidia.dali import fn, types


def split_rgb(img):
    return img[:, :, 0], img[:, :, 1], img[:, :, 2]


def merge(*planes):
    return fn.stack(*planes, axis=2, axis_name="C")


def luma(img):
    """Pillow's ``convert("L")``: (19595 R + 38470 G + 7471 B + 32768) >> 16."""
    r, g, b = split_rgb(img)
    return dmath.floor((r * 19595 + g * 38470 + b * 7471 + 32768) * (1.0 / 65536))


def grayscale(img, channels: int, apply=None):
    """``rgb_to_grayscale`` on a PIL image; with ``apply`` (0/1 per sample) only where it is 1."""
    lum = luma(fn.cast(img, dtype=types.FLOAT))
    gray = merge(*([lum] * channels))
    if apply is not None:
        gray = apply * gray + (apply == 0) * img
    return fn.cast(gray, dtype=types.UINT8)

