"""Measurement inside the patched DataLoader, for `dali-autoproxy ab`.

Both arms of an A/B run are patched: arm A only measures, arm B proxies and measures. Per
loader: when each batch arrived, how long the training loop waited for it, and how many
samples it held. At the end (or at the --batches/--seconds limit, which stops the script
with StopAB) the figures go to a JSON file.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any, Dict, List, Optional

import wrapt

from dali_autoproxy.tree import batch_length


class StopAB(BaseException):
    """Raised from the loader once the arm has done enough work; a BaseException so that a
    script's ``except Exception`` does not swallow it."""


def _proc_children() -> List[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def tree_cpu_seconds() -> float:
    """CPU time of this process, its reaped children and its live children (workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _proc_children():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _peak_rss_mb() -> Dict[str, float]:
    main = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    for pid in _proc_children():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        worker = max(worker, int(line.split()[1]) / 1024)
        except OSError:
            pass
    return {"main": round(main, 1), "largest_worker": round(worker, 1)}


class LoaderStats:
    """Per loader: one segment per iterator (epoch), each batch's arrival, wait and size."""

    def __init__(self, record: Dict[str, Any]):
        self.record = record
        self.segments: List[Dict[str, Any]] = []

    def new_segment(self) -> None:
        self.segments.append({"start": time.perf_counter(), "arrivals": [], "waits": [], "sizes": []})

    def add(self, arrival: float, wait: float, size: int) -> None:
        seg = self.segments[-1]
        seg["arrivals"].append(arrival)
        seg["waits"].append(wait)
        seg["sizes"].append(size)

    def summary(self, warmup: int) -> Dict[str, Any]:
        """Rates over the loader's own epochs: the first ``warmup`` batches of its first epoch
        are not counted; later epochs count from the iterator's creation (worker start-up is
        a cost the training loop pays)."""
        out: Dict[str, Any] = {"loader": self.record.get("loader"), "dataset": self.record.get("dataset"),
                               "proxied": self.record.get("proxied"), "reason": self.record.get("reason"),
                               "device": self.record.get("device"),
                               "batches": sum(len(g["sizes"]) for g in self.segments), "warmup_batches": warmup}
        samples, seconds, waits, timeline, counted = 0, 0.0, [], [], 0
        origin = None
        for k, seg in enumerate(self.segments):
            skip = warmup if k == 0 else 0
            if len(seg["arrivals"]) <= skip:
                continue
            t0 = seg["arrivals"][skip - 1] if skip else seg["start"]
            origin = t0 if origin is None else origin
            samples += sum(seg["sizes"][skip:])
            counted += len(seg["sizes"][skip:])
            seconds += seg["arrivals"][-1] - t0
            waits += seg["waits"][skip:]
            timeline += [[round(t - origin, 4), n] for t, n in zip(seg["arrivals"][skip:], seg["sizes"][skip:])]
        if samples and seconds > 0:
            waits.sort()
            out.update(samples=samples, counted_batches=counted, seconds=round(seconds, 4),
                       samples_per_s=round(samples / seconds, 1),
                       latency_p50_ms=round(1000 * waits[len(waits) // 2], 2),
                       latency_p99_ms=round(1000 * waits[min(len(waits) - 1, int(0.99 * len(waits)))], 2),
                       waited_s=round(sum(waits), 3), waited_fraction=round(min(1.0, sum(waits) / seconds), 3),
                       timeline=timeline)
        return out


class MeasuredIterator(wrapt.ObjectProxy):
    """Times each next() of a DataLoader iterator (plain or proxied)."""

    def __init__(self, inner: Any, stats: LoaderStats, recorder: "Recorder"):
        super().__init__(inner)
        self._self_stats = stats
        self._self_recorder = recorder
        stats.new_segment()

    def _reset(self, *args: Any, **kwargs: Any) -> Any:
        """persistent_workers: a new epoch on the same iterator, a new segment."""
        self._self_stats.new_segment()
        return self.__wrapped__._reset(*args, **kwargs)

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        batch = self.__wrapped__.__next__()
        t1 = time.perf_counter()
        self._self_stats.add(t1, t1 - t0, batch_length(batch))
        self._self_recorder.tick()
        return batch


class Recorder:
    """One per A/B arm process: collects LoaderStats, shows progress, enforces the limits."""

    def __init__(self, arm: str, out: str, batches: Optional[int], seconds: Optional[float], warmup: int):
        self.arm, self.out, self.batches, self.seconds, self.warmup = arm, out, batches, seconds, warmup
        self.loaders: List[LoaderStats] = []
        self.total = 0
        self.start: Optional[float] = None
        self.cpu0 = tree_cpu_seconds()
        self.gpu_peak_mb: Optional[float] = None
        self._last_progress = 0.0
        self.tty = os.environ.get("DALI_AUTOPROXY_AB_TTY") == "1"

    def wrap(self, iterator: Any, record: Dict[str, Any]) -> MeasuredIterator:
        stats = next((s for s in self.loaders if s.record is record), None)
        if stats is None:
            stats = LoaderStats(record)
            self.loaders.append(stats)
        return MeasuredIterator(iterator, stats, self)

    def tick(self) -> None:
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        self.total += 1
        if now - self._last_progress > 1.0:
            self._last_progress = now
            self._sample_gpu()
            self._progress(now)
        done_batches = self.batches is not None and self.total >= self.batches
        done_time = self.seconds is not None and now - self.start >= self.seconds
        if done_batches or done_time:
            raise StopAB()

    def _sample_gpu(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            used = (total - free) / 2**20
            self.gpu_peak_mb = max(self.gpu_peak_mb or 0.0, round(used, 1))

    def _progress(self, now: float) -> None:
        samples = sum(sum(g["sizes"]) for s in self.loaders for g in s.segments)
        elapsed = now - (self.start or now)
        rate = f", {samples / elapsed:,.0f}/s" if elapsed > 0.5 else ""
        goal = ""
        if self.batches:
            frac = min(1.0, self.total / self.batches)
            goal = f" [{'#' * int(20 * frac):<20}] {self.total}/{self.batches} batches"
        elif self.seconds:
            frac = min(1.0, (now - (self.start or now)) / self.seconds)
            goal = f" [{'#' * int(20 * frac):<20}] {now - (self.start or now):.0f}/{self.seconds:.0f} s"
        line = f"[dali_autoproxy ab] arm {self.arm}:{goal} {samples} samples{rate}"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def dump(self, status: str, error: Optional[str] = None) -> None:
        self._sample_gpu()
        if self.tty:
            sys.stderr.write("\n")
        samples = sum(sum(g["sizes"]) for s in self.loaders for g in s.segments)
        data = {"arm": self.arm, "status": status, "error": error, "warmup_batches": self.warmup,
                "loaders": [s.summary(self.warmup) for s in self.loaders],
                "cpu_s": round(tree_cpu_seconds() - self.cpu0, 3), "samples": samples,
                "peak_rss_mb": _peak_rss_mb(), "gpu_peak_mb": self.gpu_peak_mb}
        data["cpu_s_per_1k_samples"] = round(1000 * data["cpu_s"] / samples, 3) if samples else None
        with open(self.out, "w") as f:
            json.dump(data, f)
