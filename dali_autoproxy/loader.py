"""The loader side: deciding per DataLoader, swapping transforms in workers, and the
iterator that runs DALI on each batch before the training loop sees it.

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
from torch.utils.data import get_worker_info

from .config import Options, logger
from .ir import Unsupported
from .planning import Path, Plan, build_plan, find_sites, resolve
from .translate import flatten, transform_name
from .transport import EncodedFileLoader, ProxyBatch, ProxyNode

LOOKAHEAD = 2  # batches handed to DALI ahead of the one the loop is waiting for


# ----------------------------------------------------------------------------- decision
@dataclass
class SitePlan:
    path: Path
    plan_id: int
    plan: Plan
    decode: bool

    def spec(self) -> Tuple[Path, int, str, bool, str]:
        """Picklable description for workers (they rebuild the plan from their own copy)."""
        return self.path, self.plan_id, self.plan.input_kind, self.decode, self.plan.signature()


@dataclass
class Decision:
    proxied: bool
    reason: Optional[str] = None
    device: Optional[str] = None
    sites: List[SitePlan] = field(default_factory=list)
    worker_transforms: List[str] = field(default_factory=list)


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


def decide(loader: Any, options: Options) -> Decision:
    """Proxy this loader, or say precisely why not. Never raises for user data."""
    from torch.utils.data.dataloader import _DatasetKind
    from torch.utils.data._utils.collate import default_collate
    dataset = loader.dataset
    names = _all_transform_names(dataset)
    if loader._dataset_kind != _DatasetKind.Map:
        return Decision(False, "IterableDataset is not supported (map-style datasets are)",
                        worker_transforms=names)
    if not loader._auto_collation:
        return Decision(False, "batch_size=None (no batching): nothing for a batched pipeline",
                        worker_transforms=names)
    if loader.collate_fn is not default_collate:
        return Decision(False, f"a custom collate_fn ({getattr(loader.collate_fn, '__name__', loader.collate_fn)!r}) "
                        "may look inside the images", worker_transforms=names)
    if max_batch_size(loader) is None:
        return Decision(False, "a batch_sampler without a batch_size attribute: the largest batch "
                        "(DALI's batch size) is unknown", worker_transforms=names)
    sites = find_sites(dataset)
    if not sites:
        return Decision(False, "the dataset has no `transform` attribute to move", worker_transforms=names)
    plans: List[SitePlan] = []
    for plan_id, site in enumerate(sites):
        try:
            plan = build_plan(site.holder.transform, "encoded" if site.decode else "raw")
        except Unsupported as exc:
            return Decision(False, f"transform: {exc}", worker_transforms=names)
        plans.append(SitePlan(site.path, plan_id, plan, site.decode and plan.input_kind == "encoded"))
    device, why = resolve_device(options)
    if device is None:
        return Decision(False, why, worker_transforms=names)
    return Decision(True, None, device, plans, [])


def max_batch_size(loader: Any) -> Optional[int]:
    """The largest batch the loader can make: DALI pipelines are sized for it."""
    if loader.batch_size is not None:
        return int(loader.batch_size)
    size = getattr(loader.batch_sampler, "batch_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None


def _all_transform_names(dataset: Any) -> List[str]:
    try:
        return [transform_name(t) for s in find_sites(dataset) for t in flatten(s.holder.transform)]
    except Exception:
        return []


# ----------------------------------------------------------------------------- workers
def install(dataset: Any, specs: List[Tuple[Path, int, str, bool, str]],
            plans: Optional[Dict[int, Plan]] = None) -> List[Tuple[Any, str, Any]]:
    """Swap the dataset's transforms (and PIL loader) for proxy nodes; return an undo list."""
    undo: List[Tuple[Any, str, Any]] = []
    for path, plan_id, input_kind, decode, signature in specs:
        holder = resolve(dataset, path)
        original = holder.transform
        try:
            plan = plans[plan_id] if plans else build_plan(original, input_kind)
        except Unsupported:
            plan = None
        if plan is None or plan.signature() != signature:
            # changed since the main process planned (say, by a worker_init_fn): leave this
            # site to torchvision; its finished tensors pass through the iterator untouched
            continue
        node = ProxyNode(plan_id, plan, original, getattr(holder, "samples", None))
        undo.append((holder, "transform", original))
        holder.transform = node
        standard = getattr(holder, "transforms", None)
        if standard is not None and getattr(standard, "transform", None) is original:
            undo.append((standard, "transform", original))
            standard.transform = node
        if decode:
            undo.append((holder, "loader", holder.loader))
            holder.loader = EncodedFileLoader()
    return undo


def uninstall(undo: List[Tuple[Any, str, Any]]) -> None:
    for obj, attr, value in reversed(undo):
        setattr(obj, attr, value)


