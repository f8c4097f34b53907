"""An ImageNet-like ImageFolder of photographic JPEGs, made from scikit-image's sample photos
(used by the demo command and the benchmarks).

No downloads: each file is a random crop of one of the package's colour photographs,
rescaled so its shorter side is 300-500 px (``large``: 1000-1300 px, the size of a phone or
camera photo, where decoding dominates), saved as JPEG. Deterministic for a seed.
"""
from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from typing import List, Optional, Tuple

import numpy as np

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field",
          "retina", "cat", "colorwheel", "motorcycle_left")


def _photos() -> List[np.ndarray]:
    from skimage import data
    out = []
    for name in PHOTOS:
        fn = getattr(data, name, None)
        if fn is None:
            continue
        try:
            img = fn()
        except Exception:  # some sample images need an optional download: skip those
            continue
        if isinstance(img, tuple):
            img = img[0]
        if img.ndim == 3 and img.shape[2] == 3 and min(img.shape[:2]) >= 256:
            out.append(np.ascontiguousarray(img[..., :3]))
    return out


SHORT_SIDE = {False: (300, 501), True: (1000, 1301)}  # by ``large``


def _make(args: Tuple[str, int, int, int, bool]) -> int:
    from PIL import Image
    root, start, stop, n_classes, large = args
    photos = _photos()
    total = 0
    for k in range(start, stop):
        rng = np.random.default_rng(k)
        cls = k % n_classes
        src = photos[cls % len(photos)]
        h, w = src.shape[:2]
        s = rng.uniform(0.5, 1.0)
        ch, cw = int(h * s), int(w * s * rng.uniform(0.8, 1.25))
        cw = min(cw, w)
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        img = Image.fromarray(src[y:y + ch, x:x + cw])
        short = int(rng.integers(*SHORT_SIDE[large]))
        scale = short / min(img.size)
        img = img.resize((max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale))), Image.BILINEAR)
        path = os.path.join(root, f"class{cls:03d}", f"img{k:06d}.jpg")
        img.save(path, "JPEG", quality=int(rng.integers(85, 96)))
        total += os.path.getsize(path)
    return total


def make_corpus(root: str, n_images: int, n_classes: int = 10, jobs: int = 0, large: bool = False) -> dict:
    """Create (or reuse) the corpus; return its size and mean file size."""
    marker = os.path.join(root, f".done-{n_images}-{n_classes}" + ("-large" if large else ""))
    if not os.path.exists(marker):
        for c in range(n_classes):
            os.makedirs(os.path.join(root, f"class{c:03d}"), exist_ok=True)
        jobs = jobs or min(16, os.cpu_count() or 1)
        chunks = [(root, i, min(n_images, i + 256), n_classes, large) for i in range(0, n_images, 256)]
        with ProcessPoolExecutor(jobs) as ex:
            sum(ex.map(_make, chunks))
        open(marker, "w").close()
    sizes = [e.stat().st_size for c in os.scandir(root) if c.is_dir() for e in os.scandir(c.path)]
    return {"root": root, "images": len(sizes), "classes": n_classes,
            "mean_file_kb": round(sum(sizes) / max(1, len(sizes)) / 1024, 1)}


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", help="folder to create the ImageFolder in (reused when already made)")
    p.add_argument("--images", type=int, default=8192, help="number of JPEGs")
    p.add_argument("--classes", type=int, default=10, help="number of class folders")
    p.add_argument("--large", action="store_true", help="camera-sized photos (shorter side 1000-1300 px)")
    a = p.parse_args(argv)
    print(make_corpus(a.root, a.images, a.classes, large=a.large))


if __name__ == "__main__":
    main()
