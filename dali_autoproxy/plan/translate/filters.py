"""Filter converters: GaussianBlur.

The sigma is drawn per sample by torchvision's own code; DALI's gaussian_blur uses the same
normalised kernel and the same reflected border (reflect-101), accumulating in float as
torchvision does, so results differ only by float rounding (measured in the fidelity table).
"""
from __future__ import annotations

import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.plan.ir import Blur, Unsupported
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import register, transform_name, v2_params


@register(T.GaussianBlur, v2.GaussianBlur)
def gaussian_blur(t, state: ChainState, alloc) -> Step:
    kernel_x, kernel_y = (int(k) for k in t.kernel_size)  # torchvision orders it (x, y)
    if state.kind == "tensor" and state.dtype not in ("uint8", "float32"):
        raise Unsupported(f"GaussianBlur on {state.dtype} tensors is not translated")
    blur = Blur((kernel_y, kernel_x), alloc(Blur))
    if isinstance(t, v2.Transform):
        params = v2_params(t)

        def draw(g) -> None:
            sigma_x, sigma_y = params([g.standin()])["sigma"]
            g.put(blur, sigma_y=float(sigma_y), sigma_x=float(sigma_x))
    else:
        low, high = float(t.sigma[0]), float(t.sigma[1])

        def draw(g) -> None:
            sigma = T.GaussianBlur.get_params(low, high)
            g.put(blur, sigma_y=sigma, sigma_x=sigma)
    return Step(transform_name(t), [blur], draw, neutral=list(Blur.neutral))
