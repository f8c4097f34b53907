"""Deciding what moves to DALI: the transform chains a dataset holds, and the plan for each.

Planning is pure and deterministic, so the main process (to build pipelines and the report)
and each worker (to draw per-sample params) derive the same plan, with the same ``key``, from
the same chain; nothing unpicklable has to travel to spawned workers.

The chains are found by walking the dataset's object graph: attributes, lists, tuples and
dicts, closures and ``functools.partial`` arguments, and the module globals that the dataset
class's methods name. The walk decides whether a loader is worth proxying and which pipelines
to build up front; the workers intercept every recognised chain wherever it is called
(``worker/chains.py``), and a chain the walk missed announces its plan with its first batch.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional, Set, Tuple

from dali_autoproxy.plan.call_sites import called_with_targets
from dali_autoproxy.plan.ir import Op, Placement, ToCHW, Unsupported, split_at_takeover
from dali_autoproxy.plan.pillow_ops import PillowCall
from dali_autoproxy.plan.record.learnt import LEARNT
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.steps import ChainState, SampleGeometry, Step
from dali_autoproxy.plan.translate import chain_of, flatten, is_chain, lookup, transform_name
from dali_autoproxy.plan.translate.recorded import cannot_record, guess_tensor_tail, record_step
from dali_autoproxy.plan.tv_internals import calls_transforms_with_targets, uses_pil_file_loader

Path = Tuple[Any, ...]  # how a chain was reached from the loader's dataset (for messages)


@dataclass
class Plan:
    steps: List[Step]
    state: ChainState
    n_params: int
    names: List[str] = field(default_factory=list)
    worker_prefix: int = 0  # leading (flattened) transforms the worker runs itself
    worker_names: List[str] = field(default_factory=list)
    split_reason: Optional[str] = None  # why those stay in the worker
    any_size: bool = False  # its images end at sizes of their own (a joint transform's): the torch stage
    #                         may take every sample at its own size (``ir.split_at_takeover``)
    chain: str = field(default="", compare=False)  # the chain it came from (``chain_of``), for the report
    joint_shape: Optional[Tuple[Path, Any]] = field(default=None, compare=False, repr=False)  # record/learnt.py

    @property
    def ops(self) -> List[Op]:
        return [op for s in self.steps for op in s.ops]

    @functools.cached_property
    def records(self) -> bool:
        """Whether a step is recorded (its drawer calls a transform that may need pixels)."""
        return any(isinstance(op, PillowCall) for op in self.ops)

    def signature(self) -> str:
        """Everything a back end uses: ops, the transforms they came from, the worker split."""
        return f"{self.worker_prefix}|{self.any_size}|{[(s.name, s.ops) for s in self.steps]!r}"

    @functools.cached_property
    def key(self) -> str:
        """Names the plan between processes: equal keys, equal pipelines."""
        return hashlib.sha1(self.signature().encode()).hexdigest()[:16]

    def draw(self, height: int, width: int) -> List[float]:
        return self.draw_sample(height, width)[0]

    def draw_sample(self, height: int, width: int) -> Tuple[List[float], Tuple[int, int, int]]:
        """One sample's params row, and the (C, H, W) of the tensor the plan makes of it."""
        return self.draw_from(SampleGeometry(height, width), 0)

    def draw_from(self, g: SampleGeometry, start: int) -> Tuple[List[float], Tuple[int, int, int]]:
        """The draws of steps ``start``.. continuing ``g`` (what the steps before drew)."""
        for step in self.steps[start:]:
            if step.draw is not None:
                step.draw(g)
        return g.params, (self.state.channels, int(g.height), int(g.width))

    def __getstate__(self) -> dict:
        """Pickled (a worker announcing a plan) without the drawers, which only workers run."""
        state = dict(self.__dict__)
        state["steps"] = [Step(s.name, list(s.ops), None, s.neutral) for s in self.steps]
        return state


# ----------------------------------------------------------------------------- the walk
_MAX_DEPTH = 8
_MAX_NODES = 5000
_MAX_ITEMS = 64  # longer lists and dicts are data (a dataset's samples), not configuration
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), type, types.ModuleType, range, slice)


