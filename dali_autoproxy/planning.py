"""Deciding what moves to DALI: where the dataset keeps its transform, and the plan for it.

Planning is pure and deterministic, so the main process (to build the pipeline and the
report) and each worker (to draw per-sample params) derive the same plan from the same
transform; nothing unpicklable has to travel to spawned workers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from .ir import ChainState, Op, Placement, SampleGeometry, Step, ToCHW, Unsupported, split_at_takeover
from .translate import flatten, lookup, transform_name

Path = Tuple[Any, ...]  # attribute names and list indices from the loader's dataset


@dataclass
class Site:
    """A dataset object (reached by ``path``) whose ``transform`` attribute we replace."""
    path: Path
    holder: Any
    decode: bool  # its files reach the transform through torchvision's PIL loader


@dataclass
class Plan:
    steps: List[Step]
    state: ChainState
    n_params: int
    input_kind: str  # "encoded" (file bytes, decoded by DALI) or "raw" (HWC uint8 pixels)
    names: List[str] = field(default_factory=list)
    worker_prefix: int = 0  # leading (flattened) transforms the worker runs itself
    worker_names: List[str] = field(default_factory=list)
    split_reason: Optional[str] = None  # why those stay in the worker

    @property
    def ops(self) -> List[Op]:
        return [op for s in self.steps for op in s.ops]

    def signature(self) -> str:
        """Compares the plans made in the main process and in a worker."""
        return f"{self.input_kind}|{self.worker_prefix}|{self.ops!r}"

    def draw(self, height: int, width: int) -> List[int]:
        g = SampleGeometry(height, width)
        for step in self.steps:
            if step.draw is not None:
                step.draw(g)
        return g.params


def resolve(dataset: Any, path: Path) -> Any:
    obj = dataset
    for key in path:
        obj = obj[key] if isinstance(key, int) else getattr(obj, key)
    return obj


def uses_pil_file_loader(ds: Any) -> bool:
    """True for DatasetFolder/ImageFolder that read files with torchvision's PIL loader,
    unmodified: then the worker may hand over the file's bytes instead of a PIL image."""
    try:
        from torchvision import get_image_backend
        from torchvision.datasets.folder import DatasetFolder, default_loader, pil_loader
    except ImportError:  # pragma: no cover
        return False
    return (isinstance(ds, DatasetFolder)
            and type(ds).__getitem__ is DatasetFolder.__getitem__
            and getattr(ds, "loader", None) in (default_loader, pil_loader)
            and get_image_backend() == "PIL")


def find_sites(dataset: Any, path: Path = ()) -> List[Site]:
    """Datasets (through Subset and ConcatDataset) that hold a transform."""
    from torch.utils.data import ConcatDataset, Subset
    if isinstance(dataset, Subset):
        return find_sites(dataset.dataset, path + ("dataset",))
    if isinstance(dataset, ConcatDataset):
        sites: List[Site] = []
        for i, ds in enumerate(dataset.datasets):
            sites += find_sites(ds, path + ("datasets", i))
        return sites
    if getattr(dataset, "transform", None) is not None:
        return [Site(path, dataset, uses_pil_file_loader(dataset))]
    return []


def _translate(transforms: List[Any], input_kind: str) -> Plan:
    state = ChainState()
    counter = [0]

    def alloc(n: int) -> int:
        start = counter[0]
        counter[0] += n
        return start

    steps = [lookup(t)(t, state, alloc) for t in transforms]
    if not steps:
        raise Unsupported("the transform chain is empty")
    dali_part, _ = split_at_takeover([op for s in steps for op in s.ops])
    stuck = [op for op in dali_part if op.placement is Placement.TORCH]
    if stuck:
        name = next(s.name for s in steps if stuck[0] in s.ops)
        raise Unsupported(f"{name} before a resize or crop runs in the worker (its exact kernel is in the "
                          "torch stage, which follows DALI's resizes)")
    if state.kind != "tensor":
        raise Unsupported("the chain ends in a PIL image, which default_collate cannot batch")
    if not any(isinstance(op, ToCHW) for s in steps for op in s.ops):  # pragma: no cover
        raise Unsupported("the chain never converts to a tensor")
    return Plan(steps, state, counter[0], input_kind, [transform_name(t) for t in transforms])


def _ends_as_pil(prefix: List[Any]) -> bool:
    """Whether the worker's part, as far as it is known, still holds a PIL image at its end
    (untranslatable steps are assumed to keep the type; the worker checks each sample)."""
    state = ChainState()
    for t in prefix:
        try:
            lookup(t)(t, state, lambda n: 0)
        except Unsupported:
            pass
    return state.kind == "pil"


def build_plan(transform: Any, input_kind: str) -> Plan:
    """Translate a transform chain; where a step cannot be translated, offload the longest
    tail that can (partial offload: the worker runs the rest, and decodes); raise
    Unsupported with the first reason when no tail worth moving remains."""
    flat = flatten(transform)
    try:
        return _translate(flat, input_kind)
    except Unsupported as exc:
        first_reason = exc
    for split in range(1, len(flat)):
        if not _ends_as_pil(flat[:split]):
            continue  # the worker's part would hand over a tensor, not an image's pixels
        try:
            plan = _translate(flat[split:], "raw")  # the worker hands over its PIL image's pixels
        except Unsupported:
            continue
        if not any(not isinstance(op, ToCHW) for op in plan.ops):
            break  # only the layout change is left: nothing worth moving
        plan.worker_prefix = split
        plan.worker_names = [transform_name(t) for t in flat[:split]]
        plan.split_reason = str(first_reason)
        return plan
    raise first_reason
