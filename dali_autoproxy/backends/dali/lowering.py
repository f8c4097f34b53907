"""Lowering a plan's ops to one DALI graph (its runner, ``runner.py``, runs it).

Fusions, because each saves a full pass over the image:
- the first crop of an encoded input becomes a region-of-interest decode
  (``decoders.image_slice``): only the crop is decoded, as hand-written DALI code does
  (on the GPU where its nvJPEG can upsample chroma as Pillow does there: nvjpeg.py);
- the trailing flip / to-float / normalise / HWC->CHW run becomes one
  ``crop_mirror_normalize``.
Everything per sample (crop boxes, sizes, flip flags) arrives through external sources.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from dali_autoproxy.backends.dali import color as dali_color
from dali_autoproxy.backends.dali.nvjpeg import region_decode_like_libjpeg
from dali_autoproxy.backends.torch_stage import TorchStage
from dali_autoproxy.config import Options
from dali_autoproxy.plan.ir import (
    Blur,
    Crop,
    Erase,
    FastColorJitter,
    Flip,
    Grayscale,
    Normalize,
    Op,
    PixelOp,
    Placement,
    Resize,
    ToCHW,
    ToFloat,
    compose_affine,
    split_at_takeover,
)
from dali_autoproxy.plan.kernel_table import KernelTable
from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.plan.steps import ChainState


def _torch_only(op_type: type) -> Optional[str]:
    """An op placed in the torch stage only is exact only as torch ops: never lowered to DALI."""
    if op_type.placement is Placement.TORCH:
        return "exact only as torch ops; the torch stage takes over from it"
    return None


DALI_KERNELS = KernelTable("DALI lowering", absent_by_default=_torch_only)

_TAIL_OPS = frozenset((Flip, ToFloat, Normalize, ToCHW))  # what one crop_mirror_normalize can finish with

def _split_tail(ops: Sequence[object]) -> Tuple[List[object], List[object]]:
    """Longest suffix of elementwise ops (with at most one horizontal flip) for one
    crop_mirror_normalize."""
    i = len(ops)
    flips = 0
    while i > 0 and type(ops[i - 1]) in _TAIL_OPS:
        op = ops[i - 1]
        if type(op) is Flip:
            if op.vertical or flips:
                break  # crop_mirror_normalize mirrors horizontally, once
            flips += 1
        i -= 1
    return list(ops[:i]), list(ops[i:])


class Lowering:
    """Builds the DALI graph for a plan; knows which external sources need which params.
    Each op is lowered by its kernel in DALI_KERNELS: ``kernel(lowering, op, img) -> img``."""

    def __init__(self, plan: Plan, input_kind: str, device: str,
                 hw_decoder_load: float = Options.hw_decoder_load, prefix: str = ""):
        self.plan = plan
        self.prefix = prefix  # of its inputs' names: a pipeline with a branch per view names each apart
        self.hw_decoder_load = hw_decoder_load  # the GPU's hardware JPEG decoder's share
        self.device = device  # "gpu" or "cpu"
        self.input_kind = input_kind  # "encoded" (JPEG bytes) or "raw" (HWC uint8 pixels)
        self.feeds: List[Tuple[str, int, int, object]] = []  # (name, column, width, numpy dtype)
        self.ops, torch_ops = split_at_takeover(plan.ops, plan.any_size)
        self.torch_stage = TorchStage(torch_ops, compile_behind=True) if torch_ops else None
        # what the DALI part hands over: the plan's output, or uint8 HWC pixels for the torch stage
        channels = 3
        for op in self.ops:
            channels = getattr(op, "channels", channels)  # a Grayscale sets the channel count
        self.out_state = ChainState(channels=channels) if torch_ops else plan.state

    def param(self, op: Op, first: str, width: int, dtype, operand: bool = False) -> object:
        """An op's per-sample value ``first`` (and the ``width - 1`` after it in its schema) as a
        named pipeline input, fed from the params row; ``operand``: used in arithmetic with the
        image, so it must sit on the image's device."""
        from nvidia.dali import fn, types
        dali_type = types.INT32 if dtype == np.int32 else types.FLOAT
        name = f"{self.prefix}{type(op).__name__}.{first}@{op.slot}"  # op, value, where in the row
        self.feeds.append((name, op.col(first), width, dtype))
        node = fn.external_source(name=name, device="cpu", dtype=dali_type)
        return node.gpu() if operand and self.device == "gpu" else node

    def _decode_options(self) -> dict:
        from nvidia.dali import types
        decode_device = "mixed" if self.device == "gpu" else "cpu"
        # jpeg_fancy_upsampling: the GPU decoder upsamples chroma as libjpeg-turbo (Pillow) does
        common = dict(device=decode_device, output_type=types.RGB, adjust_orientation=False,
                      jpeg_fancy_upsampling=True)
        if decode_device == "mixed":
            common["hw_decoder_load"] = self.hw_decoder_load
        return common

    def decode_whole(self, data):
        """Every JPEG of the batch decoded whole, as Pillow decodes it."""
        from nvidia.dali import fn
        return fn.decoders.image(data, **self._decode_options())

    def graph(self, decoded=None):
        """The plan's DALI graph from its ``data`` input, or from ``decoded`` images (the whole
        JPEG decoded once for several views: see ``shared_graph``)."""
        from nvidia.dali import fn
        ops = list(self.ops)
        if decoded is not None:
            img = decoded
        elif self.input_kind == "encoded":
            data = input_data(encoded=True)
            first = ops[0] if ops else None
            # A region decode can upsample chroma as libjpeg at full speed only with nvJPEG 13.2+
            # (nvjpeg.py); elsewhere the whole image is decoded and the crop (a DALI op) follows
            region = self.device == "cpu" or region_decode_like_libjpeg()
            if type(first) is Crop and first.in_bounds and region:  # region-of-interest decode
                ops.pop(0)
                anchor = self.param(first, "top", 2, np.int32)
                shape = self.param(first, "height", 2, np.int32)
                img = fn.decoders.image_slice(data, anchor, shape, axis_names="HW", **self._decode_options())
            else:
                img = self.decode_whole(data)
        else:
            data = input_data(encoded=False)
            img = data.gpu() if self.device == "gpu" else data

        erases: List[object] = []
        while ops and type(ops[-1]) is Erase:  # erasing after the tail, on the CHW tensor
            erases.insert(0, ops.pop())
        body, tail = _split_tail(ops)
        for op in body:
            img = DALI_KERNELS[op](self, op, img)
        stage = self.torch_stage
        if stage is not None and stage.ops[0].ragged and not self.plan.any_size:
            # the stage's first op takes each sample at its own size: one batch, padded to the largest
            # (a joint transform's plan hands over its samples as they are: the stage pads them, knowing their sizes)
            if tail:
                img = self._lower_tail(tail, img)
            return fn.pad(img, axis_names="HW", fill_value=0)
        img = self._lower_tail(tail, img)
        for op in erases:
            img = DALI_KERNELS[op](self, op, img)
        return img

    def _lower_tail(self, tail: List[object], img):
        from nvidia.dali import fn, types
        state = self.out_state
        kwargs = {}
        flips = [op for op in tail if type(op) is Flip]
        if flips:
            kwargs["mirror"] = self.param(flips[0], "apply", 1, np.int32)
        a, b = compose_affine(tail, state.channels)
        if state.dtype == "float32":
            # (x - mean) / std == a * x + b  with  std = 1 / a, mean = -b / a
            kwargs.update(dtype=types.FLOAT, mean=list(-b / a), std=list(1.0 / a))
        else:
            kwargs.update(dtype=types.UINT8)
        layout = "CHW" if state.kind == "tensor" else "HWC"
        return fn.crop_mirror_normalize(img, output_layout=layout, **kwargs)


