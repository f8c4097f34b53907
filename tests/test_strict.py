"""Strict mode (``enable(strict=True)`` / ``DALI_AUTOPROXY_STRICT=1``): a loader that would not
run on DALI raises StrictModeError naming what and why; a fully proxied loader runs as usual.
Real DataLoader workers, DALI's CPU backend, photographs."""
import numpy as np
import pytest
import torch
import torchvision.transforms as T
from helpers import image_folder, load_all, one_epoch
from PIL import Image
from torch.utils.data import DataLoader

import dali_autoproxy
from dali_autoproxy import StrictModeError
from dali_autoproxy.config import resolve_options

CHAIN = [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.2] * 3)]


class InvertWithNumpy:
    """A step that needs the pixels in the worker (numpy on the image: nothing to record)."""

    def __call__(self, img):
        return Image.fromarray(255 - np.asarray(img))


def _iterate(dataset, epochs=2, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 2)
    dali_autoproxy.enable(device="cpu", strict=True, log_level="ERROR")
    try:
        torch.manual_seed(0)
        loader = DataLoader(dataset, **kw)
        return [one_epoch(loader) for _ in range(epochs)][-1]  # an iterator a raise leaves is shut down
    finally:
        dali_autoproxy.disable()


def test_a_fully_proxied_loader_runs_and_equals_plain(photo_root):
    ds = image_folder(photo_root, T.Compose(CHAIN))
    out = _iterate(ds)
    ref = load_all(ds, autoproxy=False, batch_size=4, epochs=2)
    assert len(out) == len(ref)
    for (x, y), (rx, ry) in zip(out, ref):
        assert torch.equal(y, ry) and x.shape == rx.shape
        assert (x - rx).abs().max() < 0.5  # the default resize's bound (docs/transforms.md), in normalised units


def test_a_step_that_needs_pixels_raises_naming_it(photo_root):
    ds = image_folder(photo_root, T.Compose([T.RandomResizedCrop(64), InvertWithNumpy(), T.ToTensor()]))
    with pytest.raises(StrictModeError, match="InvertWithNumpy") as info:
        _iterate(ds)
    assert "strict mode" in str(info.value)


def test_a_loader_that_falls_back_raises_before_its_first_batch(photo_root):
    ds = image_folder(photo_root, T.Compose(CHAIN))
    with pytest.raises(StrictModeError, match=r"plain torchvision: batch_size=None"):
        _iterate(ds, batch_size=None)


def test_a_decode_left_in_the_worker_raises_with_its_reason(mixed_root):
    root, special = mixed_root
    ds = image_folder(root, T.Compose([T.CenterCrop(32), T.ToTensor()]))
    with pytest.raises(StrictModeError, match="decoded in the worker"):
        _iterate(ds, num_workers=0)


def test_the_switch_reads_the_keyword_and_the_variable():
    assert resolve_options(environ={}).strict == "off"
    assert resolve_options(strict=True, environ={}).strict == "on"
    assert resolve_options(environ={"DALI_AUTOPROXY_STRICT": "1"}).strict == "on"
    assert resolve_options(strict=False, environ={"DALI_AUTOPROXY_STRICT": "1"}).strict == "off"
    with pytest.raises(ValueError, match="DALI_AUTOPROXY_STRICT='sometimes'"):
        resolve_options(environ={"DALI_AUTOPROXY_STRICT": "sometimes"})


def test_a_grayscale_jpeg_handed_over_unconverted_says_so(mixed_root):
    """A dataset handing ``Image.open(path)`` of a grayscale JPEG to the chain without
    ``convert("RGB")`` computes on mode L, so the chain runs in the worker: the report says that,
    not that the file is no ordinary JPEG; strict mode raises with it."""
    from dali_autoproxy.transport import WHY_CPU

    root, special = mixed_root

    class Opened(torch.utils.data.Dataset):
        def __init__(self):
            self.tf = T.Compose([T.CenterCrop(32), T.PILToTensor()])

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.tf(Image.open(special["gray"])), i
    ref = load_all(Opened(), autoproxy=False, batch_size=2, epochs=1)
    out = load_all(Opened(), autoproxy=True, batch_size=2, epochs=1)
    assert all(torch.equal(a[0], b[0]) and a[0].shape[1] == 1 for a, b in zip(ref, out))
    rep = dali_autoproxy.report()[-1]
    assert rep["decoded_in_worker"] == {WHY_CPU: 4}, rep
    with pytest.raises(StrictModeError, match="not an RGB image"):
        _iterate(Opened(), batch_size=2)


def test_the_log_says_each_decision_once_with_its_chain():
    """A loader of joint transforms only names them (not an empty chain); plans a worker
    announces for more shapes of one chain of steps are logged once."""
    import logging

    from dali_autoproxy.config import resolve_options
    from dali_autoproxy.main.decision import Decision
    from dali_autoproxy.main.state import LoaderState
    from dali_autoproxy.plan.planning import build_plan
    loader = DataLoader(list(range(4)), batch_size=2)
    state = LoaderState(loader)
    lines = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    log, handler = logging.getLogger("dali_autoproxy"), Collect(logging.INFO)
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        state.update(Decision(True, None, "cpu", joint=["dataset.transforms: Compose"]), resolve_options(environ={}))
        for size in (32, 48, 64):
            state.learn(build_plan(T.Compose([T.CenterCrop(size), T.PILToTensor()])))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    text = "\n".join(lines)
    assert "proxied to DALI on cpu: joint transforms (dataset.transforms: Compose)" in text, text
    assert text.count("joins DALI") == 1, text


def test_another_librarys_wrapt_wrapper_is_not_taken_for_ours():
    """A wrapt wrapper another library put on an attribute gets ours around it (called
    through both), and undo gives it back; ours is not wrapped twice."""
    import wrapt

    from dali_autoproxy.patches import PatchLedger

    class Owner:
        def f(self):
            return ["f"]

    def theirs(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) + ["theirs"]

    def ours(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) + ["ours"]
    wrapt.wrap_function_wrapper(Owner, "f", theirs)
    their_wrapper = Owner.__dict__["f"]
    ledger = PatchLedger()
    ledger.wrap(Owner, "f", ours)
    ledger.wrap(Owner, "f", ours)  # twice: a no-op
    assert Owner().f() == ["f", "theirs", "ours"]
    ledger.undo_all()
    assert Owner.__dict__["f"] is their_wrapper and Owner().f() == ["f", "theirs"]
