"""Several consecutive loader batches fed to a DALI pipeline as one run, in the main process.

Every pipeline run costs the main process about the same Python work whatever its size: the
feeds of its inputs, DALI's run and outputs, the torch stage's launches. That work shares one
interpreter with the training loop, so a loader of small batches (detection and segmentation
train at 2-8 images per GPU) is bound by it. The iterator therefore gathers the groups of
consecutive batches that go to one pipeline into a :class:`Run`, feeds the run as one batch,
and each batch takes its own rows back from the run's output (:meth:`Part.rows`). Every sample
carries its own parameters, size and region through the pipeline and the torch stage, so a
sample's result does not depend on the other samples of its run.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional, Union

import numpy as np

from dali_autoproxy.backends.dali import PipelineError
from dali_autoproxy.config import LOOKAHEAD_RANGE
from dali_autoproxy.transport import SHARED, ProxyGroup, SharedGroup

RUN_SAMPLES = 32  # a run gathers batches up to about this many samples
# where runs gather batches: on the GPU the main process's per-run work is what bounds small batches;
# DALI's CPU backend is bound by its own compute, which a larger padded run (the exact resize pads a
# run to its largest sample) only adds to
GATHER_ON = ("gpu",)
RUNS_IN_LOOKAHEAD = 3  # the look-ahead holds at least this many runs: one collected, others fed behind it
DEFAULT_LOOKAHEAD = 16  # batches the loop holds ahead unless the user says (``lookahead=``)

Unit = Union[ProxyGroup, SharedGroup]


def lookahead_batches(option: Optional[int], batch_size: Optional[int], device: str = "gpu") -> int:
    """The batches the loop holds ahead of the one it waits for: the user's ``lookahead``, else
    ``DEFAULT_LOOKAHEAD``, grown where runs gather batches until it holds ``RUNS_IN_LOOKAHEAD``
    runs of about ``RUN_SAMPLES`` samples (batch 2: 47 batches, three runs of 16). Much of a run's
    Python work in the main process (feeds, DALI's outputs, the torch stage's launches) is the
    same whatever its size, so batches of 2 gathered 16 to a run instead of 5 pay it a third as
    often; the samples held ahead (94) stay below those of 16 batches of 8."""
    if option is not None:
        return option
    if device not in GATHER_ON:
        return DEFAULT_LOOKAHEAD
    wanted = -(-RUN_SAMPLES // max(1, batch_size or 1))
    return max(DEFAULT_LOOKAHEAD, min(LOOKAHEAD_RANGE[1], RUNS_IN_LOOKAHEAD * wanted - 1))


def batches_per_run(batch_size: Optional[int], lookahead: int, device: str = "gpu") -> int:
    """How many batches' groups one run takes: enough for about ``RUN_SAMPLES`` samples, while
    the look-ahead still holds ``RUNS_IN_LOOKAHEAD`` runs (so DALI works ahead of the loop); one
    on a device not in ``GATHER_ON``."""
    if device not in GATHER_ON:
        return 1
    wanted = -(-RUN_SAMPLES // max(1, batch_size or 1))
    return max(1, min(wanted, (lookahead + 1) // RUNS_IN_LOOKAHEAD))


def runs_behind(lookahead: int, per_run: int) -> int:
    """How many runs are fed behind the oldest before the pipeline's thread collects it ahead of
    the loop (the runner's ``ahead``, in runs instead of batches)."""
    return lookahead if per_run == 1 else max(1, (lookahead + 1) // per_run - 1)


class _Rows:
    """One view's rows of a run: what the pipeline's feeds and torch stage read of a group."""
    __slots__ = ("params", "payload")

    def __init__(self, params: np.ndarray, payload: tuple):
        self.params = params
        self.payload = payload  # the groups' shared-memory tensors: alive until DALI has read them


class _MergedGroup:
    """The groups of a run as one group of their rows, in order (the pipeline's input)."""

    def __init__(self, units: List[Unit]):
        self.key, self.kind = units[0].key, units[0].kind
        payloads = tuple(u.members[0].payload for u in units)
        self.members = [_Rows(np.concatenate([u.members[k].params for u in units]), payloads)
                        for k in range(len(units[0].members))]
        self._units = units

    def payload_views(self) -> List[np.ndarray]:
        return [view for u in self._units for view in u.payload_views()]


class Run:
    """Groups of consecutive batches for one pipeline (one runner key), fed as one batch."""

    def __init__(self, key: tuple):
        self.key = key
        self.kind = key[1]  # the input kind: ``shared`` runs give one output per view
        self.units: List[Unit] = []
        self.rows = 0
        self.submitted = self.collected = False
        self.output: Any = None
        self.error: Optional[str] = None  # the pipeline's failure on this run, as text
        self._parts_left = 0
        self._group: Optional[Unit] = None

    def add(self, unit: Unit) -> "Part":
        part = Part(self, self.rows, len(unit.members[0].indices))
        self.units.append(unit)
        self.rows += part.count
        self._parts_left += 1
        return part

    def group(self) -> Unit:
        """What the pipeline is fed: the one group as it is, or the groups' rows merged."""
        if self._group is None:
            self._group = self.units[0] if len(self.units) == 1 else _MergedGroup(self.units)
        return self._group

    def collected_as(self, output: Any = None, error: Optional[str] = None) -> None:
        self.output, self.error, self.collected = output, error, True
        self.units, self._group = [], None  # the payloads go once DALI has read them


class Part:
    """One batch's group within a run: rows [offset, offset + count) of the run's output."""
    __slots__ = ("run", "offset", "count")

    def __init__(self, run: Run, offset: int, count: int):
        self.run, self.offset, self.count = run, offset, count

    def rows(self) -> Any:
        """This group's output (a tensor, a list of tensors, or for views one of those per
        view); the run lets go of its output once every part has taken its rows."""
        run = self.run
        out = run.output
        run._parts_left -= 1
        if run._parts_left == 0:
            run.output = None
        if self.offset == 0 and self.count == run.rows:
            return out
        end = self.offset + self.count
        if run.kind == SHARED:
            return [view[self.offset:end] for view in out]
        return out[self.offset:end]


class RunQueue:
    """One iterator's runs: those still gathering batches and those fed but not yet collected,
    per pipeline (``runners``: the iterator's, by runner key)."""

    def __init__(self, runners: Dict[tuple, Any], per_run: int, behind: int, timeout: Optional[float]):
        self.runners, self.per_run, self.behind, self.timeout = runners, per_run, behind, timeout
        self.open: Dict[tuple, Run] = {}
        self.queued: Dict[tuple, collections.deque] = collections.defaultdict(collections.deque)

    def clear(self) -> None:
        self.open.clear()
        self.queued.clear()

    def add(self, unit: Unit) -> Part:
        """A batch's group for its pipeline: its part of the open run (fed once the run is full)."""
        key = (unit.key, unit.kind)
        run = self.open.get(key) or self.open.setdefault(key, Run(key))
        part = run.add(unit)
        if len(run.units) >= self.per_run:
            self._submit(run)
        return part

    def submit_open(self, parts: Optional[List[Optional[Part]]] = None) -> None:
        """Feed the runs still gathering that hold one of ``parts`` (None: every one)."""
        runs = list(self.open.values()) if parts is None else [p.run for p in parts if p is not None]
        for run in runs:
            if not run.submitted:
                self._submit(run)

    def _submit(self, run: Run) -> None:
        del self.open[run.key]
        run.submitted = True
        self.queued[run.key].append(run)
        self.runners[run.key].submit(run.group(), ahead=self.behind)

    def output(self, part: Part) -> Any:
        """A group's rows of its run's output, collecting the run first (the runs of a pipeline
        are collected in the order they were fed, as batches are finished in order); a str: why
        the pipeline failed on the run (it is then rebuilt and fed again what was queued behind)."""
        run = part.run
        if not run.collected:
            queued = self.queued[run.key]
            assert queued[0] is run, "runs are collected in the order they were fed"
            queued.popleft()
            runner = self.runners[run.key]
            try:
                run.collected_as(output=runner.collect(self.timeout))
            except PipelineError as exc:  # only the pipeline's own: the loader's errors propagate
                run.collected_as(error=str(exc))  # as text: a kept exception's frames would hold the iterator
                runner.rebuild()
                for later in queued:
                    runner.submit(later.group(), ahead=self.behind)
        return run.error if run.error is not None else part.rows()
