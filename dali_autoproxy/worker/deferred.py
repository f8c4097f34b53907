"""JPEGs that stay encoded until something needs their pixels.

Pillow already decodes lazily: ``Image.open`` reads the header, and ``load()`` (which every
pixel-touching method calls, ``convert()`` first of all) decodes. In a proxied loader's worker
two things keep that laziness one step longer:

- ``JpegImageFile.convert("RGB")`` on an image nothing has loaded returns a
  :class:`DeferredJpeg`: a real ``PIL.Image.Image`` in mode RGB, of the file's size, holding
  the file's encoded bytes (taken while the file is still open);
- ImageFolder's PIL loader is swapped for :class:`DeferredFileLoader`, which reads the file and
  returns the same thing without PIL's header parse.

A recognised transform chain that receives such an image sends the bytes to DALI, so decoding
runs there (``encoded_jpeg``). Anything else that touches the pixels (numpy, ``crop``, a user's
PIL filter, pickling) decodes them right then, exactly as Pillow would have: the image opens
its bytes with Pillow and converts to RGB. Only ordinary, complete JPEGs that Pillow reads as
RGB or L are deferred; anything else (PNG, CMYK, truncated, drafted) decodes as it always
did, where it always did, so errors arise where the user's code expects them.
"""
from __future__ import annotations

import io
import re
from typing import Any, Optional, Tuple

from PIL import Image, JpegImagePlugin

from dali_autoproxy.plan.record.image import NeedsPixels, RecordingImage, recording

_SOF_BASELINE_PROGRESSIVE = (0xC0, 0xC1, 0xC2)  # 8-bit Huffman frames, which PIL opens as "L"/"RGB"
_STANDALONE = set(range(0xD0, 0xD8)) | {0x01}     # markers without a length field


