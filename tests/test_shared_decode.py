"""The views a multi-view recipe makes of one image decode it once (CPU backend, real workers).

A sample's views are separate chains called on the same image; each becomes its own position
in the batch. The worker packs their JPEG bytes once (one shared-memory tensor for every
position holding the same images, row for row) and the main process runs them as one DALI
pipeline: each JPEG decoded whole, once, and every view cropped from that decode. The results
must be the same as with a decode per view, and as plain torchvision's.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from helpers import image_folder, last_report, load_all
from torch.utils.data import DataLoader, default_collate

import dali_autoproxy


def _views() -> list:
    big = T.Compose([T.RandomResizedCrop(64, scale=(0.4, 1.0)), T.RandomHorizontalFlip(), T.PILToTensor()])
    other = T.Compose([T.RandomResizedCrop(64, scale=(0.4, 1.0)), T.RandomGrayscale(0.5), T.PILToTensor()])
    small = T.Compose([T.RandomResizedCrop(32, scale=(0.05, 0.4)), T.RandomHorizontalFlip(), T.PILToTensor()])
    return [big, other, small, small, small]


class MultiView:
    """What DINO-style code does: every view's chain called on the one image."""

    def __init__(self, views, repeat_first: bool = False):
        self.views, self.repeat_first = views, repeat_first

    def __call__(self, img):
        out = [v(img) for v in self.views]
        return out + out[:1] if self.repeat_first else out  # DINOv2's teacher copies: the same tensors again


def _runs(ds, shared: str, options=None, **kw):
    runs = []
    for proxied in (False, True):
        random.seed(3)
        np.random.seed(3)
        if proxied:
            dali_autoproxy.enable(device="cpu", log_level="WARNING", resize="pillow", shared_decode=shared,
                                  **(options or {}))
        else:
            dali_autoproxy.disable()
        try:
            torch.manual_seed(5)
            kw.setdefault("batch_size", 8)
            kw.setdefault("num_workers", 2)
            runs.append([(tuple(v.clone() for v in x), y.clone()) for x, y in DataLoader(ds, **kw)])
        finally:
            dali_autoproxy.disable()
    return runs


def _assert_equal(ref, out):
    assert len(ref) == len(out)
    for (xa, ya), (xb, yb) in zip(ref, out):
        assert len(xa) == len(xb) and torch.equal(ya, yb)
        for u, v in zip(xa, xb):
            assert u.shape == v.shape and torch.equal(u, v), int((u.int() - v.int()).abs().max())


@pytest.mark.parametrize("shared", ["on", "off"])
def test_views_of_one_image_decode_it_once_equal_to_plain(photo_root, shared):
    ds = image_folder(photo_root, MultiView(_views()))
    ref, out = _runs(ds, shared)
    _assert_equal(ref, out)
    rep = last_report()
    images = len(ds)
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    assert rep["decoded_on_dali"] == 5 * images, rep  # every view made by DALI
    assert rep["dali_decodes"] == (images if shared == "on" else 5 * images), rep


def test_a_multi_view_loader_builds_only_the_pipelines_it_runs(photo_root, monkeypatch):
    """Three plans, their views run as one pipeline: one pipeline before the workers start (DALI
    proven able to build one), the views' when their first batch comes; none per view that no
    batch would run (each build is the first batch's time and device memory)."""
    from dali_autoproxy.backends.dali import runner
    built = []
    real = runner.DaliRunner._build
    monkeypatch.setattr(runner.DaliRunner, "_build", lambda self: built.append(self.input_kind) or real(self))
    ds = image_folder(photo_root, MultiView(_views()))
    ref, out = _runs(ds, "on")
    _assert_equal(ref, out)
    assert sorted(built) == ["encoded", "shared"], built


def test_the_same_views_twice_in_a_sample(photo_root):
    """A sample holding the same view tensors at two places (DINOv2's teacher crops)."""
    ds = image_folder(photo_root, MultiView(_views()[:2], repeat_first=True))
    ref, out = _runs(ds, "on", num_workers=0)
    _assert_equal(ref, out)
    assert last_report()["dali_decodes"] == len(ds)


