"""The loader side: deciding per DataLoader, the set-up of its workers, and the iterator that
runs DALI on each batch before the training loop sees it.

DALI's own proxy sends work to the main process on a second queue and waits on it with
no timeout; a pipeline that fails before producing output blocks forever, and the batch
order must be rebuilt from batch ids. Here the proxied batch rides the DataLoader's own
result queue (transport.py), so order, ``timeout=``, worker errors and shutdown stay
exactly the DataLoader's, and DALI runs in the main process just ahead of the loop.
"""
from __future__ import annotations

import collections
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import wrapt

from dali_autoproxy.worker.collate import CollateInMain, DefaultCollate, ProxyCollated, find_proxy_batches, finish, on_device
from dali_autoproxy.config import Options, logger
from dali_autoproxy.worker.intercept import ChainRouter, WorkerInstaller, patch, routing, swap_folder_loaders, unswap
from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import SETTINGS, Plan, build_plan, walk
from dali_autoproxy.plan.translate import flatten, transform_name
from dali_autoproxy.transport import ENCODED, RAW, ProxyBatch, ProxyGroup


RunnerKey = Tuple[str, str]  # (plan key, input kind)
NOTHING_ROUTED = ("no recognised chain was called with one image in __getitem__ (a joint image+target "
                  "transform, say): the batches are plain torchvision's")


# ----------------------------------------------------------------------------- decision
@dataclass
class Decision:
    proxied: bool
    reason: Optional[str] = None
    device: Optional[str] = None
    plans: Dict[str, Plan] = field(default_factory=dict)  # by key: the chains found in the dataset
    chain_classes: set = field(default_factory=set)       # their types, whose calls the workers take
    worker_transforms: List[str] = field(default_factory=list)
    unplanned: List[str] = field(default_factory=list)    # chains found that stay in the worker, and why
    collate: Any = None                                   # the user's collate_fn, run in the main process


def dali_import_error() -> Optional[str]:
    try:
        import nvidia.dali  # noqa: F401
        return None
    except Exception as exc:  # ImportError, or a broken install
        return f"DALI is not installed or failed to import ({exc.__class__.__name__}: {exc})"


def resolve_device(options: Options) -> Tuple[Optional[str], Optional[str]]:
    err = dali_import_error()
    if err:
        return None, err + "; pip install 'dali-autoproxy[dali]'"
    if options.device == "cpu":
        return "cpu", None
    if torch.cuda.is_available():
        return "gpu", None
    return None, ("no usable CUDA GPU (device=" + options.device +
                  "); DALI_AUTOPROXY_DEVICE=cpu runs DALI's CPU backend instead")


def _path_text(path: Tuple[Any, ...]) -> str:
    out = "dataset"
    for step in path:
        out += f"[{step!r}]" if isinstance(step, int) else f".{step}"
    return out


def chain_names(dataset: Any) -> List[str]:
    """The transforms of every chain found in the dataset (the report's worker column)."""
    try:
        return [transform_name(t) for _, chain in walk(dataset).chains for t in flatten(chain)]
    except Exception:
        return []


def decide(loader: Any, options: Options) -> Decision:
    """Proxy this loader, or say precisely why not. Never raises for user data."""
    from torch.utils.data._utils.collate import default_collate
    found = walk(loader.dataset)
    names = [transform_name(t) for _, chain in found.chains for t in flatten(chain)]
    if not loader._auto_collation:
        return Decision(False, "batch_size=None (no batching): nothing for a batched pipeline",
                        worker_transforms=names)
    if max_batch_size(loader) is None:
        return Decision(False, "a batch_sampler without a batch_size attribute: the largest batch "
                        "(DALI's batch size) is unknown", worker_transforms=names)
    if not found.chains:
        return Decision(False, "no torchvision transform chain found in the dataset (its attributes, closures "
                        "and the module globals its methods use)", worker_transforms=names)
    plans: Dict[str, Plan] = {}
    unplanned: List[str] = []
    first_reason = None
    for path, chain in found.chains:
        try:
            plan = build_plan(chain)
        except Unsupported as exc:
            first_reason = first_reason or str(exc)  # text, not the exception: see _own_frames_dropped
            unplanned.append(f"{_path_text(path)}: {exc}")
            continue
        plans.setdefault(plan.key, plan)
    if not plans:
        return Decision(False, f"transform: {first_reason}", worker_transforms=names)
    device, why = resolve_device(options)
    if device is None:
        return Decision(False, why, worker_transforms=names)
    classes = {type(chain) for _, chain in found.chains}
    collate = None if loader.collate_fn is default_collate else loader.collate_fn
    return Decision(True, None, device, plans, classes, unplanned=unplanned, collate=collate)


