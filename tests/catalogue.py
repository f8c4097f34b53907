"""Every transform the coverage issue lists, as a case: a chain to run, plain and autoproxied,
and what is expected of it. One source for tests/test_catalogue.py and for the generated table
(benchmarks/transform_table.py -> docs/transforms.md).

Expectations, with the default ``resize`` (Pillow's arithmetic; ``dali_resize``: the expectation
with the opt-in resize="dali" where it differs):
  exact  the same bytes as torchvision (uint8), or float rounding only (<= 1e-5) for float output
  bound  resampling or float accumulation: MAE <= 0.5 levels and PSNR >= 40 dB (DALI CPU backend)
  worker the transform stays in the worker (partial offload, or a fallback with its reason), and
         the output equals torchvision's
Each chain starts with a crop to a fixed size (so batches collate) unless the transform makes
the size itself, and ends in a tensor; cases run on the photo folder with a fixed seed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from photos import MEAN, STD

I = T.InterpolationMode


@dataclass
class Case:
    name: str
    make: Callable  # (module T or v2) -> list of transforms, without the final conversion
    expect: str     # "exact", "bound" or "worker", with the default resize
    apis: Tuple[str, ...] = ("v1", "v2")
    output: str = "uint8"  # "uint8": PILToTensor appended; "float": ToTensor appended; "own": as made
    batch: int = 4
    dali_resize: str = ""  # the expectation with resize="dali", where it is not ``expect``

    def expected(self, resize: Optional[str] = None) -> str:
        return self.dali_resize or self.expect if resize == "dali" else self.expect

    def chain(self, api: str):
        m = T if api == "v1" else v2
        transforms = self.make(m)
        if self.output == "uint8":
            transforms = transforms + [m.PILToTensor()]
        elif self.output == "float":
            transforms = transforms + ([T.ToTensor()] if api == "v1" else
                                       [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
        return (T.Compose if api == "v1" else v2.Compose)(transforms)


def _crop(m):
    return m.CenterCrop(200)


def _stack_crops(crops):
    return torch.stack([T.functional.pil_to_tensor(c) for c in crops])


def _stack(m):
    """The documented FiveCrop/TenCrop pattern (v2's Lambda would see each crop alone)."""
    return T.Lambda(_stack_crops) if m is T else _stack_crops


def _normalized(m):
    if m is T:
        return [_crop(m), T.ToTensor(), T.Normalize(MEAN, STD)]
    return [_crop(m), v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]


CASES: List[Case] = [
    # geometry, no resampling
    Case("CenterCrop", lambda m: [m.CenterCrop(180)], "exact"),
    Case("CenterCrop larger than the image", lambda m: [m.Resize(150), m.CenterCrop(200)], "exact", batch=1,
         dali_resize="bound"),
    Case("Pad int", lambda m: [m.Pad(7)], "exact", batch=1),
    Case("Pad [l, t, r, b] RGB fill", lambda m: [m.Pad([3, 5, 11, 2], fill=(10, 200, 30))], "exact", batch=1),
    Case("RandomCrop", lambda m: [m.RandomCrop(150)], "exact"),
    Case("RandomCrop padding fill", lambda m: [m.RandomCrop((180, 200), padding=20, fill=77)], "exact"),
    Case("RandomCrop pad_if_needed",
         lambda m: [m.CenterCrop((120, 140)), m.RandomCrop(160, pad_if_needed=True, fill=5)],
         "exact"),
    Case("RandomHorizontalFlip", lambda m: [_crop(m), m.RandomHorizontalFlip()], "exact"),
    Case("RandomVerticalFlip", lambda m: [_crop(m), m.RandomVerticalFlip()], "exact"),
    # resampling
    Case("RandomResizedCrop bilinear", lambda m: [m.RandomResizedCrop(160)], "exact", dali_resize="bound"),
    Case("RandomResizedCrop bicubic", lambda m: [m.RandomResizedCrop(160, interpolation=I.BICUBIC)], "exact",
         dali_resize="bound"),
    Case("RandomResizedCrop nearest", lambda m: [m.RandomResizedCrop(160, interpolation=I.NEAREST)], "exact",
         dali_resize="bound"),
    Case("Resize + CenterCrop", lambda m: [m.Resize(180), m.CenterCrop(160)], "exact", dali_resize="bound"),
    Case("Resize max_size", lambda m: [m.Resize(150, max_size=200), m.CenterCrop(140)], "exact", dali_resize="bound"),
    Case("Resize on a tensor, bilinear", lambda m: [m.PILToTensor(), m.Resize(180), m.CenterCrop(160)], "exact",
         output="own", dali_resize="bound"),
    Case("Resize on a tensor, NEAREST_EXACT", lambda m: [m.PILToTensor(), m.Resize(180, interpolation=I.NEAREST_EXACT),
                                                       m.CenterCrop(160)], "exact", output="own", dali_resize="bound"),
    Case("Resize on a tensor, no antialias", lambda m: [m.PILToTensor(), m.Resize(180, antialias=False),
                                                      m.CenterCrop(160)], "exact", output="own", dali_resize="bound"),
    Case("Resize LANCZOS (Pillow's arithmetic)", lambda m: [m.Resize(180, interpolation=I.LANCZOS), m.CenterCrop(160)],
         "exact", output="float"),
    Case("Resize BOX (Pillow's arithmetic: DALI has no box filter)",
         lambda m: [m.Resize(180, interpolation=I.BOX), m.CenterCrop(160)], "exact", output="float"),
    Case("Resize HAMMING (Pillow's arithmetic)", lambda m: [m.Resize(180, interpolation=I.HAMMING), m.CenterCrop(160)],
         "exact", output="float"),
    # colour
    Case("ColorJitter(0.4, 0.4, 0.4, 0.1)", lambda m: [_crop(m), m.ColorJitter(0.4, 0.4, 0.4, 0.1)], "exact"),
    Case("ColorJitter brightness, contrast", lambda m: [_crop(m), m.ColorJitter(brightness=0.5, contrast=(0.2, 1.8))],
         "exact"),
    Case("ColorJitter saturation, hue 0.5", lambda m: [_crop(m), m.ColorJitter(saturation=(0.0, 2.0), hue=0.5)],
         "exact"),
    Case("ColorJitter on a uint8 tensor (torchvision's tensor kernels)", lambda m: [
        m.PILToTensor(), m.CenterCrop(200), m.ColorJitter(0.4, 0.4, 0.4, 0.1)], "exact", output="own"),
    Case("ColorJitter on a float tensor",
         lambda m: [m.PILToTensor(), m.CenterCrop(200), m.ConvertImageDtype(torch.float32),
                                                     m.ColorJitter(0.3, 0.3, 0.3, 0.2)], "exact", output="own"),
    Case("ColorJitter before a crop", lambda m: [
        m.ColorJitter(0.4, 0.4, 0.4, 0.1), m.CenterCrop(160)], "worker", output="float"),
    Case("RandomGrayscale before a resize (DALI arithmetic)", lambda m: [
        m.RandomGrayscale(0.5), m.RandomResizedCrop(160)], "exact", dali_resize="bound"),
    Case("Grayscale(1)", lambda m: [_crop(m), m.Grayscale()], "exact"),
    Case("Grayscale(3)", lambda m: [_crop(m), m.Grayscale(3)], "exact"),
    Case("RandomGrayscale", lambda m: [_crop(m), m.RandomGrayscale(0.5)], "exact"),
    Case("RandomInvert", lambda m: [_crop(m), m.RandomInvert()], "exact"),
    Case("RandomSolarize", lambda m: [_crop(m), m.RandomSolarize(100.5, p=0.7)], "exact"),
    Case("RandomPosterize", lambda m: [_crop(m), m.RandomPosterize(3, p=0.6)], "exact"),
    Case("GaussianBlur", lambda m: [_crop(m), m.GaussianBlur(9, sigma=(0.1, 3.0))], "bound"),
    Case("GaussianBlur rectangular kernel", lambda m: [_crop(m), m.GaussianBlur((3, 11), sigma=(1.0, 2.0))], "bound"),
    Case("GaussianBlur on a uint8 tensor", lambda m: [_crop(m), m.PILToTensor(), m.GaussianBlur(5, sigma=1.5)],
         "bound", output="own"),
    Case("RandomAdjustSharpness", lambda m: [_crop(m), m.RandomAdjustSharpness(2.0)], "exact"),
    Case("RandomAdjustSharpness 0.3, p=1", lambda m: [_crop(m), m.RandomAdjustSharpness(0.3, p=1.0)], "exact"),
    Case("RandomAutocontrast", lambda m: [_crop(m), m.RandomAutocontrast()], "exact"),
    Case("RandomEqualize", lambda m: [_crop(m), m.RandomEqualize()], "exact"),
    # geometry with warps
    Case("RandomRotation", lambda m: [_crop(m), m.RandomRotation(30)], "exact"),
    Case("RandomRotation centre, fill", lambda m: [_crop(m), m.RandomRotation((-90, 90), center=(20, 150),
                                                                                fill=(255, 0, 128))], "exact"),
    Case("RandomAffine", lambda m: [_crop(m), m.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10)], "exact"),
    Case("RandomAffine scale and translate only", lambda m: [_crop(m), m.RandomAffine(0, (0.2, 0.1), (0.5, 1.5),
                                                                                       fill=7)], "exact"),
    Case("RandomAffine shear x, y", lambda m: [_crop(m), m.RandomAffine(0, shear=(-20, 20, -10, 10))], "exact"),
    Case("RandomRotation before a crop", lambda m: [m.RandomRotation(30), m.CenterCrop(160)], "exact",
         output="float"),
    Case("RandomRotation bilinear", lambda m: [_crop(m), m.RandomRotation(30, interpolation=I.BILINEAR)], "exact",
         output="float"),
    Case("RandomAffine bilinear, fill", lambda m: [_crop(m), m.RandomAffine(25, (0.1, 0.2), (0.7, 1.3), 15,
                                                                           interpolation=I.BILINEAR, fill=40)],
         "exact"),
    Case("RandomRotation bicubic", lambda m: [_crop(m), m.RandomRotation(30, interpolation=I.BICUBIC)], "worker",
         output="float"),
    Case("RandomPerspective", lambda m: [_crop(m), m.RandomPerspective()], "exact"),
    Case("RandomPerspective 0.8 nearest, fill, p=1", lambda m: [
        _crop(m), m.RandomPerspective(0.8, p=1.0, interpolation=I.NEAREST, fill=(10, 200, 30))], "exact"),
    Case("RandomPerspective bilinear, p=1, float output", lambda m: [_crop(m), m.RandomPerspective(0.3, p=1.0)],
         "exact", output="float"),
    Case("RandomPerspective before a crop", lambda m: [m.RandomPerspective(p=1.0), m.CenterCrop(160)], "worker",
         output="float"),
    Case("RandomPerspective bicubic", lambda m: [_crop(m), m.RandomPerspective(interpolation=I.BICUBIC)],
         "worker", output="float"),
    Case("FiveCrop", lambda m: [_crop(m), m.FiveCrop(100), _stack(m)], "worker", output="own"),
    Case("TenCrop", lambda m: [_crop(m), m.TenCrop(100), _stack(m)], "worker", output="own"),
    Case("RandomShortestSize", lambda m: [v2.RandomShortestSize([150, 180], max_size=260)], "exact",
         apis=("v2",), output="float", batch=1),
    Case("ScaleJitter", lambda m: [v2.ScaleJitter((200, 200))], "exact", apis=("v2",), output="float", batch=1),
    Case("RandomResize", lambda m: [v2.RandomResize(150, 200)], "exact", apis=("v2",), output="float", batch=1),
    # policies (TrivialAugmentWide, RandAugment, AutoAugment: torch stage, exact; AugMix: the worker by default,
    # test_policies.py runs it in the torch stage with augmix="stage")
    Case("AutoAugment imagenet", lambda m: [_crop(m), m.AutoAugment()], "exact", batch=8),
    Case("AutoAugment cifar10", lambda m: [_crop(m), m.AutoAugment(T.AutoAugmentPolicy.CIFAR10)], "exact", batch=8),
    Case("AutoAugment svhn", lambda m: [_crop(m), m.AutoAugment(T.AutoAugmentPolicy.SVHN)], "exact", batch=8),
    Case("RandAugment", lambda m: [_crop(m), m.RandAugment()], "exact"),
    Case("RandAugment 3 ops, magnitude 15, fill", lambda m: [_crop(m), m.RandAugment(3, 15, fill=[9, 99, 199])],
         "exact"),
    Case("TrivialAugmentWide", lambda m: [_crop(m), m.TrivialAugmentWide()], "exact", batch=8),
    Case("TrivialAugmentWide bilinear (the references' --auto-augment ta_wide)",
         lambda m: [_crop(m), m.TrivialAugmentWide(interpolation=T.InterpolationMode.BILINEAR)], "exact", batch=8),
    Case("RandAugment bilinear", lambda m: [_crop(m), m.RandAugment(interpolation=T.InterpolationMode.BILINEAR)],
         "exact"),
    Case("AutoAugment imagenet bilinear",
         lambda m: [_crop(m), m.AutoAugment(interpolation=T.InterpolationMode.BILINEAR)], "exact", batch=8),
    Case("RandAugment on a uint8 tensor (torchvision's tensor kernels)", lambda m: [
        m.PILToTensor(), m.CenterCrop(200), m.RandAugment()], "exact", output="own", batch=8),
    Case("TrivialAugmentWide bilinear on a uint8 tensor", lambda m: [
        m.PILToTensor(), m.CenterCrop(200), m.TrivialAugmentWide(interpolation=I.BILINEAR, fill=[9, 99, 199])],
        "exact", output="own", batch=8),
    Case("AutoAugment on a uint8 tensor", lambda m: [m.PILToTensor(), m.CenterCrop(200), m.AutoAugment()], "exact",
         output="own", batch=8),
    Case("v2 recipe: ToImage, RandomResizedCrop, flip, TrivialAugmentWide, ToDtype, RandomErasing",
         lambda m: [v2.ToImage(), v2.RandomResizedCrop(176, antialias=True), v2.RandomHorizontalFlip(),
                    v2.TrivialAugmentWide(interpolation=I.BILINEAR), v2.ToDtype(torch.float32, scale=True),
                    v2.RandomErasing(0.25)], "exact", apis=("v2",), output="own", batch=8, dali_resize="bound"),
    Case("TrivialAugmentWide before a crop", lambda m: [m.TrivialAugmentWide(), m.CenterCrop(160)], "worker",
         output="float"),
    Case("AugMix", lambda m: [_crop(m), m.AugMix()], "worker", batch=8),
    Case("AugMix severity 5, width 4, depth 2, nearest, fill, not all ops", lambda m: [_crop(m), m.AugMix(
        5, 4, 2, alpha=0.5, all_ops=False, interpolation=I.NEAREST, fill=[9, 99, 199])], "worker", batch=8),
    Case("AugMix on a uint8 tensor", lambda m: [m.PILToTensor(), m.CenterCrop(200), m.AugMix()], "worker",
         output="own", batch=8),
    # composition
    Case("RandomApply(ColorJitter, RandomInvert)", lambda m: [_crop(m), m.RandomApply(
        [m.ColorJitter(0.4, 0.4, 0.4, 0.1), m.RandomInvert(1.0)], p=0.6)], "exact"),
    Case("RandomApply(GaussianBlur)", lambda m: [_crop(m), m.RandomApply([m.GaussianBlur(9, (0.1, 2.0))], p=0.5)],
         "bound"),
    Case("RandomChoice", lambda m: [_crop(m), m.RandomChoice([m.RandomInvert(1.0), m.Grayscale(3)])], "exact",
         output="float"),  # recorded: Pillow's invert table, torchvision's 3-channel grayscale
    Case("RandomOrder", lambda m: [_crop(m), m.RandomOrder([m.RandomInvert(0.5), m.RandomSolarize(99)])], "exact",
         output="float"),  # recorded: Pillow's invert and solarize tables
    Case("nested Compose", lambda m: [(T.Compose if m is T else v2.Compose)([_crop(m), m.RandomHorizontalFlip()])],
         "exact"),
    Case("Identity", lambda m: [_crop(m), v2.Identity()], "exact", apis=("v2",)),
    Case("Lambda", lambda m: [_crop(m), m.Lambda(lambda im: im.transpose(0))], "exact", output="float"),  # recorded
    Case("chain: padded crop, flip, invert, posterize, solarize", lambda m: [
        m.RandomCrop(200, padding=4), m.RandomHorizontalFlip(), m.RandomInvert(0.3), m.RandomPosterize(4, p=0.5),
        m.RandomSolarize(128, p=0.5)], "exact"),
    Case("chain: crop, flip, ColorJitter, RandomGrayscale", lambda m: [
        m.RandomCrop(200), m.RandomHorizontalFlip(), m.ColorJitter(0.4, 0.4, 0.4, 0.1), m.RandomGrayscale(0.2)],
        "exact"),
    # after ToTensor
    Case("ToTensor + Normalize", _normalized, "exact", output="own"),
    Case("RandomErasing value 0", lambda m: _normalized(m) + [m.RandomErasing(p=0.8)], "exact", output="own"),
    Case("RandomErasing per channel", lambda m: _normalized(m) + [m.RandomErasing(
        p=1.0, scale=(0.1, 0.5), ratio=(0.5, 2.0), value=(0.5, -1.0, 2.0))], "exact", output="own"),
    Case("RandomErasing value 'random'", lambda m: _normalized(m) + [m.RandomErasing(value="random")], "worker",
         output="own"),
]


def where_it_runs(case: Case, api: str) -> Tuple[str, Optional[str]]:
    """("DALI", None), ("partial", reason), ("fallback", reason) or ("recorded", reason), from the
    planner alone ("recorded": what the step's calls need is known once a worker has called it)."""
    from dali_autoproxy.plan.ir import Unsupported
    from dali_autoproxy.plan.planning import build_plan
    try:
        plan = build_plan(case.chain(api))
    except Unsupported as exc:
        return "fallback", str(exc)
    if plan.worker_prefix:
        return "partial", plan.split_reason
    if plan.records:
        return "recorded", "a step is recorded: its Pillow calls decide, per sample, whether it needs pixels"
    return "DALI", None
