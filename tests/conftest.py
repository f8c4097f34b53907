import itertools
import os
import sys

import pytest


def _share_the_cores() -> None:
    """In a pytest-xdist worker, torch's intra-op threads are its share of the cores. xdist runs a
    test process per core, each with its DataLoader workers and DALI's threads, and OpenMP threads
    beyond the share only contend (they spin waiting for work). Subprocesses a test starts keep
    torch's default: while they run, their test process waits. Results do not depend on it (both
    arms of a comparison run in one process)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None or "PYTEST_XDIST_WORKER" not in os.environ or "OMP_NUM_THREADS" in os.environ:
        return  # not a worker, or told how many
    import torch
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


_share_the_cores()
sys.path.insert(0, os.path.dirname(__file__))
from photos import make_gradient_folder, make_photo_folder  # noqa: E402


def dali_installed() -> bool:
    try:
        import nvidia.dali  # noqa: F401
        return True
    except ImportError:
        return False


def cuda_usable() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and dali_installed()
    except Exception:
        return False


def _slow_spread(items: list, workers: int) -> list:
    """The order pytest-xdist's ``load`` scheduling hands out: each worker first gets a run of
    consecutive tests (a quarter of its share), then one at a time as it finishes. So each
    worker's first run starts with its share of the slow tests, the slow tests left over come
    next: every worker starts on slow tests, none finishes them alone at the end."""
    slow = [item for item in items if "slow" in item.keywords]
    rest = [item for item in items if "slow" not in item.keywords]
    if workers <= 1 or len(items) < 2 * workers:
        return slow + rest
    chunk = max(2, len(items) // workers // 4)
    others = iter(rest)
    first_runs, left = [], []
    for share in (slow[k::workers] for k in range(workers)):
        first_runs += share[:chunk] + list(itertools.islice(others, max(0, chunk - len(share))))
        left += share[chunk:]
    return first_runs + left + list(others)


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected
def pytest_collection_modifyitems(config, items):
    items[:] = _slow_spread(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if cuda_usable():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and DALI (the CPU-backend twin runs in CI)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def photo_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("photos"))
    make_photo_folder(root)
    return root


@pytest.fixture(scope="session")
def mixed_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mixed"))
    special = make_photo_folder(root, per_class=3, extras=True)
    return root, special


@pytest.fixture(scope="session")
def gradient_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gradient"))
    make_gradient_folder(root)
    return root


@pytest.fixture(autouse=True)
def _two_epochs_on_the_gpu(request):
    """Every GPU test's loaders run two epochs (helpers.load_all): a training run is many epochs,
    and state a forked worker inherits from the first shows only when the second forks."""
    import helpers
    before = helpers.EPOCHS
    if "gpu" in request.keywords:
        helpers.EPOCHS = max(before, 2)
    yield
    helpers.EPOCHS = before


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    import dali_autoproxy
    dali_autoproxy.disable()


@pytest.fixture
def pillow_hooks():
    """The workers' hooks on Pillow's functions, in this process for the test only."""
    import wrapt

    from dali_autoproxy.plan.record.image_hooks import PILLOW_HOOKS
    from dali_autoproxy.plan.record.tensor_hooks import TENSOR_HOOKS
    hooks = PILLOW_HOOKS + TENSOR_HOOKS
    saved = [(owner, name, owner[name] if isinstance(owner, dict) else owner.__dict__[name])
             for owner, name, _ in hooks]
    for owner, name, wrapper in hooks:
        if isinstance(owner, dict):  # a v2 kernel table
            owner[name] = wrapt.FunctionWrapper(owner[name], wrapper)
        else:
            wrapt.wrap_function_wrapper(owner, name, wrapper)
    yield
    for owner, name, original in saved:
        if isinstance(owner, dict):
            owner[name] = original
        else:
            setattr(owner, name, original)
