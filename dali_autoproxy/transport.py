"""Worker-to-main transport: what a worker hands over instead of a processed image.

In the worker, the dataset's transform is replaced by a :class:`ProxyNode`. It returns a
:class:`ProxySample` (the file's encoded bytes or the image's pixels, plus the per-sample
params drawn with torchvision's RNG calls). ``default_collate`` batches those into one
:class:`ProxyBatch`, whose pixel bytes sit in a single shared-memory tensor: one file
descriptor per batch, no pickling of image data. The batch then travels through the
DataLoader's own result queue, so ordering, timeouts and worker errors are the DataLoader's.

Samples DALI should not see (PNG, CMYK, unreadable headers...) take the original transform
on the CPU right here; they travel as finished tensors and are merged back in place.
"""
from __future__ import annotations

import io
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from .planning import Plan

DALI_DECODABLE = {("JPEG", "RGB"), ("JPEG", "L")}  # decoded by DALI exactly as PIL's .convert("RGB")


def has_end_marker(data: bytes) -> bool:
    """A complete JPEG ends with EOI (FF D9), maybe followed by padding. Byte stuffing keeps
    FF D9 out of the entropy-coded data, so its absence near the end means truncation."""
    return data.rfind(b"\xff\xd9", max(0, len(data) - 4096)) != -1


_SOF_BASELINE_PROGRESSIVE = (0xC0, 0xC1, 0xC2)  # 8-bit Huffman frames, which PIL opens as "L"/"RGB"
_STANDALONE = set(range(0xD0, 0xD8)) | {0x01}     # markers without a length field


def plain_jpeg_header(data: bytes) -> Optional[Tuple[str, int, int]]:
    """(mode, width, height) of an ordinary JPEG, read from its markers in a few microseconds,
    or None for anything else (then PIL's own header parse decides, as before). Ordinary:
    SOI, well-formed segments, an 8-bit baseline/extended/progressive frame with 1 or 3
    components and no Adobe marker (its colour transform is left to PIL), before the first
    scan. PIL opens every such file as "L" or "RGB" with these dimensions."""
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
            return frame
        pos += 2 + length
    return None


class EncodedImage:
    """A file's bytes, standing in for the PIL image torchvision's loader would return."""
    __slots__ = ("path", "data")

    def __init__(self, path: str, data: bytes):
        self.path = path
        self.data = data


class EncodedFileLoader:
    """Replaces ImageFolder's PIL loader in workers: read the file, leave decoding to DALI."""

    def __call__(self, path: str) -> EncodedImage:
        with open(path, "rb") as f:
            return EncodedImage(path, f.read())


class ProxySample:
    """One sample's input to the DALI pipeline, or its finished CPU result (``done``)."""
    __slots__ = ("plan_id", "payload", "params", "path", "done")

    def __init__(self, plan_id: int, payload: Optional[np.ndarray] = None,
                 params: Optional[List[float]] = None, path: Optional[str] = None,
                 done: Optional[torch.Tensor] = None):
        self.plan_id = plan_id
        self.payload = payload
        self.params = params
        self.path = path
        self.done = done

    def __repr__(self) -> str:
        return f"ProxySample(plan={self.plan_id}, path={self.path!r}, done={self.done is not None})"


class ProxyNode:
    """The transform the worker calls in place of the dataset's recognised chain."""

    def __init__(self, plan_id: int, plan: Plan, original: Any, samples: Optional[list] = None):
        from .translate import flatten
        self.plan_id = plan_id
        self.plan = plan
        self.original = original
        self.samples = samples  # the dataset's (path, label) list, to name an index in errors
        flat = flatten(original) if plan.worker_prefix else []
        self.prefix = flat[:plan.worker_prefix]  # partial offload: these run here
        self.rest = flat[plan.worker_prefix:]

    def __call__(self, img: Any) -> ProxySample:
        from PIL import Image
        if isinstance(img, EncodedImage):
            return self._encoded(img)
        for t in self.prefix:
            img = t(img)
        if (isinstance(img, Image.Image) and self.plan.input_kind == "raw" and img.mode == "RGB"):
            pixels = np.asarray(img)
            height, width = pixels.shape[:2]
            return ProxySample(self.plan_id, pixels, self.plan.draw(height, width))
        return self._on_cpu(img)

    def _encoded(self, enc: EncodedImage) -> ProxySample:
        from PIL import Image
        fast = plain_jpeg_header(enc.data)
        if fast is not None:
            fmt, (mode, width, height) = "JPEG", fast
        else:
            try:
                with Image.open(io.BytesIO(enc.data)) as header:  # parses the header, decodes nothing
                    fmt, mode, (width, height) = header.format, header.mode, header.size
            except Exception:
                return self._on_cpu(self._pil_load(enc.path))  # raises what torchvision raises
        if (fmt, mode) in DALI_DECODABLE and width > 0 and height > 0 and has_end_marker(enc.data):
            payload = np.frombuffer(enc.data, dtype=np.uint8)
            return ProxySample(self.plan_id, payload, self.plan.draw(height, width), enc.path)
        return self._on_cpu(self._pil_load(enc.path), enc.path)  # PIL's pixels, or PIL's exception

    def _pil_load(self, path: str) -> Any:
        """torchvision's pil_loader; its exception keeps its type and gains the index and file."""
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

    def _on_cpu(self, img: Any, path: Optional[str] = None) -> ProxySample:
        """The rest of the original chain (all of it, or what follows a worker prefix)."""
        if self.prefix:
            out = img
            for t in self.rest:
                out = t(out)
        else:
            out = self.original(img)
        if isinstance(out, np.ndarray):  # timm's ToNumpy: default_collate would make it this tensor
            out = torch.from_numpy(out)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"dali_autoproxy: the original transform returned {type(out).__name__}, "
                            "expected a tensor")
        return ProxySample(self.plan_id, path=path, done=out.as_subclass(torch.Tensor))


