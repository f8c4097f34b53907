"""The Triton kernels of ``fused_color`` (imported only where Triton is; see there)."""
import triton
import triton.language as tl


@triton.jit
def _rgb(ptr, p, m, HW):
    r = tl.load(ptr + p, mask=m, other=0.0)
    g = tl.load(ptr + HW + p, mask=m, other=0.0)
    b = tl.load(ptr + 2 * HW + p, mask=m, other=0.0)
    return r, g, b


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
        r, g, b = _rgb(img, p, m, HW)
        tl.store(img + p, _blend(d, f, r), mask=m)
        tl.store(img + HW + p, _blend(d, f, g), mask=m)
        tl.store(img + 2 * HW + p, _blend(d, f, b), mask=m)


@triton.jit
def jitter(src, dst, order_ptr, factor_ptr, shift_ptr, to_hs, to_rgb,
           W, HW, s_b, s_c, s_h, s_w, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    src_n = src + n * s_b
    img = dst + n * 3 * HW
    for start in range(0, HW, BLOCK):  # the sample, copied into its contiguous slot
        p = start + tl.arange(0, BLOCK)
        m = p < HW
        off = (p // W) * s_h + (p % W) * s_w
        for ch in tl.static_range(3):
            tl.store(img + ch * HW + p, tl.load(src_n + ch * s_c + off, mask=m), mask=m)
    tl.debug_barrier()
    for pos in tl.static_range(4):
        step = tl.load(order_ptr + n * 4 + pos)
        if step == 3:  # hue: RGB -> Pillow's H*256+S, H shifted, -> RGB (two gathers)
            shift = tl.load(shift_ptr + n)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _rgb(img, p, m, HW)
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
                r, g, b = _rgb(img, p, m, HW)
                d = _luma(r, g, b).to(tl.float32)
                tl.store(img + p, _blend(d, f, r), mask=m)
                tl.store(img + HW + p, _blend(d, f, g), mask=m)
                tl.store(img + 2 * HW + p, _blend(d, f, b), mask=m)
        elif step == 1:  # contrast: a pass for the mean luma, then blend with it
            total = tl.zeros((), dtype=tl.int64)
            for start in range(0, HW, BLOCK):
                p = start + tl.arange(0, BLOCK)
                m = p < HW
                r, g, b = _rgb(img, p, m, HW)
                total += tl.sum(tl.where(m, _luma(r, g, b), 0).to(tl.int64), axis=0)
            mean = ((total * 2 + HW) // (HW * 2)).to(tl.float32)  # int(mean + 0.5)
            _blend_pass(img, mean, tl.load(factor_ptr + n * 3 + 1), HW, BLOCK)
        elif step == 0:  # brightness: blend with black
            _blend_pass(img, 0.0, tl.load(factor_ptr + n * 3), HW, BLOCK)
        tl.debug_barrier()
