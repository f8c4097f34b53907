"""Interception at the call, in a proxied loader's workers.

A recognised transform chain (a torchvision Compose, v1 or v2, or any transform class with a
converter, timm's and users' registered equivalents included) called with one image returns a
:class:`~dali_autoproxy.transport.ProxySample` instead of running, wherever the call happens:
``self.transform``, an attribute of another name, a closure, a wrapper that calls it twice per
sample (each call makes its own draws, as torchvision would), results nested in tuples, lists,
dicts and namedtuples. Each worker plans a chain on its first call; the plan's key names the
DALI pipeline in the main process, and a plan the main process did not find by walking the
dataset travels with the chain's samples.

Only the outermost chain call is taken: while a chain runs for real (it could not be
translated, or its input is no image), the calls inside it are left alone. If the dataset's
own code then uses a proxied result as a tensor and fails, the sample is fetched again with
that chain running as plain torchvision, and the chain stays plain in that worker (logged).

A chain called with an image and its targets (a v2 chain, or a two-argument class of the user's
own code that the walk found) is a joint call: ``worker/joint.py`` takes it over for its image.

In the main process nothing is patched unless a loader has ``num_workers=0``; then the same
happens around each fetch.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from PIL import Image

from dali_autoproxy.config import StrictModeError, logger
from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import ENDS_AS_PIL, build_head_plan, build_plan, joint_class, may_be_joint, walk
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.translate.registry import is_chain, transform_name
from dali_autoproxy.transport import ProxyBatch, ProxyCollated, ProxySample, Unrouted
from dali_autoproxy.tree import flatten
from dali_autoproxy.worker.collate import rng_states, set_rng_states
from dali_autoproxy.worker.deferred import LazyPixels, defer_convert
from dali_autoproxy.worker.handover import HeadNode
from dali_autoproxy.worker.joint import NOT_TAKEN, JointNode
from dali_autoproxy.worker.proxy_node import ProxyNode
from dali_autoproxy.worker.routing import local

MAX_CHAINS = 256  # chain objects remembered per worker


class ChainRouter:
    """One worker's (or one main-process fetch's) chains: each chain object's ProxyNode, made
    on first call; None for a chain that stays plain torchvision."""

    def __init__(self, known_keys: Iterable[str], dataset: Any = None):
        self.known = set(known_keys)
        self.dataset = dataset  # the fetches' dataset (the worker's copy): where a joint chain's path is found
        self._paths: Optional[Dict[int, Tuple[Any, Any]]] = None  # chain id: (chain, its path in the dataset)
        # by chain id: (the chain, its ProxyNode or HeadNode or None, why its plan was refused)
        self.nodes: Dict[int, Tuple[Any, Optional[Any], Optional[str]]] = {}
        self.joint: Dict[int, Tuple[Any, Optional[JointNode]]] = {}  # chains called with their targets
        self.produced: List[int] = []  # ids of chains that made ProxySamples during this fetch
        self.passed_over: Dict[str, int] = {}  # calls not taken over since the last batch, by why
        self.taken = 0  # calls that made a ProxySample since the last batch
        self.decoded_here: Dict[str, int] = {}  # JPEGs the outermost declined joint calls decoded here, by why
        self.declined: Optional[str] = None  # why the last joint call left to run as written was left
        self.fetches = 0  # guarded fetches so far (the first ones save every generator's state)

    def batch_done(self, batch: Any) -> Any:
        """The collated batch, as an :class:`Unrouted` carrying why where no call was taken."""
        why, taken, decoded = self.passed_over, self.taken, self.decoded_here
        self.passed_over, self.taken, self.decoded_here = {}, 0, {}
        if why and not taken:
            return Unrouted(batch, why, decoded)
        if decoded:  # samples of a batch others of which reached DALI: their decodes counted with those
            first = next((x for x in (batch.batches if isinstance(batch, ProxyCollated) else flatten(batch)[0])
                          if isinstance(x, ProxyBatch)), None)
            if first is not None:
                for reason, n in decoded.items():
                    first.why[reason] = first.why.get(reason, 0) + n
        return batch

    def node_for(self, chain: Any) -> Optional[Any]:
        entry = self.nodes.get(id(chain))
        if entry is None or entry[0] is not chain:
            refused = None
            try:
                plan = build_plan(chain)
            except Unsupported as exc:
                node = _head_node(chain) if str(exc) == ENDS_AS_PIL else None
                refused = str(exc) if node is None else None
            except Exception as exc:  # a converter tripped on an unusual transform: never the user's problem
                node = _planning_failed(chain, exc)
            else:
                node = ProxyNode(plan, chain, announce=plan.key not in self.known)
            if len(self.nodes) >= MAX_CHAINS:  # chains made anew per sample: plan them again, hold none
                self.nodes.clear()
            entry = self.nodes[id(chain)] = (chain, node, refused)  # holds the chain: its id stays its own
        return entry[1]

    def path_of(self, chain: Any) -> Optional[Tuple[Any, ...]]:
        """Where the dataset holds ``chain`` (``planning.walk``'s path: the same in every process
        that has a copy of the dataset, however its workers start); None where it holds it nowhere."""
        if self._paths is None:
            found = walk(self.dataset) if self.dataset is not None else None
            self._paths = {id(c): (c, path) for path, c in found.chains + found.joint} if found else {}
        entry = self._paths.get(id(chain))
        return entry[1] if entry is not None and entry[0] is chain else None

    def pass_over(self, chain: Any) -> None:
        """A call of a chain without a node: counted with why its plan was refused, for the report."""
        entry = self.nodes.get(id(chain))
        why = entry[2] if entry is not None and entry[0] is chain else None
        if why is not None:
            self.passed_over[why] = self.passed_over.get(why, 0) + 1

    def joint_node_for(self, chain: Any) -> Optional[JointNode]:
        """The JointNode of a chain called with an image and its targets (None: not a joint transform)."""
        entry = self.joint.get(id(chain))
        if entry is None or entry[0] is not chain:
            if len(self.joint) >= MAX_CHAINS:
                self.joint.clear()
            node = JointNode(chain, self.known, self.path_of(chain)) if may_be_joint(chain) else None
            entry = self.joint[id(chain)] = (chain, node)
        return entry[1]

    def make_plain(self, chain_ids: Iterable[int]) -> List[str]:
        """These chains run as written from now on; returns the names of those that were taken over."""
        names = []
        for cid in chain_ids:
            if cid in self.joint:
                self.joint[cid] = (self.joint[cid][0], None)
            chain, node, _ = self.nodes.get(cid, (None, None, None))
            if node is not None:
                names.append(type(chain).__name__)
                self.nodes[cid] = (chain, None, None)
        return names


def _head_node(chain: Any) -> Optional[HeadNode]:
    """A chain ending in a PIL image hands its image on (``worker/handover.py``) when it translates."""
    try:
        return HeadNode(build_head_plan(chain), chain)
    except Unsupported:
        return None
    except Exception as exc:  # pragma: no cover - a converter tripped: the chain runs as written
        return _planning_failed(chain, exc)


def _planning_failed(chain: Any, exc: Exception) -> None:
    """A converter raised on a chain: it runs as plain torchvision, said at WARNING (a broken
    converter must not pass for a chain that was never meant to move); in strict mode, an error."""
    what = f"planning {transform_name(chain)} in a worker failed ({type(exc).__name__}: {exc})"
    if SETTINGS["strict"] == "on":
        raise StrictModeError(f"{what} (strict mode)") from exc
    logger.warning("%s; it runs as plain torchvision", what)
    logger.debug("the converter's traceback", exc_info=True)
    return None


def _joint_call(instance: Any, args: tuple, kwargs: dict) -> Optional[str]:
    """What a joint call is (an image with its targets: several arguments, or one structure), said
    where it is not taken over; None for a call with one image (or anything else)."""
    if len(args) == 1 and not kwargs and not isinstance(args[0], (tuple, list, dict)):
        return None
    leaves = flatten((args, kwargs))[0]
    if not any(isinstance(x, Image.Image) or type(x).__name__ == "Image" for x in leaves):
        return None
    kinds = list(dict.fromkeys(_kind(x) for x in leaves if not isinstance(x, (str, int, float))))
    called = f"{transform_name(instance)} called with {', '.join(kinds)}"
    return f"joint image-and-target transform ({called})"


def _kind(x: Any) -> str:
    if isinstance(x, Image.Image):
        return "PIL image"
    return "tensor" if type(x) is torch.Tensor else type(x).__name__


def _take_joint(router: ChainRouter, instance: Any, args: tuple, kwargs: dict, joint: str) -> Any:
    """A joint call's result with its image proxied (``worker/joint.py``), or NOT_TAKEN, with why
    counted for the report."""
    node = router.joint_node_for(instance)
    if node is None:
        why = f"{joint}: not a v2 transform or a two-argument class"
    else:
        local.depth += 1  # the transform's own calls, made while it is recorded, are not taken
        try:
            out = node(args, kwargs, decoded_because=local.declined)
        finally:
            local.depth -= 1
        if out is not NOT_TAKEN:
            router.produced.append(id(instance))
            router.taken += 1
            return out
        why = node.why
    router.passed_over[why] = router.passed_over.get(why, 0) + 1
    router.declined = why
    return NOT_TAKEN


def _still_encoded(args: tuple, kwargs: dict) -> List[Any]:
    """The call's JPEGs whose pixels nothing has needed yet (``worker/deferred.py``)."""
    return [x for x in flatten((args, kwargs))[0] if isinstance(x, LazyPixels) and x.deferred]


