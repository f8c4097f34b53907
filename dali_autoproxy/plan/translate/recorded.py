"""A transform without a translation, on a PIL image: called with a recording image.

Planning falls back to this for a step that has no converter (or whose converter refused it)
where the chain holds an RGB PIL image: a user's class, a function in a Compose, a torchvision
transform whose arguments have no translation. The step's drawer runs the transform itself, in
the worker, on a :class:`~dali_autoproxy.plan.record.image.RecordingImage` of the sample's size;
the Pillow calls it made become ``PillowCall`` ops with the arguments it passed (a few positions
per transform: ``LEARNT.call_widths``, grown when a sample records more), its crops and resizes
``Crop`` and ``PillowResize`` ops (the plan's shape, ``LEARNT.shape_of``, learnt from the first
sample that makes them; a sample that does not make one gets its neutral values). Where it
needs pixels, or returns anything but an RGB recording image, the drawer raises
``NeedsPixels`` and the worker plans the chain again with this transform in the worker (or,
where it made size changes or more calls than planned, with a plan of that shape).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from dali_autoproxy.plan.ir import (
    PERSPECTIVE_IDENTITY,
    Crop,
    Flip,
    Perspective,
    PillowReduce,
    PillowResize,
    TensorResize,
    Warp,
)
from dali_autoproxy.plan.pillow_ops import CALL_CODE, PillowCall, RaggedPillowCall
from dali_autoproxy.plan.record.image import (
    GEOMETRY_CALLS,
    MAX_CALLS,
    CallShape,
    NeedsPixels,
    RecordingImage,
    call_token,
    recording,
)
from dali_autoproxy.plan.record.learnt import LEARNT, MAX_SIZE_CHANGES
from dali_autoproxy.plan.record.tensor import RecordingTensor, equivalent
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.steps import ChainState, Step
from dali_autoproxy.plan.translate.registry import compose_types, lookup, transform_name

DEFAULT_CALLS = 2  # calls planned per sample for a transform not recorded before


# How a sample's size change (or its absence) becomes the values of its op: each writes the op's
# values for an image of (height, width) and returns the size after it (None: a flip, no change).
# ``change``: the recorded call's token, None where this sample did not make it.
def _flipped(g, op: Flip, change, height: int, width: int) -> None:
    g.put(op, apply=1 if change is not None else 0)


def _cropped(g, op: Crop, change, height: int, width: int) -> Tuple[int, int]:
    """A crop ("crop", top, ...) or a pad ("pad", fill, top, ...); not made: the whole image."""
    top, left, h, w = change[-4:] if change is not None else (0, 0, height, width)
    g.put(op, top=top, left=left, height=h, width=w)
    return h, w


def _reduced(g, op: PillowReduce, change, height: int, width: int) -> Tuple[int, int]:
    """Not made: factors 1, 1."""
    fy, fx = change[3:5] if change is not None else (1, 1)
    g.put(op, in_height=height, in_width=width, factor_y=fy, factor_x=fx)
    return -(-height // fy), -(-width // fx)


def _tensor_resized(g, op: TensorResize, change, height: int, width: int) -> Tuple[int, int]:
    """Not made: to the same size, which torchvision returns as it is."""
    h, w = change[1:3] if change is not None else (height, width)
    g.put(op, height, width, h, w)
    return h, w


def _warped(g, op: Warp, change, height: int, width: int) -> Tuple[int, int]:
    """Not made: the identity to the same size, Pillow's copy."""
    h, w = change[3:5] if change is not None else (height, width)
    g.put(op, *(change[5:] if change is not None else (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)), height, width, h, w)
    return h, w


def _perspective(g, op: Perspective, change, height: int, width: int) -> Tuple[int, int]:
    """Not made: the identity to the same size, Pillow's copy."""
    h, w = change[3:5] if change is not None else (height, width)
    g.put(op, *(change[5:] if change is not None else PERSPECTIVE_IDENTITY), h, w)
    return h, w


