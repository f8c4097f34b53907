"""A training run, many epochs: an unchanged training loop with a model step (ResNet-18, AMP,
channels_last, SGD) for every epoch of each recipe, plain torchvision and autoproxy, with the
DataLoader's defaults (fork, workers not persistent: every epoch forks new workers).

Per epoch it records the rate (steady state inside the epoch: batches [w, B - w) timed, the
queues full at both ends; and the whole epoch, worker start included), the main process's RSS
(after ``malloc_trim``), GPU memory (PyTorch's allocations and the device's used memory, which
includes DALI's pools), open file descriptors and processes left after the epoch. The summary
compares the last third of the epochs with the first third (after ``--settle`` epochs): a rate
decline beyond plain's own spread, or memory that keeps growing, is a finding.

Recipes: ``train`` (RandomResizedCrop, flip, ToTensor, Normalize), ``color_jitter`` (the same
with ColorJitter(0.4, 0.4, 0.4, 0.1)), ``rand_augment`` (RandAugment on PIL images), ``detection``
(the detection references' v2 hflip preset on a COCO-format set, batch 8, images padded into one
tensor as torchvision's detection models batch them) and, from their repositories' own files
(``*_DIR`` as ``dataset_shapes_benchmark.py`` names them), ``dino``, ``dinov2``, ``moco_v3``, ``swav``:
every view of a sample goes through the model.

    python benchmarks/training_soak.py --recipes train color_jitter rand_augment detection \\
        --epochs 20 --out benchmarks/results/training_soak_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from soak import rss_mb  # noqa: E402  (RSS after malloc_trim, as the resource soak reads it)

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
# batch size and batches per epoch: short epochs, long enough for a steady window inside each
RECIPES = {"train": (64, 40), "color_jitter": (64, 40), "rand_augment": (64, 40), "detection": (8, 48),
           "dino": (32, 24), "dinov2": (32, 24), "moco_v3": (64, 30), "swav": (32, 24)}


def _classification_chain(name: str):
    import torchvision.transforms as T
    middle = {"train": [], "color_jitter": [T.ColorJitter(0.4, 0.4, 0.4, 0.1)],
              "rand_augment": [T.RandAugment()]}[name]
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *middle, T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def shape_of(recipe: str, batches: int = 0) -> tuple:
    """(batch size, batches per epoch) of a recipe; ``batches`` overrides the second."""
    batch, default = RECIPES[recipe]
    return batch, batches or default


def make_loader(recipe: str, corpus: str, coco: str, workers: int, batches: int = 0):
    """The recipe's DataLoader with the DataLoader's defaults (shuffle, pinned memory)."""
    import torch
    import torchvision
    batch, batches = shape_of(recipe, batches)
    n = batch * batches
    pin = torch.cuda.is_available()
    if recipe == "detection":
        from detection_benchmark import loader_for
        return loader_for("detection:hflip", coco, n, workers, batch)
    if recipe in ("train", "color_jitter", "rand_augment"):
        ds = torchvision.datasets.ImageFolder(corpus, _classification_chain(recipe))
    else:
        from dataset_shapes_benchmark import ssl_recipe
        made = ssl_recipe(recipe, root=corpus)
        ds = made if recipe == "swav" else torchvision.datasets.ImageFolder(corpus, made)
    ds = torch.utils.data.Subset(ds, range(n))
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                       pin_memory=pin)


def views_of(batch):
    """The batch's image tensors (one per view or, for detection, per image) and its labels (or None)."""
    import torch
    if isinstance(batch, tuple) and batch and isinstance(batch[1], tuple) and isinstance(batch[1][0], dict):
        return [list(batch[0])], None  # detection: images of their own sizes
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], dict) and "global_crops" in batch[0]:
        return list(batch[0]["global_crops"]) + list(batch[0]["local_crops"]), None  # DINOv2's collate-free dict
    if isinstance(batch, list) and batch and all(isinstance(v, torch.Tensor) and v.ndim == 4 for v in batch):
        return list(batch), None  # SwAV: crops, no labels
    x, y = batch[0], batch[1]
    return (list(x) if isinstance(x, list) else [x]), y


def padded(images):
    """Images of their own sizes in one zero-padded batch, as torchvision's detection models do."""
    import torch
    h, w = max(i.shape[-2] for i in images), max(i.shape[-1] for i in images)
    out = torch.zeros(len(images), 3, h, w, device="cuda" if torch.cuda.is_available() else "cpu")
    for k, img in enumerate(images):
        out[k, :, :img.shape[-2], :img.shape[-1]].copy_(img, non_blocking=True)
    return out


