"""Samples/s of the recipes the main process must keep up with, plain torchvision and autoproxy
side by side in one run, each arm in a process of its own, two epochs each.

Recipes (their own chains and loaders, as ``detection_benchmark`` and ``dataset_shapes_benchmark``
build them):
  segmentation   the segmentation references' v2 train preset shape on small images: RandomResize
                 48-192, flip, RandomCrop 64 (pad_if_needed, fill 255 for the masks), PILToTensor,
                 ToDtype, Normalize, with each image's class mask
  detection      the detection references' v2 hflip preset with boxes, ``tuple(zip(*batch))`` collate
  dino           DINO's DataAugmentationDINO from its main_dino.py (2 x 224 + 8 x 96); DINO_DIR
  swav           SwAV's MultiCropDataset (2 x 224 + 6 x 96); SWAV_DIR
  train          ImageFolder with RandomResizedCrop 224, flip, ToTensor, Normalize, a long epoch drawn
                 by a RandomSampler
  augmix         the classification references' ``--auto-augment augmix`` train preset (PIL backend):
                 RandomResizedCrop 176, flip, AugMix (bilinear), PILToTensor, ConvertImageDtype,
                 Normalize, on the train recipe's images and sampler
  augmix_v2      the same preset with the v2 API (ToImage first: AugMix on uint8 tensors)

A sample counts once whatever its views. Steady state: batches [w, B - w) of each epoch timed, w
at least autoproxy's look-ahead + 1 and twice the workers (at most a quarter of the epoch), the
GPU synchronised at both ends; ``samples_per_s`` is the second epoch's (the first also builds
the pipelines of plans it meets), ``epoch_samples_per_s`` both. Every DataLoader option is its
default but those named (fork, workers not persistent).

    python benchmarks/recipes_steady.py --out benchmarks/results/recipes_steady_h100.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# autoproxy's modes: enable()'s options beyond the device (the defaults: torchvision's results)
MODES_OPTIONS = {"autoproxy": {}, "autoproxy_dali_resize": {"resize": "dali"}, "autoproxy_batch_a_run": {}}
# modes that differ from the default by a module setting instead of an option
MODES_SETTINGS = {"autoproxy_batch_a_run": ("dali_autoproxy.main.runs", "RUN_SAMPLES", 1)}
# (recipe, batch, workers): the batch sizes each recipe trains at
DEFAULT_ARMS = [("segmentation", 2, 8), ("segmentation", 8, 8), ("detection", 2, 8), ("detection", 8, 8),
                ("dino", 32, 8), ("swav", 32, 8), ("train", 128, 2), ("train", 128, 8)]


def segmentation_dataset(root: str, n: int):
    import torch
    import torchvision.transforms.v2 as T
    from detection_benchmark import Segmentation
    from torchvision import tv_tensors
    ds = Segmentation(root, n)
    ds.transforms = T.Compose([
        T.RandomResize(min_size=48, max_size=192), T.RandomHorizontalFlip(0.5),
        T.RandomCrop(64, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
        T.PILToTensor(), T.ToDtype(torch.float, scale=True),
        T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), T.ToPureTensor()])
    return ds


def augmix_chain(api: str):
    """The references' ClassificationPresetTrain with auto_augment_policy="augmix", interpolation bilinear."""
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    if api == "v1":
        return T.Compose([T.RandomResizedCrop(176, antialias=True), T.RandomHorizontalFlip(0.5),
                          T.AugMix(interpolation=T.InterpolationMode.BILINEAR, severity=3), T.PILToTensor(),
                          T.ConvertImageDtype(torch.float), T.Normalize(mean, std)])
    return v2.Compose([v2.ToImage(), v2.RandomResizedCrop(176, antialias=True), v2.RandomHorizontalFlip(0.5),
                       v2.AugMix(interpolation=v2.InterpolationMode.BILINEAR, severity=3),
                       v2.ToDtype(torch.float, scale=True), v2.Normalize(mean, std), v2.ToPureTensor()])


def make_loader(recipe: str, batch: int, workers: int, images: int, args):
    import torch
    import torchvision
    pin = torch.cuda.is_available()
    if recipe == "segmentation":
        return torch.utils.data.DataLoader(segmentation_dataset(args.coco, images), batch_size=batch, shuffle=True,
                                           num_workers=workers, drop_last=True, pin_memory=pin)
    if recipe == "detection":
        from detection_benchmark import loader_for
        return loader_for("detection:hflip", args.coco, images, workers, batch)
    if recipe in ("train", "augmix", "augmix_v2"):
        from dataset_shapes_benchmark import train_chain
        chain = train_chain() if recipe == "train" else augmix_chain("v2" if recipe == "augmix_v2" else "v1")
        ds = torchvision.datasets.ImageFolder(args.corpus, transform=chain)
        sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=images)
        return torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                                           drop_last=True, pin_memory=pin)
    from dataset_shapes_benchmark import make_loader as shapes_loader
    return shapes_loader(recipe, args.corpus, workers, batch)


