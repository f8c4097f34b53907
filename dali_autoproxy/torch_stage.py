"""The end of a plan run as batched torch ops on DALI's output, on the same device.

Pillow's colour maths (ColorJitter above all) is dozens of small steps: as DALI operators each is
a separate operator with its own scheduling, and a batch pays for all of them (measured on the
H200: the heavy augmentation chain at 1,800 images/s, against 11,800 for DALI's own approximate
color_twist). As torch ops on one [B, C, H, W] batch they take ~5 ms per 128 images. So when a
plan holds a ColorJitter, DALI decodes, crops and resizes, and from the ColorJitter on the ops
run here. Rotations and affine warps too: Pillow samples them in 16.16 fixed point, which
integer torch ops reproduce exactly and DALI's float warp does not. Here: Pillow's arithmetic
(exact), torchvision's own kernels for blur and normalisation, per-sample params from the worker.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple, Union

import torch
import torch.nn.functional as nnf

from .ir import (AUGMENT_OPS, PERSPECTIVE_IDENTITY, Augment, Blur, ColorJitter, Erase, Flip, Grayscale, Normalize,
                 Perspective, PixelOp, TensorColorJitter, ToCHW, ToFloat, Warp)

TORCH_OPS = (ColorJitter, TensorColorJitter, Warp, Perspective, Augment, Grayscale, PixelOp, Blur, Flip, ToFloat,
             Normalize, ToCHW, Erase)
# what DALI does slowly (jitter) or not exactly (warps, policies, torchvision's tensor kernels)
TAKES_OVER_AT = (ColorJitter, TensorColorJitter, Warp, Perspective, Augment)
ONLY_HERE = TAKES_OVER_AT  # needed in DALI: the plan stays in the worker


def split(ops: Sequence[object]) -> Tuple[List[object], List[object]]:
    """(DALI's ops, torch's ops): torch takes over at the first op of TAKES_OVER_AT when it can
    run everything from there on (and the per-pixel ops just before it)."""
    for k, op in enumerate(ops):
        if isinstance(op, TAKES_OVER_AT):
            if all(isinstance(o, TORCH_OPS) for o in ops[k:]):
                while k > 0 and isinstance(ops[k - 1], TORCH_OPS):
                    k -= 1  # the stage also takes what precedes it, so DALI hands over uint8 pixels
                return list(ops[:k]), list(ops[k:])
            break
    return list(ops), []


def _per_sample(col: torch.Tensor) -> torch.Tensor:
    return col.view(-1, 1, 1)


def upload(values, device: torch.device, dtype=None) -> torch.Tensor:
    """Host numbers onto ``device`` without stopping the host: through pinned memory, queued on
    the current stream. (A pageable copy waits for all queued GPU work, and the stage makes a
    few per batch: every one of them would serialise the main thread with the GPU.)"""
    import numpy as np
    t = torch.as_tensor(np.asarray(values), dtype=dtype)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


_CONSTANTS: dict = {}


def constant(values: Sequence[float], device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """A small per-channel constant (mean, std, fill) as [1, C, 1, 1], uploaded once per device."""
    key = (tuple(values), str(device), dtype)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(list(values), dtype=dtype).view(1, -1, 1, 1).to(device)
    return _CONSTANTS[key]


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
        _HUE_TABLES[key] = (to_hs, to_rgb)
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
    import numpy as np
    order = np.minimum(host[:, op.slot:op.slot + 4].astype(np.int64), 4)  # 4: RandomApply's "skip"
    enabled = np.append(np.asarray(op.enabled, dtype=bool), False)
    is_blend = (order < 3) & enabled[order]
    is_hue = (order == 3) & enabled[order]
    blends_before = np.cumsum(is_blend, axis=1) - is_blend  # at each position of the order
    steps = np.full((len(order), 3), -1, dtype=np.int64)  # -1: nothing (identity)
    rows, cols = np.nonzero(is_blend)
    steps[rows, blends_before[rows, cols]] = order[rows, cols]
    # hue after this many blends; -1: none
    hue_after = np.where(is_hue.any(1), (blends_before * is_hue).sum(1), -1)
    factors = params[:, op.slot + 4:op.slot + 7].to(torch.float32)
    shift = params[:, op.slot + 7]
    x = x.contiguous()  # written in place below (a copy only if it is a broadcast view)
    for k in range(4):
        due = np.flatnonzero(hue_after == k)
        if len(due):
            idx = upload(due, x.device)
            x.index_copy_(0, idx, shift_hue(x.index_select(0, idx), shift.index_select(0, idx)))
        if k < 3 and (steps[:, k] >= 0).any():
            x = _blend_step(x, steps[:, k], factors)
    return x


def _blend_step(x: torch.Tensor, which, factors: torch.Tensor) -> torch.Tensor:
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


def gaussian_blur(x: torch.Tensor, op: Blur, params: torch.Tensor) -> torch.Tensor:
    """torchvision's gaussian_blur with a per-sample sigma: its 2-D kernel, reflect padding,
    float32 convolution, rounding for integer images."""
    b, c, h, w = x.shape
    kh, kw = op.kernel

    def kernel1d(size: int, sigma: torch.Tensor) -> torch.Tensor:
        half = (size - 1) * 0.5
        pts = torch.linspace(-half, half, steps=size, device=x.device)
        pdf = torch.exp(-0.5 * (pts[None, :] / sigma[:, None].to(torch.float32)).pow(2))
        return pdf / pdf.sum(1, keepdim=True)
    ky, kx = kernel1d(kh, params[:, op.slot]), kernel1d(kw, params[:, op.slot + 1])
    weight = (ky[:, :, None] * kx[:, None, :]).repeat_interleave(c, 0).unsqueeze(1)
    padded = nnf.pad(x.reshape(1, b * c, h, w), [kw // 2, kw // 2, kh // 2, kh // 2], mode="reflect")
    return nnf.conv2d(padded, weight, groups=b * c).reshape(b, c, h, w)


def _coord(v):
    """Pillow's COORD: -1 below zero, else truncation."""
    import numpy as np
    return np.where(v < 0, -1, v.astype(np.int64))


