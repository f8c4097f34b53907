"""The Triton kernel of ``resample`` (imported only where Triton is; see there)."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["C", "n_b"])
def resample_pass(block, mean, std, C, n_b, scale, SRC_FLOAT: tl.constexpr, DST_FLOAT: tl.constexpr,
                  AFFINE: tl.constexpr, NORMALIZE: tl.constexpr, META: tl.constexpr, BLOCK_O: tl.constexpr,
                  BLOCK_A: tl.constexpr):
    """One of Pillow's passes (ImagingResampleHorizontal/Vertical_8bpc) of every sample of a
    [B, C, H, W] batch of whole numbers: out[o] = clip8(2**21 + sum_k in[first[o] + k] * w[o, k])
    in int32, each sample along its own axis (Pillow orders the passes per image) with its own
    tables, read from the kept flat buffers. Everything that changes from batch to batch is read
    from ``block`` (int64): the addresses of the source, the destination (uint8, or float32
    where SRC_FLOAT, DST_FLOAT) and the kept buffers, the source's and the destination's strides (batch, channel,
    height, width: META values in all), then the rows that ``fused_resize`` names (FIRST ... FLIP_Y, [9, B]); so one
    compiled kernel, and one CUDA graph of a batch's two launches, serves every batch. The
    output's axes are the image's (height, width) whichever axis the pass runs along; outputs
    past a sample's extents are not written. The end of a chain may come with the pass: each
    sample mirrored (FLIP_X, FLIP_Y, within its own size), then per value AFFINE (1: divided by
    ``scale``, correctly rounded, as v1's ToTensor; 2: multiplied by it, as v2's ToDtype) and
    NORMALIZE ((v - mean[c]) / std[c], correctly rounded), torch's float32 steps one by one
    (launched without contracted multiply-adds). Program (sample and channel, block of outputs,
    block across the axis)."""
    pid = tl.program_id(0)
    b = pid // C
    c = pid % C
    row = block + META + b
    n_out = tl.load(row + 3 * n_b).to(tl.int32)
    n_across = tl.load(row + 4 * n_b).to(tl.int32)
    o_start = tl.program_id(1) * BLOCK_O
    a_start = tl.program_id(2) * BLOCK_A
    if (o_start >= n_out) | (a_start >= n_across):  # past this sample's own extents (or the grid's spare)
        return
    if SRC_FLOAT:
        src = tl.load(block).to(tl.pointer_type(tl.float32))
    else:
        src = tl.load(block).to(tl.pointer_type(tl.uint8))
    if DST_FLOAT:
        dst = tl.load(block + 1).to(tl.pointer_type(tl.float32))
    else:
        dst = tl.load(block + 1).to(tl.pointer_type(tl.uint8))
    first_buf = tl.load(block + 2).to(tl.pointer_type(tl.int32))
    weights_buf = tl.load(block + 3).to(tl.pointer_type(tl.int32))
    first_at = tl.load(row)
    weights_at = tl.load(row + n_b)
    taps = tl.load(row + 2 * n_b).to(tl.int32)
    along_width = tl.load(row + 5 * n_b) != 0
    n_in = tl.load(row + 6 * n_b).to(tl.int32)
    flip_along = tl.load(row + tl.where(along_width, 7, 8) * n_b) != 0
    flip_across = tl.load(row + tl.where(along_width, 8, 7) * n_b) != 0
    s_along = tl.load(block + tl.where(along_width, 7, 6))
    s_across = tl.load(block + tl.where(along_width, 6, 7))
    d_along = tl.load(block + tl.where(along_width, 11, 10))
    d_across = tl.load(block + tl.where(along_width, 10, 11))
    o = o_start + tl.arange(0, BLOCK_O)
    a = a_start + tl.arange(0, BLOCK_A)
    mo = o < n_out
    ma = a < n_across
    start = tl.load(first_buf + first_at + o, mask=mo, other=0)
    acc = tl.zeros((BLOCK_O, BLOCK_A), dtype=tl.int32) + (1 << 21)
    base = src + b * tl.load(block + 4) + c * tl.load(block + 5)
    for k in range(0, taps):
        w = tl.load(weights_buf + weights_at + o * taps + k, mask=mo, other=0)
        pos = start + k
        mp = mo & (pos < n_in)
        v = tl.load(base + pos[:, None] * s_along + a[None, :] * s_across,
                    mask=mp[:, None] & ma[None, :], other=0)
        acc += v.to(tl.int32) * w[:, None]
    value = tl.minimum(tl.maximum(acc >> 22, 0), 255).to(tl.float32)
    if AFFINE == 1:
        value = tl.math.div_rn(value, scale)
    elif AFFINE == 2:
        value = value * scale
    if NORMALIZE:
        value = tl.math.div_rn(value - tl.load(mean + c), tl.load(std + c))
    o_to = tl.where(flip_along, n_out - 1 - o, o)
    a_to = tl.where(flip_across, n_across - 1 - a, a)
    tl.store(dst + b * tl.load(block + 8) + c * tl.load(block + 9) + o_to[:, None] * d_along + a_to[None, :] * d_across,
             value.to(dst.dtype.element_ty), mask=mo[:, None] & ma[None, :])
