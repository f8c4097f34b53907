"""What a converter works with besides the ops: the chain's state as torchvision would hold it
(types, not pixels), one sample's size and params row as it moves through the chain, and the
Step a converter returns (its ops, its drawer, its neutral row)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

from dali_autoproxy.plan.ir import Op


@dataclass
class ChainState:
    """What torchvision would be holding at this point of the chain (types, not pixels)."""
    kind: str = "pil"        # "pil" (HWC uint8) or "tensor" (CHW)
    dtype: str = "uint8"     # "uint8" or "float32"
    channels: int = 3
    fixed_size: Optional[Tuple[int, int]] = None  # output size when it is the same for all
    fidelity: str = "exact"  # "fast": approximate DALI operators where they are much faster (ColorJitter)
    exact_resize: bool = True  # False: DALI's resize for PIL images too (planning's second try)
    any_size: bool = False   # a joint transform's plan: recorded flips are Flip ops, its calls take any size


class SampleGeometry:
    """One sample's size as it moves through the chain, and the params drawn for it."""
    __slots__ = ("height", "width", "channels", "params")

    def __init__(self, height: int, width: int, channels: int = 3):
        self.height = height
        self.width = width
        self.channels = channels
        self.params: List[float] = []

    def put(self, op: Op, *values: float, **named: float) -> None:
        """Append ``op``'s values to the row, by name (``put(crop, top=0, left=0, ...)``) or all of
        them in the schema's order; every value once. The op's values must come next in the row
        (its drawer runs in plan order), which is checked."""
        names = type(op).params
        if len(self.params) != op.slot:
            raise RuntimeError(f"{type(op).__name__}'s values go at column {op.slot}, not {len(self.params)}")
        if values:
            if named or len(values) != len(names):
                raise TypeError(f"{type(op).__name__} takes {len(names)} values {names}, got {len(values)}")
            self.params += list(values)
            return
        try:  # per sample, in the worker: a list by name, the sets only to explain a mistake
            if len(named) != len(names):
                raise KeyError
            self.params += [named[n] for n in names]
        except KeyError:
            missing, unknown = set(names) - set(named), set(named) - set(names)
            raise TypeError(f"{type(op).__name__} values: missing {sorted(missing)}, "
                            f"unknown {sorted(unknown)}") from None

    def standin(self):
        """A zero-cost tensor of the current size, for torchvision's own get_params code."""
        import torch
        return torch.empty(1, dtype=torch.uint8).expand(self.channels, self.height, self.width)


Drawer = Callable[[SampleGeometry], None]


@dataclass
class Step:
    """One transform, translated: its name, its ops and its per-sample drawer. ``neutral``:
    the params row that makes its ops leave the image unchanged, where one exists (what lets
    RandomApply skip it per sample). ``note``: set on a recorded step (why it has no translation)."""
    name: str
    ops: List[Op] = field(default_factory=list)
    draw: Optional[Drawer] = None
    neutral: Optional[List[float]] = None
    note: Optional[str] = None  # a recorded step: why it has no translation