def _resized(g, op: PillowResize, change, height: int, width: int) -> Tuple[int, int]:
    """A Pillow resize (the table's default); not made: the same size, Pillow's copy."""
    h, w, kind, top, left, bottom, right = change[1:] if change is not None else (height, width, 2, 0, 0, height,
                                                                                 width)
    g.put(op, in_height=height, in_width=width, out_height=h, out_width=w, filter=kind,
          box_top=top, box_left=left, box_bottom=bottom, box_right=right)
    return h, w


WRITE_CHANGE = {Flip: _flipped, Crop: _cropped, PillowReduce: _reduced, TensorResize: _tensor_resized,
                Warp: _warped, Perspective: _perspective}


def cannot_record(t: object, state: ChainState) -> Optional[str]:
    """Why ``t`` cannot be recorded at this point of the chain (None: it can)."""
    if SETTINGS["record"] != "on":
        return "recording is off (record='off')"
    if state.kind != "pil" or state.channels != 3:
        return f"{transform_name(t)} on {state.kind} images with {state.channels} channels is not recorded"
    if not callable(t) or isinstance(t, type) or type(t) in compose_types():
        return f"{transform_name(t)} is not a transform"
    return LEARNT.pixel_readers.get(type(t))


def planned_shape(t: object) -> CallShape:
    """The size changes ``t`` is planned with, in order, and the Pillow calls planned before,
    between and after them: what it recorded before (``LEARNT.shape_of``), else none and
    ``LEARNT.call_widths`` calls."""
    known = LEARNT.shape_of(t)
    if known is not None:
        return known
    return (), (LEARNT.call_widths.get(type(t), DEFAULT_CALLS),)


FLIPS = ("hflip", "vflip")  # in a joint transform's plan, recorded as Flip ops (DALI's, or the stage's on any size)


def split_calls(calls, flips: bool = False) -> Tuple[Tuple[str, ...], List[list], List[tuple]]:
    """A sample's recorded calls as its size changes (and, with ``flips``, its flips) and the
    runs of the other calls around them."""
    tokens, runs, changes = [], [[]], []
    for call in calls:
        if call[0] in GEOMETRY_CALLS or call[0] == "tensor" or (flips and call[0] in FLIPS):
            tokens.append(call_token(call))
            changes.append(call)
            runs.append([])
        else:
            runs[-1].append(call)
    return tuple(tokens), runs, changes


def fit(shape: CallShape, tokens: Tuple[str, ...], runs: List[list]) -> Optional[Tuple[List[Optional[int]], dict]]:
    """Where a sample's calls go in the planned shape: its size changes matched in order to the
    planned ones (a planned one left unmatched is neutral), each run of calls to the planned run
    before its next size change. None where they do not fit."""
    planned, widths = shape
    match: List[Optional[int]] = []
    j = 0
    for token in planned:
        if j < len(tokens) and tokens[j] == token:
            match.append(j)
            j += 1
        else:
            match.append(None)
    if j < len(tokens) or any(m is None and _makes_tensor(t) for t, m in zip(planned, match)):
        return None  # a tensor step cannot be left out: it changes what the chain holds
    placed = {0: runs[0]}
    for k, m in enumerate(match):
        if m is not None:
            placed[k + 1] = runs[m + 1]
    if any(len(calls) > widths[r] for r, calls in placed.items()):
        return None
    return match, placed


def _makes_tensor(token) -> bool:
    return isinstance(token, tuple) and token[0] == "tensor"


def _no_calls_on_tensors(shape: CallShape) -> CallShape:
    """No Pillow call is planned after a tensor step (there is no image to make it on)."""
    tokens, widths = shape
    first = next((k for k, t in enumerate(tokens) if _makes_tensor(t)), None)
    if first is None:
        return shape
    return tokens, tuple(w if r <= first else 0 for r, w in enumerate(widths))


