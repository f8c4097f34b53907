"""The Triton kernel of ``resample`` (imported only where Triton is; see there)."""
import triton
import triton.language as tl


@triton.jit
def resample_axis(src, dst, first, weights, n_out, n_across, n_in, K, C,
                  s_b, s_c, s_along, s_across, d_b, d_c, d_along, d_across,
                  BLOCK_O: tl.constexpr, BLOCK_A: tl.constexpr):
    """One of Pillow's passes (ImagingResampleHorizontal/Vertical_8bpc) along one axis of a
    [B, C, ., .] batch of whole numbers: out[o] = clip8(2**21 + sum_k in[first[o] + k] * w[o, k])
    in int32, each sample with its own tables ``first`` [B, n_out] and ``weights`` [B, n_out, K]
    (zero past the taps Pillow uses). Program (sample and channel, block of outputs, block
    across the axis)."""
    pid = tl.program_id(0)
    b = pid // C
    c = pid % C
    o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    mo = o < n_out
    ma = a < n_across
    start = tl.load(first + b * n_out + o, mask=mo, other=0)
    acc = tl.zeros((BLOCK_O, BLOCK_A), dtype=tl.int32) + (1 << 21)
    base = src + b * s_b + c * s_c
    for k in range(0, K):
        w = tl.load(weights + (b * n_out + o) * K + k, mask=mo, other=0)
        pos = start + k
        mp = mo & (pos < n_in)
        v = tl.load(base + pos[:, None] * s_along + a[None, :] * s_across,
                    mask=mp[:, None] & ma[None, :], other=0.0)
        acc += v.to(tl.int32) * w[:, None]
    out = tl.minimum(tl.maximum(acc >> 22, 0), 255)
    tl.store(dst + b * d_b + c * d_c + o[:, None] * d_along + a[None, :] * d_across, out.to(tl.float32),
             mask=mo[:, None] & ma[None, :])