class ProxyGroup:
    """The samples of one batch that share a plan (and so a DALI pipeline)."""

    def __init__(self, plan_id: int, indices: List[int], payload: torch.Tensor,
                 offsets: np.ndarray, shapes: Optional[np.ndarray], params: np.ndarray,
                 paths: List[Optional[str]]):
        self.plan_id = plan_id
        self.indices = indices
        self.payload = payload      # uint8, all samples' bytes back to back (shared memory)
        self.offsets = offsets      # int64 [n + 1]
        self.shapes = shapes        # int64 [n, 3] for raw pixels, None for encoded files
        self.params = params        # float64 [n, n_params] (whole numbers are exact)
        self.paths = paths

    def payload_views(self) -> List[np.ndarray]:
        flat = self.payload.numpy()
        views = [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(len(self.indices))]
        if self.shapes is not None:
            views = [v.reshape(tuple(s)) for v, s in zip(views, self.shapes)]
        return views


class ProxyBatch:
    """What the training loop would see as an image batch, before DALI has run."""

    def __init__(self, size: int, groups: List[ProxyGroup], done_indices: List[int],
                 done: List[torch.Tensor]):
        self.size = size
        self.groups = groups
        self.done_indices = done_indices
        self.done = done  # CPU-path results, one tensor each, or one stacked tensor

    def done_tensors(self) -> List[torch.Tensor]:
        if len(self.done) == 1 and len(self.done_indices) > 1:
            return list(self.done[0].unbind(0))
        return self.done

    def __repr__(self) -> str:
        return (f"ProxyBatch(size={self.size}, dali={[len(g.indices) for g in self.groups]}, "
                f"cpu={len(self.done_indices)})")


def _uint8_buffer(nbytes: int) -> torch.Tensor:
    """In a worker, allocate straight in shared memory, so sending it copies nothing."""
    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,))
    return torch.empty(nbytes, dtype=torch.uint8)


def _pack(plan_id: int, indices: List[int], samples: List[ProxySample]) -> ProxyGroup:
    payloads = [s.payload for s in samples]
    sizes = np.fromiter((p.nbytes for p in payloads), dtype=np.int64, count=len(payloads))
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    buf = _uint8_buffer(int(offsets[-1]))
    flat = buf.numpy()
    for p, start, end in zip(payloads, offsets[:-1], offsets[1:]):
        flat[start:end] = p.reshape(-1)
    shapes = None
    if payloads and payloads[0].ndim == 3:
        shapes = np.array([p.shape for p in payloads], dtype=np.int64)
    params = np.array([s.params for s in samples], dtype=np.float64).reshape(len(samples), -1)
    return ProxyGroup(plan_id, indices, buf, offsets, shapes, params, [s.path for s in samples])


def collate_proxy_samples(batch: List[ProxySample], *, collate_fn_map: Optional[Dict] = None) -> ProxyBatch:
    """default_collate's handler for ProxySample (registered below, in every process)."""
    by_plan: Dict[int, List[int]] = {}
    done_indices: List[int] = []
    for i, s in enumerate(batch):
        if not isinstance(s, ProxySample):
            raise TypeError(f"dali_autoproxy: cannot batch a proxied sample with {type(s).__name__}")
        if s.done is not None:
            done_indices.append(i)
        else:
            by_plan.setdefault(s.plan_id, []).append(i)
    groups = [_pack(pid, idx, [batch[i] for i in idx]) for pid, idx in by_plan.items()]
    done = [batch[i].done for i in done_indices]
    if len(done) > 1 and all(d.shape == done[0].shape for d in done):
        done = [torch.stack(done)]  # one tensor, one file descriptor
    return ProxyBatch(len(batch), groups, done_indices, done)


default_collate_fn_map[ProxySample] = collate_proxy_samples
