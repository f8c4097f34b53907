"""`dali-autoproxy demo`: the A/B comparison on a generated ImageNet-like dataset.

No data of yours and no downloads: photographs shipped with scikit-image become an
ImageFolder of JPEGs in a cache directory; a standard train and eval loader read it, once
plain and once with autoproxy (on the GPU when there is one, else on DALI's CPU backend).
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap

DEMO_SCRIPT = textwrap.dedent('''
    """A standard ImageNet-style train + eval loop over an ImageFolder (written by dali-autoproxy demo)."""
    import sys

    import torch
    import torchvision
    import torchvision.transforms as T

    root, epochs, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    normalize = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train = torchvision.datasets.ImageFolder(root, T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), normalize]))
    val = torchvision.datasets.ImageFolder(root, T.Compose([
        T.Resize(256), T.CenterCrop(224), T.ToTensor(), normalize]))
    cuda = torch.cuda.is_available()
    train_loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True, num_workers=workers,
                                               pin_memory=cuda)
    val_loader = torch.utils.data.DataLoader(val, batch_size=64, num_workers=workers, pin_memory=cuda)
    device = torch.device("cuda" if cuda else "cpu")
    for epoch in range(epochs):
        for images, target in train_loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
        for images, target in val_loader:
            images = images.to(device, non_blocking=True)
''')


# (images, epochs, seconds per arm): with a GPU, enough work for each arm to reach its steady
# rate (autoproxy runs ~20,000 images/s on an H200, so it needs tens of thousands of images);
# without one, DALI's CPU backend shows the path works, not its speed, so small
GPU_SIZE = (8192, 40, 12.0)
CPU_SIZE = (512, 2, None)
MEASURED = ("on an H100 with 8 workers the train chain ran at 17,579 images/s with autoproxy against 1,406 "
            "for plain torchvision, in steady state (the README's table, benchmarks/results/train_workers_h100.md)")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--images", type=int, default=None,
                    help=f"JPEGs in the generated dataset (default {GPU_SIZE[0]} with a GPU, {CPU_SIZE[0]} without)")
    ap.add_argument("--epochs", type=int, default=None,
                    help=f"epochs of each loader per arm (default {GPU_SIZE[1]} with a GPU, ended by --seconds; "
                         f"{CPU_SIZE[1]} without)")
    ap.add_argument("--seconds", type=float, default=None,
                    help=f"end each arm after this much loader time (default {GPU_SIZE[2]:g} with a GPU: long "
                         "enough for both arms to reach their steady rate)")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 2), help="DataLoader workers")
    ap.add_argument("--repeat", type=int, default=1, help="alternate the plain and autoproxy arms this many times")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "dali_autoproxy"),
                    help="where the generated dataset is kept between runs")
    ap.add_argument("--json", help="also write both arms' measurements to this JSON file")
    ap.add_argument("--plot", help="also draw throughput over time to this PNG (needs matplotlib)")


def run(ns: argparse.Namespace) -> int:
    import torch

    from dali_autoproxy.main.decision import dali_import_error
    from dali_autoproxy.tools import ab
    from dali_autoproxy.tools.corpus import make_corpus
    if dali_import_error():
        print(f"dali-autoproxy demo: {dali_import_error()}; install it with pip install 'dali-autoproxy[dali]'",
              file=sys.stderr)
        return 1
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["DALI_AUTOPROXY_DEVICE"] = "cpu"  # arm B: DALI's CPU backend
    images, epochs, seconds = GPU_SIZE if gpu else CPU_SIZE
    images = ns.images or images
    epochs = ns.epochs or epochs
    seconds = ns.seconds if ns.seconds is not None else (seconds if ns.epochs is None else None)
    os.makedirs(ns.cache, exist_ok=True)
    info = make_corpus(os.path.join(ns.cache, f"demo-{images}"), images)
    script = os.path.join(ns.cache, "demo_train.py")
    with open(script, "w") as f:
        f.write(DEMO_SCRIPT)
    where = "on the GPU" if gpu else "on DALI's CPU backend (no CUDA GPU here)"
    limit = f", each arm ended after {seconds:g} s of loader time" if seconds else ""
    print(f"dali-autoproxy demo: {info['images']} JPEGs ({info['mean_file_kb']} KB mean) in {info['root']}; "
          f"up to {epochs} epochs of a train and an eval loader{limit}, {ns.workers} workers; arm B runs DALI "
          f"{where}", flush=True)
    if not gpu:
        print("dali-autoproxy demo: without a GPU, arm B runs on DALI's CPU backend, which is there to show that the "
              "whole path works and gives torchvision's results, not to be fast: its speed here says nothing about "
              f"the GPU's, and no B/A is shown for it. The speed is on the GPU: {MEASURED}.", flush=True)
    ab_ns = argparse.Namespace(batches=None, seconds=seconds, repeat=ns.repeat, warmup=2, json=ns.json,
                               plot=ns.plot, script=script, args=[info["root"], str(epochs), str(ns.workers)],
                               longer="run the demo with more --images or --epochs",
                               no_warmup="more --images (the first 2 batches of each loader are warm-up)")
    return ab.run(ab_ns)
