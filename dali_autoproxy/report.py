"""report() and print_report(): one row per DataLoader seen since enable()."""
from __future__ import annotations

import copy
import sys
from typing import IO, List, Optional

from .patching import instrumentor

COLUMNS = ("loader", "dataset", "proxied", "device", "decode", "dali_transforms",
           "worker_transforms", "partial", "batches", "samples", "cpu_path_samples", "reason")


def report() -> List[dict]:
    """A copy of the per-loader records (plan, device, counters and fallback reason) of the
    DataLoaders that were iterated: a loader only built, then replaced by a copy (what
    ``accelerate.prepare`` and Hugging Face's Trainer do), has no row."""
    return copy.deepcopy([r for r in instrumentor.records if r.get("iterated")])


def format_report(rows: Optional[List[dict]] = None) -> str:
    rows = report() if rows is None else rows
    if not rows:
        if not instrumentor.active:
            return ("dali_autoproxy is not enabled: call dali_autoproxy.enable() or run with DALI_AUTOPROXY=1")
        return "dali_autoproxy: no DataLoader iterated yet"

    def cell(v) -> str:
        if isinstance(v, list):
            return ", ".join(v) or "-"
        return "-" if v is None else str(v)
    table = [[c for c in COLUMNS]] + [[cell(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_report(file: Optional[IO[str]] = None) -> None:
    print(format_report(), file=file or sys.stdout)
