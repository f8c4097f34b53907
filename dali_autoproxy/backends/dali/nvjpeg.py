"""Which nvJPEG DALI's GPU decoder gets, and whether a region decode can upsample like Pillow.

DALI's decoder opens nvJPEG by its soname (``libnvjpeg.so.13`` for the CUDA 13 build). The
dynamic loader hands back the first library loaded under that soname, and torchvision's wheel
bundles an older nvJPEG with the same soname, loaded by ``import torchvision``. With nvJPEG
older than 13.2 a region decode (``decoders.image_slice``) cannot upsample chroma as libjpeg
does: DALI falls back to a path 4x slower. Loading DALI's own nvJPEG (its wheel dependency)
first, before torchvision, makes the decoder take that one: the ``DALI_AUTOPROXY=1`` start-up
hook and ``enable()`` do it where nothing has loaded an nvJPEG yet. Where an older one is
already loaded, the plans decode whole images (libjpeg-style upsampling works there with any
nvJPEG) and crop after the decode.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import List, Optional, Tuple

FANCY_REGION_DECODE = (13, 2)  # the first nvJPEG whose region decode upsamples like libjpeg at full speed


def _dali_libraries() -> List[str]:
    """DALI's own nvJPEG files (nvidia-nvjpeg: nvidia/cu13/lib or nvidia/nvjpeg/lib), newest
    soname first; found on the import path without importing DALI."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    found: List[str] = []
    for root in roots:
        found += glob.glob(os.path.join(root, "*", "lib", "libnvjpeg.so.[0-9]*"))
    return sorted(found, key=os.path.basename, reverse=True)  # stable: import-path order kept


def _version(lib: ctypes.CDLL) -> Optional[Tuple[int, int]]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    try:
        if lib.nvjpegGetProperty(0, ctypes.byref(major)) or lib.nvjpegGetProperty(1, ctypes.byref(minor)):
            return None
    except AttributeError:
        return None
    return major.value, minor.value


def loaded_version(soname: str) -> Optional[Tuple[int, int]]:
    """(major, minor) of the nvJPEG a dlopen of ``soname`` returns now, or None where no
    library of that soname is loaded (RTLD_NOLOAD: nothing is loaded by asking)."""
    try:
        lib = ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError:
        return None
    return _version(lib)


def preload() -> Optional[Tuple[int, int]]:
    """Load DALI's own nvJPEG under its soname unless one of that soname is loaded already;
    the version DALI's decoder will get, or None where DALI's wheel has none (CPU machines, no
    DALI). Costs a glob and, once, a dlopen; never raises."""
    try:
        for path in _dali_libraries():
            soname = os.path.basename(path)
            version = loaded_version(soname)
            if version is None:
                version = _version(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
            return version
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=None)
def region_decode_like_libjpeg() -> bool:
    """Whether a GPU region decode can upsample chroma as libjpeg does at full speed: the nvJPEG
    DALI gets is 13.2 or newer. Decided once per process, when the first GPU pipeline is built
    (DALI's decoder has loaded its library by then)."""
    return (preload() or (0, 0)) >= FANCY_REGION_DECODE