def child(recipe: str, mode: str, a) -> None:
    """One arm: the training loop, one JSON line per epoch on stdout."""
    import multiprocessing

    import torch
    import torchvision
    cuda = torch.cuda.is_available()
    if mode == "autoproxy":
        import dali_autoproxy
        dali_autoproxy.enable(device="gpu" if cuda else "cpu", log_level="WARNING")
    dev = torch.device("cuda" if cuda else "cpu")
    model = torchvision.models.resnet18(num_classes=10).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(enabled=cuda)
    loader = make_loader(recipe, a.corpus, a.coco, a.workers, a.batches)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step(batch) -> int:
        views, y = views_of(batch)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=cuda):
            loss = 0.0
            for v in views:
                x = padded(v) if isinstance(v, list) else v.to(dev, non_blocking=True)
                out = model(x.contiguous(memory_format=torch.channels_last))
                target = y.to(dev, non_blocking=True) if y is not None else torch.zeros(len(out), dtype=torch.long,
                                                                                          device=dev)
                loss = loss + torch.nn.functional.cross_entropy(out.float(), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return len(views[0])

    for epoch in range(a.epochs):
        n_batches = len(loader)
        w = min(a.workers, n_batches // 4)
        sync()
        t0 = time.perf_counter()
        samples = steady_samples = 0
        t_first = t_start = t_stop = None
        for i, batch in enumerate(loader):
            if i == 0:
                t_first = time.perf_counter() - t0
            if i == w:
                sync()
                t_start = time.perf_counter()
            if i == n_batches - w:
                sync()
                t_stop = time.perf_counter()
            k = step(batch)
            samples += k
            if w <= i < n_batches - w:
                steady_samples += k
        sync()
        t_end = time.perf_counter()
        t_stop = t_stop or t_end  # an epoch too short for a window at its end (w = 0)
        print(json.dumps({
            "epoch": epoch, "samples": samples, "epoch_s": round(t_end - t0, 3),
            "first_batch_s": round(t_first, 3),
            "epoch_samples_per_s": round(samples / (t_end - t0), 1),
            "steady_samples_per_s": round(steady_samples / (t_stop - t_start), 1),
            "rss_mb": round(rss_mb(), 1),
            "gpu_torch_mb": round(torch.cuda.memory_allocated() / 2**20, 1) if cuda else 0.0,
            "gpu_used_mb": round((lambda f, t: (t - f) / 2**20)(*torch.cuda.mem_get_info()), 1) if cuda else 0.0,
            "fds": len(os.listdir("/proc/self/fd")), "processes_left": len(multiprocessing.active_children())}),
            flush=True)
    if mode == "autoproxy":
        import dali_autoproxy
        rep = dali_autoproxy.report()
        print(json.dumps({"report": rep[-1] if rep else None}, default=str), flush=True)


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize_arm(epochs: list, settle: int) -> dict:
    """Rates and memory of the first and last thirds of the settled epochs."""
    rows = epochs[settle:] if len(epochs) > settle + 2 else epochs
    third = max(1, len(rows) // 3)
    first, last = rows[:third], rows[-third:]
    rates = [r["steady_samples_per_s"] for r in rows]
    med = _median(rates)
    return {
        "epochs": len(epochs),
        "steady_samples_per_s": round(med, 1),
        "spread": [round(min(rates) / med, 3), round(max(rates) / med, 3)],
        "last_over_first_third": round(_median([r["steady_samples_per_s"] for r in last])
                                       / _median([r["steady_samples_per_s"] for r in first]), 3),
        "epoch_s": round(_median([r["epoch_s"] for r in rows]), 2),
        "first_batch_s": round(_median([r["first_batch_s"] for r in rows]), 3),
        "rss_growth_mb": round(_median([r["rss_mb"] for r in last]) - _median([r["rss_mb"] for r in first]), 1),
        "gpu_used_growth_mb": round(max(r["gpu_used_mb"] for r in rows) - rows[0]["gpu_used_mb"], 1),
        "gpu_torch_growth_mb": round(max(r["gpu_torch_mb"] for r in rows) - rows[0]["gpu_torch_mb"], 1),
        "fd_growth": max(r["fds"] for r in rows) - rows[0]["fds"],
        "processes_left": max(r["processes_left"] for r in epochs),
    }


def table(results: list) -> str:
    lines = ["| recipe | mode | epochs | steady samples/s (min-max of epochs) | last / first third | epoch s "
             "| first batch s | RSS growth MB | GPU used growth MB | fds growth | processes left | / plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    plain = {r["recipe"]: r for r in results if r["mode"] == "plain" and "summary" in r}
    for r in results:
        if "summary" not in r:
            lines.append(f"| {r['recipe']} | {r['mode']} | FAILED: {r.get('error', '')[-200:]!r} |")
            continue
        s = r["summary"]
        med = s["steady_samples_per_s"]
        lo, hi = (round(med * x) for x in s["spread"])
        ref = plain.get(r["recipe"])
        ratio = f"{med / ref['summary']['steady_samples_per_s']:.2f}x" if ref and r["mode"] != "plain" else ""
        lines.append(f"| {r['recipe']} | {r['mode']} | {s['epochs']} | {med:,.0f} ({lo:,}-{hi:,}) "
                     f"| {s['last_over_first_third']:.3f} | {s['epoch_s']} | {s['first_batch_s']} "
                     f"| {s['rss_growth_mb']:+.1f} | {s['gpu_used_growth_mb']:+.1f} | {s['fd_growth']:+d} "
                     f"| {s['processes_left']} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", nargs="+", default=["train", "color_jitter", "rand_augment", "detection"],
                    choices=sorted(RECIPES))
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batches", type=int, default=0, help="batches per epoch (default: the recipe's own)")
    ap.add_argument("--settle", type=int, default=2, help="epochs left out of the trend (default 2)")
    ap.add_argument("--data", default=None, help="where the corpora are made (default: a temporary folder)")
    ap.add_argument("--out", default=None, help="results JSON (a Markdown table beside it)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per arm")
    ap.add_argument("--child", nargs=2, metavar=("RECIPE", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--coco", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child, a)
        return 0
    from corpus import make_corpus
    from detection_benchmark import make_set
    tmp = tempfile.TemporaryDirectory() if a.data is None else None
    data = a.data or tmp.name
    corpus, coco = os.path.join(data, "corpus"), os.path.join(data, "coco")
    make_corpus(corpus, max(b * n for b, n in (shape_of(r, a.batches) for r in a.recipes)))
    if "detection" in a.recipes:
        make_set(coco, (lambda b, n: b * n)(*shape_of("detection", a.batches)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DALI_AUTOPROXY")}
    results = []
    for recipe in a.recipes:
        for mode in ("plain", "autoproxy"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", recipe, mode, "--corpus", corpus,
                   "--coco", coco, "--epochs", str(a.epochs), "--workers", str(a.workers), "--batches", str(a.batches)]
            batch, batches = shape_of(recipe, a.batches)
            row = {"recipe": recipe, "mode": mode, "batch": batch, "samples_per_epoch": batch * batches,
                   "workers": a.workers}
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
                lines = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
                row["epochs"] = [ln for ln in lines if "epoch" in ln]
                row["report"] = next((ln["report"] for ln in lines if "report" in ln), None)
                if res.returncode != 0 or len(row["epochs"]) < a.epochs:
                    row["error"] = res.stderr[-2000:]
                else:
                    row["summary"] = summarize_arm(row["epochs"], a.settle)
            except subprocess.TimeoutExpired as exc:
                row["error"] = f"timed out after {a.timeout} s: {(exc.stderr or b'')[-500:]!r}"
            print(json.dumps({k: v for k, v in row.items() if k != "epochs"}, default=str), flush=True)
            results.append(row)
    md = table(results)
    print(md)
    if a.out:
        import platform

        import torch
        from results_io import measured_commit, write_results
        commit = measured_commit()
        payload = {"commit": commit, "method": (
            "per arm, one process: ResNet-18 (AMP float16, channels_last, SGD) trained on every view of every "
            "batch, a DataLoader with its defaults (fork, workers not persistent, shuffle, pin_memory, drop_last) "
            "iterated once per epoch; steady samples/s: batches [w, B - w) of each epoch, w = min(workers, B/4), "
            "the GPU synchronised at both ends; trend: median of the last third of the epochs over the first "
            f"third, after {a.settle} settling epochs"),
            "machine": {"python": platform.python_version(), "torch": torch.__version__,
                        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                        "cpus": os.cpu_count()},
            "options": {"epochs": a.epochs, "workers": a.workers,
                        "autoproxy": "dali_autoproxy.enable(device='gpu') before the loader, defaults otherwise"},
            "results": results}
        write_results(a.out, payload, f"# Training soak ({commit[:12]})\n\n{payload['method']}.\n\n{md}")
    failed = [r for r in results if "summary" not in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
