"""The Triton kernel of ``resample`` (imported only where Triton is; see there)."""
import triton
import triton.language as tl


# sizes and strides change from batch to batch: compiled once, not per value's divisibility
@triton.jit(do_not_specialize=["n_out", "n_across", "n_in", "C", "s_b", "s_c", "s_along", "s_across",
                               "d_b", "d_c", "d_along", "d_across"])
def resample_axis_stored(src, dst, first_buf, weights_buf, tables, n_out, n_across, n_in, C,
                         s_b, s_c, s_along, s_across, d_b, d_c, d_along, d_across,
                         BLOCK_O: tl.constexpr, BLOCK_A: tl.constexpr):
    """One of Pillow's passes (ImagingResampleHorizontal/Vertical_8bpc) along one axis of a
    [B, C, ., .] batch of whole numbers: out[o] = clip8(2**21 + sum_k in[first[o] + k] * w[o, k])
    in int32, each sample with its own tables, read from the kept flat buffers: ``tables`` int64
    [4, B] holds per sample the offset of its first-pixel table, the offset of its weights, its
    number of taps and its output size (outputs past it are 0). Program (sample and channel,
    block of outputs, block across the axis)."""
    pid = tl.program_id(0)
    b = pid // C
    c = pid % C
    n_b = tl.num_programs(0) // C
    first_at = tl.load(tables + b)
    weights_at = tl.load(tables + n_b + b)
    taps = tl.load(tables + 2 * n_b + b).to(tl.int32)
    out_b = tl.load(tables + 3 * n_b + b).to(tl.int32)
    o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    mo = o < out_b
    ma = a < n_across
    start = tl.load(first_buf + first_at + o, mask=mo, other=0)
    acc = tl.zeros((BLOCK_O, BLOCK_A), dtype=tl.int32) + (1 << 21)
    base = src + b * s_b + c * s_c
    for k in range(0, taps):
        w = tl.load(weights_buf + weights_at + o * taps + k, mask=mo, other=0)
        pos = start + k
        mp = mo & (pos < n_in)
        v = tl.load(base + pos[:, None] * s_along + a[None, :] * s_across,
                    mask=mp[:, None] & ma[None, :], other=0.0)
        acc += v.to(tl.int32) * w[:, None]
    out = tl.where(mo[:, None], tl.minimum(tl.maximum(acc >> 22, 0), 255), 0)
    tl.store(dst + b * d_b + c * d_c + o[:, None] * d_along + a[None, :] * d_across, out.to(tl.float32),
             mask=(o < n_out)[:, None] & ma[None, :])
