"""dali_autoproxy: one line moves a DataLoader's torchvision transforms onto DALI.

    import dali_autoproxy; dali_autoproxy.enable()

or ``DALI_AUTOPROXY=1 python train.py``. Importing this package imports neither torch
nor DALI; enable() patches torch's DataLoader when torch is (or gets) imported.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from dali_autoproxy.config import StrictModeError, configure_logging, resolve_options
from dali_autoproxy.main.hooks import instrumentor
from dali_autoproxy.main.report import format_report, print_report, report

__version__ = "0.1.0"
__all__ = ["enable", "disable", "register_equivalent", "register_op", "is_enabled", "report", "print_report",
           "format_report", "StrictModeError"]


def enable(*, device: Optional[str] = None, output: Optional[str] = None,
           log_level: Optional[str] = None, fidelity: Optional[str] = None,
           lookahead: Optional[int] = None, hw_decoder_load: Optional[float] = None,
           resize: Optional[str] = None, record: Optional[str] = None,
           shared_decode: Optional[str] = None, strict: Optional[bool] = None,
           augmix: Optional[str] = None) -> None:
    """Patch torch's DataLoader so recognised torchvision transforms run in DALI.

    device: "auto" (GPU when CUDA and DALI are usable, else plain torchvision), "gpu", or
    "cpu" (DALI's CPU backend). output: "auto" (where DALI ran) or "cpu". log_level: a
    logging level name. fidelity: "exact" (torchvision's arithmetic) or "fast" (ColorJitter
    by DALI's own colour operator, with torchvision's draws: faster, approximate; its PSNR is
    in docs/benchmarks.md). lookahead: batches queued to DALI ahead of the one the loop waits
    for (default 16, on the GPU more for batches under 8 so that several gathered runs are queued;
    fewer hold less GPU memory, more keep decode-bound loaders busier).
    hw_decoder_load: share of the JPEGs given to the GPU's hardware decoder, 0 to 1 (default
    0.9; the rest decode on DALI's CPU threads and CUDA). resize: "pillow" (default:
    Resize and RandomResizedCrop equal to torchvision's, of PIL images with Pillow's arithmetic,
    border included, of tensors with torchvision's kernel) or "dali" (DALI's resize, within a
    measured bound of torchvision's, see docs/transforms.md). record: "on" (default: a
    transform without a translation is called with a recording image and its Pillow calls run on
    DALI's side, see docs/how-it-works.md) or "off" (it runs in the worker). shared_decode: "on"
    (default: the views of one image, as multi-view recipes make them, decode it once) or "off"
    (each view decodes its own region). strict: True raises StrictModeError, naming the step and
    the reason, wherever the data would not run on DALI (a loader that falls back, a step or a
    decode left in the worker, a chain call not taken over, a batch DALI failed on): for a CI
    that must know its pipeline runs on DALI. augmix: "worker" (default: AugMix runs in the worker,
    as written) or "stage" (in the torch stage, the same values; slower than the workers where
    measured). Each falls back to DALI_AUTOPROXY_DEVICE / _OUTPUT / _LOG / _FIDELITY / _LOOKAHEAD /
    _HW_DECODER_LOAD / _RESIZE / _RECORD / _SHARED_DECODE / _STRICT / _AUGMIX.
    Calling it again only updates the options.
    """
    options = resolve_options(device, output, log_level, fidelity, lookahead=lookahead,
                              hw_decoder_load=hw_decoder_load, resize=resize, record=record,
                              shared_decode=shared_decode, strict=strict, augmix=augmix)
    configure_logging(options.log_level)
    if options.device != "cpu":  # before torchvision loads its older copy (see nvjpeg.py)
        from dali_autoproxy.backends.dali.nvjpeg import preload
        preload()
    instrumentor.instrument(options)


def register_equivalent(cls: type, to_torchvision: Optional[Callable[[Any], Any]] = None) -> Any:
    """Declare your own transform class equivalent to torchvision transforms, so that a chain
    holding it moves to DALI whole::

        @dali_autoproxy.register_equivalent(GaussianBlur)   # MoCo's PIL blur, random radius
        def _(t):
            return T.GaussianBlur(kernel_size=23, sigma=tuple(t.sigma))

    ``to_torchvision(instance)`` returns the torchvision transform (or Compose) translated in
    its place, with torchvision's random draws: the results are the equivalent's, by your
    declaration. Register where the class is defined, at import time."""
    from dali_autoproxy.plan.translate import register_equivalent as register
    return register(cls, to_torchvision)


def register_op(op_type: type, **kernels_and_converter: Any) -> type:
    """Add an IR op of your own with its converter and its kernels in one place (see
    ``dali_autoproxy.extend.register_op``, which this calls; it imports torch)."""
    from dali_autoproxy.extend import register_op as register
    return register(op_type, **kernels_and_converter)


def disable() -> None:
    """Restore every patched attribute; loaders iterate as plain torchvision again."""
    instrumentor.uninstrument()


def is_enabled() -> bool:
    return instrumentor.active