def warp(x: torch.Tensor, matrices, fill: Sequence[float]) -> torch.Tensor:
    """Pillow's nearest-neighbour ImagingTransformAffine with one inverse matrix per sample
    (host float64 [B, 6]): its scale-only path (double accumulation, tabulated on the host)
    or its 16.16 fixed-point path (integers, exact on the device); outside: ``fill``. The host
    part is vectorised over the batch with the C's operation order (accumulate is sequential)."""
    import numpy as np
    b, c, h, w = x.shape
    a = np.asarray(matrices, dtype=np.float64).reshape(b, 6)
    a0, a1, a2, a3, a4, a5 = (a[:, k:k + 1] for k in range(6))
    is_fixed = ~((a[:, 1] == 0) & (a[:, 3] == 0))  # else ImagingScaleAffine
    xs = _coord(np.add.accumulate(np.concatenate([a2 + a0 * 0.5, np.repeat(a0, w - 1, 1)], 1), axis=1))
    ys = _coord(np.add.accumulate(np.concatenate([a5 + a4 * 0.5, np.repeat(a4, h - 1, 1)], 1), axis=1))
    px, py = np.array([[0.0, w, 0.0, w]]), np.array([[0.0, h, h, 0.0]])  # the corners Pillow checks
    in_range = (np.abs(px * a0 + py * a1 + a2) < 32768.0) & (np.abs(px * a3 + py * a4 + a5) < 32768.0)
    if not in_range[is_fixed].all():
        raise ValueError("affine matrix outside Pillow's fixed-point range")  # replayed by PIL
    fixed = np.floor(np.concatenate([a0, a1, a2 + a0 * 0.5 + a1 * 0.5, a3, a4, a5 + a3 * 0.5 + a4 * 0.5], 1)
                     * 65536.0 + 0.5)
    fixed = np.where(is_fixed[:, None], fixed, 0).astype(np.int64)
    dev = x.device
    f = upload(fixed, dev).view(b, 6, 1, 1)
    row = torch.arange(h, device=dev, dtype=torch.int64).view(1, h, 1)
    col = torch.arange(w, device=dev, dtype=torch.int64).view(1, 1, w)
    xin = (f[:, 2] + row * f[:, 1] + col * f[:, 0]) >> 16
    yin = (f[:, 5] + row * f[:, 4] + col * f[:, 3]) >> 16
    if not is_fixed.all():
        scale_only = upload(~is_fixed, dev).view(b, 1, 1)
        xin = torch.where(scale_only, upload(xs, dev).view(b, 1, w), xin)
        yin = torch.where(scale_only, upload(ys, dev).view(b, h, 1), yin)
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    index = (yin.clamp(0, h - 1) * w + xin.clamp(0, w - 1)).view(b, 1, h * w).expand(b, c, h * w)
    out = x.reshape(b, c, h * w).gather(2, index).view(b, c, h, w)
    return torch.where(inside.unsqueeze(1), out, constant(fill, dev, x.dtype))


