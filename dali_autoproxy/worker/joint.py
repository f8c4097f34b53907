"""Joint image-and-target transforms, in a proxied loader's workers.

Detection and segmentation transforms take the image with its targets: a v2 transform called
with ``(image, target)`` or any structure holding one image and ``tv_tensors`` (BoundingBoxes,
Mask, KeyPoints) and plain labels. Such a call is taken over for its image: the transform runs
for real, here, with a recording image of the image's size in the image's place
(``plan/record/image.py``) and the sample's own targets. torchvision therefore draws every parameter
as it always does (``make_params`` on the flattened sample, the same RNG calls in the same order)
and transforms the targets with its own kernels (boxes, masks, keypoints, ``SanitizeBoundingBoxes``,
``ConvertBoundingBoxFormat``): the targets it returns are plain's, bit for bit. The image's Pillow
calls (flips, crops, pads, resizes, photometric adjustments, the channel shuffle) and its
conversion to a tensor are recorded, and the image goes to DALI, still encoded, with those calls
as its ops: the whole joint call is one recorded step (:class:`JointCall`) of a one-step plan.

A call that is not taken (no RGB PIL image in it, several, a transform that needs the pixels) runs
as written, and the report says why. The targets a call is given are never the ones a failed
attempt touched: each attempt gets copies, so the call as written sees what the dataset passed.
"""
from __future__ import annotations

import random
from typing import Any, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image

from dali_autoproxy.config import logger
from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import Plan, build_joint_plan
from dali_autoproxy.plan.record.image import NeedsPixels, RecordingImage
from dali_autoproxy.plan.record.learnt import LEARNT
from dali_autoproxy.plan.record.tensor import RecordingTensor, settled
from dali_autoproxy.plan.translate.registry import compose_types, transform_name
from dali_autoproxy.plan.translate.registry import flatten as unroll
from dali_autoproxy.transport import ENCODED, RAW, WHY_RECORDING, ProxySample
from dali_autoproxy.tree import flatten, unflatten
from dali_autoproxy.worker.collate import own_generators, rng_states, set_rng_states
from dali_autoproxy.worker.deferred import encoded_jpeg
from dali_autoproxy.worker.proxy_node import MAX_REPLANS, _why_decoded_here

NOT_TAKEN = object()  # what a JointNode returns for a call it leaves to the transform as written
# draws of a joint chain's parameters a worker makes on its first sample, before the sample's own, when no
# earlier epoch left it a shape and the chain is torchvision's (``draws_from_global_generators``): the subsets
# of steps its samples make (a flip or none, a pad or none) are planned as one from the first batch instead
# of one plan, and one DALI pipeline, per new subset
PROBE_DRAWS = 16


class TransformRaised(BaseException):
    """The joint transform raised on the recording image and the sample's real targets (a bad
    target, say): the call runs as written, which raises plain's own exception. A BaseException,
    so that the recorded step's drawer does not take it for a need of pixels."""


class JointCall:
    """A joint transform seen by planning as a transform of one image: called with a recording
    image, it calls the transform with the sample's arguments, that image in the image's place,
    and keeps what the transform returned (``output``). Each joint chain gets a subclass of its own,
    so what planning learns of one (it needs pixels, it makes more calls) is learnt of it alone."""

    def __init__(self, transform: Any):
        self.transform = transform
        self.leaves: List[Any] = []
        self.spec: Any = None
        self.at = 0
        self.output: Optional[Tuple[List[Any], Any, int]] = None

    def given(self, leaves: List[Any], spec: Any, at: int) -> None:
        self.leaves, self.spec, self.at, self.output = leaves, spec, at, None

    def __call__(self, img: Any) -> Any:
        leaves = _copies(self.leaves)
        leaves[self.at] = img
        args, kwargs = unflatten(self.spec, leaves)
        try:
            out = self.transform(*args, **kwargs)
        except NeedsPixels:
            raise
        except Exception as exc:
            raise TransformRaised(exc) from None
        out_leaves, out_spec = flatten(out)
        found = [i for i, x in enumerate(out_leaves) if type(x) in (RecordingImage, RecordingTensor)]
        if len(found) != 1:
            raise NeedsPixels(f"the joint transform returned its image {len(found)} times")
        if type(out_leaves[found[0]]) is RecordingTensor:
            settled(out_leaves[found[0]])  # not a half-written border
        self.output = (out_leaves, out_spec, found[0])
        return out_leaves[found[0]]


