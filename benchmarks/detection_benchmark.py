"""Detection and segmentation loaders, plain torchvision against autoproxy, in one run.

    python benchmarks/detection_benchmark.py --data /tmp/coco_bench --images 4096 --workers 8

A COCO-format set of COCO-sized JPEGs (photographs cropped and resized to about 640 x 480, 1-6
boxes each) read by torchvision's ``CocoDetection`` through ``wrap_dataset_for_transforms_v2``
with the detection references' v2 presets (PIL backend, or the one a task names:
``detection:ssd:tensor``; ``tuple(zip(*batch))`` collate), and the
same images with one mask each for the segmentation references' v2 preset (random resize, flip,
padded random crop to 480, normalise). Steady state: batches [w, B - w) of a long epoch timed,
the modes interleaved per repeat; the median and the spread reported.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_benchmark import ThreadClock, auto_warmup  # noqa: E402
from results_io import write_results  # noqa: E402

MEAN = (123.0, 117.0, 104.0)


def make_set(root: str, n: int, seed: int = 3) -> str:
    """``root/images`` (JPEGs about 640 x 480), ``root/masks`` (one class mask per image, PNG) and
    ``root/annotations.json``; made once."""
    path = os.path.join(root, "annotations.json")
    if os.path.exists(path):
        return path
    from skimage import data
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.immunohistochemistry()]
    rng = np.random.default_rng(seed)
    for sub in ("images", "masks"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    images, annotations = [], []
    for i in range(n):
        src = photos[i % len(photos)]
        h0, w0 = src.shape[:2]
        s = rng.uniform(0.6, 1.0)
        ch, cw = int(h0 * s), int(w0 * s)
        y0, x0 = rng.integers(0, h0 - ch + 1), rng.integers(0, w0 - cw + 1)
        w, h = int(rng.integers(560, 641)), int(rng.integers(420, 481))
        Image.fromarray(src[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BILINEAR).save(
            os.path.join(root, "images", f"{i:06d}.jpg"), quality=90)
        mask = np.zeros((h, w), dtype=np.uint8)
        images.append({"id": i + 1, "file_name": f"{i:06d}.jpg", "width": w, "height": h})
        for _ in range(int(rng.integers(1, 7))):
            bw, bh = rng.uniform(0.1, 0.6) * w, rng.uniform(0.1, 0.6) * h
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            label = int(rng.integers(1, 21))
            mask[int(y):int(y + bh), int(x):int(x + bw)] = label
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": label,
                                "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0,
                                "segmentation": [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]})
        Image.fromarray(mask, mode="L").save(os.path.join(root, "masks", f"{i:06d}.png"))
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations,
                   "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 21)]}, f)
    return path


def detection_preset(augmentation: str, backend: str = "pil"):
    """The detection references' ``DetectionPresetTrain(..., backend=backend, use_v2=True)``."""
    import torchvision.transforms.v2 as T
    from torchvision import tv_tensors
    first = {"pil": [], "tensor": [T.PILToTensor()], "tv_tensor": [T.ToImage()]}[backend]
    head = first + {
        "hflip": [T.RandomHorizontalFlip(p=0.5)],
        "multiscale": [T.RandomShortestSize(min_size=(480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800),
                                            max_size=1333), T.RandomHorizontalFlip(p=0.5)],
        "ssd": [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=defaultdict(lambda: MEAN, {tv_tensors.Mask: 0})),
                T.RandomIoUCrop(), T.RandomHorizontalFlip(p=0.5)],
        "ssdlite": [T.RandomIoUCrop(), T.RandomHorizontalFlip(p=0.5)],
    }[augmentation]
    return T.Compose(head + [T.ToImage()] * (backend == "pil") + [T.ToDtype(torch.float, scale=True),
                             T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
                             T.SanitizeBoundingBoxes(), T.ToPureTensor()])


class Preset:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img, target):
        return self.transforms(img, target)


class Segmentation(torch.utils.data.Dataset):
    """Image and class mask through the segmentation references' v2 preset (``SegmentationPresetTrain``)."""

    def __init__(self, root: str, n: int):
        import torchvision.transforms.v2 as T
        from torchvision import tv_tensors
        self.root, self.n = root, n
        self.transforms = T.Compose([
            T.RandomResize(min_size=260, max_size=1040), T.RandomHorizontalFlip(0.5),
            T.RandomCrop(480, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
            T.PILToTensor(), T.ToDtype(torch.float, scale=True),
            T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), T.ToPureTensor()])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from torchvision import tv_tensors
        from torchvision.transforms.v2.functional import pil_to_tensor
        img = Image.open(os.path.join(self.root, "images", f"{i:06d}.jpg")).convert("RGB")
        mask = tv_tensors.Mask(pil_to_tensor(Image.open(os.path.join(self.root, "masks", f"{i:06d}.png")))[0])
        return self.transforms(img, mask)


def collate_fn(batch):
    return tuple(zip(*batch))


def loader_for(task: str, root: str, n: int, workers: int, batch: int):
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    pin = torch.cuda.is_available()
    if task == "segmentation":
        ds = Segmentation(root, n)
        return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                           drop_last=True, pin_memory=pin)
    ds = CocoDetection(os.path.join(root, "images"), os.path.join(root, "annotations.json"),
                       transforms=Preset(detection_preset(*task.split(":")[1:])))
    ds = torch.utils.data.Subset(wrap_dataset_for_transforms_v2(ds, target_keys=["boxes", "labels", "image_id"]),
                                 range(n))
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                       collate_fn=collate_fn, pin_memory=pin)


