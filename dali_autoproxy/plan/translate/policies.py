"""Augmentation policies: TrivialAugmentWide, RandAugment, AutoAugment, AugMix (v1, v2), on PIL
images and on uint8 tensor images.

The worker makes torchvision's own draws, in its order (which operation, which magnitude bin,
which sign), reading the magnitudes from the transform's own augmentation space; each chosen
operation travels as (index, magnitude) and runs in the torch stage. On PIL images with
Pillow's arithmetic, one group of samples per operation (v2's Solarize magnitude, a fraction of
255, is stored in v1's levels so one kernel serves both); on tensors with torchvision's own
tensor arithmetic of the transform's API (torch_stage/tensor_policies.py).
"""
from __future__ import annotations

import functools

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode

from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, Augment, MixAdd, MixStart, TensorAugment
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.affine import pil_fill, pil_resample
from dali_autoproxy.plan.translate.geometry import as_mode
from dali_autoproxy.plan.translate.registry import fingerprint, register, transform_name
from dali_autoproxy.plan.tv_internals import tensor_policy_operation, v2_grid_functions


def _policy_fill(t, state: ChainState):
    """(fill, bilinear) of a policy on a PIL image: its geometric operations go through Pillow's
    affine transform, nearest (16.16 fixed point) or bilinear (its generic transform), both
    reproduced exactly in the torch stage."""
    mode = pil_resample(t, state, (InterpolationMode.NEAREST, InterpolationMode.BILINEAR))
    fill = t.fill
    if isinstance(fill, dict):  # v2 keeps a per-type dict; PIL images get the PIL entry
        import PIL.Image
        fill = fill.get(PIL.Image.Image, fill.get("others")) if fill else None
    return pil_fill(fill, state.channels), mode == InterpolationMode.BILINEAR


def _tensor_fill(t, state: ChainState):
    """The fill torchvision hands its tensor kernels: v1's forward makes a list of floats, v2
    looks its per-type dict up for an image (``_get_fill``)."""
    if isinstance(t, v2.Transform):
        from torchvision import tv_tensors
        fill = t._fill.get(tv_tensors.Image, t._fill.get("others"))
        return tuple(fill) if isinstance(fill, list) else fill
    fill = t.fill
    if isinstance(fill, (int, float)):
        return (float(fill),) * state.channels
    return None if fill is None else tuple(float(f) for f in fill)


def _policy_ops(t, state: ChainState, alloc, count: int):
    """The ops of a policy that applies ``count`` operations per sample: on a PIL image Pillow's
    arithmetic (Augment); on a uint8 tensor torchvision's own tensor arithmetic (TensorAugment)."""
    if state.kind == "pil":
        fill, bilinear = _policy_fill(t, state)
        return [Augment(alloc(Augment), fill, bilinear) for _ in range(count)]
    if state.dtype != "uint8":
        raise Unsupported(f"{transform_name(t)} on a float tensor is left to torchvision (its tensor "
                          "policies expect uint8)")
    mode = as_mode(t.interpolation)
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise Unsupported(f"{transform_name(t)} with {mode.value} interpolation on tensors; "
                          "torchvision would raise")
    api = "v2" if isinstance(t, v2.Transform) else "v1"
    try:
        tensor_policy_operation(api)
        v2_grid_functions()
    except (ImportError, AttributeError) as exc:  # torchvision moved its private kernels
        raise Unsupported(f"{transform_name(t)} on tensors needs torchvision's policy kernels, "
                          f"not found in this torchvision ({exc})") from None
    fill = _tensor_fill(t, state)
    return [TensorAugment(alloc(TensorAugment), fill, mode.value, api) for _ in range(count)]


def _solarize_scale(ops) -> float:
    """v2 draws Solarize as a fraction of the range; Pillow's kernel (Augment) takes v1's levels."""
    return 255.0 if isinstance(ops[0], Augment) else 1.0


def _v1_draw(space, signed_rng=True):
    """v1's draw from an ``_augmentation_space`` dict: op, magnitude bin (or fixed), sign."""
    names = list(space.keys())
    name = names[int(torch.randint(len(names), (1,)).item())]
    magnitudes, signed = space[name]
    return name, magnitudes, signed


def _record(g, op, name: str, magnitude: float) -> None:
    g.put(op, operation=AUGMENT_OPS.index(name), magnitude=float(magnitude))


