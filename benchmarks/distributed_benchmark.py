"""Total images/s of a DDP-style loader on 1 and 2 GPUs (ranks), plain torchvision against
autoproxy, the same DataLoader workers per rank, in one run.

Each rank iterates its DistributedSampler shard of the corpus (train pipeline: RandomResizedCrop,
flip, ToTensor, Normalize), moving batches to its GPU; the total is all ranks' images over the
slowest rank's time, after a barrier-aligned start and warm-up.

Every epoch begins with a fixed wait: each worker builds a whole batch before the first one
arrives (the same for torchvision and autoproxy). With 2 ranks each epoch has half the batches,
so a small corpus charges that wait twice as often per image and understates scaling; the
default corpus keeps it small, and the JSON records the mean time to the first batch.

Runs are noisy: ``--repeat N`` runs every (ranks, mode) N times, interleaved, and reports the
median with its min-max; scaling is the median of two ranks over the median of one.

    python benchmarks/distributed_benchmark.py --images 32768 --workers 8 --ranks 1 2 --repeat 3 \\
        --out benchmarks/results/distributed_h200x2.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(a) -> None:
    import torch
    import torch.distributed as dist
    import torchvision
    sys.path.insert(0, HERE)
    from loader_benchmark import tv_transform
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    if a.mode == "autoproxy":
        import dali_autoproxy
        dali_autoproxy.enable(device="gpu", log_level="WARNING")
    ds = torchvision.datasets.ImageFolder(a.data, transform=tv_transform("train"))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                                         pin_memory=True, persistent_workers=True)
    n, elapsed, first = 0, 0.0, []
    for epoch in range(a.epochs + 1):  # epoch 0 warms up (workers, pipelines, caches)
        sampler.set_epoch(epoch)
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        count, t_first = 0, None
        for x, _ in loader:
            x = x.cuda(non_blocking=True)
            count += x.shape[0]
            if t_first is None:
                t_first = time.perf_counter() - t0
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if epoch:
            n, elapsed = n + count, elapsed + dt
            first.append(t_first)
    times = [None] * dist.get_world_size()
    dist.all_gather_object(times, (n, elapsed, sum(first) / max(1, len(first))))
    if dist.get_rank() == 0:
        total = sum(t[0] for t in times)
        with open(a.result, "w") as f:
            json.dump({"images": total, "seconds": max(t[1] for t in times),
                       "images_per_s": total / max(t[1] for t in times),
                       "first_batch_s": max(t[2] for t in times)}, f)
    del loader
    dist.destroy_process_group()


def run_once(a, ranks: int, mode: str) -> dict:
    result = f"/tmp/dist_bench_{os.getpid()}_{ranks}_{mode}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
           f"--master_port={29600 + ranks}", os.path.abspath(__file__), "--rank-run", "--mode", mode,
           "--result", result, "--data", a.data, "--workers", str(a.workers), "--batch", str(a.batch),
           "--epochs", str(a.epochs)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stderr[-3000:], flush=True)
        return {"ranks": ranks, "mode": mode, "error": res.stderr[-500:]}
    with open(result) as f:
        return {"ranks": ranks, "mode": mode, "workers_per_rank": a.workers, **json.load(f)}


def summarize(rows, a) -> str:
    """Median images/s per (ranks, mode) with min-max; a mode not run (or failed) shows "-"."""
    import statistics
    runs: dict = {}
    for r in rows:
        if "images_per_s" in r:
            runs.setdefault((r["ranks"], r["mode"]), []).append(r)
    med = {k: statistics.median(x["images_per_s"] for x in v) for k, v in runs.items()}

    def cell(key) -> str:
        if key not in runs:
            return "-"
        rates = sorted(x["images_per_s"] for x in runs[key])
        return f"{med[key]:,.0f}" + (f" ({rates[0]:,.0f}-{rates[-1]:,.0f})" if len(rates) > 1 else "")

    def ratio(num, den) -> str:
        return f"{med[num] / med[den]:.2f}x" if num in med and den in med else "-"

    def first_ms(key) -> str:
        return f"{statistics.median(x['first_batch_s'] for x in runs[key]) * 1e3:.0f}" if key in runs else "-"
    lines = ["| ranks (GPUs) | workers per rank | runs | torchvision img/s (min-max) | autoproxy img/s (min-max) | "
             "autoproxy / torchvision | scaling vs 1 rank (tv / autoproxy) | first batch ms (tv / autoproxy) |",
             "|---|---|---|---|---|---|---|---|"]
    base = a.ranks[0]
    for ranks in a.ranks:
        tv, ap_ = (ranks, "torchvision"), (ranks, "autoproxy")
        n = max(len(runs.get(tv, [])), len(runs.get(ap_, [])))
        lines.append(f"| {ranks} | {a.workers} | {n} | {cell(tv)} | {cell(ap_)} | {ratio(ap_, tv)} | "
                     f"{ratio(tv, (base, 'torchvision'))} / {ratio(ap_, (base, 'autoproxy'))} | "
                     f"{first_ms(tv)} / {first_ms(ap_)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data", "corpus"))
    ap.add_argument("--images", type=int, default=32768)
    ap.add_argument("--workers", type=int, default=8, help="DataLoader workers per rank")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs (after one warm-up epoch)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--modes", nargs="+", default=["torchvision", "autoproxy"])
    ap.add_argument("--repeat", type=int, default=1, help="runs per (ranks, mode), interleaved; medians reported")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_run:
        return rank_main(a)
    sys.path.insert(0, HERE)
    from corpus import make_corpus
    from results_io import write_results
    corpus = make_corpus(a.data, a.images)
    rows = []
    for rep in range(a.repeat):
        for ranks in a.ranks:
            for mode in a.modes:
                row = run_once(a, ranks, mode)
                rows.append(dict(row, repeat=rep))
                print(json.dumps(rows[-1]), flush=True)
    table = summarize(rows, a)
    print(table, flush=True)
    if a.out:
        write_results(a.out, {"corpus": corpus, "rows": rows}, table)


if __name__ == "__main__":
    main()
