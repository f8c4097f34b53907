"""Pillow's resampling tables kept on the device the exact resize runs on: the one store that its
Triton kernel and its torch ops (``resample``) read.

A batch's tables are looked up by key (input size, box, output size, filter) and only their
offsets travel: one small copy per batch, for both passes. Keys not kept yet are computed together: on a CUDA
device by float64 torch ops (precompute_coeffs and normalize_coeffs_8bpc in the C's operation
order, every product and sum its own op, as exact as on the host) and scattered into the
buffers there, so an epoch of images of many sizes costs the host a few dozen kernel launches
per batch, not a table per image; LANCZOS and HAMMING (the C library's ``sin``/``cos``) and
NEAREST (a sequential running sum) are computed on the host (``pillow_weights``) and copied.
"""
from __future__ import annotations

import threading
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

import numpy as np
import torch

from dali_autoproxy.backends.torch_stage import pillow_weights as pw
from dali_autoproxy.backends.torch_stage.registry import upload

Key = pw.Key
_ON_DEVICE = (pw.BILINEAR, pw.BICUBIC, pw.BOX)


class KeptTables:
    """The tables of one device in two flat int32 buffers (plus one slot past the end that
    unused entries are scattered to). Past ``LIMIT`` weights the tables start over in new buffers
    (a stream of random boxes cannot grow them without bound). Several loaders' pipeline threads
    share it: adding is locked, an adder's stream waits for every earlier adder's writes (so a grown
    copy holds them, and each ``_written`` covers all before it), a reader's stream waits for the
    copies that wrote its tables, and a reader takes its offsets and the buffers they index
    together (``Located``): an entry once written is never written again, a buffer grown or
    started over is a new one, and the reader keeps the old one for its launches
    (``Located.hold``: not reused before its stream is done)."""

    LIMIT = 1 << 26  # int32 weights (256 MB)
    SIBLINGS = 256  # a whole image's tables come with those of every size up to a multiple of this ...
    SIBLINGS_AFTER = 8  # ... where a batch misses this many at one output size and filter
    COMPUTED_ON = ("cuda",)  # device types whose new tables are computed there (tests add "cpu")
    ON_HOST_UP_TO = 32  # new keys of one filter computed by the host's ops, up to this many

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.first = torch.zeros(1 << 14, dtype=torch.int32, device=device)
        self.weights = torch.zeros(1 << 18, dtype=torch.int32, device=device)
        self.where: Dict[Key, Tuple[int, int, int, int]] = {}  # first offset, weights offset, taps, output size
        self.n_first = self.n_weights = 0
        self._codes = np.zeros(0, dtype=np.int64)  # sorted codes of the whole-image keys kept ...
        self._code_where = np.zeros((4, 0), dtype=np.int64)  # ... and their ``where``, column by column
        self._new_codes: List[Tuple[int, Tuple[int, int, int, int]]] = []  # added since the last sort
        self._families: Set[Tuple[int, int]] = set()  # (output size, filter) whose siblings are kept
        self.lookups_computing = 0  # lookups that computed new tables (benchmarks report it)
        self._lock = threading.Lock()
        self._written = torch.cuda.Event() if device.type == "cuda" else None

    def locate(self, keys: List[Key]) -> np.ndarray:
        """int64 [4, B]: each key's first-pixel offset, weights offset, taps and output size; the
        current stream made to wait for the copies that wrote them (from any thread)."""
        return self.located(keys).where

    def located(self, keys: List[Key]) -> "Located":
        """``locate``'s offsets and the buffers they index, taken together."""
        with self._lock:
            missing = [k for k in dict.fromkeys(keys) if k not in self.where]
            if missing:
                self.lookups_computing += 1
                if self._written is not None:  # a grown copy reads what other threads' streams wrote
                    torch.cuda.current_stream(self.device).wait_event(self._written)
                self._add(self._with_siblings(missing))
                if self._written is not None:
                    self._written.record(torch.cuda.current_stream(self.device))
            where = np.array([self.where[k] for k in keys], dtype=np.int64).T.copy()
            return self._read(where)

    def locate_rows(self, keys: np.ndarray) -> "Located":
        """``located`` of keys given as rows (float64 [N, 5]: input size, box start, box end,
        output size, filter): whole images' (box 0..n) by ``locate_whole``."""
        n, b0, b1, out, kind = keys.T
        if (b0 == 0).all() and (b1 == n).all():
            return self.locate_whole(n.astype(np.int64), out.astype(np.int64), kind.astype(np.int64))
        ints = keys.astype(np.int64)
        return self.located(list(zip(ints[:, 0].tolist(), b0.tolist(), b1.tolist(), ints[:, 3].tolist(),
                                     ints[:, 4].tolist())))

    def locate_whole(self, n: np.ndarray, out: np.ndarray, kind: np.ndarray) -> "Located":
        """``located`` of whole images' keys (box 0..n) given as arrays (input sizes, output
        sizes and filters, broadcast together: any shape S), offsets int64 [4, *S]. Where every
        one is kept already, a sorted search of their codes, with no Python per key: a batch's
        lookup costs the same few numpy calls for 2 keys or 512."""
        if n.max() < _CODE_LIMIT and out.max() < _CODE_LIMIT:
            codes = _code(n, out, kind)
            with self._lock:
                self._sort_codes()
                if len(self._codes):
                    at = np.minimum(np.searchsorted(self._codes, codes), len(self._codes) - 1)
                    if (self._codes[at] == codes).all():
                        return self._read(self._code_where[:, at])
        n, out, kind = np.broadcast_arrays(n, out, kind)
        columns = (a.ravel().tolist() for a in (n, out, kind))
        found = self.located([(m, 0.0, float(m), o, k) for m, o, k in zip(*columns)])
        return Located(found.where.reshape(4, *n.shape), found.first, found.weights)

    def _read(self, where: np.ndarray) -> "Located":
        """(Under the lock.) The offsets with today's buffers; the current stream made to wait for
        the copies that wrote them."""
        if self._written is not None:
            torch.cuda.current_stream(self.device).wait_event(self._written)
        return Located(where, self.first, self.weights)

    def _sort_codes(self) -> None:
        if not self._new_codes:
            return
        codes = np.concatenate([self._codes, np.array([c for c, _ in self._new_codes], dtype=np.int64)])
        where = np.concatenate([self._code_where, np.array([w for _, w in self._new_codes], dtype=np.int64).T], 1)
        order = np.argsort(codes, kind="stable")
        self._codes, self._code_where, self._new_codes = codes[order], where[:, order], []

    def _with_siblings(self, missing: List[Key]) -> List[Key]:
        """The missing keys, and where ``SIBLINGS_AFTER`` or more of them are whole images (box
        0..n) computed on the device at one output size and filter, their siblings: every
        input size up to the next multiple of ``SIBLINGS``. DALI decodes a RandomResizedCrop's
        crop, so the stage resizes whole images of every size to one output size; computing all
        of them at once costs the same few launches as computing one, where each batch with a
        size not seen yet would pay them again (most batches of an epoch). A family, once made,
        grows the same way on any miss past it (a crop larger than the first batch's). An
        output size that a batch asks for only a few times (the long side after Resize(256))
        brings none: a family per image size would fill the buffers with tables nobody asks for."""
        if self.device.type not in self.COMPUTED_ON:
            return missing
        families: Dict[Tuple[int, int], List[int]] = {}
        for n, b0, b1, out, kind in missing:
            if kind in _ON_DEVICE and b0 == 0.0 and b1 == float(n):
                families.setdefault((out, kind), []).append(n)
        extra: List[Key] = []
        for (out, kind), sizes in families.items():
            if len(sizes) < self.SIBLINGS_AFTER and (out, kind) not in self._families:
                continue
            top = -(-max(sizes) // self.SIBLINGS) * self.SIBLINGS
            family = [k for k in ((m, 0.0, float(m), out, kind) for m in range(1, top + 1)) if k not in self.where]
            if int((pw.taps_of(family) * out).sum()) <= self.LIMIT // 8:
                extra += family
                self._families.add((out, kind))
        return list(dict.fromkeys(missing + extra))

    def _add(self, keys: List[Key]) -> None:
        taps = pw.taps_of(keys)
        outs = np.array([k[3] for k in keys], dtype=np.int64)
        n_first, n_weights = int(outs.sum()), int((outs * taps).sum())
        if self.n_weights + n_weights > self.LIMIT:  # new buffers: launches queued may still read the old ones
            self.first, self.weights = torch.zeros_like(self.first), torch.zeros_like(self.weights)
            self.where, self.n_first, self.n_weights = {}, 0, 0
            self._codes, self._code_where, self._new_codes = self._codes[:0], self._code_where[:, :0], []
            self._families = set()
        self.first = self._room(self.first, self.n_first + n_first + 1)
        self.weights = self._room(self.weights, self.n_weights + n_weights + 1)
        first_at = self.n_first + np.concatenate([[0], np.cumsum(outs)[:-1]])
        weights_at = self.n_weights + np.concatenate([[0], np.cumsum(outs * taps)[:-1]])
        on_device = self.device.type in self.COMPUTED_ON
        for kind in sorted({k[4] for k in keys}):
            rows = [i for i, k in enumerate(keys) if k[4] == kind]
            group = [keys[i] for i in rows]
            if on_device and kind in _ON_DEVICE:
                self._scatter(group, first_at[rows], weights_at[rows], taps[rows])
                continue
            for (f, w), i in zip(pw.tables(*group), rows):  # the host's tables (read-only), copied
                self.first[first_at[i]:first_at[i] + len(f)] = upload(f.copy(), self.device)
                self.weights[weights_at[i]:weights_at[i] + w.size] = upload(w.ravel().copy(), self.device)
        for i, key in enumerate(keys):
            self.where[key] = (int(first_at[i]), int(weights_at[i]), int(taps[i]), int(outs[i]))
            n, b0, b1, out, kind = key
            if b0 == 0 and b1 == n and n < _CODE_LIMIT and out < _CODE_LIMIT:
                self._new_codes.append((int(_code(n, out, kind)), self.where[key]))
        self.n_first, self.n_weights = self.n_first + n_first, self.n_weights + n_weights

    def _scatter(self, keys: List[Key], first_at: np.ndarray, weights_at: np.ndarray, taps: np.ndarray) -> None:
        """``pillow_weights.coefficients`` of the keys written at their offsets. A few keys (a
        batch's new sizes) are computed by the host's torch ops and their valid entries copied:
        each op there costs a few microseconds of the pipeline thread, where a launch costs
        several; a family of hundreds is computed on the device (one launch per op, whatever
        its size), entries past a key's output size or taps sent to the buffers' last slot."""
        host = len(keys) <= self.ON_HOST_UP_TO
        on = torch.device("cpu") if host else self.device
        first, weights = pw.coefficients(keys, on)
        n, out_max, taps_max = weights.shape
        at = upload(np.stack([first_at, weights_at, taps, [k[3] for k in keys]], 1), on)  # on the host: as it is
        f_at, w_at, tp, out = (v.view(-1, 1) for v in at.unbind(1))
        o = torch.arange(out_max, device=on).view(1, -1)
        k = torch.arange(taps_max, device=on).view(1, 1, -1)
        rows = o < out
        valid = rows.unsqueeze(2) & (k < tp.unsqueeze(2))
        if host:
            spots = [(f_at + o)[rows], (w_at.unsqueeze(2) + o.unsqueeze(2) * tp.unsqueeze(2) + k)[valid]]
            values = [first[rows], weights[valid]]
            for buffer, spot, value in zip((self.first, self.weights), spots, values):
                buffer.index_put_((upload(spot.numpy(), self.device),),
                                  upload(value.to(torch.int32).numpy(), self.device))
            return
        self.first.index_put_((torch.where(rows, f_at + o, len(self.first) - 1).view(-1),),
                              first.to(torch.int32).view(-1))
        spot = torch.where(valid, w_at.unsqueeze(2) + o.unsqueeze(2) * tp.unsqueeze(2) + k, len(self.weights) - 1)
        self.weights.index_put_((spot.view(-1),), weights.to(torch.int32).view(-1))

    @staticmethod
    def _room(buffer: torch.Tensor, needed: int) -> torch.Tensor:
        """``buffer``, or a larger copy (the old one stays with the readers that hold it)."""
        if needed <= len(buffer):
            return buffer
        grown = torch.zeros(max(2 * len(buffer), needed), dtype=buffer.dtype, device=buffer.device)
        grown[:len(buffer) - 1] = buffer[:len(buffer) - 1]
        return grown


class Located(NamedTuple):
    """Tables' offsets (int64 [4, ...]: first-pixel offset, weights offset, taps, output size) and
    the two buffers they index, as one reader took them."""
    where: np.ndarray
    first: torch.Tensor
    weights: torch.Tensor

    def hold(self, stream: Optional[torch.cuda.Stream] = None) -> None:
        """The buffers are not reused before ``stream`` (the current one) has run what is queued
        on it now: the launches that read them, wherever another thread has grown them since."""
        if self.first.is_cuda:
            stream = stream or torch.cuda.current_stream(self.first.device)
            self.first.record_stream(stream)
            self.weights.record_stream(stream)


_CODE_LIMIT = 1 << 20  # sizes below this have a code (input size, output size, filter) as one int64


def _code(n, out, kind):
    """A whole image's key as one integer (numpy arrays or Python ints)."""
    return n + out * _CODE_LIMIT + kind * _CODE_LIMIT * _CODE_LIMIT


_KEPT: Dict[str, KeptTables] = {}
_KEPT_LOCK = threading.Lock()


def kept_tables(device: torch.device) -> KeptTables:
    """The one store of ``device`` in this process (pipeline threads of several loaders share it)."""
    key = str(device)
    with _KEPT_LOCK:
        if key not in _KEPT:
            _KEPT[key] = KeptTables(device)
        return _KEPT[key]
