"""Data libraries that decode images themselves, eagerly: their JPEGs stay encoded too.

webdataset's ``.decode("pil")`` and Hugging Face ``datasets``' ``Image`` feature open each image
with Pillow and call ``load()`` at once, so Pillow's own laziness never gets a chance. In a
proxied loader's workers their decoders are wrapped (by qualified name: neither library is
imported here): an ordinary, complete JPEG (RGB, or grayscale where the library converts it)
comes back as a :class:`DeferredJpeg`, the very image the library would have returned (same
size and mode, decoded by Pillow the moment anything needs its pixels), and a recognised chain
that receives it sends its bytes to DALI; a grayscale one the library returns as it is comes
back opened by Pillow, not loaded.
Anything else, and any image the library would change (Hugging Face applies EXIF orientation),
is decoded by the library as before.
"""
from __future__ import annotations

import io
import sys
from typing import Any, Callable, List, Tuple

from PIL import Image

from dali_autoproxy.worker.deferred import DeferredJpeg, dali_decodable
from dali_autoproxy.worker.routing import routing_active


def _rgb_jpeg(data: Any, path: Any = None, keep_mode: bool = False) -> Any:
    """For bytes that Pillow opens as an ordinary complete JPEG: a DeferredJpeg of its RGB image
    (a grayscale one converted as Pillow's ``convert("RGB")``, which is what DALI decodes); with
    ``keep_mode`` (the library returns the image in its own mode) a grayscale JPEG comes back
    as Pillow opens it, not loaded, so that the chain's ``convert("RGB")`` defers it. Else None."""
    if not isinstance(data, (bytes, bytearray)):
        return None
    found = dali_decodable(bytes(data))
    if found is None:
        return None
    if found[0] == "L" and keep_mode:
        return Image.open(io.BytesIO(bytes(data)))  # Pillow's laziness: decoded when its pixels are used
    return DeferredJpeg(bytes(data), found[1:], None, path)


def webdataset_image(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``webdataset.autodecode.ImageHandler.__call__(key, data)``: for the "pil"/"pilrgb" specs
    the library returns ``Image.open(data)``, loaded, converted to RGB."""
    if routing_active() and len(args) == 2 and not kwargs and instance.imagespec in ("pil", "pilrgb"):
        key, data = args
        if key.rsplit(".", 1)[-1].lower() in instance.extensions:
            img = _rgb_jpeg(data)
            if img is not None:
                return img
    return wrapped(*args, **kwargs)


def hf_image(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``datasets.features.Image.decode_example(value)``: the library opens the bytes (or the
    local file), loads them, applies EXIF orientation, converts to the feature's mode."""
    value = args[0] if args else kwargs.get("value")
    if routing_active() and isinstance(value, dict) and instance.mode in (None, "RGB"):
        data, path = value.get("bytes"), value.get("path")
        if data is None and isinstance(path, str) and "::" not in path and "://" not in path:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                data = None
        img = _rgb_jpeg(data, path, keep_mode=instance.mode is None)
        if img is not None and not _has_orientation(data):
            return img
    return wrapped(*args, **kwargs)


def _has_orientation(data: bytes) -> bool:
    with Image.open(io.BytesIO(data)) as header:  # the header only: no pixels decoded
        return header.getexif().get(0x0112) is not None


# (module, class, method, wrapper): patched in a proxied loader's workers when the module is loaded
DECODERS: List[Tuple[str, str, str, Callable]] = [
    ("webdataset.autodecode", "ImageHandler", "__call__", webdataset_image),
    ("datasets.features.image", "Image", "decode_example", hf_image),
]


def loaded_decoders() -> List[Tuple[Any, str, Callable]]:
    """(class, method, wrapper) for each library decoder whose module this process has loaded."""
    out = []
    for module, cls, method, wrapper in DECODERS:
        mod = sys.modules.get(module)
        owner = getattr(mod, cls, None) if mod is not None else None
        if owner is not None and hasattr(owner, method):
            out.append((owner, method, wrapper))
    return out
