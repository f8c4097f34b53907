"""The iterator of a proxied DataLoader, in the main process: it runs DALI on each batch before
the training loop sees it.

DALI's own proxy sends work to the main process on a second queue and waits on it with
no timeout; a pipeline that fails before producing output blocks forever, and the batch
order must be rebuilt from batch ids. Here the proxied batch rides the DataLoader's own
result queue (``transport.py``), so order, ``timeout=``, worker errors and shutdown stay
exactly the DataLoader's, and DALI runs in the main process just ahead of the loop: the
iterator pulls up to ``lookahead`` batches from the DataLoader, submits their groups to the
loader's DALI runners (the groups of small batches gathered into runs of several batches,
``main/runs.py``), and hands each batch over once its tensors are back, in order.
"""
from __future__ import annotations

import collections
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import wrapt

from dali_autoproxy.config import Options, StrictModeError, logger
from dali_autoproxy.main.collate import find_proxy_batches, finish, on_device, put_back
from dali_autoproxy.main.cpu_fallback import replay_group
from dali_autoproxy.main.decision import Decision, chain_names, decide, keep_joint_shape, max_batch_size
from dali_autoproxy.main.errors import raised_here, without_frames
from dali_autoproxy.main.payload_release import PooledPayloads
from dali_autoproxy.main.runs import Part, RunQueue, batches_per_run, lookahead_batches, runs_behind
from dali_autoproxy.main.state import GeneratorStates, LoaderState, RunnerKey, output_device
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.transport import (
    ENCODED,
    RAW,
    SHARED,
    WHY_CPU,
    ProxyBatch,
    ProxyCollated,
    ProxyGroup,
    SharedGroup,
    Unrouted,
)
from dali_autoproxy.tree import batch_length
from dali_autoproxy.worker.chains import ChainRouter
from dali_autoproxy.worker.collate import CollateInMain, DefaultCollate
from dali_autoproxy.worker.install import WorkerInstaller, patch, swap_folder_loaders, unswap
from dali_autoproxy.worker.routing import routing

DEATH_SHOWS_WITHIN = 10.0  # seconds a worker whose queue broke has to show as dead (the DataLoader's error)
NOTHING_ROUTED = ("no recognised chain was called with one image in __getitem__ (a joint image+target "
                  "transform, say), or the chains called stayed plain in the workers (the log says why)")


class CountedIterator(wrapt.ObjectProxy):
    """A plain DataLoader iterator (a loader that fell back) that counts its batches and samples
    for the report, as the proxied iterator does; nothing else changes."""

    def __init__(self, inner: Any, record: Dict[str, Any], batched: bool = True):
        super().__init__(inner)
        self._self_record = record
        self._self_batched = batched  # batch_size=None: each item is one sample

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.__wrapped__.__next__()
        self._self_record["batches"] += 1
        self._self_record["samples"] += batch_length(batch) if self._self_batched else 1
        return batch


def make_iterator(wrapped: Any, loader: Any, state: LoaderState, options: Options) -> Any:
    """The DataLoader's ``_get_iterator``, proxied when the decision says so. One DALI pipeline is
    built before the first batch is asked for, so a DALI that cannot build one is a clean fallback:
    with workers, while they start (a failed build stops them, rewinds the generators their start
    drew from and starts plain ones: plain's draws), at ``num_workers=0`` before the loop. The
    others come with their first batch (a multi-view recipe's views run as one pipeline that
    decodes each image once; each build costs the first batch its time and holds device memory)."""
    try:
        decision = decide(loader, options)
        state.update(decision, options)
        if not decision.proxied:
            if options.strict == "on":
                state.check_strict()
            return CountedIterator(wrapped(), state.record, loader._auto_collation)
        if loader.num_workers == 0:
            build_first_pipeline(loader, state, decision, options)
    except StrictModeError:
        raise
    except Exception as exc:
        return _fall_back(wrapped, loader, state, options, exc)
    user_init, user_collate = loader.worker_init_fn, loader.collate_fn
    # the workers collate proxies; a user's collate runs here, on DALI's tensors
    loader.collate_fn = CollateInMain(decision.collate) if decision.collate is not None else DefaultCollate()
    if loader.num_workers > 0:
        loader.worker_init_fn = WorkerInstaller(set(decision.plans), decision.chain_classes, user_init, SETTINGS,
                                                decision.joint_shapes)
    else:
        patch(decision.chain_classes)
    generators = GeneratorStates(loader)
    try:
        inner = wrapped()
    finally:
        loader.worker_init_fn, loader.collate_fn = user_init, user_collate
    if loader.num_workers > 0:
        try:
            build_first_pipeline(loader, state, decision, options)
        except Exception as exc:
            inner._shutdown_workers()
            generators.restore()
            return _fall_back(wrapped, loader, state, options, exc)
    return ProxiedIterator(inner, loader, state, decision, options)


