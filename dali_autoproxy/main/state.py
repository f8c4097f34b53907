"""What autoproxy knows about one DataLoader, in the main process: its report row, the plans
its workers use, and its idle DALI runners (kept between epochs, handed back by each iterator)."""
from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import torch

from dali_autoproxy.config import Options, StrictModeError, logger
from dali_autoproxy.main.decision import Decision
from dali_autoproxy.plan.planning import Plan
from dali_autoproxy.transport import ENCODED, SHARED, ProxyBatch

RunnerKey = Tuple[str, str]  # (plan key, input kind)

_ids = itertools.count(1)

KEPT_AFTER_LOADER = 2  # idle pipelines kept once their loader is gone, for the next loader of the same plan


class _KeptRunners:
    """The idle runners of loaders that are gone, kept for a later loader with the same plan and
    settings (a script that builds a new eval loader every epoch pays a pipeline's build, and its
    torch stage's first launches, once per process instead of once per epoch). At most
    ``KEPT_AFTER_LOADER``, the oldest closed first; ``disable()`` closes them all."""

    def __init__(self) -> None:
        self._runners: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _settings(key: RunnerKey, runner: Any) -> tuple:
        return (key, runner.batch_size, runner.ahead, runner.hw_decoder_load, runner.device, runner.device_id)

    def keep(self, idle: Dict[RunnerKey, list]) -> None:
        """A gone loader's idle runners (its state's finalizer)."""
        closing = []
        with self._lock:
            for key, pool in idle.items():
                for runner in pool:
                    if runner.pipe is None:
                        continue
                    old = self._runners.pop(self._settings(key, runner), None)
                    if old is not None:
                        closing.append(old)
                    self._runners[self._settings(key, runner)] = runner
            while len(self._runners) > KEPT_AFTER_LOADER:
                closing.append(self._runners.popitem(last=False)[1])
            idle.clear()
        for runner in closing:
            runner.close()

    def take(self, settings: tuple) -> Optional[Any]:
        with self._lock:
            return self._runners.pop(settings, None)

    def close(self) -> None:
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        for runner in runners:
            runner.close()


kept_runners = _KeptRunners()