def _count_decoded(router: ChainRouter, why: str, watched: List[Any]) -> None:
    """The watched JPEGs that running a declined joint call as written decoded here, counted
    with why (those it handed on, still encoded, to a chain that was taken are not)."""
    n = sum(1 for img in watched if not img.deferred)
    if n:
        router.decoded_here[why] = router.decoded_here.get(why, 0) + n


def on_chain_call(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of a chain class's entry point (``__call__``, or ``forward`` of a module)."""
    router = local.router
    if router is None or local.depth:
        return wrapped(*args, **kwargs)
    joint = _joint_call(instance, args, kwargs)
    users_class = joint_class(type(instance)) and not is_chain(instance)  # a registered equivalent is a chain
    declined, watched = local.declined, []
    if joint is not None:
        out = _take_joint(router, instance, args, kwargs, joint)
        if out is not NOT_TAKEN:
            return out
        declined = router.declined
        if local.declined is None:  # the outermost call left as written: what it decodes, it decodes here
            watched = _still_encoded(args, kwargs)
    if users_class:  # a user's two-argument class: run as written, the chain calls inside it may be taken
        before, local.declined = local.declined, declined  # an image decoded inside it was decoded for it
        try:
            return wrapped(*args, **kwargs)
        finally:
            local.declined = before
            _count_decoded(router, declined, watched)
    if joint is not None or kwargs or len(args) != 1:
        local.depth += 1  # the chain's own calls inside are not taken either
        try:
            return wrapped(*args, **kwargs)
        finally:
            local.depth -= 1
            _count_decoded(router, declined, watched)
    node = router.node_for(instance)
    local.depth += 1
    try:
        if node is None:
            router.pass_over(instance)
            return wrapped(*args)
        out = node(args[0])
        if isinstance(out, ProxySample) and out.done is None:
            router.produced.append(id(instance))
            router.taken += 1
        return out
    finally:
        local.depth -= 1


def convert_jpeg(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``JpegImageFile.convert``: deferred (``deferred.defer_convert``) only while routing."""
    if local.router is None:
        return wrapped(*args, **kwargs)
    return defer_convert(wrapped, instance, args, kwargs)


# ----------------------------------------------------------------------------- fetching
FULLY_REWOUND_FETCHES = 32  # a worker's first fetches save Python's and numpy's generators too


def guarded_get(dataset: Any, index: Any) -> Any:
    """``dataset[index]``; if the dataset's own code fails on a proxied result, again with the
    chains it used running plain, from the same random states, so the retry draws what plain
    draws. A dataset whose code cannot take a proxied result fails on its first samples: the
    first ``FULLY_REWOUND_FETCHES`` of a worker rewind torch's, Python's and numpy's generators;
    later ones torch's alone (saving the other two costs ~70 us per sample on a CI-sized core)."""
    return _guarded(lambda: dataset[index])


def _guarded(fetch: Callable[[], Any]) -> Any:
    """``fetch()`` (one sample, or a whole batch of a dataset's ``__getitems__``), again as
    ``guarded_get`` says where the dataset's code failed on a proxied result."""
    router = local.router
    if router is None:
        return fetch()
    router.produced.clear()
    router.fetches += 1
    states = rng_states() if router.fetches <= FULLY_REWOUND_FETCHES else None
    rng = torch.get_rng_state() if states is None else states[0]
    counts = router.taken, dict(router.passed_over), dict(router.decoded_here)
    try:
        return fetch()
    except Exception:
        if not router.produced:
            raise
    names = router.make_plain(set(router.produced))  # out of the except: plain's error is not chained to ours
    if states is not None:
        set_rng_states(states)
    else:
        torch.set_rng_state(rng)
    router.taken, router.passed_over, router.decoded_here = counts  # the failed attempt's calls never happened
    out = fetch()  # what plain raises, it raises here (and nothing is said of the dataset)
    for name in names:  # plain's run worked where the proxied one failed: the dataset read the result
        logger.warning("the dataset uses the result of %s inside __getitem__; that chain runs as "
                       "plain torchvision in this worker", name)
    return out


def guarded_fetch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper of torch's ``_MapDatasetFetcher.fetch`` in a proxied loader's worker."""
    if local.router is None or kwargs or len(args) != 1:
        return wrapped(*args, **kwargs)
    index = args[0]
    if not instance.auto_collation:
        return instance.collate_fn(guarded_get(instance.dataset, index))
    if getattr(instance.dataset, "__getitems__", None):  # a Subset's: the whole batch, guarded as one
        data = _guarded(lambda: instance.dataset.__getitems__(index))
    else:
        data = [guarded_get(instance.dataset, i) for i in index]
    return instance.collate_fn(data)
