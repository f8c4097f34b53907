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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--images", type=int, default=512, help="JPEGs in the generated dataset")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each loader per arm")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 2), help="DataLoader workers")
    ap.add_argument("--repeat", type=int, default=1, help="alternate the plain and autoproxy arms this many times")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "dali_autoproxy"),
                    help="where the generated dataset is kept between runs")
    ap.add_argument("--json", help="also write both arms' measurements to this JSON file")
    ap.add_argument("--plot", help="also draw throughput over time to this PNG (needs matplotlib)")


def run(ns: argparse.Namespace) -> int:
    from . import ab
    from .corpus import make_corpus
    from .loader import dali_import_error
    import torch
    if dali_import_error():
        print(f"dali-autoproxy demo: {dali_import_error()}; install it with pip install 'dali-autoproxy[dali]'",
              file=sys.stderr)
        return 1
    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["DALI_AUTOPROXY_DEVICE"] = "cpu"  # arm B: DALI's CPU backend
    os.makedirs(ns.cache, exist_ok=True)
    info = make_corpus(os.path.join(ns.cache, f"demo-{ns.images}"), ns.images)
    script = os.path.join(ns.cache, "demo_train.py")
    with open(script, "w") as f:
        f.write(DEMO_SCRIPT)
    where = "on the GPU" if gpu else "on DALI's CPU backend (no CUDA GPU here)"
    print(f"dali-autoproxy demo: {info['images']} JPEGs ({info['mean_file_kb']} KB mean) in {info['root']}; "
          f"{ns.epochs} epochs of a train and an eval loader, {ns.workers} workers; arm B runs DALI {where}",
          flush=True)
    ab_ns = argparse.Namespace(batches=None, seconds=None, repeat=ns.repeat, warmup=2, json=ns.json,
                               plot=ns.plot, script=script,
                               args=[info["root"], str(ns.epochs), str(ns.workers)])
    return ab.run(ab_ns)
