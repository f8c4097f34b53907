"""The DALI runners of loaders that are gone, kept for the process's next loaders.

A script that builds a new DataLoader per epoch (an eval loader made in the loop, a loader per
stage of a curriculum) would otherwise build its pipelines again each time: the pipeline, its
buffers, its thread, the torch stage's prepared tables and graphs, the longest part of the time
to the first batch. A runner is reused only by a loader whose plan, input kind, batch size,
look-ahead, hardware-decoder share and device are the same (equal plan keys: equal pipelines).
Idle pipelines hold GPU memory, so few are kept: past ``LIMIT`` the longest kept is closed;
``dali_autoproxy.disable()`` closes them all. Runs in the main process.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Dict, Hashable, Iterable, Optional, Tuple

LIMIT = 4  # runners kept for later loaders, at most


def spare_key(plan_key: str, kind: str, runner: Any) -> Tuple[Hashable, ...]:
    """What a runner must match to serve another loader."""
    return (plan_key, kind, runner.batch_size, runner.ahead, runner.hw_decoder_load, runner.device,
            runner.device_id)


class SpareRunners:
    """The process's kept runners, the longest kept first; counts for the report's tests."""

    def __init__(self) -> None:
        self._runners: "collections.OrderedDict[Tuple[Hashable, ...], list]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.kept = 0
        self.reused = 0
        self.open = True  # False after disable(): runners handed in are closed, not kept

    def keep(self, runners: Dict[Tuple[str, str], Iterable[Any]]) -> None:
        """A gone loader's idle runners, by (plan key, kind): kept, the oldest beyond LIMIT closed."""
        closing = []
        with self._lock:
            for (plan_key, kind), pool in list(runners.items()):
                for runner in pool:
                    if not self.open:
                        closing.append(runner)
                        continue
                    self._runners.setdefault(spare_key(plan_key, kind, runner), []).append(runner)
                    self.kept += 1
            while sum(len(v) for v in self._runners.values()) > LIMIT:
                key, pool = next(iter(self._runners.items()))
                closing.append(pool.pop(0))
                if not pool:
                    del self._runners[key]
        for runner in closing:
            runner.close()

    def take(self, plan_key: str, kind: str, batch_size: int, ahead: int, hw_decoder_load: float, device: str,
             device_id: Optional[int]) -> Optional[Any]:
        key = (plan_key, kind, batch_size, ahead, hw_decoder_load, device, device_id)
        with self._lock:
            pool = self._runners.get(key)
            if not pool:
                return None
            runner = pool.pop()
            if not pool:
                del self._runners[key]
            self.reused += 1
            return runner

    def close(self) -> None:
        """Close every kept runner (their threads and pipelines), and those handed in later,
        until ``open`` again (enable())."""
        with self._lock:
            self.open = False
            runners = [r for pool in self._runners.values() for r in pool]
            self._runners.clear()
        for runner in runners:
            runner.close()


SPARE = SpareRunners()