def _copies(leaves: List[Any]) -> List[Any]:
    """The leaves a transform may change in place (the references' v1 classes write boxes and
    dicts in place), copied: tensors cloned (a tv_tensor keeps its type and metadata), arrays
    copied; the containers are rebuilt by ``unflatten``."""
    out = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            x = x.clone()
        elif isinstance(x, np.ndarray):
            x = x.copy()
        out.append(x)
    return out


def _the_image(leaves: List[Any]) -> Tuple[Optional[int], Optional[str]]:
    """Where the call's one RGB PIL image is, or why there is none to take."""
    rgb = [i for i, x in enumerate(leaves) if isinstance(x, Image.Image) and x.mode == "RGB"
           and type(x) is not RecordingImage]
    if len(rgb) == 1:
        return rgb[0], None
    if not rgb:
        kinds = sorted({type(x).__name__ for x in leaves if isinstance(x, (Image.Image, torch.Tensor))})
        return None, f"no RGB PIL image in the call ({', '.join(kinds) or 'no image'})"
    return None, f"{len(rgb)} RGB PIL images in one call"


def _steps_of(chain: Any) -> str:
    """`` (A -> B -> C)``: the steps a joint chain holds (its ``transforms``, nested Compose
    unrolled), for the report; empty for a class without such a list."""
    inner = getattr(chain, "transforms", None)
    if inner is not None and type(inner) in compose_types():
        inner = inner.transforms
    if not isinstance(inner, (list, tuple)) or not inner:
        return ""
    return f" ({' -> '.join(transform_name(t) for step in inner for t in unroll(step))})"


def draws_from_global_generators(t: Any) -> bool:
    """Whether ``t`` draws only from the global generators the probe draws put back: torchvision's
    own transforms and containers of them (torch's generator). A class of another library or of
    the user's code, or a ``Lambda``, may hold a generator of its own, which extra draws would move
    off plain's sequence."""
    if type(t).__name__ == "Lambda" or not type(t).__module__.startswith("torchvision."):
        return False
    inner = getattr(t, "transforms", None)
    if isinstance(inner, (list, tuple, torch.nn.ModuleList)):
        return all(draws_from_global_generators(x) for x in inner)
    return True


def joint_call(chain: Any) -> JointCall:
    """A JointCall of ``chain``, of a class of the chain's own (named after its steps: a plan
    made of it in any process has the same key)."""
    own = type(f"{type(chain).__name__} with its targets{_steps_of(chain)}", (JointCall,),
               {"__module__": type(chain).__module__})
    return own(chain)


def planned_jointly(chain: Any) -> Optional[Plan]:
    """The main process's plan of a chain that an earlier epoch's workers called with its targets
    (``LEARNT.joint_shape_of``): the plan those workers' successors start from, so its pipeline is
    built before the first batch asks for it. None where none is known or it cannot be planned."""
    shape = LEARNT.joint_shape_of(chain)
    if shape is None:
        return None
    call = joint_call(chain)
    LEARNT.set_shape(call, shape)
    try:
        return build_joint_plan(call)
    except Unsupported:
        return None
    finally:
        LEARNT.forget_shape(call)


