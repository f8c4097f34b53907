"""The README's main job until `dali-autoproxy ab` exists: an ordinary training-style loop
over a small generated ImageFolder, once plain and once with autoproxy, side by side.

    python benchmarks/quickstart.py            # DALI on the GPU when there is one, else its CPU backend
"""
from __future__ import annotations

import argparse
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


def epoch(root: str, workers: int, batch: int) -> float:
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    loader = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=tf),
                                         batch_size=batch, shuffle=True, num_workers=workers)
    n, t0 = 0, time.perf_counter()
    for x, y in loader:
        n += len(y)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 2))
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    device = "gpu" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        info = make_corpus(os.path.join(tmp, "corpus"), a.images)
        print(f"corpus: {info['images']} JPEGs, mean {info['mean_file_kb']} KB; DALI backend: {device}")
        plain = epoch(info["root"], a.workers, a.batch)
        dali_autoproxy.enable(device=device)
        proxied = epoch(info["root"], a.workers, a.batch)
        dali_autoproxy.print_report()
        dali_autoproxy.disable()
    print(f"torchvision: {plain:,.0f} images/s   autoproxy ({device}): {proxied:,.0f} images/s   "
          f"ratio {proxied / plain:.2f}x")


if __name__ == "__main__":
    main()
