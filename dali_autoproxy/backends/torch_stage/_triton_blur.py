"""The Triton kernel of ``pillow_filters`` (imported only where Triton is; see there)."""
import triton
import triton.language as tl


@triton.jit
def box_pass_axis(src, dst, whole, ww, fw, n, n_across, C,
                  s_b, s_c, s_along, s_across, d_b, d_c, d_along, d_across,
                  BLOCK_O: tl.constexpr, BLOCK_A: tl.constexpr):
    """One of Pillow's box passes (``ImagingLineBoxBlur``) along one axis of a [B, C, ., .]
    batch of whole numbers, each sample with its own integer radius ``whole`` and 24-bit weights
    ``ww``, ``fw``: out[x] = (sum(in[x - r .. x + r]) * ww + (in[x - r - 1] + in[x + r + 1]) * fw
    + 2**23) >> 24, every index clamped to the line (Pillow repeats the edge pixel). The window
    is summed from the source (held in cache), so a pass reads and writes the batch once.
    Program (sample and channel, block along the axis, block across it)."""
    pid = tl.program_id(0)
    b = pid // C
    c = pid % C
    o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    mask = (o < n)[:, None] & (a < n_across)[None, :]
    r = tl.load(whole + b)
    w_in = tl.load(ww + b)
    w_edge = tl.load(fw + b)
    base = src + b * s_b + c * s_c + a[None, :] * s_across
    acc = tl.zeros((BLOCK_O, BLOCK_A), dtype=tl.int32)
    for k in range(-r, r + 1):
        pos = tl.minimum(tl.maximum(o + k, 0), n - 1)
        acc += tl.load(base + pos[:, None] * s_along, mask=mask, other=0.0).to(tl.int32)
    lo = tl.minimum(tl.maximum(o - r - 1, 0), n - 1)
    hi = tl.minimum(tl.maximum(o + r + 1, 0), n - 1)
    far = (tl.load(base + lo[:, None] * s_along, mask=mask, other=0.0).to(tl.int64)
           + tl.load(base + hi[:, None] * s_along, mask=mask, other=0.0).to(tl.int64))
    out = (acc.to(tl.int64) * w_in + far * w_edge + (1 << 23)) >> 24
    tl.store(dst + b * d_b + c * d_c + o[:, None] * d_along + a[None, :] * d_across, out.to(tl.float32),
             mask=mask)
