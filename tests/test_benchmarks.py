"""The benchmark and fidelity tools run end to end (tiny sizes, DALI's CPU backend).
Speed is not asserted here: figures come from runs on the GPU machine."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_loader_benchmark_runs_every_mode(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "loader_benchmark.py"), "--data", str(tmp_path / "c"),
           "--images", "48", "--workers", "2", "--batch", "8", "--device", "cpu", "--warmup", "1",
           "--repeat", "2", "--epochs", "2", "--pipelines", "train", "eval", "heavy", "trivialaugment", "jitter_v2", "decode",
           "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    modes = {(r["pipeline"], r["mode"]) for r in data["results"]}
    assert modes == {(p, m) for p in ("train", "eval", "heavy", "trivialaugment", "jitter_v2", "decode")
                     for m in ("torchvision", "autoproxy", "dali_proxy", "dali_native")}
    assert all(r["images_per_s"] > 0 for r in data["results"])
    assert data["corpus"]["images"] == 48
    assert "autoproxy / DALI proxy" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").stat().st_size > 1000


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