def build_first_pipeline(loader: Any, state: LoaderState, decision: Decision, options: Options) -> None:
    """Build (or take from the process's kept ones) the pipeline of the loader's first plan and
    leave it idle in the loader's pool, where its iterator takes it."""
    capacity = run_capacity(loader, options, decision.device)
    for plan in list(decision.plans.values())[:1]:
        kind = RAW if plan.worker_prefix else ENCODED
        runner = state.take_runner(plan.key, kind, capacity, decision.device,
                                   lookahead_batches(options.lookahead, max_batch_size(loader), decision.device),
                                   options.hw_decoder_load)
        state.give_back({(plan.key, kind): runner})


def _fall_back(wrapped: Any, loader: Any, state: LoaderState, options: Options, exc: Exception) -> Any:
    """Plain torchvision's iterator, counted, with the set-up's failure as the reason."""
    state.update(Decision(False, f"set-up failed ({exc.__class__.__name__}: {exc})",
                          worker_transforms=chain_names(loader.dataset)), options)
    logger.debug("set-up failed", exc_info=True)
    if options.strict == "on":
        state.check_strict()
    return CountedIterator(wrapped(), state.record, loader._auto_collation)


def run_capacity(loader: Any, options: Options, device: str) -> int:
    """A pipeline's batch size: the samples of the loader batches one run gathers."""
    batch_size = max_batch_size(loader)
    return batch_size * batches_per_run(batch_size, lookahead_batches(options.lookahead, batch_size, device), device)


class _InFlight:
    __slots__ = ("batch", "proxies", "error", "index", "units", "parts")

    def __init__(self, batch=None, proxies=(), error=None, index=-1, units=(), parts=()):
        self.batch, self.proxies, self.error, self.index = batch, proxies, error, index
        self.units = units  # what went to the runners, in order: ProxyGroups and SharedGroups
        self.parts = parts  # where each unit's rows are: its part of a run (None: no pipeline for it)


def pipeline_units(proxies: List[ProxyBatch], share: bool) -> List[Union[ProxyGroup, SharedGroup]]:
    """What one batch's groups run as: a group alone, or (``share``) groups whose payload is one
    tensor (a worker packed the same JPEGs, row for row, for several positions: the views of a
    multi-view recipe) as one SharedGroup, decoded once."""
    by_payload: Dict[int, List[ProxyGroup]] = {}
    units: List[Union[ProxyGroup, SharedGroup]] = []
    for pb in proxies:
        for group in pb.groups:
            if share and group.kind == ENCODED:
                views = by_payload.setdefault(id(group.payload), [])
                views.append(group)
                if len(views) > 1:
                    continue
            units.append(group)
    if not share:
        return units
    return [SharedGroup(by_payload[id(u.payload)]) if u.kind == ENCODED and len(by_payload[id(u.payload)]) > 1
            else u for u in units]


