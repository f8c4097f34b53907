"""The benchmark and fidelity tools run end to end (tiny sizes, DALI's CPU backend).
The speed of our code is not asserted here (figures come from runs on the GPU machine);
the benchmarks' timing window is, with a loader of known cost."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


MODES = ("torchvision", "autoproxy", "dali_proxy", "dali_native", "decode_ceiling")


def _loader_benchmark(tmp_path, pipelines, modes, images: int = 48) -> dict:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "loader_benchmark.py"), "--data", str(tmp_path / "c"),
           "--images", str(images), "--workers", "2", "--batch", "8", "--device", "cpu", "--warmup", "1",
           "--repeat", "1", "--epochs", "2", "--pipelines", *pipelines, "--modes", *modes, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {(r["pipeline"], r["mode"]) for r in data["results"]} == {(p, m) for p in pipelines for m in modes}
    assert all(r["images_per_s"] > 0 for r in data["results"])
    assert data["corpus"]["images"] == images and len(data["commit"]) == 40
    return data


def test_loader_benchmark_runs_every_mode(tmp_path):
    """Every mode on the train pipeline: the table, the decode ceiling's line and the chart."""
    _loader_benchmark(tmp_path, ["train"], MODES)
    assert "decode ceiling (train" in (tmp_path / "bench.md").read_text()
    assert "autoproxy / DALI proxy" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").stat().st_size > 1000


@pytest.mark.slow
def test_loader_benchmark_runs_every_pipeline(tmp_path):
    """Every other pipeline, autoproxied and as the hand-written proxy (the modes share each
    pipeline's torchvision chain and DALI graph)."""
    _loader_benchmark(tmp_path, ["eval", "heavy", "trivialaugment", "jitter_v2", "decode"], ["autoproxy", "dali_proxy"],
                      images=24)


def test_torch_stage_profile_runs(tmp_path):
    """The stage profile (per-op times; host vs GPU times only on a GPU) for both chains."""
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "torch_stage_profile.py"), "--chain", "heavy",
           "trivialaugment", "--batch", "4", "--size", "32", "--repeat", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert {r["chain"] for r in rows} == {"heavy", "trivialaugment"}
    assert all(r["ms_per_batch"] > 0 for r in rows if "ms_per_batch" in r)
    assert any(r.get("op", "").endswith("Augment") for r in rows)


def test_recipe_loaders_are_proxied(tmp_path):
    """MixUp/CutMix collate, webdataset shards, timm's loader (its prefetcher needs a GPU: here
    without), v2 RandAugment on tensors and ta_wide: each one autoproxied with decoding on DALI
    (the benchmark raises where a loader falls back)."""
    recipes = ["mixup", "webdataset", "timm_prefetch", "randaug_v2", "ta_wide"]
    out = tmp_path / "recipes.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "dataset_shapes_benchmark.py"), "--data",
           str(tmp_path / "c"), "--images", "48", "--workers", "2", "--batch", "8", "--device", "cpu",
           "--warmup", "1", "--shapes", *recipes, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"error"' not in res.stdout, res.stdout[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert {(r["shape"], r["mode"]) for r in rows} == {(s, m) for s in recipes for m in ("torchvision", "autoproxy")}
    assert all(r["decode"].startswith("DALI 100%") for r in rows if r["mode"] == "autoproxy"), rows


