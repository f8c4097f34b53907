"""`dali-autoproxy ab`: the unchanged script, plain (A) and with autoproxy (B), side by side.

Each arm runs in a fresh process (``python -m dali_autoproxy.tools.ab --child ...``) whose
DataLoaders are patched to measure (measure.py); arm B also proxies. The parent streams the
arms' output, then prints one table per DataLoader.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import traceback
from collections import deque
from typing import Any, Callable, Dict, List, Optional

MIN_STABLE_BATCHES = 50   # fewer counted batches per loader than this: the ratio is noisy, say so
WIDE_SPREAD = 0.2         # --repeat runs whose B/A spread (max-min) exceeds this share of the median
ERROR_CHARS = 4000        # a failing arm's traceback shown up to about this length, whole frames

METRICS = [  # (key in a loader summary, label, format)
    ("counted_batches", "batches counted", "{:,.0f}"),
    ("samples", "samples counted", "{:,.0f}"),
    ("samples_per_s", "samples/s", "{:,.0f}"),
    ("latency_p50_ms", "batch latency p50 (ms)", "{:.2f}"),
    ("latency_p99_ms", "batch latency p99 (ms)", "{:.2f}"),
    ("waited_fraction", "loop waited on loader (share of time)", "{:.0%}"),
]
ARM_METRICS = [
    ("cpu_s_per_1k_samples", "CPU s per 1,000 samples (process tree)", "{:.2f}"),
    ("peak_rss_main_mb", "peak RSS, main process (MB)", "{:,.0f}"),
    ("peak_rss_worker_mb", "peak RSS, largest worker (MB)", "{:,.0f}"),
    ("gpu_peak_mb", "peak GPU memory in use (MB)", "{:,.0f}"),
]


# ------------------------------------------------------------------ child (one arm)
def child_main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="dali_autoproxy.tools.ab --child")
    ap.add_argument("--arm", choices=["A", "B"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    from dali_autoproxy.config import configure_logging, resolve_options
    from dali_autoproxy.main.hooks import instrumentor
    from dali_autoproxy.tools.measure import Recorder, StopAB
    recorder = Recorder(a.arm, a.out, a.batches, a.seconds, a.warmup)
    options = resolve_options()
    configure_logging(options.log_level)
    instrumentor.instrument(options, proxy=a.arm == "B", recorder=recorder)
    sys.argv = [a.script] + a.args
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    status, error, code = "finished", None, 0
    try:
        runpy.run_path(a.script, run_name="__main__")
    except StopAB:
        status = "stopped at the limit"
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            status, error = "failed", f"exit code {exc.code}"
    except BaseException as exc:  # the script's own failure: reported, not hidden
        status, error, code = "failed", last_frames(exc), 1
    recorder.dump(status, error)
    return code


def last_frames(exc: BaseException, limit: int = ERROR_CHARS) -> str:
    """The traceback of ``exc`` within ``limit`` characters, cut between frames, never inside one:
    the frames nearest the error (where the script failed) stay whole, the first ones give way,
    and the exception's own lines are kept (each cut to a line's worth when the message is long)."""
    te = traceback.TracebackException.from_exception(exc)
    tail = [line[:2000] for line in te.format_exception_only()]
    frames = te.stack.format()
    kept: List[str] = []
    budget = limit - sum(map(len, tail)) - 120
    for frame in reversed(frames):
        if budget - len(frame) < 0 and kept:
            break
        kept.insert(0, frame)
        budget -= len(frame)
    head = ["Traceback (most recent call last):\n"]
    if len(kept) < len(frames):
        head.append(f"  ... {len(frames) - len(kept)} earlier frame(s) left out ...\n")
    text = "".join(head + kept + tail)
    return text if len(text) <= limit + 2000 else text[-(limit + 2000):]


# ------------------------------------------------------------------ parent
def _run_arm(arm: str, script: str, args: List[str], ns: argparse.Namespace, out: str) -> Dict:
    env = dict(os.environ)
    env.pop("DALI_AUTOPROXY", None)  # the child enables itself, per arm
    env["DALI_AUTOPROXY_AB_TTY"] = "1" if sys.stderr.isatty() else "0"
    cmd = [sys.executable, "-m", "dali_autoproxy.tools.ab", "--child", "--arm", arm, "--out", out,
           "--warmup", str(ns.warmup)]
    if ns.batches:
        cmd += ["--batches", str(ns.batches)]
    if ns.seconds:
        cmd += ["--seconds", str(ns.seconds)]
    cmd += [script] + list(args)
    tail: deque = deque(maxlen=40)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    while True:
        chunk = os.read(proc.stderr.fileno(), 4096)
        if not chunk:
            break
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        tail.extend(chunk.decode(errors="replace").splitlines())
    code = proc.wait()
    try:
        with open(out) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {"arm": arm, "status": "failed", "loaders": [], "error": "\n".join(tail)}
    data["exit_code"] = code
    if code and not data.get("error"):
        data["error"] = "\n".join(tail)
    if code:
        data["status"] = "failed"
    rss = data.get("peak_rss_mb") or {}
    data["peak_rss_main_mb"], data["peak_rss_worker_mb"] = rss.get("main"), rss.get("largest_worker")
    return data


def _agg(values: List[Optional[float]], fmt: str) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    text = fmt.format(med)
    if len(vals) > 1:
        text += f" ({fmt.format(min(vals))}-{fmt.format(max(vals))})"
    return text


def _median(values: List[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


LONGER_AB = "use --batches 300 or --seconds 60"
LONGER_SCRIPT = "let the script run longer (more epochs), or --repeat 3"


def format_table(runs: Dict[str, List[Dict]], warm: int = 5, longer: str = LONGER_SCRIPT,
                 no_warmup: str = "--warmup 0") -> str:
    """One table per DataLoader (matched by creation order), then the whole-process rows, then
    warnings where the figures are too few or too spread to trust, each with what would help:
    ``longer`` is the advice when the script itself ended early (the demo's differs from ab's),
    ``no_warmup`` how to count every batch. On DALI's CPU backend arm B proves the path, not the
    speed: no B/A is shown for it."""
    lines: List[str] = []
    warnings: List[str] = []
    n_loaders = max([len(r.get("loaders", [])) for arm in runs.values() for r in arm] or [0])
    repeats = max(len(runs["A"]), len(runs["B"]))
    lines.append(f"dali-autoproxy ab: A = plain torchvision, B = autoproxy; {repeats} run(s) per arm"
                 f"{', median (min-max)' if repeats > 1 else ''}; the first {warm} batches of each "
                 "loader are warm-up and not counted.")
    for arm in ("A", "B"):
        for k, r in enumerate(runs[arm]):
            if r.get("status") == "failed":
                lines.append(f"\narm {arm} (run {k + 1}) FAILED:\n{(r.get('error') or '').strip()}")
    for i in range(n_loaders):
        def col(arm: str, key: str) -> List[Optional[float]]:
            return [r["loaders"][i].get(key) if len(r.get("loaders", [])) > i else None for r in runs[arm]]
        first = next((r["loaders"][i] for arm in ("B", "A") for r in runs[arm] if len(r.get("loaders", [])) > i), {})
        b_rows = [r["loaders"][i] for r in runs["B"] if len(r.get("loaders", [])) > i]
        state = "proxied" if b_rows and all(x.get("proxied") for x in b_rows) else \
            f"fell back: {b_rows[0].get('reason') if b_rows else 'not reached'}"
        lines.append(f"\nDataLoader #{i + 1} ({first.get('dataset', '?')}), arm B {state}"
                     + (f" on {b_rows[0].get('device')}" if b_rows and b_rows[0].get("proxied") else ""))
        on_cpu_backend = bool(b_rows) and all(x.get("device") == "cpu" for x in b_rows)
        rows = [("metric", "A: torchvision", "B: autoproxy", "B/A")]
        for key, label, fmt in METRICS:
            a, b = col("A", key), col("B", key)
            ma, mb = _median(a), _median(b)
            ratio = f"{mb / ma:.2f}x" if key == "samples_per_s" and ma and mb and not on_cpu_backend else ""
            rows.append((label, _agg(a, fmt), _agg(b, fmt), ratio))
        lines += _grid(rows)
        if on_cpu_backend:
            lines.append("arm B ran on DALI's CPU backend (no GPU): it shows that the path works and gives "
                         "torchvision's results, not the speed-up, so no B/A is shown; the speed is on the GPU "
                         "(docs/benchmarks.md)")
        counted = [v or 0 for v in col("A", "counted_batches") + col("B", "counted_batches")]
        made = [v or 0 for v in col("A", "batches") + col("B", "batches")]
        stopped = all(r.get("status") == "stopped at the limit" for arm in runs.values() for r in arm)
        failed = any(r.get("status") == "failed" for arm in runs.values() for r in arm)
        if made and min(counted) == 0 and failed:
            warnings.append(f"DataLoader #{i + 1}: nothing was measured in an arm that failed (its error is above)")
        elif made and min(counted) == 0 and stopped:
            warnings.append(f"DataLoader #{i + 1}: the limit ended each arm inside the warm-up (it made "
                            f"{min(made)} batch(es) in an arm; --batches counts the warm-up, the first {warm} "
                            f"of each loader are not counted): nothing was measured; {LONGER_AB}")
        elif made and min(counted) == 0:
            warnings.append(f"DataLoader #{i + 1}: the loader's epochs ended inside the warm-up (it made "
                            f"{min(made)} batch(es) in an arm, the first {warm} are not counted): nothing was "
                            f"measured; {longer}, or {no_warmup} to count every batch")
        elif min(counted or [0]) < MIN_STABLE_BATCHES:
            advice = LONGER_AB if stopped else f"the script ended on its own: {longer}"
            warnings.append(f"DataLoader #{i + 1}: only {min(counted or [0])} batches counted in an arm; a ratio "
                            f"from so few is noisy ({advice})")
        a_rows = [r["loaders"][i] for r in runs["A"] if len(r.get("loaders", [])) > i]
        ratios = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(a_rows, b_rows)
                  if a.get("samples_per_s") and b.get("samples_per_s")]
        if len(ratios) > 1 and (max(ratios) - min(ratios)) > WIDE_SPREAD * statistics.median(ratios):
            warnings.append(f"DataLoader #{i + 1}: B/A varied from {min(ratios):.2f}x to {max(ratios):.2f}x over the "
                            "repeats; the machine is noisy (more --repeat, or a quieter machine)")
    rows = [("whole process", "A: torchvision", "B: autoproxy", "B/A")]
    b_loaders = [x for r in runs["B"] for x in r.get("loaders", [])]
    any_cpu_backend = any(x.get("device") == "cpu" and x.get("proxied") for x in b_loaders)
    for key, label, fmt in ARM_METRICS:
        a, b = [r.get(key) for r in runs["A"]], [r.get(key) for r in runs["B"]]
        ma, mb = _median(a), _median(b)
        rows.append((label, _agg(a, fmt), _agg(b, fmt), f"{mb / ma:.2f}x" if ma and mb and not any_cpu_backend else ""))
    rows.append(("ended", " / ".join(r.get("status", "?") for r in runs["A"]) or "-",
                 " / ".join(r.get("status", "?") for r in runs["B"]) or "-", ""))
    lines.append("")
    lines += _grid(rows)
    lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines)


def _grid(rows) -> List[str]:
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    out = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def plot(runs: Dict[str, List[Dict]], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("[dali_autoproxy ab] --plot needs matplotlib (pip install matplotlib)\n")
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    bars = {}
    for arm, colour in (("A", "tab:gray"), ("B", "tab:green")):
        for k, r in enumerate(runs[arm]):
            for lo in r.get("loaders", []):
                tl = lo.get("timeline") or []
                if len(tl) > 1:
                    t = [p[0] for p in tl]
                    cum, total = [], 0
                    for p in tl:
                        total += p[1]
                        cum.append(total)
                    rate = [c / max(x, 1e-6) for c, x in zip(cum, t)]
                    ax1.plot(t[1:], rate[1:], color=colour, alpha=0.8,
                             label=f"{arm} loader #{lo.get('loader')}" if k == 0 else None)
                if lo.get("samples_per_s"):
                    bars.setdefault((lo.get("loader"), arm), []).append(lo["samples_per_s"])
    ax1.set_xlabel("seconds after warm-up")
    ax1.set_ylabel("samples/s (cumulative)")
    ax1.legend()
    keys = sorted(bars)
    ax2.bar(range(len(keys)), [statistics.median(bars[k]) for k in keys],
            color=["tab:gray" if k[1] == "A" else "tab:green" for k in keys])
    ax2.set_xticks(range(len(keys)), [f"#{k[0]} {k[1]}" for k in keys])
    ax2.set_ylabel("samples/s (median)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def _number(kind: type, least, what: str) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` of at least ``least`` (a clear message otherwise)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < least or (kind is float and value == least == 0):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--batches", type=_number(int, 1, "a whole number of at least 1"),
                    help="stop each arm after this many batches of all its loaders, the warm-up included")
    ap.add_argument("--seconds", type=_number(float, 0, "a number of seconds above 0"),
                    help="stop each arm after this much loader time")
    ap.add_argument("--repeat", type=_number(int, 1, "a whole number of at least 1"), default=1,
                    help="alternate A and B this many times (default: %(default)s)")
    ap.add_argument("--warmup", type=_number(int, 0, "a whole number of at least 0"), default=5,
                    help="batches of each loader not counted (default: %(default)s)")
    ap.add_argument("--json", help="keep the measurements of both arms in this file")
    ap.add_argument("--plot", help="write a PNG (throughput over time, summary bars); needs matplotlib")
    ap.add_argument("script", help="the training script to compare (then its own arguments)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")


def run(ns: argparse.Namespace) -> int:
    runs: Dict[str, List[Dict]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(max(1, ns.repeat)):
            for arm in ("A", "B"):
                runs[arm].append(_run_arm(arm, ns.script, ns.args, ns, os.path.join(tmp, f"{arm}{k}.json")))
    print(format_table(runs, ns.warmup, getattr(ns, "longer", LONGER_SCRIPT), getattr(ns, "no_warmup", "--warmup 0")),
          flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(runs, f, indent=1)
    if ns.plot and plot(runs, ns.plot):
        print(f"plot written to {ns.plot}")
    failed = [arm for arm in ("A", "B") for r in runs[arm] if r.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child_main(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="dali-autoproxy ab")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
