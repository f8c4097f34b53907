"""The Triton kernels of ``resample`` (imported only where Triton is; see there).

Both run one of Pillow's passes (ImagingResampleHorizontal/Vertical_8bpc) over every sample of a
[B, C, H, W] batch of whole numbers, each sample along its own axis (Pillow orders the passes
per image): out[o] = clip8(2**21 + sum_k in[xmin[o] + k] * w[o, k]) in int32. They differ in
where the weights come from: ``resample_computed`` computes them for each output pixel as
precompute_coeffs and normalize_coeffs_8bpc do (BILINEAR, BICUBIC, BOX: float64 arithmetic,
the C's operations in the C's order), so a batch needs nothing from the host but its params
rows; ``resample_pass`` reads them from the tables kept on the device (``kept_tables``: the
filters whose weights need the C library's ``sin``/``cos``, and NEAREST's running sum).

Everything that changes from batch to batch is read from ``block`` (int64), so one compiled
kernel, and one CUDA graph of a batch's two launches, serves every batch of a shape: per pass
META values (the source's and the destination's addresses, two the kernel uses for its
tables, the source's and the destination's strides: batch, channel, height, width), then the
per-sample values. The output's axes are the image's (height, width) whichever axis a pass runs
along; outputs past a sample's extents are not written. The end of a chain may come with the
pass (``_store``): each sample mirrored within its own size, then per value AFFINE (1: divided
by ``scale``, correctly rounded, as v1's ToTensor; 2: multiplied by it, as v2's ToDtype) and
NORMALIZE ((v - mean[c]) / std[c], correctly rounded), torch's float32 steps one by one
(launched without contracted multiply-adds). Program: (sample and channel, block of outputs,
block across the axis)."""
import triton
import triton.language as tl

# the filters resample_computed computes (Resample.c's numbering: BILINEAR, BICUBIC, BOX)
FIRST_COMPUTED, LAST_COMPUTED = 2, 4


@triton.jit
def _source(meta, SRC_FLOAT: tl.constexpr):
    # one return: Triton's code generator types every return statement of a function, a
    # constexpr-dead one too, and refuses two pointer types
    if SRC_FLOAT:
        src = tl.load(meta).to(tl.pointer_type(tl.float32))
    else:
        src = tl.load(meta).to(tl.pointer_type(tl.uint8))
    return src


@triton.jit
def _store(acc, meta, mean, std, b, c, scale, o, a, mo, ma, n_out, n_across, along_width, flip_along, flip_across,
           DST_FLOAT: tl.constexpr, AFFINE: tl.constexpr, NORMALIZE: tl.constexpr):
    """clip8 of the sums, the chain's end, stored at each sample's place (mirrored where it flips)."""
    if DST_FLOAT:
        dst = tl.load(meta + 1).to(tl.pointer_type(tl.float32))
    else:
        dst = tl.load(meta + 1).to(tl.pointer_type(tl.uint8))
    value = tl.minimum(tl.maximum(acc >> 22, 0), 255).to(tl.float32)
    if AFFINE == 1:
        value = tl.math.div_rn(value, scale)
    elif AFFINE == 2:
        value = value * scale
    if NORMALIZE:
        value = tl.math.div_rn(value - tl.load(mean + c), tl.load(std + c))
    d_along = tl.load(meta + tl.where(along_width, 11, 10))
    d_across = tl.load(meta + tl.where(along_width, 10, 11))
    o_to = tl.where(flip_along, n_out - 1 - o, o)
    a_to = tl.where(flip_across, n_across - 1 - a, a)
    tl.store(dst + b * tl.load(meta + 8) + c * tl.load(meta + 9) + o_to[:, None] * d_along + a_to[None, :] * d_across,
             value.to(dst.dtype.element_ty), mask=mo[:, None] & ma[None, :])


