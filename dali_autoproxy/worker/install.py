"""Setting up a proxied loader's workers: the patches that route chain calls, and the
``worker_init_fn`` that installs them in each worker (picklable, for spawn workers)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch
import torchvision.transforms.v2 as v2
from torch.utils.data import get_worker_info
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from dali_autoproxy.patches import ledger
from dali_autoproxy.plan.planning import walk
from dali_autoproxy.plan.record.image_hooks import PILLOW_HOOKS
from dali_autoproxy.plan.record.learnt import LEARNT
from dali_autoproxy.plan.record.tensor_hooks import TENSOR_HOOKS
from dali_autoproxy.plan.settings import SETTINGS
from dali_autoproxy.plan.translate import compose_types
from dali_autoproxy.worker.chains import ChainRouter, convert_jpeg, guarded_fetch, on_chain_call
from dali_autoproxy.worker.collate import collate_proxy_samples  # noqa: F401  (registers ProxySample with default_collate)
from dali_autoproxy.worker.deferred import DeferredFileLoader, JpegImageFile
from dali_autoproxy.worker.iou_crop import SAME_CODE as IOU_CROP_KNOWN
from dali_autoproxy.worker.iou_crop import iou_crop_params
from dali_autoproxy.worker.libraries import loaded_decoders
from dali_autoproxy.worker.routing import local


def entry_point(cls: type) -> str:
    """The method a chain's call goes through: ``forward`` for torch modules, else ``__call__``."""
    return "forward" if issubclass(cls, torch.nn.Module) else "__call__"


def patch(chain_classes: Iterable[type]) -> None:
    """Wrap the entry points of these chain classes, Pillow's JPEG convert and the functions
    recorded on recording images, torch's map fetcher, RandomIoUCrop's trials and the loaded
    data libraries' image decoders, in this process (idempotent; recorded in the patch
    ledger, undone by disable())."""
    for cls in set(compose_types()) | set(chain_classes):
        ledger.wrap(cls, entry_point(cls), on_chain_call)
    ledger.wrap(JpegImageFile, "convert", convert_jpeg)
    for owner, name, wrapper in PILLOW_HOOKS + TENSOR_HOOKS:  # recorded on recording images and tensors
        ledger.wrap(owner, name, wrapper)
    ledger.wrap(_MapDatasetFetcher, "fetch", guarded_fetch)
    if IOU_CROP_KNOWN:  # torchvision's RandomIoUCrop trials, the same draws, in numpy (worker/iou_crop.py)
        ledger.wrap(v2.RandomIoUCrop, "make_params", iou_crop_params)
    for owner, method, wrapper in loaded_decoders():  # webdataset's and Hugging Face's eager decoders
        ledger.wrap(owner, method, wrapper)


def swap_folder_loaders(dataset: Any) -> List[Tuple[Any, str, Any]]:
    """Give each plain ImageFolder in the dataset the deferred file loader; return the undo list."""
    undo = []
    for folder in walk(dataset).folders:
        undo.append((folder, "loader", folder.loader))
        folder.loader = DeferredFileLoader(getattr(folder, "samples", None))
    return undo


def unswap(undo: List[Tuple[Any, str, Any]]) -> None:
    for obj, attr, value in reversed(undo):
        setattr(obj, attr, value)


class WorkerInstaller:
    """The worker_init_fn of a proxied loader: run the user's worker_init_fn, then route this
    worker's chain calls. Picklable, for spawn and forkserver workers."""

    def __init__(self, known_keys: Set[str], chain_classes: Set[type], user_init_fn: Any,
                 settings: Optional[dict] = None, joint_shapes: Optional[Dict[tuple, Any]] = None):
        self.known_keys = known_keys
        self.chain_classes = chain_classes
        self.user_init_fn = user_init_fn
        self.settings = dict(settings or {})  # planning's options, as the main process planned
        self.joint_shapes = dict(joint_shapes or {})  # earlier workers' shapes of joint chains, by path

    def __call__(self, worker_id: int) -> None:
        SETTINGS.update(self.settings)  # a spawned worker starts from the defaults
        if self.user_init_fn is not None:  # first: it may expect the dataset as the user left it
            self.user_init_fn(worker_id)
        patch(self.chain_classes)
        dataset = get_worker_info().dataset
        if self.joint_shapes:  # a forked worker has them already; a spawned one, by the chains' paths
            found = walk(dataset)
            for path, chain in found.chains + found.joint:
                if path in self.joint_shapes:
                    LEARNT.set_joint_shape(chain, self.joint_shapes[path])
        swap_folder_loaders(dataset)
        local.router = ChainRouter(self.known_keys, dataset)