def grown(shape: CallShape, tokens: Tuple[str, ...], runs: List[list], merge: bool = False) -> CallShape:
    """A shape that fits this sample's calls too. ``merge`` (a joint transform's plan, whose samples
    make different subsets of the same steps, all ending in the same tensor steps): the shortest
    sequence holding the planned size changes and the sample's in their orders, so that the shapes
    settle after a few samples instead of following each one."""
    if merge:  # the size changes and flips merged; the tensor steps (the chain's end) the sample's
        merged = _supersequence(tuple(t for t in shape[0] if not _makes_tensor(t)),
                                tuple(t for t in tokens if not _makes_tensor(t))) + tuple(
            t for t in tokens if _makes_tensor(t))
        if merged != tokens or merged != shape[0]:
            most = min(MAX_CALLS, max([len(r) for r in runs] + list(shape[1])))
            return _no_calls_on_tensors((merged, (most,) * (len(merged) + 1)))
    return _no_calls_on_tensors(_grown(shape, tokens, runs))


def merged_joint_shape(a: CallShape, b: CallShape) -> Optional[CallShape]:
    """A joint transform's shape that fits every sample either fits (the shapes two workers
    learnt, say): their size changes and flips merged as ``grown`` merges a sample's, each run of
    calls as wide as the widest; None where their tensor steps differ or the merge plans more
    size changes than a recorded transform may make."""
    tails = [tuple(t for t in shape[0] if _makes_tensor(t)) for shape in (a, b)]
    if tails[0] != tails[1]:
        return None
    merged = _supersequence(tuple(t for t in a[0] if not _makes_tensor(t)),
                            tuple(t for t in b[0] if not _makes_tensor(t))) + tails[1]
    if len(merged) > MAX_SIZE_CHANGES:
        return None
    most = min(MAX_CALLS, max(a[1] + b[1]))
    return _no_calls_on_tensors((merged, (most,) * (len(merged) + 1)))