def perspective(x: torch.Tensor, coeffs, fill: Sequence[float], bilinear: bool) -> torch.Tensor:
    """Pillow's ImagingGenericTransform with perspective_transform (host float64 [B, 8]) and its
    nearest (COORD) or bilinear_filter32RGB sampler, in float64 with the C's operation order:
    every product and sum is its own torch op, so nothing is fused and each rounds as the C's
    does. Samples whose coefficients are the identity (not drawn) are left alone."""
    import numpy as np
    coeffs = np.asarray(coeffs, dtype=np.float64)
    todo = np.flatnonzero(~np.all(coeffs == np.asarray(PERSPECTIVE_IDENTITY), axis=1))
    if not len(todo):
        return x
    x = x.contiguous()  # written back in place
    dev = x.device
    idx = upload(todo, dev)
    src = x.index_select(0, idx).to(torch.float64)
    n, c, h, w = src.shape
    a = upload(coeffs[todo], dev).view(n, 8, 1, 1).unbind(1)
    col = (torch.arange(w, device=dev, dtype=torch.float64) + 0.5).view(1, 1, w)
    row = (torch.arange(h, device=dev, dtype=torch.float64) + 0.5).view(1, h, 1)
    den = a[6] * col + a[7] * row + 1
    xin = (a[0] * col + a[1] * row + a[2]) / den
    yin = (a[3] * col + a[4] * row + a[5]) / den
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)  # also false for NaN
    flat = src.reshape(n, c, h * w)

    def tap(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        index = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).view(n, 1, h * w).expand(n, c, h * w)
        return flat.gather(2, index).view(n, c, h, w)
    xin, yin = torch.where(inside, xin, 0.5), torch.where(inside, yin, 0.5)
    if not bilinear:
        out = tap(yin.to(torch.int64), xin.to(torch.int64))  # COORD: truncation (>= 0 here)
    else:
        xs, ys = xin - 0.5, yin - 0.5
        fx, fy = torch.floor(xs), torch.floor(ys)
        dx, dy = (xs - fx).unsqueeze(1), (ys - fy).unsqueeze(1)
        ix, iy = fx.to(torch.int64), fy.to(torch.int64)
        top_l, top_r = tap(iy, ix), tap(iy, ix + 1)
        v1 = top_l + (top_r - top_l) * dx
        bot_l, bot_r = tap(iy + 1, ix), tap(iy + 1, ix + 1)
        v2 = torch.where(((iy + 1) < h).unsqueeze(1), bot_l + (bot_r - bot_l) * dx, v1)
        out = torch.trunc(v1 + (v2 - v1) * dy)
    out = torch.where(inside.unsqueeze(1), out, constant(fill, dev, torch.float64))
    x.index_copy_(0, idx, out.to(x.dtype))
    return x