@register(T.TrivialAugmentWide)
def trivial_augment_v1(t, state: ChainState, alloc) -> Step:
    ops = _policy_ops(t, state, alloc, 1)
    bins = t.num_magnitude_bins

    def draw(g) -> None:
        name, magnitudes, signed = _v1_draw(t._augmentation_space(bins))
        magnitude = (float(magnitudes[torch.randint(len(magnitudes), (1,), dtype=torch.long)].item())
                     if magnitudes.ndim > 0 else 0.0)
        if signed and torch.randint(2, (1,)):
            magnitude *= -1.0
        _record(g, ops[0], name, magnitude)
    return Step(transform_name(t), ops, draw)


@register(T.RandAugment)
def rand_augment_v1(t, state: ChainState, alloc) -> Step:
    ops = _policy_ops(t, state, alloc, t.num_ops)
    bins, level = t.num_magnitude_bins, t.magnitude

    def draw(g) -> None:
        space = t._augmentation_space(bins, (g.height, g.width))
        for op in ops:
            name, magnitudes, signed = _v1_draw(space)
            magnitude = float(magnitudes[level].item()) if magnitudes.ndim > 0 else 0.0
            if signed and torch.randint(2, (1,)):
                magnitude *= -1.0
            _record(g, op, name, magnitude)
    return Step(transform_name(t), ops, draw)


def _v2_magnitude(t, name, magnitudes_fn, signed, g, pick, solarize, bins=None) -> float:
    magnitudes = magnitudes_fn(bins or t.num_magnitude_bins, g.height, g.width)
    if magnitudes is None:
        return 0.0
    magnitude = float(magnitudes[pick()])
    if signed and torch.rand(()) <= 0.5:
        magnitude *= -1
    return magnitude * solarize if name == "Solarize" else magnitude


def _v2_item(space):
    keys = tuple(space.keys())
    key = keys[int(torch.randint(len(keys), ()))]
    return key, space[key]


@register(v2.TrivialAugmentWide)
def trivial_augment_v2(t, state: ChainState, alloc) -> Step:
    ops = _policy_ops(t, state, alloc, 1)
    solarize = _solarize_scale(ops)

    def draw(g) -> None:
        name, (fn, signed) = _v2_item(t._AUGMENTATION_SPACE)
        _record(g, ops[0], name, _v2_magnitude(t, name, fn, signed, g,
                                       lambda: int(torch.randint(t.num_magnitude_bins, ())), solarize))
    return Step(transform_name(t), ops, draw)


@register(v2.RandAugment)
def rand_augment_v2(t, state: ChainState, alloc) -> Step:
    ops = _policy_ops(t, state, alloc, t.num_ops)
    solarize = _solarize_scale(ops)

    def draw(g) -> None:
        for op in ops:
            name, (fn, signed) = _v2_item(t._AUGMENTATION_SPACE)
            _record(g, op, name, _v2_magnitude(t, name, fn, signed, g, lambda: t.magnitude, solarize))
    return Step(transform_name(t), ops, draw)


@register(T.AutoAugment)
def auto_augment_v1(t, state: ChainState, alloc) -> Step:
    """A sub-policy per sample, each of its two operations applied with its probability
    (Identity where not): torchvision's get_params, then its loop."""
    ops = _policy_ops(t, state, alloc, 2)

    def draw(g) -> None:
        policy_id, probs, signs = t.get_params(len(t.policies))
        space = t._augmentation_space(10, (g.height, g.width))
        for i, (name, p, magnitude_id) in enumerate(t.policies[policy_id]):
            if probs[i] <= p:
                magnitudes, signed = space[name]
                magnitude = float(magnitudes[magnitude_id].item()) if magnitude_id is not None else 0.0
                if signed and signs[i] == 0:
                    magnitude *= -1.0
                _record(g, ops[i], name, magnitude)
            else:
                _record(g, ops[i], "Identity", 0.0)
    return Step(transform_name(t), ops, draw)


@register(v2.AutoAugment)
def auto_augment_v2(t, state: ChainState, alloc) -> Step:
    policies = t._policies
    if any(len(p) != 2 for p in policies):
        raise Unsupported(f"{transform_name(t)} with sub-policies of other than two operations")
    ops = _policy_ops(t, state, alloc, 2)
    solarize = _solarize_scale(ops)

    def draw(g) -> None:
        policy = policies[int(torch.randint(len(policies), ()))]
        for op, (name, probability, magnitude_idx) in zip(ops, policy):
            if not torch.rand(()) <= probability:
                _record(g, op, "Identity", 0.0)
                continue
            fn, signed = t._AUGMENTATION_SPACE[name]
            _record(g, op, name, _v2_magnitude(t, name, fn, signed, g, lambda: magnitude_idx, solarize, bins=10))
    return Step(transform_name(t), ops, draw)


