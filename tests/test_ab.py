"""`dali-autoproxy ab` and `dali-autoproxy demo` end to end, on DALI's CPU backend."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, torch, torchvision
    import torchvision.transforms as T
    root, fail_in_b = sys.argv[1], sys.argv[2] == "fail-in-b"
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    train = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=tf),
                                        batch_size=4, shuffle=True, num_workers=2)
    val = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=T.Compose(
        [T.Resize(64), T.CenterCrop(64), T.ToTensor()])), batch_size=4, num_workers=2)
    for epoch in range(100):
        for x, y in train:
            if fail_in_b and sys.modules["dali_autoproxy.main.hooks"].instrumentor.proxy:
                raise ValueError("the training step broke in arm B")
        for x, y in val:
            pass
    print("script finished")
""")


def _exe():
    return shutil.which("dali-autoproxy", path=os.path.dirname(sys.executable)) or shutil.which("dali-autoproxy")


def _ab(tmp_path, photo_root, *extra, mode="ok"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, DALI_AUTOPROXY_DEVICE="cpu")
    cmd = [_exe(), "ab", *extra, str(script), photo_root, mode]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_ab_on_an_unchanged_script(tmp_path, photo_root):
    keep = tmp_path / "ab.json"
    res = _ab(tmp_path, photo_root, "--batches", "30", "--warmup", "2", "--json", str(keep))
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "DataLoader #1 (ImageFolder), arm B proxied on cpu" in out
    assert "DataLoader #2 (ImageFolder), arm B proxied on cpu" in out
    assert "the first 2 batches of each loader are warm-up" in out
    for label in ("samples/s", "batch latency p50", "batch latency p99", "loop waited on loader",
                  "CPU s per 1,000 samples", "peak RSS, main process", "peak GPU memory"):
        assert label in out
    assert "script finished" not in out  # ended at the limit, cleanly
    assert "batches counted" in out and "samples counted" in out
    assert "stopped at the limit" in out  # the "ended" row, per arm
    # few batches are said even on DALI's CPU backend, where no B/A is shown
    assert "warning: DataLoader #1: only" in out
    # DALI's CPU backend shows the path, not the speed: no B/A that looks like a speed-up
    assert "arm B ran on DALI's CPU backend" in out
    rate_rows = [line for line in out.splitlines() if line.startswith("samples/s")]
    assert rate_rows and not any(line.rstrip().endswith("x") for line in rate_rows), rate_rows
    assert "Traceback" not in res.stderr
    assert "[dali_autoproxy ab] arm A" in res.stderr and "[dali_autoproxy ab] arm B" in res.stderr  # progress
    runs = json.loads(keep.read_text())
    for arm in ("A", "B"):
        (r,) = runs[arm]
        assert r["status"] == "stopped at the limit" and r["exit_code"] == 0
        assert sum(lo["batches"] for lo in r["loaders"]) == 30
        assert all(lo["samples_per_s"] > 0 for lo in r["loaders"])
        assert all(lo["counted_batches"] == lo["batches"] - 2 and lo["samples"] > 0 for lo in r["loaders"])
    assert all(lo["proxied"] for lo in runs["B"][0]["loaders"])
    assert not any(lo["proxied"] for lo in runs["A"][0]["loaders"])


@pytest.mark.slow
def test_ab_repeat_seconds_and_plot(tmp_path, photo_root):
    pytest.importorskip("matplotlib")
    png = tmp_path / "ab.png"
    res = _ab(tmp_path, photo_root, "--seconds", "2", "--repeat", "2", "--plot", str(png))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 run(s) per arm, median (min-max)" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ab_reports_the_failing_arm(tmp_path, photo_root):
    res = _ab(tmp_path, photo_root, "--batches", "20", mode="fail-in-b")
    assert res.returncode != 0
    assert "arm B (run 1) FAILED" in res.stdout and "the training step broke in arm B" in res.stdout
    assert "arm A (run 1) FAILED" not in res.stdout
    assert "the first 5 batches of each loader are warm-up" in res.stdout


def test_demo_is_sized_for_the_machine():
    """Large enough on a GPU for each arm to reach its steady rate (>= 10 s of loader time)."""
    from dali_autoproxy.tools.demo import CPU_SIZE, GPU_SIZE
    images, epochs, seconds = GPU_SIZE
    assert seconds >= 10 and images * epochs * 2 >= 20_000 * seconds  # autoproxy's H200 rate cannot run out
    assert CPU_SIZE[0] <= 1024 and CPU_SIZE[2] is None


