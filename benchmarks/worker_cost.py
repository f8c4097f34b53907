"""CPU time a DataLoader worker spends per sample, plain torchvision and autoproxy side by side.

Few workers are bound by what each worker does per sample: plain torchvision decodes and
transforms, autoproxy reads the file, checks the JPEG, draws the chain's parameters and packs the
bytes. This measures it directly, where the main process's work cannot blur it: each mode in a
process of its own, one worker, ImageFolder with the train chain (RandomResizedCrop 224, flip,
ToTensor, Normalize); the worker's own CPU time (user + system, ``os.times``) from its start to
its exit, over every sample of two epochs (the first epoch's worker included), divided by the
samples. Modes: ``torchvision``; ``autoproxy`` (DALI's CPU backend runs the pipeline in the main
process); ``autoproxy_new_buffers``, autoproxy with every batch packed into a new shared-memory
buffer (``worker/payload_pool.py`` off), which is what the pool saves.

    python benchmarks/worker_cost.py --out benchmarks/results/worker_cost_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["torchvision", "autoproxy", "autoproxy_new_buffers"]


def _report_at_exit(folder: str, worker_id: int) -> None:
    """worker_init_fn: the worker's CPU seconds from here to its exit, written to ``folder``."""
    import multiprocessing.util
    start = os.times()

    def write() -> None:
        end = os.times()
        with open(os.path.join(folder, str(os.getpid())), "w") as f:
            f.write(str(end.user - start.user + end.system - start.system))
    multiprocessing.util.Finalize(None, write, exitpriority=100)


def run_mode(mode: str, corpus: str, samples: int, batch: int) -> float:
    """This process: two epochs of one mode; the worker CPU microseconds per sample."""
    import functools

    import torch
    import torchvision
    from dataset_shapes_benchmark import train_chain

    import dali_autoproxy
    if mode.startswith("autoproxy"):
        if mode == "autoproxy_new_buffers":
            from dali_autoproxy.worker import payload_pool
            payload_pool.POOL_BUFFERS = 0
        dali_autoproxy.enable(device="cpu", log_level="WARNING", strict=True)
    folder = tempfile.mkdtemp()
    ds = torchvision.datasets.ImageFolder(corpus, transform=train_chain())
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=samples)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=1,
                                         worker_init_fn=functools.partial(_report_at_exit, folder))
    for _ in range(2):
        for _batch in loader:
            pass
    del loader
    seconds = sum(float(open(os.path.join(folder, f)).read()) for f in os.listdir(folder))
    return 1e6 * seconds / (2 * samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/tmp/corpus", help="the photograph corpus (made once)")
    ap.add_argument("--images", type=int, default=1024, help="images in the corpus")
    ap.add_argument("--samples", type=int, default=4096, help="samples per epoch")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode, interleaved; the median is reported")
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # one mode, in its own process
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    if a.mode:
        print("FIGURE " + json.dumps(run_mode(a.mode, a.corpus, a.samples, a.batch)), flush=True)
        return 0
    from corpus import make_corpus
    from results_io import interleaved_runs, measured_commit, medians_table, write_results
    make_corpus(a.corpus, a.images)
    runs = interleaved_runs(__file__, a.modes, a.repeat, ["--corpus", a.corpus, "--samples", str(a.samples),
                                                          "--batch", str(a.batch)])
    if runs is None:
        return 1
    rows, text = medians_table(runs, "us_per_sample", "worker CPU us per sample")
    print(text)
    if a.out:
        head = (f"# Worker CPU per sample ({measured_commit()[:12]})\n\none worker, ImageFolder, train chain, batch "
                f"{a.batch}, two epochs of {a.samples} samples, {a.repeat} runs per mode interleaved, each in its own "
                "process; the worker's user + system CPU from its start to its exit over the samples\n\n")
        write_results(a.out, {"commit": measured_commit(), "method": head.split("\n\n")[1], "images": a.images,
                              "samples": a.samples, "batch": a.batch, "results": rows}, head + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