AUGMIX_IN_THE_WORKER = ("{} runs in the worker (augmix=\"worker\", the default): in the torch stage its copies' "
                        "operations, grouped per drawn operation, keep the main process behind the workers "
                        "(benchmarks/results/augmix_steady_h200.md); augmix=\"stage\" moves it there, exact")
# fingerprints of the AugMix.forward whose draws ``aug_mix`` makes (registry.fingerprint)
_AUG_MIX_FORWARD = {"v1": {"56853741bb30426c"}, "v2": {"13bb8a1b1bf3767a"}}


@functools.lru_cache(maxsize=None)
def _forward_fingerprint(cls: type) -> str:
    try:
        return fingerprint(cls.forward)
    except (OSError, TypeError, SyntaxError):
        return ""


@register(T.AugMix, v2.AugMix)
def aug_mix(t, state: ChainState, alloc) -> Step:
    """AugMix on a PIL image or a uint8 tensor: ``mixture_width`` copies of the image, each through
    ``chain_depth`` (or 1 to 3, drawn) policy operations of torchvision's tensor kernels, mixed in
    float32 with Dirichlet weights and truncated back to uint8. The worker makes forward's draws
    in its order (both Dirichlet samples first, then each copy's depth and operations); the torch
    stage keeps the source, runs each copy's operations (Identity past its depth) and mixes."""
    if SETTINGS["augmix"] != "stage":
        raise Unsupported(AUGMIX_IN_THE_WORKER.format(transform_name(t)))
    api = "v2" if isinstance(t, v2.Transform) else "v1"
    if _forward_fingerprint(type(t)) not in _AUG_MIX_FORWARD[api]:
        raise Unsupported(f"{transform_name(t)}: this torchvision's AugMix.forward is not the one translated "
                          "here (another version): it runs as written")
    if state.kind != "pil" and state.dtype != "uint8":
        raise Unsupported(f"{transform_name(t)} on a float tensor is left to torchvision (its operations "
                          "expect uint8)")
    mode = as_mode(t.interpolation)
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise Unsupported(f"{transform_name(t)} with {mode.value} interpolation; torchvision would raise")
    if api == "v2":  # the copies are plain tensors: v2 looks its fill up for that type
        fill = t._fill.get(torch.Tensor, t._fill.get("others"))
        fill = tuple(fill) if isinstance(fill, list) else fill
    else:
        fill = _tensor_fill(t, state)
    depth = t.chain_depth if t.chain_depth > 0 else 3
    start = MixStart(alloc(MixStart))
    copies = []
    for i in range(t.mixture_width):
        chain = [TensorAugment(alloc(TensorAugment), fill, mode.value, api) for _ in range(depth)]
        copies.append((chain, MixAdd(alloc(MixAdd), last=i == t.mixture_width - 1)))
    ops = [start] + [op for chain, add in copies for op in chain + [add]]
    space_v2 = (t._AUGMENTATION_SPACE if t.all_ops else t._PARTIAL_AUGMENTATION_SPACE) if api == "v2" else None

    def draw(g) -> None:
        m = t._sample_dirichlet(torch.tensor([t.alpha, t.alpha]).expand(1, -1))
        weights = t._sample_dirichlet(torch.tensor([t.alpha] * t.mixture_width).expand(1, -1)) * m[:, 1].view(1, -1)
        g.put(start, weight=float(m[0, 0]))
        space = t._augmentation_space(t._PARAMETER_MAX, (g.height, g.width)) if api == "v1" else space_v2
        for i, (chain, add) in enumerate(copies):
            n = t.chain_depth if t.chain_depth > 0 else int(torch.randint(low=1, high=4, size=(1,)).item())
            for k, op in enumerate(chain):
                if k >= n:
                    _record(g, op, "Identity", 0.0)
                elif api == "v1":
                    name, magnitudes, signed = _v1_draw(space)
                    magnitude = (float(magnitudes[torch.randint(t.severity, (1,), dtype=torch.long)].item())
                                 if magnitudes.ndim > 0 else 0.0)
                    if signed and torch.randint(2, (1,)):
                        magnitude *= -1.0
                    _record(g, op, name, magnitude)
                else:
                    name, (fn, signed) = _v2_item(space)
                    pick = lambda: int(torch.randint(t.severity, ()))  # noqa: E731
                    _record(g, op, name, _v2_magnitude(t, name, fn, signed, g, pick, 1.0, bins=t._PARAMETER_MAX))
            g.put(add, weight=float(weights[0, i]))
    return Step(transform_name(t), ops, draw)
