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