@pytest.mark.slow
def test_demo_runs_on_a_machine_without_data(tmp_path):
    res = subprocess.run([_exe(), "demo", "--images", "64", "--workers", "2", "--epochs", "1",
                          "--cache", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "64 JPEGs" in res.stdout
    assert ("arm B runs DALI on DALI's CPU backend" in res.stdout) or ("arm B runs DALI on the GPU" in res.stdout)
    if "CPU backend" in res.stdout:  # says plainly where the speed is, and what was measured there
        from dali_autoproxy.tools.demo import MEASURED
        assert "not to be fast" in res.stdout and f"The speed is on the GPU: {MEASURED}" in res.stdout
        import re
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")) as f:
            readme = f.read()  # one source of figures: the demo quotes the README's table
        assert all(n in readme for n in re.findall(r"\d+,\d{3}", MEASURED)), MEASURED
    assert "DataLoader #1 (ImageFolder), arm B proxied" in res.stdout
    assert "DataLoader #2 (ImageFolder), arm B proxied" in res.stdout


SHORT_SCRIPT = textwrap.dedent("""
    import sys, torch, torchvision
    import torchvision.transforms as T
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor()])
    loader = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(sys.argv[1], transform=tf),
                                         batch_size=4, num_workers=1)
    for k, (x, y) in enumerate(loader):
        if k == 2:
            break
""")


def test_ab_on_a_script_shorter_than_the_warm_up_says_so(tmp_path, photo_root):
    script = tmp_path / "short.py"
    script.write_text(SHORT_SCRIPT)
    env = dict(os.environ, DALI_AUTOPROXY_DEVICE="cpu")
    res = subprocess.run([_exe(), "ab", str(script), photo_root], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ended inside the warm-up" in res.stdout and "--warmup 0" in res.stdout
    assert "--batches 300" not in res.stdout  # cannot help a script that ends by itself


def test_a_failing_arm_shows_its_last_frames_whole():
    """A deep traceback is cut between frames: the innermost ones and the error stay whole."""
    from dali_autoproxy.tools.ab import last_frames

    def ping(n):  # two functions in turn: Python folds only a frame repeated in a row
        if n == 0:
            raise ValueError("the bottom of the stack " + "x" * 50)
        return pong(n - 1)

    def pong(n):
        return ping(n)
    try:
        ping(200)
    except ValueError as exc:
        text = last_frames(exc, limit=4000)
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "earlier frame(s) left out" in lines[1]
    assert lines[-1].startswith("ValueError: the bottom of the stack") and lines[-1].endswith("x" * 50)
    frames = lines[2:-1]
    assert len(text) <= 4000 and len(frames) > 20
    assert frames[0].startswith("  File ")  # whole frames: each names its place, then its source line
    assert all(b.startswith("    ") for a, b in zip(frames, frames[1:]) if a.startswith("  File "))
    assert 'raise ValueError("the bottom of the stack "' in text  # the failing line itself


def test_the_few_batches_warning_says_what_helps():
    """On a GPU arm: stopped at the limit, a larger limit helps; ended by itself, a longer run does."""
    from dali_autoproxy.tools.ab import format_table

    def runs(status):
        loader = {"loader": 1, "dataset": "ImageFolder", "proxied": True, "device": "gpu", "batches": 25,
                  "counted_batches": 20, "samples": 2560, "samples_per_s": 1000.0}
        arm = {"status": status, "loaders": [dict(loader, proxied=False, device="torchvision")]}
        return {"A": [arm], "B": [{"status": status, "loaders": [loader]}]}
    stopped = format_table(runs("stopped at the limit"))
    assert "only 20 batches counted" in stopped and "use --batches 300 or --seconds 60" in stopped
    assert "1.00x" in stopped  # a GPU arm shows its ratio
    ended = format_table(runs("finished"))
    assert "the script ended on its own" in ended and "--batches 300" not in ended


def _one_loader_runs(status_a, status_b, counted, device="gpu", made=25):
    loader = {"loader": 1, "dataset": "ImageFolder", "proxied": True, "device": device, "batches": made,
              "counted_batches": counted, "samples": 2560, "samples_per_s": 1000.0}
    return {"A": [{"status": status_a, "loaders": [dict(loader, proxied=False, device="torchvision")],
                   "cpu_s_per_1k_samples": 2.0}],
            "B": [{"status": status_b, "loaders": [loader], "cpu_s_per_1k_samples": 1.0}]}


def test_nothing_measured_is_blamed_on_what_ended_the_arm():
    """A failed arm and a --batches cap inside the warm-up each get their own reason, not the
    advice to let the script run longer."""
    from dali_autoproxy.tools.ab import format_table
    failed = format_table(_one_loader_runs("failed", "finished", 0, made=3))
    assert "an arm that failed" in failed and "run longer" not in failed
    capped = format_table(_one_loader_runs("stopped at the limit", "stopped at the limit", 0, made=3))
    assert "--batches counts the warm-up" in capped and "run longer" not in capped
    ended = format_table(_one_loader_runs("finished", "finished", 0, made=3))
    assert "ended inside the warm-up" in ended and "--warmup 0" in ended


def test_few_batches_warn_on_the_cpu_backend_too_and_no_ratio_is_shown_there():
    from dali_autoproxy.tools.ab import format_table
    text = format_table(_one_loader_runs("finished", "finished", 9, device="cpu"))
    assert "only 9 batches counted" in text
    assert "1.00x" not in text and "0.50x" not in text, text  # neither the loader's nor the process's B/A
    assert "0.50x" in format_table(_one_loader_runs("finished", "finished", 60))  # shown for a GPU arm
