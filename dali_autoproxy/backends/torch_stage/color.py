"""Pillow's colour arithmetic as batched torch ops (what torchvision does to PIL images):
luma, blends, its 8-bit HSV for hue, autocontrast and equalize. Exact: the same integer and
float32 steps in the same order."""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import fused_color
from dali_autoproxy.backends.torch_stage.registry import Batch, kernel, shared, update_rows, upload
from dali_autoproxy.plan.ir import ColorJitter, Grayscale, PixelOp, jitter_order


def luma(x: torch.Tensor) -> torch.Tensor:
    """Pillow's convert("L") on [B, 3, H, W] float holding whole numbers -> [B, H, W]."""
    return torch.floor((x[:, 0] * 19595 + x[:, 1] * 38470 + x[:, 2] * 7471 + 32768) / 65536)


def blend(degenerate, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Image.blend: float32 interpolation (two roundings, as Pillow's C), truncated, clipped."""
    return torch.clamp(torch.floor(degenerate + factor * (x - degenerate)), 0, 255)


def mean_luma(lum: torch.Tensor) -> torch.Tensor:
    """int(mean + 0.5) in exact integers, per sample -> [B, 1, 1, 1]."""
    total = lum.to(torch.int64).sum(dim=(1, 2))
    count = lum.shape[1] * lum.shape[2]
    return ((total * 2 + count) // (count * 2)).to(torch.float32).view(-1, 1, 1, 1)


def rgb_to_hsv8(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pillow's 8-bit RGB -> HSV on [N, 3, ...] whole numbers, at Pillow's float/double steps."""
    f32, f64 = torch.float32, torch.float64
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    maxc = torch.maximum(r, torch.maximum(g, b))
    minc = torch.minimum(r, torch.minimum(g, b))
    chroma = maxc - minc
    grey = chroma == 0
    safe = torch.where(grey, torch.ones_like(chroma), chroma)
    sat = chroma / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    rc, gc, bc = [((maxc - c) / safe).to(f64) for c in (r, g, b)]
    h = torch.where(r == maxc, bc - gc, torch.where(g == maxc, 2.0 + rc - bc, 4.0 + gc - rc)).to(f32)
    h = h.to(f64) / 6.0 + 1.0
    h = (h - torch.floor(h)).to(f32).to(f64)
    hue = torch.where(grey, 0.0, torch.clamp(torch.floor(h * 255.0), 0, 255))
    s8 = torch.where(grey, 0.0, torch.clamp(torch.floor(sat.to(f64) * 255.0), 0, 255))
    return hue, s8, maxc


def hsv8_to_rgb(hue: torch.Tensor, s8: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Pillow's 8-bit HSV -> RGB (float64 inputs holding whole numbers) -> [N, 3, ...]."""
    f32, f64 = torch.float32, torch.float64
    xs = hue * 6.0 / 255.0
    sector = torch.floor(xs)
    frac = (xs - sector).to(f32)
    sector = torch.where(sector >= 6, sector - 6, sector)
    fs = (s8 / 255.0).to(f32)
    v = v.to(f64)
    p = torch.floor(v * (1.0 - fs.to(f64)) + 0.5)
    q = torch.floor(v * (1.0 - (fs * frac).to(f64)) + 0.5)
    t = torch.floor(v * (1.0 - fs.to(f64) * (1.0 - frac.to(f64))) + 0.5)
    planes = []
    for choices in ([v, q, p, p, t, v], [t, v, v, q, p, p], [p, p, t, v, v, q]):
        plane = choices[0]
        for k in range(1, 6):
            plane = torch.where(sector == k, choices[k], plane)
        planes.append(plane)
    return torch.stack(planes, 1)


_HUE_TABLES: dict = {}


def hue_tables(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Both directions of Pillow's conversion for all 2**24 inputs, computed once per device
    with the functions above (so exact by construction): RGB -> H*256+S (int16, 32 MB) and
    H, S, V -> RGB (uint8, 48 MB). A hue pass is then a few integer ops and two gathers."""
    key = str(device)
    if key not in _HUE_TABLES:
        n, chunk = 1 << 24, 1 << 21
        to_hs = torch.empty(n, dtype=torch.int16, device=device)
        to_rgb = torch.empty(n, 3, dtype=torch.uint8, device=device)
        for start in range(0, n, chunk):
            idx = torch.arange(start, start + chunk, device=device)
            a, b_, c = ((idx >> 16) & 255), ((idx >> 8) & 255), (idx & 255)
            h, s, _ = rgb_to_hsv8(torch.stack([a, b_, c], 1).to(torch.float32))   # a, b, c = R, G, B
            to_hs[start:start + chunk] = (h * 256 + s).to(torch.int16)
            to_rgb[start:start + chunk] = hsv8_to_rgb(a.to(torch.float64), b_.to(torch.float64),
                                                      c.to(torch.float64)).to(torch.uint8)  # a, b, c = H, S, V
        _HUE_TABLES[key] = (shared(to_hs), shared(to_rgb))
    return _HUE_TABLES[key]


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's PIL adjust_hue: RGB -> Pillow's HSV, H += shift (mod 256), -> RGB."""
    to_hs, to_rgb = hue_tables(x.device)
    xi = x.to(torch.int32)
    r, g, b = xi[:, 0], xi[:, 1], xi[:, 2]
    hs = to_hs[(r << 16) | (g << 8) | b].to(torch.int32)
    v = torch.maximum(r, torch.maximum(g, b))
    h = ((hs >> 8) + shift.to(torch.int32).view(-1, 1, 1)) & 255
    rgb = to_rgb[(h << 16) | ((hs & 255) << 8) | v]  # [B, H, W, 3]
    return rgb.permute(0, 3, 1, 2).to(torch.float32)


def color_jitter(x: torch.Tensor, op: ColorJitter, params: torch.Tensor, host) -> torch.Tensor:
    """Each sample's own order, planned on the host from its params row (no GPU sync): the
    enabled brightness/contrast/saturation steps of each sample become its 1st, 2nd and 3rd
    blend (one selected blend per step for the whole batch), and the hue pass runs on just
    the samples whose hue comes at that point."""
    order = jitter_order(host, op)
    is_blend = (order >= 0) & (order < 3)
    is_hue = order == 3
    blends_before = np.cumsum(is_blend, axis=1) - is_blend  # at each position of the order
    steps = np.full((len(order), 3), -1, dtype=np.int64)  # -1: nothing (identity)
    rows, cols = np.nonzero(is_blend)
    steps[rows, blends_before[rows, cols]] = order[rows, cols]
    # hue after this many blends; -1: none
    hue_after = np.where(is_hue.any(1), (blends_before * is_hue).sum(1), -1)
    factors, shift = jitter_factors(params, op)
    for k in range(4):
        due = np.flatnonzero(hue_after == k)
        if len(due):
            x = update_rows(x, due, lambda sub, idx: shift_hue(sub, shift.index_select(0, idx)))
        if k < 3 and (steps[:, k] >= 0).any():
            x = blend_step(x, steps[:, k], factors)
    return x


def blend_step(x: torch.Tensor, which, factors: torch.Tensor) -> torch.Tensor:
    """One blend per sample: brightness (0), contrast (1), saturation (2) or nothing (-1),
    as ``blend(degenerate, x, factor)`` with the degenerate and factor picked per sample
    (degenerate 0 and factor 1 for nothing: exact)."""
    view = (-1, 1, 1, 1)
    w = upload(which, x.device).view(view)
    degenerate = torch.zeros(x.shape[0], 1, 1, 1, device=x.device)
    if (which == 1).any() or (which == 2).any():
        lum = luma(x).unsqueeze(1)
        if (which == 1).any():
            degenerate = torch.where(w == 1, mean_luma(lum[:, 0]), degenerate)
        if (which == 2).any():
            degenerate = torch.where(w == 2, lum, degenerate)
    picked = factors.gather(1, w.view(-1, 1).clamp(min=0)).view(view)
    factor = torch.where(w >= 0, picked, torch.ones_like(picked))
    return blend(degenerate, x, factor)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """ImageOps.autocontrast (cutoff 0): per channel, lo..hi stretched to 0..255 in double,
    truncated (int()), clipped; a channel with hi <= lo is left as it is."""
    lo = x.amin(dim=(2, 3), keepdim=True).to(torch.float64)
    hi = x.amax(dim=(2, 3), keepdim=True).to(torch.float64)
    flat = hi <= lo
    # a true division (255.0 / tensor would multiply by a reciprocal and round differently)
    scale = torch.full_like(hi, 255.0) / torch.where(flat, torch.ones_like(hi), hi - lo)
    offset = -lo * scale
    y = torch.clamp(torch.trunc(x.to(torch.float64) * scale + offset), 0, 255)
    return torch.where(flat, x, y.to(x.dtype))


def equalize(x: torch.Tensor) -> torch.Tensor:
    """ImageOps.equalize: per channel, Pillow's histogram LUT in integers."""
    b, c, h, w = x.shape
    xi = x.to(torch.int64).view(b * c, h * w)
    hist = torch.zeros(b * c, 256, dtype=torch.int64, device=x.device).scatter_add_(1, xi, torch.ones_like(xi))
    levels = torch.arange(256, device=x.device)
    last = torch.where(hist > 0, levels, -1).amax(1, keepdim=True)       # highest used level
    top = hist.gather(1, last.clamp(min=0))                               # histo[-1]
    used = (hist > 0).sum(1, keepdim=True)
    step = (hist.sum(1, keepdim=True) - top) // 255
    keep = (used <= 1) | (step == 0)
    safe = torch.where(keep, torch.ones_like(step), step)
    before = torch.cumsum(hist, 1) - hist                                 # n before level i
    lut = ((safe // 2 + before) // safe).clamp(max=255)  # Image.point clips
    lut = torch.where(keep, levels.expand_as(lut), lut)
    return lut.gather(1, xi).view(b, c, h, w).to(x.dtype)


@kernel(ColorJitter)
def _color_jitter(x: torch.Tensor, op: ColorJitter, batch: Batch) -> torch.Tensor:
    if fused_color.usable(x):  # one Triton kernel per batch, the same values
        out = fused_color.color_jitter(x, jitter_order(batch.host, op), *jitter_factors(batch.params, op),
                                       hue_tables(x.device))
        if out is not None:
            return out
    return color_jitter(x, op, batch.params, batch.host)


def jitter_factors(params: torch.Tensor, op: ColorJitter) -> Tuple[torch.Tensor, torch.Tensor]:
    """The brightness, contrast and saturation factors [B, 3] (float32, as Pillow blends) and
    the hue shifts [B] (int32, 1/256 turns) of each sample."""
    return params[:, op.span("brightness", "saturation")].to(torch.float32), params[:, op.col("hue")].to(torch.int32)


@kernel(Grayscale)
def _grayscale(x: torch.Tensor, op: Grayscale, batch: Batch) -> torch.Tensor:
    lum = luma(x).unsqueeze(1).expand(-1, op.channels, -1, -1)
    return lum if op.slot is None else torch.where(batch.flag(op.col("apply")), lum, x)


@kernel(PixelOp)
def _pixel_op(x: torch.Tensor, op: PixelOp, batch: Batch) -> torch.Tensor:
    xi = x.to(torch.int32)
    y = {"invert": lambda: 255 - xi, "solarize": lambda: torch.where(xi >= op.arg, 255 - xi, xi),
         "posterize": lambda: xi & op.arg}[op.kind]()
    return torch.where(batch.flag(op.col("apply")), y.to(torch.float32), x)