@triton.jit(do_not_specialize=["C", "n_b"])
def resample_pass(block, mean, std, C, n_b, scale, SRC_FLOAT: tl.constexpr, DST_FLOAT: tl.constexpr,
                  AFFINE: tl.constexpr, NORMALIZE: tl.constexpr, META: tl.constexpr, BLOCK_O: tl.constexpr,
                  BLOCK_A: tl.constexpr):
    """One pass from kept tables: ``block`` holds the META values (the kept buffers' addresses
    third and fourth), then the rows that ``fused_resize`` names (FIRST ... FLIP_Y, [9, B])."""
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
    src = _source(block, SRC_FLOAT)
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
    _store(acc, block, mean, std, b, c, scale, o, a, mo, ma, n_out, n_across, along_width, flip_along, flip_across,
           DST_FLOAT, AFFINE, NORMALIZE)


@triton.jit
def _filter(arg, kind):
    """Resample.c's bilinear_filter, bicubic_filter (a = -0.5) and box_filter at ``arg`` (float64)."""
    x = tl.abs(arg)
    bilinear = tl.where(x < 1.0, 1.0 - x, 0.0)
    near = ((x * 1.5 - 2.5) * x) * x + 1.0  # ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * -0.5  # (((x - 5) * x + 8) * x - 4) * a
    bicubic = tl.where(x < 1.0, near, tl.where(x < 2.0, far, 0.0))
    box = tl.where((arg > -0.5) & (arg <= 0.5), 1.0, 0.0)
    return tl.where(kind == 3, bicubic, tl.where(kind == 4, box, bilinear))