def max_batch_size(loader: Any) -> Optional[int]:
    """The largest batch the loader can make: DALI pipelines are sized for it."""
    if loader.batch_size is not None:
        return int(loader.batch_size)
    size = getattr(loader.batch_sampler, "batch_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None


# ----------------------------------------------------------------------------- per-loader state
_ids = itertools.count(1)


class LoaderState:
    """What autoproxy knows about one DataLoader: its report row and idle DALI runners."""

    def __init__(self, loader: Any):
        self.record: Dict[str, Any] = {
            "loader": next(_ids), "dataset": type(loader.dataset).__name__,
            "batch_size": loader.batch_size, "num_workers": loader.num_workers,
            "proxied": False, "reason": "not iterated yet", "decode": "-", "decode_on_dali": False, "decoded_on_dali": 0,
            "decoded_in_worker": {}, "worker_transforms": [], "dali_transforms": [], "device": "torchvision",
            "output": "cpu", "batches": 0, "samples": 0, "cpu_path_samples": 0, "partial": None,
            "iterated": False,  # report() lists the loaders a loop iterated (accelerate rebuilds the others)
        }
        self.idle_runners: Dict[RunnerKey, list] = collections.defaultdict(list)
        self.plans: Dict[str, Plan] = {}
        self.lock = threading.Lock()
        self._logged: Optional[Tuple[bool, Optional[str]]] = None

    def update(self, decision: Decision, options: Options) -> None:
        rec = self.record
        rec["proxied"], rec["reason"] = decision.proxied, decision.reason
        if decision.proxied:
            self.plans.update(decision.plans)
            rec["device"] = decision.device
            rec["output"] = output_device(decision.device, options)
            self._describe_plans()
        else:
            rec["device"], rec["output"] = "torchvision", "cpu"
            rec["dali_transforms"], rec["worker_transforms"] = [], decision.worker_transforms
            rec["partial"] = None
        key = (decision.proxied, decision.reason)
        if key != self._logged:
            self._logged = key
            if decision.proxied:
                logger.info("DataLoader #%d (%s): proxied to DALI on %s: %s", rec["loader"],
                            rec["dataset"], rec["device"], " -> ".join(rec["dali_transforms"]))
                if rec["partial"]:
                    logger.info("DataLoader #%d: partial offload, worker | DALI: %s", rec["loader"], rec["partial"])
                for line in decision.unplanned:
                    logger.info("DataLoader #%d: stays in the worker: %s", rec["loader"], line)
                if rec["output"] != "cpu":
                    logger.info("DataLoader #%d: batches arrive as CUDA tensors on %s; if the model runs "
                                "on the CPU, set DALI_AUTOPROXY_OUTPUT=cpu (or enable(output='cpu'))",
                                rec["loader"], rec["output"])
            else:
                logger.warning("DataLoader #%d (%s): running plain torchvision: %s", rec["loader"],
                               rec["dataset"], decision.reason)

    def _describe_plans(self) -> None:
        rec, plans = self.record, list(self.plans.values())
        rec["dali_transforms"] = (["decode"] if rec["decode_on_dali"] else []) + [n for p in plans for n in p.names]
        rec["worker_transforms"] = [n for p in plans for n in p.worker_names]
        splits = [f"{' -> '.join(p.worker_names)} | {' -> '.join(p.names)} ({p.split_reason})"
                  for p in plans if p.worker_prefix]
        rec["partial"] = "; ".join(splits) or None

    def learn(self, plan: Plan) -> None:
        """A plan a worker announced (a chain the walk did not find)."""
        with self.lock:
            if plan.key not in self.plans:
                self.plans[plan.key] = plan
                logger.info("DataLoader #%d: a chain called in the workers joins DALI: %s",
                            self.record["loader"], " -> ".join(plan.names))
                self._describe_plans()

    def count_decoding(self, pb: ProxyBatch) -> None:
        rec = self.record
        rec["decoded_on_dali"] += sum(len(g.indices) for g in pb.groups if g.kind == ENCODED)
        for why, n in pb.why.items():
            rec["decoded_in_worker"][why] = rec["decoded_in_worker"].get(why, 0) + n
        if rec["decoded_on_dali"] and not rec["decode_on_dali"]:
            rec["decode_on_dali"] = True
            self._describe_plans()
        total = rec["decoded_on_dali"] + sum(rec["decoded_in_worker"].values())
        if total:
            parts = [f"DALI {100 * rec['decoded_on_dali'] / total:.0f}%"] if rec["decoded_on_dali"] else []
            parts += [f"worker {100 * n / total:.0f}% ({why})" for why, n in rec["decoded_in_worker"].items()]
            rec["decode"] = "; ".join(parts)

    def take_runner(self, plan: Plan, kind: str, batch_size: int, device: str, ahead: int,
                    hw_decoder_load: float):
        from dali_autoproxy.backends.dali.pipeline import DaliRunner
        with self.lock:
            pool = self.idle_runners[(plan.key, kind)]
            while pool:
                runner = pool.pop()
                if (runner.batch_size, runner.ahead, runner.hw_decoder_load) == (batch_size, ahead, hw_decoder_load):
                    runner.drain()
                    return runner
        device_id = torch.cuda.current_device() if device == "gpu" else None
        return DaliRunner(plan, kind, batch_size, device, device_id, ahead=ahead, hw_decoder_load=hw_decoder_load)

    def give_back(self, runners: Dict[RunnerKey, Any]) -> None:
        with self.lock:
            for key, runner in runners.items():
                self.idle_runners[key].append(runner)


def output_device(device: str, options: Options) -> str:
    if device == "gpu" and options.output == "auto":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def batch_length(batch: Any) -> int:
    """Samples in a collated batch: the first dimension of its first tensor (0 when none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_length(item)
            if n:
                return n
    return 0


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
    """The DataLoader's ``_get_iterator``, proxied when the decision says so. DALI pipelines are
    built before any worker starts, so a failure there is a clean fallback."""
    try:
        decision = decide(loader, options)
        state.update(decision, options)
        if not decision.proxied:
            return CountedIterator(wrapped(), state.record, loader._auto_collation)
        batch_size = max_batch_size(loader)
        for plan in decision.plans.values():
            kind = RAW if plan.worker_prefix else ENCODED
            runner = state.take_runner(plan, kind, batch_size, decision.device, options.lookahead,
                                       options.hw_decoder_load)
            state.give_back({(plan.key, kind): runner})
    except Exception as exc:
        state.update(Decision(False, f"set-up failed ({exc.__class__.__name__}: {exc})",
                              worker_transforms=chain_names(loader.dataset)), options)
        logger.debug("set-up failed", exc_info=True)
        return CountedIterator(wrapped(), state.record, loader._auto_collation)
    user_init, user_collate = loader.worker_init_fn, loader.collate_fn
    # the workers collate proxies; a user's collate runs here, on DALI's tensors
    loader.collate_fn = CollateInMain(decision.collate) if decision.collate is not None else DefaultCollate()
    if loader.num_workers > 0:
        loader.worker_init_fn = WorkerInstaller(set(decision.plans), decision.chain_classes, user_init, SETTINGS)
    else:
        patch(decision.chain_classes)
    try:
        inner = wrapped()
    finally:
        loader.worker_init_fn, loader.collate_fn = user_init, user_collate
    return ProxiedIterator(inner, loader, state, decision, options)


# ----------------------------------------------------------------------------- the iterator
def _replace(obj: Any, table: Dict[int, torch.Tensor]) -> Any:
    """Rebuild the batch's nesting (tuple, list, dict, namedtuple) with tensors in place."""
    if isinstance(obj, ProxyBatch):
        return table[id(obj)]
    if isinstance(obj, tuple):
        items = [_replace(x, table) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        obj[:] = [_replace(x, table) for x in obj]
        return obj
    if isinstance(obj, dict):
        for k in obj:
            obj[k] = _replace(obj[k], table)
        return obj
    return obj


def _without_frames(exc: BaseException) -> BaseException:
    """``exc`` (and the exceptions chained to it) without tracebacks, to be raised later in its
    place in the batch order. A kept traceback holds its frames, and each frame its caller
    (``f_back``): the iterator's own frames among them, a cycle that would keep the iterator,
    and the DataLoader's workers, alive after a ``break`` until the next garbage collection.
    What the user reads stays: a worker's error carries the worker's traceback in its message,
    as the DataLoader raises it."""
    seen = set()
    e: "BaseException | None" = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


class _InFlight:
    __slots__ = ("batch", "proxies", "error", "index")

    def __init__(self, batch=None, proxies=(), error=None, index=-1):
        self.batch, self.proxies, self.error, self.index = batch, proxies, error, index


class ProxiedIterator(wrapt.ObjectProxy):
    """Wraps the DataLoader's own iterator (isinstance and attributes pass through)."""

    def __init__(self, inner: Any, loader: Any, state: LoaderState, decision: Decision, options: Options):
        super().__init__(inner)
        self._self_state = state
        self._self_device = decision.device
        self._self_out = output_device(decision.device, options)
        self._self_pin = bool(loader.pin_memory) and torch.cuda.is_available()
        self._self_batch_size = max_batch_size(loader)
        self._self_lookahead = options.lookahead
        self._self_hw_decoder_load = options.hw_decoder_load
        self._self_inflight: collections.deque = collections.deque()
        self._self_count = 0
        self._self_runners: Dict[RunnerKey, Any] = {}
        self._self_broken: Dict[RunnerKey, Exception] = {}  # pipelines that could not be built
        self._self_dataset = loader.dataset
        self._self_main_dataset = loader.dataset if loader.num_workers == 0 else None
        self._self_router = ChainRouter(decision.plans) if loader.num_workers == 0 else None
        self._self_timeout = float(loader.timeout) if loader.timeout else None
        self._self_collate = on_device(decision.collate) if decision.collate is not None else None
        weakref.finalize(self, state.give_back, self._self_runners)

    # -- runners
    def _self_runner(self, group: ProxyGroup) -> Optional[Any]:
        """The pipeline for a group's plan and input kind, built on first use; None when it
        cannot be built (the group is then computed on the CPU)."""
        key = (group.key, group.kind)
        runner = self._self_runners.get(key)
        if runner is None and key not in self._self_broken:
            state = self._self_state
            if group.plan is not None:
                state.learn(group.plan)
            plan = state.plans.get(group.key)
            try:
                if plan is None:
                    raise RuntimeError(f"no plan {group.key} was announced")
                runner = state.take_runner(plan, group.kind, self._self_batch_size, self._self_device,
                                           self._self_lookahead, self._self_hw_decoder_load)
            except Exception as exc:
                logger.warning("DataLoader #%d: no DALI pipeline for %s (%s): those samples are computed "
                               "by PIL and torchvision", state.record["loader"], group.key, exc)
                self._self_broken[key] = f"{type(exc).__name__}: {exc}"  # text: no frames kept
                return None
            self._self_runners[key] = runner
        return runner

    def _reset(self, loader: Any, *args: Any, **kwargs: Any) -> None:
        """persistent_workers: a new epoch on the same iterator."""
        self._self_inflight.clear()
        for runner in self._self_runners.values():
            runner.drain()
        return self.__wrapped__._reset(loader, *args, **kwargs)

    # -- iteration
    def __iter__(self):
        return self

    def __next__(self):
        inflight = self._self_inflight
        while len(inflight) < self._self_lookahead + 1 and not (inflight and inflight[-1].error is not None):
            entry = self._self_pull()
            if entry is None:
                break
            inflight.append(entry)
        if not inflight:
            raise StopIteration
        entry = inflight.popleft()
        if entry.error is None:
            return self._self_finish(entry)
        error, entry = entry.error, None
        try:
            raise error
        finally:  # no reference cycle frame -> error -> traceback -> frame: this iterator, and the
            error = None  # DataLoader's with its workers, are freed as soon as the loop lets go

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
            return _InFlight(error=_without_frames(exc))
        index = self._self_count
        self._self_count += 1
        proxies: List[ProxyBatch] = []
        find_proxy_batches(batch, proxies)
        for pb in proxies:
            for group in pb.groups:
                runner = self._self_runner(group)
                if runner is not None:
                    runner.submit(group)
        return _InFlight(batch, proxies, None, index)

    def _self_finish(self, entry: _InFlight):
        table: Dict[int, torch.Tensor] = {}
        try:
            collated = isinstance(entry.batch, ProxyCollated)
            for pb in entry.proxies:
                outputs = []
                for gi, group in enumerate(pb.groups):
                    runner = self._self_runners.get((group.key, group.kind))
                    if runner is None:
                        outputs.append(self._self_on_cpu(group, entry.index, self._self_broken[(group.key, group.kind)]))
                        continue
                    try:
                        outputs.append(runner.collect(self._self_timeout))
                    except Exception as exc:
                        self._self_recover(entry, pb, gi)
                        outputs.append(self._self_on_cpu(group, entry.index, exc))
                table[id(pb)] = self._self_assemble(pb, outputs, stack=not collated)
        finally:
            rec = self._self_state.record
            rec["batches"] += 1
            if not entry.proxies and not rec["samples"]:
                rec["reason"] = NOTHING_ROUTED
            elif entry.proxies and rec["reason"] == NOTHING_ROUTED:
                rec["reason"] = None
            for pb in entry.proxies:
                rec["samples"] += pb.size
                rec["cpu_path_samples"] += len(pb.done_indices)
                self._self_state.count_decoding(pb)
        if collated:  # the user's collate_fn, on DALI's tensors, under the worker's random states
            out = finish(entry.batch, [table[id(pb)] for pb in entry.batch.batches], self._self_collate)
            if self._self_out == "cpu" and self._self_pin:  # what the loader's pin thread would have done
                from torch.utils.data._utils.pin_memory import pin_memory
                out = pin_memory(out)
            return out
        return _replace(entry.batch, table)

    def _self_on_cpu(self, group: ProxyGroup, batch_index: int, dali_error: Any) -> List[torch.Tensor]:
        """DALI failed on this batch: replay its samples through PIL and torchvision's
        functional ops with the params drawn in the worker (PIL's pixels, or PIL's error)."""
        from dali_autoproxy.backends.cpu_replay import decode_like_pil_loader, run_plan
        plan = self._self_state.plans[group.key]
        out = []
        for k, (view, path) in enumerate(zip(group.payload_views(), group.paths)):
            try:
                img = decode_like_pil_loader(view.tobytes()) if group.kind == ENCODED else view
                out.append(run_plan(plan, img, group.params[k].tolist()))
            except Exception as exc:
                msg = (f"{exc} [{self._self_describe(path)}; batch {batch_index}; "
                       f"DALI failed on it too: {dali_error}]")
                try:
                    err = type(exc)(msg)
                except Exception:
                    err = RuntimeError(msg)
                raise err from exc
        logger.warning("DataLoader #%d: DALI failed on batch %d (%s); its %d samples were computed by "
                       "PIL and torchvision instead", self._self_state.record["loader"], batch_index,
                       str(dali_error).strip().splitlines()[-1][:200], len(out))
        self._self_state.record["cpu_path_samples"] += len(out)
        return out

    def _self_describe(self, path: Optional[str]) -> str:
        """'dataset index N, file F' where the dataset lists its files, else what is known."""
        if path is None:
            return "pixels produced by the dataset"
        for folder in walk(self._self_dataset).folders:
            for i, sample in enumerate(getattr(folder, "samples", ()) or ()):
                if sample[0] == path:
                    return f"{type(folder).__name__} index {i}, file {path}"
        return f"file {path}"

    def _self_recover(self, failed: _InFlight, pb: ProxyBatch, group_index: int) -> None:
        """Rebuild the failed runner and resubmit what was queued behind the failed batch."""
        key = (pb.groups[group_index].key, pb.groups[group_index].kind)
        runner = self._self_runners[key]
        runner.rebuild()

        def same(g: ProxyGroup) -> bool:
            return (g.key, g.kind) == key
        later_groups = [g for g in pb.groups[group_index + 1:] if same(g)]
        later_groups += [g for pb2 in failed.proxies[failed.proxies.index(pb) + 1:] for g in pb2.groups if same(g)]
        later_groups += [g for e in self._self_inflight for pb2 in e.proxies for g in pb2.groups if same(g)]
        for g in later_groups:
            runner.submit(g)

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
