"""The Triton kernels of ``fused_color`` (imported only where Triton is; see there)."""
import triton
import triton.language as tl


@triton.jit
def _load_rgb(ptr, off, s_c, m):
    """The three channels at element offsets ``off`` (channel stride ``s_c``)."""
    r = tl.load(ptr + off, mask=m, other=0.0)
    g = tl.load(ptr + s_c + off, mask=m, other=0.0)
    b = tl.load(ptr + 2 * s_c + off, mask=m, other=0.0)
    return r, g, b


@triton.jit
def _store_rgb(img, p, m, HW, r, g, b):
    """The three channels of a contiguous [3, H, W] sample at pixels ``p``."""
    tl.store(img + p, r, mask=m)
    tl.store(img + HW + p, g, mask=m)
    tl.store(img + 2 * HW + p, b, mask=m)


@triton.jit
def _offset(p, W, s_h, s_w):
    """Element offsets of pixels ``p`` (row-major indices) in a strided image."""
    return (p // W) * s_h + (p % W) * s_w


@triton.jit
def _copy_sample(src_n, img, W, HW, s_c, s_h, s_w, BLOCK: tl.constexpr):
    """A strided [3, H, W] sample copied into its contiguous slot of the output."""
    for start in range(0, HW, BLOCK):
        p = start + tl.arange(0, BLOCK)
        m = p < HW
        off = _offset(p, W, s_h, s_w)
        for ch in tl.static_range(3):
            tl.store(img + ch * HW + p, tl.load(src_n + ch * s_c + off, mask=m), mask=m)


@triton.jit
def _luma(r, g, b):
    # Pillow's L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16, in integers
    return (r.to(tl.int32) * 19595 + g.to(tl.int32) * 38470 + b.to(tl.int32) * 7471 + 32768) >> 16


@triton.jit
def _blend(d, f, v):
    # Image.blend in float32: d + f * (v - d), truncated, clipped (no FMA: see the launch)
    return tl.minimum(tl.maximum(tl.floor(d + f * (v - d)), 0.0), 255.0)


@triton.jit
def _blend_pass(img, d, f, HW, BLOCK: tl.constexpr):
    for start in range(0, HW, BLOCK):
        p = start + tl.arange(0, BLOCK)
        m = p < HW
        r, g, b = _load_rgb(img, p, HW, m)
        _store_rgb(img, p, m, HW, _blend(d, f, r), _blend(d, f, g), _blend(d, f, b))


@triton.jit
def jitter(src, dst, order_ptr, factor_ptr, shift_ptr, to_hs, to_rgb,
           W, HW, s_b, s_c, s_h, s_w, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    src_n = src + n * s_b
    img = dst + n * 3 * HW
    _copy_sample(src_n, img, W, HW, s_c, s_h, s_w, BLOCK)
    tl.debug_barrier()
    for pos in tl.static_range(4):
        step = tl.load(order_ptr + n * 4 + pos)
        if step == 3:  # hue: RGB -> Pillow's H*256+S, H shifted, -> RGB (two gathers)
            shift = tl.load(shift_ptr + n)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                ri, gi, bi = r.to(tl.int32), g.to(tl.int32), b.to(tl.int32)
                hs = tl.load(to_hs + ((ri << 16) | (gi << 8) | bi), mask=m, other=0).to(tl.int32)
                v = tl.maximum(ri, tl.maximum(gi, bi))
                hue = ((hs >> 8) + shift) & 255
                at = (((hue << 16) | ((hs & 255) << 8) | v).to(tl.int64)) * 3
                for ch in tl.static_range(3):
                    y = tl.load(to_rgb + at + ch, mask=m, other=0).to(tl.float32)
                    tl.store(img + ch * HW + p, y, mask=m)
        elif step == 2:  # saturation: blend with the pixel's luma
            f = tl.load(factor_ptr + n * 3 + 2)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                d = _luma(r, g, b).to(tl.float32)
                _store_rgb(img, p, m, HW, _blend(d, f, r), _blend(d, f, g), _blend(d, f, b))
        elif step == 1:  # contrast: a pass for the mean luma, then blend with it
            total = tl.zeros((), dtype=tl.int64)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                total += tl.sum(tl.where(m, _luma(r, g, b), 0).to(tl.int64), axis=0)
            mean = ((total * 2 + HW) // (HW * 2)).to(tl.float32)  # int(mean + 0.5)
            _blend_pass(img, mean, tl.load(factor_ptr + n * 3 + 1), HW, BLOCK)
        elif step == 0:  # brightness: blend with black
            _blend_pass(img, 0.0, tl.load(factor_ptr + n * 3), HW, BLOCK)
        tl.debug_barrier()


# ---------------------------------------------------------------------------------------------
# torchvision v2's ColorJitter on uint8 tensor images (adjust_*_image): float32 steps as its
# torch calls take them, add_(x, alpha=a) as one fused multiply-add (as ATen computes it),
# divisions correctly rounded, results truncated to uint8 as .to(torch.uint8) does.

@triton.jit
def _to_u8(v):  # clamp_(0, 255) then .to(torch.uint8): truncation
    return tl.minimum(tl.maximum(v, 0.0), 255.0).to(tl.int32).to(tl.float32)


@triton.jit
def _fma(a, b, c):
    """a * b + c rounded once to float32, as ATen's add_(other, alpha) computes it: the float32
    product is exact in float64 (as the batched torch ops take it, in Triton's interpreter too)."""
    product = tl.cast(a, tl.float64) * tl.cast(tl.cast(b, tl.float32), tl.float64)
    return (product + tl.cast(c, tl.float64)).to(tl.float32)


@triton.jit
def _gray_v2(r, g, b):  # r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114), then floor_()
    return tl.floor(_fma(b, 0.114, _fma(g, 0.587, r * 0.2989)))


@triton.jit
def _mix_v2(v, other, ratio, alpha):  # v2's _blend: image1.mul(ratio).add_(image2, alpha=1 - ratio)
    return _to_u8(_fma(other, alpha, v * ratio))


@triton.jit
def _hue_v2(r8, g8, b8, hue):
    """adjust_hue_image on one pixel: to float (x * (1/255)), _rgb_to_hsv, h + hue mod 1,
    _hsv_to_rgb, back to uint8 (x * 255.999, truncated)."""
    scale = 0.00392156862745098  # 1.0 / 255
    r = r8 * scale
    g = g8 * scale
    b = b8 * scale
    maxc = tl.maximum(tl.maximum(r, g), b)
    minc = tl.minimum(tl.minimum(r, g), b)
    eqc = maxc == minc
    cr = maxc - minc
    s = tl.math.div_rn(cr, tl.where(eqc, 1.0, maxc))
    div = tl.where(eqc, 1.0, cr)
    rc = tl.math.div_rn(maxc - r, div)
    gc = tl.math.div_rn(maxc - g, div)
    bc = tl.math.div_rn(maxc - b, div)
    neq_r = maxc != r
    eq_g = maxc == g
    hg = ((rc + 2.0) - bc) * (eq_g & neq_r).to(tl.float32)
    hr = (bc - gc) * (neq_r == 0).to(tl.float32)
    hb = ((gc + 4.0) - rc) * (neq_r & (eq_g == 0)).to(tl.float32)
    h = ((hr + hg + hb) * 0.16666666666666666 + 1.0) % 1.0
    h = (h + hue) % 1.0  # remainder_(1.0)
    h = tl.where((h != 0.0) & (h < 0.0), h + 1.0, h)
    h6 = h * 6.0
    sector = tl.floor(h6)
    f = h6 - sector
    i = sector.to(tl.int32) % 6
    i = tl.where(i < 0, i + 6, i)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = tl.minimum(tl.maximum((1.0 - sxf) * maxc, 0.0), 1.0)
    t = tl.minimum(tl.maximum((sxf + one_minus_s) * maxc, 0.0), 1.0)
    p = tl.minimum(tl.maximum(one_minus_s * maxc, 0.0), 1.0)
    v = maxc
    ro = tl.where(i == 0, v, tl.where(i == 1, q, tl.where((i == 2) | (i == 3), p, tl.where(i == 4, t, v))))
    go = tl.where(i == 0, t, tl.where((i == 1) | (i == 2), v, tl.where(i == 3, q, p)))
    bo = tl.where((i == 0) | (i == 1), p, tl.where(i == 2, t, tl.where((i == 3) | (i == 4), v, q)))
    up = 255.999
    return (ro * up).to(tl.int32).to(tl.float32), (go * up).to(tl.int32).to(tl.float32), \
        (bo * up).to(tl.int32).to(tl.float32)


@triton.jit
def tensor_jitter_v2(src, dst, order_ptr, factor_ptr, alpha_ptr, W, HW, s_b, s_c, s_h, s_w,
                     MEAN_BY_DIVISION: tl.constexpr, BLOCK: tl.constexpr):
    """One program per sample; factors [B, 4] (float32: brightness, contrast, saturation, hue),
    alphas [B, 2] (float32 of 1 - ratio in float64: contrast, saturation). torch.mean of the
    floored grey: a sum of whole numbers (exact below 2**24, which the caller ensures), then
    divided by N (CPU) or times 1/N (CUDA), in float32."""
    n = tl.program_id(0).to(tl.int64)
    src_n = src + n * s_b
    img = dst + n * 3 * HW
    _copy_sample(src_n, img, W, HW, s_c, s_h, s_w, BLOCK)
    tl.debug_barrier()
    for pos in tl.static_range(4):
        step = tl.load(order_ptr + n * 4 + pos)
        if step == 0:
            f = tl.load(factor_ptr + n * 4)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                _store_rgb(img, p, m, HW, _to_u8(r * f), _to_u8(g * f), _to_u8(b * f))
        elif step == 1:
            total = tl.zeros((), dtype=tl.float64)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                total += tl.sum(tl.where(m, _gray_v2(r, g, b), 0.0).to(tl.float64), axis=0)
            count = HW.to(tl.float32)
            if MEAN_BY_DIVISION:  # the CPU's mean: sum, then div_(N)
                mean = tl.math.div_rn(total.to(tl.float32), count)
            else:  # CUDA's: sum times the factor 1/N
                mean = total.to(tl.float32) * tl.math.div_rn(1.0, count)
            _mix_v2_pass(img, mean, tl.load(factor_ptr + n * 4 + 1), tl.load(alpha_ptr + n * 2), HW, BLOCK)
        elif step == 2:
            ratio = tl.load(factor_ptr + n * 4 + 2)
            alpha = tl.load(alpha_ptr + n * 2 + 1)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                gray = _gray_v2(r, g, b)
                _store_rgb(img, p, m, HW, _mix_v2(r, gray, ratio, alpha), _mix_v2(g, gray, ratio, alpha),
                           _mix_v2(b, gray, ratio, alpha))
        elif step == 3:
            hue = tl.load(factor_ptr + n * 4 + 3)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(img, p, HW, m)
                ro, go, bo = _hue_v2(r, g, b, hue)
                _store_rgb(img, p, m, HW, ro, go, bo)
        tl.debug_barrier()


@triton.jit
def _mix_v2_pass(img, other, ratio, alpha, HW, BLOCK: tl.constexpr):
    for start in range(0, HW, BLOCK):
        p = start + tl.arange(0, BLOCK)
        m = p < HW
        r, g, b = _load_rgb(img, p, HW, m)
        _store_rgb(img, p, m, HW, _mix_v2(r, other, ratio, alpha), _mix_v2(g, other, ratio, alpha),
                   _mix_v2(b, other, ratio, alpha))


# ---------------------------------------------------------------------------------------------
# One policy operation per sample on PIL images (TrivialAugmentWide, RandAugment, AutoAugment):
# the arithmetic of policies.py / color.py / filters.py / geometry.py, one program per sample.

AUG_KINDS = ("copy", "warp_fixed", "warp_scale", "brightness", "contrast", "color", "sharpness", "posterize",
             "solarize", "autocontrast", "equalize", "invert", "warp_bilinear")  # the host's codes, by index
AUG_WARP_FIXED, AUG_WARP_SCALE, AUG_BRIGHTNESS, AUG_CONTRAST, AUG_COLOR, AUG_SHARPNESS, AUG_POSTERIZE, \
    AUG_SOLARIZE, AUG_AUTOCONTRAST, AUG_EQUALIZE, AUG_INVERT, AUG_WARP_BILINEAR = \
    (tl.constexpr(k) for k in range(1, len(AUG_KINDS)))


@triton.jit
def _smooth_row(src, off, m, s_w, weight_mid, k1):  # (r[x-1] * k1 + r[x] * mid) + r[x+1] * k1
    left = tl.load(src + off - s_w, mask=m, other=0.0)
    right = tl.load(src + off + s_w, mask=m, other=0.0)
    return (left * k1 + tl.load(src + off, mask=m, other=0.0) * weight_mid) + right * k1


@triton.jit
def _sharpen(src, off, inner, s_h, s_w, v, f, k1, k5):
    """blend(smooth(x), x, f): Pillow's SMOOTH (rows below, centre, above, rounded half up; the
    border copied) as the degenerate image."""
    ss = _smooth_row(src, off + s_h, inner, s_w, k1, k1)  # border lanes read nothing and keep v
    ss = ss + _smooth_row(src, off, inner, s_w, k5, k1)
    ss = ss + _smooth_row(src, off - s_h, inner, s_w, k1, k1)
    smooth = tl.where(ss <= 0.0, 0.0, tl.where(ss >= 255.0, 255.0, tl.floor(ss + 0.5)))
    return _blend(tl.where(inner, smooth, v), f, v)


@triton.jit
def augment_pil(src, dst, kind_ptr, fparam_ptr, iparam_ptr, fixed_ptr, xs_ptr, ys_ptr, coef_ptr, lut_ptr, fill_ptr,
                W, H, HW, s_b, s_c, s_h, s_w, k1, k5, BLOCK: tl.constexpr):
    """dst[n] = the operation ``kind`` of sample n on src[n]: fparam is the blend or sharpness
    factor or the solarize threshold, iparam the posterize mask, fixed the 16.16 affine matrix,
    xs/ys the scale-only path's tables, coef the float64 affine matrix of a bilinear warp, lut a
    scratch [B, 3, 256] for equalize."""
    n = tl.program_id(0).to(tl.int64)
    src_n = src + n * s_b
    img = dst + n * 3 * HW
    kind = tl.load(kind_ptr + n)
    if (kind == AUG_WARP_FIXED) | (kind == AUG_WARP_SCALE):
        f0 = tl.load(fixed_ptr + n * 6)
        f1 = tl.load(fixed_ptr + n * 6 + 1)
        f2 = tl.load(fixed_ptr + n * 6 + 2)
        f3 = tl.load(fixed_ptr + n * 6 + 3)
        f4 = tl.load(fixed_ptr + n * 6 + 4)
        f5 = tl.load(fixed_ptr + n * 6 + 5)
        fill_r = tl.load(fill_ptr)
        fill_g = tl.load(fill_ptr + 1)
        fill_b = tl.load(fill_ptr + 2)
        for start in range(0, HW, BLOCK):
            p = start + tl.arange(0, BLOCK)
            m = p < HW
            row = (p // W).to(tl.int64)
            col = (p % W).to(tl.int64)
            if kind == AUG_WARP_FIXED:
                xin = (f2 + row * f1 + col * f0) >> 16
                yin = (f5 + row * f4 + col * f3) >> 16
            else:
                xin = tl.load(xs_ptr + n * W + col, mask=m, other=0).to(tl.int64)
                yin = tl.load(ys_ptr + n * H + row, mask=m, other=0).to(tl.int64)
            inside = (xin >= 0) & (xin < W) & (yin >= 0) & (yin < H)
            off = tl.where(inside, yin, 0) * s_h + tl.where(inside, xin, 0) * s_w
            r, g, b = _load_rgb(src_n, off, s_c, m & inside)
            _store_rgb(img, p, m, HW, tl.where(inside, r, fill_r), tl.where(inside, g, fill_g),
                       tl.where(inside, b, fill_b))
    elif kind == AUG_WARP_BILINEAR:  # geometry.perspective with g = h = 0, in float64
        c0 = tl.load(coef_ptr + n * 6)
        c1 = tl.load(coef_ptr + n * 6 + 1)
        c2 = tl.load(coef_ptr + n * 6 + 2)
        c3 = tl.load(coef_ptr + n * 6 + 3)
        c4 = tl.load(coef_ptr + n * 6 + 4)
        c5 = tl.load(coef_ptr + n * 6 + 5)
        for start in range(0, HW, BLOCK):
            p = start + tl.arange(0, BLOCK)
            m = p < HW
            colf = (p % W).to(tl.float64) + 0.5
            rowf = (p // W).to(tl.float64) + 0.5
            xin = (c0 * colf + c1 * rowf) + c2  # divided by a denominator of exactly 1
            yin = (c3 * colf + c4 * rowf) + c5
            inside = (xin >= 0.0) & (xin < W) & (yin >= 0.0) & (yin < H)
            xs = tl.where(inside, xin, 0.5) - 0.5
            ys = tl.where(inside, yin, 0.5) - 0.5
            fx = tl.floor(xs)
            fy = tl.floor(ys)
            dx = xs - fx
            dy = ys - fy
            ix = fx.to(tl.int64)
            iy = fy.to(tl.int64)
            x0 = tl.minimum(tl.maximum(ix, 0), W - 1) * s_w
            x1 = tl.minimum(tl.maximum(ix + 1, 0), W - 1) * s_w
            y0 = tl.minimum(tl.maximum(iy, 0), H - 1) * s_h
            y1 = tl.minimum(tl.maximum(iy + 1, 0), H - 1) * s_h
            for ch in tl.static_range(3):
                base = src_n + ch * s_c
                top_l = tl.load(base + y0 + x0, mask=m, other=0.0).to(tl.float64)
                top_r = tl.load(base + y0 + x1, mask=m, other=0.0).to(tl.float64)
                bot_l = tl.load(base + y1 + x0, mask=m, other=0.0).to(tl.float64)
                bot_r = tl.load(base + y1 + x1, mask=m, other=0.0).to(tl.float64)
                v1 = top_l + (top_r - top_l) * dx
                v2 = tl.where(iy + 1 < H, bot_l + (bot_r - bot_l) * dx, v1)
                out = v1 + (v2 - v1) * dy
                out = tl.where(out < 0.0, tl.ceil(out), tl.floor(out))  # trunc
                fill = tl.load(fill_ptr + ch)
                tl.store(img + ch * HW + p, tl.where(inside, out.to(tl.float32), fill), mask=m)
    elif (kind == AUG_BRIGHTNESS) | (kind == AUG_CONTRAST) | (kind == AUG_COLOR):
        f = tl.load(fparam_ptr + n)
        mean = tl.zeros((), dtype=tl.float32)
        if kind == AUG_CONTRAST:
            total = tl.zeros((), dtype=tl.int64)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _load_rgb(src_n, _offset(p, W, s_h, s_w), s_c, m)
                total += tl.sum(tl.where(m, _luma(r, g, b), 0).to(tl.int64), axis=0)
            mean = ((total * 2 + HW) // (HW * 2)).to(tl.float32)
        for start in range(0, HW, BLOCK):
            p = start + tl.arange(0, BLOCK)
            m = p < HW
            r, g, b = _load_rgb(src_n, _offset(p, W, s_h, s_w), s_c, m)
            d = tl.where(kind == AUG_COLOR, _luma(r, g, b).to(tl.float32), mean)
            _store_rgb(img, p, m, HW, _blend(d, f, r), _blend(d, f, g), _blend(d, f, b))
    elif kind == AUG_SHARPNESS:
        f = tl.load(fparam_ptr + n)
        for start in range(0, HW, BLOCK):
            p = start + tl.arange(0, BLOCK)
            m = p < HW
            y = p // W
            x = p % W
            inner = m & (y >= 1) & (y <= H - 2) & (x >= 1) & (x <= W - 2)
            off = y * s_h + x * s_w
            for ch in tl.static_range(3):
                v = tl.load(src_n + ch * s_c + off, mask=m, other=0.0)
                tl.store(img + ch * HW + p, _sharpen(src_n + ch * s_c, off, inner, s_h, s_w, v, f, k1, k5), mask=m)
    elif kind == AUG_AUTOCONTRAST:
        for ch in tl.static_range(3):
            lo = tl.full((), 255.0, tl.float32)
            hi = tl.full((), 0.0, tl.float32)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                v = tl.load(src_n + ch * s_c + _offset(p, W, s_h, s_w), mask=m, other=0.0)
                lo = tl.minimum(lo, tl.min(tl.where(m, v, 255.0), axis=0))
                hi = tl.maximum(hi, tl.max(tl.where(m, v, 0.0), axis=0))
            lo64 = lo.to(tl.float64)
            hi64 = hi.to(tl.float64)
            flat = hi64 <= lo64
            scale = tl.full((), 255.0, tl.float64) / tl.where(flat, 1.0, hi64 - lo64)  # float64: correctly rounded
            offset = (-lo64) * scale
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                v = tl.load(src_n + ch * s_c + _offset(p, W, s_h, s_w), mask=m, other=0.0)
                yv = v.to(tl.float64) * scale + offset
                yv = tl.minimum(tl.maximum(tl.where(yv < 0.0, tl.ceil(yv), tl.floor(yv)), 0.0), 255.0)
                tl.store(img + ch * HW + p, tl.where(flat, v, yv.to(tl.float32)), mask=m)
    elif kind == AUG_EQUALIZE:
        levels = tl.arange(0, 256)
        for ch in tl.static_range(3):
            hist = tl.zeros((256,), dtype=tl.int32)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                v = tl.load(src_n + ch * s_c + _offset(p, W, s_h, s_w), mask=m, other=0.0)
                hist += tl.histogram(tl.where(m, v.to(tl.int32), 0), 256)
            padded = ((HW + BLOCK - 1) // BLOCK) * BLOCK - HW  # masked lanes counted as level 0
            hist = hist - tl.where(levels == 0, padded, 0).to(tl.int32)
            last = tl.max(tl.where(hist > 0, levels, -1), axis=0)
            top = tl.sum(tl.where(levels == last, hist, 0), axis=0)
            used = tl.sum((hist > 0).to(tl.int32), axis=0)
            step = (HW - top) // 255
            keep = (used <= 1) | (step == 0)
            safe = tl.where(keep, 1, step)
            before = tl.cumsum(hist, axis=0) - hist
            lut = tl.minimum((safe // 2 + before) // safe, 255)
            lut = tl.where(keep, levels, lut)
            tl.store(lut_ptr + (n * 3 + ch) * 256 + levels, lut)
            tl.debug_barrier()
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                v = tl.load(src_n + ch * s_c + _offset(p, W, s_h, s_w), mask=m, other=0.0)
                y = tl.load(lut_ptr + (n * 3 + ch) * 256 + v.to(tl.int32), mask=m, other=0)
                tl.store(img + ch * HW + p, y.to(tl.float32), mask=m)
    else:  # identity, posterize, solarize, invert: one pixel at a time
        mask_bits = tl.load(iparam_ptr + n)
        threshold = tl.load(fparam_ptr + n)
        for start in range(0, HW, BLOCK):
            p = start + tl.arange(0, BLOCK)
            m = p < HW
            off = _offset(p, W, s_h, s_w)
            for ch in tl.static_range(3):
                v = tl.load(src_n + ch * s_c + off, mask=m, other=0.0)
                if kind == AUG_POSTERIZE:
                    v = (v.to(tl.int32) & mask_bits).to(tl.float32)
                elif kind == AUG_SOLARIZE:
                    v = tl.where(v >= threshold, 255.0 - v, v)
                elif kind == AUG_INVERT:
                    v = 255.0 - v
                tl.store(img + ch * HW + p, v, mask=m)