def input_data(encoded: bool):
    """The pipeline's one image input, ``data``: JPEG files, or HWC pixels."""
    from nvidia.dali import fn, types
    # no_copy: DALI reads the workers' shared memory in place (DaliRunner keeps it alive)
    return fn.external_source(name="data", device="cpu", dtype=types.UINT8, no_copy=True,
                              layout=None if encoded else "HWC")


def shared_graph(lowerings: Sequence[Lowering]) -> list:
    """One output per view: each JPEG of the batch decoded once, whole, and every view's plan
    lowered from that decode (its first crop a DALI slice of it). A multi-view recipe's ten
    crops of one image then cost one decode instead of ten region decodes."""
    decoded = lowerings[0].decode_whole(input_data(encoded=True))
    return [lw.graph(decoded=decoded) for lw in lowerings]


# ----------------------------------------------------------------------------- DALI kernels
@DALI_KERNELS.register(Crop)
def _crop(lw: Lowering, op: Crop, img):
    from nvidia.dali import fn
    anchor = lw.param(op, "top", 2, np.int32)
    shape = lw.param(op, "height", 2, np.int32)
    return fn.slice(img, anchor, shape, axis_names="HW", fill_values=list(op.fill),
                    out_of_bounds_policy="error" if op.in_bounds else "pad")