def test_views_with_images_dali_does_not_take(mixed_root):
    """PNG, CMYK, grayscale files among JPEGs: their views run in the worker, the rest share."""
    root, _ = mixed_root
    ds = image_folder(root, MultiView(_views()[:3]))
    ref, out = _runs(ds, "on", batch_size=5)
    _assert_equal(ref, out)
    rep = last_report()
    assert 0 < rep["dali_decodes"] < rep["decoded_on_dali"], rep


def _stack_views(batch):
    views, labels = zip(*batch)
    return tuple(torch.stack(v) for v in zip(*views)), default_collate(labels)


def test_views_through_a_users_collate(photo_root):
    ds = image_folder(photo_root, MultiView(_views()))
    ref, out = _runs(ds, "on", collate_fn=_stack_views)
    _assert_equal(ref, out)
    assert last_report()["dali_decodes"] == len(ds)


def _fail_second_shared_run(monkeypatch) -> dict:
    """DALI failing on the second run of a shared pipeline; returns the count of runs collected."""
    from dali_autoproxy.backends.dali import PipelineError
    from dali_autoproxy.backends.dali import runner as pipeline
    real_collect = pipeline.DaliRunner.collect
    calls = {"n": 0}

    def failing_collect(self, *args):
        if self.input_kind == "shared":
            calls["n"] += 1
            if calls["n"] == 2:
                self._batches.popleft()
                raise PipelineError("injected DALI failure")
        return real_collect(self, *args)
    monkeypatch.setattr(pipeline.DaliRunner, "collect", failing_collect)
    return calls


def test_a_failed_shared_batch_gets_pils_pixels_and_the_loader_goes_on(photo_root, monkeypatch):
    """DALI failing on one batch of a shared pipeline (a look-ahead of 2: one batch a run): every
    view of its images replayed by PIL and torchvision with the worker's draws; the next batches
    run on the rebuilt pipeline."""
    calls = _fail_second_shared_run(monkeypatch)
    ds = image_folder(photo_root, MultiView(_views()))
    ref, out = _runs(ds, "on", options={"lookahead": 2}, batch_size=4)
    _assert_equal(ref, out)
    assert calls["n"] > 2
    assert last_report()["cpu_path_samples"] == 5 * 4  # the failed batch's views, each replayed


def test_a_failed_run_of_several_small_batches_replays_each_of_them(photo_root, monkeypatch):
    """Batches of 2 go to DALI several to a run: a failed run's batches are each replayed with
    their own draws, in their places, and the runs after it run on the rebuilt pipeline."""
    from dali_autoproxy.config import Options
    from dali_autoproxy.main import runs
    monkeypatch.setattr(runs, "GATHER_ON", ("gpu", "cpu"))  # on DALI's CPU backend too, as on the GPU
    per_run = runs.batches_per_run(2, runs.lookahead_batches(Options.lookahead, 2, "cpu"), "cpu")
    assert per_run > 1
    calls = _fail_second_shared_run(monkeypatch)
    ds = image_folder(photo_root, MultiView(_views()))
    ref, out = _runs(ds, "on", batch_size=2)
    _assert_equal(ref, out)
    assert calls["n"] > 2
    replayed = last_report()["cpu_path_samples"]  # views: 5 a sample
    assert replayed % (5 * 2) == 0 and 5 * 2 < replayed <= 5 * 2 * per_run
    assert last_report()["batches"] == len(ds) // 2


def test_views_differ_from_each_other(photo_root):
    """The shared decode gives each view its own crop: not one view copied to all."""
    ds = image_folder(photo_root, MultiView(_views()[:2]))
    out = load_all(ds, autoproxy=True, resize="pillow")
    assert any(not torch.equal(x[0], x[1]) for x, _ in out)
