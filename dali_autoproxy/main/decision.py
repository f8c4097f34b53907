"""Deciding per DataLoader, in the main process: proxy it, or say precisely why not.

The decision reads the loader (batching, its sampler's batch size), walks its dataset for
transform chains and plans each (``plan/``), and checks that DALI and a device are usable. It
never raises for user data: whatever it cannot take runs as plain torchvision, with the reason
in the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils.data._utils.collate import default_collate

from dali_autoproxy.config import Options
from dali_autoproxy.patches import unsupported
from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import Plan, build_plan, may_be_joint, walk
from dali_autoproxy.plan.record.learnt import LEARNT
from dali_autoproxy.plan.translate import flatten, transform_name
from dali_autoproxy.plan.translate.recorded import merged_joint_shape
from dali_autoproxy.worker.joint import planned_jointly


@dataclass
class Decision:
    proxied: bool
    reason: Optional[str] = None
    device: Optional[str] = None
    plans: Dict[str, Plan] = field(default_factory=dict)  # by key: the chains found in the dataset
    chain_classes: set = field(default_factory=set)       # their types, whose calls the workers take
    worker_transforms: List[str] = field(default_factory=list)
    unplanned: List[str] = field(default_factory=list)    # chains found that stay in the worker, and why
    joint: List[str] = field(default_factory=list)        # chains planned per call with their targets, in the workers
    collate: Any = None                                   # the user's collate_fn, run in the main process
    joint_shapes: Dict[tuple, Any] = field(default_factory=dict)  # kept shapes of joint chains, by path: the workers'


def dali_import_error() -> Optional[str]:
    try:
        import nvidia.dali  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"DALI is not installed or failed to import ({exc.__class__.__name__}: {exc})"
    return unsupported("nvidia.dali")


def resolve_device(options: Options) -> Tuple[Optional[str], Optional[str]]:
    err = dali_import_error()
    if err:
        return None, err + "; pip install 'dali-autoproxy[dali]'"
    if options.device == "cpu":
        return "cpu", None
    if torch.cuda.is_available():
        return "gpu", None
    return None, ("no usable CUDA GPU (device=" + options.device +
                  "); DALI_AUTOPROXY_DEVICE=cpu runs DALI's CPU backend instead")


def _path_text(path: Tuple[Any, ...]) -> str:
    out = "dataset"
    for step in path:
        out += f"[{step!r}]" if isinstance(step, int) else f".{step}"
    return out


def chain_names(dataset: Any) -> List[str]:
    """The transforms of every chain found in the dataset (the report's worker column)."""
    try:
        return [transform_name(t) for _, chain in walk(dataset).chains for t in flatten(chain)]
    except Exception:
        return []


def decide(loader: Any, options: Options) -> Decision:
    """Proxy this loader, or say precisely why not. Never raises for user data."""
    found = walk(loader.dataset)
    names = [transform_name(t) for _, chain in found.chains for t in flatten(chain)]
    if not loader._auto_collation:
        return Decision(False, "batch_size=None (no batching): nothing for a batched pipeline",
                        worker_transforms=names)
    if max_batch_size(loader) is None:
        return Decision(False, "a batch_sampler without a batch_size attribute: the largest batch "
                        "(DALI's batch size) is unknown", worker_transforms=names)
    if not found.chains and not found.joint:
        return Decision(False, "no torchvision transform chain found in the dataset (its attributes, closures "
                        "and the module globals its methods use)", worker_transforms=names)
    plans: Dict[str, Plan] = {}
    unplanned: List[str] = []
    joint: List[str] = [f"{_path_text(path)}: {transform_name(t)}" for path, t in found.joint]
    first_reason = None
    shapes = {path: LEARNT.joint_shape_of(c) for path, c in found.chains + found.joint}
    shapes = {path: shape for path, shape in shapes.items() if shape is not None}
    for path, chain in found.chains:
        jointly = planned_jointly(chain) if path in shapes else None
        if jointly is not None:  # an earlier epoch's workers called it with its targets: their plan
            joint.append(f"{_path_text(path)}: {transform_name(chain)}")
            plans.setdefault(jointly.key, jointly)
            continue
        if path in found.with_targets and may_be_joint(chain):  # its plan is made per call in the workers:
            joint.append(f"{_path_text(path)}: {transform_name(chain)}")  # none of the image alone to build
            continue
        try:
            plan = build_plan(chain)
        except Unsupported as exc:
            if may_be_joint(chain):  # called with its targets, it is planned in the workers, per call
                joint.append(f"{_path_text(path)}: {transform_name(chain)}")
                continue
            first_reason = first_reason or str(exc)  # text, not the exception: see _own_frames_dropped
            unplanned.append(f"{_path_text(path)}: {exc}")
            continue
        plans.setdefault(plan.key, plan)
    if not plans and not joint:
        return Decision(False, f"transform: {first_reason}", worker_transforms=names)
    device, why = resolve_device(options)
    if device is None:
        return Decision(False, why, worker_transforms=names)
    classes = {type(chain) for _, chain in found.chains + found.joint}
    collate = None if loader.collate_fn is default_collate else loader.collate_fn
    return Decision(True, None, device, plans, classes, unplanned=unplanned, joint=joint, collate=collate,
                    joint_shapes=shapes)


def keep_joint_shape(plan: Plan, dataset: Any) -> None:
    """A joint plan's shape a worker sent, merged into what the process keeps of the dataset's
    chain it came from (``LEARNT.keep_joint_shape``), found by its path in the dataset (the
    worker walked its copy of it)."""
    if plan.joint_shape is None:
        return
    path, shape = plan.joint_shape
    found = walk(dataset)
    chain = next((c for p, c in found.chains + found.joint if p == path), None)
    if chain is not None:
        LEARNT.keep_joint_shape(chain, shape, merged_joint_shape)


def max_batch_size(loader: Any) -> Optional[int]:
    """The largest batch the loader can make: DALI pipelines are sized for it."""
    if loader.batch_size is not None:
        return int(loader.batch_size)
    size = getattr(loader.batch_sampler, "batch_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None