class LoaderState:
    """What autoproxy knows about one DataLoader: its report row and idle DALI runners."""

    def __init__(self, loader: Any):
        self.record: Dict[str, Any] = {
            "loader": next(_ids), "dataset": type(loader.dataset).__name__,
            "batch_size": loader.batch_size, "num_workers": loader.num_workers,
            "proxied": False, "reason": "not iterated yet", "decode": "-", "decode_on_dali": False,
            "decoded_on_dali": 0, "dali_decodes": 0,  # images DALI made / JPEG decodes (views share one)
            "decoded_in_worker": {}, "worker_transforms": [], "dali_transforms": [], "device": "torchvision",
            "output": "cpu", "batches": 0, "samples": 0, "cpu_path_samples": 0, "partial": None,
            "passed_over": {},  # chain calls the workers did not take over, by why
            "iterated": False,  # report() lists the loaders a loop iterated (accelerate rebuilds the others)
        }
        self.idle_runners: Dict[RunnerKey, list] = collections.defaultdict(list)
        self.plans: Dict[str, Plan] = {}
        self.used: set = set()  # keys of the plans batches came with (a worker may replan a chain)
        self.routed = 0  # chain outputs (views) the workers sent as proxies, DALI's or done in the worker
        self.ran_in_worker = 0  # of those, the ones whose whole chain ran in the worker (none reached DALI)
        self.lock = threading.Lock()
        self._logged: Optional[Tuple[bool, Optional[str], tuple]] = None
        self._announced: set = set()  # the step chains learn() has logged
        weakref.finalize(self, kept_runners.keep, self.idle_runners)  # the loader is gone: keep its pipelines

    def update(self, decision: Decision, options: Options, announce: bool = True) -> None:
        """The loader's decision, in its report row; ``announce``: logged too (once per decision
        and chain). The decision at construction is not: the dataset's transform may change before
        the loop (DeiT's 3-Augment replaces it on ``loader.dataset``), and the log names what runs."""
        rec = self.record
        rec["proxied"], rec["reason"] = decision.proxied, decision.reason
        if decision.proxied:  # this decision's plans; the workers announce any other chain they call
            self.plans = dict(decision.plans)
            rec["device"] = decision.device
            rec["output"] = output_device(decision.device, options)
            self._describe_plans()
        else:
            rec["device"], rec["output"] = "torchvision", "cpu"
            rec["dali_transforms"], rec["worker_transforms"] = [], decision.worker_transforms
            rec["partial"] = None
        key = (decision.proxied, decision.reason, tuple(n for n in rec["dali_transforms"] if n != "decode"))
        if announce and key != self._logged:
            self._logged = key
            if decision.proxied:
                chain = " -> ".join(rec["dali_transforms"]) or (
                    "joint transforms (" + "; ".join(decision.joint) + "), planned in the workers per call: "
                    "the image on DALI, the targets in the worker")
                logger.info("DataLoader #%d (%s): proxied to DALI on %s: %s", rec["loader"],
                            rec["dataset"], rec["device"], chain)
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
        rec = self.record
        plans = [p for p in self.plans.values() if not self.used or p.key in self.used]
        # a chain planned again per shape (joint transforms, recorded calls) listed once; distinct chains
        # each, though their steps have the same names (VICReg's two views: the same classes, other odds)
        varied = list(dict.fromkeys((p.chain, tuple(p.names)) for p in plans if p.any_size or p.records))
        named = [tuple(p.names) for p in plans if not (p.any_size or p.records)] + [names for _, names in varied]
        rec["dali_transforms"] = (["decode"] if rec["decode_on_dali"] else []) + [n for names in named for n in names]
        rec["worker_transforms"] = [n for p in plans for n in p.worker_names]
        splits = [f"{' -> '.join(p.worker_names)} | {' -> '.join(p.names)} ({p.split_reason})"
                  for p in plans if p.worker_prefix]
        rec["partial"] = "; ".join(splits) or None

    def learn(self, plan: Plan) -> None:
        """A plan a worker announced (a chain the walk did not find, or a joint transform planned
        for one more shape: said once per chain of steps)."""
        with self.lock:
            if plan.key not in self.plans:
                self.plans[plan.key] = plan
                steps = " -> ".join(plan.names)
                if steps not in self._announced:
                    self._announced.add(steps)
                    logger.info("DataLoader #%d: a chain called in the workers joins DALI: %s",
                                self.record["loader"], steps)
                self._describe_plans()

    def off_dali(self) -> Optional[str]:
        """What of this loader has not run on DALI so far, in words (None: everything did)."""
        rec = self.record
        if not rec["proxied"]:
            return f"it runs plain torchvision: {rec['reason']}"
        if rec["worker_transforms"]:
            kept = " -> ".join(rec["worker_transforms"])
            return f"steps stay in the worker: {kept}" + (f" ({rec['partial']})" if rec["partial"] else "")
        if rec["decoded_in_worker"]:
            return "images decoded in the worker: " + "; ".join(
                f"{n} ({why})" for why, n in rec["decoded_in_worker"].items())
        if rec["passed_over"]:
            return "chain calls the workers did not take over: " + "; ".join(
                f"{n} ({why})" for why, n in rec["passed_over"].items())
        if rec["cpu_path_samples"]:
            return (f"{rec['cpu_path_samples']} samples were computed by PIL and torchvision (their chain ran in "
                    "the worker, or DALI failed on their batch: the log says which)")
        return None

    def check_strict(self) -> None:
        """strict="on": raise StrictModeError where anything of this loader did not run on DALI."""
        why = self.off_dali()
        if why is not None:
            rec = self.record
            raise StrictModeError(f"DataLoader #{rec['loader']} ({rec['dataset']}) does not run on DALI "
                                  f"(strict mode): {why}")

    def count_decoding(self, pb: ProxyBatch) -> None:
        rec = self.record
        rec["decoded_on_dali"] += sum(len(g.indices) for g in pb.groups if g.kind == ENCODED)
        keys = {g.key for g in pb.groups} - self.used
        if keys:
            self.used |= keys
            self._describe_plans()
        if rec["decoded_on_dali"] and not rec["decode_on_dali"]:
            rec["decode_on_dali"] = True
            self._describe_plans()
        self.count_worker_decodes(pb.why)

    def count_worker_decodes(self, why: Dict[str, int]) -> None:
        """Images decoded in the workers, by why (samples for DALI that came decoded, and those
        whose joint call ran as written), and the decode share again."""
        rec = self.record
        for reason, n in why.items():
            rec["decoded_in_worker"][reason] = rec["decoded_in_worker"].get(reason, 0) + n
        total = rec["decoded_on_dali"] + sum(rec["decoded_in_worker"].values())
        if total:
            parts = [f"DALI {100 * rec['decoded_on_dali'] / total:.0f}%"] if rec["decoded_on_dali"] else []
            parts += [f"worker {100 * n / total:.0f}% ({why})" for why, n in rec["decoded_in_worker"].items()]
            rec["decode"] = "; ".join(parts)

    def passed_over(self, why: Dict[str, int]) -> None:
        """Chain calls a worker did not take over (joint image-and-target calls), by why."""
        seen = self.record["passed_over"]
        for reason, n in why.items():
            seen[reason] = seen.get(reason, 0) + n

    def nothing_reached_dali(self, generic: str) -> None:
        """A batch came and no sample of this loader has reached DALI: not proxied, and why
        (the workers' reason where they gave one). Logged once."""
        rec = self.record
        seen = rec["passed_over"]
        reason = f"no sample reached DALI: {max(seen, key=seen.get) if seen else generic}"
        if rec["proxied"] or rec["reason"] != reason:
            logger.warning("DataLoader #%d (%s): %s; the batches are plain torchvision's", rec["loader"],
                           rec["dataset"], reason)
        rec["proxied"], rec["reason"], rec["dali_transforms"] = False, reason, []

    def loop_raised(self, exc: BaseException) -> None:
        """The loop got ``exc`` in its batch's place (the dataset's or a transform's error, as
        plain torchvision raises it): the report says so beside its counts, the first one only."""
        lines = [line for line in str(exc).splitlines() if line.strip()]
        said = lines[-1].strip() if lines else ""  # a worker's error ends with the original one
        name = type(exc).__name__
        self.record.setdefault("raised", said if said.startswith(name) else f"{name}: {said}".rstrip(": "))

    def reached_dali(self) -> None:
        """The first batch with samples for DALI, after batches without any."""
        rec = self.record
        if not rec["proxied"] and rec["device"] != "torchvision":
            rec["proxied"], rec["reason"] = True, None
            self._describe_plans()

    def count_decodes(self, units: list) -> None:
        """The JPEG decodes DALI ran for one batch: one per row of an encoded group, one per
        image of a SharedGroup however many views it makes."""
        self.record["dali_decodes"] += sum(len(u.members[0].indices) for u in units if u.kind in (ENCODED, SHARED))

    def take_runner(self, key: str, kind: str, batch_size: int, device: str, ahead: int,
                    hw_decoder_load: float):
        """An idle runner for plan ``key`` (kind ``shared``: the views' keys joined by "+"), or a
        new one; KeyError where a plan was never announced."""
        # DALI is optional: its back end (which imports it) loads when a first pipeline is built
        from dali_autoproxy.backends.dali.runner import DaliRunner
        plans = [self.plans[k] for k in key.split("+")] if kind == SHARED else self.plans[key]
        with self.lock:
            pool = self.idle_runners[(key, kind)]
            while pool:
                runner = pool.pop()
                if (runner.batch_size, runner.ahead, runner.hw_decoder_load) == (batch_size, ahead, hw_decoder_load):
                    runner.drain()
                    return runner
        device_id = torch.cuda.current_device() if device == "gpu" else None
        runner = kept_runners.take(((key, kind), batch_size, ahead, hw_decoder_load, device, device_id))
        if runner is not None:
            runner.drain()
            return runner
        return DaliRunner(plans, kind, batch_size, device, device_id, ahead=ahead, hw_decoder_load=hw_decoder_load)

    def give_back(self, runners: Dict[RunnerKey, Any]) -> None:
        """An iterator's runners, once it is gone; what it left queued is discarded in the background."""
        with self.lock:
            for key, runner in runners.items():
                if runner.pipe is not None:
                    runner.discard_pending()
                self.idle_runners[key].append(runner)

    def close(self) -> None:
        """Close the idle runners (their threads and pipelines): the loader is gone."""
        with self.lock:
            runners = [r for pool in self.idle_runners.values() for r in pool]
            self.idle_runners.clear()
        for runner in runners:
            runner.close()


class GeneratorStates:
    """The generators an iterator's start draws from (the workers' base seed, the sampler's
    shuffle): torch's default one, the loader's and its samplers' own; ``restore()`` rewinds them."""

    def __init__(self, loader: Any) -> None:
        owners = [loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None),
                  getattr(getattr(loader, "batch_sampler", None), "sampler", None)]
        generators = {id(g): g for g in (getattr(o, "generator", None) for o in owners)
                      if isinstance(g, torch.Generator)}
        self.default = torch.get_rng_state()
        self.own = [(g, g.get_state()) for g in generators.values()]

    def restore(self) -> None:
        torch.set_rng_state(self.default)
        for generator, saved in self.own:
            generator.set_state(saved)


def output_device(device: str, options: Options) -> str:
    if device == "gpu" and options.output == "auto":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
