"""What planning has learnt of the transforms recorded so far in this process: the state the
recording's drawers read (``translate/recorded.py``) and the workers' replans write
(``worker/proxy_node.py``), one object, ``LEARNT``."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from dali_autoproxy.config import logger
from dali_autoproxy.plan.record.image import MAX_CALLS, CallShape, NeedsPixels

MAX_SIZE_CHANGES = 8  # crops and resizes planned for one recorded transform; more: it runs in the worker


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

    def shape_of(self, t: Any) -> Optional[CallShape]:
        known = self._shapes.get(id(t))
        return known[1] if known is not None and known[0] is t else None

    def set_shape(self, t: Any, shape: CallShape) -> None:
        self._shapes[id(t)] = (t, shape)

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