def _is_leaf(obj: Any) -> bool:
    if isinstance(obj, _LEAVES):
        return True
    module = type(obj).__module__ or ""
    return module.startswith(("numpy", "PIL.", "torch._C")) or type(obj).__name__ in ("Tensor", "Parameter")


def _children(obj: Any) -> Iterator[Tuple[Any, Any]]:
    """(path step, child) pairs of one object."""
    if isinstance(obj, (list, tuple)):
        if len(obj) <= _MAX_ITEMS:
            yield from enumerate(obj)
        return
    if isinstance(obj, dict):
        if len(obj) <= _MAX_ITEMS:
            for k, v in obj.items():
                yield (k if isinstance(k, (str, int)) else repr(k)), v
        return
    if isinstance(obj, functools.partial):
        yield "func", obj.func
        yield from (("args", a) for a in obj.args)
        yield from (("keywords", v) for v in obj.keywords.values())
        return
    if isinstance(obj, types.MethodType):
        yield "__func__", obj.__func__
        yield "__self__", obj.__self__
        return
    if isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield f"<closure {i}>", cell.cell_contents
            except ValueError:  # an empty cell
                pass
        for name in _global_names(obj.__code__):
            if name in obj.__globals__:
                yield f"<global {name}>", obj.__globals__[name]
        return
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict) and len(attrs) <= 4 * _MAX_ITEMS:
        yield from attrs.items()


