"""Measured fidelity of autoproxy against plain torchvision, per pipeline and backend.

Same images (scikit-image photographs re-encoded as JPEG), same seed, so random crops and
flips are the same boxes; the figures are the uint8-domain error of whole batches. With
``--fidelity exact fast`` each case runs in both modes, and ColorJitter's four adjustments are
measured alone too (CenterCrop, ColorJitter with one factor, ToTensor, Normalize): what the ``fast``
opt-in costs per operation. ``--resize pillow dali``: the default (Pillow's arithmetic) and the
opt-in DALI resize, each case in both.

    python benchmarks/fidelity.py --device gpu cpu --out benchmarks/results/fidelity_h100.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers import image_folder, last_report, load_all  # noqa: E402
from photos import make_photo_folder, psnr, to_uint8_domain  # noqa: E402
from results_io import measured_commit, write_results  # noqa: E402
from test_fidelity import EVAL, MEAN, STD, TRAIN  # noqa: E402


def _jitter_alone(**factor):
    import torchvision.transforms as T
    return lambda: T.Compose([T.CenterCrop(200), T.ColorJitter(**factor), T.ToTensor(), T.Normalize(MEAN, STD)])


JITTER_OPS = {"brightness": _jitter_alone(brightness=0.4), "contrast": _jitter_alone(contrast=0.4),
              "saturation": _jitter_alone(saturation=0.4), "hue": _jitter_alone(hue=0.1)}


def measure(root: str, device: str, fidelity: str = "exact", resize: str = "pillow", only=None) -> list:
    rows = []
    cases = [(f"eval {k}", EVAL[k], {}) for k in sorted(EVAL)] + \
            [(f"train {k}", TRAIN[k], {"shuffle": True, "seed": 3}) for k in sorted(TRAIN)]
    if only:
        cases = [c for c in cases if c[0] in only]
    if fidelity != "exact":
        cases += [(f"ColorJitter {k} alone", JITTER_OPS[k], {"shuffle": True, "seed": 3}) for k in JITTER_OPS]
    for name, make, kw in cases:
        ds = image_folder(root, make())
        ref = load_all(ds, autoproxy=False, epochs=2, **kw)
        out = load_all(ds, autoproxy=True, device=device, fidelity=fidelity, resize=resize, epochs=2, **kw)
        rep = last_report()
        a = np.concatenate([to_uint8_domain(x, True).numpy() for x, _ in ref])
        b = np.concatenate([to_uint8_domain(x.cpu(), True).numpy() for x, _ in out])
        d = np.abs(a - b)
        rows.append({"pipeline": name, "device": device, "fidelity": fidelity, "resize": resize,
                     "proxied": rep["proxied"], "decode": rep["decode"],
                     "mae": round(float(d.mean()), 3), "p99_abs": round(float(np.percentile(d, 99)), 2),
                     "max_abs": round(float(d.max()), 2), "psnr_db": round(psnr(a, b), 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", nargs="+", default=["cpu"])
    ap.add_argument("--fidelity", nargs="+", default=["exact"], choices=["exact", "fast"])
    ap.add_argument("--resize", nargs="+", default=["pillow", "dali"], choices=["pillow", "dali"])
    ap.add_argument("--pipelines", nargs="+", default=None, help='only these rows ("eval v2_tensor", ...)')
    ap.add_argument("--out", default=None, help="results JSON (the table beside it as .md)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        make_photo_folder(root, per_class=8)
        rows = [r for dev in a.device for fid in a.fidelity for rs in a.resize
                for r in measure(root, dev, fid, rs, a.pipelines)]
    commit = measured_commit()
    method = ("24 scikit-image photographs re-encoded as JPEG (3 classes x 8), batch 8, 2 workers, two epochs "
              "(fork, workers not persistent), the second epoch's batches compared with plain torchvision's "
              "(same seed: same crops and flips); error in uint8 levels over every pixel, the border included")
    lines = [f"# Fidelity against plain torchvision ({commit[:12]})", "", method, "",
             "| pipeline | DALI backend | fidelity | resize | decode | MAE (levels) | p99 abs error | max abs error "
             "| PSNR (dB) |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['pipeline']} | {r['device']} | {r['fidelity']} | {r['resize']} | {r['decode']} | {r['mae']} | "
              f"{r['p99_abs']} | {r['max_abs']} | {r['psnr_db']} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if a.out:
        write_results(a.out, {"commit": commit, "method": method, "results": rows}, table)


if __name__ == "__main__":
    main()
