"""Soak test: many epochs of a proxied loader; host RSS, open file descriptors, processes and
GPU memory must stay flat. Prints one JSON line per epoch and a summary line; exits 1 when a
resource grows past its bound after the warm-up epochs.

    python benchmarks/soak.py --minutes 3                 # on the GPU machine
    python benchmarks/soak.py --epochs 12 --warmup-epochs 3 --images 64 --workers 2 --device cpu
                                                          # the short version CI runs (with MALLOC_ARENA_MAX=2)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

import torch
import torchvision
import torchvision.transforms as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import make_corpus  # noqa: E402

import dali_autoproxy  # noqa: E402


def rss_mb() -> float:
    """Resident memory after handing freed heap pages back (glibc's malloc_trim): what stays is
    what is held, not what the allocator keeps cached, which swings by tens of MB per epoch."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> int:
    import multiprocessing
    return len(multiprocessing.active_children())


def gpu_used_mb() -> float:
    if not torch.cuda.is_available():
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup-epochs", type=int, default=2)
    ap.add_argument("--max-rss-growth-mb", type=float, default=100.0)
    ap.add_argument("--max-gpu-growth-mb", type=float, default=256.0)
    a = ap.parse_args(argv)
    if a.minutes is None and a.epochs == 1000:
        a.epochs = 6
    tmp = None
    if a.data is None:
        tmp = tempfile.TemporaryDirectory()
        a.data = os.path.join(tmp.name, "corpus")
    info = make_corpus(a.data, a.images)
    dali_autoproxy.enable(device=a.device, log_level="WARNING")
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(a.data, transform=tf)
    rows, start, epoch = [], time.time(), 0
    while epoch < a.epochs and (a.minutes is None or time.time() - start < 60 * a.minutes):
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                                             persistent_workers=epoch % 2 == 1)
        n = 0
        for i, (x, y) in enumerate(loader):
            n += len(y)
            if epoch % 3 == 2 and i == 2:
                break  # also exercise the break-out path
        del loader
        gc.collect()
        from dali_autoproxy.backends.dali.runner import _live_pipelines
        rows.append({"epoch": epoch, "samples": n, "rss_mb": round(rss_mb(), 1), "fds": open_fds(),
                     "live_pipelines": len(_live_pipelines),
                     "children": children(), "gpu_used_mb": round(gpu_used_mb(), 1),
                     "seconds": round(time.time() - start, 1)})
        print(json.dumps(rows[-1]), flush=True)
        epoch += 1
    from dali_autoproxy.backends.dali.runner import _live_pipelines
    from dali_autoproxy.main.state import KEPT_AFTER_LOADER
    dali_autoproxy.disable()  # closes the pipelines kept for a next loader of the same plan
    gc.collect()
    steady = rows[a.warmup_epochs:] if len(rows) > a.warmup_epochs + 1 else rows
    # a leak grows every epoch; an allocator's capacity step (DALI's buffers, a heap that cannot
    # shrink past a live block) lands in one epoch and can swing back: thirds of three epochs or
    # more, compared by their medians, see the first and not the second
    third = max(1, len(steady) // 3)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    summary = {"epochs": len(rows), "images": info["images"], "device": a.device,
               # allocator caches make RSS swing by tens of MB; a leak shows as a trend
               "rss_trend_mb": round(median([r["rss_mb"] for r in steady[-third:]])
                                     - median([r["rss_mb"] for r in steady[:third]]), 1),
               "fd_growth": max(r["fds"] for r in steady) - steady[0]["fds"],
               "gpu_growth_mb": round(max(r["gpu_used_mb"] for r in steady) - steady[0]["gpu_used_mb"], 1),
               "live_pipelines_after_del": max(r["live_pipelines"] for r in rows),
               "live_pipelines_after_disable": len(_live_pipelines),
               "children_left": rows[-1]["children"]}
    ok = (summary["rss_trend_mb"] <= a.max_rss_growth_mb and summary["fd_growth"] <= 0
          and summary["gpu_growth_mb"] <= a.max_gpu_growth_mb and summary["children_left"] == 0
          and summary["live_pipelines_after_del"] <= KEPT_AFTER_LOADER
          and summary["live_pipelines_after_disable"] == 0)
    summary["ok"] = ok
    print(json.dumps({"summary": summary}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
