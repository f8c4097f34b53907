"""What building a DALI pipeline costs the process, and how much of it holds the interpreter lock.

One process: a thread counts in a Python loop the whole time (its rate measured first, alone),
CUDA is initialised by torch, then six pipelines of one shape are defined and built one after the
other and all kept: external_source -> decoders.image (mixed) -> resize 224 -> crop_mirror_normalize,
batch 32, 8 threads, prefetch 2, with the decoder's defaults, hw_decoder_load 0, no memory paddings,
both, and the defaults again. ``build_gil_free_share``: the counting thread's progress during the
build over its rate alone (1.0: the build let the interpreter run all along; 0: never). Needs a GPU.

    python benchmarks/pipeline_build.py --out benchmarks/results/pipeline_build_h100.json
"""
from __future__ import annotations

import argparse
import threading
import time

from results_io import measured_commit, write_results

VARIANTS = [("default", {}), ("default again", {}), ("hw_decoder_load=0", dict(hw_decoder_load=0.0)),
            ("no paddings", dict(device_memory_padding=0, host_memory_padding=0)),
            ("hw 0, no paddings", dict(hw_decoder_load=0.0, device_memory_padding=0, host_memory_padding=0)),
            ("default, earlier ones kept", {})]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    from nvidia.dali import fn, pipeline_def, types
    count, stop = [0], [False]

    def spin():
        while not stop[0]:
            count[0] += 1

    threading.Thread(target=spin, daemon=True).start()
    time.sleep(0.3)
    c0 = count[0]
    time.sleep(0.2)
    rate = (count[0] - c0) / 0.2
    torch.zeros(1, device="cuda")
    rows, kept = [], []
    for name, decoder in VARIANTS:
        @pipeline_def(batch_size=32, num_threads=8, device_id=0, exec_dynamic=True, prefetch_queue_depth=2)
        def pipe_def():
            enc = fn.external_source(name="x", dtype=types.UINT8)
            img = fn.resize(fn.decoders.image(enc, device="mixed", **decoder), resize_x=224, resize_y=224)
            return fn.crop_mirror_normalize(img, mean=[0., 0., 0.], std=[1., 1., 1.])
        t0, c0 = time.perf_counter(), count[0]
        pipe = pipe_def()
        t1, c1 = time.perf_counter(), count[0]
        pipe.build()
        t2, c2 = time.perf_counter(), count[0]
        rows.append(dict(name=name, define_s=round(t1 - t0, 4), build_s=round(t2 - t1, 4),
                         build_gil_free_share=round((c2 - c1) / rate / (t2 - t1), 3)))
        print(rows[-1], flush=True)
        kept.append(pipe)
    stop[0] = True
    method = __doc__.split("\n\n")[1].replace("\n", " ")
    table = ["# A DALI pipeline's build (%s)" % measured_commit()[:12], "", method, "",
             "| pipeline | define (s) | build (s) | build's share with the interpreter free |", "|---|---|---|---|"]
    table += [f"| {r['name']} | {r['define_s']} | {r['build_s']} | {r['build_gil_free_share']} |" for r in rows]
    write_results(args.out, {"commit": measured_commit(), "device": torch.cuda.get_device_name(0), "results": rows},
                  "\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
