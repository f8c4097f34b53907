"""Small COCO- and VOC-format detection and segmentation sets made from photographs."""
from __future__ import annotations

import json
import os
from typing import List

import numpy as np
from photos import photographs
from PIL import Image


def _boxes(rng: np.random.Generator, w: int, h: int, n: int) -> List[List[float]]:
    out = []
    for _ in range(n):
        bw, bh = rng.uniform(0.1, 0.6) * w, rng.uniform(0.1, 0.6) * h
        x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        out.append([round(x, 2), round(y, 2), round(bw, 2), round(bh, 2)])
    return out


def make_coco(root: str, n: int = 12, seed: int = 7, empty: bool = False, large: bool = False) -> str:
    """``root/images/*.jpg`` and ``root/annotations.json``: photographs cropped and resized to
    sizes of their own, 1-4 objects each (boxes xywh, polygons, no crowds), one image's boxes
    degenerate (zero width); with ``empty``, the second image has no objects (the references
    filter such images out of training sets); ``large``: COCO's sizes (about 640 x 480). Returns the
    annotation file's path."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    images, annotations = [], []
    for i in range(n):
        src = photos[i % len(photos)]
        h0, w0 = src.shape[:2]
        s = rng.uniform(0.6, 1.0)
        ch, cw = int(h0 * s), int(w0 * s)
        y0, x0 = rng.integers(0, h0 - ch + 1), rng.integers(0, w0 - cw + 1)
        w, h = (int(rng.integers(560, 641)), int(rng.integers(420, 481))) if large else (
            int(rng.integers(200, 360)), int(rng.integers(160, 300)))
        Image.fromarray(src[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BILINEAR).save(
            os.path.join(root, "images", f"{i:04d}.jpg"), quality=90)
        images.append({"id": i + 1, "file_name": f"{i:04d}.jpg", "width": w, "height": h})
        count = 0 if empty and i == 1 else int(rng.integers(1, 5))
        for box in _boxes(rng, w, h, count):
            x, y, bw, bh = box
            if i == 2:
                bw = 0.0  # degenerate: SanitizeBoundingBoxes and ConvertCocoPolysToMask drop it
            polygon = [x, y, x + bw, y, x + bw * 0.8, y + bh, x, y + bh * 0.7]
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": int(rng.integers(1, 4)),
                                "bbox": [x, y, bw, bh], "area": float(bw * bh), "iscrowd": 0,
                                "segmentation": [[round(v, 2) for v in polygon]]})
    categories = [{"id": c, "name": f"class{c}", "supercategory": "thing"} for c in (1, 2, 3)]
    path = os.path.join(root, "annotations.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return path


def make_voc(root: str, n: int = 8, seed: int = 11) -> str:
    """A VOC2012-layout segmentation set (``VOCdevkit/VOC2012``: JPEGImages, palette PNG masks in
    SegmentationClass with 255 borders, ImageSets/Segmentation/train.txt). Returns ``root``."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    base = os.path.join(root, "VOCdevkit", "VOC2012")
    for sub in ("JPEGImages", "SegmentationClass", os.path.join("ImageSets", "Segmentation")):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    names = []
    palette = [v for c in range(256) for v in ((c * 37) % 256, (c * 91) % 256, (c * 53) % 256)]
    for i in range(n):
        src = photos[i % len(photos)]
        w, h = int(rng.integers(200, 360)), int(rng.integers(160, 300))
        Image.fromarray(src).resize((w, h), Image.BILINEAR).save(os.path.join(base, "JPEGImages", f"{i:06d}.jpg"),
                                                                 quality=90)
        mask = np.zeros((h, w), dtype=np.uint8)
        for _ in range(int(rng.integers(1, 4))):
            x, y, bw, bh = (int(v) for v in _boxes(rng, w, h, 1)[0])
            mask[y:y + bh, x:x + bw] = int(rng.integers(1, 21))
            mask[y:y + bh, x:x + 2] = 255  # VOC's "void" outline
        m = Image.fromarray(mask, mode="P")
        m.putpalette(palette)
        m.save(os.path.join(base, "SegmentationClass", f"{i:06d}.png"))
        names.append(f"{i:06d}")
    with open(os.path.join(base, "ImageSets", "Segmentation", "train.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    return root