class WorkerInstaller:
    """The worker_init_fn of a proxied loader: run the user's worker_init_fn, then swap the
    transforms in the worker's dataset copy. Picklable, for spawn and forkserver workers."""

    def __init__(self, specs, user_init_fn):
        self.specs = specs
        self.user_init_fn = user_init_fn

    def __call__(self, worker_id: int) -> None:
        if self.user_init_fn is not None:  # first: it may expect the dataset as the user left it
            self.user_init_fn(worker_id)
        install(get_worker_info().dataset, self.specs)


# ----------------------------------------------------------------------------- per-loader state
_ids = itertools.count(1)


class LoaderState:
    """What autoproxy knows about one DataLoader: its report row and idle DALI runners."""

    def __init__(self, loader: Any):
        self.record: Dict[str, Any] = {
            "loader": next(_ids), "dataset": type(loader.dataset).__name__,
            "batch_size": loader.batch_size, "num_workers": loader.num_workers,
            "proxied": False, "reason": "not iterated yet", "decode_on_dali": False,
            "worker_transforms": [], "dali_transforms": [], "device": "torchvision",
            "output": "cpu", "batches": 0, "samples": 0, "cpu_path_samples": 0, "partial": None,
        }
        self.idle_runners: Dict[int, list] = collections.defaultdict(list)
        self.lock = threading.Lock()
        self._logged: Optional[Tuple[bool, Optional[str]]] = None

    def update(self, decision: Decision, options: Options) -> None:
        rec = self.record
        rec["proxied"], rec["reason"] = decision.proxied, decision.reason
        if decision.proxied:
            rec["device"] = decision.device
            rec["output"] = output_device(decision.device, options)
            rec["decode_on_dali"] = any(s.decode for s in decision.sites)
            rec["dali_transforms"] = (["decode"] if rec["decode_on_dali"] else []) + \
                [n for s in decision.sites for n in s.plan.names]
            rec["worker_transforms"] = [n for s in decision.sites for n in s.plan.worker_names]
            splits = [f"{' -> '.join(s.plan.worker_names)} | {' -> '.join(s.plan.names)} ({s.plan.split_reason})"
                      for s in decision.sites if s.plan.worker_prefix]
            rec["partial"] = "; ".join(splits) or None
        else:
            rec["device"], rec["output"], rec["decode_on_dali"] = "torchvision", "cpu", False
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
                if rec["output"] != "cpu":
                    logger.info("DataLoader #%d: batches arrive as CUDA tensors on %s; if the model runs "
                                "on the CPU, set DALI_AUTOPROXY_OUTPUT=cpu (or enable(output='cpu'))",
                                rec["loader"], rec["output"])
            else:
                logger.warning("DataLoader #%d (%s): running plain torchvision: %s", rec["loader"],
                               rec["dataset"], decision.reason)

    def take_runner(self, site: SitePlan, batch_size: int, device: str):
        from .pipeline import DaliRunner
        with self.lock:
            pool = self.idle_runners[site.plan_id]
            while pool:
                runner = pool.pop()
                if runner.plan.signature() == site.plan.signature() and runner.batch_size == batch_size:
                    runner.drain()
                    return runner
        device_id = torch.cuda.current_device() if device == "gpu" else None
        return DaliRunner(site.plan, batch_size, device, device_id)

    def give_back(self, runners: Dict[int, Any]) -> None:
        with self.lock:
            for plan_id, runner in runners.items():
                self.idle_runners[plan_id].append(runner)


def output_device(device: str, options: Options) -> str:
    if device == "gpu" and options.output == "auto":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