@DALI_KERNELS.register(Resize)
def _resize(lw: Lowering, op: Resize, img):
    from nvidia.dali import fn, types
    interp = {"linear": types.INTERP_LINEAR, "cubic": types.INTERP_CUBIC, "nn": types.INTERP_NN}[op.interp]
    if op.size is not None:
        height, width = float(op.size[0]), float(op.size[1])
    else:
        height = lw.param(op, "height", 1, np.float32)
        width = lw.param(op, "width", 1, np.float32)
    return fn.resize(img, resize_y=height, resize_x=width, interp_type=interp, antialias=op.antialias)


@DALI_KERNELS.register(Flip)
def _flip(lw: Lowering, op: Flip, img):
    from nvidia.dali import fn
    flag = lw.param(op, "apply", 1, np.int32)
    return fn.flip(img, horizontal=0, vertical=flag) if op.vertical else fn.flip(img, horizontal=flag)


_PIXEL_FORMULAS = {  # y as integer arithmetic on x, applied where flag is 1
    "invert": lambda x, flag, arg: x + flag * (255 - 2 * x),
    "solarize": lambda x, flag, arg: x + flag * (x >= arg) * (255 - 2 * x),
    "posterize": lambda x, flag, arg: x + flag * ((x & arg) - x),
}


@DALI_KERNELS.register(PixelOp)
def _pixel_op(lw: Lowering, op: PixelOp, img):
    from nvidia.dali import fn, types
    flag = lw.param(op, "apply", 1, np.int32)
    y = _PIXEL_FORMULAS[op.kind](fn.cast(img, dtype=types.INT32), flag, op.arg)
    return fn.cast(y, dtype=types.UINT8)


@DALI_KERNELS.register(Grayscale)
def _grayscale(lw: Lowering, op: Grayscale, img):
    apply = None if op.slot is None else lw.param(op, "apply", 1, np.float32, True)
    return dali_color.grayscale(img, op.channels, apply)


@DALI_KERNELS.register(FastColorJitter)
def _fast_color_jitter(lw: Lowering, op: FastColorJitter, img):
    """DALI's fused color_twist once per position of each sample's drawn order (ir.FastColorJitter)."""
    from nvidia.dali import fn
    for k in range(4):
        b, c, s, h = (lw.param(op, f"{name}{k}", 1, np.float32)
                      for name in ("brightness", "contrast", "saturation", "hue"))
        img = fn.color_twist(img, brightness=b, contrast=c, saturation=s, hue=h * 360.0)
    return img


@DALI_KERNELS.register(Blur)
def _blur(lw: Lowering, op: Blur, img):
    from nvidia.dali import fn
    sigma = lw.param(op, "sigma_y", 2, np.float32)
    return fn.gaussian_blur(img, window_size=list(op.kernel), sigma=sigma)


@DALI_KERNELS.register(Erase)
def _erase(lw: Lowering, op: Erase, img):
    from nvidia.dali import fn
    anchor = lw.param(op, "top", 2, np.float32)
    shape = lw.param(op, "height", 2, np.float32)
    return fn.erase(img, anchor=anchor, shape=shape, axis_names="HW", fill_value=list(op.value))


@DALI_KERNELS.register(ToFloat)
def _to_float(lw: Lowering, op: ToFloat, img):
    from nvidia.dali import fn, types
    img = fn.cast(img, dtype=types.FLOAT)
    return img * op.scale if op.scale != 1.0 else img


@DALI_KERNELS.register(Normalize)
def _normalize(lw: Lowering, op: Normalize, img):
    from nvidia.dali import fn, types
    return fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="HWC", mean=list(op.mean), std=list(op.std))


@DALI_KERNELS.register(ToCHW)
def _to_chw(lw: Lowering, op: ToCHW, img):
    return img  # the layout is applied once, in the tail
