"""report() and print_report(): one row per DataLoader seen since enable()."""
from __future__ import annotations

import copy
import sys
import textwrap
from typing import IO, List, Optional

from dali_autoproxy.main.hooks import instrumentor

COLUMNS = ("loader", "dataset", "proxied", "device", "decode", "dali_decodes", "dali_transforms",
           "worker_transforms", "partial", "batches", "samples", "cpu_path_samples", "reason", "raised")
COMPACT = ("loader", "dataset", "proxied", "device", "batches", "samples", "decode", "reason")
WIDTH = 100  # the compact table's cells wrap to stay within this many characters


def report() -> List[dict]:
    """A copy of the per-loader records (plan, device, counters and fallback reason) of the
    DataLoaders that were iterated: a loader only built, then replaced by a copy (what
    ``accelerate.prepare`` and Hugging Face's Trainer do), has no row."""
    return copy.deepcopy([r for r in instrumentor.records if r.get("iterated")])


def format_report(rows: Optional[List[dict]] = None, verbose: bool = False) -> str:
    """The report as text. The default is compact (who was proxied, where, how much, why not),
    its long cells wrapped to stay within WIDTH characters; ``verbose=True`` is every column,
    one line per loader (the transforms on DALI and in the worker, the partial split)."""
    rows = report() if rows is None else rows
    if not rows:
        if not instrumentor.active:
            return ("dali_autoproxy is not enabled: call dali_autoproxy.enable() or run with DALI_AUTOPROXY=1")
        return "dali_autoproxy: no DataLoader iterated yet"

    def cell(v) -> str:
        if isinstance(v, list):
            return ", ".join(v) or "-"
        return "-" if v is None else str(v)
    columns = COLUMNS if verbose else COMPACT

    def value(r: dict, c: str):  # the compact table says in its reason what the loop got instead of a batch
        if c == "reason" and not verbose and not r.get("reason") and r.get("raised"):
            return f"the loop got {r['raised']}"
        return r.get(c)
    table = [list(columns)] + [[cell(value(r, c)) for c in columns] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    if not verbose:  # the last two columns (decode, reason) share what the others leave
        fixed = sum(widths[:-2]) + 2 * (len(columns) - 1)
        room = max(WIDTH - fixed, 2 * len(columns[-1]))
        widths[-2] = min(widths[-2], max(room // 3, len(columns[-2])))
        widths[-1] = min(widths[-1], max(room - widths[-2], len(columns[-1])))
    lines = []
    for k, r in enumerate(table):
        wrapped = [textwrap.wrap(v, w, break_on_hyphens=False) or [""] for v, w in zip(r, widths)]
        for j in range(max(map(len, wrapped))):
            parts = [(c[j] if j < len(c) else "").ljust(w) for c, w in zip(wrapped, widths)]
            lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_report(file: Optional[IO[str]] = None, verbose: bool = False) -> None:
    print(format_report(verbose=verbose), file=file or sys.stdout)