def test_shared_and_per_view_decode_side_by_side(tmp_path):
    """--per-view-decode adds autoproxy with shared_decode='off' to the same run, both proxied."""
    out = tmp_path / "views.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "dataset_shapes_benchmark.py"), "--data",
           str(tmp_path / "c"), "--images", "32", "--workers", "2", "--batch", "8", "--device", "cpu",
           "--warmup", "1", "--shapes", "two_view", "--per-view-decode", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and '"error"' not in res.stdout, (res.stdout + res.stderr)[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert {r["mode"] for r in rows} == {"torchvision", "autoproxy", "autoproxy, a decode per view"}, rows
    decode = {r["mode"]: r["decode"] for r in rows}
    assert decode["autoproxy"] == "DALI 100%, 2.0 views per decode", rows
    assert decode["autoproxy, a decode per view"] == "DALI 100%, 1.0 views per decode", rows


def test_train_benchmark_reads_the_imagenet_scripts_progress():
    """The end-to-end benchmark's parser on pytorch/examples' ProgressMeter lines (running averages)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from train_benchmark import parse
    lines = [f"Epoch: [0][{n:3d}/20]\tTime  0.100 ( {0.5 if n == 1 else (0.5 + 0.1 * (n - 1)) / n:.3f})\t"
             f"Data  0.050 ( {(0.45 + 0.05 * (n - 1)) / n:.3f})\tLoss 1.0e+00 (1.0e+00)" for n in range(1, 21)]
    out = parse("\n".join(lines + [" *   Acc@1 81.250 Acc@5 99.000"]), batch=256)
    assert out["batches"] == 20 and out["val_acc1"] == 81.25
    assert abs(out["epoch_s"] - 2.4) < 0.02 and abs(out["data_wait_s"] - 1.4) < 0.02
    assert abs(out["steady_images_per_s"] - 10 * 256 / 1.0) < 30  # batches 11-20: 0.1 s each


def test_distributed_summary_reports_medians_and_modes_not_run():
    import argparse
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from distributed_benchmark import summarize
    rows = [{"ranks": 1, "mode": "autoproxy", "images_per_s": v, "first_batch_s": 0.1} for v in (100.0, 120.0, 90.0)]
    rows += [{"ranks": 2, "mode": "autoproxy", "images_per_s": v, "first_batch_s": 0.2} for v in (190.0, 200.0)]
    rows += [{"ranks": 2, "mode": "autoproxy", "error": "failed"}]
    table = summarize(rows, argparse.Namespace(ranks=[1, 2], workers=8))
    assert "| 1 | 8 | 3 | - | 100 (90-120) | - | - / 1.00x |" in table
    assert "| 2 | 8 | 2 | - | 195 (190-200) | - | - / 1.95x |" in table


def test_loader_benchmark_leaves_the_deepest_queue_untimed():
    """A loader that queues k batches ahead has worked on them before a shorter warm-up ends."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from loader_benchmark import auto_warmup

    from dali_autoproxy.main.runs import DEFAULT_LOOKAHEAD
    assert auto_warmup(8, 256, 128) == max(DEFAULT_LOOKAHEAD + 1, 16)
    assert auto_warmup(15, 256, 128) == max(DEFAULT_LOOKAHEAD + 1, 30)
    assert auto_warmup(8, 256, 2) == 48  # batches of 2: three runs of 16 ahead
    assert auto_warmup(8, 10, 128) == 3  # at most a third of the epoch
    assert auto_warmup(0, 2, 128) == 1


def test_loader_benchmark_long_epoch_draws_the_samples_asked_for():
    """--samples: train draws N shuffled samples, eval cycles through the corpus in order."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import loader_benchmark as lb
    ds = list(range(10))
    assert lb.order(ds, "train") == {"shuffle": True} and lb.order(ds, "eval") == {"shuffle": False}
    lb.EPOCH_SAMPLES["n"] = 25
    try:
        train, eval_ = lb.order(ds, "train")["sampler"], lb.order(ds, "eval")["sampler"]
        drawn = list(train)
        assert len(train) == len(drawn) == 25 and sorted(drawn[:10]) == ds  # each pass a permutation
        assert list(eval_) == [i % 10 for i in range(25)] and len(eval_) == 25
    finally:
        lb.EPOCH_SAMPLES["n"] = 0


def test_loader_benchmark_long_epoch_and_thread_times_end_to_end(tmp_path):
    """--samples sets the epoch of a real proxied loader; --thread-times reports the pipeline
    thread's feed and stage CPU and the main thread's waits over the timed window."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "loader_benchmark.py"), "--data", str(tmp_path / "c"),
           "--images", "24", "--samples", "64", "--workers", "2", "--batch", "8", "--device", "cpu",
           "--warmup", "1", "--pipelines", "train", "--modes", "autoproxy", "--thread-times",
           "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    row, = json.loads(out.read_text())["results"]
    assert row["images"] == (64 // 8 - 2) * 8  # batches [1, 7) of the 64-sample epoch, not of the 24 files
    times, = row["thread_times"]
    assert times["feed_cpu_ms"] > 0 and times["stage_cpu_ms"] > 0 and times["stage_cpu_ms_mean"] > 0
    assert times["stage_batches_replayed"] == 0  # CUDA graphs only on the GPU
    assert 0 <= times["main_waits_pull"] and 0 <= times["main_waits_collect"]
    assert times["main_waits_pull"] + times["main_waits_collect"] <= 1.01


class _Timed(torch.utils.data.Dataset):
    """Samples that cost a known time each (a sleep: no CPU taken from the other tests)."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.zeros(3, 4, 4), i


def test_the_timing_window_excludes_the_queued_work():
    """A loader whose batches cost a known time, with a queue 16 batches deep filled before the loop
    starts: the steady-state window [w, B - w) measures that cost; timing from an early batch to the
    end counts the queued batches as free and reads faster (so this test can fail)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from loader_benchmark import consume
    per_sample, batch, workers, batches = 0.02, 2, 2, 80
    true_per_batch = per_sample * batch / workers  # two workers make batches side by side

    def measured(warmup: int, total: int) -> float:
        loader = torch.utils.data.DataLoader(_Timed(batch * batches, per_sample), batch_size=batch,
                                             num_workers=workers, prefetch_factor=8)
        it = iter(loader)
        deadline = time.monotonic() + 20  # the queue (workers x prefetch_factor = 16 batches) full before the
        while it._data_queue.qsize() < workers * 8 and time.monotonic() < deadline:  # loop runs, however busy
            time.sleep(0.05)                                                          # the machine
        n, seconds = consume(it, "cpu", warmup, total)
        del it
        return seconds / (n / batch)
    # Other tests on the machine can slow one measurement and not the other: up to three tries of
    # both; a window that counted the queued work would fail every one.
    for _attempt in range(3):
        steady = measured(17, batches)
        naive = measured(1, 0)
        if 0.85 * true_per_batch < steady < 1.3 * true_per_batch and naive < 0.95 * steady:
            break
    assert 0.85 * true_per_batch < steady < 1.3 * true_per_batch, (steady, true_per_batch)
    assert naive < 0.95 * steady, (naive, steady)  # 16 of 80 batches free: about 0.8 on an idle machine


@pytest.mark.slow
def test_recipes_steady_runs_both_arms_over_two_epochs(tmp_path):
    """The steady-state recipes benchmark: each arm in its own process, two epochs, the rows the
    results file promises, with the commit measured and the method."""
    out = tmp_path / "recipes.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "recipes_steady.py"), "--coco", str(tmp_path / "coco"),
           "--corpus", str(tmp_path / "c"), "--images", "48", "--plain-images", "32", "--train-samples", "512",
           "--arms", "segmentation:2:2", "--modes", "torchvision", "autoproxy", "autoproxy_dali_resize",
           "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    data = json.loads(out.read_text())
    assert data["commit"] and "second epoch" in data["method"]
    rows = {(r["recipe"], r["mode"]): r for r in data["results"]}
    assert set(rows) == {("segmentation", m) for m in ("torchvision", "autoproxy", "autoproxy_dali_resize")}
    assert "resize': 'dali'" in data["options"]["autoproxy_dali_resize"]
    for r in rows.values():
        assert {"recipe", "mode", "workers", "batch", "samples_per_s"} <= set(r) and len(r["epoch_samples_per_s"]) == 2
        assert r["samples_per_s"] > 0
    auto = rows[("segmentation", "autoproxy")]
    assert auto["proxied"] and auto["decode"] == "DALI 100%"
    assert "| segmentation | 2 | 2 |" in (tmp_path / "recipes.md").read_text()
    assert "autoproxy_dali_resize / plain" in (tmp_path / "recipes.md").read_text()


def test_main_cost_measures_every_mode(tmp_path):
    """The main-process benchmark: each mode in its own process, the loop thread's CPU per batch
    over the second epoch's middle, every autoproxy mode on DALI (strict)."""
    out = tmp_path / "main_cost.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "main_cost.py"), "--coco", str(tmp_path / "c"),
           "--images", "64", "--repeat", "1", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    data = json.loads(out.read_text())
    assert data["commit"] and "loop thread's CPU" in data["method"]
    rows = {r["mode"]: r for r in data["results"]}
    assert set(rows) == {"torchvision", "autoproxy", "autoproxy_shared_files"}
    assert all(r["us_per_batch"] > 0 for r in rows.values())
    assert "| autoproxy_shared_files |" in (tmp_path / "main_cost.md").read_text()


def test_worker_cost_measures_every_mode(tmp_path):
    """The worker CPU benchmark: each mode in its own process, the worker's CPU per sample, plain
    torchvision's far above autoproxy's (it decodes and resizes; autoproxy's worker does neither)."""
    out = tmp_path / "worker_cost.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "worker_cost.py"), "--corpus", str(tmp_path / "c"),
           "--images", "32", "--samples", "64", "--batch", "16", "--repeat", "1", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    data = json.loads(out.read_text())
    assert data["commit"] and "worker's user + system CPU" in data["method"]
    rows = {r["mode"]: r for r in data["results"]}
    assert set(rows) == {"torchvision", "autoproxy", "autoproxy_new_buffers"}
    assert all(r["us_per_sample"] > 0 for r in rows.values())
    assert rows["torchvision"]["us_per_sample"] > 2 * rows["autoproxy"]["us_per_sample"]
    assert "| autoproxy_new_buffers |" in (tmp_path / "worker_cost.md").read_text()
