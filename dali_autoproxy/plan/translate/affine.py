"""RandomRotation and RandomAffine, RandomPerspective, each nearest or bilinear, on PIL images.

The worker draws the parameters with torchvision's own code and turns them into the inverse
matrix exactly as torchvision and Pillow do (Pillow's ``Image.rotate`` rounds cos/sin to 15
places; torchvision's ``_get_inverse_affine_matrix`` for RandomAffine). The warp itself runs
in the torch stage, which reproduces Pillow's 16.16 fixed-point sampling (nearest) or its
generic transform with the bilinear filter (an affine matrix is a perspective one with g = h = 0):
the result is Pillow's, pixel for pixel. DALI's own warp samples in float and differs on ~0.2% of the pixels,
so a warp that the torch stage cannot take (one before a resize) stays in the worker.

RandomPerspective: the worker makes torchvision's draw and its own coefficients
(``_get_perspective_coeffs``); the torch stage then evaluates Pillow's generic transform in
float64 with the C's operation order (and its bilinear filter's truncation): exact too.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode

from dali_autoproxy.plan.ir import SAME_SIZE, Perspective, Unsupported, Warp
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.geometry import as_mode
from dali_autoproxy.plan.translate.registry import register, transform_name, v2_params
from dali_autoproxy.plan.tv_internals import rotation_matrix


def pil_resample(t, state: ChainState, allowed=(InterpolationMode.NEAREST,)) -> InterpolationMode:
    """The transform's interpolation, where it is one of ``allowed`` and the image is a PIL one."""
    if state.kind != "pil":
        raise Unsupported(f"{transform_name(t)} on tensors (torch's grid_sample) is not translated; "
                          "on PIL images it is")
    mode = as_mode(t.interpolation)
    if mode not in allowed:
        raise Unsupported(f"{transform_name(t)} with {mode.value} interpolation (Pillow's filtered transform) "
                          f"is not translated; {' and '.join(m.value.upper() for m in allowed)} "
                          f"{'is' if len(allowed) == 1 else 'are'}")
    return mode


def pil_fill(fill, channels: int) -> Tuple[float, ...]:
    """torchvision's _parse_fill for a PIL image: the fillcolor Pillow gets, as integers."""
    if isinstance(fill, dict):
        raise Unsupported("a per-type fill dict is not translated")
    if fill is None:
        fill = 0
    values = [fill] * channels if isinstance(fill, (int, float)) else list(fill)
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise Unsupported(f"a fill of {len(values)} values for {channels} channels; torchvision would raise")
    return tuple(float(int(v)) for v in values)


WARP_MODES = (InterpolationMode.NEAREST, InterpolationMode.BILINEAR)  # Pillow's fixed-point / generic paths


@register(T.RandomRotation, v2.RandomRotation)
def random_rotation(t, state: ChainState, alloc) -> Step:
    bilinear = pil_resample(t, state, WARP_MODES) == InterpolationMode.BILINEAR
    if t.expand:
        raise Unsupported(f"{transform_name(t)}(expand=True) changes each image's size; not translated")
    fill = pil_fill(t.fill if not isinstance(t.fill, dict) else t.fill, state.channels)
    center = t.center
    warp = Warp(alloc(Warp), fill, bilinear)
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def angle_of(g) -> float:
            return float(params([g.standin()])["angle"])
    else:
        degrees = t.degrees

        def angle_of(g) -> float:
            return T.RandomRotation.get_params(degrees)

    def draw(g) -> None:
        g.put(warp, *rotation_matrix(angle_of(g), g.width, g.height, center), g.height, g.width, g.height, g.width)
    return Step(transform_name(t), [warp], draw)


@register(T.RandomAffine, v2.RandomAffine)
def random_affine(t, state: ChainState, alloc) -> Step:
    from torchvision.transforms.functional import _get_inverse_affine_matrix
    bilinear = pil_resample(t, state, WARP_MODES) == InterpolationMode.BILINEAR
    fill = pil_fill(t.fill, state.channels)
    center = t.center
    warp = Warp(alloc(Warp), fill, bilinear)
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def drawn(g):
            p = params([g.standin()])
            return p["angle"], p["translate"], p["scale"], p["shear"]
    else:
        def drawn(g):
            return T.RandomAffine.get_params(t.degrees, t.translate, t.scale, t.shear, [g.width, g.height])

    def draw(g) -> None:
        angle, translate, scale, shear = drawn(g)
        c = list(center) if center is not None else [g.width * 0.5, g.height * 0.5]
        g.put(warp, *_get_inverse_affine_matrix(c, float(angle), [float(v) for v in translate], float(scale),
                                                [float(v) for v in shear]), g.height, g.width, g.height, g.width)
    return Step(transform_name(t), [warp], draw)


@register(T.RandomPerspective, v2.RandomPerspective)
def random_perspective(t, state: ChainState, alloc) -> Step:
    import torch
    from torchvision.transforms.functional import _get_perspective_coeffs
    if state.kind != "pil":
        raise Unsupported(f"{transform_name(t)} on tensors (torch's grid_sample) is not translated; "
                          "on PIL images it is")
    mode = as_mode(t.interpolation)
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.BILINEAR):
        raise Unsupported(f"{transform_name(t)} with {mode.value} interpolation (Pillow's bicubic filter) "
                          "is not translated; NEAREST and BILINEAR are")
    fill = pil_fill(t.fill, state.channels)
    op, p = Perspective(alloc(Perspective), fill, mode == InterpolationMode.BILINEAR), float(t.p)
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def coefficients(g) -> Optional[List[float]]:
            if torch.rand(1) >= p:  # v2's _RandomApplyTransform
                return None
            return params([g.standin()])["coefficients"]
    else:
        def coefficients(g) -> Optional[List[float]]:
            if not torch.rand(1) < p:
                return None
            start, end = T.RandomPerspective.get_params(g.width, g.height, t.distortion_scale)
            return _get_perspective_coeffs(start, end)

    def draw(g) -> None:
        coeffs = coefficients(g)
        g.put(op, *(Perspective.neutral if coeffs is None else [float(v) for v in coeffs] + list(SAME_SIZE)))
    return Step(transform_name(t), [op], draw, neutral=list(Perspective.neutral))
