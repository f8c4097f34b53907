"""How every benchmark saves its figures: the raw rows as JSON, the table beside it as Markdown
(same name, ``.md``), so a results file and its summary never drift apart."""
from __future__ import annotations

import json
import os
from typing import Any


def write_results(out: str, payload: Any, table: str) -> str:
    """Write ``payload`` to ``out`` (JSON) and ``table`` to ``out`` with ``.md``; return the stem."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(payload, f, indent=1)
    stem = os.path.splitext(out)[0]
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    return stem
