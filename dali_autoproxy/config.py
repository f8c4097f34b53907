"""Options of enable() and their environment variables, validated in one place.

Every option has a keyword argument and a variable; the keyword wins. A bad value is a
ValueError that names the option, where it came from and what is accepted, so that a typo
never silently turns the feature off.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping, Optional

DEVICES = ("auto", "gpu", "cpu")
OUTPUTS = ("auto", "cpu")
FIDELITIES = ("exact", "fast")
RESIZES = ("dali", "pillow")
RECORDS = ("on", "off")
AUGMIXES = ("worker", "stage")
SHARED_DECODES = ("on", "off")
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")
ENABLE_VALUES_ON = ("1", "true", "yes", "on")
ENABLE_VALUES_OFF = ("", "0", "false", "no", "off")

ENV_ENABLE = "DALI_AUTOPROXY"
ENV_DEVICE = "DALI_AUTOPROXY_DEVICE"
ENV_OUTPUT = "DALI_AUTOPROXY_OUTPUT"
ENV_LOG = "DALI_AUTOPROXY_LOG"
ENV_FIDELITY = "DALI_AUTOPROXY_FIDELITY"
ENV_LOOKAHEAD = "DALI_AUTOPROXY_LOOKAHEAD"
LOOKAHEAD_RANGE = (1, 64)
ENV_HW_DECODER_LOAD = "DALI_AUTOPROXY_HW_DECODER_LOAD"
ENV_RESIZE = "DALI_AUTOPROXY_RESIZE"
ENV_RECORD = "DALI_AUTOPROXY_RECORD"
ENV_AUGMIX = "DALI_AUTOPROXY_AUGMIX"
ENV_SHARED_DECODE = "DALI_AUTOPROXY_SHARED_DECODE"
ENV_STRICT = "DALI_AUTOPROXY_STRICT"
ENV_TRITON = "DALI_AUTOPROXY_TRITON"
TRITON_VALUES = ("1", "0")


@dataclass(frozen=True)
class Options:
    device: str = "auto"
    output: str = "auto"
    log_level: str = "INFO"
    fidelity: str = "exact"
    # Batches handed to DALI ahead of the one the loop waits for; DALI's queue is as deep (DALI's
    # proxy documentation sizes its queue at 2 per worker). None: main/runs.py's ``lookahead_batches``
    # (16, more for small batches on the GPU, so that the look-ahead holds several gathered runs).
    lookahead: Optional[int] = None
    # Share of each batch's JPEGs given to the GPU's hardware decoder (where it has one; the rest
    # are decoded by nvJPEG's CUDA path, whose Huffman stage runs on DALI's CPU threads). DALI's
    # default is 0.65; on the H200, 0.9 took camera-sized photos from 5.1k to 7.4k img/s and train
    # at 8 workers from 24.4k to 27.7k, with the DataLoader's workers sharing the cores.
    hw_decoder_load: float = 0.9
    # "pillow": Resize / RandomResizedCrop of PIL images with Pillow's arithmetic, border included
    # (torch_stage/resample.py), of tensor images with torchvision's own kernel
    # (torch_stage/tensor_resize.py): torchvision's results; "dali": DALI's resize, faster where the
    # main process is the limit, within the bound in docs/transforms.md.
    resize: str = "pillow"
    # "on": a transform without a translation, on a PIL image, is called with a recording image
    # (plan/record/image.py) and its Pillow calls run on DALI's side; "off": it runs in the worker.
    record: str = "on"
    # "worker": AugMix (torchvision's and timm's) runs in the worker, as written; "stage": in the
    # torch stage, with the same values, slower than the workers where measured
    # (benchmarks/results/augmix_steady_h200.md).
    augmix: str = "worker"
    # "on": the views a multi-view recipe makes of one image (one per position of the sample) are
    # decoded once, each view cropped from that decode in one pipeline; "off": each view decodes
    # its own region of the JPEG (fewer pixels per decode, as many decodes as views).
    shared_decode: str = "on"
    # "on": whatever would not run on DALI (a loader falling back, a step or a decode left in the
    # worker, a chain call not taken over, a batch DALI failed on) raises StrictModeError naming
    # it, for a CI that must know the pipeline runs on DALI; "off": it runs as torchvision's code.
    strict: str = "off"


class StrictModeError(RuntimeError):
    """Raised with ``strict="on"`` where a loader, step or decode would not run on DALI."""


def _pick_number(name: str, value, env_name: str, environ: Mapping[str, str], default, parse, valid, accepted: str):
    """A numeric option: the keyword, else the variable parsed by ``parse`` (None when unreadable)."""
    source, number = f"{name}=", value
    if value is None:
        raw = environ.get(env_name)
        if raw is None or raw.strip() == "":
            return default
        value, source = raw, f"{env_name}="
        number = parse(raw.strip())
    if not valid(number):
        raise ValueError(f"dali_autoproxy: invalid value {source}{value!r}; accepted values: {accepted}")
    return number


def _pick_int(name: str, value, env_name: str, bounds: tuple, environ: Mapping[str, str], default: int) -> int:
    return _pick_number(name, value, env_name, environ, default, lambda raw: int(raw) if raw.isdigit() else None,
                        lambda n: type(n) is int and bounds[0] <= n <= bounds[1],
                        f"whole numbers {bounds[0]} to {bounds[1]}")


def _float_or_none(raw: str) -> Optional[float]:
    try:
        return float(raw)
    except ValueError:
        return None


def _pick_fraction(name: str, value, env_name: str, environ: Mapping[str, str], default: float) -> float:
    return float(_pick_number(name, value, env_name, environ, default, _float_or_none,
                              lambda n: type(n) in (int, float) and 0.0 <= n <= 1.0, "numbers from 0 to 1"))


def _given(name: str, value, env_name: str, environ: Mapping[str, str]) -> Optional[tuple]:
    """(value, where it came from as "name=" or "VARIABLE="): the keyword, else the variable;
    None when neither is set (the default applies)."""
    if value is not None:
        return value, f"{name}="
    raw = environ.get(env_name)
    if raw is None or raw.strip() == "":
        return None
    return raw, f"{env_name}="


def _pick(name: str, value: Optional[str], env_name: str, accepted: tuple, environ: Mapping[str, str],
          default: str, upper: bool = False) -> str:
    given = _given(name, value, env_name, environ)
    if given is None:
        return default
    value, source = given
    if not isinstance(value, str):
        raise ValueError(f"dali_autoproxy: option {source}{value!r} must be a string; "
                         f"accepted values: {', '.join(accepted)}")
    norm = value.strip().upper() if upper else value.strip().lower()
    if norm not in accepted:
        raise ValueError(f"dali_autoproxy: invalid value {source}{value!r}; "
                         f"accepted values: {', '.join(accepted)}")
    return norm


def resolve_options(device: Optional[str] = None, output: Optional[str] = None,
                    log_level: Optional[str] = None, fidelity: Optional[str] = None,
                    environ: Optional[Mapping[str, str]] = None, lookahead: Optional[int] = None,
                    hw_decoder_load: Optional[float] = None, resize: Optional[str] = None,
                    record: Optional[str] = None, shared_decode: Optional[str] = None,
                    strict: Optional[str] = None, augmix: Optional[str] = None) -> Options:
    """Merge keyword arguments over environment variables and validate both."""
    env = os.environ if environ is None else environ
    triton_allowed(env)  # read where the kernels load (backends/torch_stage/fused_color.py); checked here too
    return Options(
        device=_pick("device", device, ENV_DEVICE, DEVICES, env, "auto"),
        output=_pick("output", output, ENV_OUTPUT, OUTPUTS, env, "auto"),
        log_level=_pick("log_level", log_level, ENV_LOG, LOG_LEVELS, env, "INFO", upper=True),
        fidelity=_pick("fidelity", fidelity, ENV_FIDELITY, FIDELITIES, env, "exact"),
        lookahead=_pick_int("lookahead", lookahead, ENV_LOOKAHEAD, LOOKAHEAD_RANGE, env, Options.lookahead),
        hw_decoder_load=_pick_fraction("hw_decoder_load", hw_decoder_load, ENV_HW_DECODER_LOAD, env,
                                       Options.hw_decoder_load),
        resize=_pick("resize", resize, ENV_RESIZE, RESIZES, env, Options.resize),
        record=_pick("record", record, ENV_RECORD, RECORDS, env, Options.record),
        shared_decode=_pick("shared_decode", shared_decode, ENV_SHARED_DECODE, SHARED_DECODES, env,
                            Options.shared_decode),
        strict=_pick_switch("strict", strict, ENV_STRICT, env, Options.strict),
        augmix=_pick("augmix", augmix, ENV_AUGMIX, AUGMIXES, env, Options.augmix),
    )


def _pick_switch(name: str, value, env_name: str, environ: Mapping[str, str], default: str) -> str:
    """An on/off option: a bool or on/off/1/0/true/false/yes/no -> "on" or "off"."""
    given = _given(name, value, env_name, environ)
    if given is None:
        return default
    value, source = given
    if isinstance(value, bool):
        return "on" if value else "off"
    norm = value.strip().lower() if isinstance(value, str) else None
    if norm in ENABLE_VALUES_ON:
        return "on"
    if norm and norm in ENABLE_VALUES_OFF:
        return "off"
    raise ValueError(f"dali_autoproxy: invalid value {source}{value!r}; accepted values: True, False, "
                     f"{', '.join(ENABLE_VALUES_ON)} (on) or 0, false, no, off (off)")


def triton_allowed(environ: Optional[Mapping[str, str]] = None) -> bool:
    """DALI_AUTOPROXY_TRITON: whether the Triton kernels may run (ValueError on a bad value)."""
    env = os.environ if environ is None else environ
    return _pick(ENV_TRITON, None, ENV_TRITON, TRITON_VALUES, env, "1") == "1"


def enable_requested(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Read DALI_AUTOPROXY; raise ValueError on a value that is neither on nor off."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_ENABLE, "")
    norm = raw.strip().lower()
    if norm in ENABLE_VALUES_ON:
        return True
    if norm in ENABLE_VALUES_OFF:
        return False
    raise ValueError(f"dali_autoproxy: invalid value {ENV_ENABLE}={raw!r}; accepted values: "
                     f"{', '.join(ENABLE_VALUES_ON)} (on) or 0, false, no, off (off)")


logger = logging.getLogger("dali_autoproxy")
_handler: Optional[logging.Handler] = None


def configure_logging(level: str) -> None:
    """Make the package's messages visible by default (fallback reasons matter to users)."""
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[dali_autoproxy] %(levelname)s: %(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False
    logger.setLevel(level)
