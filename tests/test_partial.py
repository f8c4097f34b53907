"""Partial offload: a chain with a step DALI cannot run keeps the shortest prefix holding it
in the worker (which then decodes too) and moves the rest to DALI."""
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, last_report, load_all, recording_off
from photos import MEAN, STD
from PIL import Image, ImageFilter

from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import build_plan


class Median:
    """A user's PIL-only transform (a rank filter: no recorded kernel, it needs the pixels)."""

    def __call__(self, img):
        return img.filter(ImageFilter.MedianFilter(3))


def test_user_pil_step_splits_the_chain(photo_root):
    tf = T.Compose([T.RandomResizedCrop(160), Median(), T.RandomHorizontalFlip(),
                    T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=21)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=21)
    rep = last_report()
    assert rep["proxied"] and not rep["decode_on_dali"], rep
    assert rep["worker_transforms"] == ["RandomResizedCrop", "Median"]
    assert rep["dali_transforms"] == ["RandomHorizontalFlip", "ColorJitter", "ToTensor", "Normalize"]
    assert "Median has no DALI translation" in rep["partial"]
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb)
        assert (a - b).abs().max() < 1e-5  # flip, jitter (same draws), normalise: exact


def test_lambda_in_a_v2_chain(photo_root):
    tf = v2.Compose([v2.RandomResizedCrop(128), v2.Lambda(lambda im: im.rotate(30, Image.BICUBIC)), v2.ToImage(),
                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=2)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=2)
    rep = last_report()
    assert rep["proxied"] and rep["worker_transforms"] == ["v2.RandomResizedCrop", "v2.Lambda"], rep
    for (a, _), (b, _) in zip(ref, out):
        assert (a - b).abs().max() < 1e-5


def test_prefix_that_does_not_end_in_an_rgb_image_finishes_on_the_cpu(photo_root):
    """The split is planned for RGB PIL output; a sample that is something else (here: an
    "L" image) runs the rest of the chain with torchvision, per sample."""
    tf2 = T.Compose([T.CenterCrop(150), T.Lambda(lambda im: im.convert("L")), T.ToTensor(), T.Normalize([0.5], [0.5])])
    ds2 = image_folder(photo_root, tf2)
    ref2 = load_all(ds2, autoproxy=False)
    out2 = load_all(ds2, autoproxy=True)
    rep = last_report()  # every sample finished in the worker: none reached DALI, and the report says so
    assert not rep["proxied"] and rep["cpu_path_samples"] == len(ds2), rep
    assert rep["reason"].startswith("no sample reached DALI: not an RGB image"), rep
    for (a, _), (b, _) in zip(ref2, out2):
        assert torch.equal(a, b)


@pytest.mark.parametrize("tf,why", [
    (T.Compose([T.ToTensor(), T.Lambda(lambda x: x * 2), T.Normalize(MEAN, STD)]), "Lambda runs user code"),
    (T.Compose([T.CenterCrop(10), T.ToTensor(), T.Lambda(lambda x: x)]), "Lambda runs user code"),
    (T.Compose([T.CenterCrop(10), Median(), T.PILToTensor()]), "Median has no DALI"),  # only the layout left
])
def test_nothing_worth_moving_falls_back_with_the_first_reason(tf, why):
    with pytest.raises(Unsupported, match=why), recording_off():
        build_plan(tf)


def test_split_plan_is_raw_and_names_its_prefix():
    with recording_off():
        plan = build_plan(T.Compose([Median(), T.Resize(64), T.ToTensor()]))
    assert plan.worker_prefix == 1 and plan.worker_names == ["Median"]
    assert plan.names == ["Resize", "ToTensor"]


def test_a_chain_the_workers_refuse_to_plan_is_reported_with_the_refusal(photo_root):
    """A v2 Compose (planned per call in the workers, as it may take targets) holding a step
    without a translation: plain's batches, and the report says which step and why, not only
    that nothing reached DALI."""
    tf = v2.Compose([v2.CenterCrop(120), v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                     v2.RandomErasing(value="random")])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, seed=3)
    out = load_all(ds, autoproxy=True, seed=3)
    rep = last_report()
    assert not rep["proxied"] and rep["reason"] == (
        "no sample reached DALI: v2.RandomErasing(value='random') fills with torch's normal noise, which DALI "
        "cannot reproduce"), rep
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb) and torch.equal(a, b)