class ProxiedIterator(wrapt.ObjectProxy):
    """Wraps the DataLoader's own iterator (isinstance and attributes pass through)."""

    def __init__(self, inner: Any, loader: Any, state: LoaderState, decision: Decision, options: Options):
        super().__init__(inner)
        self._self_state = state
        self._self_device = decision.device
        self._self_out = output_device(decision.device, options)
        self._self_pin = bool(loader.pin_memory) and torch.cuda.is_available()
        self._self_capacity = run_capacity(loader, options, decision.device)
        self._self_lookahead = lookahead = lookahead_batches(options.lookahead, max_batch_size(loader),
                                                             decision.device)
        self._self_hw_decoder_load = options.hw_decoder_load
        self._self_share = options.shared_decode == "on"
        self._self_strict = options.strict == "on"
        self._self_inflight: collections.deque = collections.deque()
        self._self_count = 0
        self._self_taken = 0  # batches handed to the loop (this epoch)
        self._self_runners: Dict[RunnerKey, Any] = {}
        self._self_broken: Dict[RunnerKey, Exception] = {}  # pipelines that could not be built
        self._self_dataset = loader.dataset
        self._self_main_dataset = loader.dataset if loader.num_workers == 0 else None
        self._self_router = ChainRouter(decision.plans, loader.dataset) if loader.num_workers == 0 else None
        self._self_timeout = float(loader.timeout) if loader.timeout else None
        per_run = batches_per_run(max_batch_size(loader), lookahead, decision.device)
        self._self_runs = RunQueue(self._self_runners, per_run, runs_behind(lookahead, per_run),
                                   self._self_timeout)
        self._self_collate = on_device(decision.collate) if decision.collate is not None else None
        self._self_payloads = PooledPayloads()
        weakref.finalize(self, state.give_back, self._self_runners)

    # -- runners
    def _self_runner(self, unit: Union[ProxyGroup, SharedGroup]) -> Optional[Any]:
        """The pipeline for a group's plan and input kind (a SharedGroup: its views' plans),
        built on first use; None when it cannot be built (the group is then computed on the CPU)."""
        key = (unit.key, unit.kind)
        runner = self._self_runners.get(key)
        if runner is None and key not in self._self_broken:
            state = self._self_state
            for member in unit.members:
                if member.plan is not None:
                    state.learn(member.plan)
                    keep_joint_shape(member.plan, self._self_dataset)  # for the next epoch's decision and workers
            try:
                missing = [m.key for m in unit.members if m.key not in state.plans]
                if missing:
                    raise RuntimeError(f"no plan {missing[0]} was announced")
                runner = state.take_runner(unit.key, unit.kind, self._self_capacity, self._self_device,
                                           self._self_lookahead, self._self_hw_decoder_load)
            except Exception as exc:
                logger.warning("DataLoader #%d: no DALI pipeline for %s (%s): those samples are computed "
                               "by PIL and torchvision", state.record["loader"], unit.key, exc)
                self._self_broken[key] = f"{type(exc).__name__}: {exc}"  # text: no frames kept
                return None
            self._self_runners[key] = runner
        return runner

    def _reset(self, loader: Any, *args: Any, **kwargs: Any) -> None:
        """persistent_workers: a new epoch on the same iterator."""
        self._self_inflight.clear()
        self._self_taken = 0
        self._self_runs.clear()
        for runner in self._self_runners.values():
            runner.drain()
        return self.__wrapped__._reset(loader, *args, **kwargs)

    # -- iteration
    def __iter__(self):
        return self

    def __next__(self):
        inflight = self._self_inflight
        # The look-ahead fills as the loop goes (one batch more per batch taken): the first batch
        # waits for DALI on its own, not for the workers to make the whole look-ahead.
        depth = min(self._self_lookahead + 1, self._self_taken + 2)
        while len(inflight) < depth and not (inflight and inflight[-1].error is not None):
            entry = self._self_pull()
            if entry is None:
                self._self_runs.submit_open()  # the epoch's last batches: their runs gather no more
                break
            inflight.append(entry)
        if not inflight:
            raise StopIteration
        entry = inflight.popleft()
        self._self_taken += 1
        self._self_runs.submit_open(entry.parts)
        if entry.error is None:
            try:
                return self._self_finish(entry)
            except BaseException:
                self._self_end_if_a_worker_died()
                raise
        error, entry = entry.error, None
        self._self_state.loop_raised(error)
        try:
            raise error
        finally:  # no reference cycle frame -> error -> traceback -> frame: this iterator, and the
            error = None  # DataLoader's with its workers, are freed as soon as the loop lets go

    def _self_end_if_a_worker_died(self, wait: float = 0.0) -> List[int]:
        """A worker died (killed, out of memory): the DataLoader reports it from its SIGCHLD
        handler wherever the main thread is, and the iterator cannot go on. Its other workers
        are shut down now, not when the iterator is freed: the error's frames, kept by the loop
        or by the exceptions chained to it, would otherwise keep them running. ``wait``: up to
        that long for a death to show (its queue can close before the process is reaped).
        Returns the dead workers' pids."""
        workers = getattr(self.__wrapped__, "_workers", None) or []
        deadline = time.monotonic() + wait
        while True:
            dead = [w.pid for w in workers if not w.is_alive()]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if dead:
            self.__wrapped__._shutdown_workers()
        return dead

    def _self_fetch(self) -> Any:
        if self._self_main_dataset is None:
            return self.__wrapped__.__next__()
        undo = swap_folder_loaders(self._self_main_dataset)  # num_workers=0: around the fetch
        try:
            with routing(self._self_router):
                return self.__wrapped__.__next__()
        finally:
            unswap(undo)

    def _self_pull(self) -> Optional[_InFlight]:
        try:
            batch = self._self_fetch()
        except StopIteration:
            return None
        except Exception as exc:  # raised in its place in the batch order, as the DataLoader does
            # a dead worker's queue or shared-memory server fails before the process is reaped, the
            # later the more loaded the machine: the worker is given time to show as dead
            broken = isinstance(exc, (ConnectionError, EOFError))
            dead = self._self_end_if_a_worker_died(wait=DEATH_SHOWS_WITHIN if broken else 0.0)
            if dead and broken:  # the dead worker's queue, read first
                error = RuntimeError(f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited unexpectedly")
                error.__cause__ = exc
                return _InFlight(error=without_frames(error))
            return _InFlight(error=raised_here(exc) if self._self_router is not None else without_frames(exc))
        index = self._self_count
        self._self_count += 1
        if type(batch) is Unrouted:  # the chains were called, none taken: say why, hand it on as it is
            self._self_state.passed_over(batch.why)
            self._self_state.count_worker_decodes(batch.decoded)
            batch = batch.batch
        proxies = find_proxy_batches(batch)
        self._self_payloads.receive(proxies)
        units = pipeline_units(proxies, self._self_share)
        parts: List[Optional[Part]] = []
        for unit in units:  # a unit without a pipeline (it could not be built) is computed on the CPU
            parts.append(self._self_runs.add(unit) if self._self_runner(unit) is not None else None)
        return _InFlight(batch, proxies, None, index, units, parts)

    def _self_finish(self, entry: _InFlight):
        table: Dict[int, torch.Tensor] = {}
        try:
            collated = isinstance(entry.batch, ProxyCollated)
            outputs: Dict[int, Any] = {}  # id(group): its tensors
            for unit, part in zip(entry.units, entry.parts):
                out = self._self_broken[(unit.key, unit.kind)] if part is None else self._self_runs.output(part)
                why = out if isinstance(out, str) else None
                if why is not None:
                    out = [self._self_on_cpu(g, entry.index, why) for g in unit.members]
                    out = out if unit.kind == SHARED else out[0]
                outputs.update(zip(map(id, unit.members), out if unit.kind == SHARED else [out]))
            for pb in entry.proxies:
                table[id(pb)] = self._self_assemble(pb, [outputs[id(g)] for g in pb.groups], stack=not collated)
        finally:
            state = self._self_state
            rec = state.record
            state.count_decodes(entry.units)
            for pb in entry.proxies:
                state.routed += pb.size
                rec["cpu_path_samples"] += len(pb.done_indices)
                state.ran_in_worker += len(pb.done_indices)
                state.count_decoding(pb)
            if not state.routed:
                state.nothing_reached_dali(NOTHING_ROUTED)
            elif state.ran_in_worker == state.routed:  # every sample ran its chain in the worker
                state.nothing_reached_dali(next(iter(rec["decoded_in_worker"]), WHY_CPU))
            else:
                state.reached_dali()
        if self._self_strict:
            state.check_strict()
        if collated:  # the user's collate_fn, on DALI's tensors, under the worker's random states
            out = finish(entry.batch, [table[id(pb)] for pb in entry.batch.batches], self._self_collate)
            if self._self_out == "cpu" and self._self_pin:  # what the loader's pin thread would have done
                from torch.utils.data._utils.pin_memory import pin_memory
                out = pin_memory(out)
        else:
            out = put_back(entry.batch, table)
        rec["batches"] += 1  # what the loop receives: the batch, and its samples (not its views)
        rec["samples"] += max((pb.size for pb in entry.proxies), default=0) or batch_length(out)
        return out

    def _self_on_cpu(self, group: ProxyGroup, batch_index: int, dali_error: Any) -> List[torch.Tensor]:
        return replay_group(self._self_state, group, batch_index, dali_error, self._self_dataset)

    def _self_assemble(self, pb: ProxyBatch, outputs: List[Any], stack: bool = True) -> Any:
        """The batch's tensor in sample order (``stack=False``: one tensor per sample, for a
        user's collate_fn to batch)."""
        pieces: List[Tuple[List[int], Any]] = list(zip([g.indices for g in pb.groups], outputs))
        if pb.done_indices:
            pieces.append((pb.done_indices, pb.done_tensors()))
        if stack and len(pieces) == 1 and isinstance(pieces[0][1], torch.Tensor) and len(pieces[0][0]) == pb.size:
            result = pieces[0][1]
        else:
            samples: List[Any] = [None] * pb.size
            for indices, out in pieces:
                for i, t in zip(indices, out):
                    samples[i] = t.to(self._self_out) if self._self_out != "cpu" else t.cpu()
            if not stack:
                return samples
            result = torch.stack(samples)  # raises as default_collate would on unequal sizes
        if self._self_out == "cpu":
            result = result.cpu()
            if self._self_pin:
                result = result.pin_memory()
        elif result.device != torch.device(self._self_out):
            result = result.to(self._self_out)
        return result
