"""Images/s of the dataset shapes real projects use, plain and with autoproxy, beside the
textbook ImageFolder loader, measured side by side in one run (modes interleaved per repeat).

Shapes (same JPEG corpus; the train chain RandomResizedCrop 224, flip, ToTensor, Normalize):
  imagefolder   torchvision's ImageFolder, the chain in ``transform`` (the reference shape)
  path          an own Dataset: a file list, Image.open(path).convert("RGB"), the chain in ``self.tf``
  dict          the same, returning {"image": ..., "label": ...}
  bytes         the same from encoded bytes held in memory (Image.open(io.BytesIO(b)))
  two_view      ImageFolder with a wrapper returning [chain(x), chain(x)] (MoCo, SimCLR, BYOL)
  timm          timm's create_dataset + create_loader(use_prefetcher=False) with its own train
                transforms (timm's RandomResizedCropAndInterpolation, flip, ToTensor, Normalize)
Recipes (their own chains and loaders):
  mixup         ImageFolder + the train chain, a collate_fn as torchvision's classification references
                build it: default_collate, then v2.RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])
  webdataset    tar shards of the corpus: WebDataset(urls).decode("pil").to_tuple("jpg", "cls")
                .map_tuple(train chain, identity), an IterableDataset split by worker
  timm_prefetch timm's create_loader(use_prefetcher=True) (its training script's default): uint8
                batches by fast_collate, normalised on the GPU by its PrefetchLoader
  randaug_v2    the v2 recipe on tensors: ToImage, RandomResizedCrop 224, flip, RandAugment,
                ToDtype(float32, scale=True), Normalize
  ta_wide       the references' ClassificationPresetTrain with --auto-augment ta_wide: RandomResizedCrop
                176, flip, TrivialAugmentWide(BILINEAR), PILToTensor, ConvertImageDtype, Normalize,
                RandomErasing(0.1), on PIL images
  moco_v3       MoCo v3's two augmentations as main_moco.py builds them, with its own moco/loader.py
                (GaussianBlur, Solarize, TwoCropsTransform); set MOCO_V3_DIR to a checkout
  dino          DINO's DataAugmentationDINO from its main_dino.py (2 x 224 + 8 x 96, its utils.py
                GaussianBlur and Solarization); set DINO_DIR to a checkout
  dinov2        DINOv2's DataAugmentationDINO (dinov2/data/augmentations.py, transforms.py: 2 x 224 +
                8 x 96, a geometric chain handing its image to colour chains, its RandomApply blur);
                set DINOV2_DIR to a directory holding them as dinov2/data/
  swav          SwAV's own MultiCropDataset (src/multicropdataset.py: 2 x 224 + 6 x 96, its
                PILRandomGaussianBlur, recorded); set SWAV_DIR to a checkout

Images counts a multi-view sample once per view; samples counts it once. ``--per-view-decode``
adds autoproxy with ``shared_decode="off"`` (each view decodes its own region of the JPEG). Every batch is moved to
the GPU when there is one. Steady state: batches [w, B - w) of the epoch are timed, w as many as
autoproxy queues ahead (at most a third of the epoch), so no queued work counts as free.

    python benchmarks/dataset_shapes_benchmark.py --images 8192 --workers 8 --repeat 2 \\
        --out benchmarks/results/dataset_shapes_h200.json
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import make_corpus  # noqa: E402
from loader_benchmark import auto_warmup  # noqa: E402
from results_io import write_results  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SHAPES = ("imagefolder", "path", "dict", "bytes", "two_view", "timm")
RECIPES = ("mixup", "webdataset", "timm_prefetch", "randaug_v2", "ta_wide", "moco_v3", "dino", "dinov2", "swav")
SSL_DIRS = {"moco_v3": "MOCO_V3_DIR", "dino": "DINO_DIR", "dinov2": "DINOV2_DIR", "swav": "SWAV_DIR"}
SHARDS = 16


def train_chain():
    import torchvision.transforms as T
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def randaug_v2_chain():
    import torchvision.transforms.v2 as v2
    return v2.Compose([v2.ToImage(), v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                       v2.RandAugment(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


def ta_wide_chain():
    import torchvision.transforms as T
    bilinear = T.InterpolationMode.BILINEAR
    return T.Compose([T.RandomResizedCrop(176, interpolation=bilinear, antialias=True), T.RandomHorizontalFlip(),
                      T.TrivialAugmentWide(interpolation=bilinear), T.PILToTensor(),
                      T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), T.RandomErasing(0.1)])


class MixUpCutMix:
    """The references' collate: default_collate, then one of MixUp / CutMix per batch."""
    def __init__(self, classes):
        import torchvision.transforms.v2 as v2
        self.mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                                     v2.CutMix(alpha=1.0, num_classes=classes)])

    def __call__(self, batch):
        return self.mix(*torch.utils.data.default_collate(batch))


