"""Images/s of one unchanged ImageFolder loader, plain and with autoproxy, beside the
hand-written references, measured side by side in one run.

Pipelines: train (RandomResizedCrop, flip, ToTensor, Normalize), eval (Resize, CenterCrop, ...),
heavy (train + ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.2), GaussianBlur(9), RandomErasing),
trivialaugment (train + TrivialAugmentWide), jitter_v2 (the v2 recipe with ToImage first:
RandomResizedCrop, flip, ColorJitter(0.4, 0.4, 0.4, 0.1) on uint8 tensors, ToDtype, Normalize),
decode (CenterCrop + PILToTensor: decoding is nearly all the work).

Modes (each on the same corpus, batch size, workers and transforms):
  torchvision      plain DataLoader, PIL decode + torchvision transforms in the workers
  autoproxy        the same loader object code after dali_autoproxy.enable() (its defaults: the resize
                   with Pillow's arithmetic, border included)
  autoproxy_fast   the same with enable(fidelity="fast"): DALI's approximate colour operators
  autoproxy_dali_resize  the same with enable(resize="dali"): DALI's resize, within its bound
  autoproxy_loop_stream  autoproxy with the torch stage on the loop's stream after a host wait
                   for DALI's outputs instead of on the pipeline's own stream (the two designs compared)
  dali_proxy       a hand-written DALI proxy pipeline (nvidia.dali.plugin.pytorch.experimental.proxy),
                   workers read file bytes, DALI decodes (ROI decode for train) on the device; DALI's
                   own operators (color_twist, auto_aug) for the heavy and trivialaugment pipelines
  dali_native      fn.readers.file + the same DALI ops, no DataLoader (upper bound)
  decode_ceiling   the same DALI ops on JPEG bytes already in memory, each hw_decoder_load share, the best
                   (the GPU's own limit for the corpus)
  decode_jpeg_gpu  what an expert writes by hand without DALI: workers read bytes, the main process
                   decodes the batch with torchvision.io.decode_jpeg(device="cuda") and runs the v2
                   transforms on the GPU tensors

Every batch is moved to the GPU (when there is one) as a training loop would; the first and
the last --warmup batches of each run are not timed (steady state, see consume). By default that
is the deepest queue of the modes (autoproxy's look-ahead, the hand-written proxy's 2 batches per
worker), at most a third of the epoch: a loader that queues k batches ahead has done part of
their work before a shorter warm-up ends, and drains its queue after its last batch is made. CPU time is the process
tree's (main, DALI
threads and the joined workers) per 1,000 images.

``--samples N`` makes each epoch N samples drawn from the corpus by a sampler (shuffled for train, in
order and cycling for eval), so the timed window holds hundreds of batches instead of the corpus's
few dozen: the machines' noise averages out within a run.

    python benchmarks/loader_benchmark.py --images 8192 --workers 4 8 15 --out benchmarks/results/h200.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import sys
import threading
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import make_corpus  # noqa: E402
from results_io import measured_commit, write_results  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


PIPELINES = ("train", "eval", "heavy", "trivialaugment", "jitter_v2", "decode")


def tv_transform(kind: str, m=None):
    """The pipeline's torchvision chain (``m``: torchvision.transforms, or v2 for tensors)."""
    import torch
    import torchvision.transforms as T
    m = m or T
    if kind == "jitter_v2":  # tensors from the start, whatever ``m``
        import torchvision.transforms.v2 as v2
        return v2.Compose(([] if m is v2 else [v2.ToImage()]) + [
            v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4, 0.1),
            v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    tensor = m is not T
    to_float = [m.ToDtype(torch.float32, scale=True)] if tensor else [T.ToTensor()]
    crop_flip = [m.RandomResizedCrop(224), m.RandomHorizontalFlip()]
    tail = to_float + [m.Normalize(MEAN, STD)]
    chains = {
        "train": crop_flip + tail,
        "eval": [m.Resize(256), m.CenterCrop(224)] + tail,
        "heavy": crop_flip + [m.ColorJitter(0.4, 0.4, 0.4, 0.1), m.RandomGrayscale(0.2),
                              m.GaussianBlur(9, (0.1, 2.0))] + tail + [m.RandomErasing()],
        "trivialaugment": crop_flip + [m.TrivialAugmentWide()] + tail,
        "decode": [m.CenterCrop(224)] + ([] if tensor else [T.PILToTensor()]),
    }
    return m.Compose(chains[kind])


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def auto_warmup(workers: int, n_batches: int, batch_size: int) -> int:
    """Batches to leave untimed at each end of the epoch: as many as the deepest queue ahead of the
    loop (autoproxy's look-ahead + 1 for batches of ``batch_size``, the hand-written proxy's prefetch
    of 2 per worker), at most a third of the epoch, so that something is timed between the two."""
    from dali_autoproxy.config import resolve_options
    from dali_autoproxy.main.runs import lookahead_batches
    depth = max(lookahead_batches(resolve_options().lookahead, batch_size) + 1, 2 * max(1, workers))
    return max(1, min(depth, n_batches // 3))


def consume(batches, device: str, warmup: int, total: int = 0):
    """Iterate like a training loop; return (images timed, seconds timed). Steady state: the clock
    runs from batch ``warmup`` to batch ``total - warmup`` of the ``total`` in the epoch, so every
    queue ahead of the loop is full when it starts and still full when it stops (work queued
    before the start, or drained after the loader stopped producing, is never counted)."""
    stop = total - warmup if total > 2 * warmup else None
    n, t0, stopped = 0, None, False
    for i, (x, y) in enumerate(batches):
        if device == "cuda":
            x = x.cuda(non_blocking=True)
            y = y.cuda(non_blocking=True)
        if i == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for observer in WINDOW_OBSERVERS:
                observer.start()
        if i == stop:
            stopped = True
            for observer in WINDOW_OBSERVERS:  # while the workers live: leaving the loop ends them
                observer.stop()
            break
        if i >= warmup:
            n += x.shape[0]
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - (t0 or time.perf_counter())
    if not stopped:
        for observer in WINDOW_OBSERVERS:
            observer.stop()
    return n, dt


EPOCH_SAMPLES = {"n": 0}  # --samples: every DataLoader mode's epoch draws this many samples (0: the corpus once)


class CyclingSampler(torch.utils.data.Sampler):
    """The dataset's indices in order, repeated to ``n``: eval's long epoch."""

    def __init__(self, size: int, n: int) -> None:
        self.size, self.n = size, n

    def __iter__(self):
        return (i % self.size for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def order(ds, kind: str) -> dict:
    """The DataLoader arguments that set the epoch: shuffled (train) or in order (eval), the corpus
    once, or ``--samples`` draws (a long epoch, so the timed window is long and in steady state)."""
    n = EPOCH_SAMPLES["n"]
    if not n:
        return {"shuffle": kind != "eval"}
    if kind == "eval":
        return {"sampler": CyclingSampler(len(ds), n)}
    return {"sampler": torch.utils.data.RandomSampler(ds, num_samples=n)}


def run_torchvision(root, kind, workers, batch, warmup, dali_device, autoproxy=False, fidelity="exact",
                    resize="pillow"):
    import torchvision

    import dali_autoproxy
    if autoproxy:
        dali_autoproxy.enable(device=dali_device, log_level="WARNING", fidelity=fidelity, resize=resize)
    try:
        ds = torchvision.datasets.ImageFolder(root, transform=tv_transform(kind))
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, **order(ds, kind),
                                             num_workers=workers, pin_memory=torch.cuda.is_available(),
                                             drop_last=False)
        n, dt = consume(loader, "cuda" if torch.cuda.is_available() else "cpu", warmup, len(loader))
        rep = dali_autoproxy.report()[-1] if autoproxy else None
        del loader
        gc.collect()
        if autoproxy and not rep["proxied"]:
            raise RuntimeError(f"autoproxy fell back: {rep['reason']}")
        return n, dt
    finally:
        dali_autoproxy.disable()


WINDOW_OBSERVERS: list = []  # started and stopped with the clock of ``consume`` (start(), stop())


class ProcessCpu:
    """CPU time over the timed window of each thread of this process (Python threads by name,
    native ones, DALI's and CUDA's, by their kernel name) and of each child process (the loader's
    workers), as a share of the window's wall time: a share near 1.0 is a saturated thread, the
    serial bound of a loader whose GPU is not busy. ``workers_busy`` lists the workers alive at
    the end; ``workers_busy_total`` (cores) counts those that ended inside the window too."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.rows = enabled, []

    def __enter__(self):
        if self.enabled:
            WINDOW_OBSERVERS.append(self)
        return self

    def __exit__(self, *exc):
        if self in WINDOW_OBSERVERS:
            WINDOW_OBSERVERS.remove(self)
        return False

    @staticmethod
    def _ticks(stat_path: str) -> tuple:
        with open(stat_path) as f:
            text = f.read()
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        return name, int(rest[11]) + int(rest[12])  # utime + stime (fields 14 and 15)

    def _snapshot(self) -> dict:
        names = {t.native_id: t.name for t in threading.enumerate()}
        names[os.getpid()] = "main thread"
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                comm, ticks = self._ticks(f"/proc/self/task/{tid}/stat")
            except OSError:
                continue
            out[("thread", names.get(int(tid), f"{comm} {tid}"))] = ticks
        parent, ticks = {}, {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[pid], ticks[pid] = fields[1], int(fields[11]) + int(fields[12])
        for pid in ticks:  # descendants: the loader's workers (forked, or made by a forkserver)
            up = parent[pid]
            while up in parent and up != str(os.getpid()):
                up = parent[up]
            if up == str(os.getpid()):
                out[("worker", pid)] = ticks[pid]
        with open("/proc/self/stat") as f:  # the CPU of children that ended and were waited for
            fields = f.read().rsplit(")", 1)[1].split()
        out[("ended", "")] = int(fields[13]) + int(fields[14])  # cutime + cstime
        return out

    def start(self) -> None:
        self._t0, self._before = time.perf_counter(), self._snapshot()

    def stop(self) -> None:
        wall, after = time.perf_counter() - self._t0, self._snapshot()
        hz = os.sysconf("SC_CLK_TCK")
        share = {k: (v - self._before.get(k, 0)) / hz / wall for k, v in after.items()}
        threads = sorted(((k[1], round(v, 2)) for k, v in share.items() if k[0] == "thread"), key=lambda kv: -kv[1])
        workers = sorted(round(v, 2) for k, v in share.items() if k[0] == "worker")
        # a worker that ended inside the window: its ticks before the window are in its old
        # entry, all of them now in "ended"
        all_workers = sum(after.get(k, 0) for k in after if k[0] in ("worker", "ended")) - sum(
            self._before.get(k, 0) for k in self._before if k[0] in ("worker", "ended"))
        self.rows.append({"threads_busy": dict(t for t in threads if t[1] >= 0.02),
                          "threads_busy_total": round(sum(v for _, v in threads), 2),
                          "workers_busy": workers, "workers_busy_total": round(all_workers / hz / wall, 2)})


class CudaTimeline:
    """A CUDA timeline (torch.profiler, CUPTI) of one run's timed window, summarised: how busy the
    GPU was (any stream, and each stream), the longest kernels, and the host calls that waited for
    the device (synchronize, blocking copies), per thread. CUPTI sees every kernel of the process,
    DALI's included. The profiler slows the run: its rate is not a figure to compare."""

    def __init__(self, label: str) -> None:
        self.label, self.summary = label, None

    def __enter__(self):
        WINDOW_OBSERVERS.append(self)
        return self

    def __exit__(self, *exc):
        WINDOW_OBSERVERS.remove(self)
        if getattr(self, "_prof", None) is not None:  # the window never closed (an error)
            self._prof.stop()
        return False

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self._prof.start()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        wall = time.perf_counter() - self._t0
        prof.stop()
        import tempfile
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            trace = json.load(open(f.name))
        self.summary = summarize_timeline(trace.get("traceEvents", []), wall)
        self.summary["label"] = self.label


def summarize_timeline(events, wall_s: float) -> dict:
    """Busy fractions of the device (union of kernel, copy and memset intervals) and of each stream,
    the kernels taking most device time, and the host's waiting calls by thread."""
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    def union_us(intervals):
        total, end = 0.0, -1.0
        for s, d in sorted(intervals):
            if s + d <= end:
                continue
            total += s + d - max(s, end)
            end = s + d
        return total

    if not device:
        return {"wall_s": round(wall_s, 3), "device_events": 0}
    t0 = min(e["ts"] for e in device)
    span = max(e["ts"] + e["dur"] for e in device) - t0
    streams, kernels = {}, {}
    for e in device:
        streams.setdefault(e.get("args", {}).get("stream", "?"), []).append((e["ts"], e["dur"]))
        k = kernels.setdefault(e["name"][:90], [0, 0.0])
        k[0] += 1
        k[1] += e["dur"]
    waits = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and (
                "ynchronize" in e["name"] or e["name"] in ("cudaMemcpy", "cudaMemcpy2D")):
            w = waits.setdefault(f"{e['name']} (thread {e.get('tid')})", [0, 0.0])
            w[0] += 1
            w[1] += e["dur"]
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:12]
    return {"wall_s": round(wall_s, 3), "device_span_s": round(span / 1e6, 3),
            "device_busy": round(union_us([(e["ts"], e["dur"]) for e in device]) / span, 3),
            "stream_busy": {str(s): round(union_us(iv) / span, 3) for s, iv in sorted(streams.items(), key=str)},
            "top_kernels_ms": [{"name": n, "calls": c, "ms": round(t / 1e3, 2)} for n, (c, t) in top],
            "host_waits_ms": {n: {"calls": c, "ms": round(t / 1e3, 2)} for n, (c, t) in
                              sorted(waits.items(), key=lambda kv: -kv[1][1])[:10]}}


def on_loop_stream(run, *args, **kwargs):
    """``run`` with the torch stage on the loop's stream, DALI's outputs waited for on the host."""
    from dali_autoproxy.backends.dali import runner
    runner.STAGE_ON_OWN_STREAM = False
    try:
        return run(*args, **kwargs)
    finally:
        runner.STAGE_ON_OWN_STREAM = True


class ThreadClock:
    """Where the pipeline thread's time goes per batch: wall and CPU (``thread_time``) time in
    feeding DALI (its inputs and the run), in DALI's outputs() and in the torch stage (CPU below
    wall: waiting, for the GPU or the GIL); the main thread's CPU time over the epoch's wall time;
    and, over the timed window, the share of the main thread's wall time spent waiting for the
    workers' next batch (``pull``) and for the pipeline's oldest batch (``collect``): the side it
    waits on most bounds the loader."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.rows = enabled, []
        self.window = None

    def __enter__(self):
        if not self.enabled:
            return self
        from dali_autoproxy.backends.dali import runner
        from dali_autoproxy.backends.torch_stage import TorchStage
        from dali_autoproxy.main.iterator import ProxiedIterator
        self._saved = (runner._outputs, TorchStage.__call__, ProxiedIterator._self_fetch,
                       runner.DaliRunner.collect, runner._feed)
        real_outputs, real_stage, real_fetch, real_collect, real_feed = self._saved
        rows = self.rows

        def timed(fn, kind):
            def wrapper(*args, **kwargs):
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    rows.append((kind, time.perf_counter() - w0, time.thread_time() - c0, w0))
            return wrapper
        runner._outputs = timed(real_outputs, "outputs")
        TorchStage.__call__ = timed(real_stage, "stage")
        ProxiedIterator._self_fetch = timed(real_fetch, "pull")
        runner.DaliRunner.collect = timed(real_collect, "collect")
        runner._feed = timed(real_feed, "feed")
        WINDOW_OBSERVERS.append(self)
        self._computing, self._replays = _lookups_computing(), _graph_replays()
        self._main = time.perf_counter(), time.thread_time()
        return self

    def start(self) -> None:
        self.window = [time.perf_counter(), None]

    def stop(self) -> None:
        if self.window is not None:
            self.window[1] = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        from dali_autoproxy.backends.dali import runner
        from dali_autoproxy.backends.torch_stage import TorchStage
        from dali_autoproxy.main.iterator import ProxiedIterator
        (runner._outputs, TorchStage.__call__, ProxiedIterator._self_fetch, runner.DaliRunner.collect,
         runner._feed) = self._saved
        WINDOW_OBSERVERS.remove(self)
        wall, cpu = time.perf_counter() - self._main[0], time.thread_time() - self._main[1]
        self.main_busy = cpu / max(wall, 1e-9)
        self.computing = _lookups_computing() - self._computing
        self.replays = _graph_replays() - self._replays

    def summary(self) -> dict:
        out = {"main_thread_busy": round(self.main_busy, 3)}
        n_stage = sum(1 for r in self.rows if r[0] == "stage")
        if n_stage:  # the exact resize: batches whose tables were not all kept yet, batches replayed from
            out["stage_batches"], out["stage_batches_computing_tables"] = n_stage, self.computing  # CUDA graphs
            out["stage_batches_replayed"] = self.replays
        for kind in ("feed", "outputs", "stage"):
            rows = [r for r in self.rows if r[0] == kind]
            rows = rows[min(5, len(rows) // 2):]  # the first batches compile and allocate
            if rows:  # medians, and means (a tail of slow batches shows only in these)
                for name, column in (("wall", 1), ("cpu", 2)):
                    values = [r[column] for r in rows]
                    out[f"{kind}_{name}_ms"] = round(1000 * float(np.median(values)), 3)
                    out[f"{kind}_{name}_ms_mean"] = round(1000 * float(np.mean(values)), 3)
        if self.window is not None and self.window[1] is not None:
            t0, t1 = self.window
            for kind in ("pull", "collect"):
                waited = sum(r[1] for r in self.rows if r[0] == kind and t0 <= r[3] < t1)
                out[f"main_waits_{kind}"] = round(waited / max(t1 - t0, 1e-9), 3)
        return out


def _lookups_computing() -> int:
    """How many table lookups of the exact resize computed new tables so far, every device."""
    from dali_autoproxy.backends.torch_stage import kept_tables
    return sum(store.lookups_computing for store in kept_tables._KEPT.values())


def _graph_replays() -> int:
    """How many batches the exact resize launched as a replay of a CUDA graph so far."""
    from dali_autoproxy.backends.torch_stage import fused_resize
    return fused_resize.GRAPHS.replays


def _dali_ops(jpegs, kind, dali_device, hw_decoder_load=None):
    """The hand-written DALI equivalent of each pipeline, as DALI's documentation writes it
    (``hw_decoder_load``: the share of the GPU's hardware decoder, None for DALI's default)."""
    from nvidia.dali import fn, types
    decode_device = "mixed" if dali_device == "gpu" else "cpu"
    load = {"hw_decoder_load": hw_decoder_load} if hw_decoder_load is not None and dali_device == "gpu" else {}
    if kind == "decode":
        images = fn.decoders.image(jpegs, device=decode_device, output_type=types.RGB, **load)
        return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", crop=(224, 224))
    if kind in ("heavy", "trivialaugment", "jitter_v2"):
        images = fn.decoders.image_random_crop(jpegs, device=decode_device, output_type=types.RGB, **load,
                                               random_aspect_ratio=[0.75, 4.0 / 3.0], random_area=[0.08, 1.0])
        images = fn.resize(images, size=[224, 224], interp_type=types.INTERP_LINEAR, antialias=True)
        images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
        erase = None
        if kind == "trivialaugment":
            from nvidia.dali.auto_aug import trivial_augment
            images = trivial_augment.trivial_augment_wide(images)
        elif kind == "jitter_v2":
            images = fn.color_twist(images, brightness=fn.random.uniform(range=[0.6, 1.4]),
                                    contrast=fn.random.uniform(range=[0.6, 1.4]),
                                    saturation=fn.random.uniform(range=[0.6, 1.4]),
                                    hue=fn.random.uniform(range=[-36.0, 36.0]))
        else:
            gray = fn.random.coin_flip(probability=0.2)
            images = fn.color_twist(images, brightness=fn.random.uniform(range=[0.6, 1.4]),
                                    contrast=fn.random.uniform(range=[0.6, 1.4]),
                                    saturation=fn.random.uniform(range=[0.6, 1.4]) * (1 - gray),
                                    hue=fn.random.uniform(range=[-36.0, 36.0]))
            images = fn.gaussian_blur(images, window_size=9, sigma=fn.random.uniform(range=[0.1, 2.0]))
            erase = fn.random.coin_flip(probability=0.5)
        out = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                       mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
        if erase is not None:
            side = fn.random.uniform(range=[0.14, 0.58], shape=2) * erase
            out = fn.erase(out, anchor=fn.random.uniform(range=[0.0, 0.42], shape=2), shape=side,
                           normalized_anchor=True, normalized_shape=True, axis_names="HW", fill_value=0.0)
        return out
    if kind == "train":
        images = fn.decoders.image_random_crop(jpegs, device=decode_device, output_type=types.RGB, **load,
                                               random_aspect_ratio=[0.75, 4.0 / 3.0], random_area=[0.08, 1.0])
        images = fn.resize(images, size=[224, 224], interp_type=types.INTERP_LINEAR, antialias=True)
        mirror = fn.random.coin_flip(probability=0.5)
        crop = {}
    else:
        images = fn.decoders.image(jpegs, device=decode_device, output_type=types.RGB, **load)
        images = fn.resize(images, resize_shorter=256, interp_type=types.INTERP_LINEAR, antialias=True)
        mirror, crop = 0, {"crop": (224, 224)}
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mirror=mirror,
                                    mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD], **crop)


def _read_bytes(path):
    return np.fromfile(path, dtype=np.uint8)


def run_dali_proxy(root, kind, workers, batch, warmup, dali_device, threads, hw_decoder_load=None):
    """The hand-written reference, following DALI's proxy documentation (``hw_decoder_load``: its
    decoder's hardware share, None for DALI's default)."""
    import torchvision
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

    @pipeline_def(enable_conditionals=kind == "trivialaugment")
    def pipe():
        return _dali_ops(fn.external_source(name="images", no_copy=True), kind, dali_device, hw_decoder_load)

    p = pipe(batch_size=batch, num_threads=threads, device_id=0 if dali_device == "gpu" else None,
             prefetch_queue_depth=2 * max(1, workers))
    server = dali_proxy.DALIServer(p)
    server.start_thread()  # as ``with DALIServer(p) as server:`` does on entering
    try:
        ds = torchvision.datasets.ImageFolder(root, transform=server.proxy, loader=_read_bytes)
        loader = dali_proxy.DataLoader(server, ds, batch_size=batch, num_workers=workers,
                                       **order(ds, kind), drop_last=False)
        n, dt = consume(loader, "cuda" if dali_device == "gpu" else "cpu", warmup, len(loader))
        del loader
    finally:
        # DALI's stop_thread (the ``with``'s exit) waits for its thread's next queue read, up to 5 s
        # once the epoch is over: it ends in the background, the pipeline idle, while the next arm runs
        threading.Thread(target=server.stop_thread, name="dali-proxy-stop").start()
    gc.collect()
    return n, dt


def run_dali_native(root, kind, workers, batch, warmup, dali_device, threads):
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(enable_conditionals=kind == "trivialaugment")
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=kind != "eval", name="reader")
        return _dali_ops(jpegs, kind, dali_device), labels

    p = pipe(batch_size=batch, num_threads=threads, device_id=0 if dali_device == "gpu" else None)
    it = DALIGenericIterator(p, ["x", "y"], reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL)
    n, dt = consume(((b[0]["x"], b[0]["y"]) for b in it), "cuda" if dali_device == "gpu" else "cpu", warmup,
                    -(-p.epoch_size("reader") // batch))
    del it, p
    gc.collect()
    return n, dt


CEILING_LOADS = (None, 0.65, 0.9, 1.0)  # DALI's default share of the hardware decoder, then fixed shares


def run_decode_ceiling(root, kind, workers, batch, warmup, dali_device, threads):
    """The GPU's own limit for the corpus: the pipeline's DALI operators on JPEG bytes already in
    memory (no DataLoader, no file reads), with each hardware-decoder share in CEILING_LOADS (on
    DALI's CPU backend, which has no such decoder, once); the best is returned (each share's
    figure is printed)."""
    import torchvision
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    samples = torchvision.datasets.ImageFolder(root).samples
    data = [(np.fromfile(p, dtype=np.uint8), np.array([c], dtype=np.int64)) for p, c in samples]
    order = np.random.default_rng(0).permutation(len(data))
    total = len(data) // batch

    class Epoch:
        def __init__(self):
            self.i = 0

        def __call__(self):
            if self.i >= total:
                self.i = 0
                raise StopIteration
            picked = [data[k] for k in order[self.i * batch:(self.i + 1) * batch]]
            self.i += 1
            return [p[0] for p in picked], [p[1] for p in picked]

    best = (0, 1.0)
    for load in CEILING_LOADS if dali_device == "gpu" else CEILING_LOADS[:1]:  # no hardware decoder on the CPU
        @pipeline_def(enable_conditionals=kind == "trivialaugment")
        def pipe():
            jpegs, labels = fn.external_source(source=Epoch(), num_outputs=2, batch=True,
                                               dtype=[types.UINT8, types.INT64])
            return _dali_ops(jpegs, kind, dali_device, hw_decoder_load=load), labels

        p = pipe(batch_size=batch, num_threads=threads, device_id=0 if dali_device == "gpu" else None)
        it = DALIGenericIterator(p, ["x", "y"], last_batch_policy=LastBatchPolicy.DROP)
        n, dt = consume(((b[0]["x"], b[0]["y"]) for b in it), "cuda" if dali_device == "gpu" else "cpu", warmup,
                        total)
        print(json.dumps({"pipeline": kind, "decode_ceiling_hw_decoder_load": load, "images_per_s": n / dt}),
              flush=True)
        if n / dt > best[0] / best[1]:
            best = (n, dt)
        del it, p
        gc.collect()
    return best


def _bytes_and_labels(batch):
    return [b[0] for b in batch], torch.tensor([b[1] for b in batch])


def run_decode_jpeg_gpu(root, kind, workers, batch, warmup, dali_device, threads):
    """torchvision.io.decode_jpeg on the GPU, batched, then the v2 transforms per image there."""
    import torchvision
    import torchvision.transforms.v2 as v2
    if not torch.cuda.is_available():
        raise RuntimeError("decode_jpeg_gpu needs a CUDA GPU")
    tf = tv_transform(kind, v2)
    ds = torchvision.datasets.ImageFolder(root, loader=_read_bytes)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, **order(ds, kind), num_workers=workers,
                                         collate_fn=_bytes_and_labels)

    def batches():
        for datas, y in loader:
            imgs = torchvision.io.decode_jpeg([torch.from_numpy(d) for d in datas], device="cuda",
                                              mode=torchvision.io.ImageReadMode.RGB)
            yield torch.stack([tf(img) for img in imgs]), y
    n, dt = consume(batches(), "cuda", warmup, len(loader))
    gc.collect()
    return n, dt


def gpu_memory_mb() -> float:
    """This process's GPU memory (NVML via torch), 0 without a GPU."""
    if not torch.cuda.is_available():
        return 0.0
    import re
    try:
        m = re.search(rf"process\s+{os.getpid()}\s+uses\s+([0-9.]+)\s*MB", torch.cuda.list_gpu_processes())
        return float(m.group(1)) if m else 0.0
    except Exception:
        return 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "data", "corpus"))
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--large", action="store_true", help="a corpus of camera-sized photos (decode-bound)")
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8, 15])
    ap.add_argument("--batch", type=int, nargs="+", default=[128])
    ap.add_argument("--pipelines", nargs="+", default=["train", "eval"], choices=PIPELINES)
    ap.add_argument("--modes", nargs="+", default=["torchvision", "autoproxy", "dali_proxy", "dali_native"],
                    choices=["torchvision", "autoproxy", "autoproxy_fast", "autoproxy_dali_resize",
                             "autoproxy_loop_stream", "dali_proxy",
                             "dali_native", "decode_ceiling",
                             "decode_jpeg_gpu"])
    ap.add_argument("--warmup", type=int, default=None,
                    help="batches not timed (default: the deepest queue of the modes, at most a third of the epoch)")
    ap.add_argument("--samples", type=int, default=0,
                    help="samples per epoch, drawn by a sampler from the corpus (0: the corpus once): a long "
                         "epoch, so the timed window is long and in steady state")
    ap.add_argument("--proxy-hw-decoder-load", type=float, default=None,
                    help="dali_proxy's hardware-decoder share (default: DALI's own; autoproxy's is 0.9)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode, interleaved; the median is reported")
    ap.add_argument("--tv-repeat", type=int, default=1, help="runs of the (slow) torchvision mode")
    ap.add_argument("--epochs", type=int, default=1, help="epochs per run for the DALI modes")
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--thread-times", action="store_true",
                    help="per batch, the pipeline thread's wall and CPU time in DALI's outputs and in the torch "
                         "stage (median), and the main thread's busy share, for the autoproxy modes; for every "
                         "mode, each thread's and worker's CPU share of the timed window (ProcessCpu)")
    ap.add_argument("--cuda-timeline", action="store_true",
                    help="after the timed runs, one more run per autoproxy mode and pipeline under torch.profiler: "
                         "GPU busy share per stream, top kernels, host waits (its rate is not comparable)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one autoproxy train epoch at the largest worker count (main process)")
    a = ap.parse_args(argv)
    EPOCH_SAMPLES["n"] = a.samples
    epoch = a.samples or a.images

    from dali_autoproxy.backends.dali.runner import default_num_threads
    threads = default_num_threads(a.device)
    corpus = make_corpus(a.data, a.images, large=a.large)
    env = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "dali_device": a.device, "dali_threads": threads, "samples_per_epoch": epoch,
           "dali_proxy_hw_decoder_load": a.proxy_hw_decoder_load or "DALI's default"}
    try:
        import nvidia.dali
        import torchvision
        env.update(dali=nvidia.dali.__version__, torchvision=torchvision.__version__)
    except ImportError:
        pass
    print(json.dumps({"corpus": corpus, "env": env}), flush=True)
    runners = {"torchvision": lambda *x: run_torchvision(*x[:6]),
               "autoproxy": lambda *x: run_torchvision(*x[:6], autoproxy=True),
               "autoproxy_fast": lambda *x: run_torchvision(*x[:6], autoproxy=True, fidelity="fast"),
               "autoproxy_dali_resize": lambda *x: run_torchvision(*x[:6], autoproxy=True, resize="dali"),
               "autoproxy_loop_stream": lambda *x: on_loop_stream(run_torchvision, *x[:6], autoproxy=True),
               "dali_proxy": lambda *x: run_dali_proxy(*x, hw_decoder_load=a.proxy_hw_decoder_load),
               "dali_native": run_dali_native, "decode_ceiling": run_decode_ceiling,
               "decode_jpeg_gpu": run_decode_jpeg_gpu}
    results = []
    for batch, kind, w in [(b, k, w) for b in a.batch for k in a.pipelines for w in a.workers]:
        modes = [m for m in a.modes if not (m in ("dali_native", "decode_ceiling") and w != a.workers[0])]
        runs = {m: [] for m in modes}
        for rep in range(a.repeat):  # modes interleaved, so drift hits all of them alike
            for mode in modes:
                if mode == "torchvision" and rep >= a.tv_repeat:
                    continue
                c0 = cpu_seconds()
                n, dt, busy_rows, clock_rows = 0, 0.0, [], []
                try:
                    for _ in range(1 if mode == "torchvision" else a.epochs):
                        warm = a.warmup if a.warmup is not None else auto_warmup(w, epoch // batch, batch)
                        with ThreadClock(a.thread_times and mode.startswith("autoproxy")) as clock, \
                                ProcessCpu(a.thread_times) as busy:
                            ni, di = runners[mode](a.data, kind, w, batch, warm, a.device, threads)
                        if clock.rows or busy.rows:
                            print(json.dumps({"pipeline": kind, "mode": mode, "workers": w,
                                              **(clock.summary() if clock.rows else {}), "cpu_busy": busy.rows}),
                                  flush=True)
                        busy_rows += busy.rows
                        clock_rows += [clock.summary()] if clock.rows else []
                        n, dt = n + ni, dt + di
                except Exception as exc:  # one mode failing must not lose the others' figures
                    print(json.dumps({"pipeline": kind, "mode": mode, "workers": w, "batch": batch,
                                      "error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)
                    continue
                cpu = cpu_seconds() - c0
                runs[mode].append((n / dt, 1000 * cpu / max(1, n), n, dt, gpu_memory_mb(), busy_rows, clock_rows))
        for mode, rs in runs.items():
            if not rs:
                continue
            rates = sorted(r[0] for r in rs)
            row = {"pipeline": kind, "mode": mode, "workers": w if mode not in ("dali_native", "decode_ceiling") else 0,
                   "batch": batch, "runs": len(rs), "images": rs[0][2],
                   "gpu_mb": round(max(r[4] for r in rs)),
                   "images_per_s": round(float(np.median(rates)), 1),
                   "min_images_per_s": round(rates[0], 1), "max_images_per_s": round(rates[-1], 1),
                   "cpu_s_per_1k_images": round(float(np.median([r[1] for r in rs])), 2)}
            row["runs_images_per_s"] = [round(r[0], 1) for r in rs]  # in the order they ran
            if any(r[5] for r in rs):
                row["cpu_busy"] = [b for r in rs for b in r[5]]  # per run: ProcessCpu
            if any(r[6] for r in rs):
                row["thread_times"] = [c for r in rs for c in r[6]]  # per run: ThreadClock
            results.append(row)
            print(json.dumps(row), flush=True)
    if a.profile:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        run_torchvision(a.data, a.pipelines[0], max(a.workers), a.batch[0], 0, a.device, autoproxy=True)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        print(buf.getvalue(), flush=True)
        if a.out:
            with open(os.path.splitext(a.out)[0] + ".profile.txt", "w") as f:
                f.write(buf.getvalue())
    timelines = []
    for kind in a.pipelines if a.cuda_timeline else []:
        for mode in [m for m in a.modes if m.startswith("autoproxy")]:
            w = max(a.workers)
            with CudaTimeline(f"{kind} {mode} {w} workers") as timeline:
                warm = auto_warmup(w, epoch // a.batch[0], a.batch[0])
                runners[mode](a.data, kind, w, a.batch[0], warm, a.device, threads)
            print(json.dumps(timeline.summary), flush=True)
            timelines.append(timeline.summary)
    summary = summarize(results)
    print(summary, flush=True)
    if a.out and timelines:
        with open(os.path.splitext(a.out)[0] + ".timeline.json", "w") as f:
            json.dump(timelines, f, indent=1)
    if a.out:
        stem = write_results(a.out, {"commit": measured_commit(), "corpus": corpus, "env": env,
                                      "results": results}, summary)
        chart(results, stem + ".png")


def chart(results, path: str) -> None:
    """Images/s against workers, one panel per pipeline (and batch size), one line per mode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart", flush=True)
        return
    panels = sorted({(r["pipeline"], r["batch"]) for r in results})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (kind, batch) in zip(axes[0], panels):
        for mode in sorted({r["mode"] for r in results}):
            pts = sorted((r["workers"], r["images_per_s"]) for r in results
                         if r["pipeline"] == kind and r["batch"] == batch and r["mode"] == mode)
            if not pts:
                continue
            if mode in ("dali_native", "decode_ceiling"):
                ax.axhline(pts[0][1], ls=":", color="gray" if mode == "dali_native" else "black",
                           label="native DALI reader" if mode == "dali_native" else "decode ceiling (in memory)")
            else:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax.set_title(f"{kind}, batch {batch}")
        ax.set_xlabel("DataLoader workers")
        ax.set_ylabel("images/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart: {path}", flush=True)


def _cell(x) -> str:
    if not x:
        return "-"
    spread = f" ({x['min_images_per_s']:,.0f}-{x['max_images_per_s']:,.0f})" if x["runs"] > 1 else ""
    return f"{x['images_per_s']:,.0f}{spread}"


def summarize(results) -> str:
    lines = ["| pipeline | batch | workers | torchvision img/s | autoproxy img/s (min-max) | DALI proxy (hand-written) "
             "img/s (min-max) | decode_jpeg on GPU img/s | autoproxy / torchvision | autoproxy / DALI proxy | "
             "CPU s per 1k img (tv / autoproxy) | GPU MB (autoproxy / proxy) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["pipeline"], r["batch"], r["mode"], r["workers"]): r for r in results}
    for (kind, batch, mode, w), r in sorted(by.items()):
        if mode != "autoproxy":
            continue
        tv, dp = by.get((kind, batch, "torchvision", w)), by.get((kind, batch, "dali_proxy", w))
        dj = by.get((kind, batch, "decode_jpeg_gpu", w))
        ratio = lambda x: f"{r['images_per_s'] / x['images_per_s']:.2f}x" if x else "-"  # noqa: E731
        lines.append(f"| {kind} | {batch} | {w} | {_cell(tv)} | {_cell(r)} | {_cell(dp)} | {_cell(dj)} | {ratio(tv)} | "
                     f"{ratio(dp)} | {tv['cpu_s_per_1k_images'] if tv else '-'} / {r['cpu_s_per_1k_images']} | "
                     f"{r['gpu_mb']} / {dp['gpu_mb'] if dp else '-'} |")
    for (kind, batch, mode, w), r in sorted(by.items()):
        if mode == "dali_native":
            lines.append(f"\nnative DALI reader ({kind}, batch {batch}): {r['images_per_s']:,.0f} img/s")
        if mode == "decode_ceiling":
            shares = ", ".join(f"{_cell(a)} at {w_} workers ({a['images_per_s'] / r['images_per_s']:.0%})"
                               for (k_, b_, m_, w_), a in sorted(by.items())
                               if (k_, b_, m_) == (kind, batch, "autoproxy"))
            lines.append(f"\ndecode ceiling ({kind}, batch {batch}: DALI's operators on JPEG bytes in memory, the best "
                         f"hardware-decoder share): {r['images_per_s']:,.0f} img/s; autoproxy {shares}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
