"""A transform without a translation, on a PIL image: called with a recording image.

Planning falls back to this for a step that has no converter (or whose converter refused it)
where the chain holds an RGB PIL image: a user's class, a function in a Compose, a torchvision
transform whose arguments have no translation. The step's drawer runs the transform itself, in
the worker, on a :class:`~dali_autoproxy.plan.recording.RecordingImage` of the sample's size;
the Pillow calls it made become ``PillowCall`` ops with the arguments it passed (a few positions
per transform: ``CALL_WIDTHS``, grown when a sample records more). Where it needs pixels, or
returns anything but the recording image of the same size and mode, the drawer raises
``NeedsPixels`` and the worker plans the chain again with this transform in the worker.
"""
from __future__ import annotations

from typing import Optional

from dali_autoproxy.plan.pillow_ops import CALL_CODE, PillowCall
from dali_autoproxy.plan.recording import CALL_WIDTHS, PIXEL_READERS, NeedsPixels, RecordingImage, recording
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import compose_types, transform_name

DEFAULT_CALLS = 2  # calls planned per sample for a transform not recorded before


def cannot_record(t: object, state: ChainState) -> Optional[str]:
    """Why ``t`` cannot be recorded at this point of the chain (None: it can)."""
    if SETTINGS["record"] != "on":
        return "recording is off (record='off')"
    if state.kind != "pil" or state.channels != 3:
        return f"{transform_name(t)} on {state.kind} images with {state.channels} channels is not recorded"
    if not callable(t) or isinstance(t, type) or type(t) in compose_types():
        return f"{transform_name(t)} is not a transform"
    return PIXEL_READERS.get(type(t))


def record_step(t: object, state: ChainState, alloc, refused: str = "") -> Step:
    """The Step of a transform recorded per sample: its PillowCall positions and the drawer that
    calls it with a recording image (the image's size and mode are unchanged by it). ``refused``:
    why it has no translation, said again where it turns out to need pixels."""
    width = CALL_WIDTHS.get(type(t), DEFAULT_CALLS)
    ops = [PillowCall(alloc(PillowCall)) for _ in range(width)]
    name, kind = transform_name(t), type(t)
    said = f"{refused}; recorded, " if refused else f"{name} "
    none = PillowCall.neutral

    def draw(g) -> None:
        img = RecordingImage((int(g.width), int(g.height)), "RGB")
        recording.active += 1
        try:
            out = t(img)
        except NeedsPixels as exc:
            raise NeedsPixels(f"{said}needs pixels ({exc.what})", exc.where, transform=kind) from None
        except Exception as exc:  # what it raises on a real image, its plain run raises again
            raise NeedsPixels(f"{said}raised {type(exc).__name__} on a recording image", transform=kind) from None
        finally:
            recording.active -= 1
        if type(out) is not RecordingImage or out.size != img.size or out.mode != "RGB":
            made = type(out).__name__ if type(out) is not RecordingImage else f"a {out.mode} image of {out.size}"
            raise NeedsPixels(f"{said}returned {made}, not an RGB image of its input's size", transform=kind)
        calls = out.calls
        if len(calls) > width:
            raise NeedsPixels(f"{name} made {len(calls)} Pillow calls, {width} planned", calls=len(calls),
                              transform=kind)
        for k, op in enumerate(ops):
            if k < len(calls):
                call, a, b, c = calls[k]
                g.put(op, CALL_CODE[call], a, b, c)
            else:
                g.put(op, *none)
    return Step(name, ops, draw, neutral=list(none) * width, note=refused or f"{name} has no DALI translation")
