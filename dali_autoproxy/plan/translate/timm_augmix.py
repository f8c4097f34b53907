"""timm's AugMixAugment (``auto_augment='augmix-...'``), recognised by qualified name.

timm mixes ``width`` copies of a PIL image, each through 1 to 3 (or ``depth``) of its
``AugmentOp``s, in a float32 NumPy array, clips and truncates it to uint8 and blends the source
with it (``Image.blend``). Here the worker makes timm's draws in timm's order (NumPy's Dirichlet
and Beta samples, each copy's depth and ``np.random.choice`` of ops, each op's own Python
``random`` draws) and records what each chosen op asks of Pillow on a recording image: an affine
``transform`` (rotations, shears, translations) or one colour call (autocontrast, equalize,
enhancers, solarize and posterize tables). Each op of a copy has a slot of two ops, a ``Warp``
and a ``PillowCall``, one of them drawn and the other neutral; the torch stage keeps the source,
runs the copies, mixes them (``MixStart``, ``MixAdd``: timm's float32 arithmetic) and blends
(``MixBlend``: Pillow's). Guarded by the fingerprints of timm's code, which the draws copy.
"""
from __future__ import annotations

import functools
import sys

import numpy as np
from PIL import Image

from dali_autoproxy.plan.ir import Unsupported, Warp
from dali_autoproxy.plan.pillow_ops import CALL_CODE, PillowCall
from dali_autoproxy.plan.policy_ops import MixAdd, MixBlend, MixStart
from dali_autoproxy.plan.record.image import GEOMETRY_CALLS, NeedsPixels, RecordingImage, recording
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.policies import AUGMIX_IN_THE_WORKER
from dali_autoproxy.plan.translate.registry import fingerprint, register, transform_name

_AA = "timm.data.auto_augment."
# timm 1.0's code that the draws below follow: AugMixAugment.__call__ and _apply_basic, AugmentOp.__call__
_CODE = {"AugMixAugment.__call__": "d70422e38496f693", "AugMixAugment._apply_basic": "a52ea5e51e3f7daa",
         "AugmentOp.__call__": "e9e37e69196bc61e"}
_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


@functools.lru_cache(maxsize=None)
def _code_known(module_name: str) -> bool:
    module = sys.modules[module_name]
    try:
        found = {}
        for name in _CODE:
            owner, attribute = name.split(".")
            found[name] = fingerprint(getattr(getattr(module, owner), attribute))
        return found == _CODE
    except (AttributeError, OSError, TypeError, SyntaxError):
        return False


def _warp_settings(t) -> tuple:
    """(fill, bilinear) of the ops' affine transforms, one for all of them, as ``Warp`` fixes it."""
    settings = set()
    for op in t.ops:
        resample, fill = op.kwargs.get("resample"), op.kwargs.get("fillcolor")
        if isinstance(resample, (list, tuple)):
            raise Unsupported(f"{transform_name(t)} with a random interpolation per op (timm's default without "
                              "an 'interpolation' hparam) is not translated")
        if resample not in (Image.Resampling.NEAREST, Image.Resampling.BILINEAR):
            raise Unsupported(f"{transform_name(t)} with {resample!r} warps: the exact warps are nearest or bilinear")
        if not (isinstance(fill, tuple) and len(fill) == 3 and all(type(v) is int for v in fill)):
            raise Unsupported(f"{transform_name(t)} with the fill {fill!r}: an RGB fill of integers is translated")
        settings.add((tuple(float(v) for v in fill), resample == Image.Resampling.BILINEAR))
    if len(settings) != 1:
        raise Unsupported(f"{transform_name(t)} whose ops warp with different fills or filters")
    return settings.pop()


