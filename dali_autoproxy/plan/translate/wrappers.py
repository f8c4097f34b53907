"""Classes that only hand the image to a transform they hold, recognised by their code.

Self-supervised libraries wrap each view's chain in a small class (lightly's
``SimCLRViewTransform``, ``DINOViewTransform``... and its ``ToTensor``) whose ``__call__`` is
``return self.transform(image)``. Such a class is its ``transform``: translated as that, with
its draws. Recognised by the fingerprint of ``__call__`` (``registry.fingerprint``), so any
class with exactly that code is taken, and a class that does anything more is not.
"""
from __future__ import annotations

from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import register_by_code, transform_name, translate_as

DELEGATES = (
    "517ff36f940f54d2",  # transformed: Tensor = self.transform(image); return transformed (lightly's views)
    "97c7ba6a48cbb4b5",  # def __call__(self, *args, **kwargs): return self.transform(*args, **kwargs)
    "89b2a07589fbbe52",  # def __call__(self, image): return self.transform(image)
)


@register_by_code(*DELEGATES)
def delegating_wrapper(t, state: ChainState, alloc) -> Step:
    inner = getattr(t, "transform", None)
    if inner is None:
        raise Unsupported(f"{transform_name(t)} has no transform to hand its image to")
    return translate_as(t, inner, state, alloc)
