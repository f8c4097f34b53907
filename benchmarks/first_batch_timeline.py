"""Where a loader's first batch goes: each DALI pipeline build (when, how long) between the
iterator's creation and the first batch, for two epochs of the segmentation recipe
(``recipes_steady.segmentation_dataset``), autoproxy on the GPU, the DataLoader's defaults (fork,
workers not persistent), pin_memory. Stamps are seconds from the epoch's start in one process;
the builds are timed around ``DaliRunner._build`` (wrapped here, nothing else changed).

    python benchmarks/first_batch_timeline.py --out benchmarks/results/first_batch_timeline_h100.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from results_io import measured_commit, write_results

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coco", default="/tmp/coco_bench", help="the detection set (made once, 640 x 480 JPEGs)")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--device", default="gpu", choices=("gpu", "cpu"), help="cpu: DALI's CPU backend (a check)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    from detection_benchmark import make_set
    from recipes_steady import segmentation_dataset

    import dali_autoproxy
    from dali_autoproxy.backends.dali import runner
    make_set(args.coco, args.images)  # once
    events, start = [], [time.perf_counter()]
    build = runner.DaliRunner._build

    def timed_build(self):
        t = time.perf_counter()
        build(self)
        events.append(dict(event="build", at_s=round(t - start[0], 3), took_s=round(time.perf_counter() - t, 3)))

    runner.DaliRunner._build = timed_build
    torch.multiprocessing.set_sharing_strategy("file_system")
    gpu = args.device == "gpu"
    if gpu:
        torch.zeros(1, device="cuda")  # CUDA's own start is not the loader's
    dali_autoproxy.enable(device=args.device, log_level="WARNING")
    loader = torch.utils.data.DataLoader(segmentation_dataset(args.coco, args.images), batch_size=args.batch,
                                         shuffle=True, num_workers=args.workers, drop_last=True, pin_memory=gpu)
    for epoch in range(2):
        start[0] = time.perf_counter()
        events.append(dict(event=f"epoch {epoch}", at_s=0.0))
        it = iter(loader)
        events.append(dict(event="iterator made", at_s=round(time.perf_counter() - start[0], 3)))
        for i, batch in enumerate(it):
            if i == 0:
                if gpu:
                    batch[0][0].cuda()
                    torch.cuda.synchronize()
                events.append(dict(event="first batch", at_s=round(time.perf_counter() - start[0], 3)))
            if i == 20:
                break
        del it
    for e in events:
        print(e)
    method = __doc__.split("\n\n")[0].replace("\n", " ")
    device = torch.cuda.get_device_name(0) if gpu else "DALI's CPU backend"
    table = [f"# Where the first batch goes ({measured_commit()[:12]})", "", method,
             "", f"segmentation, batch {args.batch}, {args.workers} workers, {device}", "",
             "| event | at (s from the epoch's start) | took (s) |", "|---|---|---|"]
    table += [f"| {e['event']} | {e['at_s']} | {e.get('took_s', '')} |" for e in events]
    write_results(args.out, {"commit": measured_commit(), "device": device, "batch": args.batch,
                             "workers": args.workers, "results": events}, "\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