def identity(x):
    return x


def make_shards(root) -> list:
    """The corpus as SHARDS webdataset tar shards beside it (made once)."""
    import torchvision
    import webdataset as wds
    samples = torchvision.datasets.ImageFolder(root).samples
    folder = root.rstrip("/") + f"_wds{SHARDS}"
    urls = [os.path.join(folder, f"shard-{k:03d}.tar") for k in range(SHARDS)]
    if not all(os.path.exists(u) for u in urls):
        os.makedirs(folder, exist_ok=True)
        for k, url in enumerate(urls):
            with wds.TarWriter(url + ".tmp") as sink:
                for i in range(k, len(samples), SHARDS):
                    path, label = samples[i]
                    with open(path, "rb") as f:
                        sink.write({"__key__": f"s{i:07d}", "jpg": f.read(), "cls": label})
            os.replace(url + ".tmp", url)
    return urls


class PathDataset(torch.utils.data.Dataset):
    def __init__(self, samples, tf, as_dict=False):
        self.items, self.tf, self.as_dict = samples, tf, as_dict

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image
        path, label = self.items[i]
        img = self.tf(Image.open(path).convert("RGB"))
        return {"image": img, "label": label} if self.as_dict else (img, label)


class BytesDataset(torch.utils.data.Dataset):
    def __init__(self, samples, tf):
        self.items = [(open(p, "rb").read(), y) for p, y in samples]
        self.transform = tf

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image
        data, label = self.items[i]
        return self.transform(Image.open(io.BytesIO(data)).convert("RGB")), label


class TwoViews:
    def __init__(self, base):
        self.base = base

    def __call__(self, x):
        return [self.base(x), self.base(x)]


def make_loader(shape, root, workers, batch):
    import torchvision
    kw = dict(batch_size=batch, shuffle=True, num_workers=workers, pin_memory=torch.cuda.is_available())
    if shape in ("timm", "timm_prefetch"):
        from timm.data import create_dataset, create_loader
        ds = create_dataset("", root=root, split="")
        prefetch = shape == "timm_prefetch" and torch.cuda.is_available()  # its PrefetchLoader needs a GPU
        return create_loader(ds, input_size=(3, 224, 224), batch_size=batch, is_training=True, use_prefetcher=prefetch,
                             num_workers=workers, pin_memory=torch.cuda.is_available(), persistent_workers=False)
    if shape == "webdataset":
        import webdataset as wds
        ds = wds.WebDataset(make_shards(root), shardshuffle=False).decode("pil").to_tuple("jpg", "cls") \
            .map_tuple(train_chain(), identity)
        kw.pop("shuffle")
        return torch.utils.data.DataLoader(ds, **kw)
    if shape in ("mixup", "randaug_v2", "ta_wide"):
        tf = {"mixup": train_chain, "randaug_v2": randaug_v2_chain, "ta_wide": ta_wide_chain}[shape]()
        ds = torchvision.datasets.ImageFolder(root, transform=tf)
        if shape == "mixup":
            kw["collate_fn"] = MixUpCutMix(len(ds.classes))
        return torch.utils.data.DataLoader(ds, **kw)
    if shape == "swav":
        return torch.utils.data.DataLoader(ssl_recipe(shape, root=root), **kw)
    if shape in SSL_DIRS:
        return torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=ssl_recipe(shape)), **kw)
    if shape in ("imagefolder", "two_view"):
        tf = train_chain() if shape == "imagefolder" else TwoViews(train_chain())
        return torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=tf), **kw)
    samples = torchvision.datasets.ImageFolder(root).samples
    ds = BytesDataset(samples, train_chain()) if shape == "bytes" else PathDataset(samples, train_chain(),
                                                                                    shape == "dict")
    return torch.utils.data.DataLoader(ds, **kw)


