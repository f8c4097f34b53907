"""torchvision's tensor kernels on CUDA tensors with the CPU's division.

The references run torchvision's tensor kernels on the CPU. Called on CUDA tensors, the same
Python code rounds differently in two places, because PyTorch's CUDA kernels trade the last bit
for speed there:
- ``tensor / python_number`` is computed as ``tensor * (1 / number)`` (the CPU divides), as in
  v1's ``convert_image_dtype`` (``/ 255``) and ``_rgb2hsv`` (``/ 6.0``);
- ``mean`` multiplies the sum by ``1 / n`` (the CPU divides the sum by ``n``), as in the
  contrast kernels.
One bit is enough to move a uint8 truncation by a level, and ColorJitter's later adjustments
turn that level into several (hue on a nearly grey pixel). Inside ``cpu_division`` both are
divisions again: the divisor a 0-d tensor on the device, which CUDA's kernel divides by
exactly. Integer-valued means (grayscale of uint8 images up to 2**24 / 255 pixels) then equal
the CPU's bit for bit, the sum being exact in either order.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

from dali_autoproxy.backends.torch_stage.registry import constant

_DIVISIONS = {torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.true_divide, torch.Tensor.div_,
              torch.Tensor.true_divide_, torch.Tensor.__truediv__, torch.Tensor.__itruediv__}
_MEANS = {torch.mean, torch.Tensor.mean}


def _divisor(x: torch.Tensor, number: float) -> torch.Tensor:
    return constant([number], x.device, x.dtype).view(())


class CpuDivision(TorchFunctionMode):
    """The mode itself; ``applies(tensor)`` says which tensors it rewrites (CUDA ones)."""

    def __init__(self, applies: Callable[[torch.Tensor], bool] = lambda t: t.is_cuda) -> None:
        super().__init__()
        self.applies = applies

    def _takes(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.is_floating_point() and self.applies(x)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in _DIVISIONS and len(args) == 2 and isinstance(args[1], (int, float)) and self._takes(args[0])
                and kwargs.get("rounding_mode") is None):
            return func(args[0], _divisor(args[0], args[1]), **kwargs)
        if func in _MEANS and args and self._takes(args[0]) and "dtype" not in kwargs and "out" not in kwargs:
            x = args[0]
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            total = x.sum() if dim is None else x.sum(dim=dim, keepdim=keepdim)
            return total / _divisor(x, x.numel() // max(total.numel(), 1))
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_division(x: torch.Tensor) -> Iterator[None]:
    """Run torchvision's kernels on ``x`` with the CPU's division (module docstring); a no-op
    for tensors on the CPU."""
    if not x.is_cuda:
        yield
        return
    with CpuDivision():
        yield
