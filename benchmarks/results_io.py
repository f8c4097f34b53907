"""How every benchmark saves its figures: the raw rows as JSON, the table beside it as Markdown
(same name, ``.md``), so a results file and its summary never drift apart."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any


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
