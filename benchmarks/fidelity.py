"""Measured fidelity of autoproxy against plain torchvision, per pipeline and backend.

Same images (scikit-image photographs re-encoded as JPEG), same seed, so random crops and
flips are the same boxes; the figures are the uint8-domain error of whole batches.

    python benchmarks/fidelity.py --device cpu gpu --out benchmarks/results/fidelity.md
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
from test_fidelity import EVAL, TRAIN  # noqa: E402


def measure(root: str, device: str) -> list:
    rows = []
    cases = [(f"eval {k}", EVAL[k], {}) for k in sorted(EVAL)] + \
            [(f"train {k}", TRAIN[k], {"shuffle": True, "seed": 3}) for k in sorted(TRAIN)]
    for name, make, kw in cases:
        ds = image_folder(root, make())
        ref = load_all(ds, autoproxy=False, **kw)
        out = load_all(ds, autoproxy=True, device=device, **kw)
        rep = last_report()
        a = np.concatenate([to_uint8_domain(x, True).numpy() for x, _ in ref])
        b = np.concatenate([to_uint8_domain(x.cpu(), True).numpy() for x, _ in out])
        d = np.abs(a - b)
        rows.append({"pipeline": name, "device": device, "proxied": rep["proxied"],
                     "mae": round(float(d.mean()), 3), "p99_abs": round(float(np.percentile(d, 99)), 2),
                     "max_abs": round(float(d.max()), 2), "psnr_db": round(psnr(a, b), 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", nargs="+", default=["cpu"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        make_photo_folder(root, per_class=8)
        rows = [r for dev in a.device for r in measure(root, dev)]
    lines = ["| pipeline | DALI backend | MAE (levels) | p99 abs error | max abs error | PSNR (dB) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['pipeline']} | {r['device']} | {r['mae']} | {r['p99_abs']} | {r['max_abs']} | {r['psnr_db']} |"
              for r in rows]
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")
        with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