def _global_names(code: types.CodeType) -> List[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def _class_functions(cls: type) -> Iterator[Tuple[str, Any]]:
    """The dataset class's own methods (not torch's): their globals may hold the chain."""
    for klass in cls.__mro__:
        if klass.__module__.startswith(("torch.", "builtins")):
            continue
        for name, member in vars(klass).items():
            fn = getattr(member, "__func__", member)
            if isinstance(fn, types.FunctionType):
                yield f"<{klass.__name__}.{name}>", fn


@dataclass
class Found:
    chains: List[Tuple[Path, Any]] = field(default_factory=list)
    joint: List[Tuple[Path, Any]] = field(default_factory=list)  # users' joint transforms (``joint_class``)
    with_targets: Set[Path] = field(default_factory=set)  # chains a dataset calls with the image and its target
    folders: List[Any] = field(default_factory=list)  # DatasetFolders read with the PIL loader


def walk(dataset: Any) -> Found:
    """The transform chains (and plain ImageFolders) reachable from a dataset."""
    found = Found()
    seen = set()
    stack: List[Tuple[Path, Any, int]] = [((), dataset, 0)]
    count = 0
    while stack and count < _MAX_NODES:
        path, obj, depth = stack.pop()
        if id(obj) in seen or _is_leaf(obj):
            continue
        seen.add(id(obj))
        count += 1
        if is_chain(obj):
            found.chains.append((path, obj))
            continue  # a chain's own parts are planned with it
        if uses_pil_file_loader(obj):
            found.folders.append(obj)
        if path and joint_class(type(obj)):
            found.joint.append((path, obj))
        if depth >= _MAX_DEPTH:
            continue
        kids = [(step, child) for step, child in _children(obj) if not _left_over(obj, step, child)]
        if path == () or _looks_like_dataset(obj):
            kids += list(_class_functions(type(obj)))
        for step, child in reversed(kids):
            stack.append((path + (step,), child, depth + 1))
        found.with_targets.update(path + (step,) for step, child in kids if _called_with_targets(obj, step, child))
    found.chains.reverse()
    found.chains.sort(key=lambda pc: len(pc[0]))
    return found


def _called_with_targets(owner: Any, step: Any, child: Any) -> bool:
    """A chain ``owner`` calls with the image and its target: torchvision's datasets by their
    class, a user's by the calls in its methods."""
    if not isinstance(step, str) or not is_chain(child):
        return False
    return (step == "transforms" and calls_transforms_with_targets(owner)) or called_with_targets(owner, step)


def _left_over(dataset: Any, step: Any, child: Any) -> bool:
    """torchvision's ``StandardTransform`` a VisionDataset made of the transform it was built with,
    after ``dataset.transform`` was replaced (DeiT's 3-Augment: ``loader.dataset.transform = ...``):
    ImageFolder's ``__getitem__`` calls the new one, the wrapper holds the old."""
    return (step == "transforms" and type(child).__name__ == "StandardTransform"
            and getattr(child, "transform", None) is not getattr(dataset, "transform", None))


def _looks_like_dataset(obj: Any) -> bool:
    return hasattr(type(obj), "__getitem__") and not isinstance(obj, (list, tuple, dict))


ENDS_AS_PIL = "the chain ends in a PIL image, which default_collate cannot batch"


def _translate(transforms: List[Any], exact_resize: bool = True, ends_as_pil: bool = False,
               any_size: bool = False) -> Plan:
    state = ChainState(fidelity=SETTINGS["fidelity"], exact_resize=exact_resize and SETTINGS["resize"] == "pillow",
                       any_size=any_size)
    counter = [0]

    def alloc(op_type: type) -> int:
        """Reserve the op's values in the params row; its slot."""
        start = counter[0]
        counter[0] += op_type.width()
        return start

    steps = [_convert(t, state, alloc, counter) for t in transforms]
    if not steps:
        raise Unsupported("the transform chain is empty")
    if not ends_as_pil and state.kind == "pil" and steps[-1].note is not None and guess_tensor_tail(transforms[-1]):
        return _translate(transforms, exact_resize, ends_as_pil, any_size)  # a recorded last step: it may make
        #                                                                    the tensor
    try:
        plan = _checked(steps, state, counter[0], transforms, ends_as_pil, any_size)
        plan.any_size = any_size
        return plan
    except Unsupported:
        recorded = next((s.note for s in steps if s.note), None)
        if recorded is None:
            raise
        raise Unsupported(recorded) from None  # what its converter said, as without recording


def _checked(steps: List[Step], state: ChainState, n_params: int, transforms: List[Any], ends_as_pil: bool,
             any_size: bool = False) -> Plan:
    """The plan of these steps, where DALI and the torch stage can run them in this order."""
    dali_part, _ = split_at_takeover([op for s in steps for op in s.ops], any_size)
    stuck = [op for op in dali_part if op.placement is Placement.TORCH]
    if stuck:
        name = next(s.name for s in steps if stuck[0] in s.ops)
        raise Unsupported(f"{name} before a resize or crop runs in the worker (its exact kernel is in the "
                          "torch stage, which follows DALI's resizes)")
    if ends_as_pil:
        if state.kind != "pil":
            raise Unsupported("the chain does not end in a PIL image")
        return Plan(steps, state, n_params, [transform_name(t) for t in transforms])
    if state.kind != "tensor":
        raise Unsupported(ENDS_AS_PIL)
    if not any(type(op) is ToCHW for s in steps for op in s.ops):  # pragma: no cover
        raise Unsupported("the chain never converts to a tensor")
    return Plan(steps, state, n_params, [transform_name(t) for t in transforms])


def _convert(t: Any, state: ChainState, alloc, counter: List[int]) -> Step:
    """``t``'s translation; where it has none (or its converter refused it) and it can be
    recorded, its recorded step, with the row and the chain's state as they were before it."""
    mark, before = counter[0], dataclasses.replace(state)
    try:
        return lookup(t)(t, state, alloc)
    except Unsupported as exc:
        why_not, refused = cannot_record(t, before), str(exc)
        if why_not is not None:
            raise Unsupported(why_not if type(t) in LEARNT.pixel_readers else refused) from None
    counter[0] = mark
    state.__dict__.update(before.__dict__)
    return record_step(t, state, alloc, refused)


def build_head_plan(transform: Any) -> Plan:
    """The plan of a chain that ends in a PIL image another chain takes (DINOv2's geometric
    chain before its colour chains): translated whole, no step recorded, or Unsupported."""
    plan = _translate(flatten(transform), ends_as_pil=True)
    if plan.records:
        raise Unsupported("a chain handing its image on records a step")
    return plan


def build_joined_plan(head: Any, tail: Any) -> Plan:
    """One plan for a head chain's image taken by ``tail``: both chains' transforms in one
    chain, translated whole (the head's steps, and so its values in the row, come first)."""
    return _translate(flatten(head) + flatten(tail))


def _ends_as_pil(prefix: List[Any]) -> bool:
    """Whether the worker's part still ends in a PIL image (unknown steps keep the type)."""
    state = ChainState()
    for t in prefix:
        try:
            lookup(t)(t, state, lambda op_type: 0)
        except Unsupported:
            pass
    return state.kind == "pil"


@functools.lru_cache(maxsize=None)
def _target_transforms() -> frozenset:
    """v2 transforms that only make sense on an image's targets (boxes, keypoints): a chain holding
    one is called with the image and its targets together."""
    import torchvision.transforms.v2 as v2
    names = ("SanitizeBoundingBoxes", "ConvertBoundingBoxFormat", "ClampBoundingBoxes", "ClampKeyPoints",
             "SanitizeKeyPoints")
    return frozenset(getattr(v2, n) for n in names if hasattr(v2, n))


def may_be_joint(chain: Any) -> bool:
    """Whether a chain may be called with an image and its targets, which the workers take over
    as a joint transform: torchvision v2's transforms, and classes of users' own code whose call
    takes two positional arguments (``__call__(self, image, target)``: the detection references'
    v1 transforms, DETR's)."""
    try:
        from torchvision.transforms.v2 import Transform
    except ImportError:  # pragma: no cover - torchvision without v2
        Transform = ()
    return isinstance(chain, Transform) or joint_class(type(chain))


_LIBRARY_MODULES = ("torch", "torchvision", "PIL", "numpy", "builtins", "dali_autoproxy", "functools", "collections")


@functools.lru_cache(maxsize=None)
def joint_class(cls: type) -> bool:
    """A class of the user's own code (not an installed library's) whose instances are called with
    two positional arguments (an image and its target): its ``__call__`` (``forward`` for a torch
    module) takes two or more."""
    import inspect
    import sys

    import torch
    module = cls.__module__ or ""
    if module.split(".")[0] in _LIBRARY_MODULES:
        return False
    where = getattr(sys.modules.get(module), "__file__", None) or ""
    if "site-packages" in where or "dist-packages" in where:
        return False  # an installed library's class (webdataset's stages, ...), not a transform of the user's
    entry = getattr(cls, "forward" if issubclass(cls, torch.nn.Module) else "__call__", None)
    if not isinstance(entry, types.FunctionType):
        return False
    try:
        params = list(inspect.signature(entry).parameters.values())[1:]
    except (TypeError, ValueError):  # pragma: no cover - an odd signature
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in params) >= 2


