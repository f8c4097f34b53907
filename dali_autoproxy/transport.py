"""What travels from a worker to the main process: data only, no behaviour of either side.

In the worker, a recognised chain's call returns a :class:`ProxySample` (``worker/proxy_node.py``):
the image's encoded JPEG bytes or its pixels, plus the per-sample params drawn with
torchvision's RNG calls. The worker's collate (``worker/collate.py``) batches those into one
:class:`ProxyBatch`, whose bytes sit in a single shared-memory tensor per group, in a buffer the
worker uses again (no pickling of image data; once the main process has the buffer mapped, only
its :class:`PoolSlot` travels), and whose small tensors travel inside the pickle
(:class:`InlineTensor`). The batch then travels through the DataLoader's own result queue, so
ordering, timeouts and worker errors are the DataLoader's; the main process
(``main/iterator.py``) runs DALI on it.

Samples DALI should not see (PNG, CMYK, a tensor input...) take the original chain on the CPU
in the worker; they travel as finished tensors and are merged back in place.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from dali_autoproxy.plan.planning import Plan

ENCODED, RAW = "encoded", "raw"  # what a DALI pipeline takes in: JPEG bytes, or HWC uint8 pixels
SHARED = "shared"  # several groups of one batch made from the same JPEGs: one decode, a branch each
# a worker's pooled payload buffer (worker/payload_pool.py): a header whose first byte is IN_FLIGHT
# from the worker's packing until the main process's last reference is gone (then FREE), and whose
# second is RETIRED once the worker has dropped the buffer from its pool (the main process unmaps it)
POOL_HEADER, FREE, IN_FLIGHT = 64, 0, 1
RETIRED_AT, RETIRED = 1, 1

# why a sample's image was decoded in the worker (counted per loader in the report)
WHY_PREFIX = "partial offload: worker steps need pixels"
WHY_DECODED = "the image reached the transform decoded (the dataset used or made its pixels first)"
WHY_NOT_PLAIN_JPEG = "not an ordinary complete JPEG (DALI decodes those as Pillow does)"
WHY_CPU = "not an RGB image: the whole chain ran in the worker"
WHY_RECORDING = "a recorded transform needs pixels: the whole chain ran in the worker"


class ProxySample:
    """One sample's input to a DALI pipeline, or its finished CPU result (``done``)."""
    __slots__ = ("key", "kind", "payload", "params", "path", "done", "why", "plan", "shape", "dtype", "source")

    def __init__(self, key: str, kind: str = RAW, payload: Optional[np.ndarray] = None,
                 params: Optional[List[float]] = None, path: Optional[str] = None,
                 done: Optional[torch.Tensor] = None, why: Optional[str] = None, plan: Optional[Plan] = None,
                 shape: Optional[Tuple[int, int, int]] = None, dtype: Optional[torch.dtype] = None,
                 source: Optional[int] = None):
        self.source = source  # which encoded buffer (its id in the worker): views of one image share it
        self.shape = shape  # (C, H, W) and dtype of the tensor DALI will make of it
        self.dtype = dtype
        self.key = key
        self.kind = kind
        self.payload = payload
        self.params = params
        self.path = path
        self.done = done
        self.why = why    # why it was not decoded by DALI (None: it was)
        self.plan = plan  # set when the main process may not know this plan yet

    def __repr__(self) -> str:
        return f"ProxySample(plan={self.key}, {self.kind}, path={self.path!r}, done={self.done is not None})"


class PoolSlot:
    """Where a group's payload lies in its worker's pool (``worker/payload_pool.py``): the buffer
    (the worker's pid and the buffer's serial) and the payload's length. A buffer's first trip
    carries its tensor; once the main process has that buffer mapped (``known``), the group
    travels with this slot alone and the main process finds the bytes by it
    (``main/payload_release.py``): no file descriptor or shared-memory file is passed again."""
    __slots__ = ("pid", "serial", "nbytes", "known")

    def __init__(self, pid: int, serial: int, nbytes: int, known: bool):
        self.pid, self.serial, self.nbytes, self.known = pid, serial, nbytes, known


class ProxyGroup:
    """The samples of one batch that share a plan and an input kind (and so a DALI pipeline)."""

    def __init__(self, key: str, kind: str, indices: List[int], payload: Optional[torch.Tensor],
                 offsets: np.ndarray, shapes: Optional[np.ndarray], params: np.ndarray,
                 paths: List[Optional[str]], plan: Optional[Plan] = None, pool: Optional[PoolSlot] = None):
        self.key = key
        self.kind = kind
        self.plan = plan            # the plan, when the main process may not know it
        self.indices = indices
        self.payload = payload      # uint8, all samples' bytes back to back (shared memory)
        self.offsets = offsets      # int64 [n + 1]
        self.shapes = shapes        # int64 [n, 3] for raw pixels, None for encoded files
        self.params = params        # float64 [n, n_params] (whole numbers are exact)
        self.paths = paths
        self.pool = pool            # where in its worker's pool the payload lies (None: not pooled)

    @property
    def pooled(self) -> bool:
        """The payload is in a worker's pooled buffer: the main process frees it."""
        return self.pool is not None

    def __getstate__(self) -> dict:
        """As the worker that packed it sends it: without the payload when the main process has
        its buffer mapped already (the slot finds it there)."""
        if self.pool is None or not self.pool.known or self.pool.pid != os.getpid():
            return self.__dict__
        return dict(self.__dict__, payload=None)

    @property
    def members(self) -> List["ProxyGroup"]:
        """The groups whose params a pipeline run takes: this one."""
        return [self]

    def payload_views(self) -> List[np.ndarray]:
        flat = self.payload.numpy()
        views = [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(len(self.indices))]
        if self.shapes is not None:
            views = [v.reshape(tuple(s)) for v, s in zip(views, self.shapes)]
        return views


