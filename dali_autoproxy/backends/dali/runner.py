"""Running one DALI pipeline per (plan, input kind) in the main process: batches go in with
``submit`` and come out, in order, with ``collect``; one thread per pipeline touches it, as
DALI's own proxy server does. The views a multi-view recipe makes of one image (input kind
``shared``) run as one pipeline of several plans: each JPEG decoded once, a branch per view. Its
lifetime: the loader's state keeps idle runners between epochs and closes them when the loader
goes (``close()``); a forked worker never tears down a pipeline it inherited.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import threading
import time
import weakref
from typing import List, Optional, Sequence, Union

import torch
from torch.cuda import nvtx

from dali_autoproxy.backends import fork_guard, torch_stage
from dali_autoproxy.backends.dali import PipelineError
from dali_autoproxy.backends.dali.lowering import Lowering, shared_graph
from dali_autoproxy.backends.torch_stage import TorchStage
from dali_autoproxy.backends.torch_stage.tensor_policies import release_grids
from dali_autoproxy.config import Options
from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.transport import ENCODED, SHARED, ProxyGroup, SharedGroup

STALL_LIMIT_S = 600.0  # no output for this long (or the loader's timeout=) means DALI is stuck
CLOSE_WAIT_S = 10.0  # a pipeline's thread gets this long to finish its batch when the pipeline goes

EXIT_WAIT_S = 5.0  # at interpreter exit, how long the pipelines' threads get to stop, in all
_live_pipelines: "weakref.WeakSet" = weakref.WeakSet()  # DALI's cached memory goes with the last
_live_runners: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _stop_at_exit() -> None:
    """A script may end with a loader mid-epoch (a ``break``, an exception). The interpreter then
    ends daemon threads still inside C++ (DALI's outputs, CUDA calls) by unwinding them, which
    C++ that catches everything turns into an abort: exit status 134 after the script's work was
    done. So each pipeline thread is told to stop, what it has queued is cancelled, and it gets a
    bounded time to leave the call it is in; then the torch stages' compiling threads."""
    deadline = time.monotonic() + EXIT_WAIT_S
    for runner in list(_live_runners):
        if runner.pid == os.getpid():  # not a forked process's copy (its thread is not there)
            runner._stop_thread(wait=max(0.0, deadline - time.monotonic()))
    torch_stage.stop_compiling(max(0.0, deadline - time.monotonic()))


class _Batch:
    """One submitted batch: fed and run, then collected, by the pipeline's thread; the loader
    waits for its result."""
    __slots__ = ("group", "stream", "done", "delivered", "ok", "value", "requested", "cancelled", "ready",
                 "discard")

    def __init__(self, group: Union[ProxyGroup, SharedGroup], stream) -> None:
        self.group, self.stream = group, stream
        self.done, self.delivered, self.ok, self.value = threading.Event(), threading.Event(), False, None
        self.requested = self.cancelled = False
        self.discard = False  # nobody will take it: DALI's output is consumed, the torch stage skipped
        self.ready: Optional[torch.cuda.Event] = None  # recorded on the stage's stream after its work

    def fail(self, exc: BaseException) -> None:
        self.group, self.value = None, exc
        self.done.set()

    def succeed(self, value) -> None:
        self.group, self.value, self.ok = None, value, True
        self.done.set()

    def result(self, timeout: float):
        """The batch; TimeoutError if DALI delivers no output within ``timeout`` seconds. The
        torch stage's own time (a first batch may compile its Triton kernels) does not count.
        A batch the stage made on its own stream is handed to the caller's current stream: that
        stream waits for the stage's work, and the caching allocator keeps the batch's memory
        until that stream is done with it."""
        if not self.done.wait(timeout) and not (self.delivered.is_set() and self.done.wait()):
            raise TimeoutError
        value, self.value = self.value, None
        if not self.ok:
            raise PipelineError(f"{type(value).__name__}: {value}") from value
        if self.ready is not None:
            consumer = torch.cuda.current_stream(self.stream.device)
            consumer.wait_event(self.ready)
            for t in _tensors(value):
                t.record_stream(consumer)
        return value


def _tensors(value) -> list:
    """The tensors of a batch: a tensor, or (nested) lists of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _tensors(v)]


class _Inputs:
    """A pipeline and the payloads it reads in place (``no_copy``), released in that order:
    DALI's pipeline stops before the memory it may still read is freed."""
    __slots__ = ("pipe", "payloads")

    def __init__(self, pipe) -> None:
        self.pipe, self.payloads = pipe, collections.deque()

    def close(self) -> None:
        """Drop the pipeline, then the payloads; DALI's cached memory goes with our last pipeline."""
        self.pipe = None
        self.payloads = None
        _release_memory_if_idle()


class _PipelineThread:
    """The one thread that touches a pipeline once it is built, as DALI's own proxy server
    does: it feeds and runs every batch as soon as it is queued, and collects the oldest (DALI's
    outputs, then the torch stage) once the loader has its look-ahead queued behind it. So the
    stage's launches and the feeding overlap the main thread's work on the next batches, and
    DALI's outputs() call, which has no timeout, never blocks the loader (it waits on the batch
    with one). A daemon: a pipeline stuck for good never holds up interpreter exit. Its work is
    marked with NVTX ranges (feed, DALI outputs, torch stage), as DALI's proxy marks its own, so an
    Nsight Systems profile shows where a batch's time goes."""

    def __init__(self, inputs: _Inputs, feeds: list, stages: List[Optional[TorchStage]],
                 device_id: Optional[int], views: bool) -> None:
        self._commands: "queue.SimpleQueue" = queue.SimpleQueue()
        self._run = (inputs, feeds, stages, device_id, views)  # feeds and stages: one per branch
        self._thread = threading.Thread(target=self._loop, daemon=True, name="dali_autoproxy-pipeline")
        self._thread.start()

    def feed(self, batch: _Batch) -> None:
        self._commands.put((True, batch))

    def collect(self, batch: _Batch) -> None:
        self._commands.put((False, batch))

    def close(self, wait: float = 0.0) -> None:
        """End the thread after the command in progress; ``wait``: up to that many seconds for
        it to let go of the pipeline (so its memory is free when the caller returns)."""
        self._commands.put(None)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(wait)

    def _loop(self) -> None:
        inputs = self._run[0]
        try:
            self._serve()
        finally:  # the thread lets go of the pipeline, explicitly, when it ends
            inputs.close()

    def _serve(self) -> None:
        inputs, feeds, stages, device_id, views = self._run
        del self._run
        if device_id is not None:
            torch.cuda.set_device(device_id)
        stage_stream = _stage_stream(stages, device_id)
        requested: "collections.deque" = collections.deque()  # collections asked for, oldest first
        while True:
            try:  # every queued feed goes to DALI before the thread blocks in outputs()
                command = self._commands.get(block=not requested)
            except queue.Empty:
                command = (False, requested.popleft())
            else:
                if command is None:
                    return
                if not command[0]:
                    requested.append(command[1])
                    continue
            is_feed, batch = command
            del command
            if batch.cancelled or batch.done.is_set():  # cancelled, or its feed failed
                del batch
                continue
            try:
                if is_feed:
                    with nvtx.range("dali_autoproxy feed"):
                        _feed(inputs, feeds, batch.group)
                else:
                    own = stage_stream is not None and batch.stream is not None
                    stream = stage_stream if own else batch.stream
                    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                        with nvtx.range("dali_autoproxy DALI outputs"):
                            outs = _outputs(inputs, stream if own else None)
                        batch.delivered.set()
                        if batch.discard:
                            batch.succeed(None)
                            del outs, batch
                            continue
                        with nvtx.range("dali_autoproxy torch stage"):
                            result = [stage(out, member.params) if stage is not None else out
                                      for out, stage, member in zip(outs, stages, batch.group.members)]
                        if own:
                            batch.ready = torch.cuda.Event()
                            batch.ready.record(stage_stream)
                        batch.succeed(result if views else result[0])
                        del outs, result
            except BaseException as exc:  # handed to the loader, which rebuilds the pipeline
                batch.fail(exc)
            del batch


def _feed(inputs: _Inputs, feeds: list, group: Union[ProxyGroup, SharedGroup]) -> None:
    from nvidia.dali.tensors import TensorCPU
    pipe = inputs.pipe
    # Each sample as the TensorCPU that feed_input would make of its numpy view (sharing its
    # memory, no layout): DALI's own per-sample checks of a list of arrays cost more than this
    # (about a quarter of the batch's feed, under the GIL the loop shares).
    pipe.feed_input("data", [TensorCPU(v, "") for v in group.payload_views()])
    inputs.payloads.append(group.members[0].payload)  # until its output is out, whoever drops the group
    for member, branch_feeds in zip(group.members, feeds):
        params = member.params
        for name, column, width, dtype in branch_feeds:
            col = params[:, column:column + width].astype(dtype, copy=True)
            pipe.feed_input(name, col.reshape(-1) if width == 1 else col)
    # DALI's own proxy drives the pipeline this way: one scheduled run per fed batch.
    pipe._run_once()


STAGE_ON_OWN_STREAM = True  # benchmarks compare it with the stage on the loop's stream, after a host wait


def _stage_stream(stages: List[Optional[TorchStage]], device_id: Optional[int]):
    """The stream a pipeline's torch stage runs on, or None (then DALI's outputs wait on the
    host and the stage runs on the loop's stream). Its own stream when every branch has a
    stage: DALI binds its outputs to that stream (no host wait for the decode to finish),
    the stage's kernels queue behind the decode there, not behind the training step on the
    loop's stream, and the loop's stream waits for the stage's event when it takes the batch.
    Only the stage's own outputs cross to the loop's stream (allocated by torch, so
    ``record_stream`` keeps them alive for it); DALI's buffers never leave the stage's stream."""
    if device_id is None or not STAGE_ON_OWN_STREAM or not stages or any(s is None for s in stages):
        return None
    return torch.cuda.Stream(device=device_id)


def _outputs(inputs: _Inputs, stream=None) -> List[Union[torch.Tensor, List[torch.Tensor]]]:
    """DALI's next outputs (one per branch) as torch tensors: one batch, or one per sample when
    sizes differ. With ``stream``, bound to it (ready once that stream reaches them) instead
    of waited for on the host."""
    outs = inputs.pipe.outputs() if stream is None else inputs.pipe.outputs(cuda_stream=stream)
    inputs.payloads.popleft()  # DALI is done reading it
    return [torch.from_dlpack(out.as_tensor()) if out.is_dense_tensor()
            else [torch.from_dlpack(out[i]) for i in range(len(out))] for out in outs]


def _release_memory_if_idle() -> None:
    """DALI's cached memory (and the stage's grids) go once no pipeline of ours is left."""
    if _live_pipelines or fork_guard.holding():
        return
    try:
        from nvidia.dali.backend import ReleaseUnusedMemory
        release_grids()
        ReleaseUnusedMemory()
    except Exception:  # pragma: no cover - interpreter shutdown
        pass


def default_num_threads(device: str) -> int:
    cores = os.cpu_count() or 2
    return max(1, min(cores, 8)) if device == "cpu" else max(2, min(cores // 2, 6))


class DaliRunner:
    """One DALI pipeline for one plan and input kind: batches go in with submit(), come out in
    FIFO order with collect(). Only its thread touches the pipeline once built. Input kind
    ``shared``: ``plan`` is the views' plans, a batch is a SharedGroup, and collect() returns
    one output per view."""

    def __init__(self, plan: Union[Plan, Sequence[Plan]], input_kind: str, batch_size: int, device: str,
                 device_id: Optional[int], num_threads: Optional[int] = None, ahead: int = 2,
                 hw_decoder_load: float = Options.hw_decoder_load):
        self.plans = list(plan) if input_kind == SHARED else [plan]
        self.plan = self.plans[0]
        self.input_kind = input_kind
        self.batch_size = batch_size
        self.device = device
        self.device_id = device_id
        self.num_threads = num_threads or default_num_threads(device)
        self.ahead = ahead  # batches queued behind the one being collected
        self.prefetch = ahead + 1  # DALI's queue holds every batch the loader has submitted
        self.hw_decoder_load = hw_decoder_load
        self._batches: "collections.deque" = collections.deque()  # submitted, not collected; oldest first
        self._thread: Optional[_PipelineThread] = None
        self._pipe: Optional["weakref.ref"] = None
        fork_guard.keep(self)  # a forked worker never tears down a pipeline it inherited
        self.pid = os.getpid()
        _live_runners.add(self)
        self._build()

    def _build(self) -> None:
        from nvidia.dali import Pipeline
        views = self.input_kind == SHARED
        kind = ENCODED if views else self.input_kind
        self.lowerings = [Lowering(plan, kind, self.device, self.hw_decoder_load, prefix=f"view{k}." if views else "")
                          for k, plan in enumerate(self.plans)]
        self.lowering = self.lowerings[0]
        if self.device == "gpu" and any(lw.torch_stage is not None for lw in self.lowerings):
            torch_stage.set_up_in_background(self.device_id)
        pipe = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads,
                        device_id=self.device_id if self.device == "gpu" else None,
                        prefetch_queue_depth=self.prefetch, exec_dynamic=True)
        with pipe:
            pipe.set_outputs(*(shared_graph(self.lowerings) if views else [self.lowering.graph()]))
        pipe.build()
        _live_pipelines.add(fork_guard.keep(pipe))
        self._pipe = weakref.ref(pipe)  # the thread owns the pipeline (_Inputs); the runner only looks
        self._batches.clear()
        self._thread = _PipelineThread(_Inputs(pipe), [lw.feeds for lw in self.lowerings],
                                       [lw.torch_stage for lw in self.lowerings],
                                       self.device_id if self.device == "gpu" else None, views)
        # a runner dropped without close() still ends its thread (the finalizer holds the thread, not
        # the runner); not at interpreter exit, where the daemon thread simply stops
        self._finalizer = weakref.finalize(self, self._thread.close, CLOSE_WAIT_S)
        self._finalizer.atexit = False

    @property
    def pipe(self):
        """The DALI pipeline while the runner's thread holds it (None once closed)."""
        return self._pipe() if self._pipe is not None else None

    def close(self) -> None:
        """End the pipeline's thread and free the pipeline now (idempotent); DALI's cached memory
        goes with the last pipeline of ours."""
        self._stop_thread(wait=CLOSE_WAIT_S)

    @property
    def pending(self) -> int:
        return len(self._batches)

    def _stop_thread(self, wait: float = 0.0) -> None:
        """Cancel what is queued and let the thread end (a thread stuck in DALI is left to it)."""
        for batch in getattr(self, "_batches", ()):
            batch.cancelled = True
        if getattr(self, "_thread", None) is not None:
            self._finalizer.detach()
            self._thread.close(wait)
            self._thread = None

    def rebuild(self) -> None:
        """After a failure the pipeline's queue state is unknown: start a fresh one."""
        self._stop_thread()
        self._build()

    def submit(self, group: Union[ProxyGroup, SharedGroup], ahead: Optional[int] = None) -> None:
        """Queue one batch: fed and run at once on the pipeline's thread, and collected there
        ahead of the loader once ``ahead`` batches (default: the runner's) are fed behind it."""
        stream = torch.cuda.current_stream() if self.device == "gpu" else None  # the loop's
        batch = _Batch(group, stream)
        self._batches.append(batch)
        self._thread.feed(batch)
        waiting = [b for b in self._batches if not b.requested]
        if len(waiting) > (self.ahead if ahead is None else ahead):
            self._request(waiting[0])

    def _request(self, batch: _Batch) -> None:
        batch.requested = True
        self._thread.collect(batch)

    def collect(self, timeout: Optional[float] = None) -> Union[torch.Tensor, List[torch.Tensor]]:
        """The oldest submitted batch: one batched tensor, or a list when shapes differ.

        A pipeline that fails on the batch, or gives no output for ``timeout`` seconds, raises
        PipelineError (then rebuild()) instead of hanging."""
        batch = self._batches.popleft()
        if not batch.requested:
            self._request(batch)
        limit = timeout or STALL_LIMIT_S
        try:
            return batch.result(limit)
        except TimeoutError:
            self._stop_thread()  # stuck in DALI: it is left there
            raise PipelineError(f"DALI produced no output within {limit:g} s; the pipeline is "
                                "considered stuck") from None

    def discard_pending(self) -> None:
        """The batches queued are of an iterator that is gone: the pipeline's thread consumes
        DALI's outputs of them now, in the background, without their torch stage (so a later
        ``drain()`` has little left to wait for)."""
        if self._thread is None:
            return
        for batch in list(self._batches):
            batch.discard = True
            if not batch.requested:
                self._request(batch)

    def drain(self) -> None:
        """Discard outputs of batches nobody will take (after a break out of an epoch)."""
        while self._batches:
            try:
                self.collect()
            except PipelineError:
                self.rebuild()
                return
