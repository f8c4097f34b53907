"""How every benchmark saves its figures: the raw rows as JSON, the table beside it as Markdown
(same name, ``.md``), so a results file and its summary never drift apart."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple


def measured_commit() -> str:
    """The commit the figures measure: MEASURED_COMMIT (a copy of the tree without its .git, as on
    the GPU machine), else this checkout's HEAD."""
    return os.environ.get("MEASURED_COMMIT") or subprocess.run(
        ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "HEAD"],
        capture_output=True, text=True).stdout.strip()


def write_results(out: str, payload: Any, table: str) -> str:
    """Write ``payload`` to ``out`` (JSON) and ``table`` to ``out`` with ``.md``; return the stem."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(payload, f, indent=1)
    stem = os.path.splitext(out)[0]
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    return stem


def interleaved_runs(script: str, modes: List[str], repeat: int, args: List[str],
                     timeout: int = 1200) -> Optional[Dict[str, List[float]]]:
    """Each mode's figure, ``repeat`` rounds of every mode in turn, each run a process of its own:
    ``script --mode MODE *args``, which prints its figure as one ``FIGURE <json>`` line. None when a
    run printed none (its stderr's end is printed)."""
    runs: Dict[str, List[float]] = {m: [] for m in modes}
    for _ in range(repeat):
        for mode in modes:
            done = subprocess.run([sys.executable, os.path.abspath(script), "--mode", mode, *args],
                                  capture_output=True, text=True, timeout=timeout)
            found = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("FIGURE ")]
            if not found:
                print(done.stderr[-2000:], file=sys.stderr)
                return None
            runs[mode].append(round(json.loads(found[0]), 1))
            print(mode, runs[mode][-1], flush=True)
    return runs


def medians_table(runs: Dict[str, List[float]], key: str, title: str) -> Tuple[List[dict], str]:
    """Rows ``{"mode", key: median, "runs"}`` of ``interleaved_runs``' figures, and their table:
    median (min-max), and the ratio to the ``torchvision`` mode's median where it ran."""
    rows = [{"mode": m, key: statistics.median(v), "runs": v} for m, v in runs.items()]
    lines = [f"| mode | {title} (median, min-max) | / torchvision |", "|---|---|---|"]
    tv = runs.get("torchvision") and statistics.median(runs["torchvision"])
    for r in rows:
        ratio = f"{r[key] / tv:.3f}x" if tv else "-"
        lines.append(f"| {r['mode']} | {r[key]:.1f} ({min(r['runs']):.1f}-{max(r['runs']):.1f}) | {ratio} |")
    return rows, "\n".join(lines)