def ssl_recipe(name, size: int = 224, root: str = ""):
    """The recipe's transform (SwAV: its dataset, on the images under ``root``) from the repository
    itself (its files unchanged, imported from the checkout the environment names); ``size``:
    MoCo's crop size (the others' are their own defaults)."""
    checkout = os.environ.get(SSL_DIRS[name])
    if not checkout:
        raise RuntimeError(f"set {SSL_DIRS[name]} to a checkout")
    sys.path.insert(0, checkout)
    if name == "swav":  # main_swav.py's defaults for 2 x 224 + 6 x 96
        from src.multicropdataset import MultiCropDataset
        return MultiCropDataset(root, size_crops=[224, 96], nmb_crops=[2, 6], min_scale_crops=[0.14, 0.05],
                                max_scale_crops=[1.0, 0.14])
    if name == "dinov2":  # its train config's defaults (ssl_default_config.yaml)
        from dinov2.data.augmentations import DataAugmentationDINO
        return DataAugmentationDINO((0.32, 1.0), (0.05, 0.32), 8, global_crops_size=224, local_crops_size=96)
    if name == "dino":
        import main_dino
        return main_dino.DataAugmentationDINO((0.4, 1.0), (0.05, 0.4), 8)  # main_dino.py's defaults
    import moco.loader
    import torchvision.transforms as transforms
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    augmentation1 = [  # main_moco.py's, crop_min 0.08
        transforms.RandomResizedCrop(size, scale=(0.08, 1.)),
        transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([moco.loader.GaussianBlur([.1, 2.])], p=1.0),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize]
    augmentation2 = [
        transforms.RandomResizedCrop(size, scale=(0.08, 1.)),
        transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([moco.loader.GaussianBlur([.1, 2.])], p=0.1),
        transforms.RandomApply([moco.loader.Solarize()], p=0.2),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize]
    return moco.loader.TwoCropsTransform(transforms.Compose(augmentation1), transforms.Compose(augmentation2))


def images_in(batch) -> list:
    """The image tensors of a batch (one per view), moved to the GPU as a training loop would.
    DINOv2's dict repeats its global crops for the teacher: counted once."""
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], dict) and "global_crops" in batch[0]:
        return list(batch[0]["global_crops"]) + list(batch[0]["local_crops"])
    if isinstance(batch, list) and batch and all(isinstance(v, torch.Tensor) and v.ndim == 4 for v in batch):
        return list(batch)  # SwAV: the crops, no labels
    x = batch["image"] if isinstance(batch, dict) else batch[0]
    return list(x) if isinstance(x, list) else [x]


PER_VIEW = "autoproxy, a decode per view"  # the mode --per-view-decode adds: shared_decode="off"


def run(shape, root, workers, batch, warmup, mode, dali_device):
    import dali_autoproxy
    autoproxy = mode != "torchvision"
    if autoproxy:
        dali_autoproxy.enable(device=dali_device, log_level="WARNING",
                              shared_decode="off" if mode == PER_VIEW else "on")
    try:
        loader = make_loader(shape, root, workers, batch)
        cuda = torch.cuda.is_available()
        try:
            stop = len(loader) - warmup  # steady state: the last batches drain queues, untimed
        except TypeError:  # an IterableDataset without a length: to the end
            stop = None
        n, t0, t1 = 0, None, None
        for i, b in enumerate(loader):
            views = images_in(b)
            if cuda:
                views = [v.cuda(non_blocking=True) for v in views]
            if i == warmup or (stop is not None and i == stop):
                if cuda:
                    torch.cuda.synchronize()
                if i == warmup:
                    t0 = time.perf_counter()
                else:
                    t1 = time.perf_counter()
            if i >= warmup and (stop is None or i < stop):
                n += sum(v.shape[0] for v in views)
        if cuda:
            torch.cuda.synchronize()
        dt = (t1 or time.perf_counter()) - (t0 or time.perf_counter())
        rep = dali_autoproxy.report()[-1] if autoproxy else None
        del loader
        gc.collect()
        if autoproxy and not rep["proxied"]:
            raise RuntimeError(f"autoproxy fell back: {rep['reason']}")
        decode = (rep or {}).get("decode", "-")
        if rep and rep["dali_decodes"]:
            decode += f", {rep['decoded_on_dali'] / rep['dali_decodes']:.1f} views per decode"
        return n, dt, decode
    finally:
        dali_autoproxy.disable()