class JointNode:
    """What a joint transform's call does in a worker: the targets transformed here by torchvision,
    the image handed to DALI with its recorded calls; or the call as written, with ``why``."""

    def __init__(self, chain: Any, announce_known: set, path: Optional[Tuple[Any, ...]] = None):
        self.chain = chain
        self.path = path  # where the dataset holds the chain (None: nowhere), sent with its shape
        self.call = joint_call(chain)
        self.generators = own_generators(chain)  # a draw made again puts these back too
        shape = LEARNT.joint_shape_of(chain)
        if shape is not None:  # what an earlier epoch's workers learnt (the main process kept it)
            LEARNT.set_shape(self.call, shape)
        self.known = announce_known
        self.why: Optional[str] = None  # why the last call was not taken
        self.plan: Optional[Plan] = None
        self.plain_reason: Optional[str] = None
        self._planned = False
        # an earlier epoch's shape is the merge of every worker's; a generator of a transform's own would move
        self._probed = shape is not None or not draws_from_global_generators(chain)

    @property
    def name(self) -> str:
        return f"joint image-and-target transform {transform_name(self.chain)}"

    def _make_plan(self) -> None:
        self._planned = True
        try:
            plan = build_joint_plan(self.call)
        except Unsupported as exc:  # it needs pixels: what it needed, without the "no translation" before it
            self.plan, self.plain_reason = None, f"{self.name}: {str(exc).split('; recorded, ', 1)[-1]}"
            return
        shape = LEARNT.shape_of(self.call)
        plan.joint_shape = (self.path, shape) if shape is not None and self.path is not None else None
        self.plan = plan

    def _probe(self, leaves: list, spec: Any, at: int, width: int, height: int) -> None:
        """``PROBE_DRAWS`` draws of the chain on this sample (a recording image, copies of its
        targets, the random generators seeded 0, 1, ...), each growing the shape as a sample's
        would; the worker's random states are put back after, so the sample's own draws, and
        every later one, are plain's. A draw on which the transform raises teaches nothing; one
        that fails otherwise ends the probing (the sample's own draw goes as it would have)."""
        self._probed = True
        states = rng_states(self.generators)
        try:
            for seed in range(PROBE_DRAWS):
                torch.random.default_generator.manual_seed(seed)
                random.seed(seed)
                np.random.seed(seed)
                for _ in range(MAX_REPLANS):
                    if not self._planned:
                        self._make_plan()
                    if self.plan is None:
                        return
                    self.call.given(leaves, spec, at)
                    try:
                        self.plan.draw_sample(height, width)
                    except NeedsPixels as exc:
                        LEARNT.learn(exc)
                        self._planned = False
                        continue
                    except TransformRaised:
                        pass
                    break
        except Exception:  # a draw no sample made: never the reason this sample fails
            logger.debug("a probe draw of %s failed", self.name, exc_info=True)
        finally:
            self.call.output = None
            set_rng_states(states)

    def __call__(self, args: tuple, kwargs: dict, decoded_because: Optional[str] = None) -> Any:
        """``decoded_because``: why the joint call this one runs inside was left as written (the
        reason its image, if decoded, was decoded in the worker)."""
        leaves, spec = flatten((args, kwargs))
        at, why = _the_image(leaves)
        if at is None:
            self.why = f"{self.name}: {why}"
            return NOT_TAKEN
        img = leaves[at]
        enc = encoded_jpeg(img)
        if not self._probed:
            self._probe(leaves, spec, at, *(enc[1] if enc is not None else img.size))
        for _ in range(MAX_REPLANS):
            if not self._planned:
                self._make_plan()
            if self.plan is None:
                self.why = self.plain_reason
                return NOT_TAKEN
            states = rng_states(self.generators)
            self.call.given(leaves, spec, at)
            try:
                if enc is not None:
                    data, (width, height), path = enc
                    params, shape = self.plan.draw_sample(height, width)
                    payload, kind, why = np.frombuffer(data, dtype=np.uint8), ENCODED, None
                else:
                    payload = np.asarray(img)  # Pillow decodes here; DALI still runs the ops
                    params, shape = self.plan.draw_sample(*payload.shape[:2])
                    kind, why, path, data = RAW, decoded_because or _why_decoded_here(img), None, None
            except TransformRaised:  # a real error of the transform: plain raises it
                set_rng_states(states)
                self.why = f"{self.name} raised on this sample: it ran as written"
                return NOT_TAKEN
            except NeedsPixels as exc:  # learn, plan again, draw again from the same states
                set_rng_states(states)
                LEARNT.learn(exc)
                self._planned = False
                continue
            plan = self.plan
            announce = plan if plan.key not in self.known else None
            out_leaves, out_spec, pos = self.call.output
            out_leaves = list(out_leaves)
            out_leaves[pos] = ProxySample(plan.key, kind, payload, params, path, plan=announce, shape=shape,
                                          dtype=torch.uint8 if plan.state.dtype == "uint8" else torch.float32,
                                          why=why, source=id(data) if data is not None else None)
            self.call.output = None
            return unflatten(out_spec, out_leaves)
        self.plan, self.plain_reason = None, f"{WHY_RECORDING} ({self.name})"
        logger.info("%s is planned anew on every sample; it runs in the worker", self.name)
        self.why = self.plain_reason
        return NOT_TAKEN

