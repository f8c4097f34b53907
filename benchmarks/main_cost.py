"""CPU time the main process's loop thread spends per loader batch, plain torchvision and
autoproxy side by side.

At small batches (detection and segmentation train at 2-8 images per GPU) the main process is
what bounds a proxied loader: every batch is received there (the DataLoader's queue, unpickling,
mapping what the worker passed), and autoproxy adds its own work per batch and per DALI run.
This measures that thread alone, where DALI's own threads cannot blur it: each mode in a process
of its own, the segmentation recipe of ``recipes_steady.py`` (RandomResize 48-192, flip,
RandomCrop 64, masks) at batch 2 with 2 workers, the DataLoader's defaults (its sharing strategy
too), DALI's CPU backend with runs gathered as on the GPU; the loop thread's CPU time
(``time.thread_time``) over batches [w, B - w) of the second epoch (w an eighth of the epoch's B:
past the workers' start, which the loop thread forks, and before the epoch's drain), per batch. Modes: ``torchvision``;
``autoproxy``; ``autoproxy_shared_files``, autoproxy with every batch's bytes in a new
shared-memory buffer and every tensor in a file of its own, as plain sends them
(``worker/payload_pool.POOL_BUFFERS = 0``, ``transport.INLINE_BYTES = 0``).

    python benchmarks/main_cost.py --out benchmarks/results/main_cost_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["torchvision", "autoproxy", "autoproxy_shared_files"]


def run_mode(mode: str, coco: str, images: int, batch: int, workers: int) -> float:
    """This process: two epochs of one mode; the loop thread's CPU microseconds per batch in the second."""
    import torch
    from recipes_steady import segmentation_dataset

    import dali_autoproxy
    if mode.startswith("autoproxy"):
        from dali_autoproxy.main import runs
        runs.GATHER_ON = ("gpu", "cpu")  # runs of several batches, as on the GPU
        if mode == "autoproxy_shared_files":
            from dali_autoproxy import transport
            from dali_autoproxy.worker import payload_pool
            payload_pool.POOL_BUFFERS, transport.INLINE_BYTES = 0, 0
        dali_autoproxy.enable(device="cpu", log_level="WARNING", strict=True)
    loader = torch.utils.data.DataLoader(segmentation_dataset(coco, images), batch_size=batch, shuffle=True,
                                         num_workers=workers, drop_last=True)
    total = len(loader)
    warm = max(2, total // 8)  # past the workers' start and the first runs; before the epoch's drain
    for _epoch in range(2):
        for i, _batch in enumerate(loader):
            if i == warm:
                cpu = time.thread_time()
            elif i == total - warm:
                cpu = time.thread_time() - cpu
    return 1e6 * cpu / (total - 2 * warm)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coco", default="/tmp/coco_bench", help="the detection set (made once, 640 x 480 JPEGs)")
    ap.add_argument("--images", type=int, default=512, help="images, and samples per epoch")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode, interleaved; the median is reported")
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # one mode, in its own process
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    if a.mode:
        print("FIGURE " + json.dumps(run_mode(a.mode, a.coco, a.images, a.batch, a.workers)), flush=True)
        return 0
    from detection_benchmark import make_set
    from results_io import interleaved_runs, measured_commit, medians_table, write_results
    make_set(a.coco, a.images)
    runs = interleaved_runs(__file__, a.modes, a.repeat, ["--coco", a.coco, "--images", str(a.images),
                                                          "--batch", str(a.batch), "--workers", str(a.workers)])
    if runs is None:
        return 1
    rows, text = medians_table(runs, "us_per_batch", "loop thread CPU us per batch")
    print(text)
    if a.out:
        head = (f"# Main-process loop thread CPU per batch ({measured_commit()[:12]})\n\nsegmentation recipe, batch "
                f"{a.batch}, {a.workers} workers, {a.images} images an epoch, DALI's CPU backend with runs gathered "
                f"as on the GPU, {a.repeat} runs per mode interleaved, each in its own process; the loop thread's "
                "CPU over batches [B/8, 7B/8) of the second epoch, per batch\n\n")
        write_results(a.out, {"commit": measured_commit(), "method": head.split("\n\n")[1], "images": a.images,
                              "batch": a.batch, "workers": a.workers, "results": rows}, head + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
