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
    return mean_luma_of(luma(img))


def mean_luma_of(lum_float):
    lum = fn.cast(lum_float, dtype=types.INT32)
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
    """ColorJitter's adjustments in each sample's own order, for the price of one hue pass.

    Brightness, contrast and saturation are all ``blend(degenerate, img, factor)`` (black, the
    mean luma, the luma image), so each position of the order is ONE blend whose degenerate and
    factor are selected per sample (degenerate 0 and factor 1 where the position does nothing,
    which is exact). Hue sits at one position k of every sample's order: the blends before k
    run first, then the hue pass, then the blends after k."""
    cur = fn.cast(img, dtype=types.FLOAT)
    if not any(enabled[:3]):  # hue alone: the order does not matter (and feeds nothing)
        return fn.cast(shift_hue(cur, shift), dtype=types.UINT8)
    if not enabled[3]:
        for position in range(4):
            cur = _blend_stage(cur, order[position], factors, enabled, None)
        return fn.cast(cur, dtype=types.UINT8)
    hue_at, hue_on = None, None
    for position in range(4):
        here = order[position] == 3.0
        hue_at = here * float(position) if hue_at is None else hue_at + here * float(position)
        hue_on = here if hue_on is None else hue_on | here  # 0 in RandomApply's "skip" row
    for position in range(3):  # position 3 is never before the hue
        cur = _blend_stage(cur, order[position], factors, enabled, hue_at > float(position))
    cur = hue_on * shift_hue(cur, shift) + (hue_on == 0) * cur
    for position in range(1, 4):  # position 0 is never after it
        cur = _blend_stage(cur, order[position], factors, enabled, hue_at < float(position))
    return fn.cast(cur, dtype=types.UINT8)


def _blend_stage(cur, which, factors: Sequence, enabled: Sequence[bool], active):
    """One position of the order: brightness (0), contrast (1) or saturation (2) as one blend,
    or nothing (hue, a disabled adjustment, or ``active`` 0 for this sample)."""
    sel = [None] * 3
    for k in range(3):
        if enabled[k]:
            sel[k] = (which == float(k)) if active is None else (which == float(k)) * active
    if all(x is None for x in sel):
        return cur
    lum = luma(cur) if enabled[1] or enabled[2] else None
    degenerate, factor, none = 0.0, 0.0, 1.0
    if sel[1] is not None:
        degenerate = degenerate + sel[1] * mean_luma_of(lum)
    if sel[2] is not None:
        degenerate = degenerate + sel[2] * merge(lum, lum, lum)
    for k in range(3):
        if sel[k] is not None:
            factor = factor + sel[k] * factors[k]
            none = none - sel[k]
    return blend(degenerate, cur, factor + none)


def grayscale(img, channels: int, apply=None):
    """``rgb_to_grayscale`` on a PIL image; with ``apply`` (0/1 per sample) only where it is 1."""
    lum = luma(fn.cast(img, dtype=types.FLOAT))
    gray = merge(*([lum] * channels))
    if apply is not None:
        gray = apply * gray + (apply == 0) * img
    return fn.cast(gray, dtype=types.UINT8)

