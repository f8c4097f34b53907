"""What planning has learnt of the transforms recorded so far in this process: the state the
recording's drawers read (``translate/recorded.py``) and the workers' replans write
(``worker/proxy_node.py``), one object, ``LEARNT``.

A joint transform's shape (the size changes and flips its samples make, merged as they come)
would end with the worker that learnt it: workers that are not persistent start again every
epoch, each from what the main process knew when it forked them, and each settles on a shape of
its own, so an epoch's batches come under several plans (several pipelines, smaller runs). So
the shape travels, with the chain's path in the dataset, with the plans a worker announces
(``Plan.joint_shape``), the main process merges those of every worker (``keep_joint_shape``),
plans the chain with it at its next decision (``worker/joint.planned_jointly``: built before the
first batch) and starts the next workers with it (``WorkerInstaller``: by path, whether the
workers are forked or spawned): from the second epoch on, one plan.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from dali_autoproxy.config import logger
from dali_autoproxy.plan.record.image import MAX_CALLS, CallShape, NeedsPixels

MAX_SIZE_CHANGES = 8  # crops and resizes planned for one recorded transform; more: it runs in the worker
MAX_JOINT_CHAINS = 64  # joint chains whose shapes the main process keeps for later epochs


class Learnt:
    """What planning knows of the transforms recorded so far in this process (each worker learns
    its own, from the ``NeedsPixels`` its samples raise): the transform types that need pixels
    (they run in the worker, and why), the calls planned per sample for a type (grown when a
    sample makes more), and the shape of an instance that changes sizes (its crops, resizes and
    tensor steps in order, and the calls planned around them)."""

    def __init__(self) -> None:
        self.pixel_readers: Dict[type, str] = {}
        self.call_widths: Dict[type, int] = {}
        self._shapes: Dict[int, Tuple[Any, CallShape]] = {}  # id: (the instance, kept so its id stays its own, shape)
        self._joint_shapes: Dict[int, Tuple[Any, CallShape]] = {}  # a joint chain's: id: (the chain, shape)

    def shape_of(self, t: Any) -> Optional[CallShape]:
        known = self._shapes.get(id(t))
        return known[1] if known is not None and known[0] is t else None

    def set_shape(self, t: Any, shape: CallShape) -> None:
        self._shapes[id(t)] = (t, shape)

    def joint_shape_of(self, chain: Any) -> Optional[CallShape]:
        """The shape an earlier epoch's workers planned ``chain`` with, called with its targets."""
        known = self._joint_shapes.get(id(chain))
        return known[1] if known is not None and known[0] is chain else None

    def set_joint_shape(self, chain: Any, shape: CallShape) -> None:
        self._joint_shapes.pop(id(chain), None)
        self._joint_shapes[id(chain)] = (chain, shape)
        while len(self._joint_shapes) > MAX_JOINT_CHAINS:  # the oldest go (and the chains they keep)
            del self._joint_shapes[next(iter(self._joint_shapes))]

    def forget_shape(self, t: Any) -> None:
        self._shapes.pop(id(t), None)

    def keep_joint_shape(self, chain: Any, shape: CallShape,
                         merge: Callable[[CallShape, CallShape], Optional[CallShape]]) -> None:
        """A joint chain's shape a worker planned with (the main process): merged with what
        earlier workers sent (``merge``: a shape that fits both, None where there is none: the
        newest is kept), for the next decision and the workers forked next."""
        known = self.joint_shape_of(chain)
        both = shape if known is None else merge(known, shape)
        self.set_joint_shape(chain, both if both is not None else shape)

    def learn(self, exc: NeedsPixels) -> None:
        """What a recorded transform's ``exc`` says, for the plans made from now on: it made more
        calls than planned (plan more), or changed sizes otherwise than planned (plan its shape),
        or it needs pixels (it runs in the worker; said once, at INFO)."""
        if exc.calls is not None and exc.calls <= MAX_CALLS:
            self.call_widths[exc.transform] = min(MAX_CALLS, max(exc.calls, 2 * self.call_widths.get(exc.transform, 1)))
        elif exc.shape is not None and len(exc.shape[0]) <= MAX_SIZE_CHANGES:
            self.set_shape(exc.instance, exc.shape)
        else:
            self.pixel_readers[exc.transform] = str(exc)
            logger.info("%s; it runs in the worker, as written", exc)


LEARNT = Learnt()
