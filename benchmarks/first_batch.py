"""Seconds to the first batch: a loader of a plan the process has not seen, and then new loaders of
the same chain (a script that builds a new eval loader every epoch), plain torchvision and autoproxy
in one process each, their DataLoaders at their defaults (fork, workers not persistent).

Each arm runs in a fresh process: ``loaders`` loaders one after the other, each made, iterated to its
first batch (moved to the GPU and synchronised), and dropped; the time runs from the DataLoader's
creation to that batch. Loader 1 of autoproxy builds its pipelines and compiles its torch stage's
kernels (Triton's cache directory is emptied first, as on a fresh machine, unless ``--warm-cache``);
later loaders take the pipeline their predecessor left.

    python benchmarks/first_batch.py --out benchmarks/results/first_batch_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHAINS = ("train", "eval")
MODES = {"torchvision": None, "autoproxy": {}, "autoproxy_dali_resize": {"resize": "dali"}}


def chain_of(name: str):
    import torchvision.transforms as T
    from dataset_shapes_benchmark import MEAN, STD, train_chain
    if name == "train":
        return train_chain()
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


def run_arm(chain: str, mode: str, loaders: int, workers: int, batch: int, corpus: str) -> dict:
    import torch
    import torchvision

    import dali_autoproxy
    cuda = torch.cuda.is_available()
    if MODES[mode] is not None:
        dali_autoproxy.enable(device="gpu" if cuda else "cpu", log_level="WARNING", **MODES[mode])
    ds = torchvision.datasets.ImageFolder(corpus, transform=chain_of(chain))
    seconds = []
    for _ in range(loaders):
        t0 = time.perf_counter()
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=cuda)
        images, _labels = next(iter(loader))
        if cuda:
            images = images.cuda(non_blocking=True)
            torch.cuda.synchronize()
        seconds.append(round(time.perf_counter() - t0, 3))
        del loader, images
    row = {"chain": chain, "mode": mode, "workers": workers, "batch": batch, "first_batch_s": seconds}
    if MODES[mode] is not None:
        rep = dali_autoproxy.report()[-1]
        row.update(proxied=rep["proxied"], decode=rep["decode"])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/tmp/corpus", help="the photograph corpus (made once)")
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--loaders", type=int, default=3, help="loaders made one after the other in each process")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--chains", nargs="+", default=list(CHAINS), choices=CHAINS)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--warm-cache", action="store_true", help="keep Triton's kernel cache (a machine that ran before)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    if a.arm:
        chain, mode = a.arm.split(":")
        print("ROW " + json.dumps(run_arm(chain, mode, a.loaders, a.workers, a.batch, a.corpus)), flush=True)
        return 0
    from corpus import make_corpus
    make_corpus(a.corpus, a.images)
    rows = []
    for chain in a.chains:
        for mode in a.modes:
            env = dict(os.environ)
            cache = None
            if not a.warm_cache:
                cache = tempfile.mkdtemp(prefix="triton-cache-")
                env["TRITON_CACHE_DIR"] = cache
            cmd = [sys.executable, os.path.abspath(__file__), "--arm", f"{chain}:{mode}", "--corpus", a.corpus,
                   "--loaders", str(a.loaders), "--workers", str(a.workers), "--batch", str(a.batch)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
            found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
            row = json.loads(found[0]) if found else {"chain": chain, "mode": mode, "error": done.stderr[-600:]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| chain | mode | first batch of loader 1, 2, 3... (s) |", "|---|---|---|"]
    lines += [f"| {r['chain']} | {r['mode']} | {', '.join(map(str, r.get('first_batch_s', []))) or r.get('error')} |"
              for r in rows]
    table = "\n".join(lines)
    print(table)
    if a.out:
        import platform

        import torch
        from results_io import measured_commit, write_results
        commit = measured_commit()
        method = (f"each mode one process; {a.loaders} DataLoaders of one chain made one after the other, each "
                  f"timed from its creation to its first batch on the GPU (batch {a.batch}, {a.workers} workers, "
                  "shuffle, fork, not persistent, pin_memory where there is a GPU), then dropped; Triton's "
                  + ("cache kept" if a.warm_cache else "kernel cache empty at the start of each process"))
        payload = {"commit": commit, "method": method,
                   "machine": {"python": platform.python_version(), "torch": torch.__version__,
                               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                               "cpus": os.cpu_count()},
                   "options": {m: ("plain torchvision" if o is None else f"dali_autoproxy.enable(**{o!r})")
                               for m, o in MODES.items() if m in a.modes},
                   "results": rows}
        write_results(a.out, payload, f"# Seconds to the first batch ({commit[:12]})\n\n{method}.\n\n{table}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