def plain_jpeg_header(data: bytes) -> Optional[Tuple[str, int, int, int]]:
    """(mode, width, height, scan offset) of an ordinary JPEG, read from its markers in a few
    microseconds, or None for anything else (then PIL's own header parse decides). Ordinary:
    SOI, well-formed segments, an 8-bit baseline/extended/progressive frame with 1 or 3
    components and no Adobe marker (its colour transform is left to PIL), before the first
    scan. PIL opens every such file as "L" or "RGB" with these dimensions. The scan offset is
    where the first scan's entropy-coded data starts."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos, frame = 2, None
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2 or pos + 2 + length > n:
            return None
        if marker == 0xEE:  # Adobe: colour transform flags
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in _SOF_BASELINE_PROGRESSIVE or frame is not None or length < 8:
                return None
            precision = data[pos + 4]
            height = (data[pos + 5] << 8) | data[pos + 6]
            width = (data[pos + 7] << 8) | data[pos + 8]
            components = data[pos + 9]
            if precision != 8 or components not in (1, 3) or length != 8 + 3 * components:
                return None
            frame = ("L" if components == 1 else "RGB", width, height)
        if marker == 0xDA:  # start of scan: the header is complete
            return None if frame is None else frame + (pos + 2 + length,)
        pos += 2 + length
    return None


def is_complete(data: bytes, scan_start: int) -> bool:
    """Whether the image data after the first scan reaches an end-of-image marker. Byte
    stuffing keeps FF D9 out of entropy-coded data, so any FF D9 after the scan starts is the
    image's own EOI; a truncated file has none there (an EOI before the scan, of an embedded
    EXIF thumbnail, does not count). Searched from the end, where a complete file has it."""
    return data.rfind(b"\xff\xd9") >= scan_start


# the first marker in entropy-coded data: FF then anything but a stuffed 00 or a fill FF (and,
# where restart markers are on, anything but RST0-7)
_MARKER = re.compile(rb"\xff[^\x00\xff]")
_MARKER_WITH_RESTARTS = re.compile(rb"\xff[^\x00\xff\xd0-\xd7]")
_BETWEEN_SCANS = {0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE} | set(range(0xE0, 0xF0))  # tables, SOS, DRI, APPn, COM


def scans_well_formed(data: bytes, scan_start: int) -> bool:
    """Whether the entropy-coded data from the first scan on holds no marker that cannot be
    there: each scan's data ends at a table, another scan's header or the end of the image, and
    restart markers appear only where a restart interval is set. Random bytes written over a
    JPEG's compressed data (a corrupt file) break this in all but a few cases; such a file is
    not deferred, so Pillow decodes it where the user's code asks and raises what plain raises
    (DALI's decoders decode it with a warning). One regular-expression search per scan, about
    1 us per KB."""
    restarts = b"\xff\xdd" in data[:scan_start]
    pos, n = scan_start, len(data)
    while True:
        found = (_MARKER_WITH_RESTARTS if restarts else _MARKER).search(data, pos)
        if found is None:
            return False
        at, marker = found.start(), data[found.start() + 1]
        if marker == 0xD9:  # the end of the image
            return True
        if marker not in _BETWEEN_SCANS or at + 4 > n:
            return False
        length = (data[at + 2] << 8) | data[at + 3]
        if length < 2 or at + 2 + length > n:
            return False
        restarts = restarts or marker == 0xDD
        pos = at + 2 + length  # after a scan's header: its data; after a table: the next marker


def dali_decodable(data: bytes) -> Optional[Tuple[str, int, int]]:
    """(mode, width, height) when DALI decodes these bytes exactly as Pillow's
    ``Image.open(...).convert("RGB")`` would, else None: an ordinary, complete JPEG of
    non-zero size, RGB or L, whose compressed data is well formed."""
    header = plain_jpeg_header(data)
    if header is None:
        return None
    mode, width, height, scan = header
    if width <= 0 or height <= 0 or not is_complete(data, scan) or not scans_well_formed(data, scan):
        return None
    return mode, width, height


class LazyPixels(Image.Image):
    """A PIL image whose pixels are made on first need: Pillow's methods reach them through
    ``load()`` or ``im``, and both call ``_make_pixels()`` first (which sets ``_im``)."""
    stands_in_for = Image.Image  # what torchvision's exact-type lookups (v2's fills) see: plain's type

    def _make_pixels(self) -> None:
        raise NotImplementedError

    @property
    def im(self) -> Any:
        if self._im is None:
            self._make_pixels()
        return Image.Image.im.fget(self)

    @im.setter
    def im(self, value: Any) -> None:
        self._im = value

    def load(self) -> Any:
        if self._im is None:
            self._make_pixels()
        return super().load()


class DeferredJpeg(LazyPixels):
    """An RGB image whose pixels are still the JPEG bytes ``data``. Pillow's methods reach the
    pixels through ``load()`` or ``im``; both decode first, as ``Image.open(data).convert("RGB")``."""

    def __init__(self, data: bytes, size: Tuple[int, int], info: Optional[dict] = None,
                 path: Optional[str] = None) -> None:
        super().__init__()
        self._mode = "RGB"
        self._size = size
        self.info = dict(info or {})
        self.data = data
        self.path = path

    @property
    def deferred(self) -> bool:
        """True until something has needed the pixels."""
        return self._im is None

    def _make_pixels(self) -> None:
        with Image.open(io.BytesIO(self.data)) as src:
            self._im = Image.Image.convert(src, "RGB").im  # Pillow's own convert, never deferred

    def copy(self) -> Image.Image:
        if self._im is None:
            return DeferredJpeg(self.data, self.size, self.info, self.path)
        return super().copy()

    def convert(self, mode: Optional[str] = None, *args: Any, **kwargs: Any) -> Image.Image:
        if self._im is None and mode == "RGB" and not args and not kwargs:
            return self.copy()  # what Pillow returns for a conversion to the same mode
        return super().convert(mode, *args, **kwargs)

    def crop(self, *args: Any, **kwargs: Any) -> Image.Image:
        return _kept_call(self, self, (), "crop", args, kwargs) or super().crop(*args, **kwargs)

    def resize(self, *args: Any, **kwargs: Any) -> Image.Image:
        return _kept_call(self, self, (), "resize", args, kwargs) or super().resize(*args, **kwargs)


class ResizedJpeg(LazyPixels):
    """A still-encoded JPEG that the dataset's own code cropped or resized before a chain
    (``img.resize((256, 256))`` in ``__getitem__``): its size as Pillow gives it, the calls kept
    (``calls``: Pillow's methods and arguments, ``recorded``: as a recording image records
    them). A chain that takes it sends the JPEG to DALI with those calls as the first ops
    (``worker/proxy_node.py``); anything that touches its pixels gets Pillow's: the JPEG decoded
    and the calls made, as written."""

    def __init__(self, source: DeferredJpeg, calls: tuple, recorded: tuple, size: Tuple[int, int]) -> None:
        super().__init__()
        self._mode = "RGB"
        self._size = size
        self.info = dict(source.info)
        self.source, self.calls, self.recorded = source, calls, recorded

    @property
    def deferred(self) -> bool:
        return self._im is None and self.source.deferred

    def _make_pixels(self) -> None:
        img: Image.Image = self.source.copy()
        img.load()
        for method, args, kwargs in self.calls:
            img = getattr(Image.Image, method)(img, *args, **kwargs)  # Pillow's own, on real pixels
        self._im, self._size = img.im, img.size

    def copy(self) -> Image.Image:
        if self._im is None:
            return ResizedJpeg(self.source, self.calls, self.recorded, self.size)
        return super().copy()

    def convert(self, mode: Optional[str] = None, *args: Any, **kwargs: Any) -> Image.Image:
        if self._im is None and mode == "RGB" and not args and not kwargs:
            return self.copy()
        return super().convert(mode, *args, **kwargs)

    def crop(self, *args: Any, **kwargs: Any) -> Image.Image:
        return (self._im is None and _kept_call(self, self.source, self.calls, "crop", args, kwargs)
                or super().crop(*args, **kwargs))

    def resize(self, *args: Any, **kwargs: Any) -> Image.Image:
        return (self._im is None and _kept_call(self, self.source, self.calls, "resize", args, kwargs)
                or super().resize(*args, **kwargs))


MAX_KEPT_CALLS = 4  # crops and resizes kept on an encoded JPEG; more: it decodes


def _kept_call(img: Image.Image, source: DeferredJpeg, calls: tuple, method: str, args: tuple,
             kwargs: dict) -> Optional[Image.Image]:
    """``img.<method>(*args, **kwargs)`` kept on the encoded JPEG where a recording image records
    it as Pillow would compute it (None: Pillow decodes and does it, as always)."""
    if not source.deferred or len(calls) >= MAX_KEPT_CALLS:
        return None
    before = RecordingImage(img.size, "RGB", getattr(img, "recorded", ()))
    recording.active += 1
    try:
        after = getattr(before, method)(*args, **kwargs)
    except (NeedsPixels, Exception):  # Pillow's own call decides (and raises where it raises)
        return None
    finally:
        recording.active -= 1
    if after.calls == before.calls:
        return None  # nothing to keep (a copy): Pillow's own
    return ResizedJpeg(source, calls + ((method, args, kwargs),), after.calls, after.size)


def _read_all(fp: Any) -> Optional[bytes]:
    """The whole stream Pillow opened (it always starts at 0), leaving its position alone."""
    try:
        if fp is None or getattr(fp, "closed", False):
            return None
        pos = fp.tell()
        fp.seek(0)
        data = fp.read()
        fp.seek(pos)
        return data if isinstance(data, bytes) else None
    except Exception:
        return None


def _untouched_jpeg_bytes(img: Any) -> Optional[bytes]:
    """The encoded bytes of a JpegImageFile that nothing has loaded or drafted, when DALI
    decodes them as Pillow would; None otherwise."""
    if type(img) is not JpegImageFile or img._im is not None or img.decoderconfig or img.mode not in ("RGB", "L"):
        return None
    data = img.__dict__.get(_BYTES_READ)
    if data is not None and img.fp is not None and not getattr(img.fp, "closed", False):
        return data  # read for another view of the same image: the same bytes, decoded once
    data = _read_all(img.fp)
    if data is None:
        return None
    found = dali_decodable(data)
    if found is None or found[0] != img.mode or found[1:] != img.size:
        return None
    img.__dict__[_BYTES_READ] = data
    return data


_BYTES_READ = "_dali_autoproxy_jpeg"  # where a JpegImageFile keeps the bytes read from it


JpegImageFile = JpegImagePlugin.JpegImageFile


def defer_convert(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of ``JpegImageFile.convert`` while deferral is on: ``convert("RGB")`` of an
    untouched ordinary JPEG returns a DeferredJpeg; every other call is Pillow's."""
    mode = args[0] if args else kwargs.get("mode")
    if mode == "RGB" and len(args) + len(kwargs) == 1:
        data = _untouched_jpeg_bytes(instance)
        if data is not None:
            if instance._exclusive_fp:  # Pillow opened the file: free it as load() would
                instance.fp.close()
                instance.fp = io.BytesIO(data)
            path = getattr(instance, "filename", None) or None
            return DeferredJpeg(data, instance.size, instance.info, path)
        return _not_deferred(wrapped(*args, **kwargs))
    return wrapped(*args, **kwargs)


NOT_DEFERRED = "autoproxy_not_deferred"  # marks an image decoded here because it is no ordinary JPEG


def _not_deferred(img: Image.Image) -> Image.Image:
    setattr(img, NOT_DEFERRED, True)
    return img


def encoded_jpeg(img: Any) -> Optional[Tuple[bytes, Tuple[int, int], Optional[str]]]:
    """(bytes, (width, height), path) of an image a chain may send to DALI still encoded:
    a DeferredJpeg nothing has decoded, or an untouched RGB JpegImageFile (``Image.open``
    without ``convert``) whose file is still open; else None."""
    if type(img) is DeferredJpeg:
        return (img.data, img.size, img.path) if img.deferred else None
    if type(img) is JpegImageFile and img.mode == "RGB":
        data = _untouched_jpeg_bytes(img)
        if data is not None:
            return data, img.size, getattr(img, "filename", None) or None
    return None


class DeferredFileLoader:
    """Replaces an ImageFolder's PIL loader in the workers: read the file, and return a
    DeferredJpeg for an ordinary JPEG (no PIL header parse) or, for anything else, exactly what
    torchvision's ``pil_loader`` returns or raises (its exception naming the dataset index and
    file, when the dataset's ``samples`` are known)."""

    def __init__(self, samples: Optional[list] = None):
        self.samples = samples

    def __call__(self, path: str) -> Image.Image:
        with open(path, "rb") as f:
            data = f.read()
        found = dali_decodable(data)
        if found is not None:
            return DeferredJpeg(data, found[1:], None, path)
        return _not_deferred(self.pil_load(path))

    def pil_load(self, path: str) -> Image.Image:
        from torchvision.datasets.folder import pil_loader
        try:
            return pil_loader(path)
        except Exception as exc:
            index = next((i for i, s in enumerate(self.samples or ()) if s[0] == path), None)
            where = f"dataset index {index}, file {path}" if index is not None else f"file {path}"
            try:
                err = type(exc)(f"{exc} [{where}]")
            except Exception:
                raise exc
            raise err from exc