def timed(loader, warmup: int) -> float:
    """Images per second over batches [warmup, len - warmup): each image moved to the GPU as a
    training step would (``non_blocking``), the GPU synchronised at both ends of the clock."""
    total, cuda = len(loader), torch.cuda.is_available()
    stop = total - warmup
    n, t0 = 0, None
    for i, (images, _) in enumerate(loader):
        if cuda:
            images = ([x.cuda(non_blocking=True) for x in images] if isinstance(images, tuple)
                      else images.cuda(non_blocking=True))
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        if i == stop:
            break
        if i > warmup:
            n += len(images)
    if cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def run(task: str, mode: str, args) -> dict:
    import dali_autoproxy
    if mode == "autoproxy":
        dali_autoproxy.enable(device="gpu" if torch.cuda.is_available() else "cpu", log_level="WARNING")
    try:
        loader = loader_for(task, args.data, args.images if mode == "autoproxy" else args.plain_images,
                            args.workers, args.batch)
        warmup = auto_warmup(args.workers, len(loader), args.batch) if mode == "autoproxy" else min(2 * args.workers,
                                                                                        len(loader) // 3)
        with ThreadClock(args.thread_times and mode == "autoproxy") as clock:
            rate = timed(loader, warmup)
        rep = dali_autoproxy.report()[-1] if mode == "autoproxy" else {}
        row = {"task": task, "mode": mode, "images_per_s": rate, "proxied": rep.get("proxied"),
               "decode": rep.get("decode"), "reason": rep.get("reason")}
        if clock.enabled:
            row["thread_times"] = clock.summary()
        del loader
        gc.collect()  # the loader's workers and DALI pipelines gone before the next run starts
        return row
    finally:
        dali_autoproxy.disable()


def profile_pipeline(args) -> None:
    """cProfile of the pipeline thread (DALI's feed and outputs, the torch stage) for one epoch of
    ``args.profile``: Python 3.12 allows one profiler per process, so that thread alone."""
    import cProfile
    import io
    import pstats

    from dali_autoproxy.backends.dali import runner
    profiles = []
    loop = runner._PipelineThread._loop

    def profiled(self):
        if profiles:  # one profiler per process (3.12): the first pipeline's thread
            return loop(self)
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            loop(self)
        finally:
            prof.disable()
    runner._PipelineThread._loop = profiled
    try:
        row = run(args.profile, "autoproxy", args)
    finally:
        runner._PipelineThread._loop = loop
    buf = io.StringIO()
    buf.write(json.dumps(row) + "\n")
    if profiles:
        stats = pstats.Stats(profiles[0], stream=buf)
        for extra in profiles[1:]:
            stats.add(extra)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumtime").print_stats(40)
    with open(os.path.splitext(args.out)[0] + ".profile.txt", "w") as f:
        f.write(buf.getvalue())
    print(buf.getvalue()[:3000])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/tmp/coco_bench")
    ap.add_argument("--images", type=int, default=4096, help="images in the set (autoproxy's epoch)")
    ap.add_argument("--plain-images", type=int, default=1024, help="plain torchvision's (shorter) epoch")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tasks", nargs="+", default=["detection:hflip", "detection:ssd", "detection:multiscale",
                                                   "segmentation"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "detection_h200.json"))
    ap.add_argument("--thread-times", action="store_true",
                    help="autoproxy rows: the pipeline thread's time per batch in DALI's outputs and the torch "
                         "stage, and the main thread's busy share (loader_benchmark.ThreadClock)")
    ap.add_argument("--profile", default=None, metavar="TASK",
                    help="only profile autoproxy's pipeline thread on TASK (one epoch): OUT's stem + .profile.txt")
    args = ap.parse_args(argv)
    # every sample's targets are small tensors: file descriptors would run out (both modes alike)
    torch.multiprocessing.set_sharing_strategy("file_system")
    make_set(args.data, args.images)
    if args.profile:
        profile_pipeline(args)
        return
    rows = []
    for _ in range(args.repeat):
        for task in args.tasks:
            for mode in ("torchvision", "autoproxy"):
                rows.append(run(task, mode, args))
                print(json.dumps(rows[-1]), flush=True)
    lines = [f"# Detection and segmentation loaders ({args.workers} workers, batch {args.batch}, "
             f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'})", "",
             "| task | torchvision img/s | autoproxy img/s | ratio (median) | ratio range | decode |",
             "|---|---|---|---|---|---|"]
    for task in args.tasks:
        tv = [r["images_per_s"] for r in rows if r["task"] == task and r["mode"] == "torchvision"]
        ap_ = [r for r in rows if r["task"] == task and r["mode"] == "autoproxy"]
        ratios = [a["images_per_s"] / t for a, t in zip(ap_, tv)]
        fast = statistics.median(r["images_per_s"] for r in ap_)
        lines.append(f"| {task} | {statistics.median(tv):,.0f} | {fast:,.0f} | {statistics.median(ratios):.2f}x | "
                     f"{min(ratios):.2f}-{max(ratios):.2f}x | {ap_[-1]['decode']} |")
    table = "\n".join(lines)
    print(table)
    write_results(args.out, {"args": vars(args), "rows": rows}, table)


if __name__ == "__main__":
    main()