@triton.jit(do_not_specialize=["C", "n_b"])
def resample_computed(block, mean, std, C, n_b, scale, PASS: tl.constexpr, K: tl.constexpr,
                      WINDOWED: tl.constexpr, ORDERS: tl.constexpr, N_FLIP_X: tl.constexpr, N_FLIP_Y: tl.constexpr,
                      SRC_FLOAT: tl.constexpr, DST_FLOAT: tl.constexpr, AFFINE: tl.constexpr,
                      NORMALIZE: tl.constexpr, META: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_A: tl.constexpr):
    """Pass PASS (0: the first) of each sample, its weights computed: ``block`` holds both passes'
    META values, then each sample's K params as float64 (``fused_resize.COMPUTED_COLUMNS``): its
    input and output (width, height), filter, box (left, top, right, bottom: C floats), where
    WINDOWED the window (left, top, width, height) of the resized image computed, then
    N_FLIP_X + N_FLIP_Y flip coins (mirrored along an axis where an odd number apply). The
    pass order is Pillow 13's rule where ORDERS (vertically first when the height shrinks by
    more than twice as many pixels as the width), else the width first."""
    pid = tl.program_id(0)
    b = pid // C
    c = pid % C
    meta = block + PASS * META
    p = (block + 2 * META).to(tl.pointer_type(tl.float64), bitcast=True) + b * K
    in_w = tl.load(p).to(tl.int32)
    in_h = tl.load(p + 1).to(tl.int32)
    out_w = tl.load(p + 2).to(tl.int32)
    out_h = tl.load(p + 3).to(tl.int32)
    kind = tl.load(p + 4).to(tl.int32)
    if WINDOWED:
        start_w = tl.load(p + 9).to(tl.int32)
        start_h = tl.load(p + 10).to(tl.int32)
        size_w = tl.load(p + 11).to(tl.int32)
        size_h = tl.load(p + 12).to(tl.int32)
    else:
        start_w = in_w * 0
        start_h = in_w * 0
        size_w = out_w
        size_h = out_h
    vertical = in_w < 0  # every sample horizontally first
    if ORDERS:
        shrink_y = in_h - out_h
        vertical = (shrink_y > 0) & (shrink_y > (in_w - out_w) * 2)
    if PASS == 0:
        along_width = vertical == 0
        n_across = tl.where(along_width, in_h, in_w)  # every line of the image
    else:
        along_width = vertical
        n_across = tl.where(along_width, size_h, size_w)  # the first pass's outputs
    n_out = tl.where(along_width, size_w, size_h)
    o_start = tl.program_id(1) * BLOCK_O
    a_start = tl.program_id(2) * BLOCK_A
    if (o_start >= n_out) | (a_start >= n_across):  # past this sample's own extents (or the grid's spare)
        return
    n_in = tl.where(along_width, in_w, in_h)
    n_resized = tl.where(along_width, out_w, out_h)
    o_first = tl.where(along_width, start_w, start_h)
    in0 = tl.load(p + tl.where(along_width, 5, 6)).to(tl.float32)
    in1 = tl.load(p + tl.where(along_width, 7, 8)).to(tl.float32)
    # precompute_coeffs: scale = (double)(in1 - in0) / outSize (a float subtraction), its support
    box_scale = (in1 - in0).to(tl.float64) / n_resized.to(tl.float64)
    filterscale = tl.maximum(box_scale, 1.0)
    support = tl.where(kind == 3, 2.0, tl.where(kind == 4, 0.5, 1.0)) * filterscale
    ss = 1.0 / filterscale
    taps = tl.math.ceil(support).to(tl.int32) * 2 + 1
    o = o_start + tl.arange(0, BLOCK_O)
    a = a_start + tl.arange(0, BLOCK_A)
    mo = o < n_out
    ma = a < n_across
    center = in0.to(tl.float64) + ((o + o_first).to(tl.float64) + 0.5) * box_scale
    xmin = tl.maximum((center - support + 0.5).to(tl.int32), 0)  # (int) truncates toward zero
    xmax = tl.minimum((center + support + 0.5).to(tl.int32), n_in) - xmin
    ww = tl.zeros((BLOCK_O,), dtype=tl.float64)
    for k in range(0, taps):  # the C's sequential sum of the weights
        w = _filter(((k + xmin).to(tl.float64) - center + 0.5) * ss, kind)
        ww = tl.where(k < xmax, ww + w, ww)
    nonzero = ww != 0.0
    ww = tl.where(nonzero, ww, 1.0)
    src = _source(meta, SRC_FLOAT)
    s_along = tl.load(meta + tl.where(along_width, 7, 6))
    s_across = tl.load(meta + tl.where(along_width, 6, 7))
    base = src + b * tl.load(meta + 4) + c * tl.load(meta + 5)
    acc = tl.zeros((BLOCK_O, BLOCK_A), dtype=tl.int32) + (1 << 21)
    for k in range(0, taps):
        w = _filter(((k + xmin).to(tl.float64) - center + 0.5) * ss, kind)
        w = tl.where(nonzero, w / ww, w)  # normalised, then normalize_coeffs_8bpc's fixed point
        used = mo & (k < xmax)
        fixed = tl.where(used, w * 4194304.0, 0.0)  # (unused lanes' values may not fit an int)
        weight = tl.where(fixed < 0, -0.5 + fixed, 0.5 + fixed).to(tl.int32)
        v = tl.load(base + (xmin + k)[:, None] * s_along + a[None, :] * s_across,
                    mask=used[:, None] & ma[None, :], other=0)
        acc += v.to(tl.int32) * weight[:, None]
    flip_along = along_width & False
    flip_across = along_width & False
    if PASS == 1:
        flip_x = in_w * 0
        flip_y = in_w * 0
        for i in tl.static_range(N_FLIP_X):
            flip_x += (tl.load(p + 9 + 4 * WINDOWED + i) > 0).to(tl.int32)
        for i in tl.static_range(N_FLIP_Y):
            flip_y += (tl.load(p + 9 + 4 * WINDOWED + N_FLIP_X + i) > 0).to(tl.int32)
        flip_along = (tl.where(along_width, flip_x, flip_y) & 1) != 0
        flip_across = (tl.where(along_width, flip_y, flip_x) & 1) != 0
    _store(acc, meta, mean, std, b, c, scale, o, a, mo, ma, n_out, n_across, along_width, flip_along, flip_across,
           DST_FLOAT, AFFINE, NORMALIZE)
