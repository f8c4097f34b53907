"""Conversion and normalisation converters: PIL -> tensor, dtype changes, Normalize.

These move no pixels spatially; the pipeline builder fuses a trailing run of them (with a
flip) into one crop_mirror_normalize. Where torchvision would raise (Normalize on a PIL
image, ToTensor on a tensor), the converter refuses, so the fallback raises it unchanged.
"""
from __future__ import annotations

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.plan.ir import Erase, Normalize, ToCHW, ToFloat, Unsupported
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import register, transform_name, v2_params

_FLOATS = (torch.float32,)


def _require_pil(t, state: ChainState) -> None:
    if state.kind != "pil":
        raise Unsupported(f"{transform_name(t)} expects a PIL image here, torchvision would raise")


_to_tensor_types = [T.ToTensor] + ([v2.ToTensor] if hasattr(v2, "ToTensor") else [])


@register(*_to_tensor_types)
def to_tensor(t, state: ChainState, alloc) -> Step:
    _require_pil(t, state)
    state.kind, state.dtype = "tensor", "float32"
    return Step(transform_name(t), [ToFloat(1.0 / 255.0, divide=True), ToCHW()])


@register(T.PILToTensor, v2.PILToTensor)
def pil_to_tensor(t, state: ChainState, alloc) -> Step:
    _require_pil(t, state)
    state.kind = "tensor"
    return Step(transform_name(t), [ToCHW()])


@register(v2.ToImage)
def to_image(t, state: ChainState, alloc) -> Step:
    if state.kind == "pil":
        state.kind = "tensor"
        return Step(transform_name(t), [ToCHW()])
    return Step(transform_name(t), [])


def _to_float(t, state: ChainState, dtype, scale: bool, divide: bool = False) -> Step:
    if state.kind != "tensor":
        raise Unsupported(f"{transform_name(t)} on a PIL image is left to torchvision")
    if dtype not in _FLOATS and dtype != torch.uint8:
        raise Unsupported(f"{transform_name(t)} to {dtype} is not translated (float32 and uint8 are)")
    if dtype == torch.uint8:
        if state.dtype != "uint8":
            raise Unsupported(f"{transform_name(t)} float -> uint8 is not translated")
        return Step(transform_name(t), [])
    if state.dtype == "float32":
        return Step(transform_name(t), [])
    state.dtype = "float32"
    return Step(transform_name(t), [ToFloat(1.0 / 255.0 if scale else 1.0, divide=divide and scale)])


_convert_types = [T.ConvertImageDtype] + ([v2.ConvertImageDtype] if hasattr(v2, "ConvertImageDtype") else [])


@register(*_convert_types)
def convert_image_dtype(t, state: ChainState, alloc) -> Step:
    # v1's convert_image_dtype divides by 255, v2's multiplies by 1/255
    return _to_float(t, state, t.dtype, scale=True, divide=not isinstance(t, v2.Transform))


@register(v2.ToDtype)
def to_dtype(t, state: ChainState, alloc) -> Step:
    if not isinstance(t.dtype, torch.dtype):
        raise Unsupported("v2.ToDtype with a per-type dtype dict is not translated")
    return _to_float(t, state, t.dtype, scale=bool(t.scale))


@register(T.Normalize, v2.Normalize)
def normalize(t, state: ChainState, alloc) -> Step:
    if state.kind != "tensor" or state.dtype != "float32":
        raise Unsupported("Normalize needs a float tensor here; torchvision would raise")
    mean = tuple(torch.as_tensor(t.mean, dtype=torch.float64).flatten().tolist())  # lists, tuples, tensors (timm)
    std = tuple(torch.as_tensor(t.std, dtype=torch.float64).flatten().tolist())
    if len(mean) not in (1, state.channels) or len(std) not in (1, state.channels):
        raise Unsupported(f"Normalize with {len(mean)} means for {state.channels} channels")
    if any(s == 0 for s in std):
        raise Unsupported("Normalize with a zero std; torchvision would raise")
    n = state.channels
    return Step(transform_name(t), [Normalize(mean * n if len(mean) == 1 else mean,
                                              std * n if len(std) == 1 else std)])


@register(v2.ToPureTensor)
def to_pure_tensor(t, state: ChainState, alloc) -> Step:
    return Step(transform_name(t), [], neutral=[])


@register(T.RandomErasing, v2.RandomErasing)
def random_erasing(t, state: ChainState, alloc) -> Step:
    """The box is drawn by torchvision's get_params/make_params on a stand-in of the tensor's
    shape; a draw that finds no box (after its ten tries) erases nothing, as torchvision."""
    if state.kind != "tensor" or state.dtype != "float32":
        raise Unsupported(f"{transform_name(t)} is translated on float tensors only")
    if t.value is None or isinstance(t.value, str):
        raise Unsupported(f"{transform_name(t)}(value='random') fills with torch's normal noise, "
                          "which DALI cannot reproduce")
    value = [float(t.value)] if isinstance(t.value, (int, float)) else [float(v) for v in t.value]
    if len(value) not in (1, state.channels):
        raise Unsupported(f"{transform_name(t)} with {len(value)} values for {state.channels} channels; "
                          "torchvision would raise")
    fill = tuple(value * state.channels if len(value) == 1 else value)
    erase = Erase(alloc(Erase), fill)
    p = float(t.p)
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def box(g):
            q = params([g.standin()])
            return (q["i"], q["j"], q["h"], q["w"]) if q["v"] is not None else None
    else:
        scale, ratio = t.scale, t.ratio

        def box(g):
            standin = g.standin()
            i, j, h, w, v = T.RandomErasing.get_params(standin, scale, ratio, value)
            return None if v is standin else (i, j, h, w)  # no box found: the image itself

    def draw(g) -> None:
        found = box(g) if torch.rand(1) < p else None
        g.put(erase, *(found if found is not None else Erase.neutral))
    return Step(transform_name(t), [erase], draw, neutral=list(Erase.neutral))