class SharedGroup:
    """Groups of one batch (the views of a multi-view recipe, one per position) whose rows are
    the same JPEGs in the same order: the worker packed their bytes once (the same shared-memory
    tensor), so one DALI pipeline decodes each image once and makes every view from it."""

    def __init__(self, members: List[ProxyGroup]):
        self.members = members
        self.key = "+".join(g.key for g in members)
        self.kind = SHARED
        self.params = None  # each member's own: ``members[k].params``

    def payload_views(self) -> List[np.ndarray]:
        return self.members[0].payload_views()

    def __repr__(self) -> str:
        return f"SharedGroup({len(self.members)} views of {len(self.members[0].indices)} images)"


class ProxyBatch:
    """What the training loop would see as an image batch, before DALI has run."""

    def __init__(self, size: int, groups: List[ProxyGroup], done_indices: List[int],
                 done: List[torch.Tensor], why: Optional[Dict[str, int]] = None):
        self.size = size
        self.groups = groups
        self.done_indices = done_indices
        self.done = done  # CPU-path results, one tensor each, or one stacked tensor
        self.why = why or {}  # samples not decoded by DALI, by reason

    def done_tensors(self) -> List[torch.Tensor]:
        if len(self.done) == 1 and len(self.done_indices) > 1:
            return list(self.done[0].unbind(0))
        return self.done

    def __repr__(self) -> str:
        return (f"ProxyBatch(size={self.size}, dali={[len(g.indices) for g in self.groups]}, "
                f"cpu={len(self.done_indices)})")


class Unrouted:
    """A worker's batch in which no chain call was taken (its own, untouched), with why: the
    calls the chains received that are not taken over (a joint image-and-target call, say), and
    the images decoded in the worker for the outermost of them, by why."""
    __slots__ = ("batch", "why", "decoded")

    def __init__(self, batch: Any, why: Dict[str, int], decoded: Optional[Dict[str, int]] = None):
        self.batch, self.why, self.decoded = batch, why, decoded or {}

    def pin_memory(self) -> "Unrouted":
        """What the loader's pin thread calls: the batch pinned as it would have been."""
        from torch.utils.data._utils.pin_memory import pin_memory
        self.batch = pin_memory(self.batch)
        return self


# collates that only copy the images, which the main process replaces by an equivalent on DALI's
# tensors (main/collate.py), by qualified name: the worker's log names the equivalent, not a fallback
COLLATES_WITH_EQUIVALENTS = ("timm.data.loader.fast_collate",)


def qualified_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"


INLINE_BYTES = 1 << 16  # CPU tensors of a sample this small travel inside the batch's pickle
_NUMPY_DTYPES = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128))


class InlineTensor:
    """A small CPU tensor of a sample (a detection target's boxes, labels, id) carried as its
    bytes. Through the DataLoader's result queue each tensor is otherwise a shared-memory file of
    its own, which the worker makes and the main process maps: for a few bytes that costs far
    more than the copy (a detection batch has a few tensors per sample)."""
    __slots__ = ("array",)

    def __init__(self, t: torch.Tensor):
        self.array = t.numpy()

    @staticmethod
    def fits(x: Any) -> bool:
        return (type(x) is torch.Tensor and x.device.type == "cpu" and x.layout == torch.strided
                and not x.is_nested and not x.requires_grad and x.dtype in _NUMPY_DTYPES
                and x.numel() * x.element_size() <= INLINE_BYTES)

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.array)

    def pin_memory(self) -> torch.Tensor:
        """What the loader's pin thread calls: the tensor, pinned as it would have been."""
        return self.tensor().pin_memory()


class Slot:
    """Where a proxied image goes back: row ``row`` of the ``batch``-th ProxyBatch."""
    __slots__ = ("batch", "row")

    def __init__(self, batch: int, row: int):
        self.batch, self.row = batch, row


class TraceRef:
    """A tensor of a recorded collate (``worker/collate_trace.py``): the ``index``-th tensor made by
    step ``step``, or (step -1) the ``index``-th image."""
    __slots__ = ("step", "index")

    def __init__(self, step: int, index: int):
        self.step, self.index = step, index


class TraceStep:
    """One recorded torch call: ``func(*args, **kwargs)`` with ``call`` = (args, kwargs), the
    images' tensors as TraceRefs."""
    __slots__ = ("func", "call")

    def __init__(self, func: Any, call: tuple):
        self.func, self.call = func, call


class TracedCollate:
    """A user's collate, run once in the worker: its torch calls on the images, in order, and its
    result with those tensors as TraceRefs; ``inputs``: where each image comes back from."""

    def __init__(self, steps: List[TraceStep], output: Any, inputs: Optional[List["Slot"]] = None):
        self.steps, self.output, self.inputs = steps, output, inputs or []


class ProxyCollated:
    """What a worker sends in place of the user's collated batch: the collate's recorded run
    (``traced``), or, for a collate that needs the images' values, the samples and the random
    states to call it with in the main process."""

    def __init__(self, samples: Optional[List[Any]], batches: List[ProxyBatch], rng: Optional[tuple],
                 traced: Optional[TracedCollate] = None):
        self.samples = samples   # the dataset's samples, proxied images replaced by Slots, small tensors inline
        self.batches = batches   # one ProxyBatch per position holding proxied images
        self.rng = rng           # the worker's (torch, random, numpy) states before the collate
        self.traced = traced

    def __repr__(self) -> str:
        how = "traced" if self.traced is not None else f"{len(self.samples)} samples"
        return f"ProxyCollated({how}, {self.batches!r})"