def build_joint_plan(call: Any) -> Plan:
    """A joint transform's call's plan (``worker/joint.py``): one recorded step, images of their own sizes."""
    return _translate([call], any_size=True)


def build_plan(transform: Any) -> Plan:
    """Translate a transform chain; where a step cannot be translated, offload the longest tail that
    can (the worker runs the rest, and decodes); Unsupported with the first reason if none is worth it."""
    plan = _plan_of(transform)
    plan.chain = chain_of(transform)
    return plan


def _plan_of(transform: Any) -> Plan:
    flat = flatten(transform)
    joint = next((t for t in flat if type(t) in _target_transforms()), None)
    if joint is not None:
        raise Unsupported(f"joint image-and-target transform ({transform_name(joint)} works on its targets)")
    try:
        return _translate(flat)
    except Unsupported as exc:
        first_reason = str(exc)  # text: a kept exception's traceback would keep the caller's frames alive
    try:  # the exact resize runs in the torch stage; a DALI-only step after it wants DALI's resize
        return _translate(flat, exact_resize=False)
    except Unsupported:
        pass
    for split in range(1, len(flat)):
        if not _ends_as_pil(flat[:split]):
            continue  # the worker's part would hand over a tensor, not an image's pixels
        try:
            plan = _translate(flat[split:])  # the worker hands over its PIL image's pixels
        except Unsupported:
            continue
        if all(type(op) is ToCHW for op in plan.ops):
            break  # only the layout change is left: nothing worth moving
        plan.worker_prefix = split
        plan.worker_names = [transform_name(t) for t in flat[:split]]
        plan.split_reason = first_reason
        return plan
    raise Unsupported(first_reason)