def views_of(recipe: str, batch):
    from dataset_shapes_benchmark import images_in
    if recipe in ("segmentation", "detection"):
        images = batch[0]
        return list(images) if isinstance(images, tuple) else [images]
    return images_in(batch)


def run_arm(recipe: str, mode: str, batch: int, workers: int, images: int, args) -> dict:
    """One arm in this process: two epochs, each one's steady-state samples/s."""
    import torch

    import dali_autoproxy
    from dali_autoproxy.config import resolve_options
    from dali_autoproxy.main.runs import lookahead_batches
    torch.multiprocessing.set_sharing_strategy("file_system")  # many small target tensors per batch
    if mode in MODES_SETTINGS:  # one loader batch per DALI run (none gathered): the comparison's arm
        import importlib
        module, name, value = MODES_SETTINGS[mode]
        setattr(importlib.import_module(module), name, value)
    if mode in MODES_OPTIONS:
        dali_autoproxy.enable(device="gpu" if torch.cuda.is_available() else "cpu", log_level="WARNING",
                              **MODES_OPTIONS[mode])
    loader = make_loader(recipe, batch, workers, images, args)
    cuda = torch.cuda.is_available()
    total = len(loader)
    warm = max(1, min(max(lookahead_batches(resolve_options().lookahead, batch) + 1, 2 * workers), total // 4))
    rates, first = [], None
    t_start = time.perf_counter()
    for _ in range(2):
        n, t0, dt = 0, None, None
        for i, b in enumerate(loader):
            if first is None:
                first = time.perf_counter() - t_start
            views = views_of(recipe, b)
            if cuda:
                views = [v.cuda(non_blocking=True) for v in views]
            if i == warm or i == total - warm:
                if cuda:
                    torch.cuda.synchronize()
                if i == warm:
                    t0 = time.perf_counter()
                else:
                    dt = time.perf_counter() - t0
            if warm <= i < total - warm:
                n += views[0].shape[0]
        if dt is None:  # an epoch too short for a window: to its end
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        rates.append(round(n / dt, 1) if n else 0.0)
    row = {"recipe": recipe, "mode": mode, "workers": workers, "batch": batch, "samples_per_s": rates[-1],
           "epoch_samples_per_s": rates, "epoch_batches": total, "timed_batches": [warm, total - warm],
           "first_batch_s": round(first, 3)}
    if mode in MODES_OPTIONS:
        rep = dali_autoproxy.report()[-1]
        row.update(proxied=rep["proxied"], decode=rep["decode"], reason=rep["reason"])
    return row


def _error_cell(row: dict) -> str:
    """An arm's error as one table cell: its last line (the exception), without pipes."""
    lines = [line.strip() for line in row.get("error", "-").splitlines() if line.strip()]
    return (lines[-1] if lines else "-").replace("|", "/")[:160]


def table(rows: list) -> str:
    modes = [m for m in MODES_OPTIONS if any(r["mode"] == m for r in rows)]
    lines = ["| recipe | batch | workers | plain samples/s | " + " | ".join(
        f"{m} samples/s | {m} / plain" for m in modes) + " | first batch (plain / " + " / ".join(modes) + ") |",
        "|---|---|---|---|" + "---|---|" * len(modes) + "---|"]
    keys = sorted({(r["recipe"], r["batch"], r["workers"]) for r in rows}, key=lambda k: [r for r in rows
                  if (r["recipe"], r["batch"], r["workers"]) == k][0]["order"])
    for recipe, batch, workers in keys:
        arm = {r["mode"]: r for r in rows if (r["recipe"], r["batch"], r["workers"]) == (recipe, batch, workers)}
        plain = arm.get("torchvision", {})
        p = plain.get("samples_per_s")
        cells, firsts = [], [f"{plain.get('first_batch_s', '-')} s"]
        for m in modes:
            auto = arm.get(m, {})
            a = auto.get("samples_per_s")
            cells += [str(a or _error_cell(auto)), f"{a / p:.2f}x" if p and a else "-"]
            firsts.append(f"{auto.get('first_batch_s', '-')} s")
        lines.append(f"| {recipe} | {batch} | {workers} | {p or _error_cell(plain)} | " + " | ".join(cells)
                     + " | " + " / ".join(firsts) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coco", default="/tmp/coco_bench", help="the detection set (made once, 640 x 480 JPEGs)")
    ap.add_argument("--corpus", default="/tmp/corpus", help="the photograph corpus (made once)")
    ap.add_argument("--images", type=int, default=2048, help="images in each set, and an autoproxy epoch")
    ap.add_argument("--plain-images", type=int, default=1024, help="plain torchvision's (shorter) epoch")
    ap.add_argument("--train-samples", type=int, default=32768, help="the train recipe's autoproxy epoch")
    ap.add_argument("--arms", nargs="+", default=None, metavar="RECIPE:BATCH:WORKERS")
    ap.add_argument("--modes", nargs="+", default=["torchvision", "autoproxy"],
                    choices=["torchvision", *MODES_OPTIONS], help="run in this order within each arm")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per arm")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep-other-arms", action="store_true",
                    help="keep the rows --out holds of arms not run now, where it measured the same commit")
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # one arm, in its own process
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    if a.arm:
        recipe, mode, batch, workers, images = a.arm.split(":")
        print("ROW " + json.dumps(run_arm(recipe, mode, int(batch), int(workers), int(images), a)), flush=True)
        return 0
    from corpus import make_corpus
    from detection_benchmark import make_set
    make_set(a.coco, a.images)
    make_corpus(a.corpus, a.images)
    arms = [tuple(int(v) if k else v for k, v in enumerate(s.split(":"))) for s in a.arms] if a.arms else DEFAULT_ARMS
    rows = kept_rows(a.out, arms) if a.keep_other_arms else []
    for order, (recipe, batch, workers) in enumerate(arms, start=1 + max((r["order"] for r in rows), default=-1)):
        for mode in a.modes:
            if recipe == "train":
                images = a.train_samples if mode != "torchvision" else a.train_samples // (8 if workers < 4 else 4)
            else:
                images = a.images if mode != "torchvision" else a.plain_images
            cmd = [sys.executable, os.path.abspath(__file__), "--arm", f"{recipe}:{mode}:{batch}:{workers}:{images}",
                   "--coco", a.coco, "--corpus", a.corpus]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
                row = json.loads(found[0]) if found else {"recipe": recipe, "mode": mode, "workers": workers,
                                                          "batch": batch, "error": done.stderr[-600:]}
            except subprocess.TimeoutExpired:
                row = {"recipe": recipe, "mode": mode, "workers": workers, "batch": batch,
                       "error": f"timed out after {a.timeout} s"}
            row["order"] = order
            rows.append(row)
            print(json.dumps(row), flush=True)
            if a.out:
                save(a.out, rows, a.modes)
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


def kept_rows(out: str, arms: list) -> list:
    """The rows of ``out`` for arms other than ``arms``, if it measured this commit (one set per commit)."""
    if not out or not os.path.exists(out):
        return []
    from results_io import measured_commit
    with open(out) as f:
        old = json.load(f)
    if old.get("commit") != measured_commit():
        return []
    return [r for r in old["results"] if (r["recipe"], r["batch"], r["workers"]) not in set(arms)]


def save(out: str, rows: list, modes: list) -> None:
    import platform

    import torch
    from results_io import measured_commit, write_results
    commit = measured_commit()
    modes = [m for m in ["torchvision", *MODES_OPTIONS] if m in modes or any(r["mode"] == m for r in rows)]
    method = ("each arm one process, two epochs of a DataLoader with its defaults but those named (fork, workers "
              "not persistent, pin_memory where there is a GPU); steady state: batches [w, B - w) of each epoch, "
              "w = max(look-ahead + 1, 2 x workers) at most B/4, the GPU synchronised at both ends, every view moved "
              "to the GPU; samples_per_s: the second epoch's, a sample counted once whatever its views; plain "
              "torchvision runs a shorter epoch (its rate does not depend on the epoch's length)")
    payload = {"commit": commit, "method": method, "modes": modes,
               "machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                           "cpus": os.cpu_count()},
               "options": {"torchvision": "plain torchvision, no autoproxy",
                           **{m: ("dali_autoproxy.enable(device='gpu' where there is one, else 'cpu', "
                                  f"log_level='WARNING', **{opts!r}), defaults otherwise"
                                  + (" and {0}.{1} = {2!r}".format(*MODES_SETTINGS[m]) if m in MODES_SETTINGS else ""))
                              for m, opts in MODES_OPTIONS.items() if m in modes}},
               "results": rows}
    write_results(out, payload, f"# Recipes in steady state ({commit[:12]})\n\n{method}.\n\n{table(rows)}")


if __name__ == "__main__":
    sys.exit(main())