def smooth(x: torch.Tensor) -> torch.Tensor:
    """Pillow's ImageFilter.SMOOTH (3x3, 1 1 1 / 1 5 1 / 1 1 1, divided by 13 in float32,
    rows summed bottom to top, rounded half up; the border pixels are copied)."""
    k1, k5 = float(torch.tensor(1.0) / 13.0), float(torch.tensor(5.0) / 13.0)  # float32, as Pillow's normkernel

    def row(r, weight_mid):
        return (r[..., :-2] * k1 + r[..., 1:-1] * weight_mid) + r[..., 2:] * k1
    below, mid, above = x[:, :, 2:, :], x[:, :, 1:-1, :], x[:, :, :-2, :]
    ss = torch.zeros_like(mid[..., 1:-1])
    ss = ss + row(below, k1)
    ss = ss + row(mid, k5)
    ss = ss + row(above, k1)
    inner = torch.where(ss <= 0, 0.0, torch.where(ss >= 255, 255.0, torch.floor(ss + 0.5)))
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = inner
    return out


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


_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
_BLENDS = {"Brightness": 0, "Contrast": 1, "Color": 2}  # _blend_step's codes


def _policy_matrix(name: str, v: float, w: int, h: int) -> List[float]:
    """The inverse matrix torchvision's _apply_op hands to Pillow for a geometric operation."""
    from torchvision.transforms.functional import _get_inverse_affine_matrix
    from .translate.affine import rotation_matrix
    if name == "Rotate":
        return rotation_matrix(v, w, h, None)
    shear = [math.degrees(math.atan(v)), 0.0] if name == "ShearX" else \
        [0.0, math.degrees(math.atan(v))] if name == "ShearY" else [0.0, 0.0]
    translate = [int(v), 0] if name == "TranslateX" else [0, int(v)] if name == "TranslateY" else [0, 0]
    center = [0, 0] if name.startswith("Shear") else [w * 0.5, h * 0.5]
    return list(_get_inverse_affine_matrix(center, 0.0, translate, 1.0, shear))


def augment(x: torch.Tensor, op: Augment, host) -> torch.Tensor:
    """One policy operation per sample (torchvision's _apply_op on PIL images). Samples are
    grouped by kernel: every geometric operation is one warp (a matrix per sample), the three
    blends one blend pass, the others a group each; a group is gathered, computed and written
    back. Few groups matter: the stage runs on the main thread, and each costs launches."""
    import numpy as np
    codes = host[:, op.slot].astype(np.int64)
    mags = host[:, op.slot + 1].astype(np.float64)
    names = [AUGMENT_OPS[c] for c in codes]
    h, w = x.shape[2], x.shape[3]
    groups: dict = {}
    for i, name in enumerate(names):
        if name != "Identity":
            key = "warp" if name in _GEOMETRIC else "blend" if name in _BLENDS else name
            groups.setdefault(key, []).append(i)
    x = x.contiguous()  # each group is written back in place
    for key, rows in groups.items():
        idx = upload(rows, x.device)
        sub, m = x.index_select(0, idx), mags[rows]
        if key == "warp":
            sub = warp(sub, [_policy_matrix(names[i], mags[i], w, h) for i in rows], op.fill)
        elif key == "blend":
            which = np.array([_BLENDS[names[i]] for i in rows])
            factors = np.ones((len(rows), 3), dtype=np.float32)
            factors[np.arange(len(rows)), which] = 1.0 + m
            sub = _blend_step(sub, which, upload(factors, x.device))
        elif key == "Sharpness":
            factor = upload(1.0 + m, x.device, torch.float32).view(-1, 1, 1, 1)
            sub = blend(smooth(sub), sub, factor)
        elif key == "Posterize":
            masks = upload([(0xFF << (8 - int(v))) & 0xFF for v in m], x.device).view(-1, 1, 1, 1)
            sub = (sub.to(torch.int64) & masks).to(x.dtype)
        elif key == "Solarize":
            thr = upload(m, x.device).view(-1, 1, 1, 1)
            sub = torch.where(sub.to(torch.float64) >= thr, 255 - sub, sub)
        elif key == "AutoContrast":
            sub = autocontrast(sub)
        elif key == "Equalize":
            sub = equalize(sub)
        elif key == "Invert":
            sub = 255 - sub
        x.index_copy_(0, idx, sub)
    return x