def summarize(results) -> str:
    by = {(r["shape"], r["mode"], r["workers"]): r for r in results}
    lines = ["| shape | workers | torchvision img/s | autoproxy img/s (min-max) | autoproxy / torchvision | "
             "autoproxy / ImageFolder with autoproxy | decoding with autoproxy |", "|---|---|---|---|---|---|---|"]
    for (shape, mode, w), r in by.items():
        if mode == "torchvision":
            continue
        tv, ref = by.get((shape, "torchvision", w)), by.get(("imagefolder", "autoproxy", w))
        if mode == PER_VIEW:
            shape = f"{shape} ({PER_VIEW})"
        spread = f" ({r['min_images_per_s']:,.0f}-{r['max_images_per_s']:,.0f})" if r["runs"] > 1 else ""
        vs_tv = f"{r['images_per_s'] / tv['images_per_s']:.2f}x" if tv else "-"
        vs_ref = f"{r['images_per_s'] / ref['images_per_s']:.2f}x" if ref else "-"
        lines.append(f"| {shape} | {w} | {tv['images_per_s'] if tv else 0:,.0f} | {r['images_per_s']:,.0f}{spread} | "
                     f"{vs_tv} | {vs_ref} | {r['decode']} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "data", "corpus"))
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--workers", type=int, nargs="+", default=[8])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES + RECIPES,
                    help=f"default: the dataset shapes; the recipes: {' '.join(RECIPES)}")
    ap.add_argument("--warmup", type=int, default=None,
                    help="batches not timed (default: as deep as autoproxy's queue, at most a third of the epoch; "
                         "see loader_benchmark.auto_warmup)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode, interleaved; the median is reported")
    ap.add_argument("--tv-repeat", type=int, default=1, help="runs of the (slow) torchvision mode")
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--per-view-decode", action="store_true",
                    help=f"also run autoproxy with shared_decode='off' (mode '{PER_VIEW}'), in the same run")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    modes = ("torchvision", "autoproxy") + ((PER_VIEW,) if a.per_view_decode else ())
    corpus = make_corpus(a.data, a.images)
    env = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "dali_device": a.device}
    print(json.dumps({"corpus": corpus, "env": env}), flush=True)
    results = []
    for w in a.workers:
        runs = {(s, m): [] for s in a.shapes for m in modes}
        for rep in range(a.repeat):
            for shape in a.shapes:
                for mode in modes:
                    if mode == "torchvision" and rep >= a.tv_repeat:
                        continue
                    try:
                        warm = a.warmup if a.warmup is not None else auto_warmup(w, a.images // a.batch, a.batch)
                        n, dt, decode = run(shape, a.data, w, a.batch, warm, mode, a.device)
                    except Exception as exc:  # one shape failing must not lose the others' figures
                        print(json.dumps({"shape": shape, "mode": mode, "error": f"{type(exc).__name__}: {exc}"[:300]}),
                              flush=True)
                        continue
                    runs[(shape, mode)].append((n / dt, decode))
                    print(json.dumps({"shape": shape, "mode": mode, "workers": w, "images_per_s": round(n / dt, 1)}),
                          flush=True)
        for (shape, mode), rs in runs.items():
            if rs:
                rates = sorted(r[0] for r in rs)
                results.append({"shape": shape, "mode": mode, "workers": w, "runs": len(rs),
                                "images_per_s": round(float(np.median(rates)), 1),
                                "min_images_per_s": round(rates[0], 1), "max_images_per_s": round(rates[-1], 1),
                                "decode": rs[-1][1]})
    summary = summarize(results)
    print(summary, flush=True)
    if a.out:
        write_results(a.out, {"corpus": corpus, "env": env, "results": results}, summary)


if __name__ == "__main__":
    main()
