"""Pillow's colour maths written as DALI arithmetic, so colour transforms match torchvision.

torchvision adjusts PIL images with Pillow: ``ImageEnhance`` blends in float32 and truncates,
luma is ITU-R 601-2 in 16-bit fixed point, hue goes through Pillow's 8-bit HSV. Each step is
reproduced here with DALI's arithmetic operators (on the GPU or the CPU backend). Images are
carried as float32 holding whole numbers between steps, which is exact: every intermediate
integer stays below 2**24. Per-sample factors arrive as scalar DALI nodes.
"""
from __future__ import annotations

from typing import Sequence

from nvidia.dali import fn, types
import nvidia.dali.math as dmath


def split_rgb(img):
    return img[:, :, 0], img[:, :, 1], img[:, :, 2]


def merge(*planes):
    return fn.stack(*planes, axis=2, axis_name="C")


def luma(img):
    """Pillow's ``convert("L")``: (19595 R + 38470 G + 7471 B + 32768) >> 16."""
    r, g, b = split_rgb(img)
    return dmath.floor((r * 19595 + g * 38470 + b * 7471 + 32768) * (1.0 / 65536))


def blend(degenerate, img, factor):
    """``Image.blend(degenerate, img, factor)``: float32 interpolation, truncated, clipped."""
    return dmath.clamp(dmath.floor(degenerate + factor * (img - degenerate)), 0.0, 255.0)


def mean_luma(img):
    """``int(ImageStat.Stat(img.convert("L")).mean[0] + 0.5)``, in exact integer arithmetic."""
    lum = fn.cast(luma(img), dtype=types.INT32)
    total = fn.reductions.sum(lum, dtype=types.INT64)
    shape = lum.shape(dtype=types.INT64)
    count = shape[0] * shape[1]
    return fn.cast((total * 2 + count) // (count * 2), dtype=types.FLOAT)


def _select(index, choices: Sequence):
    out = None
    for k, value in enumerate(choices):
        term = (index == k) * value
        out = term if out is None else out + term
    return out


def _f64(x):
    return fn.cast(x, dtype=types.FLOAT64)


def _f32(x):
    return fn.cast(x, dtype=types.FLOAT)


def shift_hue(img, shift):
    """torchvision's PIL adjust_hue: RGB -> Pillow's 8-bit HSV, H += shift (mod 256), -> RGB.

    Pillow's C code mixes float and double (``h / 6.0`` is double, ``cr / maxc`` float);
    each step is computed at the precision Pillow uses, so results agree bit for bit but
    for rare last-place differences of the platform's maths."""
    r, g, b = split_rgb(img)
    maxc = dmath.max(r, dmath.max(g, b))
    minc = dmath.min(r, dmath.min(g, b))
    chroma = maxc - minc
    grey = chroma == 0
    safe = chroma + grey  # no division by zero (a NaN would survive the masking)
    sat = chroma / (maxc + (maxc == 0))                                 # float
    rc, gc, bc = [_f64((maxc - c) / safe) for c in (r, g, b)]          # float, then widened
    is_r = r == maxc
    is_g = (g == maxc) * (is_r == 0)
    is_b = (is_r == 0) * (is_g == 0)
    h = _f32(is_r * (bc - gc) + is_g * (2.0 + rc - bc) + is_b * (4.0 + gc - rc))
    h = _f64(h) / 6.0 + 1.0
    h = _f64(_f32(h - dmath.floor(h)))                                 # fmod(.., 1.0) into a float
    not_grey = grey == 0
    hue = dmath.clamp(dmath.floor(h * 255.0), 0.0, 255.0) * not_grey
    s8 = dmath.clamp(dmath.floor(_f64(sat) * 255.0), 0.0, 255.0) * not_grey
    hue = hue + shift
    hue = hue - (hue >= 256.0) * 256.0
    # Pillow's hsv2rgb
    x = hue * 6.0 / 255.0                                                # double
    sector = dmath.floor(x)
    frac = _f32(x - sector)                                              # float
    sector = sector - (sector >= 6.0) * 6.0
    fs = _f32(s8 / 255.0)                                                # float
    v = _f64(maxc)
    p = dmath.floor(v * (1.0 - _f64(fs)) + 0.5)
    q = dmath.floor(v * (1.0 - _f64(fs * frac)) + 0.5)                  # fs * f is float * float
    t = dmath.floor(v * (1.0 - _f64(fs) * (1.0 - _f64(frac))) + 0.5)
    return _f32(merge(_select(sector, [v, q, p, p, t, v]),
                      _select(sector, [t, v, v, q, p, p]),
                      _select(sector, [p, p, t, v, v, q])))


def color_jitter(img, order: Sequence, factors: Sequence, shift, enabled: Sequence[bool]):
    """ColorJitter's four adjustments in a per-sample order: at each of the four positions every
    enabled adjustment is computed and the sample's own is kept (a select, not a branch)."""
    cur = fn.cast(img, dtype=types.FLOAT)
    for position in range(4):
        which = order[position]
        lum = luma(cur) if enabled[1] or enabled[2] else None
        candidates: list = []
        if enabled[0]:
            candidates.append((0, lambda c: blend(0.0, c, factors[0])))
        if enabled[1]:
            candidates.append((1, lambda c: blend(mean_luma(c), c, factors[1])))
        if enabled[2]:
            candidates.append((2, lambda c: blend(merge(lum, lum, lum), c, factors[2])))
        if enabled[3]:
            candidates.append((3, lambda c: shift_hue(c, shift)))
        cur = _pick(which, cur, candidates)
    return fn.cast(cur, dtype=types.UINT8)


def _pick(which, cur, candidates: Sequence[tuple]):
    keep = None
    out = None
    for index, make in candidates:
        chosen = which == index
        term = chosen * make(cur)
        out = term if out is None else out + term
        keep = (chosen == 0) if keep is None else keep * (chosen == 0)
    return cur if out is None else out + keep * cur


def grayscale(img, channels: int, apply=None):
    """``rgb_to_grayscale`` on a PIL image; with ``apply`` (0/1 per sample) only where it is 1."""
    lum = luma(fn.cast(img, dtype=types.FLOAT))
    gray = merge(*([lum] * channels))
    if apply is not None:
        gray = apply * gray + (apply == 0) * img
    return fn.cast(gray, dtype=types.UINT8)