def _require(module, *names: str) -> None:
    """Raise AttributeError now (at translation) if torchvision renamed a private kernel."""
    for name in names:
        getattr(module, name)


def _tensor_jitter_kernels(api: str):
    """torchvision's tensor ColorJitter kernels (v1 or v2) rewritten for a batch with one factor
    per sample: the same torch calls on the same dtypes, the factor a per-sample float32 tensor
    where torchvision passes a Python float (which it casts to float32). Where torchvision
    uses ``add_(other, alpha=...)`` (one fused multiply-add on both CPU and GPU) the product
    and sum are taken in float64 and rounded once, which is that fused result."""
    if api == "v2":
        from torchvision.transforms.v2.functional import _color as C
        from torchvision.transforms.v2.functional import to_dtype_image

        def gray(img):
            g = C._rgb_to_grayscale_image(img, num_output_channels=1, preserve_dtype=False)
            return g if img.is_floating_point() else g.floor_()

        def mix(img1, img2, ratio):  # v2's _blend: img1 * r + img2 * (1 - r), fused
            out = (img2.double() * (1.0 - ratio).float().double() + img1.mul(ratio.float()).double()).float()
            out = out.clamp_(0, 1.0 if img1.is_floating_point() else 255)
            return out if img1.is_floating_point() else out.to(img1.dtype)

        def brightness(img, f):
            out = img.mul(f.float()).clamp_(0, 1.0 if img.is_floating_point() else 255)
            return out if img.is_floating_point() else out.to(img.dtype)

        def hue(img, f):
            x = to_dtype_image(img, torch.float32, scale=True)
            h, sat, v = C._rgb_to_hsv(x).unbind(dim=-3)
            h = h.add(f.float().view(-1, 1, 1)).remainder_(1.0)
            return to_dtype_image(C._hsv_to_rgb(torch.stack((h, sat, v), dim=-3)), img.dtype, scale=True)
        contrast_gray = gray
        _require(C, "_rgb_to_grayscale_image", "_rgb_to_hsv", "_hsv_to_rgb")
    else:
        from torchvision.transforms import _functional_tensor as C

        def gray(img):
            return C.rgb_to_grayscale(img)

        def contrast_gray(img):
            return gray(img).to(img.dtype if img.is_floating_point() else torch.float32)

        def mix(img1, img2, ratio):  # v1's _blend: ratio * img1 + (1 - ratio) * img2
            bound = 1.0 if img1.is_floating_point() else 255
            return (img1 * ratio.float() + (1.0 - ratio).float() * img2).clamp(0, bound).to(img1.dtype)

        def brightness(img, f):
            return mix(img, torch.zeros_like(img), f)

        def hue(img, f):
            x = C.convert_image_dtype(img, torch.float32)
            h, sat, v = C._rgb2hsv(x).unbind(dim=-3)
            h = (h + f.float().view(-1, 1, 1)) % 1.0
            return C.convert_image_dtype(C._hsv2rgb(torch.stack((h, sat, v), dim=-3)), img.dtype)
        _require(C, "rgb_to_grayscale", "convert_image_dtype", "_rgb2hsv", "_hsv2rgb")

    def contrast(img, f):
        return mix(img, torch.mean(contrast_gray(img), dim=(-3, -2, -1), keepdim=True), f)

    def saturation(img, f):
        return mix(img, gray(img), f)
    return brightness, contrast, saturation, hue


