"""DALI's JPEG decoding against Pillow's, per decoder setting, with its speed, in one run.

For each setting (chroma upsampling as libjpeg-turbo does or not, the hardware decoder on or
off, full or region-of-interest decode), every photo of the benchmark corpus is decoded by DALI
and by Pillow (``Image.open(...).convert("RGB")``, cropped to the same box for ROI decodes) and
compared pixel by pixel; the corpus is then decoded again, timed, in batches. The odd JPEG set
of the tests (progressive, 4:2:2, ICC, restart markers, 17x9, ...) is compared the same way,
image by image, and through the eval chain (Resize 256, CenterCrop 224) to tell decoding
differences from resampling ones.

    python benchmarks/decode_fidelity.py --images 2048 --out benchmarks/results/decode_fidelity_h200.json
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from corpus import make_corpus  # noqa: E402
from results_io import write_results  # noqa: E402

SETTINGS = {  # name: (jpeg_fancy_upsampling, hw_decoder_load or None for DALI's default, crop)
    # crop: False (whole image), "roi" (region-of-interest decode), "slice" (whole decode, then slice)
    "default": (False, None, False),
    "fancy": (True, None, False),
    "fancy_no_hw": (True, 0.0, False),
    "default_roi": (False, None, "roi"),
    "fancy_roi": (True, None, "roi"),
    "fancy_slice": (True, None, "slice"),
}


def pil_rgb(data: bytes) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def boxes_for(shapes, seed=0):
    """A RandomResizedCrop-like box per image: (top, left, height, width)."""
    rng = np.random.default_rng(seed)
    out = []
    for h, w in shapes:
        ch, cw = int(h * rng.uniform(0.3, 1.0)), int(w * rng.uniform(0.3, 1.0))
        out.append((int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw))
    return out


def build(setting, batch, device):
    from nvidia.dali import Pipeline, fn, types
    fancy, hw, roi = SETTINGS[setting]
    pipe = Pipeline(batch_size=batch, num_threads=4, device_id=0 if device == "gpu" else None,
                    prefetch_queue_depth=1, exec_dynamic=True)
    kw = dict(device="mixed" if device == "gpu" else "cpu", output_type=types.RGB, adjust_orientation=False,
              jpeg_fancy_upsampling=fancy)
    if hw is not None and device == "gpu":
        kw["hw_decoder_load"] = hw
    with pipe:
        data = fn.external_source(name="data", device="cpu", dtype=types.UINT8)
        if roi:
            anchor = fn.external_source(name="anchor", device="cpu", dtype=types.INT32)
            shape = fn.external_source(name="shape", device="cpu", dtype=types.INT32)
            if roi == "roi":
                img = fn.decoders.image_slice(data, anchor, shape, axis_names="HW", **kw)
            else:
                img = fn.slice(fn.decoders.image(data, **kw), anchor, shape, axis_names="HW")
        else:
            img = fn.decoders.image(data, **kw)
        pipe.set_outputs(img)
    pipe.build()
    return pipe


def decode(pipe, datas, boxes=None):
    pipe.feed_input("data", [np.frombuffer(d, dtype=np.uint8) for d in datas])
    if boxes is not None:
        pipe.feed_input("anchor", np.array([b[:2] for b in boxes], dtype=np.int32))
        pipe.feed_input("shape", np.array([b[2:] for b in boxes], dtype=np.int32))
    (out,) = pipe.run()
    out = out.as_cpu() if hasattr(out, "as_cpu") else out
    return [np.asarray(out[i]) for i in range(len(datas))]


def compare_setting(pipe, setting, datas, refs, shapes, batch):
    roi = SETTINGS[setting][2]
    boxes = boxes_for(shapes) if roi else None
    scores = []
    for start in range(0, len(datas), batch):
        outs = decode(pipe, datas[start:start + batch], boxes[start:start + batch] if roi else None)
        for k, out in enumerate(outs):
            ref = refs[start + k]
            if roi:
                t, l, h, w = boxes[start + k]
                ref = ref[t:t + h, l:l + w]
            scores.append((psnr(ref, out), int(np.abs(ref.astype(int) - out.astype(int)).max())))
    ps = np.array([s[0] for s in scores])
    mx = np.array([s[1] for s in scores])
    return {"psnr_min": round(float(ps.min()), 1), "psnr_median": round(float(np.median(ps)), 1),
            "max_abs": int(mx.max()), "share_over_3": round(float((mx > 3).mean()), 3)}


def throughput(pipe, setting, datas, shapes, batch, repeat=3):
    roi = SETTINGS[setting][2]
    boxes = boxes_for(shapes, seed=1) if roi else None
    chunks = [(datas[s:s + batch], boxes[s:s + batch] if roi else None)
              for s in range(0, len(datas) - batch + 1, batch)]
    decode(pipe, *chunks[0])  # warm-up
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        for c, b in chunks:
            decode(pipe, c, b)
        best = max(best, len(chunks) * batch / (time.perf_counter() - t0))
    return round(best, 1)


def eval_chain_odd(device):
    """The odd set through the eval chain with autoproxy, per image, against torchvision; and
    the same with Pillow's decoded pixels handed to DALI (resampling alone)."""
    import tempfile

    import torch
    import torchvision
    import torchvision.transforms as T
    from helpers import load_all
    from photos import MEAN, STD, make_odd_jpeg_folder, to_uint8_domain
    chain = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])

    class Pixels(torch.utils.data.Dataset):  # decoded by Pillow first: only resampling differs
        def __init__(self, root):
            self.inner = torchvision.datasets.ImageFolder(root)

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            from PIL import Image
            path, y = self.inner.samples[i]
            img = Image.open(path).convert("RGB")
            img.load()
            return chain(img.crop((0, 0, img.width, img.height))), y
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        names = make_odd_jpeg_folder(root)
        ds = torchvision.datasets.ImageFolder(root, transform=chain)
        ref = load_all(ds, autoproxy=False, batch_size=1)
        out = load_all(ds, autoproxy=True, device=device, batch_size=1)
        raw = load_all(Pixels(root), autoproxy=True, device=device, batch_size=1)
        for name, (a, _), (b, _), (c, _) in zip(names, ref, out, raw):
            a8, b8, c8 = (to_uint8_domain(x.cpu(), True).numpy() for x in (a, b, c))
            rows[name] = {"eval_psnr": round(psnr(a8, b8), 1), "eval_max_abs": round(float(np.abs(a8 - b8).max()), 1),
                          "resample_only_psnr": round(psnr(a8, c8), 1)}
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data", "corpus"))
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from photos import odd_jpegs
    make_corpus(a.data, a.images)
    paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(a.data) for f in fs if f.endswith(".jpg"))[:a.images]
    datas = [open(p, "rb").read() for p in paths]
    refs = [pil_rgb(d) for d in datas]
    shapes = [r.shape[:2] for r in refs]
    odd = sorted(odd_jpegs().items())
    odd_refs = [pil_rgb(d) for _, d in odd]
    result = {"images": len(datas), "device": a.device, "corpus": {}, "odd_decode": {}, "odd_eval": {}}
    for s in a.settings:
        pipe = build(s, a.batch, a.device)
        row = compare_setting(pipe, s, datas, refs, shapes, a.batch)
        row["images_per_s"] = throughput(pipe, s, datas, shapes, a.batch)
        result["corpus"][s] = row
        print(json.dumps({"setting": s, **row}), flush=True)
        if not SETTINGS[s][2]:
            per = {}
            for (name, d), ref in zip(odd, odd_refs):
                out = decode(pipe, [d])[0]
                per[name] = {"psnr": round(psnr(ref, out), 1),
                             "max_abs": int(np.abs(ref.astype(int) - out.astype(int)).max())}
            result["odd_decode"][s] = per
            print(json.dumps({"setting": s, "odd": per}), flush=True)
    result["odd_eval"] = eval_chain_odd(a.device)
    print(json.dumps({"odd_eval": result["odd_eval"]}), flush=True)
    lines = ["| decoder setting | PSNR min (dB) | PSNR median (dB) | max abs error | images > 3 levels | images/s |",
             "|---|---|---|---|---|---|"]
    for s, r in result["corpus"].items():
        lines.append(f"| {s} | {r['psnr_min']} | {r['psnr_median']} | {r['max_abs']} | {r['share_over_3']:.1%} | "
                     f"{r['images_per_s']:,.0f} |")
    lines += ["", "| odd JPEG | " + " | ".join(f"decode {s} (dB / max)" for s in result["odd_decode"]) +
              " | eval chain, autoproxy (dB / max) | eval chain from Pillow's pixels (dB) |",
              "|---|" + "---|" * (len(result["odd_decode"]) + 2)]
    for name, _ in odd:
        cells = [f"{result['odd_decode'][s][name]['psnr']} / {result['odd_decode'][s][name]['max_abs']}"
                 for s in result["odd_decode"]]
        ev = result["odd_eval"].get(name, {})
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {ev.get('eval_psnr')} / {ev.get('eval_max_abs')} | {ev.get('resample_only_psnr')} |")
    table = "\n".join(lines)
    print(table, flush=True)
    if a.out:
        write_results(a.out, result, table)


if __name__ == "__main__":
    main()