@register(_AA + "AugMixAugment")
def timm_aug_mix(t, state: ChainState, alloc) -> Step:
    if SETTINGS["augmix"] != "stage":
        raise Unsupported(AUGMIX_IN_THE_WORKER.format(transform_name(t)))
    module = sys.modules[type(t).__module__]
    if not _code_known(module.__name__):
        raise Unsupported(f"{transform_name(t)}: timm's AugMix code is not the one translated here (another "
                          "version): it runs as written")
    if t.blended:
        raise Unsupported(f"{transform_name(t)} in blended mode ('b1') is not translated")
    if not t.ops or any(type(op).__name__ != "AugmentOp" for op in t.ops):
        raise Unsupported(f"{transform_name(t)} with ops other than timm's AugmentOp")
    fill, bilinear = _warp_settings(t)
    if state.kind != "pil" or state.channels != 3:
        raise Unsupported(f"{transform_name(t)} is translated on RGB PIL images")
    if SETTINGS["record"] != "on":
        raise Unsupported(f"{transform_name(t)} records its ops' Pillow calls, and recording is off")
    depth = t.depth if t.depth > 0 else 3
    start = MixStart(alloc(MixStart), tensors=False)
    copies = []
    for i in range(t.width):
        slots = [(Warp(alloc(Warp), fill=fill, bilinear=bilinear), PillowCall(alloc(PillowCall)))
                 for _ in range(depth)]
        copies.append((slots, MixAdd(alloc(MixAdd), last=i == t.width - 1)))
    end = MixBlend(alloc(MixBlend))
    ops = [start]
    for slots, add in copies:
        ops += [op for slot in slots for op in slot] + [add]
    ops.append(end)
    name, kind = transform_name(t), type(t)

    def recorded(op, img: RecordingImage) -> RecordingImage:
        """``op(img)`` on a recording image: what it asked of Pillow, appended to ``img.calls``."""
        try:
            out = op(img)
        except NeedsPixels as exc:
            raise NeedsPixels(f"{name}: its {op.name} needs pixels ({exc.what})", exc.where, transform=kind) from None
        except Exception as exc:  # its plain run raises it again, in the worker
            raise NeedsPixels(f"{name}: its {op.name} raised {type(exc).__name__} on a recording image",
                              transform=kind) from None
        if type(out) is not RecordingImage or out.mode != "RGB" or out.size != img.size:
            raise NeedsPixels(f"{name}: its {op.name} did not return an RGB image of the same size", transform=kind)
        return out

    def draw(g) -> None:
        weights = np.float32(np.random.dirichlet([t.alpha] * t.width))
        m = np.float32(np.random.beta(t.alpha, t.alpha))
        height, width = int(g.height), int(g.width)
        g.put(start, weight=0.0)  # timm's mix starts from zeros
        recording.active += 1
        try:
            for (slots, add), weight in zip(copies, weights):
                n = t.depth if t.depth > 0 else np.random.randint(1, 4)
                img = RecordingImage((width, height), "RGB")
                made = []
                for op in np.random.choice(t.ops, n, replace=True):
                    out = recorded(op, img)
                    calls = out.calls[len(img.calls):]
                    if len(calls) > 1:
                        raise NeedsPixels(f"{name}: its {op.name} made {len(calls)} Pillow calls", transform=kind)
                    made.append(calls[0] if calls else None)
                    img = out
                for (warp, call), what in zip(slots, made + [None] * (len(slots) - len(made))):
                    if what is not None and what[0] == "warp":
                        if what[1:5] != (fill, bilinear, height, width):
                            raise NeedsPixels(f"{name}: a warp other than its ops' planned one", transform=kind)
                        g.put(warp, *what[5:11], height, width, height, width)
                        g.put(call, *PillowCall.neutral)
                        continue
                    g.put(warp, *_IDENTITY, height, width, height, width)
                    if what is None:
                        g.put(call, *PillowCall.neutral)
                    elif what[0] in GEOMETRY_CALLS or what[0] not in CALL_CODE:
                        raise NeedsPixels(f"{name}: its ops made a {what[0]!r} call", transform=kind)
                    else:
                        g.put(call, CALL_CODE[what[0]], *(tuple(what[1:]) + (0.0, 0.0, 0.0))[:3])
                g.put(add, weight=float(weight))
        finally:
            recording.active -= 1
        g.put(end, alpha=float(m))
    return Step(name, ops, draw)