def tensor_color_jitter(x: torch.Tensor, op: TensorColorJitter, host, integer: bool) -> torch.Tensor:
    """torchvision's tensor ColorJitter with each sample's own factors and order: at each of the
    four positions of the order, the samples that apply the same adjustment there are computed
    together (torchvision's kernels, batched: _tensor_jitter_kernels)."""
    import numpy as np
    kernels = _tensor_jitter_kernels(op.api)
    order = np.minimum(host[:, op.slot:op.slot + 4].astype(np.int64), 4)  # 4: RandomApply's "skip"
    factors = torch.as_tensor(np.asarray(host[:, op.slot + 4:op.slot + 8], dtype=np.float64))
    x = x.contiguous()  # written back in place
    for k in range(4):
        for which in range(4):
            rows = np.flatnonzero(order[:, k] == which)
            if not len(rows) or not op.enabled[which]:
                continue
            idx = upload(rows, x.device)
            sub = x.index_select(0, idx)
            img = sub.to(torch.uint8) if integer else sub
            f = upload(factors[rows, which], x.device).view(-1, 1, 1, 1)
            x.index_copy_(0, idx, kernels[which](img, f).to(x.dtype))
    return x


def erase(x: torch.Tensor, op: Erase, params: torch.Tensor) -> torch.Tensor:
    top, left, hh, ww = (params[:, op.slot + k].view(-1, 1, 1, 1) for k in range(4))
    rows = torch.arange(x.shape[2], device=x.device, dtype=params.dtype).view(1, 1, -1, 1)
    cols = torch.arange(x.shape[3], device=x.device, dtype=params.dtype).view(1, 1, 1, -1)
    inside = (rows >= top) & (rows < top + hh) & (cols >= left) & (cols < left + ww)
    return torch.where(inside, constant(op.value, x.device, x.dtype), x)


class TorchStage:
    """Runs ``ops`` on a batch DALI produced: uint8 [B, H, W, C] (or a list of [H, W, C])."""

    def __init__(self, ops: Sequence[object]):
        self.ops = list(ops)

    def __call__(self, out: Union[torch.Tensor, List[torch.Tensor]], params) -> Union[torch.Tensor, List[torch.Tensor]]:
        if isinstance(out, list):  # sizes differ: one sample at a time
            return [self(o.unsqueeze(0), params[k:k + 1]).squeeze(0) for k, o in enumerate(out)]
        import numpy as np
        host = np.asarray(params)
        p = upload(host, out.device)
        x = out.permute(0, 3, 1, 2)
        integer = True  # the values are whole numbers 0..255 (uint8 semantics)
        x = x.to(torch.float32)
        for op in self.ops:
            if isinstance(op, ColorJitter):
                x = color_jitter(x, op, p, host)
            elif isinstance(op, TensorColorJitter):
                x = tensor_color_jitter(x, op, host, integer)
            elif isinstance(op, Warp):
                x = warp(x, host[:, op.slot:op.slot + 6], op.fill)
            elif isinstance(op, Perspective):
                x = perspective(x, host[:, op.slot:op.slot + 8], op.fill, op.bilinear)
            elif isinstance(op, Augment):
                x = augment(x, op, host)
            elif isinstance(op, Grayscale):
                lum = luma(x).unsqueeze(1).expand(-1, op.channels, -1, -1)
                x = lum if op.slot is None else torch.where(_flag(p, op.slot), lum, x)
            elif isinstance(op, PixelOp):
                xi = x.to(torch.int32)
                y = {"invert": lambda: 255 - xi, "solarize": lambda: torch.where(xi >= op.arg, 255 - xi, xi),
                     "posterize": lambda: xi & op.arg}[op.kind]()
                x = torch.where(_flag(p, op.slot), y.to(torch.float32), x)
            elif isinstance(op, Flip):
                x = torch.where(_flag(p, op.slot), x.flip(2 if op.vertical else 3), x)
            elif isinstance(op, Blur):
                x = gaussian_blur(x, op, p)
                if integer:
                    x = torch.round(x)
            elif isinstance(op, ToFloat):
                x = x / round(1 / op.scale) if op.divide else x * op.scale
                integer = False
            elif isinstance(op, Normalize):
                x = (x - constant(op.mean, x.device)) / constant(op.std, x.device)
            elif isinstance(op, Erase):
                x = erase(x, op, p)
        return x.to(torch.uint8).contiguous() if integer else x.contiguous()


def _flag(p: torch.Tensor, slot: int) -> torch.Tensor:
    return (p[:, slot] != 0).view(-1, 1, 1, 1)