# ----------------------------------------------------------------------------- the iterator
def _find_proxy_batches(obj: Any, found: List[ProxyBatch]) -> None:
    if isinstance(obj, ProxyBatch):
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _find_proxy_batches(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _find_proxy_batches(item, found)


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


class _InFlight:
    __slots__ = ("batch", "proxies", "error", "index")

    def __init__(self, batch=None, proxies=(), error=None, index=-1):
        self.batch, self.proxies, self.error, self.index = batch, proxies, error, index


class ProxiedIterator(wrapt.ObjectProxy):
    """Wraps the DataLoader's own iterator (isinstance and attributes pass through)."""

    def __init__(self, inner: Any, loader: Any, state: LoaderState, decision: Decision, options: Options):
        super().__init__(inner)
        self._self_state = state
        self._self_decision = decision
        self._self_out = output_device(decision.device, options)
        self._self_pin = bool(loader.pin_memory) and torch.cuda.is_available()
        self._self_batch_size = max_batch_size(loader)
        self._self_inflight: collections.deque = collections.deque()
        self._self_count = 0
        self._self_runners: Dict[int, Any] = {}
        self._self_main_dataset = loader.dataset if loader.num_workers == 0 else None
        self._self_dataset = loader.dataset
        self._self_timeout = float(loader.timeout) if loader.timeout else None
        self._self_plans = {s.plan_id: s.plan for s in decision.sites}
        self._self_specs = [s.spec() for s in decision.sites]
        self._self_acquire()

    # -- runners
    def _self_acquire(self) -> None:
        state, dec = self._self_state, self._self_decision
        self._self_runners = {s.plan_id: state.take_runner(s, self._self_batch_size, dec.device)
                              for s in dec.sites}
        weakref.finalize(self, state.give_back, self._self_runners)

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
        while len(inflight) < LOOKAHEAD + 1 and not (inflight and inflight[-1].error is not None):
            entry = self._self_pull()
            if entry is None:
                break
            inflight.append(entry)
        if not inflight:
            raise StopIteration
        entry = inflight.popleft()
        if entry.error is not None:
            raise entry.error
        return self._self_finish(entry)

    def _self_pull(self) -> Optional[_InFlight]:
        undo = None
        try:
            if self._self_main_dataset is not None:  # num_workers=0: swap around the fetch
                undo = install(self._self_main_dataset, self._self_specs, self._self_plans)
            batch = self.__wrapped__.__next__()
        except StopIteration:
            return None
        except Exception as exc:  # raised in its place in the batch order, as the DataLoader does
            return _InFlight(error=exc)
        finally:
            if undo:
                uninstall(undo)
        index = self._self_count
        self._self_count += 1
        proxies: List[ProxyBatch] = []
        _find_proxy_batches(batch, proxies)
        for pb in proxies:
            for group in pb.groups:
                self._self_runners[group.plan_id].submit(group)
        return _InFlight(batch, proxies, None, index)

    def _self_finish(self, entry: _InFlight):
        table: Dict[int, torch.Tensor] = {}
        try:
            for pb in entry.proxies:
                outputs = []
                for gi, group in enumerate(pb.groups):
                    try:
                        outputs.append(self._self_runners[group.plan_id].collect(self._self_timeout))
                    except Exception as exc:
                        self._self_recover(entry, pb, gi)
                        outputs.append(self._self_on_cpu(group, entry.index, exc))
                table[id(pb)] = self._self_assemble(pb, outputs)
        finally:
            rec = self._self_state.record
            rec["batches"] += 1
            for pb in entry.proxies:
                rec["samples"] += pb.size
                rec["cpu_path_samples"] += len(pb.done_indices)
        return _replace(entry.batch, table)

    def _self_on_cpu(self, group, batch_index: int, dali_error: Exception) -> List[torch.Tensor]:
        """DALI failed on this batch: replay its samples through PIL and torchvision's
        functional ops with the params drawn in the worker (PIL's pixels, or PIL's error)."""
        from .cpu_path import decode_like_pil_loader, run_plan
        plan = self._self_plans[group.plan_id]
        out = []
        for k, (view, path) in enumerate(zip(group.payload_views(), group.paths)):
            try:
                img = decode_like_pil_loader(view.tobytes()) if plan.input_kind == "encoded" else view
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
        """'dataset index N, file F' for DatasetFolder-like datasets, else what is known."""
        if path is None:
            return "pixels produced by the dataset"
        for site in find_sites(self._self_dataset):
            for i, sample in enumerate(getattr(site.holder, "samples", ()) or ()):
                if sample[0] == path:
                    return f"{type(site.holder).__name__} index {i}, file {path}"
        return f"file {path}"

    def _self_recover(self, failed: _InFlight, pb: ProxyBatch, group_index: int) -> None:
        """Rebuild the failed runner and resubmit what was queued behind the failed batch."""
        plan_id = pb.groups[group_index].plan_id
        runner = self._self_runners[plan_id]
        runner.rebuild()
        later_groups = [g for g in pb.groups[group_index + 1:] if g.plan_id == plan_id]
        later_groups += [g for pb2 in failed.proxies[failed.proxies.index(pb) + 1:]
                         for g in pb2.groups if g.plan_id == plan_id]
        later_groups += [g for e in self._self_inflight for pb2 in e.proxies
                         for g in pb2.groups if g.plan_id == plan_id]
        for g in later_groups:
            runner.submit(g)

    def _self_assemble(self, pb: ProxyBatch, outputs: List[Any]) -> torch.Tensor:
        pieces: List[Tuple[List[int], Any]] = list(zip([g.indices for g in pb.groups], outputs))
        if pb.done_indices:
            pieces.append((pb.done_indices, pb.done_tensors()))
        if len(pieces) == 1 and isinstance(pieces[0][1], torch.Tensor) and len(pieces[0][0]) == pb.size:
            result = pieces[0][1]
        else:
            samples: List[Any] = [None] * pb.size
            for indices, out in pieces:
                for i, t in zip(indices, out):
                    samples[i] = t.to(self._self_out) if self._self_out != "cpu" else t.cpu()
            result = torch.stack(samples)  # raises as default_collate would on unequal sizes
        if self._self_out == "cpu":
            result = result.cpu()
            if self._self_pin:
                result = result.pin_memory()
        elif result.device != torch.device(self._self_out):
            result = result.to(self._self_out)
        return result