def _supersequence(a: Tuple, b: Tuple) -> Tuple:
    """The shortest common supersequence of two token sequences (a before b where they differ)."""
    n, m = len(a), len(b)
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if a[i] == b[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append(a[i])
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return tuple(out) + tuple(a[i:]) + tuple(b[j:])


def guess_tensor_tail(t: object) -> bool:
    """A recorded transform that ends a chain on a PIL image: planned, until a sample shows what
    it does, as making a tensor the way ``to_tensor`` does (a chain must end in one); False where
    its shape is known already."""
    if LEARNT.shape_of(t) is not None:
        return False
    LEARNT.set_shape(t, ((("tensor", "to_tensor"),), (LEARNT.call_widths.get(type(t), DEFAULT_CALLS), 0)))
    return True


def _grown(shape: CallShape, tokens: Tuple[str, ...], runs: List[list]) -> CallShape:
    """A shape that fits this sample's calls too: its runs widened where its size changes fit in
    order, else its size changes planned after the planned ones, every later run as wide as the
    widest."""
    planned, widths = shape
    if planned == tokens:
        return planned, tuple(min(MAX_CALLS, max(w, len(r))) for w, r in zip(widths, runs))
    relaxed = fit((planned, (MAX_CALLS,) * (len(planned) + 1)), tokens, runs)
    if relaxed is not None:
        placed = relaxed[1]
        return planned, tuple(min(MAX_CALLS, max(w, len(placed.get(r, ())))) for r, w in enumerate(widths))
    if not planned or any(_makes_tensor(t) for t in planned + tokens):  # its first size changes, or tensor
        # steps (never left out, so a sample's own shape): calls before them as many as it made (a call planned
        # there, on images of every size, would keep the crop from DALI), room for more after
        return tokens, (len(runs[0]),) + tuple(min(MAX_CALLS, max(len(r), DEFAULT_CALLS)) for r in runs[1:])
    merged = planned + tokens
    most = max([len(r) for r in runs] + list(widths))
    return merged, (widths[0],) + tuple([min(MAX_CALLS, most)] * len(merged))


def record_step(t: object, state: ChainState, alloc, refused: str = "") -> Step:
    """The Step of a transform recorded per sample: its PillowCall positions, the size changes it
    makes (``ir.Crop``, ``ir.PillowResize``) and the drawer that calls it with a recording image.
    ``refused``: why it has no translation, said again where it turns out to need pixels."""
    shape = planned_shape(t)
    tokens, widths = shape
    ops: list = []
    runs: List[List[PillowCall]] = []
    changes: list = []
    call_op = RaggedPillowCall if state.any_size else PillowCall
    for r, width in enumerate(widths):
        runs.append([call_op(alloc(call_op)) for _ in range(width)])
        ops += runs[-1]
        if r < len(tokens):
            token = tokens[r]
            if _makes_tensor(token):  # the transform it equals, translated as such (state: a tensor now)
                made = equivalent(token[1:])
                step = lookup(made)(made, state, alloc)
                changes.append(None)
                ops += step.ops
                continue
            change = (Crop(alloc(Crop), in_bounds=False, fill=(0.0,)) if token == "crop"
                      else Flip(alloc(Flip), vertical=token == "vflip") if token in FLIPS
                      else PillowResize(alloc(PillowResize)) if token == "resize"
                      else PillowReduce(alloc(PillowReduce)) if token == "reduce"
                      else Crop(alloc(Crop), in_bounds=False, fill=token[1]) if token[0] == "pad"
                      else TensorResize(alloc(TensorResize), *token[1:]) if token[0] == "tensor_resize"
                      else Warp(alloc(Warp), fill=token[1], bilinear=token[2]) if token[0] == "warp"
                      else Perspective(alloc(Perspective), fill=token[1], bilinear=token[2]))
            changes.append(change)
            ops.append(change)
    if tokens:
        state.fixed_size = None  # each sample's size is its own
    name, kind = transform_name(t), type(t)
    state_flips = state.any_size
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
            raise NeedsPixels(f"{said}raised {type(exc).__name__} on a recording image ({str(exc)[:120]})",
                              transform=kind) from None
        finally:
            recording.active -= 1
        if type(out) is RecordingTensor:
            pass  # its calls end in the tensor steps it made
        elif type(out) is not RecordingImage or out.mode != "RGB":
            made = type(out).__name__ if type(out) is not RecordingImage else f"a {out.mode} image of {out.size}"
            raise NeedsPixels(f"{said}returned {made}, not an RGB image it recorded", transform=kind)
        made, sample_runs, sample_changes = split_calls(out.calls, state_flips)
        placed = fit(shape, made, sample_runs)
        if placed is None:
            total = sum(len(r) for r in sample_runs)
            raise NeedsPixels(f"{name} made {total} Pillow calls and size changes {list(made)}, planned "
                              f"{sum(widths)} and {list(tokens)}", calls=total if not made and not tokens else None,
                              transform=kind, shape=grown(shape, made, sample_runs, merge=state_flips),
                              instance=t)
        match, calls_at = placed
        height, width = int(g.height), int(g.width)
        for r, run in enumerate(runs):
            calls = calls_at.get(r, ())
            for k, op in enumerate(run):
                if k < len(calls):
                    call, a, b, c = (tuple(calls[k]) + (0.0, 0.0, 0.0))[:4]
                    g.put(op, CALL_CODE[call], a, b, c)
                else:
                    g.put(op, *none)
            if r < len(changes) and changes[r] is None:
                continue  # a tensor step: no values
            if r < len(changes):
                op, m = changes[r], match[r]
                change = sample_changes[m] if m is not None else None
                size = WRITE_CHANGE.get(type(op), _resized)(g, op, change, height, width)
                if size is not None:  # None: a flip, the same size
                    height, width = int(size[0]), int(size[1])
        g.height, g.width = height, width
    neutral = list(none) * sum(widths) if not tokens else None
    return Step(name, ops, draw, neutral=neutral, note=refused or f"{name} has no DALI translation")
