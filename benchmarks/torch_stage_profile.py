"""Time of each op of the torch stage (a chain's tail after DALI's crop and resize) on one
batch: where the heavy and trivialaugment pipelines' GPU time goes.

    python benchmarks/torch_stage_profile.py --chain heavy trivialaugment ssl_pillow --batch 128 --size 224
    python benchmarks/torch_stage_profile.py --chain train eval --resize pillow --host-profile

With ``--resize pillow`` the stage starts at Pillow's resize: its input is DALI's hand-over, the
decoded crops (train) or whole images (eval) of a 400 x 500 photo padded to one batch.
``--host-profile``: a cProfile of the stage's calls (the host's share of each batch: the
pipeline thread holds the GIL for it).
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import ImageFilter

from dali_autoproxy.backends.torch_stage import TorchStage
from dali_autoproxy.plan.ir import split_at_takeover as split
from dali_autoproxy.plan.planning import build_plan

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--chain", nargs="+", default=["heavy"], choices=list(CHAINS))
    ap.add_argument("--resize", choices=["dali", "pillow"], default="dali")
    ap.add_argument("--host-profile", action="store_true")
    a = ap.parse_args()
    from dali_autoproxy.plan.settings import SETTINGS
    SETTINGS["resize"] = a.resize
    for chain in a.chain:
        profile(chain, a)


class PillowRandomBlur:
    """The self-supervised recipes' own blur (SwAV's, SimCLR's): recorded, Pillow's box passes."""

    def __call__(self, img):
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))


CHAINS = {
    "train": lambda size: [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)],
    "eval": lambda size: [T.Resize(size * 8 // 7), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)],
    "heavy": lambda size: [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                           T.RandomGrayscale(0.2), T.GaussianBlur(9, (0.1, 2.0)), T.ToTensor(),
                           T.Normalize(MEAN, STD), T.RandomErasing()],
    "trivialaugment": lambda size: [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                                    T.ToTensor(), T.Normalize(MEAN, STD)],
    "ssl_pillow": lambda size: [T.RandomResizedCrop(size), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], 0.8),
                                T.RandomGrayscale(0.2), PillowRandomBlur(), T.RandomSolarize(128, 0.2),
                                T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)],
    "randaug_v2": lambda size: [v2.ToImage(), v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
                                v2.RandAugment(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)],
}


def profile(chain: str, a) -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    plan = build_plan((v2 if chain.endswith('_v2') else T).Compose(CHAINS[chain](a.size)))
    _, ops = split(plan.ops)
    torch.manual_seed(0)
    params = np.array([plan.draw(400, 500) for _ in range(a.batch)])
    hw = (400, 500) if type(ops[0]).__name__ == "PillowResize" else (a.size, a.size)  # DALI's hand-over
    x = torch.randint(0, 256, (a.batch, *hw, 3), dtype=torch.uint8, device=dev)
    if a.host_profile:
        return host_profile(chain, plan, ops, x, a)

    def timed(fn) -> float:
        fn()
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.repeat):
            fn()
        if dev == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / a.repeat * 1000
    rows = {"whole stage": timed(lambda: TorchStage(ops)(x, params))}
    if dev == "cuda":  # host-bound or GPU-bound? the launch time of one batch against its GPU time
        stage = TorchStage(ops)
        torch.cuda.synchronize()
        host, total = [], []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            stage(x, params)
            host.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            total.append(time.perf_counter() - t0)
        print(json.dumps({"chain": chain, "host_ms_to_queue_one_batch": round(1000 * float(np.median(host)), 3),
                          "ms_until_the_gpu_is_done": round(1000 * float(np.median(total)), 3)}))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            stage(x, params)
            torch.cuda.synchronize()
        events = prof.key_averages()

        def gpu(e) -> float:  # microseconds; the attribute was self_cuda_time_total in older torch
            return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        gpu_us = sum(gpu(e) for e in events)
        print(json.dumps({"chain": chain, "gpu_kernel_ms_per_batch": round(gpu_us / 1000, 3),
                          "kernels": int(sum(e.count for e in events if gpu(e) > 0)),
                          "top": [(e.key[:60], round(gpu(e) / 1000, 3)) for e in
                                  sorted(events, key=lambda e: -gpu(e))[:8]]}))
    for k, op in enumerate(ops):
        rows[f"{k}: {type(op).__name__}"] = timed(lambda op=op: TorchStage([op])(x, params))
    for name, ms in rows.items():
        print(json.dumps({"chain": chain, "op": name, "ms_per_batch": round(ms, 3),
                          "images_per_s": round(a.batch / ms * 1000)}))


def host_profile(chain: str, plan, ops, x: torch.Tensor, a) -> None:
    """The stage's host time per batch (a new draw each batch, as in an epoch) and where it goes."""
    import cProfile
    import io
    import pstats
    draws = [np.array([plan.draw(400, 500) for _ in range(a.batch)]) for _ in range(a.repeat + 3)]
    stage = TorchStage(ops)
    for params in draws[:3]:
        stage(x, params)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    plain = []
    for params in draws[3:]:  # without the profiler
        t0 = time.perf_counter()
        stage(x, params)
        plain.append(time.perf_counter() - t0)
        sync()
    host, prof = [], cProfile.Profile()
    for params in draws[3:]:
        prof.enable()
        t0 = time.perf_counter()
        stage(x, params)
        host.append(time.perf_counter() - t0)
        prof.disable()
        sync()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    pstats.Stats(prof, stream=buf).sort_stats("cumtime").print_stats(25)
    ms = round(1000 * float(np.median(host)), 3)
    from dali_autoproxy.backends.torch_stage import fused_resize
    print(json.dumps({"chain": chain, "resize": a.resize, "host_ms_per_batch": round(1000 * float(np.median(plain)), 3),
                      "host_ms_per_batch_profiled": ms, "graph_replays": fused_resize.GRAPHS.replays}))
    print(buf.getvalue())


if __name__ == "__main__":
    main()
