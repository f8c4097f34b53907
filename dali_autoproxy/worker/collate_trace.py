"""A user's collate_fn, run once, in the worker, as plain runs it: on stand-ins of the proxied
images, with its torch operations on them recorded for the main process to replay on DALI's
tensors (``main/collate.py::replay``).

A collate is the user's code: it may count batches, draw masks from a shared step counter
(I-JEPA's ``MaskCollator``), draw MixUp/CutMix parameters, or batch the images with
``default_collate``. Called once per batch in the worker, every side effect and every random draw
happens once, where plain has it. The images it receives are tensors on torch's ``meta`` device
of their final shape and dtype (no memory, no compute); a ``TorchFunctionMode`` records each
torch call that takes one of them (or makes a new one), in order, with everything else it takes
as it was: numbers drawn by the collate, real tensors, shapes. What the collate returns is
sent as it is, each tensor made from the images as a ``TraceRef`` into the recording. The main
process runs the recorded calls, in order, on DALI's tensors: views and in-place writes alias
as they did, so the result is the collate's on those images.

A collate that needs the images' values (``.item()``, numpy, a branch on a pixel), draws random
numbers from an image tensor (``rand_like``, ``dropout``: the main process would draw other
numbers), writes into a tensor through ``out=``, or returns a recording that cannot be pickled
raises here, before returning; it is then called in the main process on DALI's tensors under
the worker's random states (``NotTraceable``; the side effects its first attempt made before
it raised happen again there).
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.data._utils.collate import default_collate_fn_map

from dali_autoproxy.transport import TracedCollate, TraceRef, TraceStep
from dali_autoproxy.tree import flatten, unflatten

# random draws that take an image's shape: the main process's generator would draw other numbers
_RANDOM = frozenset({"rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_", "normal_", "uniform_",
                     "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "multinomial", "poisson",
                     "dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                     "feature_alpha_dropout", "rrelu", "rrelu_"})


class NotTraceable(Exception):
    """The collate cannot be recorded (see the module's docstring): it runs in the main process."""


class _Attr:
    """A tensor attribute read (``x.T``, ``x.mT``), replayed with getattr: the descriptor's own
    getter cannot be pickled."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, obj: Any) -> Any:
        return getattr(obj, self.name)


def _is_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


class _Recorder(TorchFunctionMode):
    """Records the torch calls that involve stand-ins or their results (see the module)."""

    def __init__(self, inputs: List[torch.Tensor]):
        super().__init__()
        self.steps: List[TraceStep] = []
        self.ref_of: Dict[int, TraceRef] = {id(t): TraceRef(-1, k) for k, t in enumerate(inputs)}
        self.alive: List[Any] = list(inputs)  # ids stay unique while the recording lasts

    def ref(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            r = self.ref_of.get(id(x))
            if r is not None:
                return r
            if _is_meta(x):  # a meta tensor the recording did not make
                raise NotTraceable("a meta tensor made outside torch's functions")
        return x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, spec = tree_flatten((args, kwargs))
        traced = any(isinstance(x, torch.Tensor) and id(x) in self.ref_of for x in leaves)
        result = func(*args, **kwargs)
        made, _ = tree_flatten(result)
        if not traced and not any(_is_meta(x) for x in made):
            return result  # nothing of the images: it ran for real, as plain runs it
        name = getattr(func, "__name__", "")
        if name in _RANDOM:
            raise NotTraceable(f"{name} draws random numbers of an image's shape")
        if "out" in kwargs:
            raise NotTraceable(f"{name} writes through out=")
        if type(func).__name__ == "method-wrapper" and name == "__get__":
            func = _Attr(func.__self__.__name__)
        if result is not None and not any(_is_meta(x) for x in made):
            return result  # a shape, a dtype, a device: a plain value of the worker's (None: a write)
        index = len(self.steps)
        self.steps.append(TraceStep(func, tree_unflatten([self.ref(x) for x in leaves], spec)))
        for k, x in enumerate(made):
            if isinstance(x, torch.Tensor):
                self.ref_of[id(x)] = TraceRef(index, k)  # an in-place call's result: its input, rebound
                self.alive.append(x)
        return result


def _stack_standins(batch: List[torch.Tensor], *, collate_fn_map: Optional[Dict] = None) -> torch.Tensor:
    """default_collate's tensor handler for a batch of stand-ins: a plain stack (in a worker it
    would stack into a shared-memory tensor made from a storage, which cannot be replayed)."""
    if any(_is_meta(t) for t in batch):
        return torch.stack(batch, 0)
    return _TENSOR_COLLATE(batch, collate_fn_map=collate_fn_map)


_TENSOR_COLLATE = default_collate_fn_map[torch.Tensor]


def trace_collate(user_collate: Callable[[List[Any]], Any], samples: List[Any],
                  inputs: List[torch.Tensor]) -> Tuple[Any, TracedCollate]:
    """Run ``user_collate(samples)`` once, ``inputs`` (meta stand-ins inside ``samples``)
    recorded: the result, and the recording with the result's image tensors as TraceRefs.
    NotTraceable (raised before the collate returns, or after it, by what it returned) where it
    cannot be recorded; any other exception is the collate's own."""
    recorder = _Recorder(inputs)
    default_collate_fn_map[torch.Tensor] = _stack_standins
    try:
        with recorder:
            result = user_collate(samples)
    except RuntimeError as exc:
        if "meta" in str(exc):  # it needed the values (item, numpy, copy to the CPU)
            raise NotTraceable(str(exc)) from None
        raise
    finally:
        default_collate_fn_map[torch.Tensor] = _TENSOR_COLLATE
    leaves, spec = flatten(result)
    traced = TracedCollate(recorder.steps, unflatten(spec, [recorder.ref(x) for x in leaves]))
    _check_sendable(traced)
    return result, traced


class _Scan(pickle.Pickler):
    """Pickles a recording without its tensors' data, to find what cannot travel: a function
    that cannot be pickled, a stand-in hidden inside an object the recording cannot see into."""

    def persistent_id(self, obj: Any) -> Optional[str]:
        if isinstance(obj, torch.Tensor):
            if _is_meta(obj):
                raise NotTraceable("the result holds an image tensor inside an object it cannot look into")
            return "tensor"
        return None


def _check_sendable(traced: TracedCollate) -> None:
    try:
        _Scan(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump((traced.steps, traced.output))
    except NotTraceable:
        raise
    except Exception as exc:
        raise NotTraceable(f"its recording cannot be pickled ({type(exc).__name__}: {exc})") from None
