"""The Triton kernel of one policy operation per sample on PIL images (fused_color.py launches it)."""
import triton
import triton.language as tl

from dali_autoproxy.backends.torch_stage._triton_color import _blend, _load_rgb, _luma, _offset, _store_rgb

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
