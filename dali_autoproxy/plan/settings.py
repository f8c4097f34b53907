"""The planning options of enable() (``fidelity``, ``resize``, ``record``, ``strict``, ``augmix``), as planning
reads them.

Set in the main process by the DataLoader hooks; a loader's workers get them from its
``worker_init_fn`` (``worker/install.py``), so spawned and forkserver workers, which start from
the defaults, plan as the main process does. Nothing else is kept here.
"""
from __future__ import annotations

from typing import Dict

DEFAULT_SETTINGS: Dict[str, str] = {"fidelity": "exact", "resize": "pillow", "record": "on", "strict": "off",
                                    "augmix": "worker"}
SETTINGS: Dict[str, str] = dict(DEFAULT_SETTINGS)


def configure(**values: str) -> None:
    """Set planning options (unknown names are a programming error)."""
    unknown = set(values) - set(DEFAULT_SETTINGS)
    if unknown:
        raise KeyError(f"unknown planning settings: {sorted(unknown)}")
    SETTINGS.update(values)


def reset() -> None:
    SETTINGS.update(DEFAULT_SETTINGS)
