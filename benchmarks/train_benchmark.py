"""End to end: an unchanged ImageNet training script, one epoch, plain and with
``DALI_AUTOPROXY=1``: epoch time and the share of it the training loop waits for data.

The script is pytorch/examples' ``imagenet/main.py``, run as its users run it (not vendored:
pass its path). It reports, per batch, the running averages of its ``Time`` (a whole step) and
``Data`` (waiting for the loader) meters; with ``--print-freq 1`` the last line gives the
epoch's sums exactly. ``steady`` excludes the first 10 batches (worker and pipeline start-up).
Modes are interleaved per architecture, ``--repeat`` times.

    git clone https://github.com/pytorch/examples /tmp/examples
    python benchmarks/train_benchmark.py --main /tmp/examples/imagenet/main.py --images 32768 \\
        --arch resnet18 resnet50 --out benchmarks/results/train_resnet_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from corpus import make_corpus  # noqa: E402
from results_io import write_results  # noqa: E402

STEP = re.compile(r"Epoch: \[0\]\[\s*(\d+)/(\d+)\]\s+Time\s+[\d.]+ \(\s*([\d.]+)\)\s+Data\s+[\d.]+ \(\s*([\d.]+)\)")
ACC = re.compile(r"\*\s+Acc@1\s+([\d.]+)")
STEADY_FROM = 10


def parse(stdout: str, batch: int) -> dict:
    """Epoch and steady-state figures from main.py's progress lines (running averages)."""
    steps = [(int(n), int(total), float(t), float(d)) for n, total, t, d in STEP.findall(stdout)]
    if not steps:
        raise RuntimeError("no progress lines in the script's output")
    n, total, t_avg, d_avg = steps[-1]
    if n != total:
        raise RuntimeError(f"the epoch stopped at batch {n} of {total}")
    k, _, tk, dk = next((s for s in steps if s[0] >= STEADY_FROM and s[0] < n), steps[0])
    steady_time, steady_data = t_avg * n - tk * k, d_avg * n - dk * k
    if n <= k or steady_time <= 0:
        raise RuntimeError(f"an epoch of {n} batches is too short to measure (more than {STEADY_FROM} needed)")
    acc = ACC.findall(stdout)
    return {"batches": n, "epoch_s": round(t_avg * n, 2), "data_wait_s": round(d_avg * n, 2),
            "data_wait_share": round(d_avg / t_avg, 3),
            "steady_images_per_s": round((n - k) * batch / steady_time, 1),
            "steady_data_wait_share": round(steady_data / steady_time, 3),
            "val_acc1": float(acc[-1]) if acc else None}


def run(main_py: str, root: str, arch: str, mode: str, a) -> dict:
    import torch
    cuda = torch.cuda.is_available()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DALI_AUTOPROXY")}
    if mode == "autoproxy":
        env.update(DALI_AUTOPROXY="1", DALI_AUTOPROXY_LOG="INFO", DALI_AUTOPROXY_DEVICE="gpu" if cuda else "cpu")
    cmd = [sys.executable, main_py, root, "-a", arch, "--epochs", "1", "-b", str(a.batch), "-j", str(a.workers),
           "--print-freq", "1"] + (["--gpu", "0"] if cuda else ["--no-accel"])
    with tempfile.TemporaryDirectory() as cwd:  # main.py saves its checkpoint in the working directory
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=a.timeout)
        wall = time.perf_counter() - t0
    if res.returncode != 0:
        return {"arch": arch, "mode": mode, "error": res.stderr[-1500:]}
    row = {"arch": arch, "mode": mode, "wall_s": round(wall, 1), **parse(res.stdout, a.batch)}
    if mode == "autoproxy":  # main.py's train and val loaders, as the log says
        row["loaders_proxied"] = res.stderr.count("proxied to DALI")
        row["fell_back"] = [ln for ln in res.stderr.splitlines() if "running plain torchvision" in ln][:3]
    return row


def summarize(rows) -> str:
    import statistics
    lines = ["| model | mode | runs | epoch s | waiting for data | steady img/s | steady waiting | val Acc@1 "
             "| epoch time / plain |",
             "|---|---|---|---|---|---|---|---|---|"]
    by: dict = {}
    for r in rows:
        if "epoch_s" in r:
            by.setdefault((r["arch"], r["mode"]), []).append(r)
    for (arch, mode), rs in by.items():
        med = lambda key: statistics.median(x[key] for x in rs)  # noqa: E731
        plain = by.get((arch, "plain"))
        vs = f"{med('epoch_s') / statistics.median(x['epoch_s'] for x in plain):.2f}x" if plain else "-"
        lines.append(f"| {arch} | {mode} | {len(rs)} | {med('epoch_s'):.1f} | {med('data_wait_share'):.0%} | "
                     f"{med('steady_images_per_s'):,.0f} | {med('steady_data_wait_share'):.0%} | "
                     f"{rs[-1]['val_acc1']} | {vs} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--main", required=True, help="path to pytorch/examples imagenet/main.py")
    ap.add_argument("--data", default=os.path.join(HERE, "data", "imagenet_like"))
    ap.add_argument("--images", type=int, default=32768, help="training images (one epoch)")
    ap.add_argument("--val-images", type=int, default=1024)
    ap.add_argument("--large", action="store_true", help="camera-sized photos")
    ap.add_argument("--arch", nargs="+", default=["resnet18", "resnet50"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--modes", nargs="+", default=["plain", "autoproxy"], choices=["plain", "autoproxy"])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not os.path.exists(a.main):
        ap.error(f"--main {a.main}: no such file (pytorch/examples' imagenet/main.py)")
    corpus = {"train": make_corpus(os.path.join(a.data, "train"), a.images, large=a.large),
              "val": make_corpus(os.path.join(a.data, "val"), a.val_images, large=a.large)}
    import torch
    env = {"torch": torch.__version__, "cpu_count": os.cpu_count(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "batch": a.batch, "workers": a.workers}
    print(json.dumps({"corpus": corpus, "env": env}), flush=True)
    rows = []
    for rep in range(a.repeat):
        for arch in a.arch:
            for mode in a.modes:
                rows.append(run(os.path.abspath(a.main), os.path.abspath(a.data), arch, mode, a))
                print(json.dumps(rows[-1]), flush=True)
    table = summarize(rows)
    print(table, flush=True)
    if a.out:
        write_results(a.out, {"corpus": corpus, "env": env, "rows": rows}, table)


if __name__ == "__main__":
    main()
